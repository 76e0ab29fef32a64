/* Test harness shared by the data-moving tests: ranks as threads over the
 * in-process transport, buffers filled with values computed from global
 * coordinates, and byte-for-byte checks of every destination element and
 * of every byte outside the destination fragments. */
#ifndef RS_TEST_HARNESS_H
#define RS_TEST_HARNESS_H

#include <stddef.h>
#include <stdint.h>

#include "reshard.h"

/* The expected bytes of element `linear` (row-major global index) of the
 * tensor called `name`, for a given step: independent of any layout. */
void th_expected(const char *name, uint64_t step, int64_t linear,
                 size_t esize, unsigned char *out);

/* One rank's buffers for one side of a layout. */
typedef struct th_side {
  int nbuf;
  unsigned char **ptr;   /* NULL where the rank holds nothing */
  size_t *bytes;
  unsigned char **mask;  /* 1 where a fragment element lives */
} th_side;

#define TH_SENTINEL 0xA5

/* Allocates this rank's buffers (sentinel-filled) and masks; when
 * fill_step >= 0 writes the expected values of that step into every
 * fragment (source side). */
int th_side_alloc(th_side *s, const reshard_layout_t *L, int rank,
                  int64_t fill_step);
void th_side_free(th_side *s);

/* Counts wrong destination elements (against step) and modified bytes
 * outside fragments. Prints the first few problems with the tensor name. */
int64_t th_side_check(const th_side *s, const reshard_layout_t *L, int rank,
                      uint64_t step, const char *label);

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
