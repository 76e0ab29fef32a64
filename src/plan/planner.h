/* The planner's internals shared between its own files (the .c files of src/plan/)
 * while it builds a plan: nothing here is read by executors, which include
 * plan/plan.h only. */
#ifndef RESHARD_PLAN_PLANNER_H
#define RESHARD_PLAN_PLANNER_H

#include <stddef.h>
#include <stdint.h>

#include "plan/plan.h"
#include "plan/relay.h"

/* create.c and the files it calls while building one plan (match.c):
 * one creation's working state on this rank. */
typedef struct build_ctx {
  const reshard_layout_t *src, *dst;
  reshard_plan_t *plan;
  int *dst2src, *src2dst;
  rs_seg_vec segs; /* sends, receives and virtual relay streams */
  rs_copy *locals;
  rs_vbox *local_vbox; /* verify mode: parallel to locals */
  size_t nlocals, cap_locals, cap_local_vbox;
  rs_assign_ctx actx;
  rs_piece_vec pieces;
  int npeers;
  /* Relay plans (plan/relay.h): built when relay is set. */
  int relay;
  rs_relay_plan rp;
  rs_seg_vec *back; /* rs_plan_force.back's segments: where segs go at the end */
  /* The tools' twin (rs_plan_agreed.twin): the first stage under
   * RESHARD_FLAG_FIRST_REPLICA too, its pieces assigned right after this
   * plan's, box by box, so that each box's holders are prepared once.
   * Only its segs and locals are used. */
  struct build_ctx *twin;
} build_ctx;

/* Whether the plan is built for RESHARD_FLAG_VERIFY (verify boxes kept). */
static inline int verifying(const reshard_plan_t *p) { return (p->opts.flags & RESHARD_FLAG_VERIFY) != 0; }

/* match.c: the tensors of c->dst paired by name with those of c->src
 * (c->dst2src, c->src2dst), dtypes and shapes checked; and, in verify mode,
 * the destination tensors' names and strides into p->vtensors. */
reshard_result_t rs_match_tensors(build_ctx *c);
reshard_result_t rs_build_vtensors(reshard_plan_t *p, const reshard_layout_t *dst);

/* options.c: the caller's options (NULL: the defaults) into out, checked
 * against the versions this library knows; then the RESHARD_* parameters
 * over them, and every option checked. */
reshard_result_t rs_options_read(const reshard_options_t *in, reshard_options_t *out);
reshard_result_t rs_options_apply_params(reshard_options_t *o);

/* mismatch.c: run by every rank when the creation's digests differ and no
 * rank failed alone; writes what differs between rank 0 and the lowest
 * rank unlike it into msg. hdr: the 7 option words of creation_digest. */
reshard_result_t rs_explain_mismatch(reshard_comm_t *comm, const reshard_layout_t *src, const reshard_layout_t *dst,
                                     const uint64_t *hdr, uint64_t digest, int64_t deadline, char *msg, size_t len);

#endif
