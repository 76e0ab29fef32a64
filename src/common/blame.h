/* Naming the rank that failed, and why, in a max-reduction.
 *
 * Collective agreements (plan creation, the double-buffer commit) are
 * max-reductions of a few words, so a rank's failure reaches the others
 * as a number only: "another rank failed with 'invalid argument'". These
 * words carry the failing rank and the start of its message through the
 * same reduction, at no extra round trip: every word holds, from the top,
 * a "first cause" bit, the rank + 1 and a few message bytes, so the max of
 * each word comes from one rank and all of them from the same one (a rank
 * without a failure contributes zeros). A first cause (any failure but
 * REMOTE and TIMEOUT, which a rank reports because of another) wins over
 * the ranks that only heard of it; among equals the highest rank wins. */
#ifndef RS_COMMON_BLAME_H
#define RS_COMMON_BLAME_H

#include <stddef.h>
#include <stdint.h>

#include "reshard.h"

#define RS_BLAME_BYTES_PER_WORD 5
#define RS_BLAME_WORDS 32 /* the first 160 bytes of the message */
#define RS_BLAME_MAX_RANK ((1 << 23) - 2)

/* This rank's words (RS_BLAME_WORDS at w): zeros if msg is NULL (no
 * failure), else the rank and msg (a longer one cut, ending in "...");
 * first_cause: msg is this rank's own failure, not news of another's. */
void rs_blame_put(uint64_t *w, int rank, const char *msg, int first_cause);

/* Whether a failure with result r is a first cause. */
static inline int rs_blame_first_cause(reshard_result_t r) {
  return r != RESHARD_ERROR_REMOTE && r != RESHARD_ERROR_TIMEOUT;
}

/* From reduced words: the failing rank (-1 if none, or if the words do
 * not come from one rank) and its message into why (NUL-terminated). */
int rs_blame_get(const uint64_t *w, char *why, size_t n);

#endif
