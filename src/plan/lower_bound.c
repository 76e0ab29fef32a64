/* T_lower (lower_bound.h): every rank's fragments of both sides, grouped
 * by tensor, cut into cells by all their boundaries; each cell's holders
 * are visited once. Cost: O(fragments x cells each covers), which is the
 * number of (fragment, cell) incidences, plus sorting. */
#include "plan/lower_bound.h"
#include "plan/quant.h"

#include <stdlib.h>
#include <string.h>

#include "common/error.h"
#include "common/sorted.h"
#include "common/vec.h"
#include "layout/layout.h"
#include "pack/convert.h"
#include "plan/cost.h"

/* One fragment, reduced to what counting needs. */
typedef struct lb_frag {
  int32_t tensor; /* source-side id */
  int32_t rank;
  int32_t side; /* 0 source, 1 destination */
  int64_t start[RESHARD_MAX_DIMS];
  int64_t extent[RESHARD_MAX_DIMS];
} lb_frag;

typedef struct lb_ctx {
  const reshard_layout_t *src, *dst;
  rs_volume *v;
  lb_frag *f;
  size_t nf, capf;
  /* stamps: the last cell that touched a rank or a domain */
  uint64_t *src_stamp, *dst_stamp, *dom_src_stamp, *dom_need_stamp;
  uint64_t cell_id;
  /* per tensor scratch */
  int64_t *bounds;
  size_t bounds_cap;
  uint32_t *count; /* ncells + 1 */
  /* per source tensor: its element size on the wire (the narrower of the
   * two sides' dtypes, src/pack/convert.h) */
  uint32_t *wire_es;
  int32_t *entries;
  size_t cells_cap, entries_cap;
} lb_ctx;

void rs_volume_free(rs_volume *v) {
  if (!v) return;
  free(v->in);
  free(v->only);
  free(v->domain_in);
  free(v->domain_out);
  free(v->node_in);
  free(v->domain_ranks);
  rs_rank_map_free(&v->map);
  memset(v, 0, sizeof *v);
}

static int cmp_lb(const void *a, const void *b) {
  const lb_frag *x = a, *y = b;
  if (x->tensor != y->tensor) return (x->tensor > y->tensor) - (x->tensor < y->tensor);
  if (x->side != y->side) return x->side - y->side;
  return (x->rank > y->rank) - (x->rank < y->rank);
}

static reshard_result_t collect(lb_ctx *c, const reshard_layout_t *L, int side, const int *to_src) {
  rs_frag_vec tmp = {0};
  reshard_result_t r = RESHARD_SUCCESS;
  for (int rank = 0; rank < c->v->nranks && !r; rank++) {
    tmp.n = 0;
    r = rs_layout_rank_fragments(L, rank, &tmp);
    for (size_t i = 0; i < tmp.n && !r; i++) {
      if (RS_VEC_GROW(c->f, c->nf, c->capf)) {
        r = rs_error(RESHARD_ERROR_OUT_OF_MEMORY, "lower_bound: out of memory (%zu fragments)", c->nf);
        break;
      }
      lb_frag *f = &c->f[c->nf++];
      memset(f, 0, sizeof *f);
      f->tensor = to_src ? to_src[tmp.v[i].tensor] : tmp.v[i].tensor;
      f->rank = rank;
      f->side = side;
      memcpy(f->start, tmp.v[i].start, sizeof f->start);
      memcpy(f->extent, tmp.v[i].extent, sizeof f->extent);
      if (!side && (c->v->root < 0 || rank < c->v->root)) c->v->root = rank;
    }
  }
  rs_frag_vec_free(&tmp);
  return r;
}

/* Visits every cell of the sub-grid [lo, hi) (per dim) of a grid with
 * `dims` cells per dim, calling back with the cell's index. */
#define FOR_CELLS(nd, lo, hi, dims, cell, body)                     \
  do {                                                              \
    size_t idx_[RESHARD_MAX_DIMS];                                  \
    for (int d_ = 0; d_ < (nd); d_++) idx_[d_] = (lo)[d_];          \
    for (;;) {                                                      \
      size_t cell = 0;                                              \
      for (int d_ = 0; d_ < (nd); d_++) cell = cell * (dims)[d_] + idx_[d_]; \
      body;                                                         \
      int d_ = (nd) - 1;                                            \
      while (d_ >= 0 && ++idx_[d_] == (hi)[d_]) idx_[d_] = (lo)[d_], d_--; \
      if (d_ < 0) break;                                            \
    }                                                               \
  } while (0)

