/* cm_log: levelled logging as key=value lines on stderr.
 *
 * A line looks like: `ts=2026-11-22T07:40:01.123Z level=info mod=gguf msg="loaded" tensors=48`.
 * The level threshold and the sink are the only process globals (set once in main). Thread-safe:
 * each line is formatted into a local buffer and written with one write(2).
 *
 *   cm_log_set_level(CM_LOG_DEBUG);
 *   CM_LOG_INFO("gguf", "loaded", "path=%s tensors=%d", path, n);
 */
#ifndef CM_LOG_H
#define CM_LOG_H

#include <stdarg.h>

enum cm_log_level { CM_LOG_LEVEL_DEBUG = 0, CM_LOG_LEVEL_INFO, CM_LOG_LEVEL_WARN, CM_LOG_LEVEL_ERROR, CM_LOG_LEVEL_OFF };

void cm_log_set_level(int level);
int  cm_log_get_level(void);
/* Parses "debug|info|warn|error|off"; returns 0 and sets *level, or CM_EINVAL. */
int  cm_log_parse_level(const char *s, int *level);
/* Redirects log lines to fd (default 2). */
void cm_log_set_fd(int fd);

/* mod: module name; msg: short human text (quoted in output); fmt: extra key=value pairs, may be NULL. */
void cm_log_write(int level, const char *mod, const char *msg, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

#define CM_LOG_DEBUG(mod, msg, ...) do { if (cm_log_get_level() <= CM_LOG_LEVEL_DEBUG) cm_log_write(CM_LOG_LEVEL_DEBUG, mod, msg, __VA_ARGS__); } while (0)
#define CM_LOG_INFO(mod, msg, ...)  cm_log_write(CM_LOG_LEVEL_INFO, mod, msg, __VA_ARGS__)
#define CM_LOG_WARN(mod, msg, ...)  cm_log_write(CM_LOG_LEVEL_WARN, mod, msg, __VA_ARGS__)
#define CM_LOG_ERROR(mod, msg, ...) cm_log_write(CM_LOG_LEVEL_ERROR, mod, msg, __VA_ARGS__)

#endif
