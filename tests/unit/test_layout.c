/* Layout lowering through the public API: every builder (placements,
 * fused buffers, grouped buffers, padding, raw fragments) checked against
 * hand-computed fragment boxes, byte offsets, strides and buffer sizes, and
 * the fused layouts of real models synced end to end from and to a plain
 * layout with every destination element and surrounding byte checked. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <cmocka.h>

#include "reshard.h"
#include "support/harness.h"

/* ------------------------------------------------------------------ */
/* Helpers                                                             */
/* ------------------------------------------------------------------ */

#define SHAPE(...) ((const int64_t[]){__VA_ARGS__})
#define RANKS(...) ((const int[]){__VA_ARGS__})

/* One expected fragment. */
typedef struct xf {
  int t, b, nd;
  int64_t s[RESHARD_MAX_DIMS], e[RESHARD_MAX_DIMS], st[RESHARD_MAX_DIMS];
  size_t off;
} xf;

static void print_frag(const char *what, const reshard_fragment_info_t *f) {
  char line[512];
  int n = snprintf(line, sizeof line, "%s: tensor %d buffer %d ndim %d off %zu start {", what, f->tensor_id,
                   f->buffer_id, f->ndim, f->byte_offset);
  for (int d = 0; d < f->ndim; d++) n += snprintf(line + n, sizeof line - (size_t)n, "%s%lld", d ? "," : "", (long long)f->start[d]);
  n += snprintf(line + n, sizeof line - (size_t)n, "} extent {");
  for (int d = 0; d < f->ndim; d++) n += snprintf(line + n, sizeof line - (size_t)n, "%s%lld", d ? "," : "", (long long)f->extent[d]);
  n += snprintf(line + n, sizeof line - (size_t)n, "} strides {");
  for (int d = 0; d < f->ndim; d++) n += snprintf(line + n, sizeof line - (size_t)n, "%s%lld", d ? "," : "", (long long)f->strides[d]);
  snprintf(line + n, sizeof line - (size_t)n, "}");
  print_error("%s\n", line);
}

/* Rank's fragments must be exactly x[0..n) in canonical order. */
static void expect_frags_at(const reshard_layout_t *L, int rank, const xf *x,
                            size_t n, int line) {
  reshard_fragment_info_t got[64];
  size_t count = 999;
  reshard_result_t r = reshard_layout_fragments(L, rank, NULL, 0, &count);
  if (r != RESHARD_SUCCESS) fail_msg("line %d rank %d: layout_fragments failed: %s", line, rank, reshard_last_error());
  if (count > 64) fail_msg("line %d rank %d: %zu fragments", line, rank, count);
  size_t count2 = 999;
  assert_int_equal(reshard_layout_fragments(L, rank, got, 64, &count2), RESHARD_SUCCESS);
  assert_int_equal(count, count2);
  int bad = count != n;
  for (size_t i = 0; !bad && i < n; i++) {
    const reshard_fragment_info_t *g = &got[i];
    bad |= g->tensor_id != x[i].t || g->buffer_id != x[i].b || g->ndim != x[i].nd || g->byte_offset != x[i].off;
    for (int d = 0; d < x[i].nd; d++)
      bad |= g->start[d] != x[i].s[d] || g->extent[d] != x[i].e[d] || g->strides[d] != x[i].st[d];
  }
  if (!bad) return;
  print_error("line %d rank %d: expected %zu fragments, got %zu\n", line, rank, n, count);
  for (size_t i = 0; i < n; i++) {
    reshard_fragment_info_t w = {x[i].t, x[i].b, x[i].nd, {0}, {0}, {0}, x[i].off};
    memcpy(w.start, x[i].s, sizeof w.start);
    memcpy(w.extent, x[i].e, sizeof w.extent);
    memcpy(w.strides, x[i].st, sizeof w.strides);
    print_frag("  want", &w);
  }
  for (size_t i = 0; i < count; i++) print_frag("  got ", &got[i]);
  fail_msg("line %d rank %d: fragments differ", line, rank);
}
#define EXPECT_FRAGS(L, rank, x, n) expect_frags_at((L), (rank), (x), (n), __LINE__)
#define EXPECT_NO_FRAGS(L, rank) expect_frags_at((L), (rank), NULL, 0, __LINE__)
#define NELEM(a) (sizeof(a) / sizeof((a)[0]))

static void expect_bytes_at(const reshard_layout_t *L, int b, int rank,
                            size_t want, int line) {
  size_t got = 12345;
  reshard_result_t r = reshard_layout_buffer_bytes(L, b, rank, &got);
  if (r != RESHARD_SUCCESS) fail_msg("line %d buffer %d rank %d: buffer_bytes failed: %s", line, b, rank, reshard_last_error());
  if (got != want) fail_msg("line %d buffer %d rank %d: %zu bytes, expected %zu", line, b, rank, got, want);
}
#define EXPECT_BYTES(L, b, rank, want) expect_bytes_at((L), (b), (rank), (want), __LINE__)

static reshard_layout_t *new_layout(void) {
  reshard_layout_t *L = NULL;
  assert_int_equal(reshard_layout_create(&L), RESHARD_SUCCESS);
  return L;
}

static int add_tensor(reshard_layout_t *L, const char *name,
                      reshard_dtype_t dt, int ndim, const int64_t *shape) {
  int t = -1;
  reshard_result_t r = reshard_layout_add_tensor(L, name, dt, ndim, shape, &t);
  if (r) fail_msg("add_tensor '%s': %s", name, reshard_last_error());
  return t;
}

static int mesh_strided(reshard_layout_t *L, int ndim, const int *shape,
                        int start, int stride) {
  int m = -1;
  reshard_result_t r = reshard_layout_add_mesh_strided(L, ndim, shape, start, stride, &m);
  if (r) fail_msg("add_mesh_strided: %s", reshard_last_error());
  return m;
}

static int mesh_ranks(reshard_layout_t *L, int ndim, const int *shape,
                      const int *ranks) {
  int m = -1;
  reshard_result_t r = reshard_layout_add_mesh(L, ndim, shape, ranks, &m);
  if (r) fail_msg("add_mesh: %s", reshard_last_error());
  return m;
}

static int place(reshard_layout_t *L, int t, int m,
                 const reshard_placement_t *pl) {
  int b = -1;
  reshard_result_t r = reshard_layout_place(L, t, m, pl, &b);
  if (r) fail_msg("place tensor %d: %s", t, reshard_last_error());
  return b;
}

static int fused(reshard_layout_t *L, const char *name, int cd, int groups,
                 int nparts, const reshard_part_t *parts) {
  int b = -1;
  reshard_result_t r = reshard_layout_add_fused(L, name, cd, groups, nparts, parts, &b);
  if (r) fail_msg("add_fused '%s': %s", name, reshard_last_error());
  return b;
}

/* The logical tensors of a scenario, declared identically on both sides. */
typedef struct tspec {
  const char *name;
  reshard_dtype_t dt;
  int ndim;
  int64_t shape[RESHARD_MAX_DIMS];
} tspec;

static void add_tensors(reshard_layout_t *L, const tspec *ts, int n) {
  for (int i = 0; i < n; i++) assert_int_equal(add_tensor(L, ts[i].name, ts[i].dt, ts[i].ndim, ts[i].shape), i);
}

/* The plain side: every tensor Shard(0) (scalars replicated) over the 2
 * ranks start, start+1, each in a buffer of its own. */
static reshard_layout_t *plain_layout(const tspec *ts, int n, int start) {
  reshard_layout_t *L = new_layout();
  add_tensors(L, ts, n);
  int m = mesh_strided(L, 1, RANKS(2), start, 1);
  for (int i = 0; i < n; i++) {
    reshard_placement_t pl[1] = {ts[i].ndim ? reshard_shard(0) : reshard_replicate()};
    place(L, i, m, pl);
  }
  return L;
}

static void sync_ok(const reshard_layout_t *src, const reshard_layout_t *dst,
                    int nranks, size_t staging, const char *what) {
  th_sync_args a = {.src = src, .dst = dst, .opts = RESHARD_OPTIONS_INITIALIZER, .steps = 2};
  if (staging) a.opts.staging_bytes = staging;
  int64_t bad = th_sync(nranks, &a);
  if (bad) fail_msg("%s: th_sync over %d ranks (staging %zu) returned %lld", what, nranks, staging, (long long)bad);
  size_t moved = 0;
  for (int r = 0; r < nranks; r++) moved += a.recv_bytes[r] + a.local_bytes[r];
  if (!moved) fail_msg("%s: nothing moved", what);
}

/* Plain -> fused and fused -> plain, with the plain side both on other
 * ranks (after the fused side's `nfused` ranks) and colocated on ranks 0
 * and 1, and once with a tiny staging budget (many rounds). */
