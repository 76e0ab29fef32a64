/* The one 64-bit mixer of the library (a bijective finalizer: every input
 * bit moves every output bit), for hashing keys into tags and buckets
 * and for tie-breaks. (The self-test's value oracle, src/selftest, keeps
 * its own on purpose: the expected values must not share code with what
 * they check.) */
#ifndef RS_COMMON_HASH_H
#define RS_COMMON_HASH_H

#include <stdint.h>

static inline uint64_t rs_mix64(uint64_t x) {
  x ^= x >> 31;
  x *= 0x7fb5d329728ea185ULL;
  x ^= x >> 27;
  x *= 0x81dadef4bc2dd44dULL;
  x ^= x >> 33;
  return x;
}

/* A set of ranks (sorted, so that equal sets hash alike), never 0: what
 * ranks compare to agree on it (a UCX rejoin's replaced ranks). */
static inline uint64_t rs_hash_ranks(const int32_t *r, int n) {
  uint64_t h = rs_mix64((uint64_t)n);
  for (int i = 0; i < n; i++) h = rs_mix64(h ^ (uint64_t)(uint32_t)r[i]);
  return h | 1;
}

#endif