static reshard_result_t tensor_cells(lb_ctx *c, const rs_tensor *t, uint64_t es, const lb_frag *F, size_t nf) {
  rs_volume *v = c->v;
  const int nd = t->ndim;
  size_t per = 2 * nf;
  if (c->bounds_cap < per * (size_t)(nd ? nd : 1)) {
    free(c->bounds);
    c->bounds_cap = per * (size_t)(nd ? nd : 1);
    c->bounds = malloc(c->bounds_cap * sizeof *c->bounds);
    if (!c->bounds) {
      c->bounds_cap = 0;
      return rs_error(RESHARD_ERROR_OUT_OF_MEMORY, "lower_bound: out of memory (tensor '%s')", t->name);
    }
  }
  size_t nb[RESHARD_MAX_DIMS], dims[RESHARD_MAX_DIMS];
  size_t ncells = 1;
  for (int d = 0; d < nd; d++) {
    int64_t *b = c->bounds + (size_t)d * per;
    for (size_t i = 0; i < nf; i++) {
      b[2 * i] = F[i].start[d];
      b[2 * i + 1] = F[i].start[d] + F[i].extent[d];
    }
    if (nf) qsort(b, 2 * nf, sizeof *b, rs_cmp_i64);
    size_t u = 0;
    for (size_t i = 0; i < 2 * nf; i++)
      if (!u || b[i] != b[u - 1]) b[u++] = b[i];
    nb[d] = u;
    dims[d] = u - 1;
    if (dims[d] && ncells > ((size_t)1 << 40) / dims[d])
      return rs_error(RESHARD_ERROR_UNSUPPORTED, "lower_bound: tensor '%s' cuts into too many cells", t->name);
    ncells *= dims[d];
  }
  /* holders per cell, compressed rows: count, prefix, fill */
  size_t lo[RESHARD_MAX_DIMS], hi[RESHARD_MAX_DIMS];
  if (c->cells_cap < ncells + 1) {
    free(c->count);
    c->cells_cap = ncells + 1;
    c->count = malloc(c->cells_cap * sizeof *c->count);
    if (!c->count) {
      c->cells_cap = 0;
      return rs_error(RESHARD_ERROR_OUT_OF_MEMORY, "lower_bound: out of memory (tensor '%s': %zu cells)", t->name, ncells);
    }
  }
  memset(c->count, 0, (ncells + 1) * sizeof *c->count);
  size_t total = 0;
  for (int pass = 0; pass < 2; pass++) {
    for (size_t i = 0; i < nf; i++) {
      for (int d = 0; d < nd; d++) {
        const int64_t *b = c->bounds + (size_t)d * per;
        lo[d] = rs_lower_bound_i64(b, nb[d], F[i].start[d]);
        hi[d] = rs_lower_bound_i64(b, nb[d], F[i].start[d] + F[i].extent[d]);
      }
      int32_t code = F[i].rank * 2 + F[i].side;
      if (pass == 0) FOR_CELLS(nd, lo, hi, dims, cell, c->count[cell + 1]++);
      else FOR_CELLS(nd, lo, hi, dims, cell, c->entries[c->count[cell]++] = code);
    }
    if (pass == 0) {
      for (size_t k = 0; k < ncells; k++) c->count[k + 1] += c->count[k];
      total = c->count[ncells];
      if (c->entries_cap < total + 1) {
        free(c->entries);
        c->entries_cap = total + 1;
        c->entries = malloc(c->entries_cap * sizeof *c->entries);
        if (!c->entries) {
          c->entries_cap = 0;
          return rs_error(RESHARD_ERROR_OUT_OF_MEMORY, "lower_bound: out of memory (tensor '%s')", t->name);
        }
      }
      /* count[k] is row k's start; the fill advances it to the row's end */
    }
  }
  /* count[k] is now the end of row k (the start of row k+1) */
  const int32_t *dom = v->map.domain, *nodes = v->map.node;
  size_t begin = 0;
  int64_t ext[RESHARD_MAX_DIMS];
  size_t idx[RESHARD_MAX_DIMS] = {0};
  for (size_t k = 0; k < ncells; k++) {
    if (k) { /* odometer in step with k */
      int d = nd - 1;
      while (d >= 0 && ++idx[d] == dims[d]) idx[d--] = 0;
    }
    size_t end = c->count[k];
    if (end == begin) continue;
    uint64_t bytes = es;
    for (int d = 0; d < nd; d++) {
      const int64_t *b = c->bounds + (size_t)d * per;
      ext[d] = b[idx[d] + 1] - b[idx[d]];
      bytes *= (uint64_t)ext[d];
    }
    uint64_t id = ++c->cell_id;
    int nsrc = 0, sole = -1, any_dst = 0, any_need = 0, net = 0, other_needs = 0, hole_rank = -1;
    int sdom = -1, multi_dom = 0, leaves = 0; /* the holders' one domain, if one; needed outside it */
    for (size_t e = begin; e < end; e++) {
      int code = c->entries[e], r = code / 2;
      if ((code & 1) || c->src_stamp[r] == id) continue;
      c->src_stamp[r] = id;
      c->dom_src_stamp[dom[r]] = id;
      nsrc++;
      sole = r;
      if (sdom < 0) sdom = dom[r];
      else if (dom[r] != sdom) multi_dom = 1;
    }
    for (size_t e = begin; e < end; e++) {
      int code = c->entries[e], r = code / 2;
      if (!(code & 1) || c->dst_stamp[r] == id) continue;
      c->dst_stamp[r] = id;
      any_dst = 1;
      if (r != sole || nsrc != 1) other_needs = 1;
      if (c->src_stamp[r] == id) continue;
      any_need = 1;
      hole_rank = r;
      if (dom[r] != sdom) leaves = 1;
      v->in[r] += bytes;
      v->node_in[nodes[r]] += bytes;
      if (c->dom_src_stamp[dom[r]] != id && c->dom_need_stamp[dom[r]] != id) {
        c->dom_need_stamp[dom[r]] = id;
        v->domain_in[dom[r]] += bytes;
        net = 1;
      }
    }
    begin = end;
    if (any_need && !nsrc)
      return rs_error(RESHARD_ERROR_INVALID_ARGUMENT, "tensor '%s' rank %d: destination elements are held by no source rank",
                      t->name, hole_rank);
    if (any_need) v->unique += bytes;
    if (net) v->unique_net += bytes;
    if (nsrc == 1 && other_needs) v->only[sole] += bytes;
    if (sdom >= 0 && !multi_dom && leaves) v->domain_out[sdom] += bytes;
    if (any_dst) {
      v->total += bytes;
      if (v->root >= 0 && c->src_stamp[v->root] == id) v->root_holds += bytes;
      if (v->root >= 0 && c->dom_src_stamp[dom[v->root]] == id) v->root_domain_holds += bytes;
    }
  }
  return RESHARD_SUCCESS;
}

