/* t.h: the unit-test harness. Every test executable prints "N passed, N failed" last and exits
 * non-zero when anything failed. Tests run from the project root (ctest sets the directory). */
#ifndef ARKA_T_H
#define ARKA_T_H

#include <math.h>
#include <stdio.h>
#include <string.h>

static int t_passed, t_failed;

#define T_CHECK(cond)                                                                   \
    do {                                                                                \
        if (cond) t_passed++;                                                           \
        else { t_failed++; fprintf(stderr, "FAIL %s:%d: %s\n", __FILE__, __LINE__, #cond); } \
    } while (0)

#define T_CHECKF(cond, ...)                                                             \
    do {                                                                                \
        if (cond) t_passed++;                                                           \
        else { t_failed++; fprintf(stderr, "FAIL %s:%d: %s: ", __FILE__, __LINE__, #cond); \
               fprintf(stderr, __VA_ARGS__); fputc('\n', stderr); }                     \
    } while (0)

#define T_EQ_INT(a, b) T_CHECKF((long long)(a) == (long long)(b), "%lld != %lld", (long long)(a), (long long)(b))
#define T_EQ_STR(a, b) T_CHECKF(strcmp((a), (b)) == 0, "\"%s\" != \"%s\"", (a), (b))
#define T_NEAR(a, b, tol) T_CHECKF(fabs((double)(a) - (double)(b)) <= (tol), "%g vs %g (tol %g)", (double)(a), (double)(b), (double)(tol))

/* Prints the summary line; returns the process exit code. */
static inline int t_done(void) {
    printf("%d passed, %d failed\n", t_passed, t_failed);
    return t_failed ? 1 : 0;
}

/* Path of a file in ../shared/models relative to the project root (the test's cwd). */
#define T_MODELS "../shared/models/"

#endif
