// plan: the kernel plan (kcuda.h): every kernel choice, made once at start-up from the device
// and the model, overridable by name, installed for the launchers.
#include "kc_common.cuh"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

extern "C" {
#include "kcuda.h"
}

namespace {

kc_plan g_plan;
bool g_plan_set;

// One table names every field once: override, format and the tests go through it.
struct field {
    const char *name;
    size_t off;
    int lo, hi; // accepted values
};
#define F(name, lo, hi) { #name, offsetof(kc_plan, name), lo, hi }
const field k_fields[] = {
    F(pdl, 0, 1),
    F(pdl_off, 0, 0x7fffffff),
    F(norm_split, 0, 1 << 20),
    F(swiglu_fuse, 0, KC_GEMV_MAX_TOK),
    { "gemmq_max_tok_q8_0", offsetof(kc_plan, gemmq_max_tok) + 0 * sizeof(int), 0, 1 << 20 },
    { "gemmq_max_tok_q4_0", offsetof(kc_plan, gemmq_max_tok) + 1 * sizeof(int), 0, 1 << 20 },
    { "gemmq_max_tok_q4_k", offsetof(kc_plan, gemmq_max_tok) + 2 * sizeof(int), 0, 1 << 20 },
    { "gemmq_max_tok_q4_1", offsetof(kc_plan, gemmq_max_tok) + 3 * sizeof(int), 0, 1 << 20 },
    { "gemmq_max_tok_q5_0", offsetof(kc_plan, gemmq_max_tok) + 4 * sizeof(int), 0, 1 << 20 },
    { "gemmq_max_tok_q5_1", offsetof(kc_plan, gemmq_max_tok) + 5 * sizeof(int), 0, 1 << 20 },
    { "gemmq_max_tok_q5_k", offsetof(kc_plan, gemmq_max_tok) + 6 * sizeof(int), 0, 1 << 20 },
    { "gemmq_max_tok_q6_k", offsetof(kc_plan, gemmq_max_tok) + 7 * sizeof(int), 0, 1 << 20 },
    F(gemmq_wg, 0, 1),
    F(f16_wg_max_tok, 0, 1 << 20),
    F(glu_tiles, 0, 1),
    F(att_tc, 0, 1),
    F(att_tc_min_tok, 1, 1 << 20),
    F(att_tc_long_ctx, 1, 1 << 30),
    F(att_pf_warps, 4, 8),
    F(att_pf_split_warps, 4, 8),
    F(att_pf_fa3, 0, 1),
    F(att_pf_fa3_ctas, 0, 1 << 20),
    F(att_dec_ctas, 1, 1 << 20),
    F(att_dec_min_chunk, 64, 1 << 20),
    F(att_dec_hpw, 0, 1 << 30),
    F(att_dec_pair, 0, 1 << 30),
    F(att_chunk, 16, 1 << 20),
    F(att_ph_splits, 0, 64),
    F(graph_max_tok, 1, 4096),
    F(fp8_gemm, 0, 1),
    F(fp8_fast_accum, 0, 1),
    F(fp8_lt_tune, 0, 1),
    F(fp8_wg, 0, 1),
    F(fp8_raw, 0, 1),
    F(q8_mma_max_tok, 0, 32),
    F(q4k_mma_max_tok, 0, 16),
    F(qgemv_max_tok, 1, KC_GEMV_MAX_TOK),
    F(moe_fuse, 0, KC_GEMV_MAX_TOK),
    F(x_plain, 0, 1),
    F(rope_tok, 0, 1 << 20),
    F(att_pf_half, 0, 1),
    F(f16_lt_min_tok, 0, 1 << 20),
    F(glu_half_min_tok, 0, 1 << 20),
    F(norm_rows_min_tok, 0, 1 << 20),
    F(att_pf_persist, 0, 1),
    F(moe_pre, 0, 7),
    F(mixed_one, 0, 1),
    F(f16_tc, 0, 1),
    F(qkv_rope, 0, 1),
    F(qkv_half_min_tok, 0, 1 << 20),
    F(pf_q_half, 0, 1),
    F(f8_x_img, 0, 1),
    F(att_pf_f8_fa3, 0, 1),
};
#undef F
static_assert(KC_N_QTYPES == 8, "one gemmq_max_tok key per quantized type (kc_qtype_index's order)");

int *slot(kc_plan *p, const field &f) { return (int *)((char *)p + f.off); }

} // namespace

