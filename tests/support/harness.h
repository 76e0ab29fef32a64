/* Test harness shared by the data-moving tests: ranks as threads over the
 * in-process transport, buffers filled with values computed from global
 * coordinates, and byte-for-byte checks of every destination element and
 * of every byte outside the destination fragments. */
#ifndef RS_TEST_HARNESS_H
#define RS_TEST_HARNESS_H

#include <stddef.h>
#include <stdint.h>

#include "reshard.h"
#include "reshard_selftest.h"

/* Seeded values and byte-exact checks are the public self-test
 * (include/reshard_selftest.h, shared with the tools and examples); the
 * th_ names are the tests' spelling of them. */
typedef reshard_selftest_t th_side;
#define TH_SENTINEL RESHARD_SELFTEST_SENTINEL

static inline void th_expected(const char *name, uint64_t step, int64_t linear,
                               size_t esize, unsigned char *out) {
  reshard_selftest_expected(name, step, linear, esize, out);
}
static inline int th_side_alloc(th_side *s, const reshard_layout_t *L,
                                int rank, int64_t fill_step) {
  return reshard_selftest_alloc(s, L, rank, fill_step);
}
static inline void th_side_free(th_side *s) { reshard_selftest_free(s); }
static inline int64_t th_side_check(const th_side *s,
                                    const reshard_layout_t *L, int rank,
                                    uint64_t step, const char *label) {
  return reshard_selftest_check(s, L, rank, step, label);
}

/* Bytes of s that are not TH_SENTINEL (0: nothing was written to a side
 * allocated with fill_step -1). */
int64_t th_side_written(const th_side *s);

/* Whether two sides hold the same buffers, byte for byte. */
int th_sides_equal(const th_side *a, const th_side *b);

/* Runs fn(rank, comm, arg) on nranks threads of a fresh in-process world;
 * returns the number of ranks whose fn returned non-zero. */
typedef int (*th_rank_fn)(int rank, reshard_comm_t *comm, void *arg);
int th_run_ranks(int nranks, th_rank_fn fn, void *arg);

/* The common test body: every rank creates a plan, executes it `steps`
 * times (refilling sources per step) and checks its destination. Returns
 * total wrong elements + outside bytes over all ranks, or -1 on any API
 * failure (printed). */
typedef struct th_sync_args {
  const reshard_layout_t *src, *dst;
  reshard_options_t opts;
  int steps;
  int expect_fail; /* plan_create should fail with this code on all ranks */
  /* Called on each rank's thread with 1 just before plan_create and with
   * 0 just after (NULL: none): a test sets thread-local planner knobs. */
  void (*plan_hook)(int before);
  reshard_result_t expected_code;
  /* results */
  int64_t bad; /* summed over ranks */
  int api_failures;
  size_t send_bytes[1024]; /* per rank, from stats */
  size_t recv_bytes[1024];
  size_t local_bytes[1024];
} th_sync_args;

int64_t th_sync(int nranks, th_sync_args *args);

/* xorshift64* PRNG for property tests (seed printed on failure). */
static inline uint64_t th_rand(uint64_t *s) {
  uint64_t x = *s;
  x ^= x >> 12;
  x ^= x << 25;
  x ^= x >> 27;
  *s = x;
  return x * 0x2545F4914F6CDD1DULL;
}
static inline int64_t th_rand_range(uint64_t *s, int64_t lo, int64_t hi) {
  return lo + (int64_t)(th_rand(s) % (uint64_t)(hi - lo + 1));
}

#endif
