/* kcuda: CUDA kernels of the cuda backend, as C-callable launchers.
 *
 * Every launcher checks its preconditions, sizes the grid, launches on the stream it is given
 * and checks the launch; it returns 0, CM_EINVAL (bad arguments) or CM_ECUDA (the launch failed;
 * the message is logged with file and line). Launchers never allocate and never synchronize,
 * so they can be captured into CUDA graphs. All pointers are device pointers unless noted.
 *
 * Shapes follow the CPU side: activations are token-major [n_tok, n], weights are
 * row-major [n_out][n_in] (GGUF ne = {n_in, n_out}).
 *
 * Called from the executor's step thread only.
 */
#ifndef K_CUDA_H
#define K_CUDA_H

#include <stddef.h>
#include <stdint.h>
#include <cuda_runtime_api.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef uint16_t kc_half; /* __half bits on the host side */

/* A weight matrix on the device, in the layout our kernels read. Every region is row-major
 * with a fixed number of bytes per row (nb = n_in / 32 blocks, nsb = n_in / 256 super-blocks):
 *   F32: data = [n_out][n_in] floats. F16: [n_out][n_in] halves. BF16: [n_out][n_in] bf16.
 * Quantized types are repacked at upload so that vector loads are aligned and each lane's unit
 * of work is contiguous; data holds the quants, d the scales and whatever else a block carries,
 * in as many bytes as the file's blocks (rows of Q5_0 and Q6_K padded by a few bytes):
 *   Q8_0: data [n_out][n_in] int8; d [n_out][nb] half.
 *   Q4_0: data [n_out][n_in/2] nibble bytes in GGUF order (byte j of a block: elements j and
 *         j + 16 in its low and high nibble); d [n_out][nb] half.
 *   Q4_1: data as Q4_0; d [n_out][nb] {half d, half m}.
 *   Q5_0: data as Q4_0 (the low four bits); d per row: nb 32-bit high-bit words, then nb half d,
 *         padded to 4 bytes.
 *   Q5_1: data as Q4_0; d [n_out][nb] {half d, half m, 32-bit high-bit word}.
 *   Q4_K: data [n_out][n_in/2] (each super-block's 128 nibble bytes in GGUF order: quarter j of
 *         64 elements is 32 bytes, low nibbles its sub-block 2j, high nibbles 2j + 1); d
 *         [n_out][nsb] 16-byte heads {half d, half dmin, 12 bytes of 6-bit scales and mins}.
 *   Q5_K: data as Q4_K (the low four bits); d [n_out][nsb] 48 bytes: the Q4_K head, then the
 *         high-bit words of its 8 sub-blocks of 32.
 *   Q6_K: data [n_out][nsb] 192 bytes: per quarter of 64 elements, 32 nibble bytes (byte l:
 *         elements l and 32 + l) then 16 bytes of the 2-bit high parts (kc_common.cuh); d per
 *         row: nsb x 16 int8 scales (GGUF order), then nsb half d, padded to 16 bytes.
 *   F8_E4M3: data [n_out][n_in] E4M3 codes (model.h); d [n_out] f32 row scales (4 bytes a row in
 *         d, whatever d's pointer type): row r's values are code x scale[r]. kc_weight_repack
 *         copies the codes only; the scales come from mdl_tensor.scale. Not a "quantized type"
 *         of the integer GEMVs: kc_matmul reads it in fp8.cu (kc_fp8_tensor_cores).
 * A high-bit word holds the fifth bit of element 4i + b of its block of 32 at bit 8b + i: the
 * four elements whose low (or high) nibbles share a 32-bit word of nibbles get their fifth bits
 * with one shift and one mask (kc_hbit4).
 *
 * Fused matrices whose parts differ in quantized type (Q|K|V of a Q4_K_M file: wq and wk Q4_K,
 * wv Q6_K in about half of the layers) keep every part in its own type: type KC_WEIGHT_MIXED,
 * and a table of row ranges (kc_weight_layout), each range laid out as a matrix of its own at
 * its offsets in data and d. kc_matmul multiplies each range with its type's kernels (one launch
 * per range) into its rows of y. Why not the alternatives: converting such a matrix to F16 (what
 * the backend did) reads 3.6x the bytes of Q4_K (2.4x of Q6_K) on every token and takes that
 * much memory; one kernel branching on the row range would carry every type's code and
 * registers in each launch and lose the per-type tuning (rows per warp, tile shapes, the plan's
 * limits). The price is one more launch per mixed matrix, and the activations are quantized (or
 * converted to half) once for all ranges. The exception is the case where that launch costs the
 * most, one token and two K-quant ranges (Q4_K or Q5_K, then Q6_K): the plan's mixed_one runs
 * both in one launch whose CTAs take either range's body (the first range keeps its tuning, the
 * second takes the shape of fewest registers; a row's bits do not depend on either). Parts must
 * be quantized types; anything else (and interleaved gate|up pairs of different types, which
 * llama.cpp's K-quant mixes do not make) is converted to F16 by the backend. */
#define KC_WEIGHT_MAX_PARTS 4
#define KC_WEIGHT_MIXED     1000 /* kc_weight.type of a matrix whose row ranges differ in type */
typedef struct kc_weight_part {
    int    type;             /* a quantized type (kc_weight_is_quant) */
    int    row0, n_rows;     /* the rows of the fused matrix it holds */
    size_t data_off, d_off;  /* where its regions start in data and d (bytes) */
} kc_weight_part;

typedef struct kc_weight {
    int      type;     /* enum dt_type (kc_weight_type_ok), or KC_WEIGHT_MIXED */
    int      n_in, n_out;
    void    *data;     /* F16/BF16 elements, or qs for quantized types */
    kc_half *d;        /* quantized types: scales (and what else the layout above puts there) */
    int      n_parts;  /* KC_WEIGHT_MIXED: 2 .. KC_WEIGHT_MAX_PARTS row ranges in part[]; else 0 */
    kc_weight_part part[KC_WEIGHT_MAX_PARTS];
} kc_weight;

/* Whether the GPU kernels read this weight type as it is (others are converted at upload). */
int kc_weight_type_ok(int type);
/* Whether the type is one of the quantized types the integer GEMVs read (Q8_0, Q4_0, Q4_1, Q5_0,
 * Q5_1, Q4_K, Q5_K, Q6_K), or KC_WEIGHT_MIXED (whose parts all are). */
int kc_weight_is_quant(int type);
/* Whether kc_embed reads a table of this type (F32, F16, BF16, Q8_0, Q4_0, Q4_K). */
int kc_embed_type_ok(int type);
/* The quantized types in the order of kc_plan.gemmq_max_tok: Q8_0, Q4_0, Q4_K, Q4_1, Q5_0, Q5_1,
 * Q5_K, Q6_K. Index of type in it, or -1. */
#define KC_N_QTYPES 8
int kc_qtype_index(int type);

/* Lays out a fused matrix of n_parts row ranges (rows[i] rows of types[i], n_in columns each)
 * for upload: fills w's type, shape and part table (consecutive ranges of one type merge; when
 * all are one type, w is an ordinary weight of that type with n_parts 0) and the bytes its two
 * regions need (ranges start 256-byte aligned). data and d are left to the caller; row r of the
 * matrix goes at the offsets kc_weight_row_at gives. Returns 0, CM_EINVAL (a row width the type
 * does not take) or CM_EUNSUPPORTED (types differ and one is not quantized, more ranges than
 * KC_WEIGHT_MAX_PARTS, or a type the kernels do not read). */
int kc_weight_layout(const int *types, const int *rows, int n_parts, int n_in, kc_weight *w, size_t *data_bytes,
                     size_t *d_bytes);
/* Byte offsets in data and d where row r of w starts (w laid out by kc_weight_layout or
 * kc_weight_sizes). */
void kc_weight_row_at(const kc_weight *w, int r, size_t *data_off, size_t *d_off);
/* Part i of a KC_WEIGHT_MIXED weight as an ordinary weight (its rows only, pointers into w's
 * regions). */
kc_weight kc_weight_part_view(const kc_weight *w, int i);

/* Whether this build has GPU code the current device can run (*arch: the SASS version used,
 * e.g. 90; 0 when none). */
int  kc_code_for_device(int *arch);
/* Whether that code is sm_80 or newer (mma.sync, ldmatrix, cp.async); looked up once. */
int  kc_code_sm80(void);

/* ---- the kernel plan (plan.cu) ---------------------------------------------------------------
 * Every choice the launchers and the backend make beyond the shapes they are given: fixed once
 * at start-up from the device and the model (kc_plan_choose), changed only by named overrides
 * (kc_plan_override: `--cuda-plan key=value,...`), installed with kc_plan_set before anything
 * is launched or captured, and logged in one line (kc_plan_format). Launchers read the
 * installed plan (kc_plan_get; the defaults of kc_plan_default until one is set); nothing
 * reads the environment. */