extern "C" void kc_plan_default(kc_plan *p) {
    memset(p, 0, sizeof *p);
    p->pdl = 1;
    // rows split over CTAs in decode-sized steps; past them one CTA a token reads its row once
    // (the split CTAs each read the whole row: llama3-8b, 8,192 tokens, 148 us a norm)
    p->norm_split = 128;
    // F16 gate|up with the SwiGLU in its epilogue for one token only (llama2-7b F16 on an H100:
    // batch 1 200.2 -> 202.2 tok/s, batch 4 608 -> 592; bench/RESULTS.md)
    p->swiglu_fuse = 1;
    // where kc_gemmq stops beating dequantize + cuBLAS (H100, llama2-7b layer, bench/RESULTS.md
    // "2026-11-24 (gemmq)"): Q8_0 80, Q4_0 96, Q4_K 48 tokens
    p->gemmq_max_tok[0] = 80;
    p->gemmq_max_tok[1] = 96;
    p->gemmq_max_tok[2] = 48;
    // not measured yet: the nearest measured type's (Q4_1, Q5_0, Q5_1: Q4_0's; Q5_K, Q6_K: Q4_K's)
    p->gemmq_max_tok[3] = p->gemmq_max_tok[4] = p->gemmq_max_tok[5] = 96;
    p->gemmq_max_tok[6] = p->gemmq_max_tok[7] = 48;
    // quantized weights times 9+ tokens on wgmma where the device runs it (kc__gemmq_wg_ncfg)
    p->gemmq_wg = 1;
    // the gated activation in gate|up's wgmma epilogue (kc_matmul_glu)
    p->glu_tiles = 1;
    // F16 matrices on cuBLAS read x's half copy from its producer (no f32 rows, no conversion)
    p->x_plain = 1;
    // prefill and large decode steps: the rotation a token a CTA, its angles once (with an FP8 KV
    // cache too: llama3-8b FP8 weights and KV, 256 x 1,152 on an H200 19,280, 19,411 -> 19,856,
    // 19,766 tok/s, 64 sequences 9,922 -> 9,884; bench/RESULTS.md, twenty-sixth session)
    p->rope_tok = 64;
    // F16 matrices on cuBLAS from 1,024 tokens (prefill) on the cuBLASLt algorithm timed fastest
    // at start-up: llama3-8b gate|up at 2,048 / 8,192 tokens 748 / 2,968 us on cublasGemmEx's
    // choice against 688 / 2,813 on the best of cuBLASLt's heuristic's eight, qkv at 8,192 596
    // against 562, while wo and down at 8,192 keep cublasGemmEx's (376 / 1,343 against 392 /
    // 1,414); below 1,024 tokens the two are within 1 % (H200, bench/RESULTS.md "2026-11-29
    // (sixteenth session)"). Above the largest decode graph: timing runs before capture.
    p->f16_lt_min_tok = 1024;
    p->att_pf_half = 1;
    // F16 gate|up on cuBLAS from 129 tokens (past the wgmma tiles' 128 on Hopper): half rows for
    // the gated activation, half the bytes written and read again (llama3-8b F16 on an H200: 256 x
    // 1,152 steps 14,435 -> 14,590 tok/s, prefill 2,048 / 32,768 tokens 39,063 / 22,579 -> 40,444
    // / 22,776, 8,192 within the spread; bench/RESULTS.md "2026-11-29 (sixteenth session)")
    p->glu_half_min_tok = 129;
    // prefill-sized steps: a row a CTA of 128 threads with all its float4 loads in flight (llama3-8b
    // F16, 8,192 tokens: the step's 64 norms 5.22 -> 3.28 ms on an H200, bench/RESULTS.md
    // "2026-11-29 (seventeenth session)"; the step gains less: it runs at the power limit)
    p->norm_rows_min_tok = 1024;
    // prefill-sized steps: the rotation writes q as the wgmma prefill kernel's half operand (the
    // same bits as that kernel makes of f32 q). F16 Q|K|V's half rows for the rotation
    // (qkv_half_min_tok) stay off: they round q and k to half before the rotation and again after
    // it, and that moved MoE routing near ties: mixtral-tiny F16 prefill of 300 tokens against
    // the CPU top-1 100 % -> 98.0 %, rel_max 1.5e-3 -> 0.34 (tests/gpu/models.sh, H200,
    // twenty-eighth session), for 8,192 / 32,768-token prefill +0.5 % / +1.3 % (both keys on
    // against both off: 35,518, 35,226, 35,198 / 35,064, 35,031, 35,362 tok/s; 23,730, 23,759 /
    // 23,444; bench/RESULTS.md, twenty-sixth session)
    p->qkv_half_min_tok = 0;
    p->pf_q_half = 1;
    p->f8_x_img = 1;
    // a step's prefill tiles over an FP8 cache on the wgmma kernel through an F16 copy of their
    // sequences' blocks (llama3-8b FP8 weights and KV on an H200, prefill 1,024 tokens off / on /
    // off / on: 56,406 / 62,459 / 55,565 / 62,012 tok/s; 256 x 1,152 decode steps 22,368 / 22,298
    // / 22,331 / 22,232, within the spread; arka serve 1,000 / 1,000 at concurrency 256 with mixed
    // steps' tiles too: 13,265 -> 13,495 output tok/s; bench/RESULTS.md, twenty-eighth session)
    p->att_pf_f8_fa3 = 1;
    // unsplit wgmma prefill launches on one persistent CTA an SM (the kernel alone at 2,048 /
    // 8,192 / 32,768 positions: 0.114 -> 0.109, 1.243 -> 1.238, 17.94 -> 17.94 ms a layer; same bits)
    p->att_pf_persist = 1;
    // F16 GEMVs on half2 FMA (f16_tc 0): on mma.sync with f32 sums llama2-7b F16 decode went 275
    // -> 215 tok/s at batch 1 and 901 -> 855 at batch 8 (H200, bench/RESULTS.md, twentieth session)
    // one-token MoE steps: the down launch requests the rows of its experts before its wait
    // (qwen3-30b-a3b Q4_K_M batch 1: 398 -> 409 tok/s on an H200, bench/RESULTS.md, twentieth session)
    p->moe_pre = 2;
    // a mixed Q|K|V at one token in one launch: its V range (Q6_K in half of a Q4_K_M file's
    // layers) ran after the Q|K launch; qwen3-30b-a3b Q4_K_M batch 1 at 128 + 128 444.3 -> 449.5
    // tok/s on an H200 (bench/RESULTS.md, twenty-second session)
    p->mixed_one = 1;
    // one token's K-quant Q|K|V GEMV rotates its heads and stores K and V itself: no RoPE launch
    // (kc_matmul_qkv_rope; batch 1 on an H200: llama2-7b Q4_K_M 461-464 -> 470-474 tok/s, qwen3-8b
    // Q4_K_M 412 -> 417, qwen3-30b-a3b Q4_K_M 451-453 -> 453-455; bench/RESULTS.md, twenty-fourth
    // session)
    p->qkv_rope = 1;
    p->att_tc = 1;
    // decode steps of up to 8 tokens below 2,048 positions keep the per-head kernel: at batch 1,
    // llama2-7b (512 positions) F16 275 against 246 tok/s, Q4_0 586 against 519; from 8,192
    // positions the tensor-core kernel reads the KV cache 2.6x (8k) to 4.5x (32k) faster
    // (H200, bench/RESULTS.md "2026-11-25")
    p->att_tc_min_tok = KC_GEMV_MAX_TOK + 1;
    p->att_tc_long_ctx = 2048;
    // prefill CTAs of 8 warps: 186-191 against 162-163 TFLOP/s at 8k and 32k positions (H200)
    p->att_pf_warps = 8;
    // chunks of a long prompt short enough for a 4-warp tile (16 tokens at 4 query heads a KV
    // head) split their keys on 4-warp CTAs, two an SM: llama3-8b shape, 16 tokens at 128k 0.349
    // -> 0.278 ms a layer, at 32k 0.139 -> 0.117; longer chunks cut into 4-warp tiles lost (64 at
    // 128k 0.794 -> 0.877, 256 at 32k 0.762 -> 0.863), so they keep 8-warp tiles (H200,
    // bench/RESULTS.md "2026-11-29")
    p->att_pf_split_warps = 4;
    // one wave of decode CTAs on an H200 (132 SMs, two 104 KiB CTAs each at head dim 128); with
    // splits of at least 1,024 positions (H200, llama3-8b shapes, bench/RESULTS.md "2026-11-28
    // (seventh session)")
    p->att_dec_ctas = 264;
    p->att_dec_min_chunk = 1024;
    // a warp a KV head from 2,048 (token, KV head) pairs (llama2-7b from 64 sequences, llama3-8b
    // from 256): at 128-256 positions the copies outweigh a CTA's start and merge (H200,
    // gpu_bench_attn mha short, 128 sequences of 128 / 192 positions: 73 -> 80 % / 90 -> 92 % of
    // the copy bandwidth; llama2-7b Q8_0 and Q4_K at 128 sequences of 128-256 positions +1.6 %),
    // at 512-1,024 positions it loses 1-2 points there, and below 2,048 pairs too few CTAs fill the
    // SMs (16 sequences of llama2-7b: -0.5 to -0.9 % a step; bench/RESULTS.md "2026-12-01
    // (thirty-third session)")
    p->att_dec_hpw = 2048;
    // below that, an FP8 cache's keys-as-rows decode takes two warps a KV head from 1,024 pairs
    // (llama3-8b from 128 sequences): a warp a head leaves 8 warps an SM there, a CTA a head two
    // waves with a merge each (bench/RESULTS.md, thirty-eighth session)
    p->att_dec_pair = 1024;
    p->att_chunk = 64;
    // per-head decode splits of att_chunk positions (kc_plan_choose cuts them from each token's
    // own position in a MoE model). Either way a token's result does not depend on the other
    // tokens of a per-head step (test_gpu_e2e: decode steps of 1 and of 4 tokens bit for bit,
    // twenty-third session)
    p->att_ph_splits = 0;
    p->graph_max_tok = 512;
    // FP8 weights: cuBLASLt's E4M3 GEMM past the GEMV, and the FP8 wgmma tiles, summing in the
    // tensor cores' own precision (fast accumulation, as vLLM's FP8 kernels do): llama3-8b FP8
    // weights + KV at 128 / 256 x (1,024 + 128) 19,486 / 23,655-23,721 -> 19,829 / 24,390-24,446
    // tok/s on an H200; KL divergence against the F16 model 0.0206 -> 0.0204 (the FP8 rounding
    // dominates; the GEMM alone ~1e-3 off f32 partials' sums; bench/RESULTS.md, thirty-ninth session)
    p->fp8_gemm = 1;
    p->fp8_fast_accum = 1;
    // FP8 GEMMs: unit scales and a scale pass where timed faster than cuBLASLt's one algorithm for
    // outer-vector scales (kc_matmul_tune_f8): llama3-8b --quantize fp8 --kv-cache-dtype fp8, 16 /
    // 64 / 256 x (1,024 + 128) greedy 2,528 / 8,954-8,978 / 19,139-19,184 -> 3,121 / 9,873-9,885 /
    // 19,326-19,430 tok/s (H200, bench/RESULTS.md "2026-11-30 (twenty-fifth session)")
    p->fp8_lt_tune = 1;
    // and the FP8 wgmma tiles (gemm_f8_wg.cu) where timed faster than both (sm_90a code only)
    p->fp8_wg = 1;
    // and, for Q|K|V into an FP8 cache and for gate|up, cuBLASLt's unit-scale sums with the scales
    // applied by their reader (the rotation, the gated activation) where timed faster than the
    // path above without its scale pass (kc_matmul_f8_raw)
    p->fp8_raw = 1;
    // Q8_0 at 9-16 tokens on int8 mma.sync (kc__gemm_q8i) instead of the wgmma tiles: llama2-7b
    // Q8_0 128 + 128 at 12 / 16 sequences 2,720 / 3,585 -> 3,228 / 4,263 tok/s on an H200, and
    // closer to the CPU (300 random ids in chunks of 9-32 on `small` Q8_0: rel_mean 1.8e-3 ->
    // 7.9e-4, top-1 99.7 -> 100 %); at 24 / 32 tokens it loses (4,605 -> 4,249 and 5,740 -> 4,474
    // tok/s; bench/RESULTS.md, twenty-ninth session)
    p->q8_mma_max_tok = 16;
    // Q4_K on the same kernel: llama2-7b Q4_K 128 + 128 at 9 / 12 / 16 sequences 1,775 / 2,345 /
    // 3,112 -> 2,250 / 2,918 / 3,882 tok/s (bench/RESULTS.md, thirtieth session)
    p->q4k_mma_max_tok = 16;
    p->qgemv_max_tok = KC_GEMV_MAX_TOK;
    // MoE steps of one token: 11 launches a layer become 8 (qwen3-30b-a3b on an H200: batch 1
    // 370.6 -> 404.3 tok/s; 4 tokens a step lose, 586 -> 505; bench/RESULTS.md)
    p->moe_fuse = 1;
}

