/* Naming the rank that failed, and why, in a max-reduction.
 *
 * Collective agreements (plan creation, the double-buffer commit) are
 * max-reductions of a few words, so a rank's failure reaches the others
 * as a number only: "another rank failed with 'invalid argument'". These
 * words carry the failing rank and the start of its message through the
 * same reduction, at no extra round trip: every word holds the rank + 1
 * in its top bits and a few message bytes below, so the max of each word
 * comes from the highest failing rank, and all of them from the same one
 * (a rank without a failure contributes zeros). */
#ifndef RS_COMMON_BLAME_H
#define RS_COMMON_BLAME_H

#include <stddef.h>
#include <stdint.h>

#define RS_BLAME_BYTES_PER_WORD 5
#define RS_BLAME_WORDS 32 /* the first 160 bytes of the message */

/* This rank's words (RS_BLAME_WORDS at w): zeros if msg is NULL (no
 * failure), else the rank and msg (cut to what fits). */
void rs_blame_put(uint64_t *w, int rank, const char *msg);

/* From reduced words: the failing rank (-1 if none, or if the words do
 * not come from one rank) and its message into why (NUL-terminated,
 * "..." where it was cut). */
int rs_blame_get(const uint64_t *w, char *why, size_t n);

#endif
