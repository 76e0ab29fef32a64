/* The in-process transport: the ranks of a world are threads of one
 * process and messages are memcpy'd between them.
 *
 * Each destination rank owns a mailbox with its own lock, so that pairs of
 * ranks that do not talk to each other never contend. A mailbox holds, per
 * hash bucket of (source, tag), the messages that arrived before their
 * receive (unexpected) and the receives posted before their message
 * (posted). For a given key at most one of the two is non-empty: a sender
 * first looks for a posted receive, a receiver first looks for a queued
 * message. Both lists are FIFO and searched from the head, which gives MPI's
 * non-overtaking order for equal keys.
 *
 * Sends are eager (the payload is copied before isend returns), so a send
 * request is complete from the start and is represented by one shared
 * sentinel instead of a heap object.
 *
 * allreduce_max_u64 is a generation-counted barrier on the world; see
 * inproc_allreduce_max_u64 for what a timeout does to it. */
#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/clock.h"
#include "common/debug.h"
#include "common/error.h"
#include "common/hash.h"
#include "reshard_inproc.h"
#include "transport/transport.h"

/* A power of two: the bucket is taken from the top bits of a hash. */
#define RS_INPROC_BUCKET_BITS 6
#define RS_INPROC_BUCKETS (1 << RS_INPROC_BUCKET_BITS)

/* Plan agreement reduces a handful of words (digests, flags, sizes); a fixed
 * capacity keeps the barrier free of allocation, which could otherwise fail
 * half-way through a collective and leave the ranks out of step. Exactly
 * the seam's bound (transport.h), so that a caller reducing more fails
 * here, in the host tests, and not only on NCCL, whose scratch has that
 * size. */
#define RS_INPROC_MAX_REDUCE RS_AGREE_MAX_WORDS

typedef struct rs_inproc_msg {
  struct rs_inproc_msg *next;
  int src;
  uint64_t tag;
  size_t bytes;
  unsigned char data[];
} rs_inproc_msg;

enum { RS_REQ_POSTED = 0, RS_REQ_DONE = 1 };

typedef struct rs_inproc_mailbox rs_inproc_mailbox;

struct rs_request {
  /* Guarded by mbox->lock while the request is posted. */
  int state;
  reshard_result_t result;
  size_t msg_bytes; /* what arrived, for the mismatch message */
  struct rs_request *prev, *next;
  rs_inproc_mailbox *mbox;
  int bucket;
  /* Immutable after irecv. */
  int rank, src;
  uint64_t tag;
  void *buf;
  size_t bytes;
};

typedef struct rs_inproc_bucket {
  rs_inproc_msg *msg_head, *msg_tail;
  rs_request *recv_head, *recv_tail;
} rs_inproc_bucket;

struct rs_inproc_mailbox {
  pthread_mutex_t lock;
  /* Broadcast whenever a posted receive completes: several threads of one
   * rank may wait on different requests of the same mailbox. */
  pthread_cond_t done;
  rs_inproc_bucket buckets[RS_INPROC_BUCKETS];
};

struct reshard_inproc_world {
  int nranks;
  rs_inproc_mailbox *mbox; /* [nranks], indexed by destination */

  /* Guards taken[] and every coll_* field. */
  pthread_mutex_t lock;
  pthread_cond_t coll_cv;
  unsigned char *taken; /* [nranks]: a communicator holds the rank */

  /* The round being gathered. */
  uint64_t coll_gen;
  int coll_arrived;
  unsigned char *coll_here; /* [nranks]: arrived in this round */
  int coll_n, coll_first_rank;
  int coll_bad_rank, coll_bad_n; /* -1: no disagreement on n so far */
  uint64_t coll_acc[RS_INPROC_MAX_REDUCE];

  /* The last completed round. Kept apart from coll_acc because a fast rank
   * may start the next round before slow ones have woken up to read this;
   * it is overwritten only when the next round completes, i.e. after every
   * rank has entered (and so left) this one. */
  int res_n, res_first_rank, res_bad_rank, res_bad_n;
  uint64_t res_vals[RS_INPROC_MAX_REDUCE];

