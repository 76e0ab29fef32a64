/* FP8 block quantization in flight (issue 19, item 2): a destination weight
 * declared with reshard_layout_add_tensor_blocked, whose source is bf16,
 * f16 or f32, arrives as fp8e4m3 codes plus f32 block scales.
 *
 * Every destination element is checked against a reference computed here
 * from global coordinates: the source values come from a function of
 * (tensor, element) written in this file, each block's amax is taken over
 * those values, and the codes and scales come from the self-test's
 * reference quantizer (src/selftest/ref_cast.c rs_ref_quant_e4m3, written
 * in double arithmetic apart from the library's integer casts). Bytes of
 * destination buffers outside fragments must keep their sentinel; other
 * tensors of the layouts move as usual and are checked as usual.
 *
 * The values put every kind of block in play: ordinary blocks with
 * magnitudes varying from block to block, all-zero blocks, blocks of
 * subnormals only (amax below 1e-4: clamped), blocks whose amax is a
 * power of two (products land on e4m3 rounding ties), blocks with a NaN
 * (everything NaN) and with an infinity (factor 0: codes 0, and NaN where
 * the infinity is).
 *
 * random_layouts: seeded random pairs (shapes, block sizes, ragged last
 * blocks, stacked leading dims, meshes with replicas, uneven splits so
 * that blocks span source ranks and must be gathered, colocated ranks,
 * relays, small staging); RS_QUANT_SEED=<n> replays one seed verbosely.
 * fixed_cases: a Megatron-like aligned TP split (no gathering), a split
 * through the middle of blocks (gathering), f32 and f16 sources.
 * wire_bytes: the wire carries one byte per element plus the scales.
 * estimate_gathering: reshard_plan_estimate prices the gathering pre-plan
 * (its time before the main plan's), as reshard_plan reports it.
 * bad_layouts: what cannot be quantized fails creation on every rank with
 * a specific code and message, and the declaration API refuses bad
 * arguments without changing the layout. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "plan/plan.h"
#include "plan/quant.h"
#include "reshard.h"
#include "reshard_models.h"
#include "reshard_selftest.h"
#include "selftest/ref_cast.h"
#include "support/harness.h"

/* ---------------- the test's own source values ---------------- */

static uint64_t mix64(uint64_t x) {
  x ^= x >> 31;
  x *= 0x7fb5d329728ea185ULL;
  x ^= x >> 27;
  x *= 0x81dadef4bc2dd44dULL;
  x ^= x >> 33;
  return x;
}

static uint64_t name_seed(const char *s, uint64_t step) {
  uint64_t h = 1469598103934665603ULL ^ step;
  while (*s) h = (h ^ (unsigned char)*s++) * 1099511628211ULL;
  return mix64(h);
}

/* The value (as a double holding an f32-representable number) of element
 * (lead, i, j) of a weight with blocks b0 x b1, at step. The block's kind
 * and scale come from its block coordinates, the element from its own. */
static double weight_value(uint64_t seed, int64_t lead, int64_t i, int64_t j, int64_t b0, int64_t b1,
                           reshard_dtype_t dt) {
  const uint64_t blk = mix64(seed ^ mix64((uint64_t)lead * 0x9E37u + (uint64_t)(i / b0) * 0x10001u + (uint64_t)(j / b1)));
  const uint64_t el = mix64(seed + 0x51ed27u * (uint64_t)lead + (uint64_t)i * 0x100000001b3ULL + (uint64_t)j);
  const int kind = (int)(blk % 16);
  const int first = i % b0 == 0 && j % b1 == 0; /* the block's first element */
  const double sign = (el >> 63) ? -1.0 : 1.0;
  if (kind == 0) return (el & 1) ? -0.0 : 0.0; /* all zero */
  if (kind == 1) /* subnormal in bf16 and f16's reach: tiny, amax < 1e-4 */
    return sign * ldexp((double)((el >> 8) % 8), dt == RESHARD_FP16 ? -24 : -133);
  if (kind == 2 && first) return NAN;
  if (kind == 3 && first) return sign * INFINITY;
  /* a mantissa the source dtype holds exactly: 8 significant bits for
   * bf16, 11 for f16, 20 for f32 */
  const int mbits = dt == RESHARD_BF16 ? 7 : dt == RESHARD_FP16 ? 10 : 19;
  const double m = 1.0 + (double)((el >> 20) % (1u << mbits)) / (double)(1u << mbits);
  const int bexp = (int)((blk >> 8) % 12) - 8; /* per block: 2^-8 .. 2^3 */
  if (kind == 4 && first) return sign * ldexp(1.0, bexp + 1); /* amax a power of two: ties */
  return sign * ldexp(m, bexp - (int)((el >> 40) % 6));
}

static void store(reshard_dtype_t dt, double v, unsigned char *at) {
  int64_t bits = rs_ref_round(dt, v);
  if (bits < 0) bits = dt == RESHARD_FP32 ? 0x7fc00000 : dt == RESHARD_BF16 ? 0x7fc0 : 0x7e00;
  for (size_t k = 0; k < reshard_dtype_size(dt); k++) at[k] = (unsigned char)((uint64_t)bits >> (8 * k));
}

/* ---------------- a layout pair and what it quantizes ---------------- */

enum { QMAX = 128 };

typedef struct qcase {
  reshard_layout_t *src, *dst;
  int nranks;
  /* the quantized weights, by destination id */
  int nq;
  int wid[QMAX], sid[QMAX];  /* destination ids of weight and scales */
  int srcid[QMAX];           /* source id of the weight */
  reshard_dtype_t sdt[QMAX];
  int64_t block[QMAX][2];
  int ndim[QMAX];
  int64_t shape[QMAX][RESHARD_MAX_DIMS];
} qcase;

static void qcase_free(qcase *c) {
  reshard_layout_destroy(c->src);
  reshard_layout_destroy(c->dst);
  memset(c, 0, sizeof *c);
}

/* Coordinates of linear index lin of a shape. */
static void unravel(int64_t lin, int nd, const int64_t *shape, int64_t *idx) {
  for (int d = nd - 1; d >= 0; d--) {
    idx[d] = shape[d] ? lin % shape[d] : 0;
    lin = shape[d] ? lin / shape[d] : 0;
  }
}

static int64_t lead_of(int nd, const int64_t *shape, const int64_t *idx) {
  int64_t l = 0;
  for (int d = 0; d < nd - 2; d++) l = l * shape[d] + idx[d];
  return l;
}

/* Writes the test's values into every source fragment of the weights. */
static void fill_weights(const qcase *c, th_side *s, int rank, uint64_t step) {
  (void)rank;
  for (size_t f = 0; f < s->nfrags; f++) {
    const reshard_fragment_info_t *fr = &s->frags[f];
    int k = -1;
    for (int q = 0; q < c->nq; q++)
      if (c->srcid[q] == fr->tensor_id) k = q;
    if (k < 0) continue;
    const char *name;
    reshard_layout_tensor_info(c->src, fr->tensor_id, &name, NULL, NULL, NULL);
    const uint64_t seed = name_seed(name, step);
    const int nd = fr->ndim;
    const size_t es = reshard_dtype_size(c->sdt[k]);
    int64_t n = 1;
    for (int d = 0; d < nd; d++) n *= fr->extent[d];
    for (int64_t e = 0; e < n; e++) {
      int64_t rel[RESHARD_MAX_DIMS] = {0}, g[RESHARD_MAX_DIMS] = {0};
      unravel(e, nd, fr->extent, rel);
      int64_t off = (int64_t)fr->byte_offset;
      for (int d = 0; d < nd; d++) g[d] = fr->start[d] + rel[d], off += rel[d] * fr->strides[d] * (int64_t)es;
      double v = weight_value(seed, lead_of(nd, c->shape[k], g), g[nd - 2], g[nd - 1], c->block[k][0], c->block[k][1],
                              c->sdt[k]);
      store(c->sdt[k], v, s->ptr[fr->buffer_id] + off);
    }
  }
}

