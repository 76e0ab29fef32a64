/* rs_layout_find_holders against brute force: over seeded random layouts
 * (tests/support/random_layout.h), the holders of a box are exactly the
 * fragments of every rank (rs_layout_rank_fragments) of that tensor that
 * intersect the box, with the same buffer, position, box, strides and
 * byte offset. This pins the shortcuts of the holder walk (pruned mesh
 * axes, single-part buffers built without lowering the buffer again) to
 * the reference lowering. RS_HOLDERS_SEED=<seed> replays one seed.
 * Also: the layout digest still tells names apart. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "layout/layout.h"
#include "support/harness.h"
#include "support/random_layout.h"

static int cmp_frag(const void *a, const void *b) {
  const rs_frag *x = a, *y = b;
  if (x->rank != y->rank) return x->rank < y->rank ? -1 : 1;
  if (x->buffer != y->buffer) return x->buffer < y->buffer ? -1 : 1;
  if (x->pos != y->pos) return x->pos < y->pos ? -1 : 1;
  return memcmp(x->start, y->start, sizeof x->start);
}

static int same_frag(const rs_frag *x, const rs_frag *y) {
  if (x->tensor != y->tensor || x->rank != y->rank || x->buffer != y->buffer || x->ndim != y->ndim ||
      x->pos != y->pos || x->byte_offset != y->byte_offset)
    return 0;
  for (int d = 0; d < x->ndim; d++)
    if (x->start[d] != y->start[d] || x->extent[d] != y->extent[d] || x->strides[d] != y->strides[d]) return 0;
  return 1;
}

static int hits(const rs_frag *f, const int64_t *qs, const int64_t *qe) {
  for (int d = 0; d < f->ndim; d++)
    if (f->start[d] >= qs[d] + qe[d] || qs[d] >= f->start[d] + f->extent[d]) return 0;
  return 1;
}

/* Returns the number of mismatching queries (printed). */
static int check_side(uint64_t seed, const reshard_layout_t *L, int nranks, uint64_t *rng) {
  rs_frag_vec all = {0};
  for (int r = 0; r < nranks; r++) assert_int_equal(rs_layout_rank_fragments(L, r, &all), RESHARD_SUCCESS);
  int bad = 0;
  for (int t = 0; t < L->ntensors; t++) {
    const rs_tensor *T = &L->tensors[t];
    for (int q = 0; q < 6; q++) {
      int64_t qs[RESHARD_MAX_DIMS], qe[RESHARD_MAX_DIMS];
      int empty = 0;
      for (int d = 0; d < T->ndim; d++) {
        if (q == 0 || T->shape[d] == 0) { /* the whole tensor first */
          qs[d] = 0;
          qe[d] = T->shape[d];
        } else {
          qs[d] = th_rand_range(rng, 0, T->shape[d] - 1);
          qe[d] = th_rand_range(rng, 1, T->shape[d] - qs[d]);
        }
        empty |= qe[d] == 0;
      }
      rs_frag_vec got = {0}, want = {0};
      assert_int_equal(rs_layout_find_holders(L, t, qs, qe, NULL, &got), RESHARD_SUCCESS);
      for (size_t i = 0; i < all.n && !empty; i++)
        if (all.v[i].tensor == t && hits(&all.v[i], qs, qe)) assert_int_equal(rs_frag_vec_push(&want, &all.v[i]), 0);
      if (got.n > 1) qsort(got.v, got.n, sizeof *got.v, cmp_frag);
      if (want.n > 1) qsort(want.v, want.n, sizeof *want.v, cmp_frag);
      int ok = got.n == want.n;
      for (size_t i = 0; ok && i < got.n; i++) ok = same_frag(&got.v[i], &want.v[i]);
      if (!ok) {
        if (bad < 3)
          print_error("seed %llu tensor '%s' query %d: %zu holders found, %zu expected (or fields differ)\n",
                      (unsigned long long)seed, T->name, q, got.n, want.n);
        bad++;
      }
      rs_frag_vec_free(&got);
      rs_frag_vec_free(&want);
    }
  }
  rs_frag_vec_free(&all);
  return bad;
}

static void holders_match_lowering(void **state) {
  (void)state;
  const char *one = getenv("RS_HOLDERS_SEED");
  uint64_t first = one ? strtoull(one, NULL, 10) : 1, last = one ? first : 1500;
  unsigned features = 0;
  int bad = 0;
  for (uint64_t seed = first; seed <= last; seed++) {
    rl_pair p;
    assert_int_equal(rl_pair_make(seed, RL_ANY, &p), 0);
    features |= p.features;
    uint64_t rng = seed * 0x9E3779B97F4A7C15ULL + 7;
    int b = check_side(seed, p.src, p.nranks, &rng) + check_side(seed, p.dst, p.nranks, &rng);
    if (b && (one || bad == 0)) rl_pair_print(&p, stderr);
    bad += b;
    rl_pair_free(&p);
  }
  assert_int_equal(bad, 0);
  /* the layouts exercised what the walk shortcuts: fused, grouped,
   * padded, uneven splits, raw fragments */
  if (!one)
    for (int f = 0; f < RL_F_NUM; f++) {
      if (!(features & (1u << f))) print_error("feature %s never generated\n", rl_feature_name(f));
      assert_true(features & (1u << f));
    }
}

/* The digest takes names through their hashes: a layout differing only in
 * one tensor's name, or in the order of two names, digests differently. */
static reshard_layout_t *two_tensors(const char *a, const char *b) {
  reshard_layout_t *L = NULL;
  const int64_t shape[2] = {4, 6};
  int t, mesh, buf;
  assert_int_equal(reshard_layout_create(&L), RESHARD_SUCCESS);
  assert_int_equal(reshard_layout_add_tensor(L, a, RESHARD_BF16, 2, shape, &t), RESHARD_SUCCESS);
  assert_int_equal(reshard_layout_add_tensor(L, b, RESHARD_BF16, 2, shape, &t), RESHARD_SUCCESS);
  assert_int_equal(reshard_layout_add_mesh_strided(L, 1, (const int[]){2}, 0, 1, &mesh), RESHARD_SUCCESS);
  for (t = 0; t < 2; t++)
    assert_int_equal(reshard_layout_place(L, t, mesh, (const reshard_placement_t[]){reshard_shard(0)}, &buf),
                     RESHARD_SUCCESS);
  return L;
}

static void digest_sees_names(void **state) {
  (void)state;
  reshard_layout_t *a = two_tensors("layers.0.w", "layers.1.w"), *same = two_tensors("layers.0.w", "layers.1.w");
  reshard_layout_t *renamed = two_tensors("layers.0.w", "layers.1.v"), *swapped = two_tensors("layers.1.w", "layers.0.w");
  assert_true(rs_layout_digest(a, 1) == rs_layout_digest(same, 1));
  assert_true(rs_layout_digest(a, 1) != rs_layout_digest(a, 2));
  assert_true(rs_layout_digest(a, 1) != rs_layout_digest(renamed, 1));
  assert_true(rs_layout_digest(a, 1) != rs_layout_digest(swapped, 1));
  reshard_layout_destroy(a);
  reshard_layout_destroy(same);
  reshard_layout_destroy(renamed);
  reshard_layout_destroy(swapped);
}

int main(void) {
  const struct CMUnitTest tests[] = {cmocka_unit_test(holders_match_lowering), cmocka_unit_test(digest_sees_names)};
  return cmocka_run_group_tests(tests, NULL, NULL);
}
