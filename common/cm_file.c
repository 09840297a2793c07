/* cm_file: reading a whole (bounded) file into memory (see cm_file.h). */
#include "cm_file.h"

#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>

#include "cm_err.h"

int cm_file_read(const char *path, size_t max, char **out, size_t *len, char *err, size_t errlen) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        snprintf(err, errlen, "%s: cannot open", path);
        return CM_ENOENT;
    }
    struct stat st;
    if (fstat(fileno(f), &st) != 0 || !S_ISREG(st.st_mode) || (size_t)st.st_size > max) {
        fclose(f);
        snprintf(err, errlen, "%s: not a regular file of at most %zu MB", path, max >> 20);
        return CM_ETOOBIG;
    }
    size_t n = (size_t)st.st_size;
    char *buf = malloc(n + 1);
    if (!buf) {
        fclose(f);
        return CM_ENOMEM;
    }
    if (fread(buf, 1, n, f) != n) {
        fclose(f);
        free(buf);
        snprintf(err, errlen, "%s: read error", path);
        return CM_EIO;
    }
    fclose(f);
    buf[n] = 0;
    *out = buf;
    *len = n;
    return 0;
}
