/* cm_sha256: SHA-256 (FIPS 180-4) in portable C, for verifying downloads in arka_core
 * (which must not depend on OpenSSL).
 *
 *   cm_sha256_ctx c; uint8_t d[CM_SHA256_LEN]; char hex[CM_SHA256_HEX_LEN + 1];
 *   cm_sha256_init(&c);
 *   cm_sha256_update(&c, buf, n);            // any number of times
 *   cm_sha256_final(&c, d);
 *   cm_sha256_hex(d, hex);
 *
 * The caller owns the context; no global state, any thread. None of these can fail.
 */
#ifndef CM_SHA256_H
#define CM_SHA256_H

#include <stddef.h>
#include <stdint.h>

#define CM_SHA256_LEN 32
#define CM_SHA256_HEX_LEN 64

typedef struct cm_sha256_ctx {
    uint32_t h[8];
    uint64_t n_bytes;     /* total bytes hashed so far */
    uint8_t  buf[64];     /* partial block */
    size_t   buf_len;
} cm_sha256_ctx;

void cm_sha256_init(cm_sha256_ctx *c);
void cm_sha256_update(cm_sha256_ctx *c, const void *data, size_t len);
/* Writes the digest; the context must be re-initialized before reuse. */
void cm_sha256_final(cm_sha256_ctx *c, uint8_t out[CM_SHA256_LEN]);
/* One-shot digest of len bytes. */
void cm_sha256(const void *data, size_t len, uint8_t out[CM_SHA256_LEN]);
/* Lower-case hex of a digest into hex (CM_SHA256_HEX_LEN + 1 bytes, NUL-terminated). */
void cm_sha256_hex(const uint8_t digest[CM_SHA256_LEN], char *hex);
/* Parses 64 hex digits (either case, nothing else) into a digest; 0 or CM_EINVAL. */
int  cm_sha256_parse_hex(const char *hex, uint8_t out[CM_SHA256_LEN]);

#endif