static reshard_result_t match(const reshard_layout_t *src, const reshard_layout_t *dst, int *to_src,
                              uint32_t *wire_es) {
  for (int i = 0; i < src->ntensors; i++) wire_es[i] = (uint32_t)reshard_dtype_size(src->tensors[i].dtype);
  for (int i = 0; i < dst->ntensors; i++) {
    const rs_tensor *dt = &dst->tensors[i];
    int s;
    if (reshard_layout_find_tensor(src, dt->name, &s) != RESHARD_SUCCESS)
      return rs_error(RESHARD_ERROR_INVALID_ARGUMENT, "lower_bound: tensor '%s': in the destination layout but not in the source layout",
                      dt->name);
    const rs_tensor *st = &src->tensors[s];
    int same = (st->dtype == dt->dtype || (rs_cvt_float_dtype(st->dtype) && rs_cvt_float_dtype(dt->dtype))) &&
               st->ndim == dt->ndim;
    for (int d = 0; same && d < dt->ndim; d++) same = st->shape[d] == dt->shape[d];
    if (!same)
      return rs_error(RESHARD_ERROR_INVALID_ARGUMENT, "lower_bound: tensor '%s': dtype or shape differ between the sides", dt->name);
    to_src[i] = s;
    if (st->dtype != dt->dtype) wire_es[s] = (uint32_t)reshard_dtype_size((reshard_dtype_t)rs_cvt_wire_dtype(st->dtype, dt->dtype));
  }
  return RESHARD_SUCCESS;
}