typedef struct kc_plan {
    int pdl;              /* programmatic dependent launch of the forward's kernels (sm_90 code) */
    int pdl_off;          /* launch classes (KC_PDL_*) that go without PDL where pdl is on, a bit each */
    int norm_split;       /* RMSNorm rows of n % 512 == 0, n <= 4096 over n / 512 CTAs (same bits) in
                           * steps of up to this many tokens (0: never) */
    int swiglu_fuse;      /* F16 gate|up GEMV with the SwiGLU in its epilogue up to this many tokens */
    int gemmq_max_tok[KC_N_QTYPES]; /* per quantized type (kc_qtype_index): the tensor-core quantized
                           * matmul from KC_GEMV_MAX_TOK + 1 up to this many tokens (0: never),
                           * then dequantize + cuBLAS */
    int gemmq_wg;         /* that matmul on Hopper's wgmma (gemmq_wg.cu) where the device runs it */
    int f16_wg_max_tok;   /* F16 weights from KC_GEMV_MAX_TOK + 1 up to this many tokens on those
                           * wgmma tiles (with gemmq_wg, where the device runs them; 0: never),
                           * then cuBLAS */
    int glu_tiles;        /* kc_matmul_glu past the GEMV: the gated activation in the epilogue of
                           * gate|up's wgmma tiles where they take it (no gate|up output) */
    int att_tc;           /* tensor-core attention where kc_attention_tc_ok (0: the per-head kernels) */
    int att_tc_min_tok;   /* decode steps of fewer tokens take the per-head kernel ... */
    int att_tc_long_ctx;  /* ... unless their longest context reaches this many positions */
    int att_pf_warps;     /* prefill attention CTAs: 4 or 8 warps */
    int att_pf_split_warps; /* a step whose prefill keys split (kc_plan_pf_splits) and whose chunks
                           * each fit a tile of this many warps (4: 64 rows, two CTAs an SM; or 8)
                           * runs them on CTAs of that size */
    int att_pf_fa3;       /* 1: prefill attention on the wgmma kernel where kc_attention_fa3_ok (F16
                           * cache; kc_plan_choose takes it where the kernel runs), 0: mma.sync */
    int att_pf_fa3_ctas;  /* steps that split their prefill keys run on the wgmma kernel (with
                           * att_pf_fa3) in one wave of this many CTAs (one an SM; kc_plan_pf_splits_fa3);
                           * 0: on the mma.sync kernel (att_pf_split_warps) */
    int att_dec_ctas;     /* tensor-core decode: the CTAs of one wave (resident at once); a launch
                           * has splits for two waves (kc_plan_dec_splits) ... */
    int att_dec_min_chunk; /* ... and a step uses them down to this many positions a split, but
                           * at least a wave's worth (kc_plan_dec_chunk; a multiple of 64) */
    int att_dec_hpw;      /* tensor-core decode without splits (an F16 cache, or an FP8 one with at most 8
                           * query heads to a KV head): from this many
                           * (token, KV head) pairs a warp takes a KV head's keys whole (CTAs of 4
                           * KV heads) instead of a quarter of them; 0: never */
    int att_dec_pair;     /* the same below att_dec_hpw for the FP8 keys-as-rows decode: from this many
                           * pairs two warps a KV head (CTAs of 2 KV heads, the pair's states merged
                           * in shared memory); 0: never */
    int att_chunk;        /* the per-head decode kernel: positions per split (att_ph_splits 0), or
                           * the most a split takes */
    int att_ph_splits;    /* > 0: the per-head decode kernel cuts a token's keys into about this
                           * many splits of a multiple of 16 positions (kc_att_split_len), from
                           * its own position; 0: splits of att_chunk positions */
    int graph_max_tok;    /* the largest decode batch captured as a CUDA graph */
    int fp8_gemm;         /* F8_E4M3 weights past the GEMV: cuBLASLt's FP8 GEMM (1) or dequantize + cuBLAS (0) */
    int fp8_fast_accum;   /* cuBLASLt's FP8 fast accumulation (CUBLASLT_MATMUL_DESC_FAST_ACCUM) */
    int q8_mma_max_tok;   /* Q8_0 matrices (rows of whole pairs of blocks) from KC_GEMV_MAX_TOK + 1
                           * up to this many tokens (at most 32; 0: none) on int8 mma.sync against
                           * the two-level int8 activations (kc__gemm_q8i) instead of the wgmma
                           * tiles; their producers then write those activations for such steps */
    int q4k_mma_max_tok;  /* the same for Q4_K matrices (at most 16 tokens; 0: none) */
    int qgemv_max_tok;    /* Q8_0 and Q4_K matrices: the integer GEMV up to this many tokens (1 to
                           * KC_GEMV_MAX_TOK), past it kc__gemm_q8i (q8_mma_max_tok /
                           * q4k_mma_max_tok) or the tensor-core tiles; the other types keep the
                           * GEMV to KC_GEMV_MAX_TOK. Steps of up to this many tokens give a
                           * token's row the same bits as alone (the GEMV's sums do not depend on
                           * the batch) */
    int fp8_lt_tune;      /* 1: each FP8 shape and count takes the faster of the outer-vector scales
                           * and unit scales + a scale pass, timed at start-up (kc_matmul_tune_f8);
                           * 0: the outer-vector scales everywhere */
    int fp8_wg;           /* 1: the FP8 wgmma tiles (kc__gemm_f8_wg) are timed too and take the shapes
                           * and counts where they beat cuBLASLt (needs fp8_lt_tune) */
    int fp8_raw;          /* 1: FP8 Q|K|V (into an FP8 KV cache) and gate|up past the GEMV take
                           * cuBLASLt's unit-scale sums, their reader applying the scales
                           * (kc_matmul_f8_raw), where kc_matmul_tune_f8 timed that faster */
    int moe_fuse;         /* mixture-of-experts steps of up to this many tokens (0: none, at most
                           * KC_GEMV_MAX_TOK): the FFN norm, router and routing in one launch
                           * (kc_moe_norm_route), the SwiGLU in the gate|up GEMV (kc_moe_gemvq_glu), the
                           * down GEMV quantizing its input (kc_moe_gemvq_f) */
    int x_plain;          /* 1: kc_matmul_x_order asks for x as half as it is (KC_X_PLAIN) where F16
                           * weights run on cuBLAS, so the norms and the gated activation write it
                           * for them; 0: the matmul converts x */
    int rope_tok;         /* steps of at least this many tokens rotate q and k a token a CTA, the
                           * angles once for all its heads (0: never; one CTA per token and head) */
    int att_pf_half;      /* 1: a step of prefill tiles alone on the wgmma kernel, wo on cuBLAS,
                           * gets the attention's output as half (kc_attention_prefill_fa3_half) */
    int f16_lt_min_tok;   /* F16 matrices on cuBLAS from this many tokens take the cuBLASLt
                           * algorithm kc_matmul_tune_f16 timed fastest for their shape at start-up
                           * (0: cublasGemmEx's own choice always) */
    int glu_half_min_tok; /* F16 gate|up on cuBLAS from this many tokens writes half rows for the
                           * gated activation (kc_glu_half_use; 0: f32 rows) */
    int qkv_half_min_tok; /* F16 Q|K|V on cuBLAS from this many tokens writes half rows for the
                           * rotation (kc_qkv_half_use, where kc_rope_pf_ok; 0: f32 rows) */
    int pf_q_half;        /* 1: a step of prefill tiles alone on the wgmma kernel gets q from the
                           * rotation as the kernel's half operand (kc_rope_store_kv_pf; same bits) */
    int att_pf_f8_fa3;    /* 1: a step's unsplit prefill tiles over an FP8 cache (alone or beside
                           * decode tokens) copy their sequences' blocks to an F16 scratch
                           * (kc_kv_f8_to_half) for the Hopper prefill kernel, where the scratch
                           * holds them; 0: the mma.sync kernel reads the FP8 cache */
    int f8_x_img;         /* 1: an F8_E4M3 matrix on cuBLASLt's FP8 GEMM takes its activations as
                           * codes and token scales written by their producer (RMSNorm, the gated
                           * activation: KC_X_F8) instead of quantizing f32 rows itself (same bits) */
    int norm_rows_min_tok; /* RMSNorm rows of n % 512 == 0, n <= 4096 in steps of at least this many
                           * tokens (past norm_split): one CTA of 128 threads a row, n / 512 float4
                           * each, all loads in flight (same bits; 0: never) */
    int moe_pre;          /* one-token MoE steps (moe_fuse): bit 0, the gate|up launch lets the down
                           * launch start only past its wait; bit 1, the down launch requests the
                           * rows of the choice it reads before its wait, checked after it; bit 2,
                           * the gate|up launch too (a measurement: in the forward the routing has
                           * not finished then). Same bits with every value */
    int mixed_one;        /* 1: one token times a mixed matrix of two ranges, Q4_K or Q5_K then Q6_K
                           * (Q|K|V of a Q4_K_M / Q5_K_M file), in one launch whose CTAs take
                           * either range (same bits); 0: a launch a range, one after the other */
    int f16_tc;           /* 1: the F16 GEMV of 1-8 tokens on mma.sync (exact products, f32 sums:
                           * phi3-tiny96's decode 100 % top-1 against the CPU, but llama2-7b batch 1
                           * 22 % slower; the default of MoE models); 0: half2 FMA (products and
                           * sums of two rounded to half, added in f32) */
    int qkv_rope;         /* 1: one token's K-quant Q|K|V GEMV rotates its own heads and stores K
                           * and V (kc_matmul_qkv_rope: no RoPE launch; same bits) */
    int att_pf_persist;   /* 1: an unsplit launch of the wgmma prefill kernel is persistent (one CTA
                           * an SM, tiles from a counter; the next tile's keys load under this one's
                           * last products and output) */
} kc_plan;
/* Device-independent defaults (what kc_plan_get returns before a plan is set). */
void kc_plan_default(kc_plan *p);
/* The plan for device `device` and a model of these attention shapes, with n_expert experts a
 * MoE layer (0: a dense model). Returns 0 or CM_ECUDA. */
int  kc_plan_choose(int device, int head_dim, int n_head, int n_kv, int block_size, int n_expert, kc_plan *p);
/* Applies "key=value[,key=value...]" (keys: the field names above; gemmq_max_tok_q8_0 / _q4_0 /
 * _q4_k / _q4_1 / _q5_0 / _q5_1 / _q5_k / _q6_k for the array). CM_EINVAL with the offending key
 * or value named in err, and p as it was. */
