/* The multi-rank tests' runner: see mock_world.h. */
#include "device-emul/mock_world.h"

#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <cmocka.h>

#include "reshard_selftest.h"

static void *rank_main(void *p) {
  mw_rank *r = p;
  mock_reset(r->rank, r->n);
  M.log_off = 1;
  r->fn(r);
  if (M.mem || M.streams || M.events)
    RFAIL(r, "leaked %ld allocations, %ld streams, %ld events", M.mem, M.streams, M.events);
  return NULL;
}

mw_outcome mw_run(int n, int64_t hang_ms, mw_fn fn, void *ctx, mw_rank *r) {
  mw_outcome o = {0, -1, 0, 0, 0, 0, 0, 0};
  if (n < 1 || n > MAXR) abort();
  mock_world_begin(n, 0);
  world.hang_ms = hang_ms;
  reshard_inproc_world_t *hw = NULL;
  if (reshard_inproc_world_create(n, &hw)) abort();
  pthread_t th[MAXR];
  for (int i = 0; i < n; i++) {
    r[i] = (mw_rank){.rank = i, .n = n, .host_world = hw, .ctx = ctx, .fn = fn};
    pthread_create(&th[i], NULL, rank_main, &r[i]);
  }
  for (int i = 0; i < n; i++) {
    pthread_join(th[i], NULL);
    o.wrong += r[i].wrong;
    if (r[i].failed && o.failed < 0) o.failed = i;
  }
  o.hangs = world.hangs;
  o.ipc_mapped = world.ipc_mapped;
  o.ipc_closed_reads = world.ipc_closed_reads;
  o.ipc_freed_mapped = world.ipc_freed_mapped;
  o.capture_violations = world.capture_violations;
  o.bad_size = world.bad_size;
  mock_world_end();
  world.hang_ms = 3000;
  reshard_inproc_world_destroy(hw);
  return o;
}

void mw_layouts_all(int n, int64_t rows, int64_t cols, reshard_layout_t **src, reshard_layout_t **dst) {
  int64_t shape[2] = {rows, cols};
  int t, m, b, sn[1] = {n}, ranks[MAXR], rev[MAXR];
  for (int i = 0; i < n; i++) ranks[i] = i, rev[i] = n - 1 - i;
  reshard_placement_t p0[1] = {reshard_shard(0)}, p1[1] = {reshard_shard(1)};
  if (reshard_layout_create(src) || reshard_layout_create(dst) ||
      reshard_layout_add_tensor(*src, "w", RESHARD_FP32, 2, shape, &t) ||
      reshard_layout_add_tensor(*dst, "w", RESHARD_FP32, 2, shape, &t) ||
      reshard_layout_add_mesh(*src, 1, sn, ranks, &m) || reshard_layout_place(*src, t, m, p0, &b) ||
      reshard_layout_add_mesh(*dst, 1, sn, rev, &m) || reshard_layout_place(*dst, t, m, p1, &b)) {
    fprintf(stderr, "mw_layouts_all: %s\n", reshard_last_error());
    abort();
  }
}

/* A layout call that cannot fail here (the pair's own bug if it does). */
#define MW_OK(call)                                                     \
  do {                                                                  \
    if ((call) != RESHARD_SUCCESS) {                                    \
      fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call,    \
              reshard_last_error());                                    \
      abort();                                                          \
    }                                                                   \
  } while (0)

