/* gpu_ck: CK(call) for the GPU-host test programs: a failed CUDA runtime call prints the call,
 * file, line and error, and exits 1; CKB(call) the same for a cuBLAS / cuBLASLt call (the caller
 * includes cublas_v2.h or cublasLt.h). Header-only, test code only. */
#ifndef ARKA_GPU_CK_H
#define ARKA_GPU_CK_H

#include <cuda_runtime_api.h>
#include <stdio.h>
#include <stdlib.h>

#define CK(x)                                                                                   \
    do {                                                                                        \
        cudaError_t e_ = (x);                                                                   \
        if (e_ != cudaSuccess) {                                                                \
            fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
            exit(1);                                                                            \
        }                                                                                       \
    } while (0)

#define CKB(x)                                                                            \
    do {                                                                                  \
        cublasStatus_t s_ = (x);                                                          \
        if (s_ != CUBLAS_STATUS_SUCCESS) {                                                \
            fprintf(stderr, "%s:%d: %s: cublas status %d\n", __FILE__, __LINE__, #x, s_); \
            exit(1);                                                                      \
        }                                                                                 \
    } while (0)

#endif