int  kc_plan_override(kc_plan *p, const char *spec, char *err, size_t errlen);
/* "key=value ..." of every field, for the start-up log. */
void kc_plan_format(const kc_plan *p, char *buf, size_t n);
/* Tensor-core decode splits (attention_tc.cu's decode kernel: one CTA per token, KV head and
 * split). kc_plan_dec_splits: the splits a launch of n_dec tokens gets: two waves of
 * att_dec_ctas in whole splits per (token, KV head), at least 1, at most one per 64 positions of
 * n_ctx. kc_plan_dec_chunk: the positions a split takes in a step whose longest context ends at
 * max_pos: the step uses the fewest splits of at least att_dec_min_chunk positions, but no fewer
 * than one wave's splits and no more than n_split (64-position units). Short splits cost a
 * partial each in the merge at the end of the launch and the ramp of a CTA; too few CTAs leave
 * SMs idle (bench/RESULTS.md, "2026-11-28 (seventh session)"). */
int kc_plan_dec_splits(const kc_plan *p, int n_kv, int n_dec, int n_ctx);
int kc_plan_dec_chunk(const kc_plan *p, int n_kv, int n_dec, int n_split, int max_pos);
/* Prefill tiles split over the keys (kc_attention_prefill_tc_split): where n_tiles x n_kv CTAs
 * are at most half a wave (att_dec_ctas), up to two waves of splits of at least att_dec_min_chunk
 * positions of the longest context (ending at max_pos), at most KC_PF_MAX_SPLIT; *kchunk: the
 * positions a split takes. 1: no split. */
int kc_plan_pf_splits(const kc_plan *p, int n_kv, int n_tiles, int max_pos, int *kchunk);
/* The same for the wgmma kernel (att_pf_fa3_ctas > 0): where n_tiles x n_kv CTAs are at most
 * half of att_pf_fa3_ctas, one wave of splits of whole 128-position tiles, each at least
 * att_dec_min_chunk positions, at most KC_PF_MAX_SPLIT. 1: no split. */
int kc_plan_pf_splits_fa3(const kc_plan *p, int n_kv, int n_tiles, int max_pos, int *kchunk);
/* CTAs of the tensor-core decode kernel that fit an SM at head dim hd (F16 cache); 0 if unknown. */
int kc_attention_dec_per_sm(int hd);
/* Installs p for every launcher of this process (before the first launch or capture). */
void kc_plan_set(const kc_plan *p);
const kc_plan *kc_plan_get(void);
int  kc_pdl_on(void); /* the installed plan's pdl, where the device code allows it */
/* Launch classes for the plan's pdl_off: bit 0 the rest, 1 decode attention, 2 norms, 3 rotation
 * and KV stores; the wgmma tiles (kc__gemmq_wg) in configuration c: 4 + c the types whose weights
 * stream through a ring in shared memory, 16 + c Q8_0 (weights streamed into registers), 28 + c
 * F16 (c < 3). */
enum { KC_PDL_OTHER = 0, KC_PDL_ATT_DEC = 1, KC_PDL_NORM = 2, KC_PDL_ROPE = 3, KC_PDL_WG0 = 4, KC_PDL_WGQ8 = 16, KC_PDL_WGF16 = 28 };
int  kc_pdl_class(int cls); /* sets this thread's launch class, returns the previous one */

/* Activations quantized for the integer GEMVs (quantized weights, up to KC_GEMV_MAX_TOK
 * tokens): per block of 32 values x ~ d (qh + ql / 256) with qh = round(x / d),
 * ql = round(256 (x / d - qh)) clamped to +-127 and d = amax / 127 (about 16 significant
 * bits, the CPU backend's two-level scheme). qh, ql: [n_tok][n] int8; m: [n_tok][n / 32] pairs
 * {d / 256 as float bits, S = sum of 256 qh + ql}, so a block's dot product with integer
 * weights w is (d / 256) * (256 sum(w qh) + sum(w ql)), exact in int32. The buffers hold
 * up to cap_tok tokens of cap_n values; n is the row length of what was last written. */
typedef struct kc_xq {
    int8_t  *qh, *ql;
    int32_t *m;
    kc_half *xh;     /* may be NULL: the same values as half [n_tok][n], read by the F16 GEMV */
    int      cap_tok, cap_n, n;
    int      no_ints; /* 1: producers write only xh (no integer GEMV reads these activations, so
                       * the blocks are not computed); the integer GEMVs then quantize x themselves */
    /* x's image for the wgmma tiles, or x as half as it is for cuBLAS (KC_X_PLAIN), in the order
     * kc_matmul_x_order gives: where img_order != 0 and img holds img_cap halves, kc_rmsnorm_xq
     * and kc_glu_xq also write their output there in that order and set img_tok and img_n
     * (img_tok = 0: nothing written). kc_matmul_xq then reads it instead of converting x, when
     * order, tokens and row length agree; the caller clears img_tok once that matmul has run
     * (x_half is every matmul's scratch). Order KC_X_F8: the rows as E4M3 codes, one byte an
     * activation in img's bytes, and one scale a token in img_scale (img_scale_cap tokens). */
    kc_half *img;
    size_t   img_cap;
    int      img_order, img_tok, img_n;
    float   *img_scale;
    int      img_scale_cap;
} kc_xq;

/* kc_xq.img_order of x as half, row after row as it is: what cuBLAS reads (the tiles' orders are 1-3). */
#define KC_X_PLAIN 4
/* kc_xq.img_order of x quantized per token for an F8_E4M3 matrix on cuBLASLt's FP8 GEMM: codes
 * [n_tok][n] bytes and scales as kc_quantize_f8 writes them (the same bits), written by
 * kc_rmsnorm_xq and kc_glu_xq instead of the matmul's own quantization pass. */
#define KC_X_F8 5
/* Whether the producers (kc_rmsnorm_xq, kc_glu_xq, gate|up's wgmma epilogue) of n_tok rows of n
 * write the image xq asks for (img_order != 0, and it fits img_cap): then they may be given no f32
 * output when the image's matmul is its only reader. */
int kc_xq_img_fits(const kc_xq *xq, int n_tok, int n);

/* Quantizes x [n_tok, n] (n % 32 == 0, n_tok <= xq->cap_tok, n <= xq->cap_n) into xq. */
int kc_quantize_x(const float *x, int n_tok, int n, kc_xq *xq, cudaStream_t s);

/* Repacks n_rows rows of GGUF blocks (host memory, `type`) into the kc_weight layout in
 * host buffers qs_out / d_out (sized by kc_weight_sizes: the bytes of n_out rows of a uniform
 * weight; CM_EINVAL when n_in is not whole blocks, CM_EUNSUPPORTED for types the kernels do not
 * read). F32/F16/BF16 are copied as they are. */
int kc_weight_sizes(int type, int n_in, int n_out, size_t *data_bytes, size_t *d_bytes);
int kc_weight_repack(int type, const void *src, int n_in, int n_rows, void *qs_out, kc_half *d_out);

/* x[t][:] = row ids[t] of table (n_vocab rows of n_embd elements of table->type) as f32. */
int kc_embed(const kc_weight *table, const int32_t *ids, int n_tok, float *x, cudaStream_t s);

/* RMSNorm: y[t] = x[t] / rms(x[t]) * w. x, y: [n_tok, n] f32 (may not alias), w: [n] f32.
 * With xq (may be NULL): when n_tok <= xq->cap_tok and n % 32 == 0, y is also written
 * quantized into xq (as kc_quantize_x would), else xq->n is set to 0 (nothing written).
 * y may be NULL when the row is quantized (n % 32 == 0, n <= 32768) or written as x's image
 * (kc_xq_img_fits, n <= 32768): only xq is written, for matrices that read nothing else
 * (kc_matmul_reads_x, kc_xq.img); CM_EINVAL when nothing would be written. */
int kc_rmsnorm(const float *x, const float *w, float *y, int n_tok, int n, float eps, cudaStream_t s);
int kc_rmsnorm_xq(const float *x, const float *w, float *y, kc_xq *xq, int n_tok, int n, float eps, cudaStream_t s);
/* Rows of n % 512 == 0, n <= 4096 are normalized by n / 512 CTAs per token, which give the
 * same bits as one CTA per token (kc_plan.norm_split: up to how many tokens; past it one CTA per token). */

/* Workspace for the cuBLAS path of kc_matmul (allocated once by the backend). */
typedef struct kc_gemm_ws {
    void    *cublas;      /* cublasHandle_t bound to the stream by the caller */
    kc_half *w_half;      /* dequantized weight tile: max n_in * n_out halves */
    kc_half *x_half;      /* activations as half: max n_tok * n_in */
    size_t   w_cap, x_cap; /* capacities in halves */
    kc_xq    xq;          /* scratch for quantizing activations of quantized GEMVs (cap_tok may be 0) */
    /* F8_E4M3 weights past KC_GEMV_MAX_TOK tokens (fp8.cu): cublasLtHandle_t (NULL: dequantize +
     * cuBLAS instead), its workspace, and one f32 scale per token (x_scale_cap tokens) for the
     * activations quantized to E4M3 codes in x_half's bytes. Zeros: the fallback path only. */
    void    *cublaslt;
    void    *lt_ws;
    size_t   lt_ws_bytes;
    float   *x_scale;
    int      x_scale_cap;
    /* the unit-scale FP8 GEMM's f32 output before its scale pass (kc_matmul_tune_f8's scalar
     * path; NULL: outer-vector scales only): f8_raw_cap floats */
    float   *f8_raw;
    size_t   f8_raw_cap;
} kc_gemm_ws;

