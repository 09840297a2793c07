/* cm_err: the one error table of ArkaTensor.
 *
 * Every fallible function returns 0 or a negative CM_E* code and passes results through
 * out-parameters. cm_err_str() turns a code into a stable short message. Codes only grow at
 * the end: they cross the process boundary (ring ERROR records, executor exit codes).
 * Any thread may call cm_err_str(); it returns a static string.
 */
#ifndef CM_ERR_H
#define CM_ERR_H

/* X(name, value, message) */
#define CM_ERR_MAP(X)                                                        \
    X(OK,          0,   "ok")                                                \
    X(NOMEM,      -1,   "out of memory")                                     \
    X(INVAL,      -2,   "invalid argument")                                  \
    X(IO,         -3,   "i/o error")                                         \
    X(NOENT,      -4,   "no such file")                                      \
    X(FORMAT,     -5,   "malformed file")                                    \
    X(UNSUPPORTED,-6,   "unsupported")                                       \
    X(RANGE,      -7,   "value out of range")                                \
    X(FULL,       -8,   "buffer or queue full")                              \
    X(EMPTY,      -9,   "buffer or queue empty")                             \
    X(NOKV,       -10,  "out of KV cache blocks")                            \
    X(CTX,        -11,  "context length exceeded")                           \
    X(NOTFOUND,   -12,  "not found")                                         \
    X(TOOBIG,     -13,  "too large")                                         \
    X(CUDA,       -14,  "CUDA error")                                        \
    X(TIMEOUT,    -15,  "timed out")                                         \
    X(CANCELLED,  -16,  "cancelled")                                         \
    X(NET,        -17,  "network error")                                     \
    X(CHECKSUM,   -18,  "checksum mismatch")                                 \
    X(STATE,      -19,  "invalid state")                                     \
    X(UTF8,       -20,  "invalid UTF-8")                                     \
    X(TEMPLATE,   -21,  "chat template error")

enum cm_err {
#define CM_ERR_ENUM(name, value, msg) CM_E##name = (value),
    CM_ERR_MAP(CM_ERR_ENUM)
#undef CM_ERR_ENUM
};

/* Short message for a code; "unknown error" for codes not in the table. Can't fail. */
const char *cm_err_str(int err);
/* Symbolic name ("NOKV") for a code; "UNKNOWN" otherwise. Can't fail. */
const char *cm_err_name(int err);

#endif
