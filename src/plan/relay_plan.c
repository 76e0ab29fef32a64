/* Relay plan building: the segments relayed fragments add to a rank's
 * plan (see relay.h). */
#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"
#include "common/error.h"
#include "common/vec.h"
#include "plan/relay.h"

/* Remembers relayed fragment box D; *id names it in segments. */
static reshard_result_t add_box(rs_relay_plan *c, const rs_frag *D, int32_t *id) {
  if (RS_VEC_GROW(c->boxes, c->nboxes, c->cap_boxes))
    return rs_error(RESHARD_ERROR_OUT_OF_MEMORY, "plan_create: out of memory (relay boxes)");
  struct rs_relay_box *b = &c->boxes[c->nboxes];
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

static int32_t domain_of(const rs_relay_plan *c, int32_t rank) { return c->ctx.domain ? c->ctx.domain[rank] : rank; }

/* Whether g's members span more than one domain (rs_seg.pipe): the same
 * for every party, from the group alone. */
static int32_t spans_domains(const rs_relay_plan *c, const rs_relay_group *g) {
  for (int i = 1; i < g->m; i++)
    if (domain_of(c, g->ranks[i]) != domain_of(c, g->ranks[0])) return 1;
  return 0;
}

/* A forward from -> to of bytes dep_off .. dep_off + s->bytes of what
 * from received in segments dep .. dep+ndep-1. */
static reshard_result_t push_forward(rs_relay_plan *c, rs_seg_vec *segs, int32_t me, rs_seg *s, int32_t from, int32_t to,
                                     size_t dep, size_t ndep, uint64_t dep_off) {
  route(s, me, from, to);
  s->origin = -1;
  s->level = domain_of(c, from) != domain_of(c, to) ? 1 : 2;
  s->dep = (int64_t)dep;
  s->ndep = (int32_t)ndep;
  s->dep_off = dep_off;
  s->fwd = s->dir == RS_SEG_SEND;
  return rs_seg_vec_push(segs, s);
}

/* What a member and a source of g both start with: g interned (*gid), D
 * remembered (*box) and g's canonical box assigned to its parts' owners
 * (pieces; with parts, the parts' boxes too). */
static reshard_result_t start_group(rs_relay_plan *c, rs_assign_ctx *actx, rs_piece_vec *pieces, rs_piece_vec *parts,
                                    const rs_frag *D, const rs_relay_group *g, int src_tensor, const char *name,
                                    int32_t *gid, int32_t *box) {
  RS_CHECK(rs_relay_table_intern(&c->groups, g->ranks, g->m, gid));
  RS_CHECK(add_box(c, D, box));
  actx->parts = parts;
  reshard_result_t r = rs_assign_pieces(actx, &g->canon, src_tensor, name, rs_relay_owners(&c->ctx, g), g->nparts, pieces);
  actx->parts = NULL;
  return r;
}

/* A relayed fragment D of this rank (a member of g). Each piece travels
 * source -> owner: this rank's receive when it owns the part, else a
 * virtual segment (forwards wait on its round). Forwards move each
 * (cell, owner) range whole, whichever holders provided it: owner -> the
 * members of its domain and the entries of the others, entry -> the
 * members of its domain (plan/relay.h); segments of other pairs on the
 * way to this rank are virtual. */
reshard_result_t rs_relay_plan_member(rs_relay_plan *c, rs_assign_ctx *actx,
                                      rs_piece_vec *pieces, rs_seg_vec *segs,
                                      int32_t me, const rs_frag *D,
                                      const rs_relay_group *g, int src_tensor,
                                      const char *name, reshard_dtype_t dt) {
  int32_t gid = -1, box = -1;
  RS_CHECK(start_group(c, actx, pieces, &c->parts, D, g, src_tensor, name, &gid, &box));
  RS_CHECK(rs_relay_roles(&c->ctx, g, me));
  const int32_t pipe = spans_domains(c, g);
  size_t nparts = c->parts.n ? (size_t)c->parts.v[c->parts.n - 1].part + 1 : 0;
  if (4 * nparts > c->cap_part_segs) {
    free(c->part_segs);
    c->cap_part_segs = 8 * nparts;
    c->part_segs = rs_malloc(c->cap_part_segs * sizeof *c->part_segs);
    if (!c->part_segs) {
      c->cap_part_segs = 0;
      return rs_error(RESHARD_ERROR_OUT_OF_MEMORY, "plan_create: out of memory (relay parts)");
    }
  }
  /* per range q: its source -> owner segments [ps[4q], ps[4q+1]) and its
   * owner -> entry segments [ps[4q+2], ps[4q+3]) */
  size_t *ps = c->part_segs;
  rs_seg s;
  for (size_t k = 0; k < pieces->n; k++) {
    const rs_piece *p = &pieces->v[k];
    const int32_t s_rank = p->src.rank, o = rs_relay_owner(g, p->owner);
    rs_seg_init(&s, RS_SEG_RECV, s_rank, o, D, p, dt, dt);
    relay_seg(&s, gid, box, k);
    route(&s, me, s_rank, o);
    s.origin = s_rank;
    s.pipe = pipe;
    if (k == 0 || p->part != pieces->v[k - 1].part) ps[4 * p->part] = segs->n;
    ps[4 * p->part + 1] = segs->n + 1;
    RS_CHECK(rs_seg_vec_push(segs, &s));
  }
  const int32_t mine = domain_of(c, me);
  for (int pass = 0; pass < 2; pass++)
    for (size_t q = 0, off = 0; q < c->parts.n; q++) {
      const rs_piece *p = &c->parts.v[q];
      const rs_relay_role *role = &c->ctx.roles[p->owner];
      const int32_t o = rs_relay_owner(g, p->owner);
      const size_t *at = &ps[4 * p->part];
      int far = o != me && domain_of(c, o) != mine;
      rs_seg_init(&s, RS_SEG_RECV, o, me, D, p, dt, dt);
      relay_seg(&s, gid, box, q);
      /* where this box of the part starts in the part's bytes: a part's
       * boxes are consecutive, in row-major order, as its pieces are */
      if (q && p->part != c->parts.v[q - 1].part) off = 0;
      const uint64_t dep_off = off;
      off += s.bytes;
      if (pass == 0 && !far) { /* from the owner in this domain, or mine */
        if (o != me) RS_CHECK(push_forward(c, segs, me, &s, o, me, at[0], at[1] - at[0], dep_off));
        for (uint32_t i = 0; o == me && i < role->nchildren; i++)
          RS_CHECK(push_forward(c, segs, me, &s, me, c->ctx.children[role->first_child + i], at[0], at[1] - at[0], dep_off));
      } else if (pass == 0) { /* the owner -> this domain's entry */
        int32_t entry = role->hop == 1 ? me : role->parent;
        if (q == 0 || p->part != c->parts.v[q - 1].part) ps[4 * p->part + 2] = segs->n;
        ps[4 * p->part + 3] = segs->n + 1;
        RS_CHECK(push_forward(c, segs, me, &s, o, entry, at[0], at[1] - at[0], dep_off));
      } else if (far) { /* the entry -> the rest of this domain */
        if (role->hop == 2) RS_CHECK(push_forward(c, segs, me, &s, role->parent, me, at[2], at[3] - at[2], dep_off));
        for (uint32_t i = 0; role->hop == 1 && i < role->nchildren; i++)
          RS_CHECK(push_forward(c, segs, me, &s, me, c->ctx.children[role->first_child + i], at[2], at[3] - at[2], dep_off));
      }
    }
  return RESHARD_SUCCESS;
}


reshard_result_t rs_relay_plan_source(rs_relay_plan *c, rs_assign_ctx *actx,
                                      rs_piece_vec *pieces, rs_seg_vec *segs,
                                      int32_t me, const rs_frag *D,
                                      const rs_relay_group *g, int src_tensor,
                                      const char *name, reshard_dtype_t dt) {
  int32_t gid = -1, box = -1;
  RS_CHECK(start_group(c, actx, pieces, NULL, D, g, src_tensor, name, &gid, &box));
  const int32_t pipe = spans_domains(c, g);
  for (size_t k = 0; k < pieces->n; k++) {
    const rs_piece *p = &pieces->v[k];
    if (p->src.rank != me) continue;
    rs_seg s;
    rs_seg_init(&s, RS_SEG_SEND, me, rs_relay_owner(g, p->owner), &p->src, p, dt, dt);
    s.vtensor = D->tensor;
    relay_seg(&s, gid, box, k);
    s.origin = me;
    s.pipe = pipe;
    RS_CHECK(rs_seg_vec_push(segs, &s));
  }
  return RESHARD_SUCCESS;
}

typedef struct box_ref {
  struct rs_relay_box b;
  int32_t id;
} box_ref;

static int cmp_box(const void *a, const void *b) {
  const struct rs_relay_box *x = &((const box_ref *)a)->b, *y = &((const box_ref *)b)->b;
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
reshard_result_t rs_relay_plan_order(rs_relay_plan *c, rs_seg_vec *segs) {
  if (!c->groups.n) return RESHARD_SUCCESS;
  int32_t *ord;
  RS_CHECK(rs_relay_table_order(&c->groups, &ord));
  box_ref *refs = rs_malloc((c->nboxes + 1) * sizeof *refs);
  int32_t *bord = rs_malloc((c->nboxes + 1) * sizeof *bord);
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
  for (size_t i = 0; i < segs->n; i++)
    if (segs->v[i].group >= 0) {
      segs->v[i].group = ord[segs->v[i].group];
      segs->v[i].box = bord[segs->v[i].box];
    }
  rs_seg_vec_changed(segs);
  free(ord);
  free(refs);
  free(bord);
  return RESHARD_SUCCESS;
}


void rs_relay_plan_free(rs_relay_plan *c) {
  rs_relay_ctx_free(&c->ctx);
  rs_relay_table_free(&c->groups);
  free(c->boxes);
  rs_piece_vec_free(&c->parts);
  free(c->part_segs);
  memset(c, 0, sizeof *c);
}