/* Times cublasGemmEx and cuBLASLt's heuristic algorithms for each F16 matrix shape of W[0..n_w)
 * that runs on cuBLAS (with a half output where half_out[i], non-NULL, says so: gate|up of
 * kc_glu_half_use or Q|K|V of kc_qkv_half_use, from the smaller of the plan's glu_half_min_tok and
 * qkv_half_min_tok), at token counts from the plan's f16_lt_min_tok, doubling, up to max_tok
 * (at most KC_TUNE_MAX_TOK), on the real weights, random activations in ws->x_half and a scratch
 * output it allocates for the call (freed before it returns), and keeps the fastest per shape
 * and count for kc_matmul: a step of n tokens takes the entry of the largest count <= n. Run it
 * before graphs are captured, with nothing else on the stream; it synchronizes. Shapes timed
 * before are kept. report (may be NULL) gets one line: shapes, counts, cuBLASLt's wins and their
 * gains. 0, or CM_ENOMEM (no room for the scratch output: nothing timed), CM_ECUDA. */
#define KC_TUNE_MAX_TOK 8192
int kc_matmul_tune_f16(const kc_weight *const *W, const unsigned char *half_out, int n_w, int max_tok, const kc_gemm_ws *ws,
                       cudaStream_t s, char *report, size_t report_len);
/* The F8_E4M3 matrices of W[0..n_w) on cuBLASLt's FP8 GEMM (the plan's fp8_gemm and fp8_lt_tune,
 * FP8 tensor cores), each with the accumulate flag its matmul passes (acc[i]; NULL: 0), at 16,
 * 32, ... tokens up to max_tok (at most KC_TUNE_MAX_TOK, ws->x_scale_cap and what ws->f8_raw
 * holds): the row and token scales as cuBLASLt's outer vectors (its one algorithm) against
 * unit scales on each of the heuristic's algorithms (up to 8) followed by a scale pass from
 * ws->f8_raw, on the real weights and random activation codes in x_half's bytes. The scalar path
 * is kept where it beats the outer one by more than 3 %. With the plan's fp8_wg, on sm_90a, the
 * FP8 wgmma tiles' configurations (kc__gemm_f8_wg, n_in % 128 == 0) are timed too and kept where
 * they beat that pick by more than 3 %. A matmul of n tokens takes the entry of the largest timed
 * count <= n: the tiles for n below twice that count, the scalar path where cuBLASLt accepts its
 * algorithm for n and f8_raw holds the output, else the outer-vector scales. Before graphs are captured; it synchronizes. 0,
 * CM_ENOMEM (nothing timed), CM_ECUDA. */
int kc_matmul_tune_f8(const kc_weight *const *W, const unsigned char *acc, int n_w, int max_tok, const kc_gemm_ws *ws,
                      cudaStream_t s, char *report, size_t report_len);
/* y (row stride ldy) (+)= W x for an F8_E4M3 W (n_in % 128 == 0) and a KC_X_F8 image (codes x
 * [n_tok][n_in], 16-byte aligned, token scales xs) on Hopper's FP8 wgmma, the row and token scales
 * and the residual in the launch (gemm_f8_wg.cu, sm_90a code): configuration cfg <
 * kc__gemm_f8_wg_ncfg() (0 where the device or the build has no sm_90a code). kc_matmul_tune_f8
 * times the configurations against cuBLASLt; kc__gemm_f8_wg_name writes one's name into buf. */
int kc__gemm_f8_wg(const kc_weight *W, const uint8_t *x, const float *xs, int n_tok, float *y, int ldy, int accumulate, int cfg,
                   cudaStream_t s);
int kc__gemm_f8_wg_ncfg(void);
const char *kc__gemm_f8_wg_name(int cfg, char *buf, size_t len);
/* 1 where configuration cfg sums in the tensor cores' fast accumulation (no f32 partials a K step):
 * the tune times it only under the plan's fp8_fast_accum */
int kc__gemm_f8_wg_fast(int cfg);
/* y (row stride ldy) (+)= W x for a Q8_0 W (n_in % 64 == 0) and n_tok (1-32) tokens, or a Q4_K W
 * and 1-16 tokens, of xq's two-level int8 activations (xq->n == W->n_in) on int8 mma.sync
 * (gemmq.cu); kc_matmul takes it for the plan's q8_mma_max_tok / q4k_mma_max_tok. A token's row
 * is the same bits alone and in a batch. */
int kc__gemm_q8i(const kc_weight *W, const kc_xq *xq, int n_tok, float *y, int ldy, int accumulate, cudaStream_t s);
/* Forgets every timed shape, F16 and FP8 (tests). */
void kc_matmul_tune_reset(void);

/* y[t][o] (+)= sum_i W[o][i] * x[t][i]. x: [n_tok, n_in] f32, y: [n_tok, n_out] f32.
 * accumulate = 1 adds into y (residual fusion). Quantized weights: the integer GEMV below
 * KC_GEMV_MAX_TOK + 1 tokens, kc_gemmq up to the plan's gemmq_max_tok, else dequantized into
 * ws->w_half (in slices of rows) for cuBLAS. Others: our GEMV up to KC_GEMV_MAX_TOK tokens,
 * then cuBLAS with f16 operands and f32 accumulation (F32 weights: SGEMM); F16 weights up to
 * the plan's f16_wg_max_tok on gemmq_wg.cu's wgmma tiles (x as their image) where they run. */
#define KC_GEMV_MAX_TOK 8
/* The order in which kc_matmul(W, ., n_tok, ., ., ws, .) converts x into ws->x_half as the image of
 * the wgmma tiles' stages (0: it does not; kc_xq.img). */
int kc_matmul_x_order(const kc_weight *W, int n_tok, const kc_gemm_ws *ws);
/* Whether kc_matmul_xq of W for n_tok tokens reads x itself, given activations quantized for
 * it in xq: 0 for the integer GEMVs and the F16 GEMV on the half copy. */
int kc_matmul_reads_x(const kc_weight *W, int n_tok);
int kc_matmul(const kc_weight *W, const float *x, int n_tok, float *y, int accumulate,
              const kc_gemm_ws *ws, cudaStream_t s);
/* The same, for quantized weights taking their activations already quantized when xq holds
 * them (xq->n == W->n_in and n_tok <= KC_GEMV_MAX_TOK): the producer (kc_rmsnorm_xq,
 * kc_swiglu_xq) wrote them, saving the quantization launch. The quantized GEMVs run on
 * integer dot products (dp4a) against these two-level activations; without xq, kc_matmul
 * quantizes x into ws->xq first. x is still read by the cuBLAS path. KC_WEIGHT_MIXED weights:
 * each row range on its type's path (activations quantized or converted once for all). */
int kc_matmul_xq(const kc_weight *W, const float *x, const kc_xq *xq, int n_tok, float *y, int accumulate,
                 const kc_gemm_ws *ws, cudaStream_t s);

/* FP8 (fp8.cu). Whether the current device has FP8 tensor cores (sm_89 and newer): without
 * them F8_E4M3 weights still run (GEMV: codes expanded in registers; larger steps dequantized
 * to F16 for cuBLAS), but the backend keeps FP8 only where the fallbacks say so. */
int kc_fp8_tensor_cores(void);
/* Activations per token as E4M3 codes with one scale each: scale[t] = amax(x[t]) / 448 and
 * q[t][i] = e4m3_sat(x[t][i] / scale[t]) (f32 division; 0 codes when the scale is 0): the
 * rounding of dt_fp8_scale / dt_fp8_encode. x: [n_tok, n] f32, q: [n_tok, n] bytes. */
int kc_quantize_f8(const float *x, int n_tok, int n, uint8_t *q, float *scale, cudaStream_t s);

/* Quantized weights (every kc_weight_is_quant type, mixed ones range by range) times half
 * activations on tensor cores, dequantizing in registers (kc_matmul's path past
 * KC_GEMV_MAX_TOK tokens; no dequantized copy of W). x: [n_tok, n_in] half, y: [n_tok, n_out]
 * f32 (+= with accumulate). cfg: the tile configuration (0 .. kc_gemmq_ncfg() - 1, see
 * gemmq.cu) or -1 to choose by n_tok. kc_gemmq_ok: whether W's shape is taken (n_in % 128 ==
 * 0; K-quants: % 256). */
int  kc_gemmq_ok(const kc_weight *W);
int  kc_gemmq_ncfg(void);
/* kc_matmul takes kc_gemmq for quantized weights from KC_GEMV_MAX_TOK + 1 tokens up to the
 * plan's gemmq_max_tok of the type (below, the integer GEMV; beyond, dequantizing into
 * ws->w_half for cuBLAS). */
int  kc_gemmq(const kc_weight *W, const kc_half *x, int n_tok, float *y, int accumulate, int cfg, cudaStream_t s);

/* out[t][j] = silu(gu[t][2j]) * gu[t][2j + 1]. gu: [n_tok, 2*n_ff] f32, gate and up interleaved
 * (the backend's gate|up matrix interleaves their rows: row 2j is gate row j, 2j + 1 up row j),
 * out: [n_tok, n_ff] f32. */
int kc_swiglu(const float *gu, float *out, int n_tok, int n_ff, cudaStream_t s);
/* The same, also writing out quantized into xq (see kc_rmsnorm_xq; xq may be NULL) and as the
 * image xq asks for. out may be NULL when the output is quantized or written as that image
 * (kc_xq_img_fits); CM_EINVAL otherwise. */
int kc_swiglu_xq(const float *gu, float *out, kc_xq *xq, int n_tok, int n_ff, cudaStream_t s);
/* out = SwiGLU(W x) for an interleaved gate|up matrix W (2 n_ff rows): kc_matmul_xq into gu,
 * then kc_swiglu_xq into out / xq_act; or one kernel where W is F16 on the GEMV with an even
 * number of rows per warp (a warp holds gate row j and up row j) and only the half copy is
 * wanted (xq_act->no_ints; out may be NULL), for one token: then gu is not written. The same
 * bits either way (the plan's swiglu_fuse: up to how many tokens). */
