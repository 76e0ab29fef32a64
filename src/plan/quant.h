/* Plans with block-quantized destinations (issue 19, item 2).
 *
 * A destination weight declared by reshard_layout_add_tensor_blocked
 * (fp8e4m3 plus its f32 `<name>_scale_inv`) whose source is a wider float
 * without scales is quantized on the source ranks, and the wire carries
 * fp8 codes and f32 scales. The planner and executor need no new kind of
 * message for it: the plan is made over rewritten layouts.
 *
 *  - The main plan's source is the caller's, with the weight renamed
 *    (`<name> (before quantization)`) and the fp8 weight and its scales
 *    added in raw scratch buffers of the source ranks ("reshard.quant.codes"
 *    and "reshard.quant.scales", after the caller's buffers): a box per
 *    source fragment, the blocks it holds whole (every replica quantizes
 *    its own, so replica balancing and relays choose freely), and a box
 *    per block that no source rank holds whole, on the rank holding most
 *    of it. Its destination is the caller's plus the renamed tensor,
 *    allowed partial and held nowhere (so nothing moves it).
 *  - Blocks no rank holds whole are first gathered, in the source dtype,
 *    by a pre-plan from the caller's source to "reshard.quant.gather"
 *    scratch buffers (a layout declaring every source tensor partial).
 *  - Execute runs the pre-plan (if any), quantizes this rank's boxes
 *    (src/pack/quantize.c) and runs the main plan (src/api/stages.c). */
#ifndef RS_PLAN_QUANT_H
#define RS_PLAN_QUANT_H

#include <stddef.h>

#include "pack/quantize.h"
#include "reshard.h"

struct rs_executor; /* plan/executor.h */

/* The rewritten layouts; src NULL: nothing to quantize (the caller's
 * layouts plan as they are). */
typedef struct rs_quant_layouts {
  reshard_layout_t *src, *dst; /* the main plan's */
  reshard_layout_t *gather;    /* the pre-plan's destination, or NULL */
  /* this rank's boxes and scratch */
  rs_qbox *boxes;
  size_t nboxes;
  int codes_buf, scales_buf, gather_buf; /* ids (-1: none on this rank) */
  size_t codes_bytes, scales_bytes, gather_bytes;
} rs_quant_layouts;

/* Rewrites src and dst for a plan over nranks ranks seen from rank `me`.
 * The same result on every rank given the same layouts. Errors (a
 * blocked destination whose source is fp8 without scales, or holds
 * different blocks, or a block no source rank holds) name the tensor. */
reshard_result_t rs_quant_layouts_make(const reshard_layout_t *src, const reshard_layout_t *dst, int nranks, int me,
                                       rs_quant_layouts *out);
void rs_quant_layouts_free(rs_quant_layouts *q);

/* What a plan keeps: the pre-plan, this rank's boxes and scratch. */
typedef struct rs_quant {
  reshard_plan_t *pre;
  int user_nsrc;   /* buffers of the caller's source layout */
  int pre_ndst;    /* buffers of the pre-plan's destination layout */
  rs_qbox *boxes;
  size_t nboxes;
  int codes_buf, scales_buf, gather_buf;
  size_t codes_bytes, scales_bytes, gather_bytes;
  unsigned char *codes, *scales, *gather;
  /* the caller's source buffers the boxes read, and the bytes they need
   * (execute checks them before quantizing) */
  int32_t *in_bufs;
  uint64_t *in_need;
  size_t nin;
  /* The device executor (its quant_prepare, src/device/
   * quant_device.c): the scratch above is device memory, dev holds the
   * boxes on the device, and dev_free releases both (NULL on host
   * transports). dev_stuck: the GPU did not let go of the main plan's or
   * the pre-plan's work (their stuck_out, plan.h): the memory is left
   * allocated rather than freed under it. */
  void *dev;
  void (*dev_free)(struct rs_quant *q);
  int dev_stuck;
} rs_quant;

/* Moves the boxes out of q into a new rs_quant with its scratch
 * allocated: host memory, or for a stream-ordered executor ex device
 * memory with the boxes uploaded (ex->quant_prepare, whose waits end
 * timeout_ms from now). */
reshard_result_t rs_quant_create(rs_quant_layouts *q, const reshard_layout_t *user_src, reshard_comm_t *comm,
                                 const struct rs_executor *ex, int64_t timeout_ms, rs_quant **out);
/* Frees q's boxes and scratch, not q->pre: whoever attached the pre-plan
 * destroys it, before this (its work writes the gather scratch). */
void rs_quant_free(rs_quant *q);

#endif