  /* Set for good by the first rank whose allreduce deadline passes. */
  bool coll_broken;
  int coll_broken_by;
};

/* Shared by every send: eager sends are complete when isend returns. */
static rs_request rs_inproc_send_done;

static const rs_transport_ops rs_inproc_ops;

static reshard_inproc_world_t *inproc_world(reshard_comm_t *comm) {
  return (reshard_inproc_world_t *)comm->impl;
}

static int inproc_bucket(int src, uint64_t tag) {
  const uint64_t h = rs_mix64(rs_mix64(tag) ^ (uint64_t)(uint32_t)src);
  return (int)(h >> (64 - RS_INPROC_BUCKET_BITS));
}

static int inproc_cond_init(pthread_cond_t *cv) {
  /* CLOCK_MONOTONIC so that deadlines survive wall-clock steps (NTP). */
  pthread_condattr_t attr;
  int rc = pthread_condattr_init(&attr);
  if (rc) return rc;
  rc = pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
  if (!rc) rc = pthread_cond_init(cv, &attr);
  pthread_condattr_destroy(&attr);
  return rc;
}

/* pthread_cond_wait with an absolute CLOCK_MONOTONIC deadline in ns.
 * Returns ETIMEDOUT once the deadline has passed; callers recheck their
 * predicate first since a wake-up and the deadline may race. */
static int inproc_wait_until(pthread_cond_t *cv, pthread_mutex_t *m,
                             int64_t deadline_ns) {
  if (deadline_ns == RS_NO_DEADLINE) return pthread_cond_wait(cv, m);
  if (deadline_ns <= 0 || rs_now_ns() >= deadline_ns) return ETIMEDOUT;
  struct timespec ts;
  ts.tv_sec = (time_t)(deadline_ns / 1000000000LL);
  ts.tv_nsec = (long)(deadline_ns % 1000000000LL);
  return pthread_cond_timedwait(cv, m, &ts);
}

/* ------------------------------------------------------------------ */
/* World and communicators                                             */
/* ------------------------------------------------------------------ */

static void inproc_mailbox_free_contents(rs_inproc_mailbox *mb,
                                         size_t *msgs, size_t *recvs) {
  for (int b = 0; b < RS_INPROC_BUCKETS; b++) {
    rs_inproc_bucket *bk = &mb->buckets[b];
    for (rs_inproc_msg *m = bk->msg_head, *next; m; m = next) {
      next = m->next;
      free(m);
      ++*msgs;
    }
    for (rs_request *r = bk->recv_head, *next; r; r = next) {
      next = r->next;
      free(r);
      ++*recvs;
    }
    bk->msg_head = bk->msg_tail = NULL;
    bk->recv_head = bk->recv_tail = NULL;
  }
}

/* Frees a world whose first `live` mailboxes and (if `world_sync`) world
 * lock and condition variable were initialised. */
static void inproc_world_free(reshard_inproc_world_t *w, int live,
                              bool world_sync) {
  size_t msgs = 0, recvs = 0;
  for (int i = 0; i < live; i++) {
    inproc_mailbox_free_contents(&w->mbox[i], &msgs, &recvs);
    pthread_cond_destroy(&w->mbox[i].done);
    pthread_mutex_destroy(&w->mbox[i].lock);
  }
  if (msgs || recvs)
    RS_LOG(RS_LOG_INFO, RS_SUBSYS_TRANSPORT,
           "inproc: world of %d ranks destroyed with %zu undelivered "
           "message(s) and %zu posted receive(s)",
           w->nranks, msgs, recvs);
  if (world_sync) {
    pthread_cond_destroy(&w->coll_cv);
    pthread_mutex_destroy(&w->lock);
  }
  free(w->mbox);
  free(w->taken);
  free(w->coll_here);
  free(w);
}

