/* reshard_plan_create: validate, plan this rank's side, agree, chunk.
 *
 * Every path past the communicator check reaches the agreement
 * collective, carrying this rank's digest, error and spread, so that a
 * rank that fails (bad input, out of memory, a coverage hole only it can
 * see) makes every other rank fail too instead of leaving them waiting.
 * Its outcome is the same on every rank, so either all return there or
 * all go on to the chunk agreement and the final one (after building),
 * each of which again carries every rank's error. Those agreements live
 * in create_agree.c; this file sequences the steps. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"
#include "common/blame.h"
#include "common/clock.h"
#include "common/debug.h"
#include "common/error.h"
#include "common/vec.h"
#include "common/params.h"
#include "pack/convert.h"
#include "plan/plan.h"
#include "plan/planner.h"
#include "plan/quant.h"
#include "plan/spread.h"
#include "plan/relay.h"
#include "transport/transport.h"

/* vt: the destination-layout tensor of the piece (verify mode). */
static reshard_result_t push_local(build_ctx *c, const rs_copy *cp,
                                   int vt, const rs_piece *piece, int ndim) {
  if (verifying(c->plan)) {
    if (RS_VEC_GROW(c->local_vbox, c->nlocals, c->cap_local_vbox))
      return rs_error(RESHARD_ERROR_OUT_OF_MEMORY, "plan_create: out of memory (local copies)");
    rs_vbox *v = &c->local_vbox[c->nlocals];
    memset(v, 0, sizeof *v);
    v->tensor = vt;
    v->ndim = ndim;
    for (int d = 0; d < ndim; d++) {
      v->start[d] = piece->start[d];
      v->extent[d] = piece->extent[d];
    }
  }
  if (RS_VEC_GROW(c->locals, c->nlocals, c->cap_locals))
    return rs_error(RESHARD_ERROR_OUT_OF_MEMORY, "plan_create: out of memory (local copies)");
  c->locals[c->nlocals++] = *cp;
  return RESHARD_SUCCESS;
}

/* What this rank receives (and forwards, in relay plans), and its local
 * copies. */
/* The pieces of D just assigned (c->pieces), into out's local copies and
 * receive segments. */
static reshard_result_t receive_pieces(build_ctx *c, build_ctx *out, const rs_frag *D, reshard_dtype_t sdt,
                                       reshard_dtype_t ddt) {
  const int me = c->plan->rank;
  const size_t ses = reshard_dtype_size(sdt), des = reshard_dtype_size(ddt);
  for (size_t k = 0; k < c->pieces.n; k++) {
    const rs_piece *p = &c->pieces.v[k];
    if (p->src.rank == me) {
      rs_copy cp; /* a cast, where the dtypes differ, straight from one buffer to the other */
      rs_copy_init_cvt(&cp, D->ndim, p->extent, sdt, p->src.buffer, rs_frag_offset_of(&p->src, p->start, ses),
                       p->src.strides, ddt, D->buffer, rs_frag_offset_of(D, p->start, des), D->strides);
      RS_CHECK(push_local(out, &cp, D->tensor, p, D->ndim));
    } else {
      rs_seg s;
      rs_seg_init(&s, RS_SEG_RECV, p->src.rank, me, D, p, ddt, (reshard_dtype_t)rs_cvt_wire_dtype(sdt, ddt));
      RS_CHECK(rs_seg_vec_push(&out->segs, &s));
    }
  }
  return RESHARD_SUCCESS;
}

/* D's relay group (g->m = 0: direct), the same on its receiver and its
 * senders. A converted tensor is not relayed: a forward reads the
 * destination buffer, whose dtype is not the wire's. */
static reshard_result_t relay_group(build_ctx *c, const rs_frag *D, rs_relay_group *g) {
  const rs_tensor *t = &c->dst->tensors[D->tensor];
  if (!c->relay || c->src->tensors[c->dst2src[D->tensor]].dtype != t->dtype) return RESHARD_SUCCESS;
  return rs_relay_group_of(&c->rp.ctx, D, c->dst2src[D->tensor], reshard_dtype_size(t->dtype), g);
}

static reshard_result_t plan_receives(build_ctx *c) {
  const int me = c->plan->rank;
  rs_frag_vec mine = {0};
  reshard_result_t r;
  RS_CHECK_GOTO(rs_layout_rank_fragments(c->dst, me, &mine), r, done);
  for (size_t i = 0; i < mine.n; i++) {
    const rs_frag *D = &mine.v[i];
    const rs_tensor *t = &c->dst->tensors[D->tensor];
    const reshard_dtype_t sdt = c->src->tensors[c->dst2src[D->tensor]].dtype;
    rs_relay_group g = {0};
    RS_CHECK_GOTO(relay_group(c, D, &g), r, done);
    if (g.m) {
      RS_CHECK_GOTO(rs_relay_plan_member(&c->rp, &c->actx, &c->pieces, &c->segs, me, D, &g, c->dst2src[D->tensor], t->name, t->dtype),
                    r, done);
      continue;
    }
    RS_CHECK_GOTO(rs_assign_pieces(&c->actx, D, c->dst2src[D->tensor], t->name, NULL, 0, &c->pieces), r, done);
    RS_CHECK_GOTO(receive_pieces(c, c, D, sdt, t->dtype), r, done);
    if (c->twin) { /* the same box again: its holders are prepared (the plan itself has no flag) */
      c->actx.first_only = 1;
      r = rs_assign_pieces(&c->actx, D, c->dst2src[D->tensor], t->name, NULL, 0, &c->pieces);
      c->actx.first_only = 0;
      RS_CHECK_GOTO(r, r, done);
      RS_CHECK_GOTO(receive_pieces(c, c->twin, D, sdt, t->dtype), r, done);
    }
  }
done:
  rs_frag_vec_free(&mine);
  return r;
}