extern "C" int kc_plan_choose(int device, int head_dim, int n_head, int n_kv, int block_size, int n_expert, kc_plan *p) {
    kc_plan_default(p);
    cudaDeviceProp prop;
    if (cudaGetDeviceProperties(&prop, device) != cudaSuccess) {
        cudaGetLastError();
        return CM_ECUDA;
    }
    p->pdl = prop.major >= 9;
    // Q8_0's 128-token tiles (qkv and gate|up at 65-128 tokens, one 256-thread CTA an SM, the
    // weights streamed into registers) start after the norm before them has finished: launched
    // early, they cost a llama2-7b Q8_0 step at 96 / 128 sequences 5-6 % on an H200 (PDL off for
    // the norms instead: the same at 128, -1 % at 64; for everything: +0.6 % more at 128, but 2-5 %
    // lost at 16-64 and in prefill; bench/RESULTS.md, thirty-fourth session)
    p->pdl_off = 1 << (KC_PDL_WGQ8 + 5);
    // Q4_K at 9-16 tokens on the wgmma tiles, not int8 mma.sync, since the tiles dequantize the
    // K-quants in half arithmetic: llama2-7b Q4_K 128 + 128 at 9 / 16 sequences 2,233-2,249 /
    // 3,876-3,885 -> 2,398-2,404 / 4,146-4,155 tok/s on an H200 (Q8_0 keeps int8 mma.sync: 16
    // sequences 4,184-4,189 against 4,041-4,059 on the tiles; bench/RESULTS.md, thirty-fifth session)
    // And past 4 tokens both leave the integer GEMV, whose cost grows with every token (llama2-7b
    // 128 + 128 at 6 / 8 sequences on an H200: Q4_K 5.46 / 6.74 ms a step, Q8_0 5.70 / 4.56,
    // against 3.75 / 3.73 ms at 9 on the tiles / int8 mma.sync; bench/RESULTS.md, thirty-fifth
    // session); steps of up to 4 tokens stay on the GEMV, batch-invariant.
    // MoE models keep the GEMV to 8 tokens: their top-k routing turns the tiles' half activations
    // at a near tie into another expert (qwen3moe-tiny512 Q4_K_M in steps of 7 tokens against the
    // CPU: top-1 98 %, one row at rel 0.46 and the rows after it off by 1.4 % on average, where the
    // GEMV gives 100 % and 4.5e-4; tests/gpu/models.sh, bench/RESULTS.md, thirty-sixth session);
    // their experts run on their own launches, so the gain measured above (dense llama2-7b) is not
    // theirs to lose.
    if (prop.major >= 9) {
        p->q4k_mma_max_tok = 0;
        p->qgemv_max_tok = n_expert > 0 ? KC_GEMV_MAX_TOK : 4;
    }
    p->att_tc = kc_attention_tc_ok(head_dim, n_head, n_kv, block_size);
    // where the wgmma tiles run (compute capability 9.0), kc_gemmq (x in the tiles' order) beats
    // dequantize + cuBLAS up to 128 tokens for the 32-element block types (Q4_0 at 128: 282
    // against 302 us a llama2-7b layer; at 192 it loses, 396 against 330) and up to 64 for the
    // K-quants (Q4_K at 64: 218 against 296, at 128 361 against 312; Q6_K wins at 128 too, but
    // the K-quants of a Q4_K_M matrix share one limit so that x is written in one order for all)
    // (H200, bench/RESULTS.md "2026-11-29 (eleventh session)")
    // Thirteenth session: with the 128- and 256-token tiles and wo's and down's residual read
    // coalesced, the tiles take every token count (no half copy of a quantized matrix): llama2-7b
    // layer at 256 / 512 / 1,024 tokens, Q4_0 238 / 395 / 727 against 341 / 472 / 781 us. Q4_K
    // loses from 512 tokens (504 / 866 against 487 / 792) and Q8_0 at 1,024 (842 against 797);
    // kept, a 512-token Q4_K prefill runs as fast as before (H200, bench/RESULTS.md "2026-11-29
    // (thirteenth session)")
    if (p->gemmq_wg && kc__gemmq_wg_ncfg() > 0)
        for (int i = 0; i < KC_N_QTYPES; i++) p->gemmq_max_tok[i] = 1 << 20;
    // F16 weights on the wgmma tiles from 9 tokens up to 128 (cuBLAS past: at 192 tokens and
    // more it runs a llama3-8b layer in half the time)
    p->f16_wg_max_tok = p->gemmq_wg && kc__gemmq_wg_ncfg() > 0 ? 128 : 0;
    // prefill tiles on the wgmma kernel with ping-pong where it runs (compute capability 9.0):
    // one causal sequence of the llama3-8b shape, 8k / 32k positions: 440 / 484 against the
    // 8-warp mma.sync kernel's 201 / 208 TFLOP/s (H200, bench/RESULTS.md "2026-11-29")
    p->att_pf_fa3 = p->att_tc && kc_attention_fa3_ok(head_dim, n_head, n_kv, block_size) ? 1 : 0;
    // steps that split their prefill keys (chunks of a long prompt) on the wgmma kernel too, one
    // CTA an SM
    p->att_pf_fa3_ctas = p->att_pf_fa3 ? prop.multiProcessorCount : 0;
    // one wave of decode CTAs: as many as the occupancy calculator fits an SM (F16 cache, head
    // dim 128 on an H200: two; ncu names shared memory the limit, 2026-11-29)
    const int per_sm = kc_attention_dec_per_sm(head_dim);
    p->att_dec_ctas = (per_sm > 0 ? per_sm : 2) * prop.multiProcessorCount;
    // per-head decode splits cut from each token's own position in MoE models only. H200, batch
    // 1, each model's arms alternated in one lease (bench/RESULTS.md, twenty-third session):
    // qwen3-30b-a3b Q4_K_M 128 + 128 427 -> 449 tok/s with 16, but llama2-7b Q4_0 512 + 128
    // 592.7 -> 587.9 and qwen3-8b F16 128 + 128 239.6 -> 238.3. Why a MoE gains (its short GEMVs
    // leave the attention's key loads exposed?) and a dense model loses is not measured;
    // unmeasured dense models keep 0
    p->att_ph_splits = n_expert > 0 ? 16 : 0;
    // MoE models' F16 GEMVs on the tensor cores (exact products, f32 sums): top-k routing turns a
    // hidden state's rounding at a near tie into another expert (a row of logits far off). With
    // the half2 GEMV, qwen3moe-tiny F16 decode took one of its 1,200 routing choices the other
    // way against the CPU (top-1 99.667 %, rel_max 0.51 in that row); on the tensor cores it
    // matched (tests/gpu/models.sh, bench/RESULTS.md, twenty-eighth and twenty-ninth sessions).
    // Their cost (llama2-7b F16 batch 1 275 -> 215 tok/s) falls on an F16 MoE model's attention
    // and head matrices only: its experts run on kc_moe_gemv
    p->f16_tc = n_expert > 0;
    return 0;
}