/* The value element (lead, i, j) has in the source dtype. */
static double held_value(const qcase *c, int k, uint64_t seed, int64_t lead, int64_t i, int64_t j) {
  double v = weight_value(seed, lead, i, j, c->block[k][0], c->block[k][1], c->sdt[k]);
  int64_t bits = rs_ref_round(c->sdt[k], v);
  return bits < 0 ? NAN : rs_ref_decode(c->sdt[k], (uint32_t)bits);
}

/* Each block's amax (NaN if it holds a NaN), computed once per check. */
typedef struct amax_table {
  double *v[QMAX];
  uint64_t seed[QMAX];
} amax_table;

static void amax_fill(const qcase *c, uint64_t step, amax_table *t) {
  for (int k = 0; k < c->nq; k++) {
    const int nd = c->ndim[k];
    const int64_t *shape = c->shape[k];
    const int64_t b0 = c->block[k][0], b1 = c->block[k][1];
    const int64_t nbr = (shape[nd - 2] + b0 - 1) / b0, nbc = (shape[nd - 1] + b1 - 1) / b1;
    int64_t nlead = 1;
    for (int d = 0; d < nd - 2; d++) nlead *= shape[d];
    const char *name = "";
    reshard_layout_tensor_info(c->src, c->srcid[k], &name, NULL, NULL, NULL);
    t->seed[k] = name_seed(name, step);
    t->v[k] = calloc((size_t)(nlead * nbr * nbc) + 1, sizeof(double));
    for (int64_t l = 0; l < nlead; l++)
      for (int64_t i = 0; i < shape[nd - 2]; i++)
        for (int64_t j = 0; j < shape[nd - 1]; j++) {
          double *a = &t->v[k][(l * nbr + i / b0) * nbc + j / b1];
          double x = held_value(c, k, t->seed[k], l, i, j);
          if (isnan(x) || isnan(*a)) *a = NAN;
          else if (fabs(x) > *a) *a = fabs(x);
        }
  }
}

static void amax_free(amax_table *t) {
  for (int k = 0; k < QMAX; k++) free(t->v[k]);
}

/* The reference code of element g and its block's scale. */
static void reference(const qcase *c, const amax_table *t, int k, const int64_t *g, int64_t *code, float *scale) {
  const int nd = c->ndim[k];
  const int64_t *shape = c->shape[k];
  const int64_t b0 = c->block[k][0], b1 = c->block[k][1];
  const int64_t nbr = (shape[nd - 2] + b0 - 1) / b0, nbc = (shape[nd - 1] + b1 - 1) / b1;
  const int64_t lead = lead_of(nd, shape, g);
  const double amax = t->v[k][(lead * nbr + g[nd - 2] / b0) * nbc + g[nd - 1] / b1];
  *code = rs_ref_quant_e4m3((float)held_value(c, k, t->seed[k], lead, g[nd - 2], g[nd - 1]), (float)amax, scale);
}

/* Checks every destination fragment element and every byte outside them. */
static int64_t check_rank(const qcase *c, const th_side *s, int rank, uint64_t step) {
  int64_t bad = 0;
  amax_table tab;
  memset(&tab, 0, sizeof tab);
  amax_fill(c, step, &tab);
  for (size_t f = 0; f < s->nfrags; f++) {
    const reshard_fragment_info_t *fr = &s->frags[f];
    int k = -1, is_scale = 0;
    for (int q = 0; q < c->nq; q++) {
      if (c->wid[q] == fr->tensor_id) k = q;
      if (c->sid[q] == fr->tensor_id) k = q, is_scale = 1;
    }
    const char *name;
    int64_t tshape[RESHARD_MAX_DIMS];
    reshard_dtype_t dt;
    reshard_layout_tensor_info(c->dst, fr->tensor_id, &name, &dt, NULL, tshape);
    const int nd = fr->ndim;
    const size_t es = reshard_dtype_size(dt);
    int64_t n = 1;
    for (int d = 0; d < nd; d++) n *= fr->extent[d];
    for (int64_t e = 0; e < n; e++) {
      int64_t rel[RESHARD_MAX_DIMS] = {0}, g[RESHARD_MAX_DIMS] = {0};
      unravel(e, nd, fr->extent, rel);
      int64_t off = (int64_t)fr->byte_offset, lin = 0;
      for (int d = 0; d < nd; d++) {
        g[d] = fr->start[d] + rel[d];
        off += rel[d] * fr->strides[d] * (int64_t)es;
        lin = lin * tshape[d] + g[d];
      }
      const unsigned char *at = s->ptr[fr->buffer_id] + off;
      int wrong;
      char what[96];
      if (k < 0) { /* a tensor that moves as it is */
        unsigned char want[16];
        reshard_selftest_expected(name, step, lin, es, want);
        wrong = memcmp(want, at, es) != 0;
        snprintf(what, sizeof what, "plain");
      } else if (!is_scale) {
        int64_t want;
        float sc;
        reference(c, &tab, k, g, &want, &sc);
        wrong = want < 0 ? !rs_ref_is_nan(RESHARD_FP8_E4M3, at[0]) : at[0] != (unsigned char)want;
        snprintf(what, sizeof what, "code 0x%02x, want 0x%02llx", at[0], (unsigned long long)(want & 0xff));
      } else { /* the scale of block g (in block coordinates) */
        int64_t wg[RESHARD_MAX_DIMS], want;
        float sc, got;
        for (int d = 0; d < nd; d++) wg[d] = g[d];
        wg[nd - 2] = g[nd - 2] * c->block[k][0];
        wg[nd - 1] = g[nd - 1] * c->block[k][1];
        reference(c, &tab, k, wg, &want, &sc);
        memcpy(&got, at, 4);
        wrong = isnan(sc) ? !isnan(got) : memcmp(&got, &sc, 4) != 0;
        snprintf(what, sizeof what, "scale %a, want %a", (double)got, (double)sc);
      }
      if (wrong) {
        if (bad < 5)
          fprintf(stderr, "rank %d tensor '%s' element %lld wrong (%s)\n", rank, name, (long long)lin, what);
        bad++;
      }
    }
  }
  for (int b = 0; b < s->nbuf; b++)
    for (size_t i = 0; i < s->bytes[b]; i++)
      if (!s->mask[b][i] && s->ptr[b][i] != RESHARD_SELFTEST_SENTINEL) {
        if (bad < 5) fprintf(stderr, "rank %d buffer %d byte %zu outside fragments was written\n", rank, b, i);
        bad++;
      }
  amax_free(&tab);
  return bad;
}

/* ---------------- ranks ---------------- */

typedef struct run_args {
  const qcase *c;
  reshard_options_t opts;
  int steps;
  int64_t bad[64];
  int fail[64];
  size_t send_bytes[64];
} run_args;