int kc_matmul_swiglu(const kc_weight *W, const float *x, const kc_xq *xq, int n_tok, float *gu, float *out, kc_xq *xq_act,
                     const kc_gemm_ws *ws, cudaStream_t s);

/* y[t][j] += bias[j]. y: [n_tok, n] f32. */
int kc_add_bias(float *y, const float *bias, int n_tok, int n, cudaStream_t s);

/* Testing only: enqueues a kernel that traps, so the stream's next synchronizing call fails
 * the way a faulting kernel does (the backend's fatal path, --cuda-fault-at-step). */
int kc_fault(cudaStream_t s);

/* Rotary parameters (see model/model.h). */
typedef struct kc_rope {
    int   layout;      /* MDL_ROPE_ADJACENT / MDL_ROPE_HALF */
    int   rope_dim;
    float base;
    int   scaling;     /* MDL_ROPE_SCALING_* */
    float factor, low_freq_factor, high_freq_factor;
    int   orig_ctx;
    /* When freq is set (device memory, [rope_dim / 2]): pair i turns by freq[i] radians per
     * position, whatever scaling says (the host's table: yarn, longrope, any rule), and cos/sin
     * are multiplied by mscale (0 counts as 1). */
    const float *freq;
    float mscale;
    /* QK-norm before the rotation when q_norm is set (device memory, [hd] each, k_norm too):
     * each q head x = x * rsqrt(mean(x^2) + norm_eps) * q_norm, each k head with k_norm. */
    const float *q_norm, *k_norm;
    float norm_eps;
} kc_rope;

/* Applies RoPE to q and k of qkv ([n_tok, (n_head + 2*n_kv) * hd] f32: q heads, k heads, v heads)
 * at each token's position, writes q (rotated) as f32 into q_out [n_tok, n_head*hd], and writes
 * rotated k and v as half into the paged cache of this layer:
 * cache layout [n_blocks][n_kv][block_size][hd] for K and for V.
 * slot of token t: block_tables[seq[t] * max_blocks + pos[t] / block_size], pos[t] % block_size.
 * pos, seq and block_tables are read before the programmatic wait (kc_launch): they must not be
 * written by the kernel launched just before this one (the backend stages them by copy). */
int kc_rope_store_kv(const float *qkv, float *q_out, kc_half *k_cache, kc_half *v_cache,
                     const int32_t *pos, const int32_t *seq, const int32_t *block_tables, int max_blocks,
                     int n_tok, int n_head, int n_kv, int hd, int block_size, const kc_rope *rope, cudaStream_t s);

/* Prefill-sized steps (kc_rope_pf_ok: at least the plan's rope_tok tokens, whole rotations,
 * head dim % 8 == 0 and <= 256, no QK-norm): kc_rope_store_kv's rotation and cache stores (the
 * same bits) with qkv as f32 or, qkv_half, as half (each value converted exactly: the bits of the
 * f32 call on those values), and q as f32 or, q_half, as the halves of q x q_scale (q_scale =
 * kc_attention_fa3_qscale(scale): the wgmma prefill kernel's Q operand, bit for bit what it makes
 * of the f32 q; it takes them as its q_half). */
int kc_rope_pf_ok(int n_tok, int hd, const kc_rope *rope);
int kc_rope_store_kv_pf(const void *qkv, int qkv_half, void *q_out, int q_half, float q_scale, kc_half *k_cache,
                        kc_half *v_cache, const int32_t *pos, const int32_t *seq, const int32_t *block_tables,
                        int max_blocks, int n_tok, int n_head, int n_kv, int hd, int block_size, const kc_rope *rope,
                        cudaStream_t s);

/* What kc_matmul_qkv_rope does after the GEMV of one token's Q|K|V rows: kc_rope_store_kv's
 * rotation of q into q_out and of k into the F16 cache, and v into the cache, at the token's
 * pos[0] / seq[0] slot. counters: [n_head + n_kv] ints, zero before the first call and left zero. */
typedef struct kc_qkv_rope {
    float *q_out;
    kc_half *k_cache, *v_cache;
    const int32_t *pos, *seq, *block_tables;
    int max_blocks, n_head, n_kv, hd, block_size;
    kc_rope rope;
    int *counters;
} kc_qkv_rope;
/* One token: y = W x (kc_matmul_xq, no accumulation) with the rotation and cache stores of
 * kc_rope_store_kv in the same launch, the same bits as the two launches (the plan's qkv_rope):
 * the last CTA of each q or k head to finish rotates it, the CTAs of V rows store them. Returns
 * 1 when it ran, 0 when W's path does not take it (nothing enqueued: call kc_matmul_xq and
 * kc_rope_store_kv), a negative cm_err code on bad arguments. The K-quants' integer GEMVs (Q4_K,
 * Q5_K, Q6_K and the plan's mixed_one pairs) of rows up to 8,192 columns; head dim <= 256, a
 * multiple of a CTA's rows. */
int kc_matmul_qkv_rope(const kc_weight *W, const float *x, const kc_xq *xq, float *y, const kc_qkv_rope *e,
                       const kc_gemm_ws *ws, cudaStream_t s);

/* Causal paged attention for n_tok query tokens: token t attends to positions 0..pos[t] of its
 * sequence seq[t] in the cache. q: [n_tok, n_head*hd] f32; out: [n_tok, n_head*hd] f32.
 * Flash-decoding: the key range is cut into n_split chunks of `chunk` positions (n_split*chunk
 * must cover the longest context the launch can see); partials go to `partial`
 * ([n_tok, n_head, n_split, hd + 2] f32) and are merged by a second kernel. hd <= 256, hd % 8 == 0. */
int kc_attention(const float *q, const kc_half *k_cache, const kc_half *v_cache, float *out,
                 const int32_t *pos, const int32_t *seq, const int32_t *block_tables, int max_blocks,
                 int n_tok, int n_head, int n_kv, int hd, int block_size, float scale,
                 int n_split, int chunk, float *partial, cudaStream_t s);

/* The per-head kernel's ranges of keys for a token at position p (kc_attention_ex's splits):
 * splits > 0: about `splits` ranges of a multiple of 16 positions, ceil((p + 1) / splits)
 * rounded up, at most chunk; splits = 0: ranges of chunk positions. A token's ranges depend on
 * its own position only (a token's result is the same in any batch). kc_att_splits_cover: the
 * ranges a launch needs for every position up to max_pos (its n_split). */
#ifdef __CUDACC__
__host__ __device__
#endif
static inline int kc_att_split_len(int p, int chunk, int splits) {
    if (splits <= 0) return chunk;
    int len = (p + splits) / splits;
    len = (len + 15) / 16 * 16;
    return len < chunk ? len : chunk;
}
static inline int kc_att_splits_cover(int max_pos, int chunk, int splits) {
    int n = max_pos / kc_att_split_len(max_pos, chunk, splits) + 1, short_n = max_pos / 16 + 1;
    if (splits > 0 && short_n > splits) short_n = splits;
    return splits > 0 && short_n > n ? short_n : n;
}

/* The same, with the split merge done by the last CTA of each (token, head) to finish (counters:
 * [n_tok * n_head] ints, zero before the first call and left zero; NULL = a separate merge
 * kernel) and, when xq is given (hd % 32 == 0, n_tok <= xq->cap_tok), the output also written
 * as two-level int8 blocks for the wo GEMV (else xq->n = 0). kv_ready = 1 promises that every
 * key below each token's own position was written before the kernels now in the stream (a pure
 * decode step); those keys are then loaded before the kernel waits for its predecessors. out may
 * be NULL when the output is quantized (only the blocks are written); CM_EINVAL otherwise.
 * splits > 0: each token's keys in the ranges of kc_att_split_len (chunk their largest), and
 * n_split at least kc_att_splits_cover of the longest context; 0: ranges of chunk positions. */
int kc_attention_ex(const float *q, const kc_half *k_cache, const kc_half *v_cache, float *out, kc_xq *xq,
                    const int32_t *pos, const int32_t *seq, const int32_t *block_tables, int max_blocks,
                    int n_tok, int n_head, int n_kv, int hd, int block_size, float scale,
                    int n_split, int chunk, int splits, float *partial, int *counters, int kv_ready, cudaStream_t s);

/* Causal GQA attention on the tensor cores (attention_tc.cu): the query heads that share a KV
 * head are the rows of one tile, so each K/V block is read once for all of them; Q, K and V
 * meet as half, scores and outputs accumulate in f32. Only where kc_attention_tc_ok (head dim 64
 * or 128, n_head / n_kv <= 16, block_size % 16 == 0, a device with mma.sync). */
int kc_attention_tc_ok(int hd, int n_head, int n_kv, int block_size);

/* Decode: one query token per listed token (toks: [n_tok] flat token indices, staged with the
 * batch; NULL = tokens 0..n_tok-1; n_tok <= 65535), each attending to positions 0..pos[t] of
 * its sequence.
 * The keys are cut into n_split ranges of *chunk positions (a device int, staged with the batch
 * so a captured graph serves any context: n_split * *chunk must cover every token's position,
 * and *chunk % 64 == 0); partials ([n_tok, n_head, n_split, hd + 2] f32, indexed by the
 * token's place in the list) are merged by the last split's CTA (counters: [n_tok, n_head]
 * zeros, left zero; also by place in the list). out and xq as for kc_attention_ex. */
int kc_attention_decode_tc(const float *q, const kc_half *k_cache, const kc_half *v_cache, float *out, kc_xq *xq,
                           const int32_t *toks, int n_tok, const int32_t *pos, const int32_t *seq,
                           const int32_t *block_tables, int max_blocks, int n_head, int n_kv, int hd, int block_size,
                           float scale, int n_split, const int32_t *chunk, float *partial, int *counters, cudaStream_t s);