static void roundtrip(const tspec *ts, int n, const reshard_layout_t *fl,
                      int nfused, const char *what) {
  char label[128];
  reshard_layout_t *apart = plain_layout(ts, n, nfused);
  reshard_layout_t *colo = plain_layout(ts, n, 0);
  snprintf(label, sizeof label, "%s plain->fused", what);
  sync_ok(apart, fl, nfused + 2, 0, label);
  sync_ok(colo, fl, nfused < 2 ? 2 : nfused, 0, label);
  sync_ok(apart, fl, nfused + 2, 4096, label);
  snprintf(label, sizeof label, "%s fused->plain", what);
  sync_ok(fl, apart, nfused + 2, 0, label);
  sync_ok(fl, colo, nfused < 2 ? 2 : nfused, 0, label);
  sync_ok(fl, apart, nfused + 2, 4096, label);
  reshard_layout_destroy(apart);
  reshard_layout_destroy(colo);
}

/* ------------------------------------------------------------------ */
/* Shard(0): even (torch.chunk) and explicit split sizes               */
/* ------------------------------------------------------------------ */

static void shard_even_chunk(void **state) {
  (void)state;
  reshard_layout_t *L = new_layout();
  int a = add_tensor(L, "a", RESHARD_FP32, 2, SHAPE(5, 3)); /* 2,2,1,0 */
  int c = add_tensor(L, "c", RESHARD_INT8, 1, SHAPE(6));    /* 2,2,2,0 */
  int d = add_tensor(L, "d", RESHARD_FP64, 1, SHAPE(10));   /* 3,3,3,1 */
  int m = mesh_strided(L, 1, RANKS(4), 0, 1);
  reshard_placement_t s0[1] = {reshard_shard(0)};
  int ba = place(L, a, m, s0), bc = place(L, c, m, s0), bd = place(L, d, m, s0);
  assert_int_equal(reshard_layout_num_buffers(L), 3);

  xf r0[] = {{a, ba, 2, {0, 0}, {2, 3}, {3, 1}, 0}, {c, bc, 1, {0}, {2}, {1}, 0}, {d, bd, 1, {0}, {3}, {1}, 0}};
  xf r1[] = {{a, ba, 2, {2, 0}, {2, 3}, {3, 1}, 0}, {c, bc, 1, {2}, {2}, {1}, 0}, {d, bd, 1, {3}, {3}, {1}, 0}};
  xf r2[] = {{a, ba, 2, {4, 0}, {1, 3}, {3, 1}, 0}, {c, bc, 1, {4}, {2}, {1}, 0}, {d, bd, 1, {6}, {3}, {1}, 0}};
  xf r3[] = {{d, bd, 1, {9}, {1}, {1}, 0}}; /* a, c: empty pieces, no fragment */
  EXPECT_FRAGS(L, 0, r0, NELEM(r0));
  EXPECT_FRAGS(L, 1, r1, NELEM(r1));
  EXPECT_FRAGS(L, 2, r2, NELEM(r2));
  EXPECT_FRAGS(L, 3, r3, NELEM(r3));
  EXPECT_NO_FRAGS(L, 4); /* outside the mesh */
  size_t ab[] = {24, 24, 12, 0, 0}, cb[] = {2, 2, 2, 0, 0}, db[] = {24, 24, 24, 8, 0};
  for (int r = 0; r < 5; r++) {
    EXPECT_BYTES(L, ba, r, ab[r]);
    EXPECT_BYTES(L, bc, r, cb[r]);
    EXPECT_BYTES(L, bd, r, db[r]);
  }
  /* the two-call pattern: capacity 0 only counts; a short buffer gets a
   * prefix */
  size_t count = 0;
  assert_int_equal(reshard_layout_fragments(L, 0, NULL, 0, &count), RESHARD_SUCCESS);
  assert_int_equal(count, 3);
  reshard_fragment_info_t one[2];
  memset(one, 0x77, sizeof one);
  assert_int_equal(reshard_layout_fragments(L, 0, one, 1, &count), RESHARD_SUCCESS);
  assert_int_equal(count, 3);
  assert_int_equal(one[0].tensor_id, a);
  assert_int_equal(one[1].tensor_id, 0x77777777); /* untouched */

  /* end to end, with empty pieces on both sides */
  reshard_layout_t *P = new_layout();
  add_tensor(P, "a", RESHARD_FP32, 2, SHAPE(5, 3));
  add_tensor(P, "c", RESHARD_INT8, 1, SHAPE(6));
  add_tensor(P, "d", RESHARD_FP64, 1, SHAPE(10));
  int pm = mesh_strided(P, 1, RANKS(3), 4, 1);
  for (int t = 0; t < 3; t++) place(P, t, pm, s0);
  sync_ok(P, L, 7, 0, "even chunk");
  sync_ok(L, P, 7, 0, "even chunk back");
  reshard_layout_destroy(P);
  reshard_layout_destroy(L);
}

static void shard_split_sizes(void **state) {
  (void)state;
  reshard_layout_t *L = new_layout();
  int u = add_tensor(L, "u", RESHARD_BF16, 2, SHAPE(10, 2));
  int v = add_tensor(L, "v", RESHARD_FP32, 2, SHAPE(2, 7));
  int m4 = mesh_strided(L, 1, RANKS(4), 0, 1);
  int m2 = mesh_strided(L, 1, RANKS(2), 4, 1);
  int64_t su[4] = {1, 6, 0, 3}, sv[2] = {3, 4};
  reshard_placement_t pu[1] = {reshard_shard_sizes(0, su)};
  reshard_placement_t pv[1] = {reshard_shard_sizes(1, sv)};
  int bu = place(L, u, m4, pu), bv = place(L, v, m2, pv);
  /* the layout keeps its own copy of the sizes */
  su[0] = 5;
  su[1] = 2;
  sv[0] = 7;
  sv[1] = 0;
  xf r0[] = {{u, bu, 2, {0, 0}, {1, 2}, {2, 1}, 0}};
  xf r1[] = {{u, bu, 2, {1, 0}, {6, 2}, {2, 1}, 0}};
  xf r3[] = {{u, bu, 2, {7, 0}, {3, 2}, {2, 1}, 0}};
  xf r4[] = {{v, bv, 2, {0, 0}, {2, 3}, {3, 1}, 0}};
  xf r5[] = {{v, bv, 2, {0, 3}, {2, 4}, {4, 1}, 0}};
  EXPECT_FRAGS(L, 0, r0, 1);
  EXPECT_FRAGS(L, 1, r1, 1);
  EXPECT_NO_FRAGS(L, 2); /* split size 0 */
  EXPECT_FRAGS(L, 3, r3, 1);
  EXPECT_FRAGS(L, 4, r4, 1);
  EXPECT_FRAGS(L, 5, r5, 1);
  size_t ub[] = {4, 24, 0, 12, 0, 0}, vb[] = {0, 0, 0, 0, 24, 32};
  for (int r = 0; r < 6; r++) {
    EXPECT_BYTES(L, bu, r, ub[r]);
    EXPECT_BYTES(L, bv, r, vb[r]);
  }
  tspec ts[] = {{"u", RESHARD_BF16, 2, {10, 2}}, {"v", RESHARD_FP32, 2, {2, 7}}};
  roundtrip(ts, 2, L, 6, "split sizes");
  reshard_layout_destroy(L);
}

/* split_sizes that do not sum to the extent are accepted by the builder
 * (it cannot know the extent a later axis sees) and rejected by every
 * query that lowers them, naming the tensor and the rank. */
static reshard_layout_t *bad_split_layout(int nmesh, int start,
                                          const int64_t *sizes) {
  reshard_layout_t *L = new_layout();
  int t = add_tensor(L, "bad.w", RESHARD_FP32, 2, SHAPE(10, 2));
  int m = mesh_strided(L, 1, &nmesh, start, 1);
  reshard_placement_t pl[1] = {reshard_shard_sizes(0, sizes)};
  assert_int_equal(reshard_layout_place(L, t, m, pl, NULL), RESHARD_SUCCESS);
  return L;
}

static void expect_names(const char *msg, const char *tensor, int rank) {
  char want[32];
  snprintf(want, sizeof want, "rank %d", rank);
  if (!strstr(msg, tensor) || !strstr(msg, want))
    fail_msg("error message '%s' does not name tensor '%s' and '%s'", msg, tensor, want);
}

typedef struct bad_plan_arg {
  const reshard_layout_t *src, *dst;
  int holders; /* ranks [0, holders) hold the bad tensor */
  int blame;   /* >= 0: the rank others must name; -1: any holder */
} bad_plan_arg;

static int bad_plan_rank(int rank, reshard_comm_t *comm, void *p) {
  bad_plan_arg *a = p;
  reshard_options_t o = RESHARD_OPTIONS_INITIALIZER;
  reshard_plan_t *plan = NULL;
  reshard_result_t r = reshard_plan_create(comm, a->src, a->dst, &o, &plan);
  char msg[1024];
  snprintf(msg, sizeof msg, "%s", reshard_last_error());
  int ok = plan == NULL;
  reshard_plan_destroy(plan);
  if (rank < a->holders) {
    char want[32];
    snprintf(want, sizeof want, "rank %d", rank);
    ok &= r == RESHARD_ERROR_INVALID_ARGUMENT && strstr(msg, "bad.w") && strstr(msg, want);
  } else if (r != RESHARD_ERROR_REMOTE) {
    /* a rank that holds nothing of it learns of the failure from the
     * others, or finds it itself while looking for the holders; it must
     * then name a rank that holds the faulty piece */
    int names_holder = 0;
    for (int h = 0; h < a->holders; h++) {
      if (a->blame >= 0 && h != a->blame) continue;
      char want[32];
      snprintf(want, sizeof want, "rank %d:", h);
      names_holder |= strstr(msg, want) != NULL;
    }
    ok &= r == RESHARD_ERROR_INVALID_ARGUMENT && strstr(msg, "bad.w") && names_holder;
  }
  if (!ok) fprintf(stderr, "bad split plan, rank %d: result %d, '%s'\n", rank, (int)r, msg);
  return !ok;
}