static int run_rank(int rank, reshard_comm_t *comm, void *arg) {
  run_args *a = arg;
  const qcase *c = a->c;
  reshard_plan_t *plan = NULL;
  reshard_result_t r = reshard_plan_create(comm, c->src, c->dst, &a->opts, &plan);
  if (r) {
    fprintf(stderr, "rank %d: plan_create: %s: %s\n", rank, reshard_result_string(r), reshard_last_error());
    a->fail[rank] = 1;
    return 1;
  }
  reshard_plan_stats_t st;
  reshard_plan_get_stats(plan, &st);
  a->send_bytes[rank] = st.send_bytes;
  th_side dst;
  if (th_side_alloc(&dst, c->dst, rank, -1)) a->fail[rank] = 1;
  for (int step = 0; step < a->steps && !a->fail[rank]; step++) {
    th_side src;
    if (th_side_alloc(&src, c->src, rank, step)) {
      a->fail[rank] = 1;
      break;
    }
    fill_weights(c, &src, rank, (uint64_t)step);
    reshard_buffer_t *sb = calloc((size_t)src.nbuf + 1, sizeof *sb), *db = calloc((size_t)dst.nbuf + 1, sizeof *db);
    for (int b = 0; b < src.nbuf; b++) sb[b] = (reshard_buffer_t){src.ptr[b], src.bytes[b]};
    for (int b = 0; b < dst.nbuf; b++) db[b] = (reshard_buffer_t){dst.ptr[b], dst.bytes[b]};
    r = reshard_plan_execute_sized(plan, 0, sb, (size_t)src.nbuf, db, (size_t)dst.nbuf, NULL);
    free(sb);
    free(db);
    th_side_free(&src);
    if (r) {
      fprintf(stderr, "rank %d: execute: %s: %s\n", rank, reshard_result_string(r), reshard_last_error());
      a->fail[rank] = 1;
      break;
    }
    a->bad[rank] += check_rank(c, &dst, rank, (uint64_t)step);
  }
  th_side_free(&dst);
  reshard_plan_destroy(plan);
  return a->fail[rank] || a->bad[rank];
}

static int64_t run_case(const qcase *c, const reshard_options_t *opts, int steps, size_t *send_total) {
  static run_args a;
  memset(&a, 0, sizeof a);
  a.c = c;
  a.opts = *opts;
  a.steps = steps;
  th_run_ranks(c->nranks, run_rank, &a);
  int64_t bad = 0;
  size_t sent = 0;
  for (int r = 0; r < c->nranks; r++) {
    if (a.fail[r]) return -1;
    bad += a.bad[r];
    sent += a.send_bytes[r];
  }
  if (send_total) *send_total = sent;
  return bad;
}

/* ---------------- layouts ---------------- */

/* Places tensor t on a mesh of the given ranks: a random placement per
 * axis (replicate, or shard a random dim evenly or with random sizes). */
static void random_place(reshard_layout_t *L, int t, int ndim_t, const int64_t *shape, const int *ranks, int n,
                         uint64_t *rng, int verbose, const char *side) {
  int mshape[2] = {n, 1}, mnd = 1;
  if (n % 2 == 0 && n > 2 && th_rand(rng) % 2) mshape[0] = n / 2, mshape[1] = 2, mnd = 2;
  int mesh;
  assert_int_equal(reshard_layout_add_mesh(L, mnd, mshape, ranks, &mesh), 0);
  reshard_placement_t pl[2];
  static int64_t sizes[8][64];
  static int which;
  int64_t ext[RESHARD_MAX_DIMS];
  for (int d = 0; d < ndim_t; d++) ext[d] = shape[d];
  for (int a = 0; a < mnd; a++) {
    int kind = (int)(th_rand(rng) % 4);
    if (kind == 0) {
      pl[a] = reshard_replicate();
    } else {
      int dim = (int)(th_rand(rng) % (uint64_t)ndim_t);
      if (kind == 3 && ext[dim] == shape[dim]) { /* sizes sum to the dim's extent: a dim no earlier axis split */
        int64_t *sz = sizes[which++ % 8], left = ext[dim];
        for (int i = 0; i < mshape[a]; i++) {
          sz[i] = i == mshape[a] - 1 ? left : th_rand_range(rng, 0, left);
          left -= sz[i];
        }
        pl[a] = reshard_shard_sizes(dim, sz);
        ext[dim] = sz[0]; /* a later axis splits some piece; any bound works */
      } else {
        pl[a] = reshard_shard(dim);
        ext[dim] = (ext[dim] + mshape[a] - 1) / mshape[a];
      }
    }
    if (verbose)
      fprintf(stderr, "  %s tensor %d mesh %dx%d axis %d: %s dim %d%s\n", side, t, mshape[0], mshape[1], a,
              pl[a].kind ? "shard" : "replicate", pl[a].dim, pl[a].split_sizes ? " (sizes)" : "");
  }
  int b;
  assert_int_equal(reshard_layout_place(L, t, mesh, pl, &b), 0);
}

/* A random pair: one or two quantized weights (2-D or stacked 3-D, random
 * blocks and source dtype) and a plain bf16 tensor, on random meshes. */
static void random_case(uint64_t seed, qcase *c, int verbose) {
  memset(c, 0, sizeof *c);
  uint64_t rng = seed * 0x9E3779B97F4A7C15ULL + 1;
  c->nranks = (int)th_rand_range(&rng, 2, 6);
  assert_int_equal(reshard_layout_create(&c->src), 0);
  assert_int_equal(reshard_layout_create(&c->dst), 0);
  c->nq = (int)th_rand_range(&rng, 1, 2);
  static const reshard_dtype_t dts[3] = {RESHARD_BF16, RESHARD_FP16, RESHARD_FP32};
  int sranks[8], dranks[8];
  const int ns = (int)th_rand_range(&rng, 1, c->nranks), nd = (int)th_rand_range(&rng, 1, c->nranks);
  /* source ranks from 0; destination ranks from the end (they overlap
   * when ns + nd > nranks: colocated) */
  for (int i = 0; i < ns; i++) sranks[i] = i;
  for (int i = 0; i < nd; i++) dranks[i] = c->nranks - nd + i;
  for (int q = 0; q < c->nq; q++) {
    char name[32];
    snprintf(name, sizeof name, "layers.%d.weight", q);
    c->ndim[q] = th_rand(&rng) % 3 ? 2 : 3;
    for (int d = 0; d < c->ndim[q]; d++) c->shape[q][d] = d < c->ndim[q] - 2 ? th_rand_range(&rng, 1, 3)
                                                                              : th_rand_range(&rng, 1, 40);
    c->block[q][0] = th_rand_range(&rng, 1, 9);
    c->block[q][1] = th_rand_range(&rng, 1, 9);
    c->sdt[q] = dts[th_rand(&rng) % 3];
    if (verbose)
      fprintf(stderr, "  weight %d: %s %lldx%lld%s block %lldx%lld from %s\n", q, name,
              (long long)c->shape[q][c->ndim[q] - 2], (long long)c->shape[q][c->ndim[q] - 1],
              c->ndim[q] == 3 ? " stacked" : "", (long long)c->block[q][0], (long long)c->block[q][1],
              reshard_dtype_name(c->sdt[q]));
    assert_int_equal(reshard_layout_add_tensor(c->src, name, c->sdt[q], c->ndim[q], c->shape[q], &c->srcid[q]), 0);
    assert_int_equal(reshard_layout_add_tensor_blocked(c->dst, name, RESHARD_FP8_E4M3, c->ndim[q], c->shape[q],
                                                       c->block[q], &c->wid[q]),
                     0);
    int64_t blk[2];
    assert_int_equal(reshard_layout_tensor_block(c->dst, c->wid[q], blk, &c->sid[q]), 0);
    assert_true(blk[0] == c->block[q][0] && blk[1] == c->block[q][1] && c->sid[q] == c->wid[q] + 1);
    random_place(c->src, c->srcid[q], c->ndim[q], c->shape[q], sranks, ns, &rng, verbose, "src");
    random_place(c->dst, c->wid[q], c->ndim[q], c->shape[q], dranks, nd, &rng, verbose, "dst");
    int64_t sshape[RESHARD_MAX_DIMS];
    reshard_layout_tensor_info(c->dst, c->sid[q], NULL, NULL, NULL, sshape);
    random_place(c->dst, c->sid[q], c->ndim[q], sshape, dranks, nd, &rng, verbose, "dst scales");
  }
  /* a tensor that is not quantized */
  const int64_t nshape[1] = {th_rand_range(&rng, 1, 50)};
  int ts, td;
  assert_int_equal(reshard_layout_add_tensor(c->src, "norm.weight", RESHARD_BF16, 1, nshape, &ts), 0);
  assert_int_equal(reshard_layout_add_tensor(c->dst, "norm.weight", RESHARD_BF16, 1, nshape, &td), 0);
  random_place(c->src, ts, 1, nshape, sranks, ns, &rng, verbose, "src");
  random_place(c->dst, td, 1, nshape, dranks, nd, &rng, verbose, "dst");
}