reshard_result_t reshard_inproc_world_create(int nranks,
                                             reshard_inproc_world_t **world) {
  if (!world)
    return rs_error(RESHARD_ERROR_INVALID_ARGUMENT,
                    "reshard_inproc_world_create: world (the output) is NULL");
  *world = NULL;
  if (nranks <= 0)
    return rs_error(RESHARD_ERROR_INVALID_ARGUMENT,
                    "reshard_inproc_world_create: nranks = %d, must be > 0",
                    nranks);

  reshard_inproc_world_t *w = calloc(1, sizeof *w);
  if (!w) goto oom;
  w->nranks = nranks;
  w->mbox = calloc((size_t)nranks, sizeof *w->mbox);
  w->taken = calloc((size_t)nranks, 1);
  w->coll_here = calloc((size_t)nranks, 1);
  if (!w->mbox || !w->taken || !w->coll_here) {
    inproc_world_free(w, 0, false);
    goto oom;
  }
  w->coll_bad_rank = -1;
  w->coll_broken_by = -1;

  int rc = pthread_mutex_init(&w->lock, NULL);
  if (rc) {
    inproc_world_free(w, 0, false);
    return rs_error(RESHARD_ERROR_BACKEND,
                    "reshard_inproc_world_create: pthread_mutex_init: %s",
                    strerror(rc));
  }
  rc = inproc_cond_init(&w->coll_cv);
  if (rc) {
    pthread_mutex_destroy(&w->lock);
    inproc_world_free(w, 0, false);
    return rs_error(RESHARD_ERROR_BACKEND,
                    "reshard_inproc_world_create: pthread_cond_init: %s",
                    strerror(rc));
  }
  for (int i = 0; i < nranks; i++) {
    rc = pthread_mutex_init(&w->mbox[i].lock, NULL);
    if (!rc) {
      rc = inproc_cond_init(&w->mbox[i].done);
      if (rc) pthread_mutex_destroy(&w->mbox[i].lock);
    }
    if (rc) {
      inproc_world_free(w, i, true);
      return rs_error(RESHARD_ERROR_BACKEND,
                      "reshard_inproc_world_create: mailbox of rank %d: %s",
                      i, strerror(rc));
    }
  }
  *world = w;
  return RESHARD_SUCCESS;

oom:
  return rs_error(RESHARD_ERROR_OUT_OF_MEMORY,
                  "reshard_inproc_world_create: no memory for %d ranks",
                  nranks);
}

void reshard_inproc_world_destroy(reshard_inproc_world_t *world) {
  if (!world) return;
  inproc_world_free(world, world->nranks, true);
}

reshard_result_t reshard_comm_create_inproc(reshard_inproc_world_t *world,
                                            int rank, reshard_comm_t **comm) {
  if (!comm)
    return rs_error(RESHARD_ERROR_INVALID_ARGUMENT,
                    "reshard_comm_create_inproc: rank %d: comm (the output) "
                    "is NULL",
                    rank);
  *comm = NULL;
  if (!world)
    return rs_error(RESHARD_ERROR_INVALID_ARGUMENT,
                    "reshard_comm_create_inproc: rank %d: world is NULL",
                    rank);
  if (rank < 0 || rank >= world->nranks)
    return rs_error(RESHARD_ERROR_INVALID_ARGUMENT,
                    "reshard_comm_create_inproc: rank %d is out of range "
                    "[0, %d) of the world",
                    rank, world->nranks);

  reshard_comm_t *c = calloc(1, sizeof *c);
  if (!c)
    return rs_error(RESHARD_ERROR_OUT_OF_MEMORY,
                    "reshard_comm_create_inproc: rank %d: no memory", rank);

  pthread_mutex_lock(&world->lock);
  bool busy = world->taken[rank];
  world->taken[rank] = 1;
  pthread_mutex_unlock(&world->lock);
  if (busy) {
    free(c);
    return rs_error(RESHARD_ERROR_INVALID_USAGE,
                    "reshard_comm_create_inproc: rank %d is already held by "
                    "another communicator of this world; destroy it first",
                    rank);
  }
  c->ops = &rs_inproc_ops;
  c->rank = rank;
  c->size = world->nranks;
  c->impl = world;
  *comm = c;
  return RESHARD_SUCCESS;
}

/* Releases the rank only. Messages queued for it and receives it left
 * posted belong to the world: a later communicator for the same rank sees
 * them, and reshard_inproc_world_destroy frees them. */