static void shard_split_sizes_bad(void **state) {
  (void)state;
  const int64_t sizes[3] = {3, 3, 3}; /* 9 != 10 */
  reshard_layout_t *L = bad_split_layout(3, 4, sizes);
  size_t count = 77, bytes = 77;
  for (int r = 4; r < 7; r++) {
    assert_int_equal(reshard_layout_fragments(L, r, NULL, 0, &count), RESHARD_ERROR_INVALID_ARGUMENT);
    expect_names(reshard_last_error(), "bad.w", r);
    assert_int_equal(reshard_layout_buffer_bytes(L, 0, r, &bytes), RESHARD_ERROR_INVALID_ARGUMENT);
    expect_names(reshard_last_error(), "bad.w", r);
  }
  assert_int_equal(count, 77);
  assert_int_equal(bytes, 77);
  /* ranks outside the mesh are unaffected */
  assert_int_equal(reshard_layout_fragments(L, 0, NULL, 0, &count), RESHARD_SUCCESS);
  assert_int_equal(count, 0);
  reshard_layout_destroy(L);

  /* too many elements as well as too few */
  const int64_t big[3] = {4, 4, 4};
  L = bad_split_layout(3, 0, big);
  assert_int_equal(reshard_layout_fragments(L, 2, NULL, 0, &count), RESHARD_ERROR_INVALID_ARGUMENT);
  expect_names(reshard_last_error(), "bad.w", 2);
  reshard_layout_destroy(L);

  /* at plan time, on either side */
  tspec ts[] = {{"bad.w", RESHARD_FP32, 2, {10, 2}}};
  reshard_layout_t *bad = bad_split_layout(3, 0, sizes);
  reshard_layout_t *good = new_layout();
  add_tensors(good, ts, 1);
  int gm = mesh_strided(good, 1, RANKS(3), 0, 1);
  place(good, 0, gm, (reshard_placement_t[]){reshard_shard(0)});
  bad_plan_arg a1 = {good, bad, 3, -1};
  assert_int_equal(th_run_ranks(3, bad_plan_rank, &a1), 0);
  bad_plan_arg a2 = {bad, good, 3, -1};
  assert_int_equal(th_run_ranks(3, bad_plan_rank, &a2), 0);
  /* a fourth rank that holds only the other side */
  reshard_layout_t *one = new_layout();
  add_tensors(one, ts, 1);
  int om = mesh_strided(one, 1, RANKS(1), 3, 1);
  place(one, 0, om, (reshard_placement_t[]){reshard_replicate()});
  bad_plan_arg a3 = {one, bad, 3, -1};
  assert_int_equal(th_run_ranks(4, bad_plan_rank, &a3), 0);
  bad_plan_arg a4 = {bad, one, 3, -1};
  assert_int_equal(th_run_ranks(4, bad_plan_rank, &a4), 0);
  reshard_layout_destroy(one);
  reshard_layout_destroy(good);
  reshard_layout_destroy(bad);

  /* the later axis of [2, 2] over {3, 1, 0, 2} splits 5 rows into 3 + 3;
   * rank 4 sends rows [5, 10) only, so it meets the fault at mesh
   * position (1, 0): rank 0 */
  const int64_t s33[2] = {3, 3};
  bad = new_layout();
  add_tensors(bad, ts, 1);
  int bm = mesh_ranks(bad, 2, RANKS(2, 2), RANKS(3, 1, 0, 2));
  place(bad, 0, bm, (reshard_placement_t[]){reshard_shard(0), reshard_shard_sizes(0, s33)});
  for (int r = 0; r < 4; r++) {
    assert_int_equal(reshard_layout_fragments(bad, r, NULL, 0, &count), RESHARD_ERROR_INVALID_ARGUMENT);
    expect_names(reshard_last_error(), "bad.w", r);
  }
  reshard_layout_t *half = new_layout();
  add_tensors(half, ts, 1);
  int hb = -1;
  assert_int_equal(reshard_layout_add_buffer(half, "half", 4, 40, &hb), RESHARD_SUCCESS);
  reshard_fragment_t hf = {0, hb, SHAPE(5, 0), SHAPE(5, 2), 0, NULL};
  assert_int_equal(reshard_layout_add_fragment(half, &hf), RESHARD_SUCCESS);
  assert_int_equal(reshard_layout_allow_partial(half, 0), RESHARD_SUCCESS);
  bad_plan_arg a5 = {half, bad, 4, 0};
  assert_int_equal(th_run_ranks(5, bad_plan_rank, &a5), 0);
  reshard_layout_destroy(half);
  reshard_layout_destroy(bad);
}

/* ------------------------------------------------------------------ */
/* Multi-axis meshes                                                   */
/* ------------------------------------------------------------------ */

static void two_d_sharding(void **state) {
  (void)state;
  reshard_layout_t *L = new_layout();
  int w = add_tensor(L, "w", RESHARD_FP32, 2, SHAPE(5, 7));
  int x = add_tensor(L, "x", RESHARD_FP32, 2, SHAPE(5, 7));
  int m = mesh_strided(L, 2, RANKS(2, 3), 0, 1);
  int bw = place(L, w, m, (reshard_placement_t[]){reshard_shard(0), reshard_shard(1)});
  /* the other way round: axis 0 (2 ranks) splits dim 1, axis 1 dim 0 */
  int bx = place(L, x, m, (reshard_placement_t[]){reshard_shard(1), reshard_shard(0)});
  for (int r = 0; r < 6; r++) {
    int i = r / 3, j = r % 3;
    /* w: rows 3,2; cols 3,3,1.  x: cols 4,3; rows 2,2,1 */
    int64_t we0 = i ? 2 : 3, we1 = j == 2 ? 1 : 3;
    int64_t xe0 = j == 2 ? 1 : 2, xe1 = i ? 3 : 4;
    xf want[] = {{w, bw, 2, {3 * i, 3 * j}, {we0, we1}, {we1, 1}, 0},
                 {x, bx, 2, {2 * j, 4 * i}, {xe0, xe1}, {xe1, 1}, 0}};
    EXPECT_FRAGS(L, r, want, 2);
    EXPECT_BYTES(L, bw, r, (size_t)(we0 * we1 * 4));
    EXPECT_BYTES(L, bx, r, (size_t)(xe0 * xe1 * 4));
  }
  EXPECT_NO_FRAGS(L, 6);
  tspec ts[] = {{"w", RESHARD_FP32, 2, {5, 7}}, {"x", RESHARD_FP32, 2, {5, 7}}};
  roundtrip(ts, 2, L, 6, "2-D");
  reshard_layout_destroy(L);
}

static void tp_x_ep_same_dim(void **state) {
  (void)state;
  reshard_layout_t *L = new_layout();
  int w = add_tensor(L, "w", RESHARD_FP16, 2, SHAPE(10, 4));
  int y = add_tensor(L, "y", RESHARD_FP32, 1, SHAPE(10));
  int z = add_tensor(L, "z", RESHARD_INT32, 1, SHAPE(8));
  int m = mesh_strided(L, 2, RANKS(2, 2), 0, 1); /* [ep, tp] */
  int m3 = mesh_strided(L, 3, RANKS(2, 2, 2), 0, 1);
  /* the later axis splits the earlier one's piece: [0,5) -> [0,3),[3,5) */
  int bw = place(L, w, m, (reshard_placement_t[]){reshard_shard(0), reshard_shard(0)});
  /* the split sizes of the later axis sum to the earlier piece (5) */
  const int64_t s14[2] = {1, 4};
  int by = place(L, y, m, (reshard_placement_t[]){reshard_shard(0), reshard_shard_sizes(0, s14)});
  int bz = place(L, z, m3, (reshard_placement_t[]){reshard_shard(0), reshard_replicate(), reshard_shard(0)});
  const int64_t ws[4] = {0, 3, 5, 8}, we[4] = {3, 2, 3, 2};
  const int64_t ys[4] = {0, 1, 5, 6}, ye[4] = {1, 4, 1, 4};
  for (int r = 0; r < 8; r++) {
    xf want[3];
    size_t n = 0;
    if (r < 4) {
      want[n++] = (xf){w, bw, 2, {ws[r], 0}, {we[r], 4}, {4, 1}, 0};
      want[n++] = (xf){y, by, 1, {ys[r]}, {ye[r]}, {1}, 0};
      EXPECT_BYTES(L, bw, r, (size_t)(we[r] * 4 * 2));
      EXPECT_BYTES(L, by, r, (size_t)(ye[r] * 4));
    }
    int a0 = r / 4, a2 = r % 2; /* z: (S0, R, S0) */
    want[n++] = (xf){z, bz, 1, {4 * a0 + 2 * a2}, {2}, {1}, 0};
    EXPECT_FRAGS(L, r, want, n);
    EXPECT_BYTES(L, bz, r, 8);
  }
  tspec ts[] = {{"w", RESHARD_FP16, 2, {10, 4}}, {"y", RESHARD_FP32, 1, {10}}, {"z", RESHARD_INT32, 1, {8}}};
  roundtrip(ts, 3, L, 8, "tp x ep");
  reshard_layout_destroy(L);
}

