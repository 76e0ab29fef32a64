/* The in-process transport: matching, ordering, errors, deadlines, cancel
 * and the allreduce barrier. CMocka's assertions longjmp and so must stay
 * on the main thread: rank threads record their first failure in their
 * argument block and the main thread asserts on it after joining. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/clock.h"
#include "reshard.h"
#include "reshard_inproc.h"
#include "transport/transport.h"

#define MS (1000000LL)

/* ------------------------------------------------------------------ */
/* Helpers                                                             */
/* ------------------------------------------------------------------ */

typedef struct rank_arg {
  reshard_inproc_world_t *world;
  reshard_comm_t *comm;
  int rank, nranks;
  int param;
  int failed;
  char why[512];
  int64_t t0_ns, elapsed_ns;
  reshard_result_t result;
} rank_arg;

static void rank_fail(rank_arg *a, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static void rank_fail(rank_arg *a, const char *fmt, ...) {
  if (a->failed++) return;
  va_list ap;
  va_start(ap, fmt);
  int off = snprintf(a->why, sizeof a->why, "rank %d: ", a->rank);
  vsnprintf(a->why + off, sizeof a->why - (size_t)off, fmt, ap);
  va_end(ap);
}

#define RCHECK(a, cond, ...)        \
  do {                              \
    if (!(cond)) {                  \
      rank_fail((a), __VA_ARGS__);  \
      goto out;                     \
    }                               \
  } while (0)

/* Runs fn on nranks threads, each with its own communicator taken from
 * world, and fails the test with the first thread failure. */
static void run_ranks(reshard_inproc_world_t *world, int nranks, int param,
                      void *(*fn)(void *), rank_arg *args) {
  pthread_t th[64];
  assert_true(nranks <= 64);
  for (int r = 0; r < nranks; r++) {
    memset(&args[r], 0, sizeof args[r]);
    args[r].world = world;
    args[r].rank = r;
    args[r].nranks = nranks;
    args[r].param = param;
    assert_int_equal(reshard_comm_create_inproc(world, r, &args[r].comm),
                     RESHARD_SUCCESS);
  }
  for (int r = 0; r < nranks; r++)
    assert_int_equal(pthread_create(&th[r], NULL, fn, &args[r]), 0);
  for (int r = 0; r < nranks; r++) pthread_join(th[r], NULL);
  for (int r = 0; r < nranks; r++) reshard_comm_destroy(args[r].comm);
  for (int r = 0; r < nranks; r++)
    if (args[r].failed) fail_msg("%s", args[r].why);
}

static unsigned char pattern(int src, int dst, uint64_t tag, size_t i) {
  uint64_t h = (uint64_t)src * 1000003u + (uint64_t)dst * 10007u +
               tag * 131u + i * 7u;
  h ^= h >> 13;
  return (unsigned char)(h * 0x9Du);
}

static void fill(unsigned char *buf, size_t n, int src, int dst,
                 uint64_t tag) {
  for (size_t i = 0; i < n; i++) buf[i] = pattern(src, dst, tag, i);
}

/* Index of the first wrong byte, or -1. */
static long check(const unsigned char *buf, size_t n, int src, int dst,
                  uint64_t tag) {
  for (size_t i = 0; i < n; i++)
    if (buf[i] != pattern(src, dst, tag, i)) return (long)i;
  return -1;
}

static void assert_error_mentions(const char *needle) {
  const char *err = reshard_last_error();
  if (!strstr(err, needle))
    fail_msg("last error \"%s\" does not mention \"%s\"", err, needle);
}

/* Two communicators driven from one thread: sends never block, so
 * orderings can be set up deterministically. */
typedef struct pair {
  reshard_inproc_world_t *w;
  reshard_comm_t *c[2];
  const rs_transport_ops *ops;
} pair;

static void pair_open(pair *p) {
  assert_int_equal(reshard_inproc_world_create(2, &p->w), RESHARD_SUCCESS);
  for (int r = 0; r < 2; r++)
    assert_int_equal(reshard_comm_create_inproc(p->w, r, &p->c[r]),
                     RESHARD_SUCCESS);
  p->ops = p->c[0]->ops;
}

static void pair_close(pair *p) {
  reshard_comm_destroy(p->c[0]);
  reshard_comm_destroy(p->c[1]);
  reshard_inproc_world_destroy(p->w);
}

/* ------------------------------------------------------------------ */
/* World and communicators                                             */
/* ------------------------------------------------------------------ */

static void test_world_create_destroy(void **state) {
  (void)state;
  for (int n = 1; n <= 9; n += 4) {
    reshard_inproc_world_t *w = NULL;
    assert_int_equal(reshard_inproc_world_create(n, &w), RESHARD_SUCCESS);
    assert_non_null(w);
    reshard_comm_t *c[9];
    for (int r = 0; r < n; r++) {
      assert_int_equal(reshard_comm_create_inproc(w, r, &c[r]),
                       RESHARD_SUCCESS);
      assert_int_equal(reshard_comm_rank(c[r]), r);
      assert_int_equal(reshard_comm_size(c[r]), n);
      assert_string_equal(c[r]->ops->name, "inproc");
    }
    /* Out of order, to show ranks are independent. */
    for (int r = n - 1; r >= 0; r--) reshard_comm_destroy(c[r]);
    reshard_inproc_world_destroy(w);
  }
  reshard_inproc_world_destroy(NULL);
  reshard_comm_destroy(NULL);
  assert_int_equal(reshard_comm_rank(NULL), -1);
  assert_int_equal(reshard_comm_size(NULL), -1);
}

static void test_world_destroy_frees_pending(void **state) {
  (void)state;
  pair p;
  pair_open(&p);
  unsigned char out[100], in[100];
  fill(out, sizeof out, 0, 1, 3);
  rs_request *rq;
  /* Undelivered messages and a posted receive left behind. */
  for (int i = 0; i < 5; i++) {
    assert_int_equal(p.ops->isend(p.c[0], 1, 3, out, sizeof out, &rq),
                     RESHARD_SUCCESS);
    assert_int_equal(p.ops->wait(p.c[0], rq, RS_NO_DEADLINE),
                     RESHARD_SUCCESS);
  }
  assert_int_equal(p.ops->irecv(p.c[0], 1, 4, in, sizeof in, &rq),
                   RESHARD_SUCCESS);
  pair_close(&p); /* ASan/valgrind check nothing leaks */
}

static void test_bad_args(void **state) {
  (void)state;
  reshard_inproc_world_t *w = (reshard_inproc_world_t *)1;
  assert_int_equal(reshard_inproc_world_create(0, &w),
                   RESHARD_ERROR_INVALID_ARGUMENT);
  assert_null(w);
  assert_error_mentions("nranks");
  assert_int_equal(reshard_inproc_world_create(-3, &w),
                   RESHARD_ERROR_INVALID_ARGUMENT);
  assert_error_mentions("-3");
  assert_int_equal(reshard_inproc_world_create(4, NULL),
                   RESHARD_ERROR_INVALID_ARGUMENT);

  assert_int_equal(reshard_inproc_world_create(4, &w), RESHARD_SUCCESS);
  reshard_comm_t *c = (reshard_comm_t *)1, *c1 = NULL, *c2 = NULL;
  assert_int_equal(reshard_comm_create_inproc(NULL, 0, &c),
                   RESHARD_ERROR_INVALID_ARGUMENT);
  assert_null(c);
  assert_error_mentions("world");
  assert_int_equal(reshard_comm_create_inproc(w, -1, &c),
                   RESHARD_ERROR_INVALID_ARGUMENT);
  assert_error_mentions("rank -1");
  assert_int_equal(reshard_comm_create_inproc(w, 4, &c),
                   RESHARD_ERROR_INVALID_ARGUMENT);
  assert_error_mentions("rank 4");
  assert_int_equal(reshard_comm_create_inproc(w, 0, NULL),
                   RESHARD_ERROR_INVALID_ARGUMENT);

  /* A rank is held by one communicator at a time. */
  assert_int_equal(reshard_comm_create_inproc(w, 1, &c1), RESHARD_SUCCESS);
  assert_int_equal(reshard_comm_create_inproc(w, 1, &c2),
                   RESHARD_ERROR_INVALID_USAGE);
  assert_null(c2);
  assert_error_mentions("rank 1");
  reshard_comm_destroy(c1);
  assert_int_equal(reshard_comm_create_inproc(w, 1, &c1), RESHARD_SUCCESS);

  const rs_transport_ops *ops = c1->ops;
  unsigned char buf[8] = {0};
  rs_request *rq = NULL;
  assert_int_equal(ops->isend(c1, 4, 0, buf, sizeof buf, &rq),
                   RESHARD_ERROR_INVALID_ARGUMENT);
  assert_error_mentions("peer 4");
  assert_int_equal(ops->isend(c1, -1, 0, buf, sizeof buf, &rq),
                   RESHARD_ERROR_INVALID_ARGUMENT);
  assert_int_equal(ops->irecv(c1, 0, 0, NULL, 8, &rq),
                   RESHARD_ERROR_INVALID_ARGUMENT);
  assert_error_mentions("buf");
  assert_int_equal(ops->irecv(c1, 0, 0, buf, sizeof buf, NULL),
                   RESHARD_ERROR_INVALID_ARGUMENT);
  assert_int_equal(ops->wait(c1, NULL, RS_NO_DEADLINE),
                   RESHARD_ERROR_INVALID_ARGUMENT);
  int done = 0;
  assert_int_equal(ops->test(c1, NULL, &done),
                   RESHARD_ERROR_INVALID_ARGUMENT);
  ops->cancel(c1, NULL);

  uint64_t v[2] = {0, 0};
  assert_int_equal(ops->allreduce_max_u64(c1, v, -1, RS_NO_DEADLINE),
                   RESHARD_ERROR_INVALID_ARGUMENT);
  assert_error_mentions("n = -1");
  assert_int_equal(ops->allreduce_max_u64(c1, v, 100000, RS_NO_DEADLINE),
                   RESHARD_ERROR_INVALID_ARGUMENT);
  assert_int_equal(ops->allreduce_max_u64(c1, NULL, 2, RS_NO_DEADLINE),
                   RESHARD_ERROR_INVALID_ARGUMENT);

  /* Zero-byte messages with NULL buffers are fine. */
  assert_int_equal(ops->isend(c1, 1, 5, NULL, 0, &rq), RESHARD_SUCCESS);
  assert_int_equal(ops->wait(c1, rq, RS_NO_DEADLINE), RESHARD_SUCCESS);
  assert_int_equal(ops->irecv(c1, 1, 5, NULL, 0, &rq), RESHARD_SUCCESS);
  assert_int_equal(ops->wait(c1, rq, RS_NO_DEADLINE), RESHARD_SUCCESS);

  reshard_comm_destroy(c1);
  reshard_inproc_world_destroy(w);
}

/* ------------------------------------------------------------------ */
/* Point to point                                                      */
/* ------------------------------------------------------------------ */

static const size_t ring_sizes[] = {0, 1, 7, 64, 4096, 65539, 1 << 20};
#define RING_ROUNDS (int)(sizeof ring_sizes / sizeof ring_sizes[0])

static void *ring_rank(void *p) {
  rank_arg *a = p;
  const rs_transport_ops *ops = a->comm->ops;
  int right = (a->rank + 1) % a->nranks;
  int left = (a->rank + a->nranks - 1) % a->nranks;
  unsigned char *out = malloc(1 << 20), *in = malloc(1 << 20);
  RCHECK(a, out && in, "malloc");
  for (int it = 0; it < 3 * RING_ROUNDS; it++) {
    size_t n = ring_sizes[it % RING_ROUNDS];
    uint64_t tag = (uint64_t)it;
    fill(out, n, a->rank, right, tag);
    memset(in, 0xEE, n);
    rs_request *sr = NULL, *rr = NULL;
    /* Half the ranks post first and half send first, so both the posted
     * and the unexpected path carry traffic. */
    if ((a->rank + it) & 1) {
      RCHECK(a, ops->irecv(a->comm, left, tag, in, n, &rr) == 0, "irecv");
      RCHECK(a, ops->isend(a->comm, right, tag, out, n, &sr) == 0, "isend");
    } else {
      RCHECK(a, ops->isend(a->comm, right, tag, out, n, &sr) == 0, "isend");
      RCHECK(a, ops->irecv(a->comm, left, tag, in, n, &rr) == 0, "irecv");
    }
    int64_t dl = rs_now_ns() + 30000 * MS;
    RCHECK(a, ops->wait(a->comm, sr, dl) == 0, "wait send: %s",
           reshard_last_error());
    RCHECK(a, ops->wait(a->comm, rr, dl) == 0, "wait recv: %s",
           reshard_last_error());
    long bad = check(in, n, left, a->rank, tag);
    RCHECK(a, bad < 0, "round %d: byte %ld of %zu from rank %d is wrong", it,
           bad, n, left);
  }
out:
  free(out);
  free(in);
  return NULL;
}

static void test_ring(void **state) {
  (void)state;
  rank_arg args[8];
  for (int n = 4; n <= 8; n += 4) {
    reshard_inproc_world_t *w;
    assert_int_equal(reshard_inproc_world_create(n, &w), RESHARD_SUCCESS);
    run_ranks(w, n, 0, ring_rank, args);
    reshard_inproc_world_destroy(w);
  }
}

/* Every rank sends several messages to every rank (itself included) on a
 * few tags, so several senders race on each mailbox. */
#define A2A_TAGS 4
#define A2A_PER_TAG 12

static size_t a2a_size(int src, int dst, int t, int k) {
  return (size_t)((src * 7 + dst * 3 + t * 5 + k * 11) % 300);
}

static void *a2a_rank(void *p) {
  rank_arg *a = p;
  const rs_transport_ops *ops = a->comm->ops;
  const int n = a->nranks, per = A2A_TAGS * A2A_PER_TAG;
  rs_request **rr = calloc((size_t)n * per, sizeof *rr);
  unsigned char *in = calloc((size_t)n * per, 300);
  unsigned char out[300];
  RCHECK(a, rr && in, "malloc");
  /* Receives for the even sources are posted up front; the rest after
   * sending, so they match queued messages. */
  for (int pass = 0; pass < 2; pass++) {
    for (int src = 0; src < n; src++) {
      if ((src & 1) != pass) continue;
      for (int t = 0; t < A2A_TAGS; t++)
        for (int k = 0; k < A2A_PER_TAG; k++) {
          int i = (src * A2A_TAGS + t) * A2A_PER_TAG + k;
          RCHECK(a,
                 ops->irecv(a->comm, src, (uint64_t)t, in + (size_t)i * 300,
                            a2a_size(src, a->rank, t, k), &rr[i]) == 0,
                 "irecv");
        }
    }
    if (pass == 0) {
      for (int k = 0; k < A2A_PER_TAG; k++)
        for (int t = A2A_TAGS - 1; t >= 0; t--)
          for (int d = 0; d < n; d++) {
            int dst = (a->rank + d) % n;
            size_t sz = a2a_size(a->rank, dst, t, k);
            fill(out, sz, a->rank, dst, (uint64_t)(t * 1000 + k));
            rs_request *sr;
            RCHECK(a, ops->isend(a->comm, dst, (uint64_t)t, out, sz, &sr) == 0,
                   "isend");
            /* The payload must already be copied out of `out`. */
            memset(out, 0, sz);
            RCHECK(a, ops->wait(a->comm, sr, RS_NO_DEADLINE) == 0,
                   "wait send");
          }
    }
  }
  for (int src = 0; src < n; src++)
    for (int t = 0; t < A2A_TAGS; t++)
      for (int k = 0; k < A2A_PER_TAG; k++) {
        int i = (src * A2A_TAGS + t) * A2A_PER_TAG + k;
        reshard_result_t r =
            ops->wait(a->comm, rr[i], rs_now_ns() + 30000 * MS);
        rr[i] = NULL;
        RCHECK(a, r == 0, "wait recv from %d tag %d #%d: %s", src, t, k,
               reshard_last_error());
        size_t sz = a2a_size(src, a->rank, t, k);
        long bad = check(in + (size_t)i * 300, sz, src, a->rank,
                         (uint64_t)(t * 1000 + k));
        RCHECK(a, bad < 0, "from %d tag %d #%d: byte %ld wrong", src, t, k,
               bad);
      }
out:
  if (rr)
    for (int i = 0; i < n * per; i++)
      if (rr[i]) ops->cancel(a->comm, rr[i]);
  free(rr);
  free(in);
  return NULL;
}

static void test_all_to_all(void **state) {
  (void)state;
  rank_arg args[8];
  reshard_inproc_world_t *w;
  assert_int_equal(reshard_inproc_world_create(8, &w), RESHARD_SUCCESS);
  for (int rep = 0; rep < 3; rep++) run_ranks(w, 8, 0, a2a_rank, args);
  reshard_inproc_world_destroy(w);
}

/* Same-tag messages from one sender arrive in the order sent, whatever the
 * mix of posted and unexpected receives; a second tag interleaved with the
 * first does not disturb either order. */
#define FIFO_COUNT 3000

static size_t fifo_size(int i) { return 8 + (size_t)(i % 29); }

static void *fifo_rank(void *p) {
  rank_arg *a = p;
  const rs_transport_ops *ops = a->comm->ops;
  unsigned char buf[64];
  if (a->rank == 0) {
    for (int i = 0; i < FIFO_COUNT; i++) {
      uint64_t tag = (i % 3 == 0) ? 8 : 7;
      size_t n = fifo_size(i);
      fill(buf, n, 0, 1, (uint64_t)i);
      rs_request *sr;
      RCHECK(a, ops->isend(a->comm, 1, tag, buf, n, &sr) == 0, "isend %d", i);
      RCHECK(a, ops->wait(a->comm, sr, RS_NO_DEADLINE) == 0, "wait %d", i);
      if (i % 97 == 0) sched_yield();
    }
  } else {
    /* Tag 7 first (with a window of outstanding receives), then tag 8,
     * which has been piling up meanwhile. */
    enum { WIN = 16 };
    for (int pass = 0; pass < 2; pass++) {
      uint64_t tag = pass ? 8 : 7;
      int idx[FIFO_COUNT], m = 0;
      for (int i = 0; i < FIFO_COUNT; i++)
        if (((i % 3 == 0) ? 8u : 7u) == tag) idx[m++] = i;
      unsigned char win[WIN][64];
      rs_request *rq[WIN];
      int head = 0, posted = 0;
      while (head < m) {
        while (posted < m && posted - head < WIN) {
          RCHECK(a,
                 ops->irecv(a->comm, 0, tag, win[posted % WIN],
                            fifo_size(idx[posted]), &rq[posted % WIN]) == 0,
                 "irecv");
          posted++;
        }
        int i = idx[head];
        reshard_result_t r = ops->wait(a->comm, rq[head % WIN],
                                       rs_now_ns() + 30000 * MS);
        RCHECK(a, r == 0, "message %d (tag %llu): %s", i,
               (unsigned long long)tag, reshard_last_error());
        long bad = check(win[head % WIN], fifo_size(i), 0, 1, (uint64_t)i);
        RCHECK(a, bad < 0, "message %d (tag %llu) out of order: byte %ld", i,
               (unsigned long long)tag, bad);
        head++;
      }
    }
  }
out:
  return NULL;
}

static void test_fifo_same_tag(void **state) {
  (void)state;
  rank_arg args[2];
  reshard_inproc_world_t *w;
  assert_int_equal(reshard_inproc_world_create(2, &w), RESHARD_SUCCESS);
  run_ranks(w, 2, 0, fifo_rank, args);
  reshard_inproc_world_destroy(w);
}

static void test_recv_before_and_after_send(void **state) {
  (void)state;
  pair p;
  pair_open(&p);
  unsigned char out[333], in[333];
  rs_request *sr, *rr;
  int done = -1;

  /* Posted before the send: delivered straight into the buffer. */
  fill(out, sizeof out, 0, 1, 11);
  memset(in, 0, sizeof in);
  assert_int_equal(p.ops->irecv(p.c[1], 0, 11, in, sizeof in, &rr),
                   RESHARD_SUCCESS);
  assert_int_equal(p.ops->test(p.c[1], rr, &done), RESHARD_SUCCESS);
  assert_int_equal(done, 0);
  assert_int_equal(p.ops->isend(p.c[0], 1, 11, out, sizeof out, &sr),
                   RESHARD_SUCCESS);
  memset(out, 0, sizeof out);
  assert_int_equal(p.ops->test(p.c[0], sr, &done), RESHARD_SUCCESS);
  assert_int_equal(done, 1); /* eager */
  assert_int_equal(p.ops->test(p.c[1], rr, &done), RESHARD_SUCCESS);
  assert_int_equal(done, 1);
  assert_int_equal(check(in, sizeof in, 0, 1, 11), -1);

  /* Sent before the receive: queued, then matched by irecv. */
  fill(out, sizeof out, 1, 0, 12);
  memset(in, 0, sizeof in);
  assert_int_equal(p.ops->isend(p.c[1], 0, 12, out, sizeof out, &sr),
                   RESHARD_SUCCESS);
  memset(out, 0, sizeof out); /* the copy is already taken */
  assert_int_equal(p.ops->wait(p.c[1], sr, RS_NO_DEADLINE), RESHARD_SUCCESS);
  assert_int_equal(p.ops->irecv(p.c[0], 1, 12, in, sizeof in, &rr),
                   RESHARD_SUCCESS);
  assert_int_equal(p.ops->wait(p.c[0], rr, rs_now_ns() + 1000 * MS),
                   RESHARD_SUCCESS);
  assert_int_equal(check(in, sizeof in, 1, 0, 12), -1);

  /* Tags and sources are matched exactly: a message on another tag or
   * from another source does not satisfy the receive. */
  fill(out, sizeof out, 0, 1, 13);
  assert_int_equal(p.ops->irecv(p.c[1], 0, 14, in, sizeof in, &rr),
                   RESHARD_SUCCESS);
  assert_int_equal(p.ops->isend(p.c[0], 1, 13, out, sizeof out, &sr),
                   RESHARD_SUCCESS);
  assert_int_equal(p.ops->isend(p.c[1], 1, 14, out, sizeof out, &sr),
                   RESHARD_SUCCESS);
  assert_int_equal(p.ops->test(p.c[1], rr, &done), RESHARD_SUCCESS);
  assert_int_equal(done, 0);
  fill(out, sizeof out, 0, 1, 14);
  assert_int_equal(p.ops->isend(p.c[0], 1, 14, out, sizeof out, &sr),
                   RESHARD_SUCCESS);
  assert_int_equal(p.ops->wait(p.c[1], rr, RS_NO_DEADLINE), RESHARD_SUCCESS);
  assert_int_equal(check(in, sizeof in, 0, 1, 14), -1);
  /* Drain the two strays (tag 13 from 0, tag 14 from self). */
  assert_int_equal(p.ops->irecv(p.c[1], 0, 13, in, sizeof in, &rr),
                   RESHARD_SUCCESS);
  assert_int_equal(p.ops->wait(p.c[1], rr, RS_NO_DEADLINE), RESHARD_SUCCESS);
  assert_int_equal(check(in, sizeof in, 0, 1, 13), -1);
  assert_int_equal(p.ops->irecv(p.c[1], 1, 14, in, sizeof in, &rr),
                   RESHARD_SUCCESS);
  assert_int_equal(p.ops->wait(p.c[1], rr, RS_NO_DEADLINE), RESHARD_SUCCESS);

  pair_close(&p);
}

static void test_size_mismatch(void **state) {
  (void)state;
  pair p;
  pair_open(&p);
  unsigned char out[16], in[16];
  rs_request *sr, *rr;
  fill(out, sizeof out, 0, 1, 42);

  /* Receive posted first: the sender finds it. */
  memset(in, 0x5A, sizeof in);
  assert_int_equal(p.ops->irecv(p.c[1], 0, 42, in, 8, &rr), RESHARD_SUCCESS);
  assert_int_equal(p.ops->isend(p.c[0], 1, 42, out, 16, &sr),
                   RESHARD_SUCCESS);
  assert_int_equal(p.ops->wait(p.c[0], sr, RS_NO_DEADLINE), RESHARD_SUCCESS);
  assert_int_equal(p.ops->wait(p.c[1], rr, RS_NO_DEADLINE),
                   RESHARD_ERROR_MISMATCH);
  assert_error_mentions("rank 1");
  assert_error_mentions("rank 0");
  assert_null(strstr(reshard_last_error(), "tag"));
  assert_error_mentions("16 bytes");
  assert_error_mentions("8 bytes");
  for (size_t i = 0; i < sizeof in; i++) assert_int_equal(in[i], 0x5A);

  /* Message queued first: irecv finds it; reported through test. */
  assert_int_equal(p.ops->isend(p.c[0], 1, 42, out, 4, &sr), RESHARD_SUCCESS);
  assert_int_equal(p.ops->irecv(p.c[1], 0, 42, in, 16, &rr), RESHARD_SUCCESS);
  int done = 0;
  assert_int_equal(p.ops->test(p.c[1], rr, &done), RESHARD_ERROR_MISMATCH);
  assert_int_equal(done, 1);
  assert_error_mentions("4 bytes");
  assert_error_mentions("16 bytes");

  /* The mismatched messages were consumed: the key works again. */
  assert_int_equal(p.ops->isend(p.c[0], 1, 42, out, 16, &sr),
                   RESHARD_SUCCESS);
  assert_int_equal(p.ops->irecv(p.c[1], 0, 42, in, 16, &rr), RESHARD_SUCCESS);
  assert_int_equal(p.ops->wait(p.c[1], rr, RS_NO_DEADLINE), RESHARD_SUCCESS);
  assert_int_equal(check(in, 16, 0, 1, 42), -1);
  pair_close(&p);
}

static void test_recv_timeout(void **state) {
  (void)state;
  pair p;
  pair_open(&p);
  unsigned char in[32], out[32];
  rs_request *rr, *sr;
  assert_int_equal(p.ops->irecv(p.c[0], 1, 9, in, sizeof in, &rr),
                   RESHARD_SUCCESS);
  int64_t t0 = rs_now_ns();
  reshard_result_t r = p.ops->wait(p.c[0], rr, t0 + 50 * MS);
  int64_t dt = rs_now_ns() - t0;
  assert_int_equal(r, RESHARD_ERROR_TIMEOUT);
  assert_true(dt >= 49 * MS);
  assert_true(dt < 5000 * MS);
  assert_error_mentions("rank 0");
  assert_error_mentions("rank 1");
  assert_error_mentions("did not complete before the deadline");
  /* the tag is the executor's encoding, meaningless as a number (issue
   * 42, item 8: "tag 9223372036854775809") */
  assert_null(strstr(reshard_last_error(), "tag"));

  /* A deadline already past fails at once. */
  t0 = rs_now_ns();
  assert_int_equal(p.ops->wait(p.c[0], rr, t0 - 1), RESHARD_ERROR_TIMEOUT);
  assert_true(rs_now_ns() - t0 < 1000 * MS);

  /* The request survives a timeout and can still complete. */
  fill(out, sizeof out, 1, 0, 9);
  assert_int_equal(p.ops->isend(p.c[1], 0, 9, out, sizeof out, &sr),
                   RESHARD_SUCCESS);
  assert_int_equal(p.ops->wait(p.c[0], rr, t0 + 50 * MS), RESHARD_SUCCESS);
  assert_int_equal(check(in, sizeof in, 1, 0, 9), -1);

  /* Or be cancelled. */
  assert_int_equal(p.ops->irecv(p.c[0], 1, 10, in, sizeof in, &rr),
                   RESHARD_SUCCESS);
  assert_int_equal(p.ops->wait(p.c[0], rr, rs_now_ns() + 10 * MS),
                   RESHARD_ERROR_TIMEOUT);
  p.ops->cancel(p.c[0], rr);
  pair_close(&p);
}

/* A waiter blocked in another thread is woken by the send. */
static void *late_sender(void *p) {
  rank_arg *a = p;
  unsigned char out[1000];
  struct timespec ts = {0, 20 * MS};
  nanosleep(&ts, NULL);
  fill(out, sizeof out, 1, 0, 77);
  rs_request *sr;
  if (a->comm->ops->isend(a->comm, 0, 77, out, sizeof out, &sr) != 0)
    rank_fail(a, "isend: %s", reshard_last_error());
  return NULL;
}

static void test_wait_wakes_on_send(void **state) {
  (void)state;
  pair p;
  pair_open(&p);
  unsigned char in[1000];
  rs_request *rr;
  assert_int_equal(p.ops->irecv(p.c[0], 1, 77, in, sizeof in, &rr),
                   RESHARD_SUCCESS);
  rank_arg a = {.comm = p.c[1], .rank = 1};
  pthread_t th;
  assert_int_equal(pthread_create(&th, NULL, late_sender, &a), 0);
  assert_int_equal(p.ops->wait(p.c[0], rr, rs_now_ns() + 10000 * MS),
                   RESHARD_SUCCESS);
  pthread_join(th, NULL);
  if (a.failed) fail_msg("%s", a.why);
  assert_int_equal(check(in, sizeof in, 1, 0, 77), -1);
  pair_close(&p);
}

static void test_cancel(void **state) {
  (void)state;
  pair p;
  pair_open(&p);
  unsigned char out[24], in[3][24];
  rs_request *rr[3], *sr;

  /* A cancelled receive neither takes the message nor touches its
   * buffer. */
  memset(in[0], 0x11, sizeof in[0]);
  assert_int_equal(p.ops->irecv(p.c[1], 0, 5, in[0], 24, &rr[0]),
                   RESHARD_SUCCESS);
  p.ops->cancel(p.c[1], rr[0]);
  fill(out, sizeof out, 0, 1, 5);
  assert_int_equal(p.ops->isend(p.c[0], 1, 5, out, 24, &sr), RESHARD_SUCCESS);
  for (size_t i = 0; i < 24; i++) assert_int_equal(in[0][i], 0x11);
  assert_int_equal(p.ops->irecv(p.c[1], 0, 5, in[1], 24, &rr[1]),
                   RESHARD_SUCCESS);
  assert_int_equal(p.ops->wait(p.c[1], rr[1], RS_NO_DEADLINE),
                   RESHARD_SUCCESS);
  assert_int_equal(check(in[1], 24, 0, 1, 5), -1);

  /* Cancelling the middle of three posted receives with one key: the
   * others keep their order. */
  for (int i = 0; i < 3; i++) {
    memset(in[i], 0, 24);
    assert_int_equal(p.ops->irecv(p.c[1], 0, 6, in[i], 24, &rr[i]),
                     RESHARD_SUCCESS);
  }
  p.ops->cancel(p.c[1], rr[1]);
  for (int k = 0; k < 2; k++) {
    fill(out, sizeof out, 0, 1, (uint64_t)(100 + k));
    assert_int_equal(p.ops->isend(p.c[0], 1, 6, out, 24, &sr),
                     RESHARD_SUCCESS);
  }
  assert_int_equal(p.ops->wait(p.c[1], rr[0], RS_NO_DEADLINE),
                   RESHARD_SUCCESS);
  assert_int_equal(p.ops->wait(p.c[1], rr[2], RS_NO_DEADLINE),
                   RESHARD_SUCCESS);
  assert_int_equal(check(in[0], 24, 0, 1, 100), -1);
  assert_int_equal(check(in[2], 24, 0, 1, 101), -1);
  for (size_t i = 0; i < 24; i++) assert_int_equal(in[1][i], 0);

  /* Completed but never waited for: cancel frees it. Sends too. */
  assert_int_equal(p.ops->isend(p.c[0], 1, 7, out, 24, &sr), RESHARD_SUCCESS);
  assert_int_equal(p.ops->irecv(p.c[1], 0, 7, in[0], 24, &rr[0]),
                   RESHARD_SUCCESS);
  p.ops->cancel(p.c[1], rr[0]);
  p.ops->cancel(p.c[0], sr);
  pair_close(&p);
}

/* ------------------------------------------------------------------ */
/* allreduce_max_u64                                                   */
/* ------------------------------------------------------------------ */

static uint64_t ar_value(int rank, int it, int k) {
  uint64_t h = (uint64_t)rank * 0x9E3779B97F4A7C15ull ^
               (uint64_t)it * 0xC2B2AE3D27D4EB4Full ^ (uint64_t)k * 0x165667B1ull;
  h ^= h >> 31;
  h *= 0xBF58476D1CE4E5B9ull;
  h ^= h >> 29;
  return h;
}

#define AR_ITERS 1000
#define AR_MAXN 64

static void *allreduce_rank(void *p) {
  rank_arg *a = p;
  const rs_transport_ops *ops = a->comm->ops;
  for (int it = 0; it < AR_ITERS; it++) {
    int n = 1 + it % AR_MAXN;
    uint64_t v[AR_MAXN];
    for (int k = 0; k < n; k++) v[k] = ar_value(a->rank, it, k);
    /* Uneven arrival: a different rank lags in each round. */
    if ((it + a->rank) % 8 == 0) sched_yield();
    if ((it * 7 + a->rank) % 61 == 0) {
      struct timespec ts = {0, 200000};
      nanosleep(&ts, NULL);
    }
    /* A deadline on every round: should one rank bail out, the others
     * fail within it instead of hanging the test. */
    reshard_result_t r =
        ops->allreduce_max_u64(a->comm, v, n, rs_now_ns() + 30000 * MS);
    RCHECK(a, r == 0, "iteration %d: %s", it, reshard_last_error());
    /* A wrong value is recorded but the rank stays in step with the
     * others. */
    for (int k = 0; k < n; k++) {
      uint64_t want = 0;
      for (int q = 0; q < a->nranks; q++)
        if (ar_value(q, it, k) > want) want = ar_value(q, it, k);
      if (v[k] != want)
        rank_fail(a, "iteration %d value %d: got %llx want %llx", it, k,
                  (unsigned long long)v[k], (unsigned long long)want);
    }
  }
out:
  return NULL;
}

static void test_allreduce_repeated(void **state) {
  (void)state;
  rank_arg args[8];
  reshard_inproc_world_t *w;
  assert_int_equal(reshard_inproc_world_create(8, &w), RESHARD_SUCCESS);
  run_ranks(w, 8, 0, allreduce_rank, args);
  reshard_inproc_world_destroy(w);
  /* One rank alone is its own maximum; n = 0 is a bare barrier. */
  assert_int_equal(reshard_inproc_world_create(1, &w), RESHARD_SUCCESS);
  reshard_comm_t *c;
  assert_int_equal(reshard_comm_create_inproc(w, 0, &c), RESHARD_SUCCESS);
  uint64_t v[2] = {5, 9};
  assert_int_equal(c->ops->allreduce_max_u64(c, v, 2, RS_NO_DEADLINE),
                   RESHARD_SUCCESS);
  assert_int_equal(v[0], 5);
  assert_int_equal(v[1], 9);
  assert_int_equal(c->ops->allreduce_max_u64(c, NULL, 0, RS_NO_DEADLINE),
                   RESHARD_SUCCESS);
  reshard_comm_destroy(c);
  reshard_inproc_world_destroy(w);
}

static void *allreduce_n_rank(void *p) {
  rank_arg *a = p;
  uint64_t v[4] = {1, 2, 3, (uint64_t)a->rank};
  int n = a->rank == 2 ? 3 : 4;
  a->result = a->comm->ops->allreduce_max_u64(a->comm, v, n,
                                              rs_now_ns() + 10000 * MS);
  if (a->result != RESHARD_ERROR_MISMATCH)
    rank_fail(a, "n mismatch gave %d", (int)a->result);
  else if (!strstr(reshard_last_error(), "passed 3"))
    rank_fail(a, "error does not name the odd n: %s", reshard_last_error());
  if (v[3] != (uint64_t)a->rank) rank_fail(a, "vals changed on error");
  /* The round completed: the next one works. */
  v[0] = (uint64_t)a->rank;
  if (a->comm->ops->allreduce_max_u64(a->comm, v, 1, RS_NO_DEADLINE) != 0 ||
      v[0] != (uint64_t)a->nranks - 1)
    rank_fail(a, "allreduce after a mismatch: %s", reshard_last_error());
  return NULL;
}

static void test_allreduce_n_mismatch(void **state) {
  (void)state;
  rank_arg args[4];
  reshard_inproc_world_t *w;
  assert_int_equal(reshard_inproc_world_create(4, &w), RESHARD_SUCCESS);
  run_ranks(w, 4, 0, allreduce_n_rank, args);
  reshard_inproc_world_destroy(w);
}

static void *allreduce_deadline_rank(void *p) {
  rank_arg *a = p;
  if (a->rank == a->nranks - 1) return NULL; /* never arrives */
  uint64_t v[3] = {1, 2, (uint64_t)a->rank};
  /* One shared deadline: a rank woken because another one timed out
   * returns early relative to its own start, never before it. */
  a->result =
      a->comm->ops->allreduce_max_u64(a->comm, v, 3, a->t0_ns + 50 * MS);
  a->elapsed_ns = rs_now_ns() - a->t0_ns;
  if (a->result != RESHARD_ERROR_TIMEOUT)
    rank_fail(a, "allreduce gave %d, want timeout", (int)a->result);
  else if (!strstr(reshard_last_error(), "timed out"))
    rank_fail(a, "error: %s", reshard_last_error());
  if (v[2] != (uint64_t)a->rank) rank_fail(a, "vals changed on timeout");
  return NULL;
}

static void test_allreduce_deadline(void **state) {
  (void)state;
  enum { N = 4 };
  rank_arg args[N];
  reshard_inproc_world_t *w;
  assert_int_equal(reshard_inproc_world_create(N, &w), RESHARD_SUCCESS);
  pthread_t th[N];
  const int64_t t0 = rs_now_ns();
  for (int r = 0; r < N; r++) {
    memset(&args[r], 0, sizeof args[r]);
    args[r].rank = r;
    args[r].nranks = N;
    args[r].t0_ns = t0;
    assert_int_equal(reshard_comm_create_inproc(w, r, &args[r].comm),
                     RESHARD_SUCCESS);
    assert_int_equal(pthread_create(&th[r], NULL, allreduce_deadline_rank,
                                    &args[r]),
                     0);
  }
  for (int r = 0; r < N; r++) pthread_join(th[r], NULL);
  for (int r = 0; r < N; r++)
    if (args[r].failed) fail_msg("%s", args[r].why);
  for (int r = 0; r < N - 1; r++) {
    assert_true(args[r].elapsed_ns >= 49 * MS);
    assert_true(args[r].elapsed_ns < 5000 * MS);
  }

  /* The latecomer, and any later collective, fails at once rather than
   * waiting for ranks that have left. */
  reshard_comm_t *late = args[N - 1].comm;
  uint64_t v = 1;
  const int64_t t1 = rs_now_ns();
  assert_int_equal(late->ops->allreduce_max_u64(late, &v, 1, RS_NO_DEADLINE),
                   RESHARD_ERROR_TIMEOUT);
  assert_true(rs_now_ns() - t1 < 1000 * MS);
  assert_error_mentions("rank 3");
  assert_int_equal(
      args[0].comm->ops->allreduce_max_u64(args[0].comm, &v, 1, RS_NO_DEADLINE),
      RESHARD_ERROR_TIMEOUT);

  /* Point to point still works. */
  rs_request *sr, *rr;
  unsigned char b = 0x42, in = 0;
  assert_int_equal(late->ops->isend(late, 0, 1, &b, 1, &sr), RESHARD_SUCCESS);
  assert_int_equal(
      args[0].comm->ops->irecv(args[0].comm, N - 1, 1, &in, 1, &rr),
      RESHARD_SUCCESS);
  assert_int_equal(args[0].comm->ops->wait(args[0].comm, rr, RS_NO_DEADLINE),
                   RESHARD_SUCCESS);
  assert_int_equal(in, 0x42);

  for (int r = 0; r < N; r++) reshard_comm_destroy(args[r].comm);
  reshard_inproc_world_destroy(w);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_world_create_destroy),
      cmocka_unit_test(test_world_destroy_frees_pending),
      cmocka_unit_test(test_bad_args),
      cmocka_unit_test(test_ring),
      cmocka_unit_test(test_all_to_all),
      cmocka_unit_test(test_fifo_same_tag),
      cmocka_unit_test(test_recv_before_and_after_send),
      cmocka_unit_test(test_size_mismatch),
      cmocka_unit_test(test_recv_timeout),
      cmocka_unit_test(test_wait_wakes_on_send),
      cmocka_unit_test(test_cancel),
      cmocka_unit_test(test_allreduce_repeated),
      cmocka_unit_test(test_allreduce_n_mismatch),
      cmocka_unit_test(test_allreduce_deadline),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