static int cmp_frag_key(const void *a, const void *b) {
  const rs_frag *x = a, *y = b;
  if (x->rank != y->rank) return (x->rank > y->rank) - (x->rank < y->rank);
  if (x->buffer != y->buffer) return (x->buffer > y->buffer) - (x->buffer < y->buffer);
  return (x->pos > y->pos) - (x->pos < y->pos);
}

/* Direct destination fragments in the order plan_sends assigns them: by
 * box (tensor, start, extent), so that the replicas of one box (every
 * destination DP replica holds the same boxes) come one after another and
 * rs_assign_pieces finds the box's holders once; then canonically. */
typedef struct box_sort {
  const rs_frag *frags;
  const int *dst2src;
} box_sort;
static _Thread_local box_sort box_sort_ctx;

static int cmp_frag_box(const void *a, const void *b) {
  const size_t x = *(const size_t *)a, y = *(const size_t *)b;
  const rs_frag *f = &box_sort_ctx.frags[x], *g = &box_sort_ctx.frags[y];
  int tf = box_sort_ctx.dst2src[f->tensor], tg = box_sort_ctx.dst2src[g->tensor];
  if (tf != tg) return tf < tg ? -1 : 1;
  if (f->ndim != g->ndim) return f->ndim < g->ndim ? -1 : 1;
  for (int d = 0; d < f->ndim; d++) {
    if (f->start[d] != g->start[d]) return f->start[d] < g->start[d] ? -1 : 1;
    if (f->extent[d] != g->extent[d]) return f->extent[d] < g->extent[d] ? -1 : 1;
  }
  return (x > y) - (x < y);
}

/* What this rank sends: the destination fragments that touch its source
 * fragments, and the pieces of them assigned to this rank. A direct
 * stream's segments must be pushed in the receiver's canonical fragment
 * order (the receiver pushes its own that way; chunk.c cuts both alike):
 * the fragments are assigned box by box (cmp_frag_box) and their
 * segments then put back in canonical order. */
static reshard_result_t plan_sends(build_ctx *c) {
  const int me = c->plan->rank;
  rs_frag_vec mine = {0}, cands = {0};
  rs_seg_vec direct[2] = {{0}, {0}}; /* this plan's, the twin's */
  size_t *order = NULL, *first[2] = {NULL, NULL}, *count[2] = {NULL, NULL};
  const int outs = c->twin ? 2 : 1;
  reshard_result_t r;
  RS_CHECK_GOTO(rs_layout_rank_fragments(c->src, me, &mine), r, done);
  for (size_t i = 0; i < mine.n; i++) {
    const rs_frag *S = &mine.v[i];
    size_t before = cands.n;
    RS_CHECK_GOTO(rs_layout_find_holders(c->dst, c->src2dst[S->tensor], S->start, S->extent, NULL, &cands), r, done);
    size_t w = before;
    for (size_t k = before; k < cands.n; k++)
      if (cands.v[k].rank != me) cands.v[w++] = cands.v[k];
    cands.n = w;
  }
  if (cands.n > 1) /* cands.v is NULL when empty: qsort(NULL, 0) is UB */
    qsort(cands.v, cands.n, sizeof *cands.v, cmp_frag_key);
  size_t nd = 0; /* distinct fragments, in canonical order */
  for (size_t i = 0; i < cands.n; i++)
    if (!i || cmp_frag_key(&cands.v[i], &cands.v[nd - 1])) cands.v[nd++] = cands.v[i];
  cands.n = nd;
  order = rs_malloc((nd + 1) * sizeof *order);
  for (int o = 0; o < outs; o++) {
    first[o] = rs_calloc(nd + 1, sizeof *first[o]);
    count[o] = rs_calloc(nd + 1, sizeof *count[o]);
  }
  if (!order || !first[0] || !count[0] || !first[outs - 1] || !count[outs - 1]) {
    r = rs_error(RESHARD_ERROR_OUT_OF_MEMORY, "plan_create rank %d: out of memory planning sends", me);
    goto done;
  }
  size_t ndirect = 0;
  for (size_t i = 0; i < nd; i++) {
    const rs_frag *D = &cands.v[i];
    const rs_tensor *t = &c->dst->tensors[D->tensor];
    rs_relay_group g = {0};
    RS_CHECK_GOTO(relay_group(c, D, &g), r, done);
    if (g.m) {
      /* every member is a candidate: the group's lowest rank's turn; only
       * the cells this rank may provide (their pieces come in the order
       * the members see them in, which is all a stream's order needs) */
      if (D->rank == g.ranks[0]) {
        c->actx.sender = me + 1;
        r = rs_relay_plan_source(&c->rp, &c->actx, &c->pieces, &c->segs, me, D, &g, c->dst2src[D->tensor], t->name, t->dtype);
        c->actx.sender = 0;
        RS_CHECK_GOTO(r, r, done);
      }
      continue;
    }
    order[ndirect++] = i;
  }
  box_sort_ctx = (box_sort){cands.v, c->dst2src};
  if (ndirect > 1) qsort(order, ndirect, sizeof *order, cmp_frag_box);
  /* the segments of fragment i are direct.v[first[i] .. first[i] + count[i]):
   * a fragment's segments are pushed together */
  c->actx.sender = me + 1; /* only the cells this rank may provide */
  for (size_t j = 0; j < ndirect && !r; j++) {
    const rs_frag *D = &cands.v[order[j]];
    const rs_tensor *t = &c->dst->tensors[D->tensor];
    const reshard_dtype_t sdt = c->src->tensors[c->dst2src[D->tensor]].dtype;
    const reshard_dtype_t wdt = (reshard_dtype_t)rs_cvt_wire_dtype(sdt, t->dtype);
    for (int o = 0; o < outs && !r; o++) { /* the twin: the same box again, its holders prepared */
      const int first_only = c->actx.first_only;
      if (o) c->actx.first_only = 1;
      r = rs_assign_pieces(&c->actx, D, c->dst2src[D->tensor], t->name, NULL, 0, &c->pieces);
      c->actx.first_only = first_only;
      if (r) break;
      first[o][order[j]] = direct[o].n;
      for (size_t k = 0; k < c->pieces.n && !r; k++) {
        const rs_piece *p = &c->pieces.v[k];
        if (p->src.rank != me) continue;
        rs_seg s;
        rs_seg_init(&s, RS_SEG_SEND, me, D->rank, &p->src, p, sdt, wdt);
        s.vtensor = D->tensor;
        r = rs_seg_vec_push(&direct[o], &s);
        count[o][order[j]]++;
      }
    }
  }
  c->actx.sender = 0;
  RS_CHECK_GOTO(r, r, done);
  /* back in canonical order, each fragment's segments as a block */
  for (int o = 0; o < outs; o++) {
    rs_seg_vec *segs = o ? &c->twin->segs : &c->segs;
    if (rs_vec_reserve((void **)&segs->v, &segs->cap, segs->n + direct[o].n + 1, sizeof *segs->v)) {
      r = rs_error(RESHARD_ERROR_OUT_OF_MEMORY, "plan_create rank %d: out of memory planning sends", me);
      goto done;
    }
    rs_seg_vec_changed(segs);
    for (size_t i = 0; i < nd; i++) {
      if (!count[o][i]) continue; /* direct.v is NULL when nothing was pushed */
      memcpy(segs->v + segs->n, direct[o].v + first[o][i], count[o][i] * sizeof *direct[o].v);
      segs->n += count[o][i];
    }
  }
done:
  rs_frag_vec_free(&mine);
  rs_frag_vec_free(&cands);
  for (int o = 0; o < 2; o++) {
    rs_seg_vec_free(&direct[o]);
    free(first[o]);
    free(count[o]);
  }
  free(order);
  return r;
}

