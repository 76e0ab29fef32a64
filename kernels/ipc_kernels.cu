/* The CUDA IPC transport's kernels: the protocol of kernels/rs_ipc.h, with
 * the spin loops the CPU emulation replaces by steps. A spin reads its
 * flag from local memory (the window of the rank that waits), checks the
 * window's abort word, and gives up past its timeout on %globaltimer (the
 * GPU's nanosecond clock), so no launch waits for ever. */
#include <cuda_runtime.h>

#include "kernels/rs_kernels.h"

namespace {

__device__ __forceinline__ uint64_t global_ns() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

/* Spins until o arrived (acked = 0) or was acked (acked = 1): 1, or 0
 * when the wait gave up (recorded by rs_ipc_give_up). One thread. */
__device__ int spin(const rs_ipc_op *o, const rs_ipc_wait *w, int acked) {
  uint64_t t0 = global_ns();
  for (unsigned i = 0;; i++) {
    if (acked ? rs_ipc_acked(o) : rs_ipc_arrived(o)) {
      RS_IPC_FENCE(); /* what the peer wrote before the flag, after it */
      return 1;
    }
    if (rs_ipc_load(w->abort)) {
      rs_ipc_give_up(w, o, RS_IPC_ABORTED);
      return 0;
    }
    if ((i & 31) == 31) {
      if (global_ns() - t0 > w->timeout_ns) {
        rs_ipc_give_up(w, o, RS_IPC_TIMEOUT);
        return 0;
      }
      __nanosleep(200);
    }
  }
}

/* Nothing more is posted once a wait here gave up (the abort word):
 * the partners stop instead of reading buffers this rank goes on
 * reusing. */
__global__ void post_kernel(rs_ipc_batch b, rs_ipc_wait w) {
  if (threadIdx.x < b.n && !rs_ipc_load(w.abort)) {
    const rs_ipc_op o = rs_ipc_at(&b.op[threadIdx.x]);
    rs_ipc_post(&o);
  }
}

/* Block (x, y) copies slice x of receive y once it arrived. */
__global__ void __launch_bounds__(RS_KERNEL_THREADS) pull_kernel(rs_ipc_batch b, rs_ipc_wait w) {
  __shared__ int go;
  /* (the counts move on only in the acks, after this launch) */
  const rs_ipc_op at = rs_ipc_at(&b.op[blockIdx.y]);
  const rs_ipc_op *o = &at;
  if (threadIdx.x == 0) {
    go = spin(o, &w, 0);
    uint64_t bad = go ? rs_ipc_check(o) : 0;
    if (bad) {
      rs_ipc_give_up(&w, o, bad);
      go = 0;
    }
  }
  __syncthreads();
  if (!go) return;
  uint64_t per = (o->bytes + gridDim.x - 1) / gridDim.x;
  per = (per + 15) & ~(uint64_t)15;
  uint64_t a = per * blockIdx.x, e = a + per < o->bytes ? a + per : o->bytes;
  if (a < e) rs_ipc_copy(o, a, e, threadIdx.x, blockDim.x);
}

/* After the pulls (stream order): acknowledges what arrived whole, one
 * thread in order (see rs_ipc_ack). */
__global__ void ack_kernel(rs_ipc_batch b) {
  for (uint32_t i = 0; i < b.n; i++) {
    const rs_ipc_op o = rs_ipc_at(&b.op[i]);
    if (rs_ipc_arrived(&o) && !rs_ipc_check(&o)) rs_ipc_ack(&o);
  }
  for (uint32_t i = 0; i < b.n; i++) rs_ipc_advance(&b.op[i]);
}

/* Every operation resolved before any moves its count on. */
__global__ void acked_kernel(rs_ipc_batch b, rs_ipc_wait w) {
  rs_ipc_op o;
  if (threadIdx.x < b.n) o = rs_ipc_at(&b.op[threadIdx.x]);
  __syncthreads();
  if (threadIdx.x < b.n) {
    spin(&o, &w, 1);
    rs_ipc_advance(&b.op[threadIdx.x]);
  }
}

__global__ void max_kernel(const uint64_t *words, uint32_t n, uint32_t stride, uint32_t k, uint64_t *out) {
  rs_ipc_max(words, n, stride, k, out);
}

} // namespace

extern "C" int rs_cuda_ipc_post(const rs_ipc_batch *b, rs_ipc_wait w, void *stream) {
  post_kernel<<<1, RS_IPC_MAX_OPS, 0, (cudaStream_t)stream>>>(*b, w);
  return (int)cudaGetLastError();
}

extern "C" int rs_cuda_ipc_pull(const rs_ipc_batch *b, rs_ipc_wait w, unsigned blocks_per_op, void *stream) {
  if (b->n == 0) return (int)cudaSuccess;
  dim3 grid(blocks_per_op ? blocks_per_op : 1, b->n);
  pull_kernel<<<grid, RS_KERNEL_THREADS, 0, (cudaStream_t)stream>>>(*b, w);
  return (int)cudaGetLastError();
}

extern "C" int rs_cuda_ipc_ack(const rs_ipc_batch *b, void *stream) {
  ack_kernel<<<1, 1, 0, (cudaStream_t)stream>>>(*b);
  return (int)cudaGetLastError();
}

extern "C" int rs_cuda_ipc_acked(const rs_ipc_batch *b, rs_ipc_wait w, void *stream) {
  acked_kernel<<<1, RS_IPC_MAX_OPS, 0, (cudaStream_t)stream>>>(*b, w);
  return (int)cudaGetLastError();
}

extern "C" int rs_cuda_ipc_max(const uint64_t *words, uint32_t n, uint32_t stride, uint32_t k, uint64_t *out,
                               void *stream) {
  max_kernel<<<1, 1, 0, (cudaStream_t)stream>>>(words, n, stride, k, out);
  return (int)cudaGetLastError();
}