/* ------------------------------------------------------------------ */
/* Fused buffers of real models                                        */
/* ------------------------------------------------------------------ */

/* vLLM qkv_proj with tp > num_kv_heads: K/V heads replicated over
 * tp/nkv ranks through a [nkv, tp/nkv] grid over the same ranks. */
static void vllm_qkv_kv_replicated(void **state) {
  (void)state;
  enum { TP = 4, NH = 8, NKV = 2, HD = 4, H = 16 };
  tspec ts[] = {{"q", RESHARD_BF16, 2, {NH * HD, H}},   {"k", RESHARD_BF16, 2, {NKV * HD, H}},
                {"v", RESHARD_BF16, 2, {NKV * HD, H}},  {"q.bias", RESHARD_BF16, 1, {NH * HD}},
                {"k.bias", RESHARD_BF16, 1, {NKV * HD}}, {"v.bias", RESHARD_BF16, 1, {NKV * HD}}};
  reshard_layout_t *L = new_layout();
  add_tensors(L, ts, 6);
  int qm = mesh_strided(L, 1, RANKS(TP), 0, 1);
  int kvm = mesh_strided(L, 2, RANKS(NKV, TP / NKV), 0, 1);
  reshard_placement_t qp[1] = {reshard_shard(0)};
  reshard_placement_t kvp[2] = {reshard_shard(0), reshard_replicate()};
  reshard_part_t w[3] = {{0, qm, qp, NULL}, {1, kvm, kvp, NULL}, {2, kvm, kvp, NULL}};
  reshard_part_t b[3] = {{3, qm, qp, NULL}, {4, kvm, kvp, NULL}, {5, kvm, kvp, NULL}};
  int bw = fused(L, "qkv_proj.weight", 0, 1, 3, w);
  int bb = fused(L, "qkv_proj.bias", 0, 1, 3, b);
  for (int r = 0; r < TP; r++) {
    int64_t kv = 4 * (r / 2); /* kv head r/2, 4 rows each */
    xf want[] = {{0, bw, 2, {8 * r, 0}, {8, 16}, {16, 1}, 0},
                 {1, bw, 2, {kv, 0}, {4, 16}, {16, 1}, 8 * 16 * 2},
                 {2, bw, 2, {kv, 0}, {4, 16}, {16, 1}, 12 * 16 * 2},
                 {3, bb, 1, {8 * r}, {8}, {1}, 0},
                 {4, bb, 1, {kv}, {4}, {1}, 8 * 2},
                 {5, bb, 1, {kv}, {4}, {1}, 12 * 2}};
    EXPECT_FRAGS(L, r, want, NELEM(want));
    EXPECT_BYTES(L, bw, r, 16 * 16 * 2);
    EXPECT_BYTES(L, bb, r, 16 * 2);
  }
  EXPECT_NO_FRAGS(L, TP);
  EXPECT_BYTES(L, bw, TP, 0);
  roundtrip(ts, 6, L, TP, "vllm qkv tp>nkv");
  reshard_layout_destroy(L);
}

static void vllm_qkv_tp_le_nkv(void **state) {
  (void)state;
  enum { TP = 2, NH = 8, NKV = 4, HD = 2, H = 8 };
  tspec ts[] = {{"q", RESHARD_FP16, 2, {NH * HD, H}}, {"k", RESHARD_FP16, 2, {NKV * HD, H}},
                {"v", RESHARD_FP16, 2, {NKV * HD, H}}};
  reshard_layout_t *L = new_layout();
  add_tensors(L, ts, 3);
  int m = mesh_strided(L, 1, RANKS(TP), 0, 1);
  reshard_placement_t p[1] = {reshard_shard(0)};
  reshard_part_t parts[3] = {{0, m, p, NULL}, {1, m, p, NULL}, {2, m, p, NULL}};
  int b = fused(L, "qkv_proj", 0, 1, 3, parts);
  for (int r = 0; r < TP; r++) {
    xf want[] = {{0, b, 2, {8 * r, 0}, {8, 8}, {8, 1}, 0},
                 {1, b, 2, {4 * r, 0}, {4, 8}, {8, 1}, 8 * 8 * 2},
                 {2, b, 2, {4 * r, 0}, {4, 8}, {8, 1}, 12 * 8 * 2}};
    EXPECT_FRAGS(L, r, want, 3);
    EXPECT_BYTES(L, b, r, 16 * 8 * 2);
  }
  roundtrip(ts, 3, L, TP, "vllm qkv tp<=nkv");
  reshard_layout_destroy(L);
}

/* Megatron fused QKV with GQA: per local KV group g, [q rows of g, k rows
 * of g, v rows of g]. */
static void megatron_interleaved_qkv(void **state) {
  (void)state;
  enum { NKV = 4, QPG = 2, HD = 2, H = 4 };
  tspec ts[] = {{"q", RESHARD_FP32, 2, {NKV * QPG * HD, H}}, {"k", RESHARD_FP32, 2, {NKV * HD, H}},
                {"v", RESHARD_FP32, 2, {NKV * HD, H}}};
  for (int tp = 2; tp <= 4; tp += 2) {
    reshard_layout_t *L = new_layout();
    add_tensors(L, ts, 3);
    int m = mesh_strided(L, 1, &tp, 0, 1);
    reshard_placement_t p[1] = {reshard_shard(0)};
    reshard_part_t parts[3] = {{0, m, p, NULL}, {1, m, p, NULL}, {2, m, p, NULL}};
    int b = fused(L, "query_key_value", 0, NKV, 3, parts);
    int local = NKV / tp;
    /* a group is 4 q rows + 2 k rows + 2 v rows = 8 rows of 4 floats */
    for (int r = 0; r < tp; r++) {
      xf want[12];
      size_t n = 0;
      for (int g = 0; g < local; g++) {
        int64_t G = r * local + g;
        size_t base = (size_t)g * 8 * H * 4;
        want[n++] = (xf){0, b, 2, {4 * G, 0}, {4, 4}, {4, 1}, base};
        want[n++] = (xf){1, b, 2, {2 * G, 0}, {2, 4}, {4, 1}, base + 4 * H * 4};
        want[n++] = (xf){2, b, 2, {2 * G, 0}, {2, 4}, {4, 1}, base + 6 * H * 4};
      }
      EXPECT_FRAGS(L, r, want, n);
      EXPECT_BYTES(L, b, r, (size_t)local * 8 * H * 4);
    }
    EXPECT_NO_FRAGS(L, tp);
    roundtrip(ts, 3, L, tp, tp == 2 ? "megatron qkv tp=2" : "megatron qkv tp=4");
    reshard_layout_destroy(L);
  }
  /* groups over a [2, 2] grid whose second axis also splits the hidden
   * dim: every fragment is a strided column block of its group's rows */
  reshard_layout_t *L = new_layout();
  add_tensors(L, ts, 3);
  int m = mesh_strided(L, 2, RANKS(2, 2), 0, 1);
  reshard_placement_t p[2] = {reshard_shard(0), reshard_shard(1)};
  reshard_part_t parts[3] = {{0, m, p, NULL}, {1, m, p, NULL}, {2, m, p, NULL}};
  int b = fused(L, "query_key_value", 0, NKV, 3, parts);
  for (int r = 0; r < 4; r++) {
    int i = r / 2, j = r % 2; /* groups 2i, 2i+1; columns [2j, 2j+2) */
    xf want[6];
    size_t n = 0;
    for (int g = 0; g < 2; g++) {
      int64_t G = 2 * i + g;
      size_t base = (size_t)g * 8 * 2 * 4; /* 8 rows of 2 floats a group */
      want[n++] = (xf){0, b, 2, {4 * G, 2 * j}, {4, 2}, {2, 1}, base};
      want[n++] = (xf){1, b, 2, {2 * G, 2 * j}, {2, 2}, {2, 1}, base + 4 * 2 * 4};
      want[n++] = (xf){2, b, 2, {2 * G, 2 * j}, {2, 2}, {2, 1}, base + 6 * 2 * 4};
    }
    EXPECT_FRAGS(L, r, want, n);
    EXPECT_BYTES(L, b, r, 16 * 2 * 4);
  }
  roundtrip(ts, 3, L, 4, "megatron qkv [2,2]");
  reshard_layout_destroy(L);
}