extern "C" int kc_plan_pf_splits_fa3(const kc_plan *p, int n_kv, int n_tiles, int max_pos, int *kchunk) {
    const int per = n_kv * n_tiles, units = (max_pos + 1 + 127) / 128, least = (p->att_dec_min_chunk + 127) / 128;
    *kchunk = units * 128;
    if (per <= 0 || 2 * per > p->att_pf_fa3_ctas) return 1;
    int ns = p->att_pf_fa3_ctas / per, by_len = units / least; // every split at least `least` tiles
    if (ns > by_len) ns = by_len;
    if (ns > KC_PF_MAX_SPLIT) ns = KC_PF_MAX_SPLIT;
    if (ns <= 1) return 1;
    const int u = (units + ns - 1) / ns; // 128-position tiles a split
    *kchunk = u * 128;
    return (units + u - 1) / u;
}

extern "C" int kc_plan_dec_splits(const kc_plan *p, int n_kv, int n_dec, int n_ctx) {
    const int per = n_kv * n_dec, most = (n_ctx + 63) / 64;
    int ns = per > 0 ? 2 * p->att_dec_ctas / per : 1;
    if (ns > most) ns = most;
    return ns < 1 ? 1 : ns;
}

extern "C" int kc_plan_dec_chunk(const kc_plan *p, int n_kv, int n_dec, int n_split, int max_pos) {
    const int units = (max_pos + 1 + 63) / 64, per = n_kv * n_dec;
    int wave = per > 0 ? p->att_dec_ctas / per : 1; // one wave's splits
    if (wave < 1) wave = 1;
    if (wave > n_split) wave = n_split;
    const int most = (units + n_split - 1) / n_split;    // units a split takes with all n_split
    const int least = (units + wave - 1) / wave;         // ... with one wave's
    const int want = p->att_dec_min_chunk / 64;
    const int u = want < most ? most : want > least ? least : want;
    return u * 64;
}

