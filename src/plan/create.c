/* reshard_plan_create: validate, plan this rank's side, agree, chunk.
 *
 * Every path past the communicator check reaches exactly one agreement
 * collective, carrying this rank's digest and error, so that a rank that
 * fails (bad input, out of memory, a coverage hole only it can see) makes
 * every other rank fail too instead of leaving them waiting. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/clock.h"
#include "common/debug.h"
#include "common/error.h"
#include "common/vec.h"
#include "common/params.h"
#include "plan/plan.h"
#include "plan/relay.h"
#include "transport/transport.h"

typedef struct build_ctx {
  const reshard_layout_t *src, *dst;
  reshard_plan_t *plan;
  int *dst2src, *src2dst;
  rs_seg_vec segs; /* sends, receives and virtual relay streams */
  rs_copy *locals;
  size_t nlocals, cap_locals;
  rs_assign_ctx actx;
  rs_piece_vec pieces;
  int npeers;
  /* Relay plans (plan/relay.h): built when relay is set. */
  int relay;
  rs_relay_ctx rctx;
  rs_relay_table groups;
  /* The relayed fragment boxes met, by id (rs_seg.box until
   * order_relay turns ids into ordinals). */
  struct relay_box {
    int32_t tensor, ndim;
    int64_t start[RESHARD_MAX_DIMS], extent[RESHARD_MAX_DIMS];
  } *boxes;
  size_t nboxes, cap_boxes;
  rs_piece_vec parts;  /* relay: the (cell, owner) ranges of a fragment */
  size_t *part_segs;   /* relay: per range, 4 segment indices (see relay_receive) */
  size_t cap_part_segs;
} build_ctx;

/* The sizes of every published version of reshard_options_t: a caller
 * built against an older header passes its own size and gets the defaults
 * of the fields it does not know. */
static size_t options_size_of_version(uint32_t version) {
  switch (version) {
    case 1: return offsetof(reshard_options_t, timeout_ms) + sizeof(int64_t);
    case 2: return sizeof(reshard_options_t);
    default: return 0;
  }
}

static reshard_result_t read_options(const reshard_options_t *in,
                                     reshard_options_t *out) {
  reshard_options_t def = RESHARD_OPTIONS_INITIALIZER;
  *out = def;
  if (!in) return RESHARD_SUCCESS;
  if (in->struct_size < offsetof(reshard_options_t, staging_bytes))
    return rs_error(RESHARD_ERROR_INVALID_ARGUMENT,
                    "options: struct_size %u is not one this library knows (expected %zu); start from RESHARD_OPTIONS_INITIALIZER",
                    in->struct_size, sizeof(reshard_options_t));
  if (in->version < 1 || in->version > RESHARD_OPTIONS_VERSION)
    return rs_error(RESHARD_ERROR_INVALID_ARGUMENT, "options: version %u unknown (library has %d)", in->version, RESHARD_OPTIONS_VERSION);
  if (in->struct_size != options_size_of_version(in->version))
    return rs_error(RESHARD_ERROR_INVALID_ARGUMENT,
                    "options: struct_size %u does not match version %u (expected %zu); start from RESHARD_OPTIONS_INITIALIZER",
                    in->struct_size, in->version, options_size_of_version(in->version));
  memcpy(out, in, in->struct_size);
  out->struct_size = (uint32_t)sizeof(reshard_options_t);
  out->version = RESHARD_OPTIONS_VERSION;
  return RESHARD_SUCCESS;
}

/* Environment parameters override the caller's options (like NCCL_*), so
 * that a job can be tuned without a rebuild; ranks that disagree still
 * fail cleanly because the options are part of the digest. */
static reshard_result_t apply_params(reshard_options_t *o) {
  int64_t v;
  if (rs_param_get(RS_PARAM_STAGING_BYTES, &v)) o->staging_bytes = v > 0 ? (size_t)v : 0;
  if (rs_param_get(RS_PARAM_CHUNK_BYTES, &v)) o->chunk_bytes = v > 0 ? (size_t)v : 0;
  if (rs_param_get(RS_PARAM_TIMEOUT_MS, &v)) o->timeout_ms = v;
  if (rs_param_get(RS_PARAM_RELAY, &v)) o->relay = (int)(v < -1 ? -2 : v > 1 ? 2 : v);
  const char *topo = rs_param_get_string(RS_PARAM_TOPOLOGY);
  if (topo) o->topology = topo;
  if (o->relay < -1 || o->relay > 1)
    return rs_error(RESHARD_ERROR_INVALID_ARGUMENT, "options: relay %d is not -1 (auto), 0 (never) or 1 (always)", o->relay);
  if (o->flags & ~RS_KNOWN_FLAGS)
    return rs_error(RESHARD_ERROR_INVALID_ARGUMENT, "options: flags 0x%x has unknown bits 0x%x", o->flags,
                    o->flags & ~RS_KNOWN_FLAGS);
  if (o->staging_bytes < 4096)
    return rs_error(RESHARD_ERROR_INVALID_ARGUMENT, "options: staging_bytes %zu is below the minimum of 4096", o->staging_bytes);
  return RESHARD_SUCCESS;
}

