/* Tiles: the batched kernels' unit of work (kernels/rs_tile.h). Built once
 * per plan on the host, so that execute does no per-segment work. */
#include "device/device.h"

static uint64_t runs_of(const rs_copy *c) {
  uint64_t r = 1;
  for (int k = 0; k < c->ndim; k++)
    r *= c->extent[k] > 0 ? (uint64_t)c->extent[k] : 0;
  return r;
}

/* Short runs are grouped whole; a run longer than a tile is cut at tile
 * boundaries (multiples of 16 bytes, so cuts never cost vector width). */
static uint64_t tiles_of(const rs_copy *c, uint64_t tb) {
  uint64_t runs = runs_of(c);
  if (runs == 0) return 0;
  if (c->run_bytes >= tb) return runs * ((c->run_bytes + tb - 1) / tb);
  uint64_t per = tb / c->run_bytes;
  return (runs + per - 1) / per;
}

uint64_t rs_tiles_count(const rs_copy *c, size_t n, uint64_t tile_bytes) {
  uint64_t t = 0;
  for (size_t i = 0; i < n; i++) t += tiles_of(&c[i], tile_bytes);
  return t;
}

void rs_tiles_build(const rs_copy *c, size_t n, uint32_t desc_base,
                    uint64_t tb, rs_tile *out) {
  for (size_t i = 0; i < n; i++) {
    uint64_t runs = runs_of(&c[i]), rb = c[i].run_bytes;
    if (runs == 0) continue;
    rs_tile t = {0};
    t.desc = desc_base + (uint32_t)i;
    if (rb >= tb) {
      for (uint64_t r = 0; r < runs; r++)
        for (uint64_t b = 0; b < rb; b += tb) {
          t.run0 = r;
          t.nruns = 1;
          t.b0 = b;
          t.b1 = b + tb < rb ? b + tb : rb;
          *out++ = t;
        }
      continue;
    }
    uint64_t per = tb / rb;
    for (uint64_t r = 0; r < runs; r += per) {
      t.run0 = r;
      t.nruns = runs - r < per ? runs - r : per;
      t.b0 = 0;
      t.b1 = rb;
      *out++ = t;
    }
  }
}