void mw_quant_pair(uint64_t seed, int n, reshard_layout_t **src, reshard_layout_t **dst) {
  uint64_t x = seed * 0x9E3779B97F4A7C15ull + 7;
#define QR(k) (int64_t)(((x = x * 6364136223846793005ull + 1442695040888963407ull) >> 33) % (uint64_t)(k))
  MW_OK(reshard_layout_create(src));
  MW_OK(reshard_layout_create(dst));
  static const reshard_dtype_t dts[3] = {RESHARD_BF16, RESHARD_FP16, RESHARD_FP32};
  int ns = 1 + (int)QR(n), nd = 1 + (int)QR(n), sr[MAXR], dr[MAXR];
  for (int i = 0; i < ns; i++) sr[i] = i;
  for (int i = 0; i < nd; i++) dr[i] = n - nd + i; /* overlapping: colocated */
  int msrc, mdst, t, b, s, mesh1;
  int one[1] = {0};
  MW_OK(reshard_layout_add_mesh(*src, 1, &ns, sr, &msrc));
  MW_OK(reshard_layout_add_mesh(*dst, 1, &nd, dr, &mdst));
  MW_OK(reshard_layout_add_mesh(*dst, 1, (int[]){1}, one, &mesh1));
  for (int q = 0; q < 2; q++) {
    char name[32];
    snprintf(name, sizeof name, "layers.%d.weight", q);
    int nd_t = QR(3) ? 2 : 3;
    int64_t shape[3], blk[2] = {1 + (int64_t)QR(12), 1 + (int64_t)QR(12)};
    for (int d = 0; d < nd_t; d++) shape[d] = d < nd_t - 2 ? 1 + (int64_t)QR(3) : 1 + (int64_t)QR(40);
    MW_OK(reshard_layout_add_tensor(*src, name, dts[QR(3)], nd_t, shape, &t));
    int sdim = nd_t - 2 + (int)QR(2);
    int64_t sizes[MAXR], left = shape[sdim];
    for (int i = 0; i < ns; i++) {
      sizes[i] = i == ns - 1 ? left : QR(left + 1);
      left -= sizes[i];
    }
    reshard_placement_t ps[1] = {reshard_shard_sizes(sdim, sizes)};
    MW_OK(reshard_layout_place(*src, t, msrc, ps, &b));
    MW_OK(reshard_layout_add_tensor_blocked(*dst, name, RESHARD_FP8_E4M3, nd_t, shape, blk, &t));
    int64_t bb[2];
    MW_OK(reshard_layout_tensor_block(*dst, t, bb, &s));
    int kind = (int)QR(3), ddim = nd_t - 2 + (int)QR(2);
    reshard_placement_t pd[1] = {kind ? reshard_shard(ddim) : reshard_replicate()};
    MW_OK(reshard_layout_place(*dst, t, mdst, pd, &b));
    reshard_placement_t one_p[1] = {reshard_replicate()};
    if (QR(2)) MW_OK(reshard_layout_place(*dst, s, mdst, pd, &b));
    else MW_OK(reshard_layout_place(*dst, s, mesh1, one_p, &b));
  }
  int64_t nshape[1] = {1 + (int64_t)QR(50)};
  reshard_placement_t rows[1] = {reshard_shard(0)};
  MW_OK(reshard_layout_add_tensor(*src, "norm.weight", RESHARD_BF16, 1, nshape, &t));
  MW_OK(reshard_layout_place(*src, t, msrc, rows, &b));
  MW_OK(reshard_layout_add_tensor(*dst, "norm.weight", RESHARD_BF16, 1, nshape, &t));
  MW_OK(reshard_layout_place(*dst, t, mdst, rows, &b));
#undef QR
}


static void mw_placed(reshard_layout_t *L, const char *name, int t, int mesh, const reshard_placement_t *pl) {
  int b;
  reshard_part_t part = {t, mesh, pl, NULL};
  MW_OK(reshard_layout_add_fused(L, name, 0, 1, 1, &part, &b));
}

void mw_moe_pair(int64_t rows, int fp8, reshard_layout_t **src, reshard_layout_t **dst) {
  int64_t es[3] = {4, rows, 512}, ds[2] = {256, 256};
  int e, d, m, m8;
  MW_OK(reshard_layout_create(src));
  MW_OK(reshard_layout_add_tensor(*src, "experts", RESHARD_BF16, 3, es, &e));
  MW_OK(reshard_layout_add_tensor(*src, "dense", RESHARD_FP32, 2, ds, &d));
  int r8[8] = {0, 1, 2, 3, 4, 5, 6, 7}, sh8[1] = {8}, sh2[1] = {2};
  MW_OK(reshard_layout_add_mesh(*src, 1, sh2, r8, &m));
  reshard_placement_t s0 = {RESHARD_PLACEMENT_SHARD, 0, NULL}, rep = {RESHARD_PLACEMENT_REPLICATE, 0, NULL};
  mw_placed(*src, "experts", e, m, &s0);
  MW_OK(reshard_layout_add_mesh(*src, 1, sh8, r8, &m8));
  mw_placed(*src, "dense", d, m8, &rep);
  MW_OK(reshard_layout_create(dst));
  const int64_t block[2] = {128, 128};
  if (fp8) MW_OK(reshard_layout_add_tensor_blocked(*dst, "experts", RESHARD_FP8_E4M3, 3, es, block, &e));
  else MW_OK(reshard_layout_add_tensor(*dst, "experts", RESHARD_BF16, 3, es, &e));
  MW_OK(reshard_layout_add_tensor(*dst, "dense", RESHARD_FP32, 2, ds, &d));
  int q8[8] = {8, 9, 10, 11, 12, 13, 14, 15};
  MW_OK(reshard_layout_add_mesh(*dst, 1, sh8, q8, &m));
  reshard_placement_t s1 = {RESHARD_PLACEMENT_SHARD, 1, NULL};
  mw_placed(*dst, "experts", e, m, &s1);
  mw_placed(*dst, "dense", d, m, &s0);
  if (fp8) mw_placed(*dst, "experts_scale_inv", e + 1, m, &s1); /* [4, rows / 128, 4], split like its weight */
}

