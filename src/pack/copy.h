/* Strided N-D box copies: the one data-movement primitive of the host
 * backend (pack into staging, unpack from staging, local copies), and the
 * reference semantics of the CUDA kernels (kernels/ uses the same
 * descriptor).
 *
 * A descriptor copies a box of `extent` (outer dims, outermost first) whose
 * innermost level is a contiguous run of run_bytes bytes on both sides.
 * Element (i_0, ..., i_{n-1}) of the box is the run at
 *   src_base + src_off + sum_k i_k * src_stride[k]
 * copied to
 *   dst_base + dst_off + sum_k i_k * dst_stride[k].
 * Strides are in bytes and may be anything (including non-monotonic);
 * a box with zero outer dims is a single run.
 *
 * A converting descriptor (cvt_from and cvt_to set: rs_copy_init_cvt)
 * casts every element from one floating-point dtype to another
 * (src/pack/convert.h) instead of copying bytes: run_bytes is then the
 * source run, and the destination run holds as many elements of the
 * destination's size (rs_copy_dst_run). */
#ifndef RS_PACK_COPY_H
#define RS_PACK_COPY_H

#include <stddef.h>
#include <stdint.h>

#include "reshard.h"

#define RS_COPY_MAX_DIMS RESHARD_MAX_DIMS

/* Which memory a descriptor side refers to. */
enum { RS_BUF_STAGING = -1 };

typedef struct rs_copy {
  uint64_t src_off;  /* bytes from the source base */
  uint64_t dst_off;  /* bytes from the destination base */
  uint64_t run_bytes; /* contiguous innermost run, > 0 */
  int32_t src_buf;   /* source-layout buffer id, or RS_BUF_STAGING */
  int32_t dst_buf;   /* destination-layout buffer id, or RS_BUF_STAGING */
  int32_t ndim;      /* outer dims, 0..RS_COPY_MAX_DIMS */
  /* 0 and 0: a byte copy; else the source's and the destination's
   * reshard_dtype_t plus one (a cast between two float dtypes). In the
   * 4 bytes that were reserved, so the layout (shipped between ranks by
   * src/exec/direct.c) keeps its size. */
  uint8_t cvt_from, cvt_to;
  uint16_t reserved;
  int64_t extent[RS_COPY_MAX_DIMS];
  int64_t src_stride[RS_COPY_MAX_DIMS]; /* bytes */
  int64_t dst_stride[RS_COPY_MAX_DIMS]; /* bytes */
} rs_copy;

/* Builds a descriptor for a box of ndim dims (extent in elements, each
 * > 0) with element strides on both sides and byte offsets. Drops unit
 * dims, merges dims that are contiguous on both sides and folds the
 * innermost contiguous dims into run_bytes, so that execution does the
 * fewest, longest memcpy calls. src_buf/dst_buf are stored as given. */
void rs_copy_init(rs_copy *c, int ndim, const int64_t *extent,
                  size_t elem_size, int32_t src_buf, uint64_t src_off,
                  const int64_t *src_stride_elems, int32_t dst_buf,
                  uint64_t dst_off, const int64_t *dst_stride_elems);

/* The same with a cast: the box's elements are src_dtype on the source
 * side and dst_dtype on the destination side (float dtypes of
 * rs_cvt_float_dtype, src/pack/convert.h), each side's strides in its
 * own elements. Equal dtypes build rs_copy_init's plain copy. */
void rs_copy_init_cvt(rs_copy *c, int ndim, const int64_t *extent,
                      reshard_dtype_t src_dtype, int32_t src_buf,
                      uint64_t src_off, const int64_t *src_stride_elems,
                      reshard_dtype_t dst_dtype, int32_t dst_buf,
                      uint64_t dst_off, const int64_t *dst_stride_elems);

/* Total bytes the descriptor reads (for a plain copy: moves). */
uint64_t rs_copy_bytes(const rs_copy *c);

/* The destination run's bytes: run_bytes, or for a cast run_bytes over
 * the source's element size times the destination's. */
uint64_t rs_copy_dst_run(const rs_copy *c);

/* One descriptor for a pack followed by its unpack: s copies a box into
 * staging (its destination is RS_BUF_STAGING, dense) and r copies the
 * same box out of staging at the same offset (its source is
 * RS_BUF_STAGING), each with its own merged dims. *out copies from s's
 * source to r's destination directly, byte for byte what the two do, on
 * the common refinement of their dims (both are coarsenings of the same
 * row-major box, so the refinement has at most RS_COPY_MAX_DIMS dims).
 * Used for registered buffers, where a receiver reads the sender's
 * buffers (src/device/). A cast in s or r (not both) is the composed
 * copy's. Returns 0, or -1 when s and r are not a pack and unpack of one
 * box (different offsets or sizes) or both cast. */
int rs_copy_compose(const rs_copy *s, const rs_copy *r, rs_copy *out);

/* Executes one descriptor on host memory. */
void rs_copy_run(const rs_copy *c, const void *src_base, void *dst_base);

#ifdef RESHARD_SIMGRID_BUILD
/* Simulation builds only: non-zero makes rs_copy_run a no-op. Folded runs
 * (RESHARD_SIM_FOLD=1 in tools/reshard_perf.c) map every simulated rank's
 * data onto the same pages, so the bytes are garbage anyway, and SMPI
 * charges no simulated time for host computation: the copies only cost
 * the 2-core machine real time (and page faults over hundreds of GB of
 * folded mappings) without changing what is measured. Per simulated rank
 * (SMPI privatizes globals). */
extern int rs_copy_skip;
#endif

#endif