static void format_shape(char *buf, size_t n, int ndim, const int64_t *shape) {
  size_t used = (size_t)snprintf(buf, n, "[");
  for (int d = 0; d < ndim && used < n; d++)
    used += (size_t)snprintf(buf + used, n - used, "%s%lld", d ? ", " : "", (long long)shape[d]);
  if (used < n) snprintf(buf + used, n - used, "]");
}

/* Tensors must match by name, dtype and shape on both sides. */
static reshard_result_t match_tensors(build_ctx *c) {
  const reshard_layout_t *S = c->src, *D = c->dst;
  c->dst2src = malloc(((size_t)D->ntensors + 1) * sizeof(int));
  c->src2dst = malloc(((size_t)S->ntensors + 1) * sizeof(int));
  if (!c->dst2src || !c->src2dst) return rs_error(RESHARD_ERROR_OUT_OF_MEMORY, "plan_create: out of memory");
  for (int i = 0; i < S->ntensors; i++) c->src2dst[i] = -1;
  for (int i = 0; i < D->ntensors; i++) {
    const rs_tensor *dt = &D->tensors[i];
    int s;
    if (reshard_layout_find_tensor(S, dt->name, &s) != RESHARD_SUCCESS)
      return rs_error(RESHARD_ERROR_INVALID_ARGUMENT, "tensor '%s': in the destination layout but not in the source layout", dt->name);
    const rs_tensor *st = &S->tensors[s];
    if (st->dtype != dt->dtype)
      return rs_error(RESHARD_ERROR_INVALID_ARGUMENT, "tensor '%s': dtype %s on the source side, %s on the destination side",
                      dt->name, reshard_dtype_name(st->dtype), reshard_dtype_name(dt->dtype));
    int same = st->ndim == dt->ndim;
    for (int d = 0; same && d < dt->ndim; d++) same = st->shape[d] == dt->shape[d];
    if (!same) {
      char a[160], b[160];
      format_shape(a, sizeof a, st->ndim, st->shape);
      format_shape(b, sizeof b, dt->ndim, dt->shape);
      return rs_error(RESHARD_ERROR_INVALID_ARGUMENT, "tensor '%s': shape %s on the source side, %s on the destination side",
                      dt->name, a, b);
    }
    c->dst2src[i] = s;
    c->src2dst[s] = i;
  }
  for (int i = 0; i < S->ntensors; i++)
    if (c->src2dst[i] < 0)
      return rs_error(RESHARD_ERROR_INVALID_ARGUMENT, "tensor '%s': in the source layout but not in the destination layout", S->tensors[i].name);
  return RESHARD_SUCCESS;
}

static reshard_result_t push_local(build_ctx *c, const rs_copy *cp) {
  if (RS_VEC_GROW(c->locals, c->nlocals, c->cap_locals))
    return rs_error(RESHARD_ERROR_OUT_OF_MEMORY, "plan_create: out of memory (local copies)");
  c->locals[c->nlocals++] = *cp;
  return RESHARD_SUCCESS;
}

/* A segment of box p of fragment f (this rank's) in stream from -> to;
 * direct traffic until relay_seg says otherwise. */
static void make_seg(rs_seg *s, int dir, int32_t from, int32_t to, const rs_frag *f,
                     const rs_piece *p, size_t es) {
  memset(s, 0, sizeof *s);
  s->dir = dir;
  s->from = from;
  s->to = to;
  s->peer = dir == RS_SEG_SEND ? to : from;
  s->origin = -1;
  s->dep = -1;
  s->buffer = f->buffer;
  s->ndim = f->ndim;
  s->tensor = f->tensor;
  s->esize = (uint32_t)es;
  s->off = rs_frag_offset_of(f, p->start, es);
  s->bytes = es;
  s->group = -1;
  for (int d = 0; d < f->ndim; d++) {
    s->extent[d] = p->extent[d];
    s->strides[d] = f->strides[d];
    s->bytes *= (uint64_t)p->extent[d];
  }
}