// The overrides go to a copy, which replaces *p only when every one of them is taken.
static int plan_override(kc_plan *p, const char *spec, char *err, size_t errlen) {
    const char *s = spec;
    while (*s) {
        const char *end = strchr(s, ',');
        size_t len = end ? (size_t)(end - s) : strlen(s);
        const char *eq = (const char *)memchr(s, '=', len);
        if (len == 0) {
            s += end ? 1 : 0;
            if (!end) break;
            continue;
        }
        if (!eq) {
            snprintf(err, errlen, "--cuda-plan: '%.*s' is not key=value", (int)len, s);
            return CM_EINVAL;
        }
        const size_t klen = (size_t)(eq - s);
        const field *f = nullptr;
        for (const field &c : k_fields)
            if (strlen(c.name) == klen && !strncmp(c.name, s, klen)) f = &c;
        if (!f) {
            snprintf(err, errlen, "--cuda-plan: unknown key '%.*s'", (int)klen, s);
            return CM_EINVAL;
        }
        char num[32];
        const size_t vlen = len - klen - 1;
        if (vlen == 0 || vlen >= sizeof num) {
            snprintf(err, errlen, "--cuda-plan: bad value for '%s'", f->name);
            return CM_EINVAL;
        }
        memcpy(num, eq + 1, vlen);
        num[vlen] = 0;
        char *e;
        long v = strtol(num, &e, 10);
        if (*e || v < f->lo || v > f->hi) {
            snprintf(err, errlen, "--cuda-plan: %s=%s is not an integer in [%d, %d]", f->name, num, f->lo, f->hi);
            return CM_EINVAL;
        }
        *slot(p, *f) = (int)v;
        s += len + (end ? 1 : 0);
    }
    if (p->att_dec_min_chunk % 64) {
        snprintf(err, errlen, "--cuda-plan: att_dec_min_chunk must be a multiple of 64");
        return CM_EINVAL;
    }
    if (p->att_pf_warps != 4 && p->att_pf_warps != 8) {
        snprintf(err, errlen, "--cuda-plan: att_pf_warps must be 4 or 8");
        return CM_EINVAL;
    }
    if (p->att_pf_split_warps != 4 && p->att_pf_split_warps != 8) {
        snprintf(err, errlen, "--cuda-plan: att_pf_split_warps must be 4 or 8");
        return CM_EINVAL;
    }
    return 0;
}