static reshard_result_t finish_plan(reshard_plan_t *p, build_ctx *c,
                                    size_t chunk) {
  p->chunk_bytes = chunk;
  RS_CHECK(rs_chunk_plan(p, &c->segs, chunk));
  p->local_copies = c->locals;
  p->nlocal_copies = c->nlocals;
  p->local_vbox = c->local_vbox;
  c->locals = NULL;
  c->local_vbox = NULL;
  if (verifying(p)) RS_CHECK(rs_build_vtensors(p, c->dst));
  /* round arrays have nrounds+1 entries for their own direction */
  int rs = p->nsends ? p->sends[p->nsends - 1].round + 1 : 0;
  int rr = p->nrecvs ? p->recvs[p->nrecvs - 1].round + 1 : 0;
  p->nrounds = rs > rr ? rs : rr;
  size_t max_s = 0, max_r = 0;
  for (int k = 0; k < rs; k++) {
    size_t n = p->send_round[k + 1] - p->send_round[k];
    if (n > max_s) max_s = n;
  }
  for (int k = 0; k < rr; k++) {
    size_t n = p->recv_round[k + 1] - p->recv_round[k];
    if (n > max_r) max_r = n;
  }
  p->max_round_sends = max_s;
  p->max_round_msgs = max_s + max_r;
  RS_CHECK(rs_plan_collect_used(c->src, p, 1, &p->src_used, &p->nsrc_used));
  RS_CHECK(rs_plan_collect_used(c->dst, p, 0, &p->dst_used, &p->ndst_used));
  RS_CHECK(rs_plan_peer_stats(p));
  rs_plan_fill_stats(p);
  return RESHARD_SUCCESS;
}

void rs_plan_stage_free(rs_plan_stage *s) {
  rs_seg_vec_free(&s->segs);
  free(s->locals);
  free(s->local_vbox);
  memset(s, 0, sizeof *s);
}

static void build_ctx_free(build_ctx *c) {
  free(c->dst2src);
  free(c->src2dst);
  if (c->back) { /* the tools reuse the memory (rs_plan_agreed.back) */
    rs_seg_vec_free(c->back);
    rs_seg_vec_changed(&c->segs);
    *c->back = c->segs;
    c->back->n = 0;
    c->segs = (rs_seg_vec){0};
  }
  rs_seg_vec_free(&c->segs);
  free(c->locals);
  free(c->local_vbox);
  rs_assign_ctx_free(&c->actx);
  rs_piece_vec_free(&c->pieces);
  rs_relay_plan_free(&c->rp);
}

/* The tools' hold on creation (plan.h). */
_Thread_local rs_plan_agreed rs_plan_force;

/* relay_mode: RELAY_FROM_OPTIONS, or 0 / 1 to build a direct or a relay
 * plan whatever options.relay says (the auto choice builds both). */
enum { RELAY_FROM_OPTIONS = -2 };

/* A first stage's spread, phase estimates and pace candidates, from one
 * sizing of its streams. */
static reshard_result_t stage_figures(reshard_plan_t *p, rs_seg_vec *segs, int32_t *spread, uint64_t *phase_est,
                                      rs_pace *pace_cand) {
  rs_streams st;
  RS_CHECK(rs_streams_size(p, segs, &st));
  *spread = rs_chunk_spread(&st, p->opts.staging_bytes / 8);
  int64_t most = 64;
  if (rs_param_get(RS_PARAM_MAX_PHASES, &most) && most < 1) most = 1;
  reshard_result_t r = rs_phase_estimates(p, &st, *spread, most > 64 ? 64 : (int32_t)most, phase_est);
  if (p->has_topo) rs_pace_candidates(&st, pace_cand); /* pacing serves links of a topology */
  rs_streams_free(&st);
  return r;
}