/* Remembers relayed fragment box D; *id names it in segments. */
static reshard_result_t add_box(build_ctx *c, const rs_frag *D, int32_t *id) {
  if (RS_VEC_GROW(c->boxes, c->nboxes, c->cap_boxes))
    return rs_error(RESHARD_ERROR_OUT_OF_MEMORY, "plan_create: out of memory (relay boxes)");
  struct relay_box *b = &c->boxes[c->nboxes];
  memset(b, 0, sizeof *b);
  b->tensor = D->tensor;
  b->ndim = D->ndim;
  memcpy(b->start, D->start, sizeof b->start);
  memcpy(b->extent, D->extent, sizeof b->extent);
  *id = (int32_t)c->nboxes++;
  return RESHARD_SUCCESS;
}

/* Marks a segment as relay traffic of group for fragment box `box`,
 * piece k of the group's assignment. */
static void relay_seg(rs_seg *s, int32_t group, int32_t box, size_t k) {
  s->group = group;
  s->box = box;
  s->piece = (uint32_t)k;
}

/* Re-routes relay segment s to the stream from -> to as seen by me. */
static void route(rs_seg *s, int32_t me, int32_t from, int32_t to) {
  s->dir = from == me ? RS_SEG_SEND : to == me ? RS_SEG_RECV : RS_SEG_VIRTUAL;
  s->from = from;
  s->to = to;
  s->peer = s->dir == RS_SEG_SEND ? to : s->dir == RS_SEG_RECV ? from : -1;
}

static int32_t domain_of(const build_ctx *c, int32_t rank) { return c->rctx.domain ? c->rctx.domain[rank] : rank; }

/* A forward from -> to of what from received in segments dep .. dep+ndep-1. */
static reshard_result_t push_forward(build_ctx *c, rs_seg *s, int32_t from, int32_t to, size_t dep, size_t ndep) {
  route(s, c->plan->rank, from, to);
  s->origin = -1;
  s->level = domain_of(c, from) != domain_of(c, to) ? 1 : 2;
  s->dep = (int64_t)dep;
  s->ndep = (int32_t)ndep;
  s->fwd = s->dir == RS_SEG_SEND;
  return rs_seg_vec_push(&c->segs, s);
}

/* A relayed fragment D of this rank (a member of g). Each piece travels
 * source -> owner: this rank's receive when it owns the part, else a
 * virtual segment (forwards wait on its round). Forwards move each
 * (cell, owner) range whole, whichever holders provided it: owner -> the
 * members of its domain and the entries of the others, entry -> the
 * members of its domain (plan/relay.h); segments of other pairs on the
 * way to this rank are virtual. */
static reshard_result_t relay_receive(build_ctx *c, const rs_frag *D, const rs_relay_group *g, size_t es) {
  const int32_t me = c->plan->rank;
  const rs_tensor *t = &c->dst->tensors[D->tensor];
  int32_t gid = -1, box = -1;
  RS_CHECK(rs_relay_table_intern(&c->groups, g->ranks, g->m, &gid));
  RS_CHECK(add_box(c, D, &box));
  c->actx.parts = &c->parts;
  reshard_result_t r = rs_assign_pieces(&c->actx, &g->canon, c->dst2src[D->tensor], t->name, g->ranks, g->m, &c->pieces);
  c->actx.parts = NULL;
  RS_CHECK(r);
  RS_CHECK(rs_relay_roles(&c->rctx, g, me));
  size_t nparts = c->parts.n ? (size_t)c->parts.v[c->parts.n - 1].part + 1 : 0;
  if (4 * nparts > c->cap_part_segs) {
    free(c->part_segs);
    c->cap_part_segs = 8 * nparts;
    c->part_segs = malloc(c->cap_part_segs * sizeof *c->part_segs);
    if (!c->part_segs) {
      c->cap_part_segs = 0;
      return rs_error(RESHARD_ERROR_OUT_OF_MEMORY, "plan_create: out of memory (relay parts)");
    }
  }
  /* per range q: its source -> owner segments [ps[4q], ps[4q+1]) and its
   * owner -> entry segments [ps[4q+2], ps[4q+3]) */
  size_t *ps = c->part_segs;
  rs_seg s;
  for (size_t k = 0; k < c->pieces.n; k++) {
    const rs_piece *p = &c->pieces.v[k];
    const int32_t s_rank = p->src.rank, o = g->ranks[p->owner];
    make_seg(&s, RS_SEG_RECV, s_rank, o, D, p, es);
    relay_seg(&s, gid, box, k);
    route(&s, me, s_rank, o);
    s.origin = s_rank;
    if (k == 0 || p->part != c->pieces.v[k - 1].part) ps[4 * p->part] = c->segs.n;
    ps[4 * p->part + 1] = c->segs.n + 1;
    RS_CHECK(rs_seg_vec_push(&c->segs, &s));
  }
  const int32_t mine = domain_of(c, me);
  for (int pass = 0; pass < 2; pass++)
    for (size_t q = 0; q < c->parts.n; q++) {
      const rs_piece *p = &c->parts.v[q];
      const rs_relay_role *role = &c->rctx.roles[p->owner];
      const int32_t o = g->ranks[p->owner];
      const size_t *at = &ps[4 * p->part];
      int far = o != me && domain_of(c, o) != mine;
      make_seg(&s, RS_SEG_RECV, o, me, D, p, es);
      relay_seg(&s, gid, box, q);
      if (pass == 0 && !far) { /* from the owner in this domain, or mine */
        if (o != me) RS_CHECK(push_forward(c, &s, o, me, at[0], at[1] - at[0]));
        for (uint32_t i = 0; o == me && i < role->nchildren; i++)
          RS_CHECK(push_forward(c, &s, me, c->rctx.children[role->first_child + i], at[0], at[1] - at[0]));
      } else if (pass == 0) { /* the owner -> this domain's entry */
        int32_t entry = role->hop == 1 ? me : role->parent;
        if (q == 0 || p->part != c->parts.v[q - 1].part) ps[4 * p->part + 2] = c->segs.n;
        ps[4 * p->part + 3] = c->segs.n + 1;
        RS_CHECK(push_forward(c, &s, o, entry, at[0], at[1] - at[0]));
      } else if (far) { /* the entry -> the rest of this domain */
        if (role->hop == 2) RS_CHECK(push_forward(c, &s, role->parent, me, at[2], at[3] - at[2]));
        for (uint32_t i = 0; role->hop == 1 && i < role->nchildren; i++)
          RS_CHECK(push_forward(c, &s, me, c->rctx.children[role->first_child + i], at[2], at[3] - at[2]));
      }
    }
  return RESHARD_SUCCESS;
}

