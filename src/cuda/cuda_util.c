/* CUDA runtime helpers of the device path: see cuda_util.h. */
#include "cuda/cuda_util.h"

#include <cuda_runtime.h>

#include "common/error.h"

reshard_result_t rs_cuda_error(int err, const char *what, int rank) {
  cudaError_t e = (cudaError_t)err;
  reshard_result_t code = e == cudaErrorMemoryAllocation
                              ? RESHARD_ERROR_OUT_OF_MEMORY
                              : RESHARD_ERROR_BACKEND;
  return rs_error(code, "rank %d: %s failed: %s (%s)", rank, what,
                  cudaGetErrorName(e), cudaGetErrorString(e));
}

int rs_stream_capturing(void *stream) {
  if (!stream) return 0;
  enum cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing((cudaStream_t)stream, &st) != cudaSuccess) return -1;
  return st == cudaStreamCaptureStatusActive ? 1 : st == cudaStreamCaptureStatusNone ? 0 : -1;
}

int rs_cuda_query(void *stream, void *event) {
  enum cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
  cudaThreadExchangeStreamCaptureMode(&mode);
  cudaError_t q = stream ? cudaStreamQuery((cudaStream_t)stream) : cudaEventQuery((cudaEvent_t)event);
  cudaThreadExchangeStreamCaptureMode(&mode);
  return (int)q;
}
