/* Verify mode's checksum: position-keyed box sums (RESHARD_FLAG_VERIFY).
 *
 * A box's sum adds, over its elements, a hash of (tensor, global linear
 * index, element bytes). Addition makes it independent of how the box is
 * walked, and the key makes it depend on where each value belongs: a
 * flipped byte, a value at the wrong coordinates or a box of another
 * tensor all change it. The copy descriptor visits elements in row-major
 * order of the box (rs_copy_init only drops and merges dims), so one
 * odometer over the box's global coordinates runs alongside it. */
#include <stdio.h>
#include <string.h>

#include "exec/exec_state.h"
#include "kernels/rs_verify.h" /* the hash, shared with the device kernels */

typedef struct gwalk {
  int nd;
  int64_t idx[RESHARD_MAX_DIMS];
  const int64_t *extent, *gstride;
  uint64_t linear;
} gwalk;

static inline void gwalk_next(gwalk *g) {
  for (int k = g->nd - 1; k >= 0; k--) {
    g->linear += (uint64_t)g->gstride[k];
    if (++g->idx[k] < g->extent[k]) return;
    g->linear -= (uint64_t)(g->idx[k] * g->gstride[k]);
    g->idx[k] = 0;
  }
}

uint64_t rs_box_sum(const rs_copy *c, int dst_side, const void *base, const rs_vbox *v, const rs_vtensor *t) {
  const unsigned char *b = (const unsigned char *)base + (dst_side ? c->dst_off : c->src_off);
  const int64_t *stride = dst_side ? c->dst_stride : c->src_stride;
  const uint32_t es = t->esize ? t->esize : 1;
  const int nd = c->ndim;
  for (int k = 0; k < nd; k++)
    if (c->extent[k] <= 0) return 0;
  gwalk g;
  memset(&g, 0, sizeof g);
  g.nd = v->ndim;
  g.extent = v->extent;
  g.gstride = t->gstride;
  for (int d = 0; d < v->ndim; d++) g.linear += (uint64_t)(v->start[d] * t->gstride[d]);
  const uint64_t tkey = rs_vtensor_key(v->tensor);
  const uint64_t per_run = c->run_bytes / es;
  uint64_t sum = 0;
  int64_t idx[RS_COPY_MAX_DIMS] = {0};
  int64_t off = 0;
  for (;;) {
    const unsigned char *run = b + off;
    for (uint64_t e = 0; e < per_run; e++) {
      sum += rs_velem_key(tkey, g.linear, rs_vload(run + e * es, es));
      gwalk_next(&g);
    }
    int k = nd - 1;
    for (; k >= 0; k--) {
      if (++idx[k] < c->extent[k]) {
        off += stride[k];
        break;
      }
      idx[k] = 0;
      off -= (c->extent[k] - 1) * stride[k];
    }
    if (k < 0) return sum;
  }
}

void rs_vbox_format(const rs_vbox *v, char *buf, size_t n) {
  size_t used = (size_t)snprintf(buf, n, "start [");
  for (int d = 0; d < v->ndim && used < n; d++)
    used += (size_t)snprintf(buf + used, n - used, "%s%lld", d ? ", " : "", (long long)v->start[d]);
  if (used < n) used += (size_t)snprintf(buf + used, n - used, "] extent [");
  for (int d = 0; d < v->ndim && used < n; d++)
    used += (size_t)snprintf(buf + used, n - used, "%s%lld", d ? ", " : "", (long long)v->extent[d]);
  if (used < n) snprintf(buf + used, n - used, "]");
}
