/* The failing rank and its message through a max-reduction (blame.h). */
#include "common/blame.h"

#include <stdio.h>
#include <string.h>

#define RANK_SHIFT (8 * RS_BLAME_BYTES_PER_WORD)
#define FIRST_CAUSE (1ull << 63)
#define CAPACITY (RS_BLAME_WORDS * RS_BLAME_BYTES_PER_WORD)

void rs_blame_put(uint64_t *w, int rank, const char *msg, int first_cause) {
  memset(w, 0, RS_BLAME_WORDS * sizeof *w);
  if (!msg || rank < 0 || rank > RS_BLAME_MAX_RANK) return;
  const uint64_t who = (first_cause ? FIRST_CAUSE : 0) | (uint64_t)(rank + 1) << RANK_SHIFT;
  char text[CAPACITY];
  size_t len = strlen(msg);
  memcpy(text, msg, len < CAPACITY ? len : CAPACITY);
  if (len > CAPACITY) { /* cut: it says so */
    memcpy(text + CAPACITY - 3, "...", 3);
    len = CAPACITY;
  }
  for (int i = 0; i < RS_BLAME_WORDS; i++) {
    uint64_t bytes = 0;
    for (int b = 0; b < RS_BLAME_BYTES_PER_WORD; b++) {
      size_t at = (size_t)i * RS_BLAME_BYTES_PER_WORD + (size_t)b;
      bytes = bytes << 8 | (at < len ? (unsigned char)text[at] : 0);
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
  for (int i = 0; i < RS_BLAME_WORDS && len == (size_t)i * RS_BLAME_BYTES_PER_WORD; i++)
    for (int b = RS_BLAME_BYTES_PER_WORD - 1; b >= 0; b--) {
      const char c = (char)(w[i] >> (8 * b) & 0xff);
      if (!c) break;
      text[len++] = c;
    }
  text[len] = 0;
  if (n) snprintf(why, n, "%s", text);
  return (int)((who & ~(FIRST_CAUSE >> RANK_SHIFT)) - 1);
}
