/* cm_file: reading a whole (bounded) file into memory. Any thread. */
#ifndef CM_FILE_H
#define CM_FILE_H

#include <stddef.h>

/* Reads the regular file at path, at most max bytes, into a malloc'ed NUL-terminated buffer the
 * caller frees (*len excludes the NUL). Returns 0, CM_ENOENT (cannot open), CM_ETOOBIG (not a
 * regular file, or larger than max), CM_EIO (read error) or CM_ENOMEM; err names the path and
 * the problem. */
int cm_file_read(const char *path, size_t max, char **out, size_t *len, char *err, size_t errlen);

#endif