void mw_double_buffer(mw_rank *r, reshard_comm_t *c) {
  reshard_layout_t *src, *dst;
  mw_layouts_all(r->n, 48, 32 * (int64_t)r->n, &src, &dst);
  reshard_options_t o = RESHARD_OPTIONS_INITIALIZER;
  o.staging_bytes = 4096;
  o.timeout_ms = 3000;
  o.flags = RESHARD_FLAG_DOUBLE_BUFFER;
  reshard_plan_t *plan = NULL;
  reshard_selftest_t s = {0}, d[2] = {{0}, {0}};
  void *bufs[2 * 8];
  if (reshard_plan_create(c, src, dst, &o, &plan)) {
    RFAIL(r, "plan_create: %s", reshard_last_error());
    goto out;
  }
  if (reshard_selftest_alloc(&d[0], dst, r->rank, -1) || reshard_selftest_alloc(&d[1], dst, r->rank, -1) ||
      d[0].nbuf > 8) {
    RFAIL(r, "selftest alloc");
    goto out;
  }
  for (int b = 0; b < d[0].nbuf; b++) bufs[b] = d[0].ptr[b], bufs[d[0].nbuf + b] = d[1].ptr[b];
  for (int step = 0; step < 5 && !r->failed; step++) {
    reshard_selftest_free(&s);
    if (reshard_selftest_alloc(&s, src, r->rank, step)) {
      RFAIL(r, "selftest alloc");
      break;
    }
    if (step == 4 && r->rank == 1) M.tamper_version = 1;
    reshard_result_t e = reshard_plan_execute(plan, (void *const *)s.ptr, (size_t)s.nbuf, bufs,
                                              2 * (size_t)d[0].nbuf, NULL);
    M.tamper_version = 0;
    if (e) {
      RFAIL(r, "step %d: execute: %s", step, reshard_last_error());
      break;
    }
    if (mock_stream_drain(NULL)) RFAIL(r, "drain hung");
    reshard_plan_status_t st = {.struct_size = sizeof st};
    reshard_plan_get_status(plan, &st);
    if (step < 4) {
      if (st.failed || st.committed_version != (uint64_t)step + 1 || st.active_copy != step % 2)
        RFAIL(r, "step %d: failed %d (%s), committed version %llu, active copy %d", step, st.failed,
              st.failure_message, (unsigned long long)st.committed_version, st.active_copy);
      else
        r->wrong += reshard_selftest_check(&d[step % 2], dst, r->rank, (uint64_t)step, "dbuf active");
      if (step >= 1) r->wrong += reshard_selftest_check(&d[(step + 1) % 2], dst, r->rank, (uint64_t)step - 1,
                                                        "dbuf inactive");
    } else {
      if (!st.failed || st.committed_version != 4 || st.active_copy != 1)
        RFAIL(r, "step 4 (a rank out of step): failed %d, committed version %llu, active copy %d", st.failed,
              (unsigned long long)st.committed_version, st.active_copy);
      r->wrong += reshard_selftest_check(&d[1], dst, r->rank, 3, "dbuf kept");
    }
  }
  if (r->wrong) RFAIL(r, "%lld wrong bytes", (long long)r->wrong);
out:
  reshard_plan_destroy(plan);
  reshard_selftest_free(&s);
  reshard_selftest_free(&d[0]);
  reshard_selftest_free(&d[1]);
  reshard_layout_destroy(src);
  reshard_layout_destroy(dst);
}