static int run_seed(uint64_t seed, int verbose) {
  qcase c;
  if (verbose) fprintf(stderr, "seed %llu:\n", (unsigned long long)seed);
  random_case(seed, &c, verbose);
  reshard_options_t o = RESHARD_OPTIONS_INITIALIZER;
  o.relay = (int)(seed % 2);
  if (seed % 3 == 0) o.staging_bytes = 4096; /* the minimum: boxes cut across messages */
  int64_t bad = run_case(&c, &o, 2, NULL);
  if (bad) {
    fprintf(stderr, "random_layouts: seed %llu: %lld wrong%s (RS_QUANT_SEED=%llu replays it)\n",
            (unsigned long long)seed, (long long)bad, bad < 0 ? " (an API call failed)" : "",
            (unsigned long long)seed);
    if (!verbose) {
      qcase_free(&c);
      random_case(seed, &c, 1);
    }
  }
  qcase_free(&c);
  return bad != 0;
}

static void random_layouts(void **state) {
  (void)state;
  const char *one = getenv("RS_QUANT_SEED");
  if (one && *one) {
    assert_int_equal(run_seed(strtoull(one, NULL, 0), 1), 0);
    return;
  }
  int failed = 0;
  for (uint64_t seed = 1; seed <= 150 && failed < 3; seed++) failed += run_seed(seed, 0);
  assert_int_equal(failed, 0);
}

/* A 2-D weight: source on ranks [0, ns) sharded along dim sdim with sizes
 * ssz (NULL: even), destination on [nranks - nd, nranks) sharded along
 * ddim, the scales split like it. */
static void tp_case(qcase *c, int nranks, reshard_dtype_t sdt, int64_t rows, int64_t cols, int64_t b0, int64_t b1,
                    int ns, int sdim, const int64_t *ssz, int nd, int ddim) {
  memset(c, 0, sizeof *c);
  c->nranks = nranks;
  c->nq = 1;
  c->sdt[0] = sdt;
  c->ndim[0] = 2;
  c->shape[0][0] = rows, c->shape[0][1] = cols;
  c->block[0][0] = b0, c->block[0][1] = b1;
  assert_int_equal(reshard_layout_create(&c->src), 0);
  assert_int_equal(reshard_layout_create(&c->dst), 0);
  assert_int_equal(reshard_layout_add_tensor(c->src, "w", sdt, 2, c->shape[0], &c->srcid[0]), 0);
  assert_int_equal(reshard_layout_add_tensor_blocked(c->dst, "w", RESHARD_FP8_E4M3, 2, c->shape[0], c->block[0],
                                                     &c->wid[0]),
                   0);
  assert_int_equal(reshard_layout_find_tensor(c->dst, "w_scale_inv", &c->sid[0]), 0);
  int ms, md, b;
  const int sh1[1] = {ns}, dh1[1] = {nd};
  assert_int_equal(reshard_layout_add_mesh_strided(c->src, 1, sh1, 0, 1, &ms), 0);
  assert_int_equal(reshard_layout_add_mesh_strided(c->dst, 1, dh1, nranks - nd, 1, &md), 0);
  reshard_placement_t ps = ssz ? reshard_shard_sizes(sdim, ssz) : reshard_shard(sdim), pd = reshard_shard(ddim);
  assert_int_equal(reshard_layout_place(c->src, c->srcid[0], ms, &ps, &b), 0);
  assert_int_equal(reshard_layout_place(c->dst, c->wid[0], md, &pd, &b), 0);
  assert_int_equal(reshard_layout_place(c->dst, c->sid[0], md, &pd, &b), 0);
}

static void fixed_cases(void **state) {
  (void)state;
  reshard_options_t o = RESHARD_OPTIONS_INITIALIZER;
  qcase c;
  /* Megatron-like: rows split over 2 trainer ranks at a block boundary
   * (256 = 2 x 128), vLLM-like columns over 2 others; 128 x 128 blocks,
   * a ragged last column block (300 = 2 x 128 + 44) */
  tp_case(&c, 4, RESHARD_BF16, 256, 300, 128, 128, 2, 0, NULL, 2, 1);
  assert_int_equal(run_case(&c, &o, 2, NULL), 0);
  qcase_free(&c);
  /* a split through the middle of blocks: 100 + 156 rows, blocks of 64
   * rows span both trainer ranks and are gathered first; colocated */
  const int64_t sz[2] = {100, 156};
  tp_case(&c, 3, RESHARD_BF16, 256, 96, 64, 32, 2, 0, sz, 3, 0);
  assert_int_equal(run_case(&c, &o, 2, NULL), 0);
  qcase_free(&c);
  /* f32 and f16 sources, columns split unevenly through blocks */
  const int64_t cz[3] = {7, 20, 13};
  tp_case(&c, 5, RESHARD_FP32, 33, 40, 8, 16, 3, 1, cz, 2, 0);
  assert_int_equal(run_case(&c, &o, 1, NULL), 0);
  qcase_free(&c);
  tp_case(&c, 5, RESHARD_FP16, 33, 40, 8, 16, 3, 1, cz, 2, 1);
  o.flags = RESHARD_FLAG_VERIFY; /* codes and scales move as plain data: verify covers them */
  assert_int_equal(run_case(&c, &o, 1, NULL), 0);
  qcase_free(&c);
}

static void wire_bytes(void **state) {
  (void)state;
  reshard_options_t o = RESHARD_OPTIONS_INITIALIZER;
  qcase c;
  /* disjoint sides, aligned: every element crosses once, as one byte,
   * and every block's scale once per destination holder */
  tp_case(&c, 4, RESHARD_BF16, 256, 512, 128, 128, 2, 0, NULL, 2, 1);
  size_t sent = 0;
  assert_int_equal(run_case(&c, &o, 1, &sent), 0);
  assert_int_equal(sent, 256 * 512 + 2 * 4 * 4);
  /* T_lower counts the same wire: about half of a bf16 destination's */
  reshard_estimate_t fp8 = RESHARD_ESTIMATE_INITIALIZER, bf16 = RESHARD_ESTIMATE_INITIALIZER;
  assert_int_equal(reshard_lower_bound(c.src, c.dst, 4, "h100-8x400g", &fp8), 0);
  reshard_layout_t *wide;
  int t, m, b;
  const int two[1] = {2};
  reshard_placement_t pd = reshard_shard(1);
  assert_int_equal(reshard_layout_create(&wide), 0);
  assert_int_equal(reshard_layout_add_tensor(wide, "w", RESHARD_BF16, 2, c.shape[0], &t), 0);
  assert_int_equal(reshard_layout_add_mesh_strided(wide, 1, two, 2, 1, &m), 0);
  assert_int_equal(reshard_layout_place(wide, t, m, &pd, &b), 0);
  assert_int_equal(reshard_lower_bound(c.src, wide, 4, "h100-8x400g", &bf16), 0);
  assert_true(fp8.seconds > 0.45 * bf16.seconds && fp8.seconds < 0.6 * bf16.seconds);
  reshard_layout_destroy(wide);
  qcase_free(&c);
}