static void gate_up_concat(void **state) {
  (void)state;
  enum { TP = 4, I = 10, H = 4 };
  tspec ts[] = {{"gate", RESHARD_BF16, 2, {I, H}}, {"up", RESHARD_BF16, 2, {I, H}}};
  reshard_layout_t *L = new_layout();
  add_tensors(L, ts, 2);
  int m = mesh_strided(L, 1, RANKS(TP), 0, 1);
  reshard_placement_t p[1] = {reshard_shard(0)};
  reshard_part_t parts[2] = {{0, m, p, NULL}, {1, m, p, NULL}};
  int b = fused(L, "gate_up_proj", 0, 1, 2, parts);
  for (int r = 0; r < TP; r++) {
    int64_t rows = r < 3 ? 3 : 1; /* 10 over 4: 3,3,3,1 */
    xf want[] = {{0, b, 2, {3 * r, 0}, {rows, 4}, {4, 1}, 0},
                 {1, b, 2, {3 * r, 0}, {rows, 4}, {4, 1}, (size_t)(rows * 4 * 2)}};
    EXPECT_FRAGS(L, r, want, 2);
    EXPECT_BYTES(L, b, r, (size_t)(2 * rows * 4 * 2));
  }
  roundtrip(ts, 2, L, TP, "gate_up");
  reshard_layout_destroy(L);
}

/* Concatenation along dim 1: each part is a strided column block. And a
 * part whose mesh covers only some of the buffer's ranks. */
static void concat_dim1(void **state) {
  (void)state;
  tspec ts[] = {{"a", RESHARD_FP32, 2, {4, 3}}, {"b", RESHARD_FP32, 2, {4, 5}},
                {"c", RESHARD_FP32, 2, {4, 6}}, {"d", RESHARD_FP32, 2, {4, 2}},
                {"e", RESHARD_FP32, 2, {4, 2}}, {"f", RESHARD_FP32, 2, {2, 2}}};
  reshard_layout_t *L = new_layout();
  add_tensors(L, ts, 4);
  int m = mesh_strided(L, 1, RANKS(2), 0, 1);
  reshard_placement_t s0[1] = {reshard_shard(0)}, s1[1] = {reshard_shard(1)};
  reshard_part_t ab[2] = {{0, m, s0, NULL}, {1, m, s0, NULL}};
  reshard_part_t cd[2] = {{2, m, s1, NULL}, {3, m, s1, NULL}};
  int b0 = fused(L, "ab", 1, 1, 2, ab); /* local [2, 3+5] */
  int b1 = fused(L, "cd", 1, 1, 2, cd); /* local [4, 3+1] */
  for (int r = 0; r < 2; r++) {
    xf want[] = {{0, b0, 2, {2 * r, 0}, {2, 3}, {8, 1}, 0},
                 {1, b0, 2, {2 * r, 0}, {2, 5}, {8, 1}, 3 * 4},
                 {2, b1, 2, {0, 3 * r}, {4, 3}, {4, 1}, 0},
                 {3, b1, 2, {0, r}, {4, 1}, {4, 1}, 3 * 4}};
    EXPECT_FRAGS(L, r, want, 4);
    EXPECT_BYTES(L, b0, r, 2 * 8 * 4);
    EXPECT_BYTES(L, b1, r, 4 * 4 * 4);
  }
  roundtrip(ts, 4, L, 2, "concat dim 1");
  reshard_layout_destroy(L);

  /* e on ranks 0..3, f on ranks 2 and 3 only: one row of each */
  L = new_layout();
  add_tensors(L, ts + 4, 2);
  int m4 = mesh_strided(L, 1, RANKS(4), 0, 1);
  int m23 = mesh_ranks(L, 1, RANKS(2), RANKS(2, 3));
  int b2 = fused(L, "ef", 0, 1, 2, (reshard_part_t[]){{0, m4, s0, NULL}, {1, m23, s0, NULL}});
  for (int r = 0; r < 4; r++) {
    xf want[2] = {{0, b2, 2, {r, 0}, {1, 2}, {2, 1}, 0}, {1, b2, 2, {r - 2, 0}, {1, 2}, {2, 1}, 1 * 2 * 4}};
    EXPECT_FRAGS(L, r, want, r < 2 ? 1 : 2);
    EXPECT_BYTES(L, b2, r, r < 2 ? 1 * 2 * 4 : 2 * 2 * 4);
  }
  roundtrip(ts + 4, 2, L, 4, "partial part mesh");
  reshard_layout_destroy(L);
}

static void padded_vocab(void **state) {
  (void)state;
  tspec ts[] = {{"embed", RESHARD_BF16, 2, {1000, 8}},
                {"tiny", RESHARD_FP32, 2, {10, 2}},
                {"wide", RESHARD_FP32, 2, {3, 5}}};
  reshard_layout_t *L = new_layout();
  add_tensors(L, ts, 3);
  int m4 = mesh_strided(L, 1, RANKS(4), 0, 1);
  int m8 = mesh_strided(L, 1, RANKS(8), 0, 1);
  reshard_placement_t p[1] = {reshard_shard(0)};
  reshard_part_t e = {0, m4, p, SHAPE(1024, 8)};
  reshard_part_t t = {1, m8, p, SHAPE(64, 2)};
  int be = fused(L, "embed", 0, 1, 1, &e);
  int bt = fused(L, "tiny", 0, 1, 1, &t);
  /* padding off the sharded dim too: rows of 8 floats hold 5 */
  int m2 = mesh_strided(L, 1, RANKS(2), 0, 1);
  reshard_part_t wd = {2, m2, p, SHAPE(4, 8)};
  int bw = fused(L, "wide", 0, 1, 1, &wd);
  for (int r = 0; r < 8; r++) {
    xf want[3];
    size_t n = 0;
    if (r < 4) /* rank 3: rows [768, 1000) of a 256-row buffer */
      want[n++] = (xf){0, be, 2, {256 * r, 0}, {r < 3 ? 256 : 232, 8}, {8, 1}, 0};
    if (r < 2) /* tiny: rows [0,8), [8,10); ranks 2..7 all padding */
      want[n++] = (xf){1, bt, 2, {8 * r, 0}, {r ? 2 : 8, 2}, {2, 1}, 0};
    if (r < 2) /* rows [0,2), [2,3) of padded [0,2), [2,4) */
      want[n++] = (xf){2, bw, 2, {2 * r, 0}, {r ? 1 : 2, 5}, {8, 1}, 0};
    EXPECT_FRAGS(L, r, want, n);
    EXPECT_BYTES(L, bw, r, r < 2 ? 2 * 8 * 4 : 0);
    EXPECT_BYTES(L, be, r, r < 4 ? 256 * 8 * 2 : 0);
    EXPECT_BYTES(L, bt, r, 8 * 2 * 4);
  }
  EXPECT_BYTES(L, bt, 8, 0);
  roundtrip(ts, 3, L, 8, "padded vocab");
  reshard_layout_destroy(L);
}

static void moe_experts(void **state) {
  (void)state;
  enum { E = 4, I = 6, H = 4 };
  tspec ts[] = {{"experts.w2", RESHARD_FP32, 3, {E, I, H}}, {"gate", RESHARD_FP16, 3, {E, I, H}},
                {"up", RESHARD_FP16, 3, {E, I, H}},         {"gate.tp", RESHARD_FP16, 3, {E, I, H}},
                {"up.tp", RESHARD_FP16, 3, {E, I, H}}};
  reshard_layout_t *L = new_layout();
  add_tensors(L, ts, 5);
  int ep = mesh_strided(L, 1, RANKS(2), 0, 1);
  int eptp = mesh_strided(L, 2, RANKS(2, 2), 0, 1);
  reshard_placement_t s0[1] = {reshard_shard(0)};
  reshard_placement_t s0s1[2] = {reshard_shard(0), reshard_shard(1)};
  int bw2 = place(L, 0, ep, s0);
  int b13 = fused(L, "w13", 1, 1, 2, (reshard_part_t[]){{1, ep, s0, NULL}, {2, ep, s0, NULL}});
  int b13tp = fused(L, "w13.tp", 1, 1, 2, (reshard_part_t[]){{3, eptp, s0s1, NULL}, {4, eptp, s0s1, NULL}});
  for (int r = 0; r < 4; r++) {
    xf want[5];
    size_t n = 0;
    if (r < 2) {
      want[n++] = (xf){0, bw2, 3, {2 * r, 0, 0}, {2, 6, 4}, {24, 4, 1}, 0};
      /* local [2, 6+6, 4] */
      want[n++] = (xf){1, b13, 3, {2 * r, 0, 0}, {2, 6, 4}, {48, 4, 1}, 0};
      want[n++] = (xf){2, b13, 3, {2 * r, 0, 0}, {2, 6, 4}, {48, 4, 1}, 6 * 4 * 2};
    }
    int e = r / 2, t = r % 2; /* local [2, 3+3, 4] */
    want[n++] = (xf){3, b13tp, 3, {2 * e, 3 * t, 0}, {2, 3, 4}, {24, 4, 1}, 0};
    want[n++] = (xf){4, b13tp, 3, {2 * e, 3 * t, 0}, {2, 3, 4}, {24, 4, 1}, 3 * 4 * 2};
    EXPECT_FRAGS(L, r, want, n);
    EXPECT_BYTES(L, bw2, r, r < 2 ? 2 * 6 * 4 * 4 : 0);
    EXPECT_BYTES(L, b13, r, r < 2 ? 2 * 12 * 4 * 2 : 0);
    EXPECT_BYTES(L, b13tp, r, 2 * 6 * 4 * 2);
  }
  roundtrip(ts, 5, L, 4, "moe w13");
  reshard_layout_destroy(L);
}