static reshard_result_t volume_compute(const reshard_layout_t *src, const reshard_layout_t *dst, int nranks,
                                   const rs_topology *topo, rs_volume *v) {
  memset(v, 0, sizeof *v);
  v->root = -1;
  v->nranks = nranks;
  v->topo = *topo;
  if (nranks < 1) return rs_error(RESHARD_ERROR_INVALID_ARGUMENT, "lower_bound: nranks %d < 1", nranks);
  int ms = rs_layout_max_rank(src), md = rs_layout_max_rank(dst);
  if (ms >= nranks || md >= nranks)
    return rs_error(RESHARD_ERROR_INVALID_ARGUMENT, "lower_bound: %s layout: rank %d is outside the %d ranks",
                    ms >= nranks ? "source" : "destination", ms >= nranks ? ms : md, nranks);
  RS_CHECK(rs_rank_map_build(topo, src, dst, nranks, &v->map));
  size_t n = (size_t)nranks, ndom = (size_t)v->map.ndomains, nnod = (size_t)v->map.nnodes;
  lb_ctx c;
  memset(&c, 0, sizeof c);
  c.v = v;
  int *to_src = malloc(((size_t)dst->ntensors + 1) * sizeof *to_src);
  c.wire_es = malloc(((size_t)src->ntensors + 1) * sizeof *c.wire_es);
  v->in = calloc(n, sizeof *v->in);
  v->only = calloc(n, sizeof *v->only);
  v->domain_in = calloc(ndom + 1, sizeof *v->domain_in);
  v->domain_out = calloc(ndom + 1, sizeof *v->domain_out);
  v->node_in = calloc(nnod + 1, sizeof *v->node_in);
  v->domain_ranks = calloc(ndom + 1, sizeof *v->domain_ranks);
  c.src_stamp = calloc(n, sizeof *c.src_stamp);
  c.dst_stamp = calloc(n, sizeof *c.dst_stamp);
  c.dom_src_stamp = calloc(ndom + 1, sizeof *c.dom_src_stamp);
  c.dom_need_stamp = calloc(ndom + 1, sizeof *c.dom_need_stamp);
  reshard_result_t r = RESHARD_SUCCESS;
  if (!to_src || !c.wire_es || !v->in || !v->only || !v->domain_in || !v->domain_out || !v->node_in || !v->domain_ranks || !c.src_stamp || !c.dst_stamp ||
      !c.dom_src_stamp || !c.dom_need_stamp)
    r = rs_error(RESHARD_ERROR_OUT_OF_MEMORY, "lower_bound: out of memory (%d ranks)", nranks);
  if (!r) r = match(src, dst, to_src, c.wire_es);
  if (!r) r = collect(&c, src, 0, NULL);
  if (!r) r = collect(&c, dst, 1, to_src);
  if (!r) {
    for (int q = 0; q < nranks; q++) v->domain_ranks[v->map.domain[q]]++;
    /* source ranks: those with a source fragment */
    unsigned char *seen = calloc(n, 1);
    if (!seen) r = rs_error(RESHARD_ERROR_OUT_OF_MEMORY, "lower_bound: out of memory");
    for (size_t i = 0; seen && i < c.nf; i++)
      if (!c.f[i].side && !seen[c.f[i].rank]) seen[c.f[i].rank] = 1, v->nsrc_ranks++;
    free(seen);
  }
  if (!r && c.nf > 1) qsort(c.f, c.nf, sizeof *c.f, cmp_lb);
  for (size_t i = 0; !r && i < c.nf;) {
    size_t j = i;
    while (j < c.nf && c.f[j].tensor == c.f[i].tensor) j++;
    r = tensor_cells(&c, &src->tensors[c.f[i].tensor], c.wire_es[c.f[i].tensor], c.f + i, j - i);
    i = j;
  }
  free(to_src);
  free(c.wire_es);
  free(c.f);
  free(c.src_stamp);
  free(c.dst_stamp);
  free(c.dom_src_stamp);
  free(c.dom_need_stamp);
  free(c.bounds);
  free(c.count);
  free(c.entries);
  if (r) rs_volume_free(v);
  return r;
}

