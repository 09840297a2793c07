/* cm_time: clocks. */
#include "cm_time.h"

#include <errno.h>
#include <time.h>

uint64_t cm_time_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

double cm_time_s(void) { return (double)cm_time_ns() * 1e-9; }


void cm_time_sleep_ms(uint32_t ms) {
    struct timespec ts = { .tv_sec = ms / 1000, .tv_nsec = (long)(ms % 1000) * 1000000L };
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {}
}
