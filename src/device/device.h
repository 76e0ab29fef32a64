/* The device executor (executor.c and the files it names) and the tile builder (tiles.c).
 * Compiled only with RESHARD_WITH_CUDA; no CUDA header here. */
#ifndef RS_DEVICE_DEVICE_H
#define RS_DEVICE_DEVICE_H

#include <stddef.h>
#include <stdint.h>

#include "kernels/rs_tile.h"
#include "cuda/cuda_util.h"
#include "plan/executor.h"
#include "plan/plan.h"

/* Bytes of one tile (one thread block's work), a multiple of 16. */
#define RS_TILE_BYTES ((uint64_t)64 << 10)

/* Number of tiles of descriptors c[0, n). */
uint64_t rs_tiles_count(const rs_copy *c, size_t n, uint64_t tile_bytes);

/* Writes the tiles of c[0, n) to out (rs_tiles_count entries); tile.desc
 * is desc_base + the descriptor's index. */
void rs_tiles_build(const rs_copy *c, size_t n, uint32_t desc_base,
                    uint64_t tile_bytes, rs_tile *out);

/* The device executor (plan/executor.h): plans on stream transports. */
extern const rs_executor rs_device_executor;

/* The device executor's register_buffers, for transports that map their
 * peers' memory (reshard_plan_register_buffers). */
reshard_result_t rs_device_register(reshard_plan_t *plan, void *const *src, size_t nsrc, void *const *dst,
                                    size_t ndst);

struct rs_quant;

/* The device executor's quant_prepare (quant_device.c). */
reshard_result_t rs_device_quant_prepare(reshard_comm_t *c, struct rs_quant *q, int64_t timeout_ms);

/* Enqueues on `stream` the quantization of this rank's boxes of q, their
 * inputs read through tab (the call's buffer table, sources first). */
reshard_result_t rs_device_quantize(const struct rs_quant *q, void *const *tab, void *stream, int rank);

struct rs_spread;

/* The device executor's spread_prepare (spread_device.c). */
reshard_result_t rs_device_spread_prepare(reshard_comm_t *c, struct rs_spread *s);

#endif
