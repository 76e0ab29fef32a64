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

/* create_agree.c: the creation's collectives (see its top comment).
 * rs_create_agree: digests, local results, spreads, phase estimates and
 * pace candidates in one reduction; on success p holds the agreed spread,
 * phases and pace, *digest_out this rank's digest. use_digest: the digest
 * of an earlier creation of the same layouts and options, or 0. */
reshard_result_t rs_create_agree(reshard_comm_t *comm, reshard_plan_t *p, const reshard_layout_t *src,
                                 const reshard_layout_t *dst, reshard_result_t local, int32_t spread,
                                 uint64_t use_digest, uint64_t *digest_out);
/* what the ranks' descriptions must agree on: the 7 option words (hdr)
 * and both layouts, hashed; `known` (non-zero): that digest, computed by
 * an earlier creation of the same layouts and options */
uint64_t rs_creation_digest(const reshard_plan_t *p, const reshard_layout_t *src, const reshard_layout_t *dst,
                            uint64_t known, uint64_t *hdr);
/* the largest chunk every rank's staging budget takes, into *out */
reshard_result_t rs_create_agree_chunk(reshard_comm_t *comm, reshard_plan_t *p, rs_seg_vec *segs, size_t *out);
/* whether any rank failed its last step (`what`) */
reshard_result_t rs_create_agree_outcome(reshard_comm_t *comm, const reshard_plan_t *p, reshard_result_t r,
                                         const char *what);
/* every rank's egress and held source bytes into w (2 x size words) */
reshard_result_t rs_create_agree_loads(reshard_comm_t *comm, const reshard_plan_t *p, const reshard_layout_t *src,
                                       uint64_t *w, reshard_result_t *local, int *any);
/* the kept plan's side of a replayed first agreement (rejoin.c): fill
 * sets its execute count and versions from `live` (NULL: a candidate the
 * creation discarded, 0 as in a creation); check compares the reduced
 * words `got` with the creation's `want` (mine: this rank's words) */
struct rs_desc;
void rs_rejoin_agree_fill(uint64_t *v, const reshard_plan_t *live);
reshard_result_t rs_rejoin_agree_check(reshard_comm_t *comm, const uint64_t *mine, const uint64_t *got,
                                       const uint64_t *want, const struct rs_desc *desc, int64_t timeout_ms,
                                       uint64_t agreed[3], char *differs, size_t len);
/* rejoin.c: INVALID_USAGE (for the call `op`) when the plan's
 * communicator was resized since its creation (its ranks renumbered:
 * transport.h resizes): every call of the plan that reaches a peer checks
 * it first (api/execute.c rs_api_enter, reshard_plan_rejoin,
 * reshard_plan_estimate). */
reshard_result_t rs_plan_current(const reshard_plan_t *p, const char *op);
/* rejoin.c: the kept plan p's side of a newcomer's creation of it, every
 * collective of it replayed from p->transcript; on success agreed[k] =
 * the maxima of the execute count, last and committed versions of
 * live[k] (p and the pre-plans it runs). Changes nothing of them. */
reshard_result_t rs_plan_rejoin_agree(reshard_plan_t *p, reshard_plan_t *const *live, int nlive,
                                      uint64_t (*agreed)[3]);

/* transcript.c: the collectives of a creation on a communicator that
 * replaces ranks, recorded for reshard_plan_rejoin. An entry: n words
 * this rank contributed, then the n reduced (at `at` in words); code_at
 * (-1: none) the word where a result code fails every rank at that step,
 * its blame words at blame_at; agree: a plan's first agreement, desc its
 * layouts' description (to name a newcomer's mismatch). plans: the
 * plans the creation numbered (comm->plans_created). broken: out of
 * memory recording (the creation then fails on every rank). */
typedef struct rs_reduce_entry {
  size_t at;
  int n, code_at, blame_at, agree;
  struct rs_desc *desc;
} rs_reduce_entry;
typedef struct rs_transcript {
  rs_reduce_entry *e;
  size_t n, cap;
  uint64_t *words;
  size_t nwords, capwords;
  uint32_t plans;
  int broken;
} rs_transcript;
/* Record comm's creation collectives into t (NULL: record nothing), until
 * rs_transcript_end. */
void rs_transcript_begin(const reshard_comm_t *comm, rs_transcript *t);
void rs_transcript_end(void);
/* Every creation collective: comm's allreduce_max_u64, recorded. */
reshard_result_t rs_create_reduce(reshard_comm_t *comm, uint64_t *v, int n, int64_t deadline, int code_at,
                                  int blame_at);
/* The entry just recorded is a plan's first agreement, over src and dst
 * (hdr: the option words); returns its index plus one (0: not recording). */
uint32_t rs_transcript_mark_agree(const reshard_comm_t *comm, const reshard_layout_t *src,
                                  const reshard_layout_t *dst, const uint64_t *hdr);
void rs_transcript_count_plan(const reshard_comm_t *comm);
void rs_transcript_free(rs_transcript *t);
/* REMOTE for another rank's failure, naming it from the blame words */
reshard_result_t rs_create_another_failed(const reshard_comm_t *comm, uint64_t code, const uint64_t *blame,
                                          const char *what);

/* introspect.c: what the finished plan says about itself. The buffers of
 * layout L (source side or not) the executor will dereference, with
 * sizes and names; the per-peer traffic (p->peers); p->stats, after
 * rs_plan_peer_stats; and a pre-plan's traffic added to p's totals. */
reshard_result_t rs_plan_collect_used(const reshard_layout_t *L, const reshard_plan_t *p, int src_side,
                                      rs_used_buffer **out, int *nout);
reshard_result_t rs_plan_peer_stats(reshard_plan_t *p);
void rs_plan_fill_stats(reshard_plan_t *p);
void rs_plan_add_pre_stats(reshard_plan_t *p, const reshard_plan_t *pre);

/* options.c: the caller's options (NULL: the defaults) into out, checked
 * against the versions this library knows; then the RESHARD_* parameters
 * over them, and every option checked. */
reshard_result_t rs_options_read(const reshard_options_t *in, reshard_options_t *out);
reshard_result_t rs_options_apply_params(reshard_options_t *o);

/* mismatch.c: what one rank's description is, as the naming of a
 * disagreement compares it: the 7 option words of rs_creation_digest
 * (hdr), both layouts' counts (rs_layout_counts), and the digests of
 * their tensors and buffers ([side][0: tensors, 1: buffers]): stored
 * (dig, a kept plan's: reshard_plan_rejoin) or hashed from the layouts
 * L when asked (L NULL on a kept plan: its messages name no names). */
typedef struct rs_desc {
  uint64_t hdr[7];
  uint64_t counts[10];
  int n[2][2];
  uint64_t *dig[2][2];
  const reshard_layout_t *L[2];
} rs_desc;
/* d over the layouts, hashing nothing yet (nothing allocated). */
void rs_desc_of(const reshard_layout_t *src, const reshard_layout_t *dst, const uint64_t *hdr, rs_desc *d);
/* A copy that outlives the layouts (digests stored; NULL: no memory). */
rs_desc *rs_desc_keep(const reshard_layout_t *src, const reshard_layout_t *dst, const uint64_t *hdr);
void rs_desc_free(rs_desc *d);
/* Run by every rank when the creation's digests differ and no rank
 * failed alone; writes what differs between rank 0 and the lowest rank
 * unlike it into msg. */
reshard_result_t rs_explain_mismatch(reshard_comm_t *comm, const rs_desc *d, uint64_t digest, int64_t deadline,
                                     char *msg, size_t len);

#endif