void mw_commit_apart(mw_rank *r, reshard_comm_t *c, int odd) {
  reshard_layout_t *src, *dst;
  assert_int_equal(reshard_layout_create(&src), 0);
  assert_int_equal(reshard_layout_create(&dst), 0);
  int64_t sw[2] = {16, 32}, su[1] = {40};
  int tw, tu, m01, m2, b, n2[1] = {2}, one[1] = {1};
  for (int side = 0; side < 2; side++) {
    reshard_layout_t *L = side ? dst : src;
    assert_int_equal(reshard_layout_add_tensor(L, "w", RESHARD_FP32, 2, sw, &tw), 0);
    assert_int_equal(reshard_layout_add_tensor(L, "u", RESHARD_BF16, 1, su, &tu), 0);
    assert_int_equal(reshard_layout_add_mesh(L, 1, n2, side ? (int[]){1, 0} : (int[]){0, 1}, &m01), 0);
    assert_int_equal(reshard_layout_add_mesh(L, 1, one, (int[]){2}, &m2), 0);
    reshard_placement_t ps[1] = {reshard_shard(side)}, rep[1] = {reshard_replicate()};
    assert_int_equal(reshard_layout_place(L, tw, m01, ps, &b), 0);
    assert_int_equal(reshard_layout_place(L, tu, m2, rep, &b), 0);
  }
  reshard_options_t o = RESHARD_OPTIONS_INITIALIZER;
  o.staging_bytes = 4096;
  o.timeout_ms = 3000;
  o.flags = RESHARD_FLAG_DOUBLE_BUFFER;
  reshard_plan_t *plan = NULL;
  reshard_selftest_t s = {0}, d[2] = {{0}, {0}};
  void *bufs[16];
  if (reshard_plan_create(c, src, dst, &o, &plan) || reshard_selftest_alloc(&d[0], dst, r->rank, -1) ||
      reshard_selftest_alloc(&d[1], dst, r->rank, -1) || d[0].nbuf > 8) {
    RFAIL(r, "setup: %s", reshard_last_error());
    goto out;
  }
  if (r->rank == 2 && plan->npeers) RFAIL(r, "rank 2 has partners: the test needs none");
  for (int b2 = 0; b2 < d[0].nbuf; b2++) bufs[b2] = d[0].ptr[b2], bufs[d[0].nbuf + b2] = d[1].ptr[b2];
  for (int step = 0; step < 2 && !r->failed; step++) {
    reshard_selftest_free(&s);
    if (reshard_selftest_alloc(&s, src, r->rank, step)) {
      RFAIL(r, "selftest alloc");
      break;
    }
    uint64_t version = step == 1 && r->rank == odd ? 7 : (uint64_t)step + 1;
    if (reshard_plan_execute_version(plan, version, (void *const *)s.ptr, (size_t)s.nbuf, bufs,
                                     2 * (size_t)d[0].nbuf, NULL) ||
        mock_stream_drain(NULL))
      RFAIL(r, "step %d: execute: %s", step, reshard_last_error());
  }
  reshard_plan_status_t st = {.struct_size = sizeof st};
  reshard_plan_get_status(plan, &st);
  const reshard_result_t want = odd == 1 && r->rank == 2 ? RESHARD_ERROR_REMOTE : RESHARD_ERROR_MISMATCH;
  if (!r->failed && (!st.failed || st.failure != want || st.committed_version != 1 || st.active_copy != 0))
    RFAIL(r, "a rank out of step at the commit: failed %d (%s: %s), committed version %llu, active copy %d", st.failed,
          reshard_result_string(st.failure), st.failure_message, (unsigned long long)st.committed_version,
          st.active_copy);
  r->wrong += reshard_selftest_check(&d[0], dst, r->rank, 0, "apart: the active copy");
out:
  reshard_plan_destroy(plan);
  reshard_selftest_free(&s);
  reshard_selftest_free(&d[0]);
  reshard_selftest_free(&d[1]);
  reshard_layout_destroy(src);
  reshard_layout_destroy(dst);
}
