/* auth_redis: the shared quota store in Redis (hiredis async on the gateway's libuv loop). */
#include "common/cm_err.h"
#include "gateway/auth_internal.h"

int gw__redis_open(gw_auth *a, const char *url) {
    (void)a, (void)url;
    return CM_EUNSUPPORTED;
}
void gw__redis_close(gw_auth *a) { (void)a; }
void gw__redis_admit(gw_auth *a, const char *bearer, const char *model, int64_t reserve, gw_auth_cb cb, void *ud) {
    gw_auth_result r = {0};
    gw__auth_refuse(&r, 503, "server_error", "store_unavailable", 1, 1, "The key store is unavailable.");
    cb(ud, &r);
}
void gw__redis_settle(gw_auth *a, const gw_auth_ticket *t, int64_t used) { (void)a, (void)t, (void)used; }
