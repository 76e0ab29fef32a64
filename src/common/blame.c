/* The failing rank and its message through a max-reduction (blame.h). */
#include "common/blame.h"

#include <stdio.h>
#include <string.h>

#define RANK_SHIFT (8 * RS_BLAME_BYTES_PER_WORD)
#define CAPACITY (RS_BLAME_WORDS * RS_BLAME_BYTES_PER_WORD)

void rs_blame_put(uint64_t *w, int rank, const char *msg) {
  memset(w, 0, RS_BLAME_WORDS * sizeof *w);
  /* ranks of up to 2^24 - 2: the rank word above the bytes */
  if (!msg || rank < 0 || rank >= (1 << (64 - RANK_SHIFT)) - 1) return;
  const uint64_t who = (uint64_t)(rank + 1) << RANK_SHIFT;
  size_t len = strlen(msg);
  if (len > CAPACITY) len = CAPACITY;
  for (int i = 0; i < RS_BLAME_WORDS; i++) {
    uint64_t bytes = 0;
    for (int b = 0; b < RS_BLAME_BYTES_PER_WORD; b++) {
      size_t at = (size_t)i * RS_BLAME_BYTES_PER_WORD + (size_t)b;
      bytes = bytes << 8 | (at < len ? (unsigned char)msg[at] : 0);
    }
    w[i] = who | bytes;
  }
}

int rs_blame_get(const uint64_t *w, char *why, size_t n) {
  if (n) why[0] = 0;
  const uint64_t who = w[0] >> RANK_SHIFT;
  if (!who) return -1;
  for (int i = 1; i < RS_BLAME_WORDS; i++)
    if (w[i] >> RANK_SHIFT != who) return -1;
  char text[CAPACITY + 1];
  size_t len = 0;
  for (int i = 0; i < RS_BLAME_WORDS; i++)
    for (int b = RS_BLAME_BYTES_PER_WORD - 1; b >= 0; b--) {
      char c = (char)(w[i] >> (8 * b) & 0xff);
      if (!c) goto done;
      text[len++] = c;
    }
done:
  text[len] = 0;
  if (n) snprintf(why, n, "%s%s", text, len == CAPACITY ? "..." : "");
  return (int)(who - 1);
}