/* estimate_gathering: each rank's estimate of the whole plan, of its
 * gathering pre-plan alone and of the main plan alone (the pre-plan
 * detached for that call: reshard_plan_estimate is collective, every
 * rank does the same). */
typedef struct est_args {
  const qcase *c;
  int fail[8];
  int has_pre[8];
  double all[8], pre[8], main_only[8];
} est_args;

static int estimate_rank(int rank, reshard_comm_t *comm, void *arg) {
  est_args *a = arg;
  reshard_options_t o = RESHARD_OPTIONS_INITIALIZER;
  o.topology = "h100-8x400g";
  reshard_plan_t *plan = NULL;
  if (reshard_plan_create(comm, a->c->src, a->c->dst, &o, &plan)) {
    fprintf(stderr, "rank %d: plan_create: %s\n", rank, reshard_last_error());
    return a->fail[rank] = 1;
  }
  reshard_estimate_t all = RESHARD_ESTIMATE_INITIALIZER, pre = all, main_only = all;
  reshard_plan_t *gather = plan->quant ? plan->quant->pre : NULL;
  a->has_pre[rank] = gather != NULL;
  int bad = reshard_plan_estimate(plan, &all) != RESHARD_SUCCESS;
  if (gather) {
    bad |= reshard_plan_estimate(gather, &pre) != RESHARD_SUCCESS;
    plan->quant->pre = NULL;
    bad |= reshard_plan_estimate(plan, &main_only) != RESHARD_SUCCESS;
    plan->quant->pre = gather;
  }
  if (bad) fprintf(stderr, "rank %d: estimate: %s\n", rank, reshard_last_error());
  a->all[rank] = all.seconds, a->pre[rank] = pre.seconds, a->main_only[rank] = main_only.seconds;
  reshard_plan_destroy(plan);
  return a->fail[rank] = bad;
}

static void estimate_gathering(void **state) {
  (void)state;
  qcase c;
  /* 100 + 156 rows, blocks of 64 rows: the block of rows 64..127 spans
   * both trainer ranks and is gathered first */
  const int64_t sz[2] = {100, 156};
  tp_case(&c, 4, RESHARD_BF16, 256, 4096, 64, 128, 2, 0, sz, 2, 1);
  static est_args a;
  memset(&a, 0, sizeof a);
  a.c = &c;
  assert_int_equal(th_run_ranks(c.nranks, estimate_rank, &a), 0);
  for (int r = 0; r < c.nranks; r++) {
    assert_false(a.fail[r]);
    assert_true(a.has_pre[r]);
    assert_true(a.pre[r] > 0 && a.main_only[r] > 0);
    /* the same answer on every rank, the pre-plan's time added */
    assert_true(a.all[r] == a.all[0] && a.pre[r] == a.pre[0]);
    assert_true(fabs(a.all[r] - (a.pre[r] + a.main_only[r])) <= 1e-12 * a.all[r]);
  }
  qcase_free(&c);
}

/* The quantized weights of a layout pair: every destination weight
 * declared blocked whose source tensor is not. */
static void find_quantized(qcase *c) {
  c->nq = 0;
  for (int t = 0; t < reshard_layout_num_tensors(c->dst); t++) {
    int64_t blk[2], shape[RESHARD_MAX_DIMS];
    int sid, s, nd;
    const char *name;
    reshard_dtype_t sdt;
    assert_int_equal(reshard_layout_tensor_block(c->dst, t, blk, &sid), 0);
    if (!blk[0]) continue;
    assert_int_equal(reshard_layout_tensor_info(c->dst, t, &name, NULL, &nd, shape), 0);
    assert_int_equal(reshard_layout_find_tensor(c->src, name, &s), 0);
    int64_t sblk[2];
    assert_int_equal(reshard_layout_tensor_block(c->src, s, sblk, NULL), 0);
    if (sblk[0]) continue;
    assert_int_equal(reshard_layout_tensor_info(c->src, s, NULL, &sdt, NULL, NULL), 0);
    assert_true(c->nq < QMAX);
    const int k = c->nq++;
    c->wid[k] = t, c->sid[k] = sid, c->srcid[k] = s, c->sdt[k] = sdt, c->ndim[k] = nd;
    c->block[k][0] = blk[0], c->block[k][1] = blk[1];
    for (int d = 0; d < nd; d++) c->shape[k][d] = shape[d];
  }
}

/* Megatron in bf16 (no scales) -> vLLM with DeepSeek's fp8 checkpoint
 * format (quantization_config.weight_block_size [4, 8]): every linear
 * weight but the router quantized on the way, the rest moved as bf16. */
static void model_sync(void **state) {
  (void)state;
  static const struct {
    const char *train, *infer;
    int colocate;
  } cases[] = {
      {"tp=2", "tp=2", 0},
      {"tp=2,pp=2,ep=2,etp=1", "tp=4,ep=4", 0},
      {"tp=2,dp=2,ep=2,etp=2", "tp=2,dp=2,ep=4", 1},
  };
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
    rm_model_options mo = RM_MODEL_OPTIONS_INIT;
    mo.layers = 2;
    rm_model *train = NULL, *infer = NULL;
    assert_int_equal(rm_model_load_ex(RESHARD_TEST_DATA "/tiny-deepseek-v3-fp8.json", &mo, &train), 0);
    mo.block_scales = 1;
    assert_int_equal(rm_model_load_ex(RESHARD_TEST_DATA "/tiny-deepseek-v3-fp8.json", &mo, &infer), 0);
    rm_parallel tp, ip;
    assert_int_equal(rm_parse_parallel(cases[i].train, &tp), 0);
    assert_int_equal(rm_parse_parallel(cases[i].infer, &ip), 0);
    qcase c;
    memset(&c, 0, sizeof c);
    const int ns = rm_parallel_ranks(&tp), nd = rm_parallel_ranks(&ip);
    const int first = cases[i].colocate ? 0 : ns;
    c.nranks = cases[i].colocate ? (ns > nd ? ns : nd) : ns + nd;
    assert_int_equal(rm_megatron_layout(train, &tp, 0, &c.src), 0);
    assert_int_equal(rm_vllm_layout(infer, &ip, first, &c.dst), 0);
    find_quantized(&c);
    assert_true(c.nq > 10); /* attention, dense and shared MLP, experts */
    reshard_options_t o = RESHARD_OPTIONS_INITIALIZER;
    int64_t bad = run_case(&c, &o, 2, NULL);
    if (bad) fprintf(stderr, "model_sync: %s -> %s: %lld wrong\n", cases[i].train, cases[i].infer, (long long)bad);
    assert_int_equal(bad, 0);
    qcase_free(&c);
    rm_model_free(train);
    rm_model_free(infer);
  }
}

