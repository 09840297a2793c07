/* cm_sha256 against the FIPS 180-4 / NIST vectors, split updates, and a real file whose
 * digest is published in ../shared/models/README.md. */
#include "common/cm_err.h"
#include "common/cm_sha256.h"
#include "t.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void hex_of(const void *data, size_t len, char *hex) {
    uint8_t d[CM_SHA256_LEN];
    cm_sha256(data, len, d);
    cm_sha256_hex(d, hex);
}

int main(void) {
    char hex[CM_SHA256_HEX_LEN + 1];
    static const struct { const char *msg, *digest; } v[] = {
        { "", "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855" },
        { "abc", "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad" },
        { "abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq",
          "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1" },
        { "abcdefghbcdefghicdefghijdefghijkefghijklfghijklmghijklmnhijklmnoijklmnopjklmnopqklmnopqrlmnopqrsmnopqrstnopqrstu",
          "cf5b16a778af8380036ce59e7b0492370b249b11e8f07a51afac45037afee9d1" },
        { "The quick brown fox jumps over the lazy dog",
          "d7a8fbb307d7809469ca9abcb0082e4f8d5651e46d3cdb762d02d0bf37c9e592" },
    };
    for (size_t i = 0; i < sizeof v / sizeof *v; i++) {
        hex_of(v[i].msg, strlen(v[i].msg), hex);
        T_EQ_STR(hex, v[i].digest);
    }

    /* One million 'a', fed in uneven pieces. */
    char *a = malloc(1000000);
    memset(a, 'a', 1000000);
    cm_sha256_ctx c;
    cm_sha256_init(&c);
    size_t off = 0, step = 1;
    while (off < 1000000) {
        size_t n = step < 1000000 - off ? step : 1000000 - off;
        cm_sha256_update(&c, a + off, n);
        off += n;
        step = step * 7 % 1000 + 1;
    }
    uint8_t d[CM_SHA256_LEN];
    cm_sha256_final(&c, d);
    cm_sha256_hex(d, hex);
    T_EQ_STR(hex, "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
    free(a);

    /* Every length around the padding boundaries, split at every point, equals one-shot. */
    uint8_t buf[200];
    for (int i = 0; i < 200; i++) buf[i] = (uint8_t)(i * 37 + 11);
    int mismatches = 0;
    for (size_t len = 0; len <= 130; len++) {
        uint8_t ref[CM_SHA256_LEN];
        cm_sha256(buf, len, ref);
        for (size_t cut = 0; cut <= len; cut++) {
            cm_sha256_init(&c);
            cm_sha256_update(&c, buf, cut);
            cm_sha256_update(&c, buf + cut, len - cut);
            cm_sha256_final(&c, d);
            mismatches += memcmp(d, ref, sizeof d) != 0;
        }
    }
    T_EQ_INT(mismatches, 0);

    /* Hex parsing. */
    uint8_t p[CM_SHA256_LEN];
    T_EQ_INT(cm_sha256_parse_hex("BA7816BF8F01CFEA414140DE5DAE2223B00361A396177A9CB410FF61F20015AD", p), 0);
    cm_sha256_hex(p, hex);
    T_EQ_STR(hex, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
    T_EQ_INT(cm_sha256_parse_hex("ba7816bf", p), CM_EINVAL);
    T_EQ_INT(cm_sha256_parse_hex("za7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad", p), CM_EINVAL);
    T_EQ_INT(cm_sha256_parse_hex("ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad0", p), CM_EINVAL);
    T_EQ_INT(cm_sha256_parse_hex(NULL, p), CM_EINVAL);

    /* A real file with a published digest. */
    FILE *f = fopen(T_MODELS "stories260K.gguf", "rb");
    T_CHECK(f != NULL);
    if (f) {
        cm_sha256_init(&c);
        uint8_t chunk[65537];
        size_t n;
        while ((n = fread(chunk, 1, sizeof chunk, f)) > 0) cm_sha256_update(&c, chunk, n);
        fclose(f);
        cm_sha256_final(&c, d);
        cm_sha256_hex(d, hex);
        T_EQ_STR(hex, "270cba1bd5109f42d03350f60406024560464db173c0e387d91f0426d3bd256d");
    }
    return t_done();
}