static void inproc_destroy(reshard_comm_t *comm) {
  reshard_inproc_world_t *w = inproc_world(comm);
  pthread_mutex_lock(&w->lock);
  w->taken[comm->rank] = 0;
  pthread_mutex_unlock(&w->lock);
}

/* ------------------------------------------------------------------ */
/* Point to point                                                      */
/* ------------------------------------------------------------------ */

static reshard_result_t inproc_check_peer(reshard_comm_t *comm, int peer,
                                          const void *buf, size_t bytes,
                                          void *req, const char *op) {
  if (!req)
    return rs_error(RESHARD_ERROR_INVALID_ARGUMENT,
                    "inproc %s: rank %d: req (the output) is NULL", op,
                    comm->rank);
  if (peer < 0 || peer >= comm->size)
    return rs_error(RESHARD_ERROR_INVALID_ARGUMENT,
                    "inproc %s: rank %d: peer %d is out of range [0, %d)", op,
                    comm->rank, peer, comm->size);
  if (!buf && bytes)
    return rs_error(RESHARD_ERROR_INVALID_ARGUMENT,
                    "inproc %s: rank %d: buf is NULL for %zu bytes (peer %d)",
                    op, comm->rank, bytes, peer);
  return RESHARD_SUCCESS;
}

static void inproc_unlink_recv(rs_inproc_bucket *bk, rs_request *r) {
  if (r->prev) r->prev->next = r->next;
  else bk->recv_head = r->next;
  if (r->next) r->next->prev = r->prev;
  else bk->recv_tail = r->prev;
  r->prev = r->next = NULL;
}

static rs_request *inproc_find_recv(rs_inproc_bucket *bk, int src,
                                    uint64_t tag) {
  for (rs_request *r = bk->recv_head; r; r = r->next)
    if (r->src == src && r->tag == tag) return r;
  return NULL;
}

/* Completes posted receive r (already unlinked) with data; caller holds the
 * mailbox lock, which is what publishes the copied bytes to the waiter. */
static void inproc_fill_recv(rs_request *r, const void *data, size_t bytes) {
  r->msg_bytes = bytes;
  if (bytes != r->bytes) {
    r->result = RESHARD_ERROR_MISMATCH;
  } else {
    if (bytes) memcpy(r->buf, data, bytes);
    r->result = RESHARD_SUCCESS;
  }
  r->state = RS_REQ_DONE;
}

static reshard_result_t inproc_isend(reshard_comm_t *comm, int peer,
                                     uint64_t tag, const void *buf,
                                     size_t bytes, rs_request **req) {
  RS_CHECK(inproc_check_peer(comm, peer, buf, bytes, req, "isend"));
  *req = NULL;
  reshard_inproc_world_t *w = inproc_world(comm);
  rs_inproc_mailbox *mb = &w->mbox[peer];
  int b = inproc_bucket(comm->rank, tag);
  rs_inproc_bucket *bk = &mb->buckets[b];

  /* A receive already waiting gets the bytes straight from the caller's
   * buffer: one copy, no allocation. The copy happens under the lock so
   * that cancel (which must not block) can never free a buffer we are
   * still writing. */
  pthread_mutex_lock(&mb->lock);
  rs_request *r = inproc_find_recv(bk, comm->rank, tag);
  if (r) {
    inproc_unlink_recv(bk, r);
    inproc_fill_recv(r, buf, bytes);
    pthread_cond_broadcast(&mb->done);
    pthread_mutex_unlock(&mb->lock);
    *req = &rs_inproc_send_done;
    return RESHARD_SUCCESS;
  }
  pthread_mutex_unlock(&mb->lock);

  /* Allocate and copy outside the lock so a large payload does not stall
   * other senders to the same rank. */
  rs_inproc_msg *m = malloc(sizeof *m + bytes);
  if (!m)
    return rs_error(RESHARD_ERROR_OUT_OF_MEMORY,
                    "inproc isend: rank %d: no memory to buffer %zu bytes "
                    "for rank %d tag %llu",
                    comm->rank, bytes, peer, (unsigned long long)tag);
  m->next = NULL;
  m->src = comm->rank;
  m->tag = tag;
  m->bytes = bytes;
  if (bytes) memcpy(m->data, buf, bytes);

  /* The receiver may have posted while we were copying: look again, or
   * the message would sit next to a receive that wants it. */
  pthread_mutex_lock(&mb->lock);
  r = inproc_find_recv(bk, comm->rank, tag);
  if (r) {
    inproc_unlink_recv(bk, r);
    inproc_fill_recv(r, m->data, bytes);
    pthread_cond_broadcast(&mb->done);
  } else {
    if (bk->msg_tail) bk->msg_tail->next = m;
    else bk->msg_head = m;
    bk->msg_tail = m;
    m = NULL;
  }
  pthread_mutex_unlock(&mb->lock);
  free(m);
  *req = &rs_inproc_send_done;
  return RESHARD_SUCCESS;
}