/* Creation's first step on this rank, before any stage: the plan's fields
 * and options (`prior` agreed on like a failure of its own), the tensors
 * matched, the layouts' ranks inside the communicator, the topology and
 * the relay context. */
static reshard_result_t begin_plan(build_ctx *c, reshard_plan_t *p, reshard_comm_t *comm, const rs_executor *ex,
                                   const reshard_layout_t *src, const reshard_layout_t *dst,
                                   const reshard_options_t *options, int relay_mode, reshard_result_t prior,
                                   const char *prior_msg, uint32_t internal, reshard_plan_t **out) {
  if (!p) return rs_error(RESHARD_ERROR_OUT_OF_MEMORY, "plan_create: out of memory");
  p->comm = comm;
  p->executor = ex;
  p->rank = comm->rank;
  p->size = comm->size;
  p->active_copy = -1;
  p->doubt_copy = -1;
  p->rejoins = comm->rejoins;
  p->resizes = comm->resizes;
  reshard_result_t local = rs_options_read(options, &p->opts);
  if (!local) local = rs_options_apply_params(&p->opts);
  p->opts.flags |= internal;
  if (!local && prior) local = rs_error(prior, "%s", prior_msg);
  if (local) return local;
  if (!src || !dst || !out)
    return rs_error(RESHARD_ERROR_INVALID_ARGUMENT, "plan_create: %s is NULL", !src ? "src" : !dst ? "dst" : "plan");
  c->src = src;
  c->dst = dst;
  c->plan = p;
  c->actx.src = src;
  c->actx.first_only = (p->opts.flags & RESHARD_FLAG_FIRST_REPLICA) != 0;
  reshard_result_t r = rs_match_tensors(c);
  if (r) return r;
  int ms = rs_layout_max_rank(src), md = rs_layout_max_rank(dst);
  if (ms >= comm->size || md >= comm->size)
    return rs_error(RESHARD_ERROR_INVALID_ARGUMENT, "%s layout: rank %d is outside the communicator of %d ranks",
                    ms >= comm->size ? "source" : "destination", ms >= comm->size ? ms : md, comm->size);
  local = rs_topology_resolve(&p->opts, &p->topo, &p->has_topo);
  /* the caller's string may not outlive the call */
  p->opts.topology = p->has_topo ? p->topo.name : NULL;
  if (!local && p->has_topo) local = rs_rank_map_build(&p->topo, src, dst, comm->size, &p->map);
  p->domain_div = p->has_topo ? rs_topology_domain_chunk_div(&p->topo) : 1;
  p->phases = 1;
  if (local) return local;
  /* Every transport relays: the host executor and the device executor
   * both send forwards from the destination buffers the round after
   * their data arrived. relay -1 (auto) plans direct here; the caller
   * builds a relay plan too when the cost model can choose. */
  int want = relay_mode == RELAY_FROM_OPTIONS ? p->opts.relay == 1 : relay_mode;
  c->relay = want;
  const int32_t *domain = p->has_topo ? p->map.domain : NULL;
  c->actx.domain = domain;
  for (int b = 0; domain && b < src->nbuffers && !c->actx.spread; b++) c->actx.spread = src->buffers[b].spread_origin != 0;
  c->rp.ctx = (rs_relay_ctx){.src = src, .dst = dst, .domain = domain, .min_part_bytes = rs_relay_min_part_bytes};
  return RESHARD_SUCCESS;
}

/* The first stage of this rank: its segments and local copies, planned
 * here (with a twin first stage when the tools ask for one) or taken from
 * an earlier creation (rs_plan_force.use, with its digest in *use_digest),
 * and its spread, phase estimates and pace candidates. */
static reshard_result_t first_stage(build_ctx *c, reshard_comm_t *comm, build_ctx **twin, int32_t *spread,
                                    uint64_t *use_digest) {
  reshard_plan_t *p = c->plan;
  rs_plan_stage *use = rs_plan_force.use;
  if (use) { /* the tools: the first stage as an earlier creation kept it */
    c->segs = use->segs;
    c->locals = use->locals;
    c->local_vbox = use->local_vbox;
    c->nlocals = c->cap_locals = use->nlocals;
    c->cap_local_vbox = use->local_vbox ? use->nlocals : 0;
    *spread = use->spread;
    *use_digest = use->digest;
    memcpy(p->phase_est, use->phase_est, sizeof p->phase_est);
    memcpy(p->pace_cand, use->pace_cand, sizeof p->pace_cand);
    memset(use, 0, sizeof *use);
    if (rs_plan_force.back) c->back = &rs_plan_force.back->segs;
    return RESHARD_SUCCESS;
  }
  reshard_result_t r = rs_layout_validate_rank(c->src, "source", comm->rank);
  if (!r) r = rs_layout_validate_rank(c->dst, "destination", comm->rank);
  if (!r && !rs_plan_force.covered) r = rs_layout_check_coverage(c->src, "source");
  if (!r && !rs_plan_force.covered) r = rs_layout_check_coverage(c->dst, "destination");
  if (r) return r;
  if (rs_plan_force.back && rs_plan_force.keep) { /* the tools: memory of an earlier stage, reused */
    c->segs = rs_plan_force.back->segs;
    rs_plan_force.back->segs = (rs_seg_vec){0};
    rs_seg_vec_changed(&c->segs);
    c->segs.n = 0;
  }
  if (rs_plan_force.twin) {
    if (rs_plan_force.stop != RS_PLAN_STOP_STAGE || !rs_plan_force.keep || c->relay || c->actx.first_only)
      return rs_error(RESHARD_ERROR_INVALID_USAGE,
                      "plan_create rank %d: a twin first stage needs a stopped, kept, direct creation without "
                      "RESHARD_FLAG_FIRST_REPLICA",
                      comm->rank);
    if (!(*twin = rs_calloc(1, sizeof **twin)))
      return rs_error(RESHARD_ERROR_OUT_OF_MEMORY, "plan_create: out of memory");
    **twin = (build_ctx){.src = c->src, .dst = c->dst, .plan = p}, c->twin = *twin;
  }
  r = plan_receives(c);
  if (!r) {
    c->rp.ctx.memo = 1;
    r = plan_sends(c);
  }
  if (!r) r = rs_relay_plan_order(&c->rp, &c->segs);
  if (r) return r;
  return stage_figures(p, &c->segs, spread, p->phase_est, p->pace_cand);
}

