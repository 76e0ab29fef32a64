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
  for (int r = 0; r < 3; r++) rs_blame_put(w[r], r, NULL);
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
  for (int r = 0; r < 8; r++) rs_blame_put(w[r], r, r == 1 ? m1 : r == 5 ? m5 : NULL);
  reduce(w, 8, out);
  char why[200];
  assert_int_equal(rs_blame_get(out, why, sizeof why), 5);
  assert_string_equal(why, m5);
}

/* A message past the capacity is cut, and says so; a rank beyond the
 * 24 bits contributes nothing (the others still see a failure code in
 * their own word, without a name); an empty message still names the
 * rank. */
static void limits(void **state) {
  (void)state;
  char longmsg[400];
  for (int i = 0; i < 399; i++) longmsg[i] = (char)('a' + i % 26);
  longmsg[399] = 0;
  uint64_t w[1][RS_BLAME_WORDS], out[RS_BLAME_WORDS];
  rs_blame_put(w[0], 3, longmsg);
  reduce(w, 1, out);
  char why[400];
  assert_int_equal(rs_blame_get(out, why, sizeof why), 3);
  const size_t cap = RS_BLAME_WORDS * RS_BLAME_BYTES_PER_WORD;
  assert_int_equal(strlen(why), cap + 3);
  assert_memory_equal(why, longmsg, cap);
  assert_string_equal(why + cap, "...");
  /* a short output buffer is filled, NUL-terminated */
  char small[8];
  assert_int_equal(rs_blame_get(out, small, sizeof small), 3);
  assert_string_equal(small, "abcdefg");

  rs_blame_put(w[0], 1 << 24, "too high");
  for (int i = 0; i < RS_BLAME_WORDS; i++) assert_true(w[0][i] == 0);
  rs_blame_put(w[0], 0, "");
  reduce(w, 1, out);
  assert_int_equal(rs_blame_get(out, why, sizeof why), 0);
  assert_string_equal(why, "");
  /* words from two ranks (not a max of whole blames) are not trusted */
  uint64_t a[RS_BLAME_WORDS], b[RS_BLAME_WORDS];
  rs_blame_put(a, 2, "two");
  rs_blame_put(b, 4, "four");
  a[RS_BLAME_WORDS - 1] = b[RS_BLAME_WORDS - 1];
  assert_int_equal(rs_blame_get(a, why, sizeof why), -1);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(nobody_failed),
      cmocka_unit_test(highest_failing_rank_whole),
      cmocka_unit_test(limits),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