static reshard_result_t inproc_irecv(reshard_comm_t *comm, int peer,
                                     uint64_t tag, void *buf, size_t bytes,
                                     rs_request **req) {
  RS_CHECK(inproc_check_peer(comm, peer, buf, bytes, req, "irecv"));
  *req = NULL;
  reshard_inproc_world_t *w = inproc_world(comm);
  rs_inproc_mailbox *mb = &w->mbox[comm->rank];
  int b = inproc_bucket(peer, tag);
  rs_inproc_bucket *bk = &mb->buckets[b];

  /* Allocated up front even when a message is waiting: the caller always
   * gets a request to test or wait on. */
  rs_request *r = calloc(1, sizeof *r);
  if (!r)
    return rs_error(RESHARD_ERROR_OUT_OF_MEMORY,
                    "inproc irecv: rank %d: no memory for a receive from "
                    "rank %d tag %llu",
                    comm->rank, peer, (unsigned long long)tag);
  r->mbox = mb;
  r->bucket = b;
  r->rank = comm->rank;
  r->src = peer;
  r->tag = tag;
  r->buf = buf;
  r->bytes = bytes;

  pthread_mutex_lock(&mb->lock);
  rs_inproc_msg *m = bk->msg_head, *prev = NULL;
  while (m && !(m->src == peer && m->tag == tag)) {
    prev = m;
    m = m->next;
  }
  if (m) {
    if (prev) prev->next = m->next;
    else bk->msg_head = m->next;
    if (bk->msg_tail == m) bk->msg_tail = prev;
  } else {
    r->prev = bk->recv_tail;
    if (bk->recv_tail) bk->recv_tail->next = r;
    else bk->recv_head = r;
    bk->recv_tail = r;
  }
  pthread_mutex_unlock(&mb->lock);

  if (m) {
    /* The message is ours alone now: copy without holding the lock. */
    inproc_fill_recv(r, m->data, m->bytes);
    free(m);
  }
  *req = r;
  return RESHARD_SUCCESS;
}

/* Frees a completed receive and turns its outcome into the result, with
 * the detail on the waiting thread (rs_error is thread-local). */
static reshard_result_t inproc_finish_recv(rs_request *r) {
  reshard_result_t res = r->result;
  if (res == RESHARD_ERROR_MISMATCH)
    rs_error(RESHARD_ERROR_MISMATCH,
             "inproc: rank %d expected %zu bytes from rank %d but rank %d "
             "sent %zu bytes",
             r->rank, r->bytes, r->src, r->src, r->msg_bytes);
  free(r);
  return res;
}

static reshard_result_t inproc_test(reshard_comm_t *comm, rs_request *req,
                                    int *done) {
  if (!req || !done)
    return rs_error(RESHARD_ERROR_INVALID_ARGUMENT,
                    "inproc test: rank %d: %s is NULL", comm->rank,
                    req ? "done" : "req");
  if (req == &rs_inproc_send_done) {
    *done = 1;
    return RESHARD_SUCCESS;
  }
  pthread_mutex_lock(&req->mbox->lock);
  int state = req->state;
  pthread_mutex_unlock(&req->mbox->lock);
  if (state != RS_REQ_DONE) {
    *done = 0;
    return RESHARD_SUCCESS;
  }
  *done = 1;
  return inproc_finish_recv(req);
}