/* A creation stopped after its first stage (rs_plan_force.stop, the
 * tools): the stage kept for later creations, and the twin's with it;
 * frees c and the twin, and the plan too on failure. */
static reshard_result_t keep_stage(build_ctx *c, build_ctx *twin, int32_t spread, reshard_plan_t **out) {
  reshard_plan_t *p = c->plan;
  rs_plan_stage *k = rs_plan_force.keep;
  if (k) { /* the tools: the first stage, kept for later creations */
    rs_plan_stage_free(k);
    k->segs = c->segs;
    k->locals = c->locals;
    k->local_vbox = c->local_vbox;
    k->nlocals = c->nlocals;
    k->spread = spread;
    uint64_t hdr[7];
    k->digest = rs_creation_digest(p, c->src, c->dst, rs_plan_force.digest, hdr);
    memcpy(k->phase_est, p->phase_est, sizeof k->phase_est);
    memcpy(k->pace_cand, p->pace_cand, sizeof k->pace_cand);
    c->segs = (rs_seg_vec){0};
    c->locals = NULL;
    c->local_vbox = NULL;
  }
  rs_plan_stage *t = twin ? rs_plan_force.twin : NULL;
  if (t) { /* the twin: its figures, and its digest under the flag */
    rs_plan_stage_free(t);
    reshard_result_t r = stage_figures(p, &twin->segs, &t->spread, t->phase_est, t->pace_cand);
    if (r) {
      build_ctx_free(twin);
      free(twin);
      build_ctx_free(c);
      reshard_plan_destroy(p);
      return r;
    }
    const uint32_t flags = p->opts.flags;
    p->opts.flags |= RESHARD_FLAG_FIRST_REPLICA;
    uint64_t hdr[7];
    t->digest = rs_creation_digest(p, c->src, c->dst, rs_plan_force.twin_digest, hdr);
    p->opts.flags = flags;
    t->segs = twin->segs;
    t->locals = twin->locals;
    t->local_vbox = twin->local_vbox;
    t->nlocals = twin->nlocals;
    twin->segs = (rs_seg_vec){0};
    twin->locals = NULL;
    twin->local_vbox = NULL;
  }
  if (twin) {
    build_ctx_free(twin);
    free(twin);
  }
  p->spread_rounds = spread;
  build_ctx_free(c);
  *out = p;
  return RESHARD_SUCCESS;
}

/* prior: a failure this rank found before (its error set), which the
 * creation agrees on like its own, so that every rank fails alike.
 * internal: RS_FLAG_GLOBAL_VERDICT or 0, added to the plan's flags after
 * the caller's options are checked. */
static reshard_result_t plan_create_one(reshard_comm_t *comm, const rs_executor *ex,
                                        const reshard_layout_t *src,
                                        const reshard_layout_t *dst,
                                        const reshard_options_t *options,
                                        int relay_mode, reshard_result_t prior,
                                        uint32_t internal, reshard_plan_t **out) {
  if (!comm) return rs_error(RESHARD_ERROR_INVALID_ARGUMENT, "plan_create: comm is NULL");
  if (out) *out = NULL;
  char prior_msg[768] = "";
  if (prior) snprintf(prior_msg, sizeof prior_msg, "%s", reshard_last_error());
  uint32_t plan_seq = comm->plans_created++;
  rs_transcript_count_plan(comm);
  build_ctx c;
  memset(&c, 0, sizeof c);
  reshard_plan_t *p = rs_calloc(1, sizeof *p);
  if (p) p->seq = plan_seq; /* the agreement may give it a kept plan's (create_agree.c) */
  reshard_result_t local =
      begin_plan(&c, p, comm, ex, src, dst, options, relay_mode, prior, prior_msg, internal, out);
  int32_t spread = 0;
  build_ctx *twin = NULL; /* rs_plan_force.twin's */
  uint64_t use_digest = 0; /* with rs_plan_force.use: the digest its creation computed */
  if (!local) local = first_stage(&c, comm, &twin, &spread, &use_digest);
  if (!local && rs_plan_force.stop == RS_PLAN_STOP_STAGE) return keep_stage(&c, twin, spread, out);
  if (twin) {
    build_ctx_free(twin);
    free(twin);
    c.twin = NULL;
  }
  uint64_t digest = 0;
  reshard_result_t r = rs_create_agree(comm, p, src, dst, local, spread, use_digest, &digest);
  if (r) goto fail;
  size_t chunk = 0;
  if (rs_plan_force.set_chunk) {
    chunk = rs_plan_force.chunk;
  } else {
    r = rs_create_agree_chunk(comm, p, &c.segs, &chunk);
    if (r) goto fail;
  }
  if (rs_plan_force.stop == RS_PLAN_STOP_CHUNK) {
    p->chunk_bytes = chunk;
    build_ctx_free(&c);
    *out = p;
    return RESHARD_SUCCESS;
  }
  p->digest = digest;
  p->num_src_buffers = src->nbuffers;
  p->num_dst_buffers = dst->nbuffers;
  /* bits 32-47 of every tag name the plan; the rest: src/exec/exec_state.h */
  p->tag_base = (uint64_t)(p->seq & 0xffffu) << 32;
  r = finish_plan(p, &c, chunk);
  /* The executor sets up everything an execute needs now, before the
   * agreement below: a rank that cannot (memory, a wrong device) fails
   * creation on every rank, instead of failing its first execute while its
   * peers queue theirs and wait forever. */
  if (r == RESHARD_SUCCESS && ex->prepare_local) r = ex->prepare_local(p);
  /* Building the plan can still fail on one rank (memory): agree once
   * more, so that no rank keeps a plan its peers do not have. */
  r = rs_create_agree_outcome(comm, p, r, "building its plan");
  if (r) goto fail;
  if (ex->prepare_peers) {
    /* Connect the plan's peers while every rank is here (collective), and
     * agree on the outcome: a rank whose peers did not all answer poisons
     * its communicator, and its partners must not keep the plan either. */
    r = rs_create_agree_outcome(comm, p, ex->prepare_peers(p), "connecting its plan's peers");
    if (r) goto fail;
  }
  build_ctx_free(&c);
  RS_LOG(RS_LOG_INFO, RS_SUBSYS_PLAN, "rank %d: plan with %zu sends, %zu receives, %zu local copies, %d rounds, chunk %zu",
         p->rank, p->nsends, p->nrecvs, p->nlocal_copies, p->nrounds, p->chunk_bytes);
  *out = p;
  return RESHARD_SUCCESS;
fail:
  build_ctx_free(&c);
  reshard_plan_destroy(p);
  return r;
}

