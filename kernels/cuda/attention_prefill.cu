// attention_prefill: causal attention for runs of consecutive query tokens of one sequence
// (prefill and chunked prefill), FlashAttention-2 style: a CTA takes 64 queries of one head,
// walks the sequence's paged K/V in tiles of 64 positions, computes S = QKᵀ and O += PV on the
// tensor cores (WMMA, half operands, f32 accumulation) and keeps the online-softmax state per
// query row in shared memory.
#include "kc_common.cuh"

#include <mma.h>

extern "C" {
#include "kcuda.h"
}

using namespace nvcuda;

#define PF_Q 64      // queries per CTA
#define PF_K 64      // key positions per tile
#define PF_WARPS 4   // each warp owns 16 query rows

template <int HD> struct pf_smem {
    __half q[PF_Q][HD + 8];
    __half k[PF_K][HD + 8];
    __half v[PF_K][HD + 8];
    float s[PF_Q][PF_K + 4];
    __half p[PF_Q][PF_K + 8];
    float o[PF_Q][HD + 4];
    float m[PF_Q], l[PF_Q], corr[PF_Q];
};

template <int HD>
__global__ void __launch_bounds__(PF_WARPS * 32)
prefill_kernel(const float *__restrict__ q, const __half *__restrict__ k_cache, const __half *__restrict__ v_cache,
               float *__restrict__ out, const int32_t *__restrict__ tiles, const int32_t *__restrict__ pos,
               const int32_t *__restrict__ seq, const int32_t *__restrict__ block_tables, int max_blocks, int n_head,
               int n_kv, int block_size, float scale) {
    extern __shared__ __align__(128) unsigned char smem_raw[];
    pf_smem<HD> &sm = *reinterpret_cast<pf_smem<HD> *>(smem_raw);
    const int tile = blockIdx.x, h = blockIdx.y;
    const int t0 = tiles[2 * tile], nq = tiles[2 * tile + 1]; // first flat token, count (<= PF_Q)
    const int kvh = h / (n_head / n_kv);
    const int p0 = pos[t0], p_last = p0 + nq - 1;
    const int32_t *bt = block_tables + (size_t)seq[t0] * max_blocks;
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;

    // Q tile (scaled) as half; rows past nq are zero
    for (int i = tid; i < PF_Q * HD; i += blockDim.x) {
        int r = i / HD, e = i % HD;
        float v = r < nq ? q[((size_t)(t0 + r) * n_head + h) * HD + e] * scale : 0.0f;
        sm.q[r][e] = __float2half(v);
        sm.o[r][e] = 0.0f;
    }
    for (int r = tid; r < PF_Q; r += blockDim.x) { sm.m[r] = -INFINITY; sm.l[r] = 0.0f; }

    for (int j0 = 0; j0 <= p_last; j0 += PF_K) {
        __syncthreads();
        // K and V tiles from the paged cache (16-byte loads); positions past p_last are zero
        for (int i = tid; i < PF_K * (HD / 8); i += blockDim.x) {
            int r = i / (HD / 8), c = (i % (HD / 8)) * 8, j = j0 + r;
            uint4 kv = make_uint4(0, 0, 0, 0), vv = make_uint4(0, 0, 0, 0);
            if (j <= p_last) {
                size_t base = (((size_t)bt[j / block_size] * n_kv + kvh) * block_size + j % block_size) * HD + c;
                kv = *(const uint4 *)(k_cache + base);
                vv = *(const uint4 *)(v_cache + base);
            }
            *(uint4 *)&sm.k[r][c] = kv;
            *(uint4 *)&sm.v[r][c] = vv;
        }
        __syncthreads();
        // S = Q Kᵀ: warp w computes rows [16w, 16w+16) x all 64 columns
        {
            wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc[PF_K / 16];
#pragma unroll
            for (int c = 0; c < PF_K / 16; c++) wmma::fill_fragment(acc[c], 0.0f);
#pragma unroll
            for (int kk = 0; kk < HD; kk += 16) {
                wmma::fragment<wmma::matrix_a, 16, 16, 16, __half, wmma::row_major> a;
                wmma::load_matrix_sync(a, &sm.q[warp * 16][kk], HD + 8);
#pragma unroll
                for (int c = 0; c < PF_K / 16; c++) {
                    wmma::fragment<wmma::matrix_b, 16, 16, 16, __half, wmma::col_major> b;
                    wmma::load_matrix_sync(b, &sm.k[c * 16][kk], HD + 8);
                    wmma::mma_sync(acc[c], a, b, acc[c]);
                }
            }
#pragma unroll
            for (int c = 0; c < PF_K / 16; c++)
                wmma::store_matrix_sync(&sm.s[warp * 16][c * 16], acc[c], PF_K + 4, wmma::mem_row_major);
        }
        __syncwarp();
        // online softmax for the warp's 16 rows: two lanes per row, 32 columns each
        {
            int r = warp * 16 + (lane >> 1), half = lane & 1;
            int pq = p0 + r; // this query's position
            float mx = -INFINITY;
            for (int c = half * 32; c < half * 32 + 32; c++) {
                float v = (j0 + c <= pq && r < nq) ? sm.s[r][c] : -INFINITY;
                sm.s[r][c] = v;
                mx = fmaxf(mx, v);
            }
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
            float m_old = sm.m[r], m_new = fmaxf(m_old, mx);
            float sum = 0.0f;
            for (int c = half * 32; c < half * 32 + 32; c++) {
                float e = m_new == -INFINITY ? 0.0f : __expf(sm.s[r][c] - m_new);
                sm.p[r][c] = __float2half(e);
                sum += __half2float(sm.p[r][c]); // the mass of what PV will actually use
            }
            sum += __shfl_xor_sync(0xffffffffu, sum, 1);
            __syncwarp();
            if (half == 0) {
                float corr = m_old == -INFINITY ? 0.0f : __expf(m_old - m_new);
                sm.corr[r] = corr;
                sm.l[r] = sm.l[r] * corr + sum;
                sm.m[r] = m_new;
            }
        }
        __syncwarp();
        // rescale the warp's O rows, then O += P V
        for (int i = lane; i < 16 * HD; i += 32) {
            int r = warp * 16 + i / HD, e = i % HD;
            sm.o[r][e] *= sm.corr[r];
        }
        __syncwarp();
#pragma unroll
        for (int c = 0; c < HD / 16; c++) {
            wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
            wmma::load_matrix_sync(acc, &sm.o[warp * 16][c * 16], HD + 4, wmma::mem_row_major);
#pragma unroll
            for (int kk = 0; kk < PF_K; kk += 16) {
                wmma::fragment<wmma::matrix_a, 16, 16, 16, __half, wmma::row_major> a;
                wmma::fragment<wmma::matrix_b, 16, 16, 16, __half, wmma::row_major> b;
                wmma::load_matrix_sync(a, &sm.p[warp * 16][kk], PF_K + 8);
                wmma::load_matrix_sync(b, &sm.v[kk][c * 16], HD + 8);
                wmma::mma_sync(acc, a, b, acc);
            }
            wmma::store_matrix_sync(&sm.o[warp * 16][c * 16], acc, HD + 4, wmma::mem_row_major);
        }
    }
    __syncthreads();
    for (int i = tid; i < nq * HD; i += blockDim.x) {
        int r = i / HD, e = i % HD;
        float l = sm.l[r];
        out[((size_t)(t0 + r) * n_head + h) * HD + e] = l > 0.0f ? sm.o[r][e] / l : 0.0f;
    }
}