/* The public self-test (reshard_selftest_check_from, what the tools' -c 1
 * runs) checks quantized destinations with its own reference: a correct
 * sync passes it, a changed code or scale does not. Its values are random
 * bit patterns, so small blocks keep some of them free of NaN. */
static int selftest_rank(int rank, reshard_comm_t *comm, void *arg) {
  const qcase *c = arg;
  reshard_plan_t *plan = NULL;
  th_side src, dst;
  int fails = reshard_plan_create(comm, c->src, c->dst, NULL, &plan) != RESHARD_SUCCESS;
  fails |= th_side_alloc(&src, c->src, rank, 3) != 0;
  fails |= th_side_alloc(&dst, c->dst, rank, -1) != 0;
  if (!fails)
    fails |= reshard_plan_execute(plan, (void *const *)src.ptr, (size_t)src.nbuf, (void *const *)dst.ptr,
                                  (size_t)dst.nbuf, NULL) != RESHARD_SUCCESS;
  if (!fails) fails |= reshard_selftest_check_from(&dst, c->dst, c->src, rank, 3, "selftest") != 0;
  /* one wrong code, then one wrong scale, each found */
  for (size_t f = 0; !fails && f < dst.nfrags; f++) {
    const reshard_fragment_info_t *fr = &dst.frags[f];
    if (fr->tensor_id != c->wid[0] && fr->tensor_id != c->sid[0]) continue;
    unsigned char *at = dst.ptr[fr->buffer_id] + fr->byte_offset;
    at[0] ^= 0x01;
    fails |= reshard_selftest_check_from(&dst, c->dst, c->src, rank, 3, "selftest (expected: one wrong)") != 1;
    at[0] ^= 0x01;
  }
  if (!fails) fails |= reshard_selftest_check_from(&dst, c->dst, c->src, rank, 3, "selftest") != 0;
  th_side_free(&src);
  th_side_free(&dst);
  reshard_plan_destroy(plan);
  return fails;
}

static void selftest_checks(void **state) {
  (void)state;
  qcase c;
  /* rows through the middle of 2 x 2 blocks: gathered; f16 sources */
  const int64_t sz[2] = {5, 7};
  tp_case(&c, 2, RESHARD_FP16, 12, 10, 2, 2, 2, 0, sz, 2, 1);
  assert_int_equal(th_run_ranks(2, selftest_rank, &c), 0);
  qcase_free(&c);
  tp_case(&c, 1, RESHARD_BF16, 9, 16, 4, 2, 1, 0, NULL, 1, 0);
  assert_int_equal(th_run_ranks(1, selftest_rank, &c), 0);
  qcase_free(&c);
}

/* RESHARD_SELFTEST_FINITE (what the tools time converting syncs with):
 * every float dtype's values are finite and spread geometrically below 1
 * (most within a few octaves of the top, a tail far below it); a
 * quantizing sync of them passes the self-test's check, which still finds
 * one wrong code or scale; and its codes are e4m3 normals (subnormals and
 * zeros are as rare as in trained weights), not the NaN path of BITS
 * values. */
static int finite_codes_rank(int rank, reshard_comm_t *comm, void *arg) {
  const qcase *c = arg;
  int fails = selftest_rank(rank, comm, arg);
  /* the codes once more, counted by kind */
  reshard_plan_t *plan = NULL;
  th_side src, dst;
  fails |= reshard_plan_create(comm, c->src, c->dst, NULL, &plan) != RESHARD_SUCCESS;
  fails |= th_side_alloc(&src, c->src, rank, 3) != 0;
  fails |= th_side_alloc(&dst, c->dst, rank, -1) != 0;
  if (!fails)
    fails |= reshard_plan_execute(plan, (void *const *)src.ptr, (size_t)src.nbuf, (void *const *)dst.ptr,
                                  (size_t)dst.nbuf, NULL) != RESHARD_SUCCESS;
  int64_t normal = 0, subnormal = 0, nan = 0;
  for (size_t f = 0; !fails && f < dst.nfrags; f++) {
    const reshard_fragment_info_t *fr = &dst.frags[f];
    if (fr->tensor_id != c->wid[0]) continue;
    int64_t n = fr->extent[0] * fr->extent[1];
    assert_int_equal(fr->strides[0], fr->extent[1]); /* (a whole-row shard: contiguous) */
    for (int64_t e = 0; e < n; e++) {
      unsigned char code = dst.ptr[fr->buffer_id][fr->byte_offset + (uint64_t)e];
      if ((code & 0x7f) == 0x7f) nan++;
      else if ((code & 0x78) == 0 && (code & 7)) subnormal++;
      else if (code & 0x78) normal++;
    }
  }
  if (!fails && (nan || normal < 100 * (subnormal + 1) || normal < (int64_t)dst.bytes[0] / 2)) {
    fprintf(stderr, "finite values: rank %d: %lld normal, %lld subnormal, %lld NaN codes\n", rank, (long long)normal,
            (long long)subnormal, (long long)nan);
    fails = 1;
  }
  th_side_free(&src);
  th_side_free(&dst);
  reshard_plan_destroy(plan);
  return fails;
}

static void finite_values(void **state) {
  (void)state;
  reshard_selftest_set_values(RESHARD_SELFTEST_FINITE);
  assert_int_equal(reshard_selftest_get_values(), RESHARD_SELFTEST_FINITE);
  /* every float dtype: finite, under 1, about half of them in [1/2, 1) */
  static const reshard_dtype_t dts[] = {RESHARD_BF16, RESHARD_FP16, RESHARD_FP32, RESHARD_FP64, RESHARD_FP8_E4M3,
                                        RESHARD_FP8_E5M2};
  for (size_t i = 0; i < sizeof dts / sizeof *dts; i++) {
    reshard_layout_t *L;
    int t, m, b;
    const int64_t shape[1] = {4096};
    const int one[1] = {1};
    reshard_placement_t p = reshard_replicate();
    assert_int_equal(reshard_layout_create(&L), 0);
    assert_int_equal(reshard_layout_add_tensor(L, "v", dts[i], 1, shape, &t), 0);
    assert_int_equal(reshard_layout_add_mesh_strided(L, 1, one, 0, 1, &m), 0);
    assert_int_equal(reshard_layout_place(L, t, m, &p, &b), 0);
    reshard_selftest_t s;
    assert_int_equal(reshard_selftest_alloc(&s, L, 0, 5), 0);
    size_t es = reshard_dtype_size(dts[i]);
    int top = 0, bad = 0;
    for (int64_t e = 0; e < shape[0]; e++) {
      const unsigned char *at = s.ptr[0] + (size_t)e * es;
      double v;
      if (dts[i] == RESHARD_FP64) {
        memcpy(&v, at, 8);
      } else {
        uint32_t bits = 0;
        for (size_t k = 0; k < es; k++) bits |= (uint32_t)at[k] << (8 * k);
        v = rs_ref_decode(dts[i], bits);
      }
      bad += !(fabs(v) < 1.0) || v == 0;
      top += fabs(v) >= 0.5;
    }
    if (bad || top < 1800 || top > 2300)
      fprintf(stderr, "finite values: %s: %d bad, %d of 4096 in [1/2, 1)\n", reshard_dtype_name(dts[i]), bad, top);
    assert_int_equal(bad, 0);
    assert_true(top >= 1800 && top <= 2300);
    reshard_selftest_free(&s);
    reshard_layout_destroy(L);
  }
  /* a quantizing sync, gathered blocks included (rows split through them) */
  qcase c;
  const int64_t sz[2] = {40, 24};
  tp_case(&c, 2, RESHARD_BF16, 64, 128, 16, 32, 2, 0, sz, 2, 0);
  int r = th_run_ranks(2, finite_codes_rank, &c);
  qcase_free(&c);
  tp_case(&c, 1, RESHARD_FP32, 128, 64, 32, 32, 1, 0, NULL, 1, 0);
  r |= th_run_ranks(1, finite_codes_rank, &c);
  qcase_free(&c);
  reshard_selftest_set_values(RESHARD_SELFTEST_BITS);
  assert_int_equal(r, 0);
}