double rs_volume_fastest_link(const rs_volume *v, int rank) {
  double nic = rs_topology_rank_nic_bw(&v->topo);
  double nvl = v->domain_ranks[v->map.domain[rank]] > 1 ? v->topo.nvlink_bw : 0;
  return nic > nvl ? nic : nvl;
}

double rs_volume_domain_cut(const rs_volume *v, int *where) {
  const double nic = rs_topology_rank_nic_bw(&v->topo);
  double best = 0;
  *where = -1;
  for (int d = 0; d < v->map.ndomains && nic > 0; d++) {
    double s = (double)v->domain_out[d] / (nic * v->domain_ranks[d]);
    if (v->domain_out[d] && s > best) {
      best = s;
      *where = d;
    }
  }
  return best;
}

/* term = bytes / bw, keeping the largest and where it is */
static void term(reshard_estimate_t *e, reshard_bound_t kind, uint64_t bytes, double bw, int where) {
  if (!bytes || !(bw > 0)) return;
  double s = (double)bytes / bw;
  if (s > e->bound_seconds[kind]) e->bound_seconds[kind] = s;
  else return;
  if (s > e->seconds) {
    e->seconds = s;
    e->bound = kind;
    e->bound_where = where;
  }
}

void rs_lower_bound_of(const rs_volume *v, reshard_estimate_t *out) {
  reshard_estimate_t e = RESHARD_ESTIMATE_INITIALIZER;
  const double nic = rs_topology_rank_nic_bw(&v->topo);
  term(&e, RESHARD_BOUND_SOURCE_EGRESS, v->unique_net, nic * v->nsrc_ranks, -1);
  for (int d = 0; d < v->map.ndomains; d++) term(&e, RESHARD_BOUND_DOMAIN_INGRESS, v->domain_in[d], nic * v->domain_ranks[d], d);
  for (int r = 0; r < v->nranks; r++) {
    double f = rs_volume_fastest_link(v, r);
    term(&e, RESHARD_BOUND_RANK_INGRESS, v->in[r], f, r);
    term(&e, RESHARD_BOUND_SOLE_HOLDER, v->only[r], f, r);
  }
  if (v->topo.node_copy_bw > 0)
    for (int q = 0; q < v->map.nnodes; q++) term(&e, RESHARD_BOUND_NODE_MEMORY, v->node_in[q], v->topo.node_copy_bw, q);
  e.bytes = v->unique;
  *out = e;
}

reshard_result_t reshard_lower_bound(const reshard_layout_t *src, const reshard_layout_t *dst, int nranks,
                                     const char *topology, reshard_estimate_t *out) {
  rs_error_clear();
  RS_CHECK(rs_estimate_check(out, "lower_bound"));
  if (!src || !dst) return rs_error(RESHARD_ERROR_INVALID_ARGUMENT, "lower_bound: %s is NULL", !src ? "src" : "dst");
  if (!topology || !*topology || !strcmp(topology, "none"))
    return rs_error(RESHARD_ERROR_INVALID_ARGUMENT, "lower_bound: topology is %s: name a preset (%s)",
                    topology ? "\"none\"" : "NULL", rs_topology_preset_names());
  rs_topology t;
  RS_CHECK(rs_topology_preset(topology, &t));
  rs_volume v;
  RS_CHECK(rs_volume_compute(src, dst, nranks, &t, &v));
  reshard_estimate_t e;
  rs_lower_bound_of(&v, &e);
  rs_volume_free(&v);
  rs_estimate_store(out, &e);
  return RESHARD_SUCCESS;
}

reshard_result_t rs_volume_compute(const reshard_layout_t *src, const reshard_layout_t *dst, int nranks,
                                   const rs_topology *t, rs_volume *out) {
  /* a destination that quantizes to fp8 blocks: the volume of moving the
   * codes and scales from every replica that can quantize them (the
   * gathering of blocks split across source ranks only adds to it) */
  rs_quant_layouts ql;
  RS_CHECK(rs_quant_layouts_make(src, dst, nranks, -1, &ql));
  reshard_result_t r = volume_compute(ql.src ? ql.src : src, ql.src ? ql.dst : dst, nranks, t, out);
  rs_quant_layouts_free(&ql);
  return r;
}
