/* The allocation a device pointer lies in (cuMemGetAddressRange, reached
 * through the runtime's driver entry point, so that reshard links no
 * libcuda): CUDA IPC exports whole allocations, and a registered buffer
 * is usually a piece of one (PyTorch's caching allocator). Its own file
 * so that the tests' emulated device can stand in for it. */
#include <cuda_runtime.h>
#include <stddef.h>
#include <stdint.h>

#include "cuda/cuda_util.h"

typedef int (*rs_range_fn)(unsigned long long *base, size_t *size, unsigned long long ptr);

int rs_cuda_mem_range(const void *p, void **base, size_t *size) {
  static rs_range_fn fn;
  if (!fn) {
    void *f = NULL;
    enum cudaDriverEntryPointQueryResult q;
    cudaError_t e = cudaGetDriverEntryPointByVersion("cuMemGetAddressRange", &f, 12000, cudaEnableDefault, &q);
    if (e) return (int)e;
    if (q != cudaDriverEntryPointSuccess || !f) return (int)cudaErrorNotSupported;
    fn = (rs_range_fn)f;
  }
  unsigned long long b = 0;
  size_t n = 0;
  if (fn(&b, &n, (unsigned long long)(uintptr_t)p) != 0) return (int)cudaErrorInvalidValue;
  *base = (void *)(uintptr_t)b;
  *size = n;
  return 0;
}