/* Review findings (2026-12-02), each a test first:
 * - a rank whose rewrite fails alone (its layout differs) fails inside the
 *   collective creation, so the others fail too instead of waiting;
 * - a partial destination does not make the plan gather blocks split
 *   across source ranks that nobody receives (the source holds rows 0-12
 *   of 16 only, in two pieces, and the destination only rows 0-4);
 * - a destination-only rank may pass an empty source array. */
static int differing_rank(int rank, reshard_comm_t *comm, void *arg) {
  (void)arg;
  qcase c;
  tp_case(&c, 4, RESHARD_BF16, 16, 16, 8, 8, 2, 0, NULL, 2, 1);
  if (rank == 1) { /* its source holds the weight in fp8e5m2: no quantizing from it */
    reshard_layout_destroy(c.src);
    reshard_layout_create(&c.src);
    int t, m, b;
    const int two[1] = {2};
    reshard_placement_t p = reshard_shard(0);
    reshard_layout_add_tensor(c.src, "w", RESHARD_FP8_E5M2, 2, c.shape[0], &t);
    reshard_layout_add_mesh_strided(c.src, 1, two, 0, 1, &m);
    reshard_layout_place(c.src, t, m, &p, &b);
  }
  reshard_options_t o = RESHARD_OPTIONS_INITIALIZER;
  o.timeout_ms = 20000;
  reshard_plan_t *plan = NULL;
  reshard_result_t r = reshard_plan_create(comm, c.src, c.dst, &o, &plan);
  int ok = r != RESHARD_SUCCESS && !plan && (rank != 1 || r == RESHARD_ERROR_INVALID_ARGUMENT);
  if (!ok) fprintf(stderr, "differing_rank: rank %d got %d: %s\n", rank, r, reshard_last_error());
  reshard_plan_destroy(plan);
  qcase_free(&c);
  return !ok;
}

static int partial_rank(int rank, reshard_comm_t *comm, void *arg) {
  (void)arg;
  reshard_layout_t *src, *dst;
  reshard_layout_create(&src);
  reshard_layout_create(&dst);
  const int64_t shape[2] = {16, 8}, block[2] = {8, 8};
  int t, d, buf;
  reshard_layout_add_tensor(src, "w", RESHARD_BF16, 2, shape, &t);
  reshard_layout_allow_partial(src, t);
  reshard_layout_add_buffer(src, "w.a", 0, 6 * 8 * 2, &buf);
  const int64_t s0[2] = {0, 0}, e0[2] = {6, 8}, s1[2] = {6, 0}, e1[2] = {6, 8};
  reshard_fragment_t f0 = {t, buf, s0, e0, 0, NULL};
  reshard_layout_add_fragment(src, &f0);
  reshard_layout_add_buffer(src, "w.b", 1, 6 * 8 * 2, &buf);
  reshard_fragment_t f1 = {t, buf, s1, e1, 0, NULL};
  reshard_layout_add_fragment(src, &f1);
  reshard_layout_add_tensor_blocked(dst, "w", RESHARD_FP8_E4M3, 2, shape, block, &d);
  reshard_layout_allow_partial(dst, d);
  reshard_layout_allow_partial(dst, d + 1);
  const int64_t ds[2] = {0, 0}, de[2] = {4, 8}, ss[2] = {0, 0}, se[2] = {1, 1};
  reshard_layout_add_buffer(dst, "w.c", 2, 4 * 8 + 4, &buf);
  reshard_fragment_t fd = {d, buf, ds, de, 0, NULL}, fs = {d + 1, buf, ss, se, 32, NULL};
  reshard_layout_add_fragment(dst, &fd);
  reshard_layout_add_fragment(dst, &fs);
  reshard_plan_t *plan = NULL;
  reshard_result_t r = reshard_plan_create(comm, src, dst, NULL, &plan);
  int fails = r != RESHARD_SUCCESS;
  if (fails) fprintf(stderr, "partial_rank: rank %d: %s\n", rank, reshard_last_error());
  unsigned char in[96] = {0}, out[36];
  memset(out, 0xA5, sizeof out);
  for (int i = 0; i < 48; i++) in[2 * i + 1] = 0x3f; /* bf16 0x3f00 = 0.5 */
  void *sp[2] = {rank == 0 ? in : NULL, rank == 1 ? in : NULL}, *dp[1] = {rank == 2 ? out : NULL};
  /* rank 2 only receives: an empty source array is fine */
  if (!fails) fails = reshard_plan_execute(plan, rank == 2 ? sp : sp, rank == 2 ? 0 : 2, dp, 1, NULL) != 0;
  if (fails) fprintf(stderr, "partial_rank: rank %d: %s\n", rank, reshard_last_error());
  if (!fails && rank == 2) { /* 0.5 everywhere: amax 0.5, codes 448 (0x7e), scale 0.5 / 448 */
    float sc, want = 0.5f / 448.0f;
    memcpy(&sc, out + 32, 4);
    for (int i = 0; i < 32; i++) fails |= out[i] != 0x7e;
    fails |= memcmp(&sc, &want, 4) != 0;
  }
  reshard_plan_destroy(plan);
  reshard_layout_destroy(src);
  reshard_layout_destroy(dst);
  return fails;
}

static void review_cases(void **state) {
  (void)state;
  assert_int_equal(th_run_ranks(4, differing_rank, NULL), 0);
  assert_int_equal(th_run_ranks(3, partial_rank, NULL), 0);
}

/* RESHARD_FLAG_DOUBLE_BUFFER on a quantizing plan: each step writes the
 * inactive copy (step 0 copy 0, step 1 copy 1), checked in full, and
 * leaves the other as it was (the main plan commits; the gather pre-plan
 * writes only its scratch). Rows split through blocks: gathered. */
static int untouched(const th_side *s) {
  for (int b = 0; b < s->nbuf; b++)
    for (size_t i = 0; i < s->bytes[b]; i++)
      if (s->ptr[b][i] != RESHARD_SELFTEST_SENTINEL) return 0;
  return 1;
}