/* Whether relay -1 (auto) has a choice to make: the cost model needs a
 * topology. The same on every rank (the options and topology are part of
 * the digest). */
static int auto_relay(const reshard_plan_t *p) { return p->opts.relay == -1 && p->has_topo; }

static reshard_result_t create_plain(reshard_comm_t *comm, const rs_executor *ex, const reshard_layout_t *src,
                                     const reshard_layout_t *dst, const reshard_options_t *options,
                                     reshard_result_t prior, uint32_t internal, reshard_plan_t **out) {
  reshard_plan_t *direct = NULL, *relay = NULL;
  RS_CHECK(plan_create_one(comm, ex, src, dst, options, RELAY_FROM_OPTIONS, prior, internal, out ? &direct : NULL));
  if (!auto_relay(direct)) {
    *out = direct;
    return RESHARD_SUCCESS;
  }
  if (rs_plan_force.stop || rs_plan_force.keep || rs_plan_force.use) {
    /* the tools' staged creations hold one first stage: they resolve
     * the relay choice themselves, and an environment that asks for it
     * again cannot be followed */
    reshard_plan_destroy(direct);
    return rs_error(RESHARD_ERROR_INVALID_USAGE,
                    "plan_create rank %d: staged planning needs relay 0 or 1, but relay is -1 with a topology "
                    "(RESHARD_RELAY=-1 in the environment?)",
                    comm->rank);
  }
  /* relay -1 with a topology: build the relay plan as well and keep the
   * one the cost model predicts faster. Both creations and both estimates
   * are collective and all-or-nothing, and the estimates are reduced over
   * all ranks, so every rank keeps the same kind of plan. A tie keeps the
   * direct plan (fewer hops, no forwarding through destination ranks). */
  reshard_estimate_t ed = RESHARD_ESTIMATE_INITIALIZER, er = RESHARD_ESTIMATE_INITIALIZER;
  reshard_result_t r = plan_create_one(comm, ex, src, dst, options, 1, RESHARD_SUCCESS, internal, &relay);
  if (!r) r = reshard_plan_estimate(direct, &ed);
  if (!r) r = reshard_plan_estimate(relay, &er);
  if (r) {
    rs_error_prefix("plan_create rank %d (choosing between a direct and a relay plan): ", comm->rank);
    reshard_plan_destroy(direct);
    reshard_plan_destroy(relay);
    return r;
  }
  int keep_relay = er.seconds < ed.seconds;
  RS_LOG(RS_LOG_INFO, RS_SUBSYS_PLAN, "rank %d: relay auto: direct %.6f s, relay %.6f s predicted on %s: keeping the %s plan",
         comm->rank, ed.seconds, er.seconds, direct->topo.name, keep_relay ? "relay" : "direct");
  reshard_plan_destroy(keep_relay ? direct : relay);
  *out = keep_relay ? relay : direct;
  (*out)->relay_chosen = keep_relay;
  return RESHARD_SUCCESS;
}

/* Whether source-side spreading (spread.h) may be tried on plan p: the
 * same answer on every rank (options, topology and executor are). A
 * stream-ordered executor needs to allocate the scratch on the device. */
static int spread_wanted(const reshard_plan_t *p) {
  return p->has_topo && !(p->opts.flags & (RESHARD_FLAG_NO_SPREAD | RESHARD_FLAG_FIRST_REPLICA)) &&
         (!p->executor->stream_ordered || p->executor->spread_prepare) && !rs_plan_force.stop &&
         !rs_plan_force.keep && !rs_plan_force.use && p->map.ndomains > 0;
}

/* The direct plan, or a spread plan (spread.h) when the cost model
 * predicts it faster. Creation of the plain plan, the loads' agreement,
 * the verdict, the pre-plan and the main plan are all collective, and
 * every choice is made from agreed figures, so every rank keeps the same
 * kind of plan; a failure on one rank (memory for the decision or the
 * scratch) fails creation on every rank, as everywhere in creation. */
