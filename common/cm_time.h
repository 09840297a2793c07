/* cm_time: monotonic clocks and sleeping. Any thread. */
#ifndef CM_TIME_H
#define CM_TIME_H

#include <stdint.h>

/* Monotonic time in nanoseconds / seconds (as double). Can't fail. */
uint64_t cm_time_ns(void);
double   cm_time_s(void);
/* Wall-clock Unix time in seconds. */
/* Sleeps for ms milliseconds (restarts on EINTR). */
void     cm_time_sleep_ms(uint32_t ms);

#endif