static int double_buffer_rank(int rank, reshard_comm_t *comm, void *arg) {
  const qcase *c = arg;
  reshard_options_t o = RESHARD_OPTIONS_INITIALIZER;
  o.flags = RESHARD_FLAG_DOUBLE_BUFFER;
  reshard_plan_t *plan = NULL;
  int fails = reshard_plan_create(comm, c->src, c->dst, &o, &plan) != RESHARD_SUCCESS;
  th_side d[2];
  fails |= th_side_alloc(&d[0], c->dst, rank, -1) != 0;
  fails |= th_side_alloc(&d[1], c->dst, rank, -1) != 0;
  const int nd = d[0].nbuf;
  void **dp = calloc(2 * (size_t)nd + 1, sizeof *dp);
  for (int b = 0; b < nd; b++) dp[b] = d[0].ptr[b], dp[nd + b] = d[1].ptr[b];
  for (int step = 0; step < 2 && !fails; step++) {
    th_side src;
    fails |= th_side_alloc(&src, c->src, rank, step) != 0;
    fill_weights(c, &src, rank, (uint64_t)step);
    reshard_result_t r = reshard_plan_execute_version(plan, (uint64_t)step + 1, (void *const *)src.ptr,
                                                      (size_t)src.nbuf, dp, 2 * (size_t)nd, NULL);
    th_side_free(&src);
    if (r) {
      fprintf(stderr, "double_buffer: rank %d step %d: %s\n", rank, step, reshard_last_error());
      fails = 1;
      break;
    }
    reshard_plan_status_t st;
    memset(&st, 0, sizeof st);
    st.struct_size = sizeof st;
    fails |= reshard_plan_get_status(plan, &st) != 0 || st.failed || st.committed_version != (uint64_t)step + 1 ||
             st.active_copy != step;
    fails |= check_rank(c, &d[step], rank, (uint64_t)step) != 0;
    if (step == 0 && !untouched(&d[1])) fprintf(stderr, "double_buffer: rank %d: copy 1 written at step 0\n", rank), fails = 1;
    else fails |= check_rank(c, &d[0], rank, 0) != 0; /* copy 0 still holds step 0 */
  }
  free(dp);
  th_side_free(&d[0]);
  th_side_free(&d[1]);
  reshard_plan_destroy(plan);
  return fails;
}

static void double_buffer(void **state) {
  (void)state;
  qcase c;
  const int64_t sz[2] = {9, 23};
  tp_case(&c, 4, RESHARD_BF16, 32, 24, 8, 8, 2, 0, sz, 2, 1);
  assert_int_equal(th_run_ranks(4, double_buffer_rank, &c), 0);
  qcase_free(&c);
}

static int create_fails(int rank, reshard_comm_t *comm, void *arg) {
  const qcase *c = arg;
  reshard_plan_t *plan = NULL;
  reshard_result_t r = reshard_plan_create(comm, c->src, c->dst, NULL, &plan);
  int ok = r == RESHARD_ERROR_INVALID_ARGUMENT && !plan && strstr(reshard_last_error(), "'w") != NULL;
  if (!ok) fprintf(stderr, "rank %d: plan_create gave %d: %s\n", rank, r, reshard_last_error());
  reshard_plan_destroy(plan);
  return !ok;
}

static void bad_layouts(void **state) {
  (void)state;
  qcase c;
  /* the source is fp8 without scales */
  tp_case(&c, 2, RESHARD_BF16, 16, 16, 8, 8, 1, 0, NULL, 1, 0);
  reshard_layout_destroy(c.src);
  assert_int_equal(reshard_layout_create(&c.src), 0);
  int t, m, b;
  const int one[1] = {1};
  reshard_placement_t rep = reshard_replicate();
  assert_int_equal(reshard_layout_add_tensor(c.src, "w", RESHARD_FP8_E4M3, 2, c.shape[0], &t), 0);
  assert_int_equal(reshard_layout_add_mesh_strided(c.src, 1, one, 0, 1, &m), 0);
  assert_int_equal(reshard_layout_place(c.src, t, m, &rep, &b), 0);
  assert_int_equal(th_run_ranks(2, create_fails, &c), 0);
  qcase_free(&c);
  /* both blocked, with different blocks */
  tp_case(&c, 2, RESHARD_BF16, 16, 16, 8, 8, 1, 0, NULL, 1, 0);
  reshard_layout_destroy(c.src);
  assert_int_equal(reshard_layout_create(&c.src), 0);
  const int64_t blk[2] = {4, 8};
  assert_int_equal(reshard_layout_add_tensor_blocked(c.src, "w", RESHARD_FP8_E4M3, 2, c.shape[0], blk, &t), 0);
  assert_int_equal(reshard_layout_add_mesh_strided(c.src, 1, one, 0, 1, &m), 0);
  assert_int_equal(reshard_layout_place(c.src, t, m, &rep, &b), 0);
  assert_int_equal(reshard_layout_place(c.src, t + 1, m, &rep, &b), 0);
  assert_int_equal(th_run_ranks(2, create_fails, &c), 0);
  qcase_free(&c);
  /* the declaration refuses bad arguments and leaves the layout as it was */
  reshard_layout_t *L;
  assert_int_equal(reshard_layout_create(&L), 0);
  const int64_t shape[2] = {4, 4}, good[2] = {2, 2}, zero[2] = {0, 2};
  assert_int_equal(reshard_layout_add_tensor_blocked(L, "w", RESHARD_BF16, 2, shape, good, &t),
                   RESHARD_ERROR_INVALID_ARGUMENT);
  assert_int_equal(reshard_layout_add_tensor_blocked(L, "w", RESHARD_FP8_E4M3, 1, shape, good, &t),
                   RESHARD_ERROR_INVALID_ARGUMENT);
  assert_int_equal(reshard_layout_add_tensor_blocked(L, "w", RESHARD_FP8_E4M3, 2, shape, zero, &t),
                   RESHARD_ERROR_INVALID_ARGUMENT);
  /* the message gives the sizes and the real limit (issue 42, item 8: a
   * block of 2^63 - 1 read "must be two sizes >= 1") */
  const int64_t huge[2] = {INT64_MAX, 2};
  assert_int_equal(reshard_layout_add_tensor_blocked(L, "w", RESHARD_FP8_E4M3, 2, shape, huge, &t),
                   RESHARD_ERROR_INVALID_ARGUMENT);
  assert_non_null(strstr(reshard_last_error(), "block 9223372036854775807 x 2: each size must be from 1 to 2147483647"));
  assert_int_equal(reshard_layout_add_tensor_blocked(L, "w", RESHARD_FP8_E4M3, 2, shape, NULL, &t),
                   RESHARD_ERROR_INVALID_ARGUMENT);
  assert_non_null(strstr(reshard_last_error(), "block is NULL"));
  assert_int_equal(reshard_layout_add_tensor(L, "v_scale_inv", RESHARD_FP32, 2, shape, &t), 0);
  assert_int_equal(reshard_layout_add_tensor_blocked(L, "v", RESHARD_FP8_E4M3, 2, shape, good, &t),
                   RESHARD_ERROR_INVALID_ARGUMENT);
  assert_non_null(strstr(reshard_last_error(), "v_scale_inv"));
  assert_int_equal(reshard_layout_num_tensors(L), 1);
  assert_int_equal(reshard_layout_find_tensor(L, "v", &t), RESHARD_ERROR_INVALID_ARGUMENT);
  assert_int_equal(reshard_layout_add_tensor_blocked(L, "u", RESHARD_FP8_E4M3, 2, shape, good, &t), 0);
  int64_t got[2];
  int sid;
  assert_int_equal(reshard_layout_tensor_block(L, t, got, &sid), 0);
  assert_true(got[0] == 2 && got[1] == 2 && sid == t + 1);
  int64_t sshape[2];
  assert_int_equal(reshard_layout_tensor_info(L, sid, NULL, NULL, NULL, sshape), 0);
  assert_true(sshape[0] == 2 && sshape[1] == 2);
  assert_int_equal(reshard_layout_tensor_block(L, 0, got, &sid), 0);
  assert_true(got[0] == 0 && sid == -1);
  reshard_layout_destroy(L);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(fixed_cases),
      cmocka_unit_test(wire_bytes),
      cmocka_unit_test(estimate_gathering),
      cmocka_unit_test(bad_layouts),
      cmocka_unit_test(model_sync),
      cmocka_unit_test(selftest_checks),
      cmocka_unit_test(finite_values),
      cmocka_unit_test(review_cases),
      cmocka_unit_test(double_buffer),
      cmocka_unit_test(random_layouts),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
