#include "support/random_layout.h"

#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "support/harness.h"

#define RL_MAX_T 4
#define RL_MAX_W 8
#define RL_MAX_TDIM 4
#define RL_MAX_AXES 3
#define RL_MAX_MESHES 3
/* Elements per tensor: keeps the per-seed work small. */
#define RL_MAX_ELEMS 8192

typedef struct rl_tensor {
  char name[32];
  reshard_dtype_t dtype;  /* on the source side */
  reshard_dtype_t ddtype; /* on the destination side (RL_CASTS), else dtype */
  int ndim;
  int64_t shape[RL_MAX_TDIM];
} rl_tensor;

typedef struct gen {
  uint64_t s;
  rl_pair *p;
  int nt;
  rl_tensor t[RL_MAX_T];
  int tid[RL_MAX_T]; /* tensor ids (identical on both sides) */
  /* tensors 0 and 1 fusable along pair_cd (-1: not fusable); groupable
   * into pair_groups > 1 groups when that is > 1 */
  int pair_cd, pair_groups;
  int nbuf;
} gen;

typedef struct side {
  reshard_layout_t *L;
  const char *tag;
  int is_dst;
  int ranks[RL_MAX_W], n;
  int nmesh;
  int mesh_id[RL_MAX_MESHES];
  int naxes[RL_MAX_MESHES];
  int shape[RL_MAX_MESHES][RL_MAX_AXES];
} side;

/* ---- helpers ---- */

static int rnd(gen *g, int lo, int hi) { return (int)th_rand_range(&g->s, lo, hi); }
static int chance(gen *g, int pct) { return rnd(g, 0, 99) < pct; }

