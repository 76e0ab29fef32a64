/* Shared by the GPU test programs: skip (exit 77) without a device, and
 * fail loudly on any CUDA error. */
#ifndef RS_TESTS_GPU_COMMON_H
#define RS_TESTS_GPU_COMMON_H

#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>

#define GPU_SKIP 77

#define CK(call)                                                          \
  do {                                                                    \
    cudaError_t ck_e_ = (call);                                           \
    if (ck_e_ != cudaSuccess) {                                           \
      fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call,       \
              cudaGetErrorString(ck_e_));                                 \
      exit(1);                                                            \
    }                                                                     \
  } while (0)

static inline void gpu_require_device(const char *prog) {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
    printf("%s: no CUDA device: skipped\n", prog);
    exit(GPU_SKIP);
  }
}

#endif