static reshard_result_t create_spread(reshard_comm_t *comm, const rs_executor *ex, const reshard_layout_t *src,
                                      const reshard_layout_t *dst,
                                      const reshard_options_t *options, reshard_result_t prior, uint32_t internal,
                                      reshard_plan_t **out) {
  reshard_plan_t *p0 = NULL;
  RS_CHECK(create_plain(comm, ex, src, dst, options, prior, internal, &p0));
  if (!spread_wanted(p0)) {
    *out = p0;
    return RESHARD_SUCCESS;
  }
  const int N = comm->size, me = comm->rank;
  uint64_t *w = rs_calloc(2 * (size_t)N + 1, sizeof *w);
  reshard_result_t local =
      w ? RESHARD_SUCCESS : rs_error(RESHARD_ERROR_OUT_OF_MEMORY, "plan_create rank %d: out of memory (spreading)", me);
  int failed = 0;
  reshard_result_t r = rs_create_agree_loads(comm, p0, src, w, &local, &failed);
  rs_spread_layouts sl;
  memset(&sl, 0, sizeof sl);
  rs_spread *sp = NULL;
  if (!r && !failed) {
    local = rs_spread_layouts_make(src, dst, &p0->map, N, me, w, w + N, (p0->opts.flags & RESHARD_FLAG_SPREAD_ALWAYS) != 0,
                                   &sl);
  }
  free(w);
  char msg[640] = "";
  if (local) snprintf(msg, sizeof msg, "%s", reshard_last_error());
  /* 0: nothing to spread, 1: spread, 2: some rank failed (with the
   * result in the next word, and who and why after it); also after a
   * failure in the loads' agreement, so that its rank is named */
  uint64_t verdict[2 + RS_BLAME_WORDS] = {local ? 2 : sl.src ? 1 : 0, (uint64_t)local};
  rs_blame_put(verdict + 2, me, local ? msg : NULL, rs_blame_first_cause(local));
  if (!r)
    r = rs_create_reduce(comm, verdict, 2 + RS_BLAME_WORDS, rs_deadline_after_ms(p0->opts.timeout_ms), 1, 2);
  /* (a result code alone fails too: how a kept plan's rejoin carries its
   * finding, plan/rejoin.c) */
  if (!r && (failed || verdict[0] == 2 || verdict[1]))
    r = local ? rs_error(local, "%s", msg)
              : rs_create_another_failed(comm, verdict[1], verdict + 2, "spreading its sources");
  reshard_plan_t *pre = NULL, *main_plan = NULL;
  if (!r && verdict[0] == 1) {
    reshard_options_t o = p0->opts;
    /* its destination is scratch; (internal bits are not options) */
    o.flags &= ~(uint32_t)(RESHARD_FLAG_DOUBLE_BUFFER | RS_FLAG_GLOBAL_VERDICT);
    o.relay = 0;
    r = create_plain(comm, ex, src, sl.pre, &o, RESHARD_SUCCESS, 0, &pre);
    /* On a device a rank whose copies failed must close every rank's
     * gate (plan.h RS_FLAG_GLOBAL_VERDICT): its partners outside the
     * domain would otherwise take its stale scratch. The host executor
     * fails the composite call on every rank itself (stages.c). */
    const uint32_t gate = ex->stream_ordered ? RS_FLAG_GLOBAL_VERDICT : 0;
    if (!r) r = create_plain(comm, ex, sl.src, dst, options, RESHARD_SUCCESS, internal | gate, &main_plan);
  }
  int keep = 0;
  if (!r && main_plan) {
    reshard_estimate_t e0 = RESHARD_ESTIMATE_INITIALIZER, ep = RESHARD_ESTIMATE_INITIALIZER,
                       em = RESHARD_ESTIMATE_INITIALIZER;
    r = reshard_plan_estimate(p0, &e0);
    if (!r) r = reshard_plan_estimate(pre, &ep);
    if (!r) r = reshard_plan_estimate(main_plan, &em);
    if (!r) {
      keep = (p0->opts.flags & RESHARD_FLAG_SPREAD_ALWAYS) || ep.seconds + em.seconds < e0.seconds * 0.98;
      RS_LOG(RS_LOG_INFO, RS_SUBSYS_PLAN,
             "rank %d: spreading %llu bytes: %.6f s + %.6f s predicted against %.6f s without: keeping the %s plan",
             me, (unsigned long long)sl.moved, ep.seconds, em.seconds, e0.seconds, keep ? "spread" : "plain");
    }
  }
  /* The scratch, for a plan kept only. It can be large (what a rank
   * takes), and the plain plan works without it: a rank that cannot
   * allocate it makes every rank keep the plain plan, and says so on
   * stderr whatever RESHARD_DEBUG says. */
  if (!r && keep) {
    reshard_result_t lr = rs_spread_create(&sl, src, comm, ex, &sp);
    char why[640] = "";
    if (lr) snprintf(why, sizeof why, "%s", reshard_last_error());
    uint64_t short_of = lr != RESHARD_SUCCESS;
    r = rs_create_reduce(comm, &short_of, 1, rs_deadline_after_ms(p0->opts.timeout_ms), -1, 0);
    if (!r && short_of) {
      keep = 0;
      if (lr)
        rs_log(RS_LOG_WARN, RS_SUBSYS_PLAN, "%s: planning without source-side spreading on every rank (RESHARD_SPREAD=0 "
               "skips it)", why);
      rs_error_clear();
    }
  }
  if (r) rs_error_prefix("plan_create rank %d (source-side spreading; RESHARD_SPREAD=0 turns it off): ", me);
  rs_spread_layouts_free(&sl);
  if (r || !keep) {
    rs_spread_free(sp);
    reshard_plan_destroy(pre);
    reshard_plan_destroy(main_plan);
    if (r) {
      reshard_plan_destroy(p0);
      return r;
    }
    *out = p0;
    return RESHARD_SUCCESS;
  }
  reshard_plan_destroy(p0);
  rs_plan_add_pre_stats(main_plan, pre);
  sp->pre = pre;
  main_plan->spread = sp;
  /* (the device executor's: plan.h) */
  pre->stage_what = "copying sole-held data to less busy ranks of its domain";
  main_plan->after = pre;
  main_plan->stuck_out[0] = pre->stuck_out[0] = &sp->dev_stuck;
  *out = main_plan;
  return RESHARD_SUCCESS;
}