/* Windows: Megatron-core's grouped experts (TEGroupedMLP,
 * megatron/core/transformer/moe/experts.py) keep one parameter per local
 * expert, linear_fc1.weight<i>, holding on EP rank r expert r * E/ep + i
 * ([gate shard; up shard] over ETP). Stacked gate/up [E=4, I=6, H=4], ep 2
 * x etp 2 over ranks 0..3 (etp fastest): buffer weight<i> is, per EP rank
 * r, the windows (r*2+i, 0, 0) + (1, 6, 4) of gate and up on ranks
 * {2r, 2r+1} with (Replicate, Shard(1)) over [expert-DP 1, etp 2]. */
static void windows_grouped_experts(void **state) {
  (void)state;
  enum { E = 4, I = 6, H = 4 };
  tspec ts[] = {{"gate", RESHARD_FP16, 3, {E, I, H}}, {"up", RESHARD_FP16, 3, {E, I, H}},
                {"router", RESHARD_FP32, 2, {E, H}}};
  reshard_layout_t *L = new_layout();
  add_tensors(L, ts, 3);
  int em[2] = {mesh_strided(L, 2, RANKS(1, 2), 0, 1), mesh_strided(L, 2, RANKS(1, 2), 2, 1)};
  reshard_placement_t rs1[2] = {reshard_replicate(), reshard_shard(1)};
  int64_t org[2][2][3];
  const int64_t win[3] = {1, I, H};
  int bw[2];
  for (int i = 0; i < 2; i++) {
    reshard_part_t parts[4];
    const int64_t *origins[4];
    for (int r = 0; r < 2; r++) {
      org[i][r][0] = r * 2 + i;
      org[i][r][1] = org[i][r][2] = 0;
      parts[2 * r] = (reshard_part_t){0, em[r], rs1, win};
      parts[2 * r + 1] = (reshard_part_t){1, em[r], rs1, win};
      origins[2 * r] = origins[2 * r + 1] = org[i][r];
    }
    char name[32];
    snprintf(name, sizeof name, "linear_fc1.weight%d", i);
    reshard_result_t res = reshard_layout_add_windows(L, name, 1, 4, parts, origins, &bw[i]);
    if (res) fail_msg("add_windows: %s", reshard_last_error());
  }
  /* EPLB-style: overlapping windows of the router on meshes without a
   * common rank: rows 0..2 on rank 0, rows 1..5 on rank 3 (one of them
   * padding). */
  int m0 = mesh_ranks(L, 1, RANKS(1), RANKS(0)), m3 = mesh_ranks(L, 1, RANKS(1), RANKS(3));
  reshard_placement_t rep[1] = {reshard_replicate()};
  reshard_part_t slot[2] = {{2, m0, rep, SHAPE(2, H)}, {2, m3, rep, SHAPE(4, H)}};
  const int64_t *so[2] = {SHAPE(0, 0), SHAPE(1, 0)};
  int bs = -1;
  assert_int_equal(reshard_layout_add_windows(L, "slot", 0, 2, slot, so, &bs), RESHARD_SUCCESS);
  for (int rank = 0; rank < 4; rank++) {
    int r = rank / 2, t = rank % 2;
    xf want[5];
    size_t n = 0;
    for (int i = 0; i < 2; i++) { /* local [1, 3 + 3, 4] fp16 */
      want[n++] = (xf){0, bw[i], 3, {r * 2 + i, 3 * t, 0}, {1, 3, 4}, {24, 4, 1}, 0};
      want[n++] = (xf){1, bw[i], 3, {r * 2 + i, 3 * t, 0}, {1, 3, 4}, {24, 4, 1}, 3 * 4 * 2};
      EXPECT_BYTES(L, bw[i], rank, 6 * 4 * 2);
    }
    if (rank == 0) want[n++] = (xf){2, bs, 2, {0, 0}, {2, 4}, {4, 1}, 0};
    if (rank == 3) want[n++] = (xf){2, bs, 2, {1, 0}, {3, 4}, {4, 1}, 0};
    EXPECT_FRAGS(L, rank, want, n);
    EXPECT_BYTES(L, bs, rank, rank == 0 ? 2 * 4 * 4 : rank == 3 ? 4 * 4 * 4 : 0);
  }
  roundtrip(ts, 3, L, 4, "grouped experts");
  reshard_layout_destroy(L);

  /* What windows refuse, leaving the layout unchanged. */
  L = new_layout();
  add_tensors(L, ts, 3);
  int m = mesh_strided(L, 1, RANKS(2), 0, 1);
  reshard_placement_t s0[1] = {reshard_shard(0)};
  const struct {
    reshard_part_t parts[2];
    const int64_t *origins[2];
    int nparts, groups;
    const char *says;
  } bad[] = {
      {{{0, m, s0, SHAPE(2, I, H)}, {0, m, s0, SHAPE(2, I, H)}}, {SHAPE(0, 0, 0), SHAPE(1, 0, 0)}, 2, 1,
       "overlapping windows of tensor 'gate'"},
      {{{0, m, s0, SHAPE(1, I, H)}, {0, m, s0, NULL}}, {SHAPE(0, 0, 0), NULL}, 2, 1, "appears twice"},
      {{{0, m, s0, SHAPE(1, I, H)}}, {SHAPE(5, 0, 0)}, 1, 1, "origin[0] = 5"},
      {{{0, m, s0, SHAPE(1, I, H)}}, {SHAPE(0, -1, 0)}, 1, 1, "origin[1] = -1"},
      {{{0, m, s0, SHAPE(1, -2, H)}}, {SHAPE(0, 0, 0)}, 1, 1, "window shape[1] = -2"},
  };
  for (size_t k = 0; k < NELEM(bad); k++) {
    int b = -7;
    reshard_result_t res = reshard_layout_add_windows(L, "bad", 0, bad[k].nparts, bad[k].parts, bad[k].origins, &b);
    if (res != RESHARD_ERROR_INVALID_ARGUMENT || !strstr(reshard_last_error(), bad[k].says))
      fail_msg("bad window %zu: result %d, '%s' (expected to say '%s')", k, res, reshard_last_error(), bad[k].says);
    assert_int_equal(b, -7);
    assert_int_equal(reshard_layout_num_buffers(L), 0);
  }
  /* an empty window beside others: refused at once (its extents off the
   * concat dim could not match theirs), not at lowering time */
  {
    reshard_part_t two[2] = {{0, m, s0, SHAPE(1, I, H)}, {0, m, s0, NULL}};
    const int64_t *o2[2] = {SHAPE(0, 0, 0), SHAPE(E, I, H)};
    assert_int_equal(reshard_layout_add_windows(L, "empty", 0, 2, two, o2, NULL), RESHARD_ERROR_INVALID_ARGUMENT);
    assert_non_null(strstr(reshard_last_error(), "the window is empty on dim 1"));
    /* empty along the concat dim only: no element, no overlap */
    reshard_part_t rows[2] = {{0, m, s0, SHAPE(1, I, H)}, {0, m, s0, SHAPE(0, I, H)}};
    const int64_t *o3[2] = {SHAPE(2, 0, 0), SHAPE(2, 0, 0)};
    int b = -1;
    assert_int_equal(reshard_layout_add_windows(L, "zero-rows", 0, 2, rows, o3, &b), RESHARD_SUCCESS);
    xf z[] = {{0, b, 3, {2, 0, 0}, {1, I, H}, {I * H, H, 1}, 0}};
    EXPECT_FRAGS(L, 0, z, 1);
    reshard_layout_destroy(L);
    L = new_layout();
    add_tensors(L, ts, 3);
    m = mesh_strided(L, 1, RANKS(2), 0, 1);
  }
  /* disjoint windows of one tensor on one rank are fine */
  reshard_part_t two[2] = {{0, m, s0, SHAPE(1, I, H)}, {0, m, s0, SHAPE(1, I, H)}};
  const int64_t *o2[2] = {SHAPE(3, 0, 0), SHAPE(0, 0, 0)};
  assert_int_equal(reshard_layout_add_windows(L, "two", 0, 2, two, o2, NULL), RESHARD_SUCCESS);
  /* rank 0 holds the first row of each window, rank 1 nothing (1 row split 2 ways) */
  xf w0[] = {{0, 0, 3, {3, 0, 0}, {1, I, H}, {I * H, H, 1}, 0}, {0, 0, 3, {0, 0, 0}, {1, I, H}, {I * H, H, 1}, I * H * 2}};
  EXPECT_FRAGS(L, 0, w0, 2);
  EXPECT_NO_FRAGS(L, 1);
  reshard_layout_destroy(L);
}

/* One tensor in more windows of one buffer than its holder list had room
 * for (it grows by doubling from 16): every window recorded (ASan found the
 * list written past its end once, with ep >= 32 experts' windows). 40 rows,
 * one window each, alternating between two ranks, plus earlier buffers of
 * the tensor; every row round-trips. */