static void logf_(rl_pair *p, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void logf_(rl_pair *p, const char *fmt, ...) {
  char line[512];
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(line, sizeof line, fmt, ap);
  va_end(ap);
  if (n < 0) return;
  if ((size_t)n >= sizeof line) n = (int)sizeof line - 1;
  if (p->log_len + (size_t)n + 2 > p->log_cap) {
    size_t cap = p->log_cap ? p->log_cap * 2 : 4096;
    while (cap < p->log_len + (size_t)n + 2) cap *= 2;
    char *q = realloc(p->log, cap);
    if (!q) return;
    p->log = q;
    p->log_cap = cap;
  }
  memcpy(p->log + p->log_len, line, (size_t)n);
  p->log_len += (size_t)n;
  p->log[p->log_len++] = '\n';
  p->log[p->log_len] = 0;
}

/* Appends "[a, b, c]" to buf. */
static void fmt_i64s(char *buf, size_t cap, const int64_t *v, int n) {
  size_t u = strlen(buf);
  u += (size_t)snprintf(buf + u, cap - u, "[");
  for (int i = 0; i < n && u < cap; i++) u += (size_t)snprintf(buf + u, cap - u, "%s%lld", i ? ", " : "", (long long)v[i]);
  if (u < cap) snprintf(buf + u, cap - u, "]");
}

static void fmt_ints(char *buf, size_t cap, const int *v, int n) {
  int64_t w[RL_MAX_W * RL_MAX_W];
  for (int i = 0; i < n; i++) w[i] = v[i];
  fmt_i64s(buf, cap, w, n);
}

static void fmt_placements(char *buf, size_t cap, const reshard_placement_t *pl, int naxes, const int *mshape) {
  size_t u = strlen(buf);
  u += (size_t)snprintf(buf + u, cap - u, "(");
  for (int a = 0; a < naxes && u < cap; a++) {
    if (a) u += (size_t)snprintf(buf + u, cap - u, ", ");
    if (u >= cap) break;
    if (pl[a].kind == RESHARD_PLACEMENT_REPLICATE) {
      u += (size_t)snprintf(buf + u, cap - u, "R");
    } else {
      u += (size_t)snprintf(buf + u, cap - u, "S(%d)", pl[a].dim);
      if (pl[a].split_sizes && u < cap) {
        fmt_i64s(buf, cap, pl[a].split_sizes, mshape[a]);
        u = strlen(buf);
      }
    }
  }
  if (u < cap) snprintf(buf + u, cap - u, ")");
}

#define RL_TRY(p, call, what)                                                                  \
  do {                                                                                         \
    reshard_result_t rl_r_ = (call);                                                           \
    if (rl_r_ != RESHARD_SUCCESS) {                                                            \
      fprintf(stderr, "random_layout: %s failed: %s: %s\n", (what), reshard_result_string(rl_r_), \
              reshard_last_error());                                                           \
      return -1;                                                                               \
    }                                                                                          \
  } while (0)

/* ---- rank sets ---- */

static int cmp_int(const void *a, const void *b) {
  int x = *(const int *)a, y = *(const int *)b;
  return (x > y) - (x < y);
}

static void shuffle(gen *g, int *v, int n) {
  for (int i = n - 1; i > 0; i--) {
    int j = rnd(g, 0, i);
    int t = v[i];
    v[i] = v[j];
    v[j] = t;
  }
}

/* A non-empty subset of [0, W): contiguous, an arithmetic progression or
 * random. */
static int pick_subset(gen *g, int W, int *out) {
  int kind = rnd(g, 0, 9);
  if (kind < 4) {
    int n = rnd(g, 1, W), a;
    if (chance(g, 50)) n = rnd(g, n, W); /* bias towards larger sides */
    a = rnd(g, 0, W - n);
    for (int i = 0; i < n; i++) out[i] = a + i;
    return n;
  }
  if (kind < 6 && W >= 3) {
    int stride = rnd(g, 2, 3);
    int a = rnd(g, 0, W - 1);
    int n = 0;
    for (int r = a; r < W; r += stride) out[n++] = r;
    return n;
  }
  int n = 0;
  for (int r = 0; r < W; r++)
    if (chance(g, 50)) out[n++] = r;
  if (!n) out[n++] = rnd(g, 0, W - 1);
  return n;
}

/* ---- tensors ---- */

static int64_t elems(const rl_tensor *t) {
  int64_t e = 1;
  for (int d = 0; d < t->ndim; d++) e *= t->shape[d];
  return e;
}

static void shrink(rl_tensor *t) {
  while (elems(t) > RL_MAX_ELEMS) {
    int big = 0;
    for (int d = 1; d < t->ndim; d++)
      if (t->shape[d] > t->shape[big]) big = d;
    t->shape[big] = (t->shape[big] + 1) / 2;
  }
}

static reshard_dtype_t same_size_dtype(gen *g, reshard_dtype_t d0) {
  reshard_dtype_t c[RESHARD_NUM_DTYPES];
  int n = 0;
  for (int d = 0; d < RESHARD_NUM_DTYPES; d++)
    if (reshard_dtype_size((reshard_dtype_t)d) == reshard_dtype_size(d0)) c[n++] = (reshard_dtype_t)d;
  return c[rnd(g, 0, n - 1)];
}

static const reshard_dtype_t FLOATS[] = {RESHARD_FP32, RESHARD_BF16, RESHARD_FP16, RESHARD_FP8_E4M3, RESHARD_FP8_E5M2};

/* A float dtype of the given size (0: any). */
static reshard_dtype_t float_of_size(gen *g, size_t size) {
  reshard_dtype_t c[5];
  int n = 0;
  for (int i = 0; i < 5; i++)
    if (!size || reshard_dtype_size(FLOATS[i]) == size) c[n++] = FLOATS[i];
  return c[rnd(g, 0, n - 1)];
}

static void gen_tensors(gen *g, int casts) {
  g->nt = rnd(g, 1, RL_MAX_T);
  g->pair_cd = -1;
  g->pair_groups = 1;
  for (int i = 0; i < g->nt; i++) {
    rl_tensor *t = &g->t[i];
    snprintf(t->name, sizeof t->name, "layers.%d.w%d", rnd(g, 0, 99), i);
    t->dtype = (reshard_dtype_t)rnd(g, 0, RESHARD_NUM_DTYPES - 1);
    t->ndim = rnd(g, 0, RL_MAX_TDIM);
    for (int d = 0; d < t->ndim; d++) t->shape[d] = chance(g, 4) ? 0 : rnd(g, chance(g, 50) ? 1 : 6, 12);
    shrink(t);
  }
  /* Make tensors 0 and 1 fusable: same ndim >= 1, same element size,
   * equal extents off the concat dim. */
  if (g->nt >= 2 && chance(g, 45)) {
    rl_tensor *a = &g->t[0], *b = &g->t[1];
    if (a->ndim == 0) {
      a->ndim = rnd(g, 1, RL_MAX_TDIM);
      for (int d = 0; d < a->ndim; d++) a->shape[d] = rnd(g, 1, 12);
    }
    int cd = rnd(g, 0, a->ndim - 1);
    b->ndim = a->ndim;
    b->dtype = same_size_dtype(g, a->dtype);
    for (int d = 0; d < a->ndim; d++) b->shape[d] = a->shape[d];
    b->shape[cd] = chance(g, 7) ? 0 : rnd(g, 1, 12);
    if (chance(g, 40)) { /* groupable: both cd extents multiples of G */
      int G = rnd(g, 2, 4);
      a->shape[cd] = G * rnd(g, 1, 3);
      b->shape[cd] = G * rnd(g, 1, 3);
      g->pair_groups = G;
    }
    /* shrink off the concat dim only, identically */
    for (;;) {
      int64_t ea = elems(a), eb = elems(b);
      if (ea <= RL_MAX_ELEMS && eb <= RL_MAX_ELEMS) break;
      int big = -1;
      for (int d = 0; d < a->ndim; d++)
        if (d != cd && (big < 0 || a->shape[d] > a->shape[big])) big = d;
      if (big < 0 || a->shape[big] <= 1) break;
      a->shape[big] = b->shape[big] = (a->shape[big] + 1) / 2;
    }
    g->pair_cd = cd;
  }
  for (int i = 0; i < g->nt; i++) g->t[i].ddtype = g->t[i].dtype;
  if (casts) /* floats, mostly converted; a fused pair keeps one size per side */
    for (int i = 0; i < g->nt; i++) {
      rl_tensor *t = &g->t[i];
      int partner = i == 1 && g->pair_cd >= 0;
      t->dtype = float_of_size(g, partner ? reshard_dtype_size(g->t[0].dtype) : 0);
      t->ddtype = chance(g, 20) && !partner ? t->dtype
                                           : float_of_size(g, partner ? reshard_dtype_size(g->t[0].ddtype) : 0);
    }
  for (int i = 0; i < g->nt; i++) {
    if (g->t[i].ndim == 0) g->p->features |= RL_F_SCALAR;
    if (elems(&g->t[i]) == 0) g->p->features |= RL_F_EMPTY_TENSOR;
  }
}

static int add_tensors(gen *g, side *s) {
  for (int i = 0; i < g->nt; i++) {
    rl_tensor *t = &g->t[i];
    char buf[128] = "";
    fmt_i64s(buf, sizeof buf, t->shape, t->ndim);
    reshard_dtype_t dt = s->is_dst ? t->ddtype : t->dtype;
    logf_(g->p, "%s: tensor %d '%s' %s %s", s->tag, i, t->name, reshard_dtype_name(dt), buf);
    RL_TRY(g->p, reshard_layout_add_tensor(s->L, t->name, dt, t->ndim, t->shape, &g->tid[i]), "add_tensor");
  }
  return 0;
}

/* ---- meshes ---- */

static int add_mesh(gen *g, side *s, int use_all) {
  int naxes = rnd(g, 1, RL_MAX_AXES);
  int total = use_all || chance(g, 60) ? s->n : rnd(g, 1, s->n);
  int shape[RL_MAX_AXES] = {1, 1, 1};
  int rem = total;
  for (int a = 0; a < naxes - 1; a++) {
    int div[RL_MAX_W], nd = 0;
    for (int k = 1; k <= rem; k++)
      if (rem % k == 0) div[nd++] = k;
    shape[a] = div[rnd(g, 0, nd - 1)];
    rem /= shape[a];
  }
  shape[naxes - 1] = rem;
  shuffle(g, shape, naxes);
  int m = s->nmesh++;
  s->naxes[m] = naxes;
  memcpy(s->shape[m], shape, sizeof shape);
  char sb[64] = "";
  fmt_ints(sb, sizeof sb, shape, naxes);
  if (chance(g, 35)) { /* strided, if the side has such a progression */
    for (int tries = 0; tries < 8; tries++) {
      int stride = total == 1 ? 1 : rnd(g, 1, 3);
      int start = s->ranks[rnd(g, 0, s->n - 1)];
      int ok = 1;
      for (int i = 0; i < total && ok; i++) {
        int r = start + i * stride, in = 0;
        for (int j = 0; j < s->n; j++) in |= s->ranks[j] == r;
        ok = in;
      }
      if (!ok) continue;
      logf_(g->p, "%s: mesh %d shape %s strided start %d stride %d", s->tag, m, sb, start, stride);
      RL_TRY(g->p, reshard_layout_add_mesh_strided(s->L, naxes, shape, start, stride, &s->mesh_id[m]), "add_mesh_strided");
      g->p->features |= RL_F_STRIDED_MESH;
      return 0;
    }
  }
  int pool[RL_MAX_W];
  memcpy(pool, s->ranks, sizeof(int) * (size_t)s->n);
  if (total < s->n || chance(g, 50)) shuffle(g, pool, s->n);
  char rb[64] = "";
  fmt_ints(rb, sizeof rb, pool, total);
  logf_(g->p, "%s: mesh %d shape %s ranks %s", s->tag, m, sb, rb);
  RL_TRY(g->p, reshard_layout_add_mesh(s->L, naxes, shape, pool, &s->mesh_id[m]), "add_mesh");
  return 0;
}

/* ---- placements ---- */

/* The extent of each dim as the axes so far left it, when it is the same
 * on every rank (-1 otherwise): split sizes must sum to it. */
typedef struct ext_track {
  int64_t u[RL_MAX_TDIM];
  int sharded[RL_MAX_TDIM];
} ext_track;

static void random_sizes(gen *g, int64_t total, int k, int64_t *out) {
  for (int i = 0; i < k; i++) out[i] = 0;
  if (chance(g, 30)) { /* everything on one rank, the others empty */
    out[rnd(g, 0, k - 1)] = total;
    return;
  }
  for (int64_t i = 0; i < total; i++) out[rnd(g, 0, k - 1)]++;
}

/* One axis' placement sharding dim d (or a free choice when d < 0) with
 * the extents tracked in x. sizes: storage for split sizes. */
static reshard_placement_t gen_shard(gen *g, ext_track *x, int d, int k, int64_t *sizes) {
  reshard_placement_t pl = reshard_shard(d);
  if (x->u[d] >= 0 && chance(g, 40)) {
    random_sizes(g, x->u[d], k, sizes);
    pl.split_sizes = sizes;
    int uni = 1;
    for (int i = 1; i < k; i++) uni &= sizes[i] == sizes[0];
    x->u[d] = uni ? sizes[0] : -1;
  } else {
    x->u[d] = x->u[d] >= 0 && x->u[d] % k == 0 ? x->u[d] / k : -1;
  }
  if (x->sharded[d]) g->p->features |= RL_F_SAME_DIM;
  if (pl.split_sizes) g->p->features |= RL_F_SPLIT_SIZES;
  x->sharded[d] = 1;
  return pl;
}

static void gen_placements(gen *g, int ndim, const int64_t *root, int naxes, const int *mshape,
                           reshard_placement_t *pl, int64_t (*sizes)[RL_MAX_W], int all_replicate) {
  ext_track x;
  memset(&x, 0, sizeof x);
  for (int d = 0; d < ndim; d++) x.u[d] = root[d];
  int last = -1;
  for (int a = 0; a < naxes; a++) {
    if (all_replicate || ndim == 0 || chance(g, 30)) {
      pl[a] = reshard_replicate();
      continue;
    }
    int d = last >= 0 && chance(g, 40) ? last : rnd(g, 0, ndim - 1);
    pl[a] = gen_shard(g, &x, d, mshape[a], sizes[a]);
    last = d;
  }
}

static int replicates(const reshard_placement_t *pl, int naxes, const int *mshape) {
  for (int a = 0; a < naxes; a++)
    if (pl[a].kind == RESHARD_PLACEMENT_REPLICATE && mshape[a] > 1) return 1;
  return 0;
}

static void log_part(gen *g, side *s, const char *what, int b, int t, int m, const reshard_placement_t *pl,
                     const int64_t *padded) {
  char buf[400] = "";
  fmt_placements(buf, sizeof buf, pl, s->naxes[m], s->shape[m]);
  if (padded) {
    size_t u = strlen(buf);
    snprintf(buf + u, sizeof buf - u, " padded ");
    fmt_i64s(buf, sizeof buf, padded, g->t[t].ndim);
  }
  logf_(g->p, "%s: buffer %d %s tensor %d mesh %d %s", s->tag, b, what, t, m, buf);
}

/* Places tensor t alone on a random mesh, sometimes with a padded shape. */
static int place_one(gen *g, side *s, int t, int all_replicate) {
  int m = rnd(g, 0, s->nmesh - 1);
  const rl_tensor *T = &g->t[t];
  int64_t padded[RL_MAX_TDIM];
  int pad = T->ndim > 0 && !all_replicate && chance(g, 20);
  for (int d = 0; d < T->ndim; d++) padded[d] = T->shape[d] + (pad && chance(g, 60) ? rnd(g, 1, 5) : 0);
  reshard_placement_t pl[RL_MAX_AXES];
  int64_t sizes[RL_MAX_AXES][RL_MAX_W];
  gen_placements(g, T->ndim, padded, s->naxes[m], s->shape[m], pl, sizes, all_replicate);
  if (replicates(pl, s->naxes[m], s->shape[m]) && s->L == g->p->src) g->p->features |= RL_F_SRC_REPLICAS;
  int b = g->nbuf++;
  char name[48];
  snprintf(name, sizeof name, "%s.buf%d", s->tag, b);
  log_part(g, s, pad ? "fused(1 part)" : "place", b, t, m, pl, pad ? padded : NULL);
  if (pad) {
    g->p->features |= RL_F_PADDED;
    reshard_part_t part = {g->tid[t], s->mesh_id[m], pl, padded};
    RL_TRY(g->p, reshard_layout_add_fused(s->L, name, 0, 1, 1, &part, NULL), "add_fused (padded)");
  } else {
    RL_TRY(g->p, reshard_layout_place(s->L, g->tid[t], s->mesh_id[m], pl, NULL), "place");
  }
  return 0;
}

/* Tensors 0 and 1 in one buffer: concatenated along pair_cd, or grouped. */
static int place_pair(gen *g, side *s, int all_replicate) {
  const rl_tensor *A = &g->t[0], *B = &g->t[1];
  const int cd = g->pair_cd, nd = A->ndim;
  /* a grouped buffer holds a tensor as one fragment per group: not in
   * full-replica sources, whose ranks hold each tensor as one fragment */
  const int grouped = g->pair_groups > 1 && !all_replicate && chance(g, 50);
  const int G = grouped ? g->pair_groups : 1;
  int m = rnd(g, 0, s->nmesh - 1);
  const int naxes = s->naxes[m];
  const int *msh = s->shape[m];
  int64_t pa[RL_MAX_TDIM], pb[RL_MAX_TDIM];
  int pad = !all_replicate && chance(g, 25);
  for (int d = 0; d < nd; d++) {
    int extra = pad && chance(g, 50) && !(grouped && d == cd) ? rnd(g, 1, 4) : 0;
    pa[d] = A->shape[d] + extra;
    pb[d] = B->shape[d] + (d == cd ? (grouped ? 0 : pad && chance(g, 50) ? rnd(g, 1, 4) : 0) : extra);
  }
  int64_t ra[RL_MAX_TDIM], rb[RL_MAX_TDIM]; /* root boxes the axes split */
  memcpy(ra, pa, sizeof ra);
  memcpy(rb, pb, sizeof rb);
  if (grouped) ra[cd] = rb[cd] = G;
  reshard_placement_t pla[RL_MAX_AXES], plb[RL_MAX_AXES];
  int64_t sa[RL_MAX_AXES][RL_MAX_W], sb[RL_MAX_AXES][RL_MAX_W];
  gen_placements(g, nd, ra, naxes, msh, pla, sa, all_replicate);
  if (grouped) {
    /* grouped parts must hold the same groups: identical placements */
    memcpy(plb, pla, sizeof plb);
  } else {
    /* Off the concat dim the local extents must match: copy those axes;
     * along it each part splits its own extent freely. */
    ext_track x;
    memset(&x, 0, sizeof x);
    x.u[cd] = rb[cd];
    for (int a = 0; a < naxes; a++) {
      if (pla[a].kind == RESHARD_PLACEMENT_SHARD && pla[a].dim != cd) {
        plb[a] = pla[a];
      } else if (all_replicate || chance(g, 40)) {
        plb[a] = reshard_replicate();
      } else {
        plb[a] = gen_shard(g, &x, cd, msh[a], sb[a]);
      }
    }
  }
  if (s->L == g->p->src && (replicates(pla, naxes, msh) || replicates(plb, naxes, msh)))
    g->p->features |= RL_F_SRC_REPLICAS;
  int b = g->nbuf++;
  char name[48];
  snprintf(name, sizeof name, "%s.fused%d", s->tag, b);
  char what[64];
  snprintf(what, sizeof what, "fused(concat_dim %d, groups %d) part 0:", cd, G);
  log_part(g, s, what, b, 0, m, pla, pad ? pa : NULL);
  log_part(g, s, "            part 1:", b, 1, m, plb, pad ? pb : NULL);
  reshard_part_t parts[2] = {{g->tid[0], s->mesh_id[m], pla, pad ? pa : NULL},
                             {g->tid[1], s->mesh_id[m], plb, pad ? pb : NULL}};
  RL_TRY(g->p, reshard_layout_add_fused(s->L, name, cd, G, 2, parts, NULL), "add_fused");
  g->p->features |= grouped ? RL_F_GROUPED : RL_F_FUSED;
  if (pad) g->p->features |= RL_F_PADDED;
  return 0;
}

/* Tensor t in 1..3 windows along dim 0, one buffer concatenated along
 * dim 0, on one mesh with the same placements (a shard of dim 0 even, so
 * that each window splits its own rows): the windows cut [0, rows) in
 * consecutive ranges (some empty), the last one sometimes reaching past
 * the end (padding); sometimes a range is left out. */
static int place_windows(gen *g, side *s) {
  int cand[RL_MAX_T], nc = 0;
  for (int i = 0; i < g->nt; i++)
    if (g->t[i].ndim > 0 && g->t[i].shape[0] > 0) cand[nc++] = i;
  if (!nc) return 0;
  const int t = cand[rnd(g, 0, nc - 1)];
  const rl_tensor *T = &g->t[t];
  const int k = rnd(g, 1, 3), m = rnd(g, 0, s->nmesh - 1);
  int64_t rows[3], org[3][RL_MAX_TDIM], win[3][RL_MAX_TDIM];
  random_sizes(g, T->shape[0], k, rows);
  int64_t root[RL_MAX_TDIM];
  for (int d = 0; d < T->ndim; d++) root[d] = T->shape[d];
  root[0] = -1; /* windows differ in rows: no split sizes on dim 0 */
  reshard_placement_t pl[RL_MAX_AXES];
  int64_t sizes[RL_MAX_AXES][RL_MAX_W];
  gen_placements(g, T->ndim, root, s->naxes[m], s->shape[m], pl, sizes, 0);
  for (int a = 0; a < s->naxes[m]; a++)
    if (pl[a].kind == RESHARD_PLACEMENT_SHARD && pl[a].dim == 0) pl[a].split_sizes = NULL;
  reshard_part_t parts[3];
  const int64_t *origins[3];
  int np = 0;
  int64_t at = 0;
  const int skip = k > 1 && chance(g, 30) ? rnd(g, 0, k - 1) : -1;
  for (int j = 0; j < k; j++) {
    if (j != skip) {
      for (int d = 0; d < T->ndim; d++) {
        org[np][d] = 0;
        win[np][d] = T->shape[d];
      }
      org[np][0] = at;
      win[np][0] = rows[j] + (j == k - 1 && chance(g, 30) ? rnd(g, 1, 3) : 0);
      if (win[np][0] > rows[j]) g->p->features |= RL_F_PADDED;
      parts[np] = (reshard_part_t){g->tid[t], s->mesh_id[m], pl, win[np]};
      origins[np] = org[np];
      np++;
    }
    at += rows[j];
  }
  int b = g->nbuf++;
  char name[48], buf[400] = "", o[64], w[64];
  snprintf(name, sizeof name, "%s.windows%d", s->tag, b);
  fmt_placements(buf, sizeof buf, pl, s->naxes[m], s->shape[m]);
  logf_(g->p, "%s: buffer %d windows(concat_dim 0) of tensor %d mesh %d %s:", s->tag, b, t, m, buf);
  for (int j = 0; j < np; j++) {
    o[0] = w[0] = 0;
    fmt_i64s(o, sizeof o, org[j], T->ndim);
    fmt_i64s(w, sizeof w, win[j], T->ndim);
    logf_(g->p, "    window %d origin %s shape %s", j, o, w);
  }
  RL_TRY(g->p, reshard_layout_add_windows(s->L, name, 0, np, parts, origins, NULL), "add_windows");
  if (s->L == g->p->src && replicates(pl, s->naxes[m], s->shape[m])) g->p->features |= RL_F_SRC_REPLICAS;
  g->p->features |= RL_F_WINDOWS;
  return 0;
}

/* A raw buffer on one rank of the side with 1..2 explicit fragments:
 * random boxes, dims in a random memory order, padded rows, sometimes a
 * reversed dim (negative stride), gaps (some of them not element-aligned). */
static int add_raw(gen *g, side *s) {
  int cand[RL_MAX_T], nc = 0;
  for (int i = 0; i < g->nt; i++)
    if (elems(&g->t[i]) > 0) cand[nc++] = i;
  if (!nc) return 0;
  int rank = s->ranks[rnd(g, 0, s->n - 1)];
  int nf = rnd(g, 1, 2);
  int64_t start[2][RL_MAX_TDIM], extent[2][RL_MAX_TDIM], strides[2][RL_MAX_TDIM];
  int ft[2];
  size_t off[2], cur = 0;
  for (int f = 0; f < nf; f++) {
    const rl_tensor *T = &g->t[ft[f] = cand[rnd(g, 0, nc - 1)]];
    size_t es = reshard_dtype_size(s->is_dst ? T->ddtype : T->dtype);
    int order[RL_MAX_TDIM];
    for (int d = 0; d < T->ndim; d++) {
      start[f][d] = rnd(g, 0, (int)T->shape[d] - 1);
      extent[f][d] = rnd(g, 1, (int)(T->shape[d] - start[f][d]));
      order[d] = d;
    }
    if (chance(g, 50)) shuffle(g, order, T->ndim);
    int64_t st = 1, span = 1, back = 0; /* back: elements before the box's first one */
    for (int i = T->ndim - 1; i >= 0; i--) { /* order[ndim-1] is fastest */
      int d = order[i];
      strides[f][d] = st;
      st *= extent[f][d] + (chance(g, 40) ? rnd(g, 1, 2) : 0);
      span += (extent[f][d] - 1) * strides[f][d];
      if (extent[f][d] > 1 && chance(g, 10)) { /* a reversed dim */
        back += (extent[f][d] - 1) * strides[f][d];
        strides[f][d] = -strides[f][d];
      }
    }
    off[f] = cur + (size_t)(chance(g, 20) ? rnd(g, 1, 7) : rnd(g, 0, 2) * (int)es) + (size_t)back * es;
    cur = off[f] - (size_t)back * es + (size_t)span * es;
  }
  size_t bytes = cur + (size_t)rnd(g, 0, 9);
  int b = g->nbuf++;
  char name[48];
  snprintf(name, sizeof name, "%s.raw%d", s->tag, b);
  logf_(g->p, "%s: buffer %d raw on rank %d, %zu bytes", s->tag, b, rank, bytes);
  int bid;
  RL_TRY(g->p, reshard_layout_add_buffer(s->L, name, rank, bytes, &bid), "add_buffer");
  for (int f = 0; f < nf; f++) {
    const rl_tensor *T = &g->t[ft[f]];
    char buf[256] = "start ";
    fmt_i64s(buf, sizeof buf, start[f], T->ndim);
    strncat(buf, " extent ", sizeof buf - strlen(buf) - 1);
    fmt_i64s(buf, sizeof buf, extent[f], T->ndim);
    strncat(buf, " strides ", sizeof buf - strlen(buf) - 1);
    fmt_i64s(buf, sizeof buf, strides[f], T->ndim);
    logf_(g->p, "%s:   fragment tensor %d %s byte_offset %zu", s->tag, ft[f], buf, off[f]);
    reshard_fragment_t fr = {g->tid[ft[f]], bid, start[f], extent[f], off[f], strides[f]};
    RL_TRY(g->p, reshard_layout_add_fragment(s->L, &fr), "add_fragment");
  }
  g->p->features |= RL_F_RAW;
  if (s->L == g->p->src) g->p->features |= RL_F_SRC_REPLICAS;
  return 0;
}

/* ---- sides ---- */

static int build_side(gen *g, side *s, int is_src, int full_replicas) {
  char rb[64] = "";
  fmt_ints(rb, sizeof rb, s->ranks, s->n);
  logf_(g->p, "%s: side ranks %s", s->tag, rb);
  g->nbuf = 0; /* buffer ids count per layout */
  if (add_tensors(g, s)) return -1;
  int nmesh = full_replicas ? 1 : rnd(g, 1, RL_MAX_MESHES);
  for (int i = 0; i < nmesh; i++)
    if (add_mesh(g, s, full_replicas)) return -1;
  int fuse = g->pair_cd >= 0 && chance(g, 65);
  for (int t = fuse ? 2 : 0; t < g->nt; t++) {
    if (!is_src && chance(g, 6)) {
      logf_(g->p, "%s: tensor %d not placed (allow_partial)", s->tag, t);
      RL_TRY(g->p, reshard_layout_allow_partial(s->L, g->tid[t]), "allow_partial");
      continue;
    }
    if (place_one(g, s, t, full_replicas)) return -1;
  }
  if (fuse && place_pair(g, s, full_replicas)) return -1;
  if (full_replicas) return 0;
  /* a second copy of one tensor, elsewhere (or on the same ranks) */
  if (chance(g, 15)) {
    int t = rnd(g, 0, g->nt - 1);
    if (place_one(g, s, t, 0)) return -1;
    if (is_src) g->p->features |= RL_F_SRC_REPLICAS;
  }
  if (chance(g, 15) && place_windows(g, s)) return -1;
  if (chance(g, 20) && add_raw(g, s)) return -1;
  return 0;
}

int rl_pair_make(uint64_t seed, rl_mode mode, rl_pair *out) {
  memset(out, 0, sizeof *out);
  gen g;
  memset(&g, 0, sizeof g);
  g.p = out;
  g.s = (seed ^ 0x9E3779B97F4A7C15ULL) * 0xD6E8FEB86659FD93ULL;
  if (!g.s) g.s = 1;
  for (int i = 0; i < 4; i++) th_rand(&g.s);
  logf_(out, "seed %llu mode %s", (unsigned long long)seed,
        mode == RL_FULL_REPLICAS ? "full-replicas" : mode == RL_CASTS ? "casts" : "any");

  side S = {.tag = "src"}, D = {.tag = "dst", .is_dst = 1};
  int W;
  if (mode == RL_FULL_REPLICAS) {
    W = rnd(&g, 3, RL_MAX_W);
    int perm[RL_MAX_W];
    for (int i = 0; i < W; i++) perm[i] = i;
    if (chance(&g, 50)) shuffle(&g, perm, W);
    int k = rnd(&g, 2, W - 1);
    S.n = k;
    memcpy(S.ranks, perm, sizeof(int) * (size_t)k);
    D.n = rnd(&g, 1, W - k);
    memcpy(D.ranks, perm + k, sizeof(int) * (size_t)D.n);
    out->full_replicas = k;
  } else {
    W = chance(&g, 50) ? rnd(&g, 4, RL_MAX_W) : rnd(&g, 1, RL_MAX_W);
    int rel = W == 1 ? 0 : rnd(&g, 0, 2);
    if (rel == 0) { /* identical sides: everything colocated */
      S.n = pick_subset(&g, W, S.ranks);
      D.n = S.n;
      memcpy(D.ranks, S.ranks, sizeof S.ranks);
    } else if (rel == 1) { /* independent subsets: often overlapping */
      S.n = pick_subset(&g, W, S.ranks);
      D.n = pick_subset(&g, W, D.ranks);
    } else { /* disjoint */
      int perm[RL_MAX_W];
      for (int i = 0; i < W; i++) perm[i] = i;
      if (chance(&g, 50)) shuffle(&g, perm, W);
      S.n = rnd(&g, 1, W - 1);
      D.n = rnd(&g, 1, W - S.n);
      memcpy(S.ranks, perm, sizeof(int) * (size_t)S.n);
      memcpy(D.ranks, perm + S.n, sizeof(int) * (size_t)D.n);
    }
  }
  qsort(S.ranks, (size_t)S.n, sizeof(int), cmp_int);
  qsort(D.ranks, (size_t)D.n, sizeof(int), cmp_int);
  out->nranks = W;
  int shared = 0;
  for (int i = 0; i < S.n; i++)
    for (int j = 0; j < D.n; j++) shared |= S.ranks[i] == D.ranks[j];
  out->features |= shared ? RL_F_COLOCATED : RL_F_DISJOINT;
  logf_(out, "world %d ranks", W);

  gen_tensors(&g, mode == RL_CASTS);
  if (reshard_layout_create(&out->src) || reshard_layout_create(&out->dst)) {
    fprintf(stderr, "random_layout: layout_create failed\n");
    rl_pair_free(out);
    return -1;
  }
  S.L = out->src;
  D.L = out->dst;
  if (build_side(&g, &S, 1, mode == RL_FULL_REPLICAS) || build_side(&g, &D, 0, 0)) {
    fprintf(stderr, "random_layout: seed %llu: the generator made an invalid call; calls so far:\n%s",
            (unsigned long long)seed, out->log ? out->log : "");
    rl_pair_free(out);
    return -1;
  }
  return 0;
}

void rl_pair_free(rl_pair *p) {
  reshard_layout_destroy(p->src);
  reshard_layout_destroy(p->dst);
  free(p->log);
  memset(p, 0, sizeof *p);
}

void rl_pair_print(const rl_pair *p, FILE *out) {
  fputs(p->log ? p->log : "(no layout calls)\n", out);
}

const char *rl_feature_name(int i) {
  static const char *names[RL_F_NUM] = {"colocated", "disjoint",   "fused",         "grouped",
                                        "padded",    "split_sizes", "same_dim",     "raw",
                                        "src_replicas", "strided_mesh", "empty_tensor", "scalar",
                                        "windows"};
  return i >= 0 && i < RL_F_NUM ? names[i] : "?";
}
