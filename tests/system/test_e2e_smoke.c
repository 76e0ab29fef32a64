/* End-to-end smoke: simple reshards over the in-process transport. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "reshard.h"
#include "support/harness.h"

static void run_2d(void **state) {
  (void)state;
  reshard_layout_t *src, *dst;
  assert_int_equal(reshard_layout_create(&src), 0);
  assert_int_equal(reshard_layout_create(&dst), 0);
  int64_t shape[2] = {16, 8};
  int t, m, b;
  assert_int_equal(reshard_layout_add_tensor(src, "w", RESHARD_FP32, 2, shape, &t), 0);
  assert_int_equal(reshard_layout_add_tensor(dst, "w", RESHARD_FP32, 2, shape, &t), 0);
  int s4[1] = {4};
  assert_int_equal(reshard_layout_add_mesh_strided(src, 1, s4, 0, 1, &m), 0);
  reshard_placement_t ps[1] = {reshard_shard(0)};
  assert_int_equal(reshard_layout_place(src, t, m, ps, &b), 0);
  int s22[2] = {2, 2};
  assert_int_equal(reshard_layout_add_mesh_strided(dst, 2, s22, 4, 1, &m), 0);
  reshard_placement_t pd[2] = {reshard_replicate(), reshard_shard(1)};
  assert_int_equal(reshard_layout_place(dst, t, m, pd, &b), 0);
  th_sync_args a = {.src = src, .dst = dst, .opts = RESHARD_OPTIONS_INITIALIZER, .steps = 2};
  assert_int_equal(th_sync(8, &a), 0);
  /* colocated: destination on the same ranks */
  reshard_layout_t *dst2;
  assert_int_equal(reshard_layout_create(&dst2), 0);
  assert_int_equal(reshard_layout_add_tensor(dst2, "w", RESHARD_FP32, 2, shape, &t), 0);
  assert_int_equal(reshard_layout_add_mesh_strided(dst2, 2, s22, 0, 1, &m), 0);
  assert_int_equal(reshard_layout_place(dst2, t, m, pd, &b), 0);
  th_sync_args a2 = {.src = src, .dst = dst2, .opts = RESHARD_OPTIONS_INITIALIZER, .steps = 2};
  a2.opts.staging_bytes = 4096; /* many rounds */
  assert_int_equal(th_sync(4, &a2), 0);
  reshard_layout_destroy(src);
  reshard_layout_destroy(dst);
  reshard_layout_destroy(dst2);
}

int main(void) {
  const struct CMUnitTest tests[] = {cmocka_unit_test(run_2d)};
  return cmocka_run_group_tests(tests, NULL, NULL);
}
