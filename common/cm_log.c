/* cm_log: key=value log lines. */
#include "cm_log.h"
#include "cm_err.h"

#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static _Atomic int g_level = CM_LOG_LEVEL_INFO;
static _Atomic int g_fd = 2;

static const char *const level_names[] = { "debug", "info", "warn", "error", "off" };

void cm_log_set_level(int level) { atomic_store(&g_level, level); }
int cm_log_get_level(void) { return atomic_load_explicit(&g_level, memory_order_relaxed); }
void cm_log_set_fd(int fd) { atomic_store(&g_fd, fd); }

int cm_log_parse_level(const char *s, int *level) {
    for (int i = 0; i <= CM_LOG_LEVEL_OFF; i++) {
        if (strcmp(s, level_names[i]) == 0) {
            *level = i;
            return 0;
        }
    }
    return CM_EINVAL;
}

void cm_log_write(int level, const char *mod, const char *msg, const char *fmt, ...) {
    if (level < cm_log_get_level() || level >= CM_LOG_LEVEL_OFF) return;
    char line[2048];
    struct timespec ts;
    struct tm tm;
    clock_gettime(CLOCK_REALTIME, &ts);
    gmtime_r(&ts.tv_sec, &tm);
    int n = snprintf(line, sizeof line, "ts=%04d-%02d-%02dT%02d:%02d:%02d.%03ldZ level=%s mod=%s msg=\"%s\"",
                     tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec,
                     ts.tv_nsec / 1000000, level_names[level], mod, msg);
    if (n < 0) return;
    if ((size_t)n >= sizeof line - 2) n = (int)sizeof line - 2;
    if (fmt && *fmt) {
        line[n++] = ' ';
        va_list ap;
        va_start(ap, fmt);
        int m = vsnprintf(line + n, sizeof line - (size_t)n - 1, fmt, ap);
        va_end(ap);
        if (m > 0) n += m;
        if ((size_t)n >= sizeof line - 1) n = (int)sizeof line - 2;
    }
    line[n++] = '\n';
    ssize_t w = write(atomic_load(&g_fd), line, (size_t)n);
    (void)w;
}