static reshard_result_t inproc_wait(reshard_comm_t *comm, rs_request *req,
                                    int64_t deadline_ns) {
  if (!req)
    return rs_error(RESHARD_ERROR_INVALID_ARGUMENT,
                    "inproc wait: rank %d: req is NULL", comm->rank);
  if (req == &rs_inproc_send_done) return RESHARD_SUCCESS;
  rs_inproc_mailbox *mb = req->mbox;
  pthread_mutex_lock(&mb->lock);
  while (req->state != RS_REQ_DONE) {
    int rc = inproc_wait_until(&mb->done, &mb->lock, deadline_ns);
    if (req->state == RS_REQ_DONE) break;
    if (rc == ETIMEDOUT ||
        (deadline_ns != RS_NO_DEADLINE && rs_now_ns() >= deadline_ns)) {
      pthread_mutex_unlock(&mb->lock);
      /* the tag's bits are the executor's business (exec_state.h), and
       * as a number they tell a user nothing; the caller prefixes what
       * the message was */
      return rs_error(RESHARD_ERROR_TIMEOUT,
                      "inproc: rank %d: receive of %zu bytes from rank %d "
                      "did not complete before the deadline",
                      req->rank, req->bytes, req->src);
    }
  }
  pthread_mutex_unlock(&mb->lock);
  return inproc_finish_recv(req);
}

static void inproc_cancel(reshard_comm_t *comm, rs_request *req) {
  (void)comm;
  if (!req || req == &rs_inproc_send_done) return;
  rs_inproc_mailbox *mb = req->mbox;
  pthread_mutex_lock(&mb->lock);
  /* Still posted: unlink so that no sender writes into a buffer the caller
   * is about to reuse. Already done: nothing references it any more. */
  if (req->state == RS_REQ_POSTED)
    inproc_unlink_recv(&mb->buckets[req->bucket], req);
  pthread_mutex_unlock(&mb->lock);
  free(req);
}

/* ------------------------------------------------------------------ */
/* allreduce_max_u64                                                   */
/* ------------------------------------------------------------------ */

static int inproc_first_missing(const reshard_inproc_world_t *w) {
  for (int i = 0; i < w->nranks; i++)
    if (!w->coll_here[i]) return i;
  return -1;
}

/* A barrier counted by generation: each round gathers every rank's values
 * into coll_acc; the last rank to arrive publishes them into res_vals,
 * bumps coll_gen and wakes the others, who wait for coll_gen to change (not
 * for a count, which the next round may already be raising).
 *
 * Timeouts: the first rank whose deadline passes marks the world's
 * collectives broken for good and wakes everyone. Ranks waiting in that
 * round, and every later allreduce on any communicator of the world, then
 * return RESHARD_ERROR_TIMEOUT at once (naming the rank that timed out)
 * instead of hanging or mixing rounds: the arrival count is no longer
 * trustworthy once a rank has left a round early. Point-to-point traffic is
 * unaffected; create a new world to run collectives again. A rank that
 * finds its round already completed when it wakes succeeds even if it was
 * woken by the breakage. */