static void windows_many_of_one_tensor(void **state) {
  (void)state;
  enum { R = 40, C = 3 };
  tspec ts[] = {{"stack", RESHARD_INT32, 2, {R, C}}};
  reshard_layout_t *L = new_layout();
  add_tensors(L, ts, 1);
  int mr[2] = {mesh_ranks(L, 1, RANKS(1), RANKS(0)), mesh_ranks(L, 1, RANKS(1), RANKS(1))};
  reshard_placement_t rep[1] = {reshard_replicate()};
  for (int k = 0; k < 14; k++) place(L, 0, mr[k % 2], rep);
  reshard_part_t parts[R];
  int64_t org[R][2];
  const int64_t *origins[R];
  const int64_t win[2] = {1, C};
  for (int r = 0; r < R; r++) {
    org[r][0] = r;
    org[r][1] = 0;
    origins[r] = org[r];
    parts[r] = (reshard_part_t){0, mr[r % 2], rep, win};
  }
  int b = -1;
  assert_int_equal(reshard_layout_add_windows(L, "rows", 0, R, parts, origins, &b), RESHARD_SUCCESS);
  for (int rank = 0; rank < 2; rank++) { /* after the 14 whole copies, rows rank, rank + 2, ... */
    reshard_fragment_info_t f[14 + R];
    size_t n = 0;
    assert_int_equal(reshard_layout_fragments(L, rank, f, 14 + R, &n), RESHARD_SUCCESS);
    assert_int_equal(n, 7 + R / 2);
    for (int k = 0; k < R / 2; k++) {
      assert_int_equal(f[7 + k].buffer_id, b);
      assert_int_equal(f[7 + k].start[0], 2 * k + rank);
      assert_int_equal(f[7 + k].byte_offset, (size_t)k * C * 4);
    }
  }
  EXPECT_BYTES(L, b, 0, (R / 2) * C * 4);
  roundtrip(ts, 1, L, 2, "many windows");
  reshard_layout_destroy(L);
}

/* Buffers by name: place_named, a name repeated on two meshes (one per
 * pipeline stage), lookups by (name, rank) and back. */
static void buffer_names(void **state) {
  (void)state;
  reshard_layout_t *L = new_layout();
  int a = add_tensor(L, "a", RESHARD_FP32, 1, SHAPE(4)), b = add_tensor(L, "b", RESHARD_FP32, 1, SHAPE(4));
  int m0 = mesh_strided(L, 1, RANKS(2), 0, 1), m1 = mesh_strided(L, 1, RANKS(2), 2, 1);
  reshard_placement_t rep[1] = {reshard_replicate()};
  int pa = -1, pb = -1, pc = -1;
  assert_int_equal(reshard_layout_place_named(L, "layers.0.weight", a, m0, rep, &pa), RESHARD_SUCCESS);
  assert_int_equal(reshard_layout_place_named(L, "layers.0.weight", b, m1, rep, &pb), RESHARD_SUCCESS);
  assert_int_equal(reshard_layout_place_named(L, NULL, a, m1, rep, &pc), RESHARD_SUCCESS);
  const char *n = NULL;
  assert_int_equal(reshard_layout_buffer_name(L, pc, &n), RESHARD_SUCCESS);
  assert_string_equal(n, "a"); /* NULL: the tensor's name */
  int id = -1;
  assert_int_equal(reshard_layout_find_buffer(L, "layers.0.weight", 1, &id), RESHARD_SUCCESS);
  assert_int_equal(id, pa);
  assert_int_equal(reshard_layout_find_buffer(L, "layers.0.weight", 3, &id), RESHARD_SUCCESS);
  assert_int_equal(id, pb);
  assert_int_equal(reshard_layout_find_buffer(L, "a", 2, &id), RESHARD_SUCCESS);
  assert_int_equal(id, pc);
  assert_int_equal(reshard_layout_find_buffer(L, "a", -1, &id), RESHARD_SUCCESS); /* the only one */
  assert_int_equal(reshard_layout_find_buffer(L, "layers.0.weight", -1, &id), RESHARD_ERROR_INVALID_ARGUMENT);
  assert_non_null(strstr(reshard_last_error(), "give the rank"));
  assert_int_equal(reshard_layout_find_buffer(L, "a", 0, &id), RESHARD_ERROR_INVALID_ARGUMENT);
  assert_non_null(strstr(reshard_last_error(), "rank 0 holds no buffer named 'a'"));
  assert_int_equal(reshard_layout_find_buffer(L, "nope", 0, &id), RESHARD_ERROR_INVALID_ARGUMENT);
  assert_non_null(strstr(reshard_last_error(), "no buffer named 'nope'"));
  /* a third of the name on ranks 0-1: rank 1 then holds two */
  int pd = -1;
  assert_int_equal(reshard_layout_place_named(L, "layers.0.weight", b, m0, rep, &pd), RESHARD_SUCCESS);
  assert_int_equal(reshard_layout_find_buffer(L, "layers.0.weight", 1, &id), RESHARD_ERROR_INVALID_ARGUMENT);
  assert_non_null(strstr(reshard_last_error(), "holds two buffers named"));
  assert_int_equal(reshard_layout_find_buffer(L, "layers.0.weight", 2, &id), RESHARD_SUCCESS);
  assert_int_equal(id, pb);
  assert_int_equal(reshard_layout_buffer_name(L, 99, &n), RESHARD_ERROR_INVALID_ARGUMENT);
  assert_int_equal(reshard_layout_find_buffer(NULL, "a", 0, &id), RESHARD_ERROR_INVALID_ARGUMENT);
  reshard_layout_destroy(L);
}

/* ------------------------------------------------------------------ */
/* Small and degenerate tensors                                        */
/* ------------------------------------------------------------------ */

static void norms_biases_scalars(void **state) {
  (void)state;
  tspec ts[] = {{"norm", RESHARD_BF16, 1, {8}},
                {"bias", RESHARD_FP32, 1, {10}},
                {"step", RESHARD_FP64, 0, {0}},
                {"temp", RESHARD_FP32, 0, {0}}};
  reshard_layout_t *L = new_layout();
  add_tensors(L, ts, 4);
  int m4 = mesh_strided(L, 1, RANKS(4), 0, 1);
  int m3 = mesh_strided(L, 1, RANKS(3), 0, 1);
  int m1 = mesh_ranks(L, 1, RANKS(1), RANKS(2));
  reshard_placement_t rep[1] = {reshard_replicate()}, s0[1] = {reshard_shard(0)};
  int bn = place(L, 0, m4, rep);
  int bb = place(L, 1, m3, s0);
  int bs = place(L, 2, m4, rep);
  int bt = place(L, 3, m1, rep);
  const int64_t bs0[3] = {0, 4, 8}, be[3] = {4, 4, 2};
  for (int r = 0; r < 4; r++) {
    xf want[4];
    size_t n = 0;
    want[n++] = (xf){0, bn, 1, {0}, {8}, {1}, 0};
    if (r < 3) want[n++] = (xf){1, bb, 1, {bs0[r]}, {be[r]}, {1}, 0};
    want[n++] = (xf){2, bs, 0, {0}, {0}, {0}, 0};
    if (r == 2) want[n++] = (xf){3, bt, 0, {0}, {0}, {0}, 0};
    EXPECT_FRAGS(L, r, want, n);
    EXPECT_BYTES(L, bn, r, 16);
    EXPECT_BYTES(L, bb, r, r < 3 ? (size_t)be[r] * 4 : 0);
    EXPECT_BYTES(L, bs, r, 8);
    EXPECT_BYTES(L, bt, r, r == 2 ? 4 : 0);
  }
  roundtrip(ts, 4, L, 4, "norms, biases, scalars");
  reshard_layout_destroy(L);
}

static void zero_size(void **state) {
  (void)state;
  tspec ts[] = {{"z0", RESHARD_FP32, 2, {0, 4}},
                {"z1", RESHARD_FP32, 2, {4, 0}},
                {"z2", RESHARD_INT8, 3, {3, 0, 5}}};
  reshard_layout_t *L = new_layout();
  add_tensors(L, ts, 3);
  int m = mesh_strided(L, 1, RANKS(2), 0, 1);
  int b0 = place(L, 0, m, (reshard_placement_t[]){reshard_replicate()});
  int b1 = place(L, 1, m, (reshard_placement_t[]){reshard_shard(1)});
  int b2 = place(L, 2, m, (reshard_placement_t[]){reshard_shard(0)});
  for (int r = 0; r < 3; r++) {
    EXPECT_NO_FRAGS(L, r);
    EXPECT_BYTES(L, b0, r, 0);
    EXPECT_BYTES(L, b1, r, 0);
    EXPECT_BYTES(L, b2, r, 0);
  }
  /* a plan over them succeeds and moves nothing, apart and colocated */
  reshard_layout_t *P = plain_layout(ts, 3, 2);
  for (int dir = 0; dir < 2; dir++) {
    th_sync_args a = {.src = dir ? L : P, .dst = dir ? P : L, .opts = RESHARD_OPTIONS_INITIALIZER, .steps = 1};
    assert_int_equal(th_sync(4, &a), 0);
    for (int r = 0; r < 4; r++) {
      assert_int_equal(a.send_bytes[r], 0);
      assert_int_equal(a.recv_bytes[r], 0);
      assert_int_equal(a.local_bytes[r], 0);
    }
  }
  reshard_layout_destroy(P);

  /* an empty part in a fused buffer takes no room */
  tspec fs[] = {{"zq", RESHARD_FP32, 2, {0, 4}}, {"zk", RESHARD_FP32, 2, {3, 4}}};
  reshard_layout_t *F = new_layout();
  add_tensors(F, fs, 2);
  m = mesh_strided(F, 1, RANKS(2), 0, 1);
  reshard_placement_t s0[1] = {reshard_shard(0)};
  int bf = fused(F, "zqk", 0, 1, 2, (reshard_part_t[]){{0, m, s0, NULL}, {1, m, s0, NULL}});
  xf f0[] = {{1, bf, 2, {0, 0}, {2, 4}, {4, 1}, 0}};
  xf f1[] = {{1, bf, 2, {2, 0}, {1, 4}, {4, 1}, 0}};
  EXPECT_FRAGS(F, 0, f0, 1);
  EXPECT_FRAGS(F, 1, f1, 1);
  EXPECT_BYTES(F, bf, 0, 32);
  EXPECT_BYTES(F, bf, 1, 16);
  roundtrip(fs, 2, F, 2, "empty fused part");
  reshard_layout_destroy(F);
  reshard_layout_destroy(L);
}

