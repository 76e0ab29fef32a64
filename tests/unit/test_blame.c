/* Blame words (src/common/blame.h): the failing rank and its message
 * survive a max-reduction over every rank's words, whatever the others
 * contribute; the highest failing rank wins whole, never a mix. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <stdio.h>
#include <string.h>

#include "common/blame.h"

/* The max-reduction of n ranks' words, as every transport computes it. */
static void reduce(uint64_t (*w)[RS_BLAME_WORDS], int n, uint64_t *out) {
  for (int i = 0; i < RS_BLAME_WORDS; i++) {
    out[i] = 0;
    for (int r = 0; r < n; r++) out[i] = w[r][i] > out[i] ? w[r][i] : out[i];
  }
}

static void nobody_failed(void **state) {
  (void)state;
  uint64_t w[3][RS_BLAME_WORDS], out[RS_BLAME_WORDS];
  for (int r = 0; r < 3; r++) rs_blame_put(w[r], r, NULL, 1);
  reduce(w, 3, out);
  char why[200] = "x";
  assert_int_equal(rs_blame_get(out, why, sizeof why), -1);
  assert_string_equal(why, "");
}

/* Ranks 1 and 5 of 8 fail; rank 1's message is longer and sorts higher
 * byte by byte, so a reduction that mixed ranks per word would show it:
 * rank 5 and exactly its message come out. */
static void highest_failing_rank_whole(void **state) {
  (void)state;
  uint64_t w[8][RS_BLAME_WORDS], out[RS_BLAME_WORDS];
  const char *m1 = "zzzz: rank 1's long story, which is longer than rank five's and sorts after it everywhere";
  const char *m5 = "plan_create rank 5: options.staging_bytes is 1";
  for (int r = 0; r < 8; r++) rs_blame_put(w[r], r, r == 1 ? m1 : r == 5 ? m5 : NULL, 1);
  reduce(w, 8, out);
  char why[200];
  assert_int_equal(rs_blame_get(out, why, sizeof why), 5);
  assert_string_equal(why, m5);
}

/* The first cause wins: rank 1 refused its input, ranks 2 and 3 only
 * heard of it (REMOTE, TIMEOUT), rank 0 is fine; rank 1 is named. */
static void first_cause_wins(void **state) {
  (void)state;
  uint64_t w[4][RS_BLAME_WORDS], out[RS_BLAME_WORDS];
  rs_blame_put(w[0], 0, NULL, 1);
  rs_blame_put(w[1], 1, "rank 1: staging_bytes is 1", rs_blame_first_cause(RESHARD_ERROR_INVALID_ARGUMENT));
  rs_blame_put(w[2], 2, "rank 2: partner rank 1 failed", rs_blame_first_cause(RESHARD_ERROR_REMOTE));
  rs_blame_put(w[3], 3, "rank 3: receive from rank 2 timed out", rs_blame_first_cause(RESHARD_ERROR_TIMEOUT));
  reduce(w, 4, out);
  char why[200];
  assert_int_equal(rs_blame_get(out, why, sizeof why), 1);
  assert_string_equal(why, "rank 1: staging_bytes is 1");
}

/* A message past the capacity is cut, and says so; a rank beyond
 * RS_BLAME_MAX_RANK contributes nothing (the others still see a failure code in
 * their own word, without a name); an empty message still names the
 * rank. */
static void limits(void **state) {
  (void)state;
  char longmsg[400];
  for (int i = 0; i < 399; i++) longmsg[i] = (char)('a' + i % 26);
  longmsg[399] = 0;
  uint64_t w[1][RS_BLAME_WORDS], out[RS_BLAME_WORDS];
  rs_blame_put(w[0], 3, longmsg, 1);
  reduce(w, 1, out);
  char why[400];
  assert_int_equal(rs_blame_get(out, why, sizeof why), 3);
  const size_t cap = RS_BLAME_WORDS * RS_BLAME_BYTES_PER_WORD;
  assert_int_equal(strlen(why), cap);
  assert_memory_equal(why, longmsg, cap - 3);
  assert_string_equal(why + cap - 3, "...");
  /* a message of exactly the capacity is whole, not marked cut */
  longmsg[cap] = 0;
  rs_blame_put(w[0], 3, longmsg, 1);
  reduce(w, 1, out);
  assert_int_equal(rs_blame_get(out, why, sizeof why), 3);
  assert_string_equal(why, longmsg);
  /* a short output buffer is filled, NUL-terminated */
  char small[8];
  assert_int_equal(rs_blame_get(out, small, sizeof small), 3);
  assert_string_equal(small, "abcdefg");

  rs_blame_put(w[0], RS_BLAME_MAX_RANK + 1, "too high", 1);
  for (int i = 0; i < RS_BLAME_WORDS; i++) assert_true(w[0][i] == 0);
  rs_blame_put(w[0], 0, "", 1);
  reduce(w, 1, out);
  assert_int_equal(rs_blame_get(out, why, sizeof why), 0);
  assert_string_equal(why, "");
  /* words from two ranks (not a max of whole blames) are not trusted */
  uint64_t a[RS_BLAME_WORDS], b[RS_BLAME_WORDS];
  rs_blame_put(a, 2, "two", 1);
  rs_blame_put(b, 4, "four", 1);
  a[RS_BLAME_WORDS - 1] = b[RS_BLAME_WORDS - 1];
  assert_int_equal(rs_blame_get(a, why, sizeof why), -1);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(nobody_failed),
      cmocka_unit_test(highest_failing_rank_whole),
      cmocka_unit_test(first_cause_wins),
      cmocka_unit_test(limits),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