/* Prefill and chunked prefill: tiles [n_tiles][2] = (first flat token, count) of consecutive
 * tokens of one sequence, count <= kc_attention_tc_tile_tok(warps, ...); list each sequence's
 * tiles by position (the kernel starts the last tile first: the longest). warps: 4 or 8 (CTAs
 * of 16 warps x rows, the kernel plan's att_pf_warps). out: [n_tok, n_head * hd] f32. */
int kc_attention_tc_tile_tok(int warps, int n_head, int n_kv);
int kc_attention_prefill_tc(const float *q, const kc_half *k_cache, const kc_half *v_cache, float *out,
                            const int32_t *tiles, int n_tiles, const int32_t *pos, const int32_t *seq,
                            const int32_t *block_tables, int max_blocks, int n_head, int n_kv, int hd, int block_size,
                            float scale, int warps, cudaStream_t s);
/* The same with the keys split (few tiles at a long context, e.g. a small chunk of a long
 * prompt: one CTA per tile and KV head leaves SMs idle): CTAs per (tile, KV head, split), split
 * j taking key positions [j kchunk, (j + 1) kchunk) (kchunk % 64 == 0); 1 <= n_split <=
 * KC_PF_MAX_SPLIT. Splits write partials [n_tiles][n_kv][16 warps][n_split][hd + 2] that the last
 * split's CTA of a (tile, KV head) merges (counters: [n_tiles][n_kv] zeros, left zero). f8: the
 * caches are FP8 (as kc_attention_prefill_tc_f8). n_split 1: kc_attention_prefill_tc's results. */
#define KC_PF_MAX_SPLIT 32
int kc_attention_prefill_tc_split(const float *q, const void *k_cache, const void *v_cache, float *out,
                                  const int32_t *tiles, int n_tiles, const int32_t *pos, const int32_t *seq,
                                  const int32_t *block_tables, int max_blocks, int n_head, int n_kv, int hd, int block_size,
                                  float scale, int warps, int f8, int n_split, int kchunk, float *partial, int *counters,
                                  cudaStream_t s);

/* Prefill as kc_attention_prefill_tc, on Hopper's wgmma (attention_fa3.cu, sm_90a code): CTAs
 * of 128 query rows (tiles of kc_attention_fa3_tile_tok tokens, = kc_attention_tc_tile_tok(8,
 * ...)), K/V tiles of 128 positions loaded by a warp group of their own. F16 cache; soft-cap
 * and window (kc_attention_mods) as the other kernels. kc_attention_fa3_ok: head dim 64 or
 * 128, n_head / n_kv <= 16, block_size a power of two >= 16, and a device of compute
 * capability 9.0 with this build's sm_90a code (else the launcher returns CM_EINVAL: use
 * kc_attention_prefill_tc). Each computing warp group's softmax of a key tile overlaps P V of the
 * previous one, and the two groups take turns to issue their products (ping-pong). Unsplit
 * launches of more (tile, KV head) items than att_pf_fa3_ctas are persistent where the plan says
 * so (att_pf_persist): their CTAs take items from a counter of the device's, so two such launches
 * must not run at once on one device (the backend's forwards are on one stream). */
int kc_attention_fa3_ok(int hd, int n_head, int n_kv, int block_size);
int kc_attention_fa3_tile_tok(int n_head, int n_kv);
/* The factor the wgmma prefill kernel applies to f32 q before rounding it to half (softmax scale
 * x log2 e): what kc_rope_store_kv_pf takes to write that operand itself. The launchers below
 * read q (f32), or where q_half is not NULL that operand as kc_rope_store_kv_pf wrote it (the
 * same bits; q is then not read). */
float kc_attention_fa3_qscale(float scale);
int kc_attention_prefill_fa3(const float *q, const kc_half *q_half, const kc_half *k_cache, const kc_half *v_cache, float *out,
                             const int32_t *tiles, int n_tiles, const int32_t *pos, const int32_t *seq,
                             const int32_t *block_tables, int max_blocks, int n_head, int n_kv, int hd, int block_size,
                             float scale, cudaStream_t s);
/* The same, the output as half into out_h ([n_tok, n_head * hd], each value the rounding of the
 * f32 one kc_attention_prefill_fa3 writes): x as it is (KC_X_PLAIN) for wo on cuBLAS. */
int kc_attention_prefill_fa3_half(const float *q, const kc_half *q_half, const kc_half *k_cache, const kc_half *v_cache,
                                  kc_half *out_h, const int32_t *tiles, int n_tiles, const int32_t *pos, const int32_t *seq,
                                  const int32_t *block_tables, int max_blocks, int n_head, int n_kv, int hd, int block_size,
                                  float scale, cudaStream_t s);
/* The same with the keys split (kc_attention_prefill_tc_split's arguments and partial layout,
 * 128 rows a tile): split j takes key positions [j kchunk, (j + 1) kchunk), kchunk % 128 == 0;
 * the last split's CTA of a (tile, KV head) merges on its two computing warp groups. */
int kc_attention_prefill_fa3_split(const float *q, const kc_half *q_half, const kc_half *k_cache, const kc_half *v_cache,
                                   float *out, const int32_t *tiles, int n_tiles, const int32_t *pos, const int32_t *seq,
                                   const int32_t *block_tables, int max_blocks, int n_head, int n_kv, int hd, int block_size,
                                   float scale, int n_split, int kchunk, float *partial, int *counters, cudaStream_t s);

/* ---- FP8 KV cache (--kv-cache-dtype fp8) ----------------------------------------------------
 * The layout of executor/kv.h and the CPU backend: one layer's K (or V) block holds the E4M3
 * codes [block_size][n_kv][hd] bytes, then the scales [n_kv][block_size] f32; position p of head
 * h has code = e4m3_sat(x / s), value = e4m3(code) x s, s the layer's static scale of head h
 * (a checkpoint's kv_cache_scheme) or amax / 448 of the head's hd values at that position (0:
 * all codes 0). The _f8 launchers take such caches (void pointers to the layer's blocks) and
 * otherwise behave as the F16 ones above; the attention kernels read 8 values at a time as
 * halves (code x scale in f32, rounded to half) and compute as with an F16 cache.
 * hd % 8 == 0, hd <= 256. k_scale / v_scale: [n_kv] static scales, or both NULL. */
int kc_rope_store_kv_f8(const float *qkv, float *q_out, void *k_cache, void *v_cache, const float *k_scale,
                        const float *v_scale, const int32_t *pos, const int32_t *seq, const int32_t *block_tables,
                        int max_blocks, int n_tok, int n_head, int n_kv, int hd, int block_size, const kc_rope *rope,
                        cudaStream_t s);
/* kc_rope_store_kv_f8 on an FP8 Q|K|V's unit-scale sums (kc_matmul_f8_raw): the values are qkv[t][o]
 * x sw[o] x sx[t] (the bits of kc_matmul's scale pass). Steps of a token a CTA only
 * (kc_rope_f8_scaled_ok: the plan's rope_tok, whole rotations of hd 64, 128 or 256, no QK-norm);
 * CM_EUNSUPPORTED otherwise. */
int kc_rope_f8_scaled_ok(int n_tok, int hd, const kc_rope *rope);
int kc_rope_store_kv_f8_scaled(const float *qkv, const float *sw, const float *sx, float *q_out, void *k_cache, void *v_cache,
                               const float *k_scale, const float *v_scale, const int32_t *pos, const int32_t *seq,
                               const int32_t *block_tables, int max_blocks, int n_tok, int n_head, int n_kv, int hd,
                               int block_size, const kc_rope *rope, cudaStream_t s);
int kc_attention_ex_f8(const float *q, const void *k_cache, const void *v_cache, float *out, kc_xq *xq,
                       const int32_t *pos, const int32_t *seq, const int32_t *block_tables, int max_blocks,
                       int n_tok, int n_head, int n_kv, int hd, int block_size, float scale,
                       int n_split, int chunk, int splits, float *partial, int *counters, int kv_ready, cudaStream_t s);
int kc_attention_decode_tc_f8(const float *q, const void *k_cache, const void *v_cache, float *out, kc_xq *xq,
                              const int32_t *toks, int n_tok, const int32_t *pos, const int32_t *seq,
                              const int32_t *block_tables, int max_blocks, int n_head, int n_kv, int hd, int block_size,
                              float scale, int n_split, const int32_t *chunk, float *partial, int *counters,
                              cudaStream_t s);
int kc_attention_prefill_tc_f8(const float *q, const void *k_cache, const void *v_cache, float *out,
                               const int32_t *tiles, int n_tiles, const int32_t *pos, const int32_t *seq,
                               const int32_t *block_tables, int max_blocks, int n_head, int n_kv, int hd, int block_size,
                               float scale, int warps, cudaStream_t s);
/* FP8 cache blocks as F16 cache blocks, for the Hopper prefill kernel on an FP8 cache (the plan's
 * att_pf_f8_fa3): for each pair p, block pairs[2p] of k8 / v8 (the FP8 layout above) is written
 * as block pairs[2p + 1] of kh / vh (the F16 layout: [n_kv][block_size][hd] halves a block),
 * each value code x scale in f32 rounded to half (kv_f8_expand8: the values the mma.sync
 * prefill kernel computes with). hd % 8 == 0. */
int kc_kv_f8_to_half(const void *k8, const void *v8, kc_half *kh, kc_half *vh, const int32_t *pairs, int n_pairs, int n_kv,
                     int hd, int block_size, cudaStream_t s);

/* out[r] = argmax_j logits[r][j] (lowest index on ties). logits: [n_rows, n_vocab] f32. */
int kc_argmax(const float *logits, int n_rows, int n_vocab, int32_t *out, cudaStream_t s);