/* What this rank receives (and forwards, in relay plans), and its local
 * copies. */
static reshard_result_t plan_receives(build_ctx *c) {
  const int me = c->plan->rank;
  rs_frag_vec mine = {0};
  reshard_result_t r;
  RS_CHECK_GOTO(rs_layout_rank_fragments(c->dst, me, &mine), r, done);
  for (size_t i = 0; i < mine.n; i++) {
    const rs_frag *D = &mine.v[i];
    const rs_tensor *t = &c->dst->tensors[D->tensor];
    size_t es = reshard_dtype_size(t->dtype);
    rs_relay_group g = {0};
    if (c->relay) RS_CHECK_GOTO(rs_relay_group_of(&c->rctx, D, c->dst2src[D->tensor], es, &g), r, done);
    if (g.m) {
      RS_CHECK_GOTO(relay_receive(c, D, &g, es), r, done);
      continue;
    }
    RS_CHECK_GOTO(rs_assign_pieces(&c->actx, D, c->dst2src[D->tensor], t->name, NULL, 0, &c->pieces), r, done);
    for (size_t k = 0; k < c->pieces.n; k++) {
      const rs_piece *p = &c->pieces.v[k];
      if (p->src.rank == me) {
        rs_copy cp;
        rs_copy_init(&cp, D->ndim, p->extent, es, p->src.buffer, rs_frag_offset_of(&p->src, p->start, es), p->src.strides,
                     D->buffer, rs_frag_offset_of(D, p->start, es), D->strides);
        RS_CHECK_GOTO(push_local(c, &cp), r, done);
      } else {
        rs_seg s;
        make_seg(&s, RS_SEG_RECV, p->src.rank, me, D, p, es);
        RS_CHECK_GOTO(rs_seg_vec_push(&c->segs, &s), r, done);
      }
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

/* What this rank sends: the destination fragments that touch its source
 * fragments, in the receivers' canonical order, and the pieces of them
 * assigned to this rank. */
static reshard_result_t plan_sends(build_ctx *c) {
  const int me = c->plan->rank;
  rs_frag_vec mine = {0}, cands = {0};
  reshard_result_t r;
  RS_CHECK_GOTO(rs_layout_rank_fragments(c->src, me, &mine), r, done);
  for (size_t i = 0; i < mine.n; i++) {
    const rs_frag *S = &mine.v[i];
    size_t before = cands.n;
    RS_CHECK_GOTO(rs_layout_find_holders(c->dst, c->src2dst[S->tensor], S->start, S->extent, &cands), r, done);
    size_t w = before;
    for (size_t k = before; k < cands.n; k++)
      if (cands.v[k].rank != me) cands.v[w++] = cands.v[k];
    cands.n = w;
  }
  if (cands.n > 1) /* cands.v is NULL when empty: qsort(NULL, 0) is UB */
    qsort(cands.v, cands.n, sizeof *cands.v, cmp_frag_key);
  for (size_t i = 0; i < cands.n; i++) {
    if (i && !cmp_frag_key(&cands.v[i], &cands.v[i - 1])) continue;
    const rs_frag *D = &cands.v[i];
    const rs_tensor *t = &c->dst->tensors[D->tensor];
    size_t es = reshard_dtype_size(t->dtype);
    rs_relay_group g = {0};
    if (c->relay) RS_CHECK_GOTO(rs_relay_group_of(&c->rctx, D, c->dst2src[D->tensor], es, &g), r, done);
    /* Relayed: every member is a candidate; the group's lowest rank's
     * turn sends each owner the parts it owns (only the box matters). */
    if (g.m && D->rank != g.ranks[0]) continue;
    int32_t gid = -1, box = -1;
    if (g.m) RS_CHECK_GOTO(rs_relay_table_intern(&c->groups, g.ranks, g.m, &gid), r, done);
    if (g.m) RS_CHECK_GOTO(add_box(c, D, &box), r, done);
    RS_CHECK_GOTO(rs_assign_pieces(&c->actx, g.m ? &g.canon : D, c->dst2src[D->tensor], t->name, g.m ? g.ranks : NULL, g.m,
                                   &c->pieces),
                  r, done);
    for (size_t k = 0; k < c->pieces.n; k++) {
      const rs_piece *p = &c->pieces.v[k];
      if (p->src.rank != me) continue;
      rs_seg s;
      make_seg(&s, RS_SEG_SEND, me, g.m ? g.ranks[p->owner] : D->rank, &p->src, p, es);
      if (g.m) {
        relay_seg(&s, gid, box, k);
        s.origin = me;
      }
      RS_CHECK_GOTO(rs_seg_vec_push(&c->segs, &s), r, done);
    }
  }
done:
  rs_frag_vec_free(&mine);
  rs_frag_vec_free(&cands);
  return r;
}

typedef struct box_ref {
  struct relay_box b;
  int32_t id;
} box_ref;

static int cmp_box(const void *a, const void *b) {
  const struct relay_box *x = &((const box_ref *)a)->b, *y = &((const box_ref *)b)->b;
  if (x->tensor != y->tensor) return x->tensor < y->tensor ? -1 : 1;
  for (int d = 0; d < x->ndim; d++)
    if (x->start[d] != y->start[d]) return x->start[d] < y->start[d] ? -1 : 1;
  for (int d = 0; d < x->ndim; d++)
    if (x->extent[d] != y->extent[d]) return x->extent[d] < y->extent[d] ? -1 : 1;
  return 0;
}

/* Relay segments name their group and box by id; the chunker orders
 * streams by the group's ordinal and segments by the box's, which every
 * rank derives alike (the relative order of two groups or boxes is the
 * same on every rank that meets both). */
static reshard_result_t order_relay(build_ctx *c) {
  if (!c->groups.n) return RESHARD_SUCCESS;
  int32_t *ord;
  RS_CHECK(rs_relay_table_order(&c->groups, &ord));
  box_ref *refs = malloc((c->nboxes + 1) * sizeof *refs);
  int32_t *bord = malloc((c->nboxes + 1) * sizeof *bord);
  if (!refs || !bord) {
    free(ord);
    free(refs);
    free(bord);
    return rs_error(RESHARD_ERROR_OUT_OF_MEMORY, "plan_create: out of memory (relay boxes)");
  }
  for (size_t i = 0; i < c->nboxes; i++) refs[i] = (box_ref){c->boxes[i], (int32_t)i};
  if (c->nboxes > 1) qsort(refs, c->nboxes, sizeof *refs, cmp_box);
  for (size_t i = 0, n = 0; i < c->nboxes; i++) {
    if (i && cmp_box(&refs[i], &refs[i - 1])) n++;
    bord[refs[i].id] = (int32_t)n;
  }
  for (size_t i = 0; i < c->segs.n; i++)
    if (c->segs.v[i].group >= 0) {
      c->segs.v[i].group = ord[c->segs.v[i].group];
      c->segs.v[i].box = bord[c->segs.v[i].box];
    }
  free(ord);
  free(refs);
  free(bord);
  return RESHARD_SUCCESS;
}

static void mark_used(const rs_copy *c, size_t n, int src_side, unsigned char *seen) {
  for (size_t i = 0; i < n; i++) {
    int id = src_side ? c[i].src_buf : c[i].dst_buf;
    if (id >= 0) seen[id] = 1;
  }
}

/* Buffers the executor will dereference, with their sizes and names for
 * execute-time checks. Sends read source buffers, relay forwards
 * destination buffers; receives and local copies write destination
 * buffers. */
static reshard_result_t collect_used(const reshard_layout_t *L, const reshard_plan_t *p, int src_side,
                                     rs_used_buffer **out, int *nout) {
  unsigned char *seen = calloc((size_t)L->nbuffers + 1, 1);
  if (!seen) return rs_error(RESHARD_ERROR_OUT_OF_MEMORY, "plan_create: out of memory");
  for (size_t i = 0; i < p->nsends; i++)
    if ((p->sends[i].fwd ? 0 : 1) == src_side) mark_used(p->send_copies + p->sends[i].first_copy, p->sends[i].ncopies, 1, seen);
  if (!src_side) mark_used(p->recv_copies, p->nrecv_copies, 0, seen);
  mark_used(p->local_copies, p->nlocal_copies, src_side, seen);
  int n = 0;
  for (int id = 0; id < L->nbuffers; id++) n += seen[id];
  rs_used_buffer *u = calloc((size_t)n + 1, sizeof *u);
  if (!u) {
    free(seen);
    return rs_error(RESHARD_ERROR_OUT_OF_MEMORY, "plan_create: out of memory");
  }
  int k = 0;
  reshard_result_t r = RESHARD_SUCCESS;
  for (int id = 0; id < L->nbuffers && r == RESHARD_SUCCESS; id++) {
    if (!seen[id]) continue;
    u[k].id = id;
    r = rs_layout_buffer_bytes(L, id, p->rank, &u[k].bytes);
    u[k].name = strdup(L->buffers[id].name);
    if (!u[k].name && r == RESHARD_SUCCESS) r = rs_error(RESHARD_ERROR_OUT_OF_MEMORY, "plan_create: out of memory");
    k++;
  }
  free(seen);
  *out = u;
  *nout = k;
  return r;
}

static void fill_stats(reshard_plan_t *p) {
  reshard_plan_stats_t *s = &p->stats;
  memset(s, 0, sizeof *s);
  s->rank = p->rank;
  s->num_chunks = p->nrounds;
  s->chunk_bytes = p->chunk_bytes;
  s->staging_bytes = (size_t)(2 * (p->send_half + p->recv_half));
  s->send_messages = p->nsends;
  s->recv_messages = p->nrecvs;
  s->segments = p->nsend_copies + p->nrecv_copies + p->nlocal_copies;
  for (size_t i = 0; i < p->nlocal_copies; i++) s->local_copy_bytes += rs_copy_bytes(&p->local_copies[i]);
  size_t npeers = 0;
  for (size_t i = 0; i < p->npeers; i++) {
    const reshard_peer_stats_t *ps = &p->peers[i];
    s->send_bytes += ps->send_bytes;
    s->recv_bytes += ps->recv_bytes;
    s->num_send_peers += ps->send_messages > 0;
    s->num_recv_peers += ps->recv_messages > 0;
    npeers++;
  }
  (void)npeers;
}

static reshard_result_t peer_stats(reshard_plan_t *p) {
  int *slot = malloc((size_t)p->size * sizeof *slot);
  if (!slot) return rs_error(RESHARD_ERROR_OUT_OF_MEMORY, "plan_create: out of memory");
  for (int i = 0; i < p->size; i++) slot[i] = -1;
  size_t n = 0;
  for (size_t i = 0; i < p->nsends + p->nrecvs; i++) {
    int peer = i < p->nsends ? p->sends[i].peer : p->recvs[i - p->nsends].peer;
    if (slot[peer] < 0) slot[peer] = (int)n++;
  }
  p->peers = calloc(n + 1, sizeof *p->peers);
  if (!p->peers) {
    free(slot);
    return rs_error(RESHARD_ERROR_OUT_OF_MEMORY, "plan_create: out of memory");
  }
  /* sorted by peer */
  size_t k = 0;
  for (int peer = 0; peer < p->size; peer++)
    if (slot[peer] >= 0) {
      slot[peer] = (int)k;
      p->peers[k++].peer = peer;
    }
  for (size_t i = 0; i < p->nsends; i++) {
    reshard_peer_stats_t *ps = &p->peers[slot[p->sends[i].peer]];
    ps->send_bytes += p->sends[i].bytes;
    ps->send_messages++;
  }
  for (size_t i = 0; i < p->nrecvs; i++) {
    reshard_peer_stats_t *ps = &p->peers[slot[p->recvs[i].peer]];
    ps->recv_bytes += p->recvs[i].bytes;
    ps->recv_messages++;
  }
  p->npeers = n;
  free(slot);
  return RESHARD_SUCCESS;
}

static reshard_result_t finish_plan(reshard_plan_t *p, build_ctx *c,
                                    size_t chunk) {
  p->chunk_bytes = chunk;
  RS_CHECK(rs_chunk_plan(p, &c->segs, chunk));
  p->local_copies = c->locals;
  p->nlocal_copies = c->nlocals;
  c->locals = NULL;
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
  RS_CHECK(collect_used(c->src, p, 1, &p->src_used, &p->nsrc_used));
  RS_CHECK(collect_used(c->dst, p, 0, &p->dst_used, &p->ndst_used));
  RS_CHECK(peer_stats(p));
  fill_stats(p);
  return RESHARD_SUCCESS;
}

static void build_ctx_free(build_ctx *c) {
  free(c->dst2src);
  free(c->src2dst);
  rs_seg_vec_free(&c->segs);
  free(c->locals);
  rs_assign_ctx_free(&c->actx);
  rs_piece_vec_free(&c->pieces);
  rs_relay_ctx_free(&c->rctx);
  rs_relay_table_free(&c->groups);
  free(c->boxes);
  rs_piece_vec_free(&c->parts);
  free(c->part_segs);
}

enum { AGREE_DIGEST, AGREE_NOT_DIGEST, AGREE_ERROR, AGREE_PEERS, AGREE_N };

reshard_result_t reshard_plan_create(reshard_comm_t *comm,
                                     const reshard_layout_t *src,
                                     const reshard_layout_t *dst,
                                     const reshard_options_t *options,
                                     reshard_plan_t **out) {
  rs_error_clear();
  if (!comm) return rs_error(RESHARD_ERROR_INVALID_ARGUMENT, "plan_create: comm is NULL");
  if (out) *out = NULL;
  uint32_t plan_seq = comm->plans_created++;
  build_ctx c;
  memset(&c, 0, sizeof c);
  reshard_plan_t *p = calloc(1, sizeof *p);
  reshard_result_t local = RESHARD_SUCCESS;
  char local_msg[1024] = "";
  if (!p) {
    local = rs_error(RESHARD_ERROR_OUT_OF_MEMORY, "plan_create: out of memory");
  } else {
    p->comm = comm;
    p->rank = comm->rank;
    p->size = comm->size;
    local = read_options(options, &p->opts);
    if (!local) local = apply_params(&p->opts);
  }
  if (!local && (!src || !dst || !out))
    local = rs_error(RESHARD_ERROR_INVALID_ARGUMENT, "plan_create: %s is NULL", !src ? "src" : !dst ? "dst" : "plan");
  if (!local) {
    c.src = src;
    c.dst = dst;
    c.plan = p;
    c.actx.src = src;
    local = match_tensors(&c);
  }
  if (!local) {
    int ms = rs_layout_max_rank(src), md = rs_layout_max_rank(dst);
    if (ms >= comm->size || md >= comm->size)
      local = rs_error(RESHARD_ERROR_INVALID_ARGUMENT, "%s layout: rank %d is outside the communicator of %d ranks",
                       ms >= comm->size ? "source" : "destination", ms >= comm->size ? ms : md, comm->size);
  }
  if (!local) {
    local = rs_topology_resolve(&p->opts, &p->topo, &p->has_topo);
    /* the caller's string may not outlive the call */
    p->opts.topology = p->has_topo ? p->topo.name : NULL;
    if (!local && p->has_topo) local = rs_rank_map_build(&p->topo, src, dst, comm->size, &p->map);
  }
  if (!local) {
    /* Forwards read destination buffers, which only the host executor
     * can do today: device transports plan direct (NCCL relays are
     * future work). relay -1 (auto) plans direct until the cost model
     * chooses. */
    c.relay = p->opts.relay == 1 && !comm->ops->stream_ops;
    const int32_t *domain = p->has_topo ? p->map.domain : NULL;
    c.actx.domain = domain;
    c.rctx = (rs_relay_ctx){.src = src, .dst = dst, .domain = domain, .min_part_bytes = rs_relay_min_part_bytes};
  }
  if (!local) local = rs_layout_validate_rank(src, "source", comm->rank);
  if (!local) local = rs_layout_validate_rank(dst, "destination", comm->rank);
  if (!local) local = plan_receives(&c);
  if (!local) {
    c.rctx.memo = 1;
    local = plan_sends(&c);
  }
  if (!local) local = order_relay(&c);
  if (local) snprintf(local_msg, sizeof local_msg, "%s", reshard_last_error());

  /* Agreement. */
  uint64_t digest = 0;
  if (src && dst && p) {
    const char *topo = p->opts.topology ? p->opts.topology : "";
    uint64_t hdr[7] = {(uint64_t)comm->size, p->opts.staging_bytes, p->opts.chunk_bytes,
                       (uint64_t)(int64_t)p->opts.relay, p->opts.flags, rs_hash_bytes(topo, strlen(topo), 0x7090),
                       rs_relay_min_part_bytes};
    digest = rs_hash_bytes(hdr, sizeof hdr, 0x5eed);
    digest = rs_layout_digest(src, digest);
    digest = rs_layout_digest(dst, digest ^ 0xd57);
  }
  uint64_t v[AGREE_N] = {digest, ~digest, (uint64_t)local,
                         local ? 0 : (uint64_t)rs_count_streams(&c.segs)};
  int64_t timeout = p ? p->opts.timeout_ms : 60000;
  reshard_result_t r = comm->ops->allreduce_max_u64(comm, v, AGREE_N, rs_deadline_after_ms(timeout));
  if (r != RESHARD_SUCCESS) {
    rs_error_prefix("plan_create rank %d: agreement failed: ", comm->rank);
    goto fail;
  }
  if (local) {
    r = local;
    rs_error(local, "%s", local_msg);
    goto fail;
  }
  if (v[AGREE_DIGEST] != digest || ~v[AGREE_NOT_DIGEST] != digest) {
    r = rs_error(RESHARD_ERROR_MISMATCH,
                 "plan_create rank %d: ranks passed different layouts or options (digest %016llx, others range %016llx..%016llx)",
                 comm->rank, (unsigned long long)digest, (unsigned long long)~v[AGREE_NOT_DIGEST],
                 (unsigned long long)v[AGREE_DIGEST]);
    goto fail;
  }
  if (v[AGREE_ERROR]) {
    r = rs_error(RESHARD_ERROR_REMOTE, "plan_create rank %d: another rank failed with '%s'", comm->rank,
                 reshard_result_string((reshard_result_t)v[AGREE_ERROR]));
    goto fail;
  }
  /* Every rank's busiest round fits the budget: each of its streams (one
   * per peer in a direct plan) has at most one message per round, double
   * buffered. */
  uint64_t maxpeers = v[AGREE_PEERS] ? v[AGREE_PEERS] : 1;
  size_t chunk = (size_t)(p->opts.staging_bytes / (2 * maxpeers));
  if (p->opts.chunk_bytes && p->opts.chunk_bytes < chunk) chunk = p->opts.chunk_bytes;
  /* one message must stay countable in an int (MPI) */
  if (chunk > ((size_t)INT32_MAX & ~(size_t)63)) chunk = (size_t)INT32_MAX & ~(size_t)63;
  chunk &= ~(size_t)63;
  if (chunk < 64) chunk = 64;
  p->digest = digest;
  p->num_src_buffers = src->nbuffers;
  p->num_dst_buffers = dst->nbuffers;
  /* bits 32-47 of every tag name the plan, bits 48-63 the execute call,
   * bits 0-31 the round */
  p->tag_base = (uint64_t)(plan_seq & 0xffffu) << 32;
  r = finish_plan(p, &c, chunk);
  {
    /* Building the plan can still fail on one rank (memory): agree once
     * more, so that no rank keeps a plan its peers do not have. */
    char msg[1024];
    snprintf(msg, sizeof msg, "%s", reshard_last_error());
    uint64_t e = (uint64_t)r;
    reshard_result_t r2 = comm->ops->allreduce_max_u64(comm, &e, 1, rs_deadline_after_ms(p->opts.timeout_ms));
    if (r != RESHARD_SUCCESS) {
      rs_error(r, "%s", msg);
      goto fail;
    }
    if (r2 != RESHARD_SUCCESS) {
      r = r2;
      goto fail;
    }
    if (e) {
      r = rs_error(RESHARD_ERROR_REMOTE, "plan_create rank %d: another rank failed building its plan with '%s'", comm->rank,
                   reshard_result_string((reshard_result_t)e));
      goto fail;
    }
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

void reshard_plan_destroy(reshard_plan_t *p) {
  if (!p) return;
  if (p->device_free) p->device_free(p);
  free(p->sends);
  free(p->recvs);
  free(p->send_round);
  free(p->recv_round);
  free(p->send_copies);
  free(p->recv_copies);
  free(p->local_copies);
  for (int i = 0; i < p->nsrc_used; i++) free(p->src_used[i].name);
  for (int i = 0; i < p->ndst_used; i++) free(p->dst_used[i].name);
  free(p->src_used);
  free(p->dst_used);
  free(p->peers);
  free(p->staging_cache);
  rs_rank_map_free(&p->map);
  free(p);
}
