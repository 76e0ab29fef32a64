/* Source-side spreading (issue 20): data only one source rank holds
 * leaves through that rank's NIC, however idle its NVLink neighbours'
 * NICs are. Where a plan's source ranks of one NVLink domain send very
 * different amounts out of the domain (an MoE layer whose experts have
 * one replica, on one pipeline stage), the busiest of them bound the plan
 * well above T_lower, whose source term assumes the domain's NICs share
 * the load (simulated: DeepSeek-V3 on 32 + 32 ranks, 3.34 x T_lower).
 *
 * Spreading is the mirror of the destination-side relays, and like block
 * quantization (quant.h) it needs no new kind of message: plan creation
 * makes the direct plan, agrees every rank's egress (bytes sent out of its
 * domain), and moves the excess of the ranks above their domain's mean
 * to the ranks below it:
 *
 *  - a pre-plan copies, over NVLink, row slices of the over-loaded ranks'
 *    sole-held fragments (no other rank holds any of their elements, and
 *    some destination rank outside the domain needs part of them) into
 *    raw scratch buffers ("reshard.spread") of under-loaded ranks of the
 *    same domain;
 *  - the main plan's source is the caller's plus those scratch buffers,
 *    each marked with its origin rank (rs_buffer.spread_origin): replica
 *    choice sends such a cell from the copy to receivers outside the
 *    origin's domain and from the origin to receivers inside it
 *    (assign.c spread_narrow), so the origin's NIC carries what is left.
 *
 * The cost model prices the pre-plan and the main plan one after the
 * other against the direct plan; the spread plan is kept only when it is
 * predicted faster (RESHARD_FLAG_SPREAD_ALWAYS: whenever some rank is over
 * its domain's mean; RESHARD_FLAG_NO_SPREAD or RESHARD_SPREAD=0: never).
 * It needs a topology and a direct creation (not the tools' staged
 * planning). The scratch is host memory on host transports; on device
 * transports (a stream-ordered executor) it is device memory the device
 * executor allocates (its spread_prepare, src/device/spread_device.c).
 * Execute runs the pre-plan, then the main plan (src/api/stages.c), on
 * the caller's stream on a device: the main plan's sends read the
 * scratch after the pre-plan's copies, in stream order. */
#ifndef RS_PLAN_SPREAD_H
#define RS_PLAN_SPREAD_H

#include <stddef.h>
#include <stdint.h>

#include "plan/topology.h"
#include "reshard.h"

struct rs_executor; /* plan/executor.h */

/* A rank over its domain's mean egress by more than this fraction of the
 * mean (and by at least RS_SPREAD_MIN_BYTES, but for
 * RESHARD_FLAG_SPREAD_ALWAYS) gives the excess away. */
#define RS_SPREAD_SLACK 8 /* 1/8 */
#define RS_SPREAD_MIN_BYTES ((uint64_t)1 << 20)
/* Slices are cut from whole rows of at most this many bytes where the
 * fragment's shape allows (spread.c give). */
#define RS_SPREAD_GRAIN ((uint64_t)64 << 10)

/* The rewritten layouts; src NULL: nothing to spread. */
typedef struct rs_spread_layouts {
  reshard_layout_t *src; /* the main plan's source: the caller's + scratch */
  reshard_layout_t *pre; /* the pre-plan's destination: every source tensor, partial, and the scratch */
  /* this rank's scratch buffers: ids in src and in pre, offsets in one
   * block of `bytes` */
  int nbufs;
  int *main_id, *pre_id;
  uint64_t *off, *len;
  uint64_t bytes;
  uint64_t moved; /* bytes all ranks copy in the pre-plan */
} rs_spread_layouts;

/* The bytes plan p's rank sends out of its NVLink domain (0 without a
 * topology): the load spreading balances. */
uint64_t rs_spread_egress(const reshard_plan_t *p);

/* The decision and the layouts, the same on every rank given the same
 * inputs. egress[r]: bytes rank r sends out of its NVLink domain in the
 * plan without spreading, plus one, or 0 when r holds no source data;
 * held[r]: the bytes of r's source fragments; always: no floor under a
 * rank's excess (RESHARD_FLAG_SPREAD_ALWAYS). */
reshard_result_t rs_spread_layouts_make(const reshard_layout_t *src, const reshard_layout_t *dst, const rs_rank_map *map,
                                        int nranks, int me,
                                        const uint64_t *egress, const uint64_t *held, int always,
                                        rs_spread_layouts *out);
void rs_spread_layouts_free(rs_spread_layouts *s);

/* What a plan keeps. */
typedef struct rs_spread {
  reshard_plan_t *pre;
  int user_nsrc; /* buffers of the caller's source layout */
  int pre_ndst;  /* buffers of the pre-plan's destination */
  int nbufs;
  int *main_id, *pre_id;
  uint64_t *off, *len;
  unsigned char *scratch;
  uint64_t bytes;
  uint64_t moved;
  /* The device executor (its spread_prepare): scratch is device memory
   * and dev_free releases it through dev_comm (registered, peers may
   * have it mapped) (NULL on host transports). dev_stuck: the GPU did
   * not let go of the main plan's or the pre-plan's work (their
   * stuck_out, plan.h): the memory is left allocated rather than freed
   * under it. */
  void (*dev_free)(struct rs_spread *s);
  reshard_comm_t *dev_comm;
  int dev_stuck;
} rs_spread;

/* Moves this rank's scratch description out of s into a new rs_spread
 * with the scratch allocated (pre attached later, by plan creation):
 * host memory, or for a stream-ordered executor ex device memory
 * (ex->spread_prepare, on comm). */
reshard_result_t rs_spread_create(rs_spread_layouts *s, const reshard_layout_t *user_src, reshard_comm_t *comm,
                                  const struct rs_executor *ex, rs_spread **out);
/* Frees s's scratch and its description, not s->pre: whoever attached the
 * pre-plan destroys it, before this (its work writes the scratch). */
void rs_spread_free(rs_spread *s);

#endif
