/* The device executor (execute_device.c) and the tile builder (tiles.c).
 * Compiled only with RESHARD_WITH_CUDA; no CUDA header here. */
#ifndef RS_DEVICE_DEVICE_H
#define RS_DEVICE_DEVICE_H

#include <stddef.h>
#include <stdint.h>

#include "kernels/rs_tile.h"
#include "plan/plan.h"

/* Bytes of one tile (one thread block's work), a multiple of 16. */
#define RS_TILE_BYTES ((uint64_t)64 << 10)

/* Number of tiles of descriptors c[0, n). */
uint64_t rs_tiles_count(const rs_copy *c, size_t n, uint64_t tile_bytes);

/* Writes the tiles of c[0, n) to out (rs_tiles_count entries); tile.desc
 * is desc_base + the descriptor's index. */
void rs_tiles_build(const rs_copy *c, size_t n, uint32_t desc_base,
                    uint64_t tile_bytes, rs_tile *out);

/* stream_ops->execute of device transports. */
reshard_result_t rs_device_execute(const reshard_plan_t *plan,
                                   void *const *src, size_t nsrc,
                                   void *const *dst, size_t ndst,
                                   void *stream, uint64_t call,
                                   uint64_t version);

/* stream_ops->prepare_local and prepare_peers of device transports. */
reshard_result_t rs_device_prepare_local(reshard_plan_t *plan);
reshard_result_t rs_device_prepare_peers(reshard_plan_t *plan);

/* stream_ops->poll of device transports (reshard_plan_get_status). */
void rs_device_poll(const reshard_plan_t *plan);

/* plan->device_free: releases what rs_device_prepare_local set up. */
void rs_device_plan_free(reshard_plan_t *plan);

/* stream_ops->register_buffers of device transports that map their
 * peers' memory (reshard_plan_register_buffers; src/device/direct.c). */
reshard_result_t rs_device_register(reshard_plan_t *plan, void *const *src, size_t nsrc, void *const *dst,
                                    size_t ndst);

struct rs_quant;

/* stream_ops->quant_prepare of device transports (quant_device.c). */
reshard_result_t rs_device_quant_prepare(reshard_comm_t *c, struct rs_quant *q, int64_t timeout_ms);

/* Enqueues on `stream` the quantization of this rank's boxes of q, their
 * inputs read through tab (the call's buffer table, sources first). */
reshard_result_t rs_device_quantize(const struct rs_quant *q, void *const *tab, void *stream, int rank);

/* The allocation p lies in (src/device/mem_range.c): 0, or a cudaError_t. */
int rs_cuda_mem_range(const void *p, void **base, size_t *size);

/* Maps a CUDA error to a result code with detail ("what" failed);
 * allocation failures are RESHARD_ERROR_OUT_OF_MEMORY. */
reshard_result_t rs_cuda_error(int err, const char *what, int rank);

#endif
