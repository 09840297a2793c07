/* cm_err: messages of the error table. */
#include "cm_err.h"

const char *cm_err_str(int err) {
    switch (err) {
#define CM_ERR_CASE(name, value, msg) case value: return msg;
        CM_ERR_MAP(CM_ERR_CASE)
#undef CM_ERR_CASE
    }
    return "unknown error";
}

const char *cm_err_name(int err) {
    switch (err) {
#define CM_ERR_CASE(name, value, msg) case value: return #name;
        CM_ERR_MAP(CM_ERR_CASE)
#undef CM_ERR_CASE
    }
    return "UNKNOWN";
}