/* ---- sampling (sample.cu) -------------------------------------------------------------------
 * kc_sample reproduces the executor's CPU sampler (executor/sampler.h, same transforms in the
 * same order, same float/double operations) for n_rows logits rows at once, one CTA per row.
 * Per-row parameters, logit-bias lists and penalty windows arrive in one pool the host packs
 * (executor/cuda/cuda_sample.c): kc_sample_row headers at the start, then 32-bit words the
 * rows point into. Results: one kc_sample_out per row. */
#define KC_SAMPLE_MAX_TOP    20   /* top logprob alternatives (= EX_MAX_LOGPROBS) */
#define KC_SAMPLE_MAX_WINDOW 4096 /* penalty window tokens a row may bring */
#define KC_SAMPLE_MAX_BIAS   1024 /* logit-bias entries a row may bring */
#define KC_SAMPLE_MAX_MASKED 512  /* rows of one launch that may bring a token mask */

typedef struct kc_sample_row {
    int32_t  logits_row;        /* row of the logits matrix to sample from (rows distinct) */
    int32_t  top_k;             /* <= 0 or >= n_vocab: off */
    float    temperature;       /* <= 0: greedy */
    float    top_p, min_p;      /* 1: off / 0: off */
    float    repeat_penalty, presence_penalty, frequency_penalty;
    int32_t  logprobs;          /* report the token's logprob */
    int32_t  top_logprobs;      /* 0..KC_SAMPLE_MAX_TOP alternatives */
    int32_t  n_bias, bias_off;  /* n_bias (id, bias bits) word pairs at pool word bias_off */
    int32_t  n_win, win_off;    /* penalty window: n_win token ids at pool word win_off (0: penalties off) */
    int32_t  mask_words;        /* token mask: (n_vocab + 31) / 32 words at pool word mask_off, bit t of
                                 * word t / 32 = token t allowed (0: no mask); it allows at least one */
    int32_t  mask_off;
    int32_t  mask_first;        /* the lowest allowed id: the token when every allowed z is -inf */
    int32_t  reserved;          /* 0 */
    uint64_t seed;
    int64_t  pos;               /* the draw is u = ex_rng_u01(seed, pos) (Philox4x32-10) */
} kc_sample_row;

typedef struct kc_sample_out {
    int32_t token;
    float   logprob;
    int32_t n_top;
    int32_t top_id[KC_SAMPLE_MAX_TOP];     /* by logprob desc, id asc */
    float   top_logprob[KC_SAMPLE_MAX_TOP];
} kc_sample_out;

/* Bytes of a pool for up to max_rows rows of n_vocab logits at the caps above: max_rows headers,
 * then words (the masks of up to KC_SAMPLE_MAX_MASKED rows included). */
size_t kc_sample_pool_bytes(int max_rows, int n_vocab);
/* Word index where a pool of max_rows headers starts its words. */
size_t kc_sample_pool_words_start(int max_rows);

/* Samples n_rows rows: row r of the pool reads logits + pool_row.logits_row * ld ([n_vocab]
 * f32) and writes out[r]. The logits rows it reads are overwritten with the processed values
 * (bias and penalties applied), so each row must name a different logits row. pool: device
 * copy of a pool the host packed (ids and offsets are trusted: pack it with the executor's
 * stager). 1,024 threads and 96 KiB of dynamic shared memory per row; no allocation, no sync. */
int kc_sample(float *logits, int ld, int n_vocab, const void *pool, int n_rows, kc_sample_out *out, cudaStream_t s);

/* The same algorithm run by one host thread on host memory (tests only: it compares the device
 * sampler's selection logic with the CPU sampler without a GPU). Allocates scratch per call.
 * Returns 0, CM_EINVAL or CM_ENOMEM. */
int kc_sample_host(float *logits, int ld, int n_vocab, const void *pool, int n_rows, kc_sample_out *out);

/* dst[r][:] = src[rows[r]][:] for f32 rows of n elements (gathers each sequence's last token). */
int kc_gather_rows_f32(const float *src, const int32_t *rows, int n_rows, int n, float *dst, cudaStream_t s);

/* Step trace (timing experiments; builds configured with -DARKA_CUDA_TRACE=ON): every CTA of
 * the forward pass's kernels records one kc_trace_rec, times in %globaltimer ns. */
typedef struct kc_trace_rec {
    uint32_t kind, sm, cta, n_warps;
    unsigned long long t_entry; /* the CTA started */
    unsigned long long t_wait;  /* its thread 0 passed the programmatic wait (0: none) */
    unsigned long long t_end;   /* its last warp finished */
    unsigned long long pad;
} kc_trace_rec;
enum { KC_TR_EMBED = 1, KC_TR_NORM, KC_TR_GEMV, KC_TR_GEMVQ, KC_TR_ROPE, KC_TR_ATTN, KC_TR_ATTN_MERGE, KC_TR_SWIGLU,
       KC_TR_GATHER, KC_TR_GEMMQ, KC_TR_OTHER };
/* Starts recording (room for cap CTAs; the kernels enqueued from now on record). CM_EUNSUPPORTED
 * in builds without the trace. */
int kc_trace_begin(unsigned cap);
/* Synchronizes the device, copies up to cap records to out (host) and stops recording.
 * *n_out: how many CTAs recorded (may exceed cap: the rest were dropped). */
int kc_trace_end(kc_trace_rec *out, unsigned cap, unsigned *n_out);

#ifdef __cplusplus
}
#endif


/* ---- the steps later architectures add (arch.cu) ----------------------------------------------
 * Attention modifiers for the attention launches that follow on this host thread (the three
 * launchers above read them when they enqueue): softcap > 0: scores = softcap * tanh(scores /
 * softcap) after the scale; window > 0: token t sees only positions pos[t] - window + 1 ..
 * pos[t] (sliding-window layers; the cache rows below need not exist: their blocks are never
 * read). NULL resets to neither. */
typedef struct kc_attn_mods {
    float softcap;
    int   window;
} kc_attn_mods;
void kc_attention_mods(const kc_attn_mods *m);
kc_attn_mods kc_attention_mods_get(void);
/* x[i] *= scale (the embedding scale). */
int kc_scale(float *x, size_t n, float scale, cudaStream_t s);
/* x[i] = cap * tanh(x[i] / cap), cap > 0 (final logit soft-capping). */
int kc_softcap(float *x, size_t n, float cap, cudaStream_t s);
/* x[t] += rmsnorm(y[t]) * w (a post-norm of a block's output added to the residual); x != y. */
int kc_rmsnorm_add(float *x, const float *y, const float *w, int n_tok, int n, float eps, cudaStream_t s);
/* out[t][j] = act(gate) * up (act: MDL_ACT_SILU or MDL_ACT_GELU_TANH) from rows of 2 n_ff: gate
 * and up interleaved (split 0: the backend's gate|up matrices) or gate then up (split 1: the
 * experts'); row_w (may be NULL): row t is also multiplied by row_w[t]. With xq (may be NULL) and
 * split rows: out is also written as two-level int8 blocks (qh, ql, m; see kc_xq; qh NULL: not
 * those) and as half (xq->xh, when not NULL) when n_ff % 32 == 0 and n_tok <= xq->cap_tok
 * (xq->n = n_ff, else 0); out may then be NULL. */
int kc_glu(const float *gu, float *out, kc_xq *xq, int n_tok, int n_ff, int act, int split, const float *row_w, cudaStream_t s);
/* Mixture-of-experts routing on the device: per token, softmax of the router logits
 * [n_tok, n_exp], the k most probable experts (ties: the lower index) into idx [n_tok, k] and
 * their probabilities into w (renormalized to sum 1 when norm); then the n_tok k entries
 * (entry t k + j) grouped by expert: list[off[e] .. off[e] + cnt[e]), in no fixed order within
 * an expert (the GEMVs compute each entry on its own: the order changes no result). */
int kc_moe_route(const float *logits, int n_tok, int n_exp, int k, int norm, int32_t *idx, float *w, int32_t *cnt,
                 int32_t *off, int32_t *list, cudaStream_t s);
/* Grouped GEMV: y[i] = W[e] x[i / x_div] for every entry i of every expert e (cnt, off, list
 * from kc_moe_route; n_ent entries in all, n_tok k), one launch; W: [n_exp][n_out][n_in] half
 * (n_in % 8 == 0), x rows of n_in f32, y [entries][n_out] f32. Experts without entries are not
 * read, and at most n_ent of them get CTAs. */
int kc_moe_gemv(const kc_half *W, int n_exp, int n_in, int n_out, const float *x, int x_div, const int32_t *cnt,
                const int32_t *off, const int32_t *list, int n_ent, float *y, cudaStream_t s);
/* The same over experts kept quantized (matmul.cu): W is a uniform kc_weight of n_exp x n_out
 * rows in the kc_weight layout (expert e's rows from e n_out: kc_weight_repack of each expert's
 * rows), against two-level int8 activations: each entry i of the n_tok k (kc_moe_route's) reads
 * row i / x_div of xq (kc_quantize_x, or a producer such as kc_glu; xq->n == W->n_in), and
 * writes row i of y [n_tok k][n_out] f32. The integer GEMV's dot products (dp4a); a
 * row's summation order depends only on n_in, so an entry's result does not depend on the other
 * entries of the launch. kc_moe_type_ok: whether experts of the type and row width run on these
 * kernels: F16 (kc_moe_gemv, n_in % 8 == 0), Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 (n_in % 32 == 0),
 * Q4_K, Q5_K, Q6_K (n_in % 256 == 0). */
int kc_moe_type_ok(int type, int n_in);
int kc_moe_gemvq(const kc_weight *W, int n_exp, const kc_xq *xq, int x_div, const int32_t *cnt, const int32_t *off,
                 const int32_t *list, int n_tok, int k, float *y, cudaStream_t s);