/* ------------------------------------------------------------------ */
/* Meshes over explicit and strided ranks                              */
/* ------------------------------------------------------------------ */

static void mesh_rank_lists(void **state) {
  (void)state;
  tspec ts[] = {{"x", RESHARD_INT32, 2, {8, 2}},
                {"y", RESHARD_FP32, 2, {6, 4}},
                {"s", RESHARD_FP16, 1, {7}},
                {"r", RESHARD_FP32, 1, {6}}};
  reshard_layout_t *L = new_layout();
  add_tensors(L, ts, 4);
  int m1 = mesh_ranks(L, 1, RANKS(4), RANKS(7, 2, 5, 0));
  int m2 = mesh_ranks(L, 2, RANKS(2, 2), RANKS(7, 2, 5, 0));
  int ms = mesh_strided(L, 1, RANKS(3), 2, 3);    /* 2, 5, 8 */
  int ms2 = mesh_strided(L, 2, RANKS(2, 2), 1, 2); /* 1, 3, 5, 7 */
  int bx = place(L, 0, m1, (reshard_placement_t[]){reshard_shard(0)});
  int by = place(L, 1, m2, (reshard_placement_t[]){reshard_shard(0), reshard_shard(1)});
  int bs = place(L, 2, ms, (reshard_placement_t[]){reshard_shard(0)});
  int br = place(L, 3, ms2, (reshard_placement_t[]){reshard_replicate(), reshard_shard(0)});
  for (int r = 0; r < 10; r++) {
    xf want[4];
    size_t n = 0;
    int px = r == 7 ? 0 : r == 2 ? 1 : r == 5 ? 2 : r == 0 ? 3 : -1; /* position in {7,2,5,0} */
    if (px >= 0) {
      want[n++] = (xf){0, bx, 2, {2 * px, 0}, {2, 2}, {2, 1}, 0};
      want[n++] = (xf){1, by, 2, {3 * (px / 2), 2 * (px % 2)}, {3, 2}, {2, 1}, 0};
    }
    int ps = r % 3 == 2 ? r / 3 : -1; /* 2, 5, 8 */
    if (ps >= 0) want[n++] = (xf){2, bs, 1, {3 * ps}, {ps == 2 ? 1 : 3}, {1}, 0};
    if (r % 2 == 1 && r < 8) want[n++] = (xf){3, br, 1, {3 * ((r / 2) % 2)}, {3}, {1}, 0};
    EXPECT_FRAGS(L, r, want, n);
    EXPECT_BYTES(L, bx, r, px >= 0 ? 16 : 0);
    EXPECT_BYTES(L, by, r, px >= 0 ? 24 : 0);
    EXPECT_BYTES(L, bs, r, ps >= 0 ? (ps == 2 ? 2 : 6) : 0);
    EXPECT_BYTES(L, br, r, r % 2 == 1 && r < 8 ? 12 : 0);
  }
  roundtrip(ts, 4, L, 9, "explicit and strided meshes");
  reshard_layout_destroy(L);
}

/* ------------------------------------------------------------------ */
/* Raw buffers with explicit fragments                                 */
/* ------------------------------------------------------------------ */

static void add_frag(reshard_layout_t *L, int t, int b, const int64_t *s,
                     const int64_t *e, size_t off, const int64_t *st) {
  reshard_fragment_t f = {t, b, s, e, off, st};
  reshard_result_t r = reshard_layout_add_fragment(L, &f);
  if (r) fail_msg("add_fragment: %s", reshard_last_error());
}

static void raw_buffers(void **state) {
  (void)state;
  tspec ts[] = {{"T", RESHARD_FP32, 2, {4, 6}}, {"U", RESHARD_INT64, 1, {3}}};
  reshard_layout_t *L = new_layout();
  add_tensors(L, ts, 2);
  int b0 = -1, b1 = -1;
  assert_int_equal(reshard_layout_add_buffer(L, "empty", 0, 0, &b0), RESHARD_SUCCESS);
  assert_int_equal(reshard_layout_add_buffer(L, "r1", 1, 200, &b1), RESHARD_SUCCESS);
  add_frag(L, 0, b1, SHAPE(1, 2), SHAPE(2, 3), 8, NULL);        /* dense: {3, 1} */
  add_frag(L, 1, b1, SHAPE(0), SHAPE(3), 40, SHAPE(2));          /* every other */
  add_frag(L, 0, b1, SHAPE(3, 0), SHAPE(0, 6), 0, NULL);         /* empty: omitted */
  add_frag(L, 0, b1, SHAPE(0, 0), SHAPE(2, 2), 100, SHAPE(1, 2)); /* column-major */
  xf want[] = {{0, b1, 2, {1, 2}, {2, 3}, {3, 1}, 8},
               {1, b1, 1, {0}, {3}, {2}, 40},
               {0, b1, 2, {0, 0}, {2, 2}, {1, 2}, 100}};
  EXPECT_FRAGS(L, 1, want, 3);
  EXPECT_NO_FRAGS(L, 0);
  EXPECT_NO_FRAGS(L, 2);
  EXPECT_BYTES(L, b0, 0, 0);
  EXPECT_BYTES(L, b1, 1, 200);
  EXPECT_BYTES(L, b1, 0, 0);
  reshard_layout_destroy(L);

  /* end to end into and out of custom strides: a column-major copy of T
   * with 16 bytes either side on rank 2, and on rank 3 T's rows in two
   * pitched blocks (row pitch 8 floats) followed by U at stride 3 */
  L = new_layout();
  add_tensors(L, ts, 2);
  int bc = -1, bp = -1;
  assert_int_equal(reshard_layout_add_buffer(L, "colmajor", 2, 16 + 96 + 16, &bc), RESHARD_SUCCESS);
  assert_int_equal(reshard_layout_add_buffer(L, "pitched", 3, 184, &bp), RESHARD_SUCCESS);
  add_frag(L, 0, bc, SHAPE(0, 0), SHAPE(4, 6), 16, SHAPE(1, 4));
  add_frag(L, 0, bp, SHAPE(0, 0), SHAPE(2, 6), 0, SHAPE(8, 1));
  add_frag(L, 0, bp, SHAPE(2, 0), SHAPE(2, 6), 64, SHAPE(8, 1));
  add_frag(L, 1, bp, SHAPE(0), SHAPE(3), 120, SHAPE(3));
  xf w2[] = {{0, bc, 2, {0, 0}, {4, 6}, {1, 4}, 16}};
  xf w3[] = {{0, bp, 2, {0, 0}, {2, 6}, {8, 1}, 0},
             {0, bp, 2, {2, 0}, {2, 6}, {8, 1}, 64},
             {1, bp, 1, {0}, {3}, {3}, 120}};
  EXPECT_FRAGS(L, 2, w2, 1);
  EXPECT_FRAGS(L, 3, w3, 3);
  EXPECT_BYTES(L, bc, 2, 128);
  EXPECT_BYTES(L, bp, 3, 184);
  roundtrip(ts, 2, L, 4, "raw buffers");
  reshard_layout_destroy(L);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(shard_even_chunk),
      cmocka_unit_test(shard_split_sizes),
      cmocka_unit_test(shard_split_sizes_bad),
      cmocka_unit_test(two_d_sharding),
      cmocka_unit_test(tp_x_ep_same_dim),
      cmocka_unit_test(vllm_qkv_kv_replicated),
      cmocka_unit_test(vllm_qkv_tp_le_nkv),
      cmocka_unit_test(megatron_interleaved_qkv),
      cmocka_unit_test(gate_up_concat),
      cmocka_unit_test(concat_dim1),
      cmocka_unit_test(padded_vocab),
      cmocka_unit_test(moe_experts),
      cmocka_unit_test(windows_grouped_experts),
      cmocka_unit_test(windows_many_of_one_tensor),
      cmocka_unit_test(buffer_names),
      cmocka_unit_test(norms_biases_scalars),
      cmocka_unit_test(zero_size),
      cmocka_unit_test(mesh_rank_lists),
      cmocka_unit_test(raw_buffers),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
