/* loadgen: `arka bench serve`, the serving load generator (bench/loadgen.c). Linked into the
 * arka binary and dispatched by cli/bench.c; main thread only. */
#ifndef BENCH_LOADGEN_H
#define BENCH_LOADGEN_H

/* Runs the load generator on argv (the arguments after "serve"). Returns the exit code: 0 when
 * at least one request succeeded, 1 on a runtime error or when every request failed, 2 on a
 * usage error. */
int bench_serve(int argc, char **argv);

#endif
