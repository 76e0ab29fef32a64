/* Seeded random layout pairs for property tests.
 *
 * rl_pair_make(seed, mode, &pair) builds a valid (source, destination)
 * layout pair over a world of 1..8 ranks, deterministically from the seed:
 *   - 1..4 tensors of any of the 13 dtypes, 0..4 dims, extents 0..12
 *     (capped so that a tensor stays small), the same on both sides;
 *   - each side over a random subset of the world; the two subsets are
 *     identical, overlapping (colocated ranks) or disjoint;
 *   - 1..3 meshes per side of 1..3 axes, explicit rank lists or strided;
 *   - placements Replicate, Shard(d) even, Shard(d) with split sizes, with
 *     several axes often sharding the same dim;
 *   - sometimes a fused buffer (tensors 0 and 1 concatenated, or grouped
 *     Megatron-style), padded shapes, a tensor placed twice, raw buffers
 *     with explicit strided fragments, a buffer of windows of one tensor
 *     (consecutive row ranges, one part each);
 *   - the source side always places every tensor at least once through a
 *     placement (which covers the whole tensor), so every destination
 *     element is held by some source rank and plan creation must succeed.
 * The destination side may leave a tensor unplaced.
 *
 * On failure, print the seed and rl_pair_print() the pair: it lists every
 * layout call the generator made. */
#ifndef RS_TEST_RANDOM_LAYOUT_H
#define RS_TEST_RANDOM_LAYOUT_H

#include <stdint.h>
#include <stdio.h>

#include "reshard.h"

typedef enum rl_mode {
  RL_ANY = 0,
  /* The source side is k >= 2 full replicas of every tensor (one mesh of
   * k ranks, every axis Replicate, no other source buffer, no padding or
   * grouping: each source rank holds each tensor as one fragment) and the
   * destination side is disjoint from it: the case where replica
   * balancing decides every source rank's egress. */
  RL_FULL_REPLICAS = 1,
  /* As RL_ANY, but every tensor is a float (f32, bf16, f16, fp8e4m3,
   * fp8e5m2) and mostly of another float dtype on the destination side
   * (converted in flight; fused partners keep equal element sizes on each
   * side). */
  RL_CASTS = 2
} rl_mode;

/* Features a pair exercises (rl_pair.features), so that tests can check
 * the generator still produces each of them. */
enum {
  RL_F_COLOCATED = 1u << 0,   /* a rank on both sides */
  RL_F_DISJOINT = 1u << 1,    /* no rank on both sides */
  RL_F_FUSED = 1u << 2,       /* a two-part concatenated buffer */
  RL_F_GROUPED = 1u << 3,     /* a two-part grouped buffer (num_groups > 1) */
  RL_F_PADDED = 1u << 4,      /* a padded shape */
  RL_F_SPLIT_SIZES = 1u << 5, /* Shard with explicit split sizes */
  RL_F_SAME_DIM = 1u << 6,    /* two mesh axes shard one dim */
  RL_F_RAW = 1u << 7,         /* raw buffer with explicit fragments */
  RL_F_SRC_REPLICAS = 1u << 8, /* a source element held by several ranks */
  RL_F_STRIDED_MESH = 1u << 9,
  RL_F_EMPTY_TENSOR = 1u << 10, /* a tensor with zero elements */
  RL_F_SCALAR = 1u << 11,       /* a 0-dim tensor */
  RL_F_WINDOWS = 1u << 12,      /* a buffer of windows of one tensor */
  RL_F_NUM = 13
};

typedef struct rl_pair {
  reshard_layout_t *src, *dst;
  int nranks;        /* world size: run ranks 0..nranks-1 */
  int full_replicas; /* RL_FULL_REPLICAS: k, the number of source ranks */
  unsigned features; /* RL_F_* bits */
  char *log;         /* every layout call made, one per line (private) */
  size_t log_len, log_cap;
} rl_pair;

/* Builds the pair for seed (any value). Returns 0, or -1 after printing
 * the failing call (a layout call rejected what the generator believes
 * valid: a generator or library bug). The pair is freed on failure. */
int rl_pair_make(uint64_t seed, rl_mode mode, rl_pair *out);
void rl_pair_free(rl_pair *p);

/* Prints every layout call the generator made for the pair. */
void rl_pair_print(const rl_pair *p, FILE *out);

/* Short name of feature bit i (0 <= i < RL_F_NUM). */
const char *rl_feature_name(int i);

#endif
