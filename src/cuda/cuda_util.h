/* CUDA runtime helpers shared by the device transports (NCCL, CUDA IPC)
 * and the device executor: below both in the layering
 * (docs/ARCHITECTURE.md), so that a transport needs no executor header.
 * Compiled only with RESHARD_WITH_CUDA; no CUDA header here: streams and
 * events are void *, errors int (a cudaError_t). */
#ifndef RS_CUDA_CUDA_UTIL_H
#define RS_CUDA_CUDA_UTIL_H

#include <stddef.h>

#include "reshard.h"

/* Maps a CUDA error to a result code with detail ("what" failed);
 * allocation failures are RESHARD_ERROR_OUT_OF_MEMORY. */
reshard_result_t rs_cuda_error(int err, const char *what, int rank);

/* The allocation p lies in (cuda/mem_range.c, its own file so that the
 * tests' emulated device can stand in for it): 0, or a cudaError_t. */
int rs_cuda_mem_range(const void *p, void **base, size_t *size);

/* Whether work enqueued on `stream` (a cudaStream_t) is captured into a
 * CUDA graph rather than run: 1, 0, or -1 when the capture was
 * invalidated (an error of the caller's or of an earlier call). The
 * legacy stream (NULL) is never capturing. */
int rs_stream_capturing(void *stream);

/* cudaStreamQuery(stream), or with stream NULL cudaEventQuery(event), made
 * in relaxed capture mode (a cudaError_t): a stream capture open on this
 * thread, or in global mode on any thread of the process, forbids such
 * queries and is invalidated by one; reshard's touch nothing captured.
 * Every host query of the device path goes through it. */
int rs_cuda_query(void *stream, void *event);

#endif
