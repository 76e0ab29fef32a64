/* Regression tests for bugs the plan fuzzer (tests/fuzz) found, one test
 * per bug, each written before its fix. The fuzzer's reproducer of each
 * also lives in tests/fuzz/corpus (regress-*), replayed by every build. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <string.h>

#include "fake_comm.h"
#include "reshard.h"

/* Plans rank 0 of a 1-rank world: the source replicates int8 "w" [2, 2],
 * the destination holds it in a raw buffer of 64 bytes as one fragment
 * with the given strides. Returns the result; *msg gets the error. */
static reshard_result_t plan_raw_strides(const int64_t *strides, char *msg, size_t cap) {
  reshard_layout_t *src = NULL, *dst = NULL;
  int64_t shape[2] = {2, 2}, start[2] = {0, 0};
  int t = -1, m = -1, b = -1, one = 1;
  reshard_placement_t rep = reshard_replicate();
  assert_int_equal(reshard_layout_create(&src), 0);
  assert_int_equal(reshard_layout_create(&dst), 0);
  assert_int_equal(reshard_layout_add_tensor(src, "w", RESHARD_INT8, 2, shape, &t), 0);
  assert_int_equal(reshard_layout_add_mesh(src, 1, &one, (int[]){0}, &m), 0);
  assert_int_equal(reshard_layout_place(src, t, m, &rep, &b), 0);
  assert_int_equal(reshard_layout_add_tensor(dst, "w", RESHARD_INT8, 2, shape, &t), 0);
  assert_int_equal(reshard_layout_add_buffer(dst, "raw", 0, 64, &b), 0);
  reshard_fragment_t f = {t, b, start, shape, 0, strides};
  reshard_result_t r = reshard_layout_add_fragment(dst, &f);
  if (r == RESHARD_SUCCESS) {
    reshard_comm_t *comm = NULL;
    assert_int_equal(bench_fake_comm_create(0, 1, &comm), 0);
    reshard_options_t opts = RESHARD_OPTIONS_INITIALIZER;
    reshard_plan_t *plan = NULL;
    r = reshard_plan_create(comm, src, dst, &opts, &plan);
    if (r == RESHARD_SUCCESS) reshard_plan_destroy(plan);
    else assert_null(plan);
    reshard_comm_destroy(comm);
  }
  snprintf(msg, cap, "%s", reshard_last_error());
  reshard_layout_destroy(src);
  reshard_layout_destroy(dst);
  return r;
}

/* Found by fuzz_plan: a raw fragment stride of INT64_MIN was negated in
 * the self-overlap check (signed overflow, undefined; UBSan aborts) and
 * then reported as an overlap. Such a fragment reaches 2^63 elements
 * before its start: it must be rejected as lying outside its buffer. */
static void int64_min_stride_is_outside_the_buffer(void **state) {
  (void)state;
  const int64_t cases[3][2] = {{INT64_MIN, 1}, {2, INT64_MIN}, {INT64_MIN, INT64_MIN}};
  for (int i = 0; i < 3; i++) {
    char msg[1024];
    reshard_result_t r = plan_raw_strides(cases[i], msg, sizeof msg);
    if (r != RESHARD_ERROR_INVALID_ARGUMENT || !strstr(msg, "tensor 'w'") || !strstr(msg, "outside buffer 'raw'"))
      fail_msg("strides {%lld, %lld}: returned %s: \"%s\"", (long long)cases[i][0], (long long)cases[i][1],
               reshard_result_string(r), msg);
  }
  /* its neighbour -(2^63 - 1) is rejected too (as before: the overlap
   * check is conservative when the reach overflows) */
  char msg[1024];
  assert_int_equal(plan_raw_strides((const int64_t[]){-INT64_MAX, 1}, msg, sizeof msg), RESHARD_ERROR_INVALID_ARGUMENT);
  assert_non_null(strstr(msg, "tensor 'w'"));
  /* and the same fragment with dense strides plans */
  assert_int_equal(plan_raw_strides((const int64_t[]){2, 1}, msg, sizeof msg), RESHARD_SUCCESS);
}

int main(void) {
  const struct CMUnitTest tests[] = {cmocka_unit_test(int64_min_stride_is_outside_the_buffer)};
  return cmocka_run_group_tests(tests, NULL, NULL);
}