static reshard_result_t inproc_allreduce_max_u64(reshard_comm_t *comm,
                                                 uint64_t *vals, int n,
                                                 int64_t deadline_ns) {
  const int rank = comm->rank;
  if (n < 0 || n > RS_INPROC_MAX_REDUCE)
    return rs_error(RESHARD_ERROR_INVALID_ARGUMENT,
                    "inproc allreduce_max_u64: rank %d: n = %d, must be in "
                    "[0, %d]",
                    rank, n, RS_INPROC_MAX_REDUCE);
  if (n > 0 && !vals)
    return rs_error(RESHARD_ERROR_INVALID_ARGUMENT,
                    "inproc allreduce_max_u64: rank %d: vals is NULL for "
                    "n = %d",
                    rank, n);

  reshard_inproc_world_t *w = inproc_world(comm);
  pthread_mutex_lock(&w->lock);
  if (w->coll_broken) {
    int by = w->coll_broken_by;
    pthread_mutex_unlock(&w->lock);
    return rs_error(RESHARD_ERROR_TIMEOUT,
                    "inproc allreduce_max_u64: rank %d: collectives of this "
                    "world are broken since rank %d timed out in one",
                    rank, by);
  }
  if (w->coll_here[rank]) {
    pthread_mutex_unlock(&w->lock);
    return rs_error(RESHARD_ERROR_INVALID_USAGE,
                    "inproc allreduce_max_u64: rank %d is already in this "
                    "allreduce (two threads calling it on one rank?)",
                    rank);
  }

  const uint64_t gen = w->coll_gen;
  if (w->coll_arrived == 0) {
    w->coll_n = n;
    w->coll_first_rank = rank;
    w->coll_bad_rank = -1;
    for (int k = 0; k < n; k++) w->coll_acc[k] = vals[k];
  } else if (n != w->coll_n) {
    /* Still count the arrival so that the round completes and every rank
     * learns of the disagreement, instead of timing out. */
    if (w->coll_bad_rank < 0) {
      w->coll_bad_rank = rank;
      w->coll_bad_n = n;
    }
  } else {
    for (int k = 0; k < n; k++)
      if (vals[k] > w->coll_acc[k]) w->coll_acc[k] = vals[k];
  }
  w->coll_here[rank] = 1;

  if (++w->coll_arrived == w->nranks) {
    w->res_n = w->coll_n;
    w->res_first_rank = w->coll_first_rank;
    w->res_bad_rank = w->coll_bad_rank;
    w->res_bad_n = w->coll_bad_n;
    for (int k = 0; k < w->coll_n; k++) w->res_vals[k] = w->coll_acc[k];
    w->coll_arrived = 0;
    memset(w->coll_here, 0, (size_t)w->nranks);
    w->coll_gen++;
    pthread_cond_broadcast(&w->coll_cv);
  } else {
    while (w->coll_gen == gen && !w->coll_broken) {
      int rc = inproc_wait_until(&w->coll_cv, &w->lock, deadline_ns);
      if (w->coll_gen != gen || w->coll_broken) break;
      if (rc == ETIMEDOUT ||
          (deadline_ns != RS_NO_DEADLINE && rs_now_ns() >= deadline_ns)) {
        int missing = inproc_first_missing(w);
        int arrived = w->coll_arrived;
        w->coll_broken = true;
        w->coll_broken_by = rank;
        pthread_cond_broadcast(&w->coll_cv);
        pthread_mutex_unlock(&w->lock);
        return rs_error(RESHARD_ERROR_TIMEOUT,
                        "inproc allreduce_max_u64: rank %d timed out with "
                        "%d of %d ranks arrived (rank %d missing)",
                        rank, arrived, w->nranks, missing);
      }
    }
    if (w->coll_gen == gen) {
      int by = w->coll_broken_by;
      pthread_mutex_unlock(&w->lock);
      return rs_error(RESHARD_ERROR_TIMEOUT,
                      "inproc allreduce_max_u64: rank %d: abandoned because "
                      "rank %d timed out in the same allreduce",
                      rank, by);
    }
  }

  /* res_* stay ours until the next round completes, which needs this rank
   * to arrive in it. */
  if (w->res_bad_rank >= 0) {
    int first = w->res_first_rank, first_n = w->res_n;
    int bad = w->res_bad_rank, bad_n = w->res_bad_n;
    pthread_mutex_unlock(&w->lock);
    return rs_error(RESHARD_ERROR_MISMATCH,
                    "inproc allreduce_max_u64: rank %d: ranks disagree on n: "
                    "rank %d passed %d, rank %d passed %d",
                    rank, first, first_n, bad, bad_n);
  }
  for (int k = 0; k < n; k++) vals[k] = w->res_vals[k];
  pthread_mutex_unlock(&w->lock);
  return RESHARD_SUCCESS;
}

static const rs_transport_ops rs_inproc_ops = {
    .name = "inproc",
    .isend = inproc_isend,
    .irecv = inproc_irecv,
    .test = inproc_test,
    .wait = inproc_wait,
    .cancel = inproc_cancel,
    .allreduce_max_u64 = inproc_allreduce_max_u64,
    .destroy = inproc_destroy,
};
