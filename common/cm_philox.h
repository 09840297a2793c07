/* cm_philox: Philox4x32-10, the counter-based random number generator of Salmon, Moraes, Dror
 * and Shaw ("Parallel Random Numbers: As Easy as 1, 2, 3", SC'11), exactly as Random123 defines
 * philox4x32 with 10 rounds. A pure function of (counter, key): no state, any thread, any order.
 * The sampler's draw (ex_rng_u01 in executor/sampler.h) and the device sampler
 * (kernels/cuda/sample.cu) both call this one header, compiled as C on the host and by nvcc for
 * host and device, so the two draw bit-identical numbers.
 *
 *   uint32_t ctr[4] = { 0, 0, 0, 0 }, key[2] = { 0, 0 }, out[4];
 *   cm_philox4x32_10(ctr, key, out);       // out = 6627e8d5 e169c58d bc57ac4c 9b00dbd8
 *   double u = cm_philox_u01(seed, pos);   // in [0, 1)
 *
 * One round (M0 = 0xD2511F53, M1 = 0xCD9E8D57; hi/lo: the high/low 32 bits of the 64-bit product):
 *   {hi0, lo0} = M0 * c0;  {hi1, lo1} = M1 * c2;
 *   c = { hi1 ^ c1 ^ k0, lo1, hi0 ^ c3 ^ k1, lo0 }
 * Ten rounds; before each round but the first the key takes its Weyl step
 *   k0 += 0x9E3779B9;  k1 += 0xBB67AE85
 * (so the rounds use key + 0 .. key + 9 steps, as Random123's philox4x32_R). */
#ifndef CM_PHILOX_H
#define CM_PHILOX_H

#include <stdint.h>

#ifdef __CUDACC__
#define CM_HD __host__ __device__
#else
#define CM_HD
#endif

/* Philox4x32-10 of counter ctr under key: out[0..3]. out may alias ctr. Can't fail. */
static inline CM_HD void cm_philox4x32_10(const uint32_t ctr[4], const uint32_t key[2], uint32_t out[4]) {
    uint32_t c0 = ctr[0], c1 = ctr[1], c2 = ctr[2], c3 = ctr[3];
    uint32_t k0 = key[0], k1 = key[1];
    for (int r = 0; r < 10; r++) {
        if (r > 0) { k0 += 0x9E3779B9u; k1 += 0xBB67AE85u; }
        uint64_t p0 = (uint64_t)0xD2511F53u * c0, p1 = (uint64_t)0xCD9E8D57u * c2;
        uint32_t hi0 = (uint32_t)(p0 >> 32), lo0 = (uint32_t)p0;
        uint32_t hi1 = (uint32_t)(p1 >> 32), lo1 = (uint32_t)p1;
        c0 = hi1 ^ c1 ^ k0;
        c1 = lo1;
        c2 = hi0 ^ c3 ^ k1;
        c3 = lo0;
    }
    out[0] = c0; out[1] = c1; out[2] = c2; out[3] = c3;
}

/* A uniform double in [0, 1) keyed by a 64-bit key and numbered by a 64-bit counter:
 *   r = Philox4x32-10(counter = { ctr lo32, ctr hi32, 0, 0 }, key = { key lo32, key hi32 })
 *   u = ((r[0] << 32 | r[1]) >> 11) * 2^-53
 * (the top 53 bits of the first two output words, r[0] the high word; exact in a double).
 * Can't fail. */
static inline CM_HD double cm_philox_u01(uint64_t key, uint64_t ctr) {
    const uint32_t c[4] = { (uint32_t)ctr, (uint32_t)(ctr >> 32), 0, 0 };
    const uint32_t k[2] = { (uint32_t)key, (uint32_t)(key >> 32) };
    uint32_t r[4];
    cm_philox4x32_10(c, k, r);
    uint64_t h = (uint64_t)r[0] << 32 | r[1];
    return (double)(h >> 11) * (1.0 / 9007199254740992.0);
}

#endif