static reshard_result_t create_quant(reshard_comm_t *comm, const rs_executor *ex, const reshard_layout_t *src,
                                     const reshard_layout_t *dst, const reshard_options_t *options,
                                     reshard_plan_t **out) {
  /* Block quantization: a main plan over rewritten layouts and, for
   * blocks no source rank holds whole, a pre-plan gathering them. Both
   * creations are collective; whatever fails on this rank before them
   * (the rewrite, the scratch) fails inside them, so that every rank
   * fails alike instead of waiting for this one. */
  rs_quant_layouts ql;
  reshard_result_t r = rs_quant_layouts_make(src, dst, comm->size, comm->rank, &ql);
  if (!r && !ql.src) return create_spread(comm, ex, src, dst, options, RESHARD_SUCCESS, 0, out);
  rs_quant *quant = NULL;
  if (!r && (rs_plan_force.stop || rs_plan_force.keep || rs_plan_force.use))
    r = rs_error(RESHARD_ERROR_UNSUPPORTED,
                 "plan_create rank %d: staged planning does not cover fp8 block quantization (reshard_plan plans "
                 "the rewritten layouts itself)", comm->rank);
  reshard_options_t defaults = RESHARD_OPTIONS_INITIALIZER;
  if (!r) r = rs_quant_create(&ql, src, comm, ex, (options ? options : &defaults)->timeout_ms, &quant);
  reshard_plan_t *main_plan = NULL, *pre = NULL;
  /* (with a pre-plan, a rank whose gathering failed must close every
   * rank's gate: the main plan's verdict is global, see plan.h) */
  r = create_spread(comm, ex, r ? src : ql.src, r ? dst : ql.dst, options, r,
                    ql.gather ? RS_FLAG_GLOBAL_VERDICT : 0, &main_plan);
  if (!r && ql.gather) {
    reshard_options_t o = main_plan->opts;
    /* its destination is scratch; (internal bits are not options) */
    o.flags &= ~(uint32_t)(RESHARD_FLAG_DOUBLE_BUFFER | RS_FLAG_GLOBAL_VERDICT);
    o.relay = 0;
    r = create_plain(comm, ex, src, ql.gather, &o, RESHARD_SUCCESS, 0, &pre);
    if (r) rs_error_prefix("plan_create rank %d (the plan gathering blocks split across source ranks): ", comm->rank);
  }
  rs_quant_layouts_free(&ql);
  if (r) {
    rs_quant_free(quant);
    reshard_plan_destroy(main_plan);
    return r;
  }
  if (pre) rs_plan_add_pre_stats(main_plan, pre);
  quant->pre = pre;
  main_plan->quant = quant;
  /* The device executor's stages (plan.h): the codes are made by the
   * first stage that reads them, after the gather; work left running on
   * the GPU by any stage keeps the scratch. */
  reshard_plan_t *first = main_plan->spread ? main_plan->spread->pre : main_plan;
  first->quantize_first = quant;
  first->after = pre;
  first->stuck_out[1] = main_plan->stuck_out[1] = &quant->dev_stuck;
  if (pre) {
    pre->stage_what = "gathering fp8 blocks split across source ranks";
    pre->stuck_out[0] = &quant->dev_stuck;
  }
  *out = main_plan;
  return RESHARD_SUCCESS;
}

/* On a communicator that replaces ranks (UCX), the creation's collectives
 * are recorded (plan/transcript.c), so that a staying rank can keep the
 * plan across a replacement by replaying them (reshard_plan_rejoin), and
 * a last agreement follows, so that every rank learns whether any could
 * not record (memory) or, in a newcomer's creation, whether a staying
 * rank's replay found that the newcomer's plan would differ. */
reshard_result_t rs_plan_create(reshard_comm_t *comm, const rs_executor *ex, const reshard_layout_t *src,
                                const reshard_layout_t *dst, const reshard_options_t *options, reshard_plan_t **out) {
  rs_error_clear();
  if (out) *out = NULL;
  if (!comm || !out) return create_plain(comm, ex, src, dst, options, RESHARD_SUCCESS, 0, out); /* which says why */
  if (!comm->ops->replaces_ranks) return create_quant(comm, ex, src, dst, options, out);
  rs_transcript *t = rs_calloc(1, sizeof *t);
  rs_transcript_begin(comm, t);
  reshard_result_t r = create_quant(comm, ex, src, dst, options, out);
  rs_transcript_end();
  if (r) {
    rs_transcript_free(t);
    return r;
  }
  reshard_result_t local = t && !t->broken ? RESHARD_SUCCESS
                                           : rs_error(RESHARD_ERROR_OUT_OF_MEMORY, "plan_create rank %d: out of "
                                                      "memory recording the creation (for reshard_plan_rejoin)",
                                                      comm->rank);
  r = rs_create_agree_outcome(comm, *out, local, "keeping its plan for a rejoin");
  if (r) {
    rs_transcript_free(t);
    reshard_plan_destroy(*out);
    *out = NULL;
    return r;
  }
  (*out)->transcript = t;
  RS_LOG(RS_LOG_INFO, RS_SUBSYS_PLAN, "rank %d: creation recorded for a rejoin: %zu collectives, %zu words, %u plans",
         comm->rank, t->n, t->nwords, t->plans);
  return RESHARD_SUCCESS;
}