extern "C" int kc_plan_override(kc_plan *p, const char *spec, char *err, size_t errlen) {
    if (!spec) return 0;
    kc_plan t = *p;
    const int rc = plan_override(&t, spec, err, errlen);
    if (!rc) *p = t;
    return rc;
}

extern "C" void kc_plan_format(const kc_plan *p, char *buf, size_t n) {
    size_t k = 0;
    if (n) buf[0] = 0;
    for (const field &f : k_fields) {
        int w = snprintf(buf + k, k < n ? n - k : 0, "%s%s=%d", k ? " " : "", f.name, *slot((kc_plan *)p, f));
        if (w < 0) return;
        k += (size_t)w;
    }
}

extern "C" void kc_plan_set(const kc_plan *p) {
    g_plan = *p;
    g_plan_set = true;
}

extern "C" const kc_plan *kc_plan_get(void) {
    if (!g_plan_set) {
        kc_plan_default(&g_plan);
        g_plan_set = true;
    }
    return &g_plan;
}

extern "C" int kc_plan_pf_splits(const kc_plan *p, int n_kv, int n_tiles, int max_pos, int *kchunk) {
    const int per = n_kv * n_tiles, units = (max_pos + 1 + 63) / 64, least = p->att_dec_min_chunk / 64;
    *kchunk = units * 64;
    if (per <= 0 || 2 * per > p->att_dec_ctas) return 1; // half a wave or more: splitting lost (32 tiles x 8 KV heads: 2 splits 2-8 % slower)
    int ns = 2 * p->att_dec_ctas / per, by_len = (units + least - 1) / least;
    if (ns > by_len) ns = by_len;
    if (ns > KC_PF_MAX_SPLIT) ns = KC_PF_MAX_SPLIT;
    if (ns <= 1) return 1;
    const int u = (units + ns - 1) / ns; // 64-position units a split
    *kchunk = u * 64;
    return (units + u - 1) / u;
}