template <int HD>
static int launch_prefill(const float *q, const kc_half *k, const kc_half *v, float *out, const int32_t *tiles, int n_tiles,
                          const int32_t *pos, const int32_t *seq, const int32_t *bt, int max_blocks, int n_head, int n_kv,
                          int bs, float scale, cudaStream_t s) {
    size_t smem = sizeof(pf_smem<HD>);
    static unsigned char configured[64]; // per instantiation and device
    if (int rc = kc_smem_limit_once(prefill_kernel<HD>, (int)smem, configured, __FILE__, __LINE__)) return rc;
    dim3 grid(n_tiles, n_head);
    prefill_kernel<HD><<<grid, PF_WARPS * 32, smem, s>>>(q, (const __half *)k, (const __half *)v, out, tiles, pos, seq, bt,
                                                         max_blocks, n_head, n_kv, bs, scale);
    return 0;
}

extern "C" int kc_attention_prefill_supported(int hd) { return hd == 64 || hd == 128; }

extern "C" int kc_attention_prefill(const float *q, const kc_half *k_cache, const kc_half *v_cache, float *out,
                                    const int32_t *tiles, int n_tiles, const int32_t *pos, const int32_t *seq,
                                    const int32_t *block_tables, int max_blocks, int n_head, int n_kv, int hd, int block_size,
                                    float scale, cudaStream_t s) {
    if (!q || !k_cache || !v_cache || !out || !tiles || !pos || !seq || !block_tables || n_tiles <= 0 || n_head <= 0 ||
        n_kv <= 0 || n_head % n_kv)
        return CM_EINVAL;
    int rc;
    switch (hd) {
    case 64: rc = launch_prefill<64>(q, k_cache, v_cache, out, tiles, n_tiles, pos, seq, block_tables, max_blocks, n_head, n_kv, block_size, scale, s); break;
    case 128: rc = launch_prefill<128>(q, k_cache, v_cache, out, tiles, n_tiles, pos, seq, block_tables, max_blocks, n_head, n_kv, block_size, scale, s); break;
    default: return CM_EUNSUPPORTED;
    }
    if (rc) return rc;
    KC_LAUNCH_CHECK();
}
