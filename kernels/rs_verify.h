/* RESHARD_FLAG_VERIFY's position-keyed box sums (see src/exec/verify.c),
 * written once for the host executor and the device kernels
 * (kernels/verify_kernels.cu) and their CPU emulation: a box's sum adds,
 * over its elements, a hash of (tensor, global linear index, element
 * bytes), mod 2^64, so it does not depend on how the box is walked. C11
 * and CUDA C++ at once, like rs_tile.h. */
#ifndef RS_KERNELS_RS_VERIFY_H
#define RS_KERNELS_RS_VERIFY_H

#include <stdint.h>
#include <string.h>

#include "kernels/rs_tile.h"
#include "reshard.h" /* RESHARD_MAX_DIMS */

/* Verify mode (RESHARD_FLAG_VERIFY): which tensor elements one copy
 * carries, in global coordinates, so that both ends can checksum a box
 * keyed by position. Kept per rs_copy (parallel arrays below), so any
 * message, whatever buffers its boxes come from, can be checked. */
typedef struct rs_vbox {
  int32_t tensor; /* destination-layout tensor id (index in vtensors) */
  int32_t ndim;
  int64_t start[RESHARD_MAX_DIMS];
  int64_t extent[RESHARD_MAX_DIMS];
} rs_vbox;

/* A tensor as verify mode needs it: its name for messages and the
 * row-major strides of its global index. */
typedef struct rs_vtensor {
  char *name;
  int32_t ndim;
  uint32_t esize;
  int64_t gstride[RESHARD_MAX_DIMS];
} rs_vtensor;

RS_HD uint64_t rs_vfmix64(uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdULL;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ULL;
  x ^= x >> 33;
  return x;
}

/* One element's term: its tensor (tkey: rs_vtensor_key), global linear
 * index and bytes (rs_vload). */
RS_HD uint64_t rs_velem_key(uint64_t tkey, uint64_t linear, uint64_t value) {
  return rs_vfmix64(rs_vfmix64(linear * 0x9E3779B97F4A7C15ULL + tkey) ^ value);
}

RS_HD uint64_t rs_vtensor_key(int32_t tensor) { return ((uint64_t)tensor + 1) * 0xD6E8FEB86659FD93ULL; }

/* An element's bytes as a word (its first 8 bytes). */
RS_HD uint64_t rs_vload(const unsigned char *p, uint32_t es) {
  uint64_t v = 0;
  memcpy(&v, p, es < 8 ? es : 8);
  return v;
}

/* The global linear index of element o (row-major ordinal) of box v. */
RS_HD uint64_t rs_vlinear(const rs_vbox *v, const rs_vtensor *t, uint64_t o) {
  uint64_t lin = 0;
  for (int d = v->ndim - 1; d >= 0; d--) {
    uint64_t e = (uint64_t)v->extent[d];
    uint64_t i = e ? o % e : 0;
    o = e ? o / e : 0;
    lin += (uint64_t)((v->start[d] + (int64_t)i) * t->gstride[d]);
  }
  return lin;
}

/* Thread tid of nthreads: its part of the sum of tile t's elements on one
 * side of copy c (dst_side: the destination's), base that side's buffer.
 * The tile's byte range is 16-byte aligned, so whole elements (dtypes of
 * at most 16 bytes). */
RS_HD uint64_t rs_tile_sum(const rs_copy *c, const rs_tile *t, const unsigned char *base, int dst_side,
                           const rs_vbox *v, const rs_vtensor *vt, unsigned tid, unsigned nthreads) {
  const uint64_t es = vt->esize ? vt->esize : 1;
  const uint64_t per_run = c->run_bytes / es, e0 = t->b0 / es, ne = (t->b1 - t->b0) / es;
  const uint64_t tkey = rs_vtensor_key(v->tensor);
  const unsigned char *b = base + (dst_side ? c->dst_off : c->src_off);
  uint64_t sum = 0;
  for (uint64_t i = tid; i < t->nruns * ne; i += nthreads) {
    uint64_t r = t->run0 + i / ne, e = e0 + i % ne;
    int64_t so, dof;
    rs_tile_run_offsets(c, r, &so, &dof);
    const unsigned char *p = b + (dst_side ? dof : so) + (int64_t)(e * es);
    sum += rs_velem_key(tkey, rs_vlinear(v, vt, r * per_run + e), rs_vload(p, (uint32_t)es));
  }
  return sum;
}

/* The first difference between this rank's sums and the ones received,
 * mine[i] vs theirs[i] for i in [0, n): recorded (sticky) in the plan's
 * verdict as RS_DEV_AGREE_VERIFY with the descriptor index (desc0 + i),
 * the two sums and `kind` (0: received, 1: local copy). One thread. */
#include "kernels/rs_agree.h"

RS_HD void rs_verify_compare(const uint64_t *mine, const uint64_t *theirs, uint32_t n, uint32_t desc0, uint32_t kind,
                             rs_dev_agree *st) {
  if (!st->ok) return;
  for (uint32_t i = 0; i < n; i++)
    if (mine[i] != theirs[i]) {
      st->bad_index = RS_DEV_AGREE_VERIFY;
      st->got.magic = kind;
      st->got.digest = desc0 + i;
      st->got.call = mine[i];
      st->got.version = theirs[i];
      st->ok = 0;
      return;
    }
}

#endif