/* The MoE layer's decode-step launches (up to KC_GEMV_MAX_TOK tokens; the plan's moe_fuse):
 * - kc_moe_gemvq_glu: kc_moe_gemvq of the gate|up experts (rows of 2 n_ff: gate then up) with
 *   the SwiGLU in its epilogue: act[i] = silu(gate) * up * row_w[i] for entry i (act
 *   [n_tok k][n_ff] f32; row_w: kc_moe_route's w, may be NULL). The bits of kc_moe_gemvq then
 *   kc_glu (split rows).
 * - kc_moe_gemvq_f: kc_moe_gemvq with f32 activations x [n_tok k][n_in] (entry i reads row i):
 *   each CTA quantizes its entries' rows into shared memory, with the blocks kc_glu would have
 *   written, so the bits of kc_glu's blocks then kc_moe_gemvq.
 * With one token and idx (kc_moe_route's choices) each CTA finds its expert and entry there, and
 * cnt, off and list may be NULL (one dependent read before the weights instead of three);
 * otherwise they come from kc_moe_route's grouping.
 * Both return CM_EUNSUPPORTED, launching nothing, where they do not take the shapes or types
 * (the caller runs the separate kernels): more than KC_GEMV_MAX_TOK tokens, a type
 * kc_moe_gemvq does not take, rows of x over the shared memory (kc_moe_gemvq_f_ok). */
int kc_moe_gemvq_glu(const kc_weight *W, int n_exp, const kc_xq *xq, int x_div, const int32_t *idx, const int32_t *cnt,
                     const int32_t *off, const int32_t *list, int n_tok, int k, const float *row_w, float *act, cudaStream_t s);
int kc_moe_gemvq_f_ok(const kc_weight *W, int n_exp, int n_tok);
int kc_moe_gemvq_f(const kc_weight *W, int n_exp, const float *x, const int32_t *idx, const int32_t *cnt, const int32_t *off,
                   const int32_t *list, int n_tok, int k, float *y, cudaStream_t s);
/* The FFN pre-norm, the router and the routing in one launch (arch.cu), steps of up to
 * KC_GEMV_MAX_TOK tokens: y (may be NULL) and xq's blocks as kc_rmsnorm_xq writes them (the same
 * bits), logits [n_tok][n_exp] = router h in f32 (F32, F16 or BF16 router: a warp per expert's
 * row), then kc_moe_route's idx, w, cnt, off and list from those logits (its code). ctr: one
 * int32 on the device, 0 before the launch and left 0 after it (the last CTA routes). cnt, off
 * and list all NULL: no grouping (the choices in idx are all the consumers read). ok: whether
 * the launch takes the shapes (n % 512 == 0, n <= 4096, n_tok <= KC_GEMV_MAX_TOK, the router's
 * type, n_exp <= MDL_MAX_EXPERTS); kc_moe_norm_route returns CM_EUNSUPPORTED where it does not. */
int kc_moe_norm_route_ok(const kc_weight *router, int n_tok, int n);
int kc_moe_norm_route(const float *x, const float *norm_w, float *y, kc_xq *xq, int n_tok, int n, float eps, const kc_weight *router,
                      float *logits, int k, int norm, int32_t *idx, float *w, int32_t *cnt, int32_t *off, int32_t *list,
                      int32_t *ctr, cudaStream_t s);
/* The same on tensor cores (gemmq.cu, kc_gemmq's dequantization in registers), for steps past
 * KC_GEMV_MAX_TOK tokens: x holds half activations (entry i reads row i / x_div), the tiles of
 * one CTA are entries of one expert (8 to 64 of them, by the entries an expert has on average).
 * W: as kc_moe_gemvq, kc_gemmq_ok. */
int kc_moe_gemmq(const kc_weight *W, int n_exp, const kc_half *x, int x_div, const int32_t *cnt, const int32_t *off,
                 const int32_t *list, int n_tok, int k, float *y, cudaStream_t s);
/* out[t] (+)= sum_j y[t k + j] over the k slots in order (y rows of n). */
int kc_moe_combine(const float *y, float *out, int n_tok, int k, int n, int accumulate, cudaStream_t s);
/* kc_moe_combine (accumulating) into x, then kc_rmsnorm_xq of the new x, in one launch (norm.cu):
 * x[t] += sum_j ey[t k + j], y[t] = rmsnorm(x[t]) * w, the blocks into xq as kc_rmsnorm_xq
 * writes them; the bits of the two calls. n % 4 == 0, n <= 32768; y != x. */
int kc_rmsnorm_moe_xq(float *x, const float *ey, int k, const float *w, float *y, kc_xq *xq, int n_tok, int n, float eps,
                      cudaStream_t s);

/* x[t] += raw[t] x sw x sx[t] (an FP8 matmul's unit-scale sums from kc_matmul_f8_raw with acc: the
 * bits of kc_matmul's scale pass adding into x), written back, then kc_rmsnorm_xq of the new x
 * into y (may be NULL) and xq's image (no int8 blocks): in one launch instead of the pass and the
 * norm. raw and sw 16-byte aligned, raw != x. kc_rmsnorm_f8raw_ok: the sizes it takes (n % 4 ==
 * 0, n <= 16,384, fewer tokens than the plan's norm_rows_min_tok). */
int kc_rmsnorm_f8raw_ok(int n_tok, int n);
int kc_rmsnorm_f8raw_xq(float *x, const float *raw, const float *sw, const float *sx, const float *w, float *y, kc_xq *xq,
                        int n_tok, int n, float eps, cudaStream_t s);

/* The gated activations in general: act MDL_ACT_SILU (SwiGLU: kc_matmul_swiglu) or MDL_ACT_GELU_TANH
 * (GeGLU: gelu_tanh(gate) * up, the expression of the CPU's k_geglu), fused into the F16 GEMV
 * on the same terms as SwiGLU. kc_glu_xq: kc_swiglu_xq with the activation. */
int kc_matmul_glu(const kc_weight *W, const float *x, const kc_xq *xq, int n_tok, float *gu, float *out, kc_xq *xq_act,
                  int act, const kc_gemm_ws *ws, cudaStream_t s);
int kc_glu_xq(const float *gu, float *out, kc_xq *xq, int n_tok, int n_ff, int act, cudaStream_t s);
/* kc_glu_xq on an FP8 gate|up's unit-scale sums (kc_matmul_f8_raw): gate and up are gu[t][r] x
 * sw[r] x sx[t] (sw: the 2 n_ff row scales, 16-byte aligned; n_ff % 4 == 0), the bits of
 * kc_matmul's scale pass followed by kc_glu_xq. */
int kc_glu_xq_scaled(const float *gu, const float *sw, const float *sx, float *out, kc_xq *xq, int n_tok, int n_ff, int act,
                     cudaStream_t s);
/* An FP8 W past the GEMV as cuBLASLt's sums of the codes alone (unit scales, y[t][r] = sum_k
 * W[r][k] x[t][k] in codes, ldy = n_out, 16-byte aligned y, written: never added) where
 * kc_matmul_tune_f8 timed that, without the scale pass, faster than the path kc_matmul takes for
 * this accumulation (acc: the timings of a matmul that adds into its output): for a reader that
 * applies W->d[r] x (*xs)[t] itself (kc_glu_xq_scaled, kc_rope_store_kv_f8_scaled, and where acc
 * kc_rmsnorm_f8raw_xq's residual add). *xs: the token scales of the codes used (x's producer's
 * KC_X_F8 image, or x quantized here). 1: not taken (no timed entry for it, the plan, the
 * shape): the caller runs kc_matmul; 0 done; < 0 an error. */
int kc_matmul_f8_raw(const kc_weight *W, const float *x, const kc_xq *xq, int n_tok, float *y, const float **xs, int acc,
                     const kc_gemm_ws *ws, cudaStream_t s);
/* Prefill-sized steps (the plan's glu_half_min_tok) of an F16 gate|up on cuBLAS (kc_glu_half_use):
 * kc_matmul_glu writes gate|up's output as half into gu's memory (kc_matmul_half_out: f32 sums,
 * each output rounded once) and takes the activation of those halves (kc_glu_xq_half: kc_glu_xq
 * on half rows; n_ff % 4 == 0, n_tok <= 65535). Half the bytes of the f32 rows, written and
 * read again; gate and up are rounded to half before the product, as the product is after it. */
int kc_glu_half_use(const kc_weight *W, int n_tok, const kc_gemm_ws *ws);
/* Whether an F16 Q|K|V of n_tok tokens on cuBLAS writes half rows (the plan's qkv_half_min_tok;
 * kc_matmul_half_out), for kc_rope_store_kv_pf with qkv_half. */
int kc_qkv_half_use(const kc_weight *W, int n_tok, const kc_gemm_ws *ws);
int kc_matmul_half_out(const kc_weight *W, const float *x, const kc_xq *xq, int n_tok, kc_half *y, const kc_gemm_ws *ws,
                       cudaStream_t s);
int kc_glu_xq_half(const kc_half *gu, float *out, kc_xq *xq, int n_tok, int n_ff, int act, cudaStream_t s);

/* kc_rmsnorm_add then kc_rmsnorm_xq of the new x in one launch (norm.cu): x[t] += rmsnorm(h[t]) *
 * w_post, then y[t] = rmsnorm(x[t]) * w and its blocks in xq as kc_rmsnorm_xq writes them (y may
 * be NULL on the same terms, and may be h); the same bits as the two calls. x != h, x != y. */
int kc_rmsnorm_add_xq(float *x, const float *h, const float *w_post, const float *w, float *y, kc_xq *xq, int n_tok, int n,
                      float eps, cudaStream_t s);
/* kc_embed with every value multiplied by scale (the embedding scale; 1: kc_embed), the same
 * bits as kc_embed then kc_scale. */
int kc_embed_scaled(const kc_weight *table, const int32_t *ids, int n_tok, float *x, float scale, cudaStream_t s);

#endif
