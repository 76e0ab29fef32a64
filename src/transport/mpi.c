/* The MPI transport: nonblocking point-to-point on a private duplicate of
 * the application's communicator, every wait polled against its deadline.
 *
 * Tags: MPI guarantees only 32767 tags, fewer than reshard's 64-bit ones.
 * The low 32 bits (the round) are dropped: messages of one stream between
 * two ranks are posted in round order on both sides, and MPI's
 * non-overtaking rule keeps them matched in that order. The high 32 bits
 * (plan digest and execute call number) are hashed into the tag range, so
 * that messages left in flight by a failed call do not match a later one. */
#include <mpi.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/clock.h"
#include "common/error.h"
#include "common/hash.h"
#include "common/params.h"
#include "pack/copy.h"
#include "reshard_mpi.h"
#include "transport/transport.h"

/* A collective abandoned at its deadline: it cannot be cancelled, stays
 * pending in MPI (its buffer with it) and may still complete when the
 * late ranks arrive; its result is kept for allreduce_late (a commit in
 * doubt reads it there). */
typedef struct rs_mpi_abandoned {
  MPI_Request req; /* MPI_REQUEST_NULL once completed */
  uint64_t *buf;
  int n;
} rs_mpi_abandoned;

typedef struct rs_mpi_comm {
  MPI_Comm comm;
  int tag_ub;
  int datatypes; /* send and receive strided boxes in place */
  /* Abandoned collectives (see mpi_allreduce): while one is pending the
   * communicator refuses new ones (they would pair with it) and destroy
   * keeps the duplicated communicator (freeing it under a pending
   * collective crashes MPI's progress engine, at the next MPI call or at
   * MPI_Finalize). Entries and their results stay until destroy, so an
   * entry's number (its index + 1) names it for allreduce_late. */
  rs_mpi_abandoned *abandoned;
  int nabandoned;
} rs_mpi_comm;

struct rs_request {
  MPI_Request req;
  int is_recv;
  int peer;
  size_t bytes;
};

static reshard_result_t mpi_fail(int err, const char *what, int rank,
                                 int peer) {
  char msg[MPI_MAX_ERROR_STRING];
  int len = 0;
  if (MPI_Error_string(err, msg, &len) != MPI_SUCCESS) snprintf(msg, sizeof msg, "MPI error %d", err);
  return rs_error(RESHARD_ERROR_BACKEND, "rank %d: %s (peer %d) failed: %s", rank, what, peer, msg);
}

static int mpi_tag(const rs_mpi_comm *m, uint64_t tag) {
  return (int)(rs_mix64(tag >> 32) % ((uint64_t)m->tag_ub + 1));
}

static reshard_result_t post(reshard_comm_t *c, int peer, uint64_t tag,
                             void *buf, size_t bytes, int is_recv,
                             rs_request **out) {
  rs_mpi_comm *m = c->impl;
  if (bytes > (size_t)INT32_MAX)
    return rs_error(RESHARD_ERROR_UNSUPPORTED, "rank %d: a %zu-byte message to %d exceeds MPI's int count (lower chunk_bytes)",
                    c->rank, bytes, peer);
  rs_request *r = malloc(sizeof *r);
  if (!r) return rs_error(RESHARD_ERROR_OUT_OF_MEMORY, "rank %d: out of memory posting a message", c->rank);
  r->is_recv = is_recv;
  r->peer = peer;
  r->bytes = bytes;
  int err = is_recv ? MPI_Irecv(buf, (int)bytes, MPI_BYTE, peer, mpi_tag(m, tag), m->comm, &r->req)
                    : MPI_Isend(buf, (int)bytes, MPI_BYTE, peer, mpi_tag(m, tag), m->comm, &r->req);
  if (err != MPI_SUCCESS) {
    free(r);
    return mpi_fail(err, is_recv ? "MPI_Irecv" : "MPI_Isend", c->rank, peer);
  }
  *out = r;
  return RESHARD_SUCCESS;
}

/* The datatype of one side of a box: a run of run_bytes, nested in one
 * hvector per outer dim (innermost first), so that MPI walks the elements
 * in the same row-major order as the staging layout. */
static int box_type(const rs_copy *c, int dst_side, MPI_Datatype *out) {
  if (c->run_bytes > (uint64_t)INT32_MAX) return -1;
  MPI_Datatype t;
  if (MPI_Type_contiguous((int)c->run_bytes, MPI_BYTE, &t) != MPI_SUCCESS) return -1;
  for (int d = c->ndim - 1; d >= 0; d--) {
    MPI_Datatype outer;
    int64_t stride = dst_side ? c->dst_stride[d] : c->src_stride[d];
    if (c->extent[d] > INT32_MAX ||
        MPI_Type_create_hvector((int)c->extent[d], 1, (MPI_Aint)stride, t, &outer) != MPI_SUCCESS) {
      MPI_Type_free(&t);
      return -1;
    }
    MPI_Type_free(&t);
    t = outer;
  }
  *out = t;
  return 0;
}

/* One message of boxes at absolute addresses (MPI_BOTTOM). The datatype is
 * freed as soon as the operation is posted; MPI keeps it alive until the
 * operation completes. */
static reshard_result_t post_boxes(reshard_comm_t *c, int peer, uint64_t tag,
                                   const rs_copy *copies, uint32_t n,
                                   void *const *bases, size_t bytes,
                                   int is_recv, rs_request **out) {
  rs_mpi_comm *m = c->impl;
  if (!m->datatypes || n == 0 || n > 4096) return RESHARD_ERROR_UNSUPPORTED;
  for (uint32_t i = 0; i < n; i++) /* a cast needs the pack or unpack: MPI moves bytes */
    if (copies[i].cvt_from) return RESHARD_ERROR_UNSUPPORTED;
  MPI_Datatype types_stack[16], *types = n <= 16 ? types_stack : malloc(n * sizeof *types);
  MPI_Aint disp_stack[16], *disps = n <= 16 ? disp_stack : malloc(n * sizeof *disps);
  int len_stack[16], *lens = n <= 16 ? len_stack : malloc(n * sizeof *lens);
  reshard_result_t res = RESHARD_SUCCESS;
  uint32_t made = 0;
  rs_request *r = NULL;
  if (!types || !disps || !lens) {
    res = RESHARD_ERROR_UNSUPPORTED;
    goto done;
  }
  for (; made < n; made++) {
    const rs_copy *cp = &copies[made];
    const char *base = is_recv ? (const char *)bases[cp->dst_buf] + cp->dst_off : (const char *)bases[cp->src_buf] + cp->src_off;
    if (box_type(cp, is_recv, &types[made])) {
      res = RESHARD_ERROR_UNSUPPORTED;
      goto done;
    }
    MPI_Get_address(base, &disps[made]);
    lens[made] = 1;
  }
  MPI_Datatype msg;
  if (MPI_Type_create_struct((int)n, lens, disps, types, &msg) != MPI_SUCCESS || MPI_Type_commit(&msg) != MPI_SUCCESS) {
    res = RESHARD_ERROR_UNSUPPORTED;
    goto done;
  }
  r = malloc(sizeof *r);
  if (!r) {
    MPI_Type_free(&msg);
    res = rs_error(RESHARD_ERROR_OUT_OF_MEMORY, "rank %d: out of memory posting a message", c->rank);
    goto done;
  }
  r->is_recv = is_recv;
  r->peer = peer;
  r->bytes = bytes;
  int err = is_recv ? MPI_Irecv(MPI_BOTTOM, 1, msg, peer, mpi_tag(m, tag), m->comm, &r->req)
                    : MPI_Isend(MPI_BOTTOM, 1, msg, peer, mpi_tag(m, tag), m->comm, &r->req);
  MPI_Type_free(&msg);
  if (err != MPI_SUCCESS) {
    free(r);
    r = NULL;
    res = mpi_fail(err, is_recv ? "MPI_Irecv" : "MPI_Isend", c->rank, peer);
    goto done;
  }
  *out = r;
done:
  for (uint32_t i = 0; i < made; i++) MPI_Type_free(&types[i]);
  if (types != types_stack) free(types);
  if (disps != disp_stack) free(disps);
  if (lens != len_stack) free(lens);
  return res;
}

static reshard_result_t mpi_isend_boxes(reshard_comm_t *c, int peer, uint64_t tag, const rs_copy *copies, uint32_t n,
                                        void *const *bases, size_t bytes, rs_request **req) {
  return post_boxes(c, peer, tag, copies, n, bases, bytes, 0, req);
}

static reshard_result_t mpi_irecv_boxes(reshard_comm_t *c, int peer, uint64_t tag, const rs_copy *copies, uint32_t n,
                                        void *const *bases, size_t bytes, rs_request **req) {
  return post_boxes(c, peer, tag, copies, n, bases, bytes, 1, req);
}

static reshard_result_t mpi_isend(reshard_comm_t *c, int peer, uint64_t tag,
                                  const void *buf, size_t bytes,
                                  rs_request **req) {
  return post(c, peer, tag, (void *)buf, bytes, 0, req);
}

static reshard_result_t mpi_irecv(reshard_comm_t *c, int peer, uint64_t tag,
                                  void *buf, size_t bytes, rs_request **req) {
  return post(c, peer, tag, buf, bytes, 1, req);
}

static reshard_result_t mpi_test(reshard_comm_t *c, rs_request *r, int *done) {
  MPI_Status st;
  int flag = 0;
  int err = MPI_Test(&r->req, &flag, &st);
  *done = 0;
  if (err != MPI_SUCCESS) {
    reshard_result_t res = mpi_fail(err, "MPI_Test", c->rank, r->peer);
    free(r);
    *done = 1;
    return res;
  }
  if (!flag) return RESHARD_SUCCESS;
  *done = 1;
  reshard_result_t res = RESHARD_SUCCESS;
  if (r->is_recv) {
    int count = -1;
    MPI_Get_count(&st, MPI_BYTE, &count);
    if (count < 0 || (size_t)count != r->bytes)
      res = rs_error(RESHARD_ERROR_MISMATCH, "rank %d: received %d bytes from rank %d, the plan expects %zu (ranks run different plans?)",
                     c->rank, count, r->peer, r->bytes);
  }
  free(r);
  return res;
}

/* Polls: a few spins for latency, then short sleeps so that a rank waiting
 * on a slow peer leaves the core to the ranks doing the work (oversubscribed
 * CPU runs), while MPI still gets called often enough to progress. */
static reshard_result_t mpi_wait(reshard_comm_t *c, rs_request *r,
                                 int64_t deadline) {
  int peer = r->peer, is_recv = r->is_recv;
  for (unsigned spin = 0;; spin++) {
    int done = 0;
    reshard_result_t res = mpi_test(c, r, &done);
    if (done) return res;
    if (spin > 64 && rs_now_ns() > deadline)
      return rs_error(RESHARD_ERROR_TIMEOUT, "rank %d: %s rank %d did not complete before the deadline",
                      c->rank, is_recv ? "receive from" : "send to", peer);
    rs_nap(spin);
  }
}

/* Abandons a request on an error path. MPI may still be reading (send)
 * or writing (receive) the caller's memory until the request completes,
 * so it is cancelled and then polled for up to 100 ms; only a request that
 * still has not completed is released to finish on its own (the execute
 * call number in the tag keeps it from matching a later call). */
static void mpi_cancel(reshard_comm_t *c, rs_request *r) {
  (void)c;
  MPI_Cancel(&r->req);
  int64_t until = rs_now_ns() + 100000000LL;
  int flag = 0;
  while (!flag && MPI_Test(&r->req, &flag, MPI_STATUS_IGNORE) == MPI_SUCCESS && !flag && rs_now_ns() < until) {
    struct timespec ts = {0, 50000};
    nanosleep(&ts, NULL);
  }
  if (!flag && r->req != MPI_REQUEST_NULL) MPI_Request_free(&r->req);
  free(r);
}

/* Every agreement reduces the same number of words: its n values padded
 * with zeros, then n and ~n. Collectives match in call order, so a rank
 * out of step (one that skipped an agreement, or one whose agreement
 * timed out and is still pending) pairs agreements of different kinds:
 * equal counts keep that well defined in MPI, and the trailer tells it. */
#define RS_MPI_AGREE_WORDS (RS_AGREE_MAX_WORDS + 2)

static reshard_result_t agree_result(const reshard_comm_t *c, const uint64_t *buf, uint64_t *vals, int n) {
  if (buf[RS_AGREE_MAX_WORDS] != (uint64_t)n || ~buf[RS_AGREE_MAX_WORDS + 1] != (uint64_t)n)
    return rs_error(RESHARD_ERROR_MISMATCH,
                    "rank %d: this agreement (%d values) was paired with another kind on some rank (between %llu "
                    "and %llu values): the ranks are out of step, e.g. a rank skipped a plan creation or execute, "
                    "or an earlier agreement of a rank timed out and is still pending",
                    c->rank, n, (unsigned long long)~buf[RS_AGREE_MAX_WORDS + 1],
                    (unsigned long long)buf[RS_AGREE_MAX_WORDS]);
  memcpy(vals, buf, (size_t)n * sizeof *vals);
  return RESHARD_SUCCESS;
}

/* Whether every abandoned collective has completed since. */
static int abandoned_done(rs_mpi_comm *m) {
  int all = 1;
  for (int i = 0; i < m->nabandoned; i++) {
    int flag = 0;
    if (m->abandoned[i].req != MPI_REQUEST_NULL &&
        (MPI_Test(&m->abandoned[i].req, &flag, MPI_STATUS_IGNORE) != MPI_SUCCESS || !flag))
      all = 0;
  }
  return all;
}

static void abandoned_free(rs_mpi_comm *m) {
  for (int i = 0; i < m->nabandoned; i++) free(m->abandoned[i].buf);
  free(m->abandoned);
  m->abandoned = NULL;
  m->nabandoned = 0;
}

static reshard_result_t mpi_allreduce_late(reshard_comm_t *c, uint64_t *ticket, uint64_t *vals, int n,
                                           int64_t deadline, int *done) {
  rs_mpi_comm *m = c->impl;
  *done = 0;
  const uint64_t k = *ticket ? *ticket : (uint64_t)m->nabandoned;
  if (k < 1 || k > (uint64_t)m->nabandoned)
    return rs_error(RESHARD_ERROR_INTERNAL, "rank %d: no abandoned agreement %llu on this communicator", c->rank,
                    (unsigned long long)k);
  *ticket = k;
  rs_mpi_abandoned *a = &m->abandoned[k - 1];
  if (n != a->n)
    return rs_error(RESHARD_ERROR_INTERNAL, "rank %d: abandoned agreement %llu has %d values, %d asked for", c->rank,
                    (unsigned long long)k, a->n, n);
  for (unsigned spin = 0;; spin++) {
    int flag = 1;
    if (a->req != MPI_REQUEST_NULL) {
      int err = MPI_Test(&a->req, &flag, MPI_STATUS_IGNORE);
      if (err != MPI_SUCCESS) return mpi_fail(err, "MPI_Test(abandoned allreduce)", c->rank, -1);
    }
    if (flag) {
      *done = 1;
      return agree_result(c, a->buf, vals, a->n);
    }
    if (rs_now_ns() > deadline) return RESHARD_SUCCESS;
    rs_nap(spin);
  }
}

static reshard_result_t mpi_allreduce(reshard_comm_t *c, uint64_t *vals,
                                      int n, int64_t deadline) {
  rs_mpi_comm *m = c->impl;
  MPI_Request req;
  /* A collective abandoned earlier that has not completed would pair with
   * this one (collectives match in order): its ranks would read each
   * other's stale votes. Refused instead; a new communicator is clean. */
  if (m->nabandoned && !abandoned_done(m))
    return rs_error(RESHARD_ERROR_INVALID_USAGE,
                    "rank %d: an earlier plan agreement on this communicator timed out and is still pending in "
                    "MPI; a new one would pair with it. Settle a commit in doubt (reshard_plan_resolve), or "
                    "destroy this communicator and create a new one (reshard_comm_create_mpi)",
                    c->rank);
  /* The reduction runs in a heap buffer of its own: after a timeout the
   * collective stays pending and may still complete (when the late ranks
   * arrive), so the buffer it writes must outlive this call: it is then
   * kept, with its result, until destroy. */
  if (n < 0 || n > RS_AGREE_MAX_WORDS)
    return rs_error(RESHARD_ERROR_INTERNAL, "rank %d: agreement of %d words, at most %d", c->rank, n,
                    RS_AGREE_MAX_WORDS);
  uint64_t *buf = calloc(RS_MPI_AGREE_WORDS, sizeof *buf);
  if (!buf) return rs_error(RESHARD_ERROR_OUT_OF_MEMORY, "rank %d: out of memory for plan agreement", c->rank);
  memcpy(buf, vals, (size_t)n * sizeof *buf);
  buf[RS_AGREE_MAX_WORDS] = (uint64_t)n;
  buf[RS_AGREE_MAX_WORDS + 1] = ~(uint64_t)n;
  int err = MPI_Iallreduce(MPI_IN_PLACE, buf, RS_MPI_AGREE_WORDS, MPI_UINT64_T, MPI_MAX, m->comm, &req);
  if (err != MPI_SUCCESS) {
    free(buf);
    return mpi_fail(err, "MPI_Iallreduce", c->rank, -1);
  }
  for (unsigned spin = 0;; spin++) {
    int flag = 0;
    err = MPI_Test(&req, &flag, MPI_STATUS_IGNORE);
    if (err != MPI_SUCCESS) return mpi_fail(err, "MPI_Test(allreduce)", c->rank, -1);
    if (flag) {
      reshard_result_t r = agree_result(c, buf, vals, n);
      free(buf);
      return r;
    }
    if (spin > 64 && rs_now_ns() > deadline) {
      /* A collective cannot be cancelled: it stays pending (recorded, so
       * that later collectives are refused until it completes and destroy
       * keeps the communicator), which the error says. */
      rs_mpi_abandoned *a = realloc(m->abandoned, (size_t)(m->nabandoned + 1) * sizeof *a);
      if (a) {
        m->abandoned = a;
        a[m->nabandoned++] = (rs_mpi_abandoned){req, buf, n};
      }
      return rs_error(RESHARD_ERROR_TIMEOUT, "rank %d: plan agreement did not complete before the deadline "
                      "(a rank is missing or stuck); it stays pending in MPI and this communicator refuses new "
                      "agreements until it completes: destroy it and create a new one", c->rank);
    }
    rs_nap(spin);
  }
}

static void mpi_destroy(reshard_comm_t *c) {
  rs_mpi_comm *m = c->impl;
  if (!m) return;
  int finalized = 0;
  MPI_Finalized(&finalized);
  /* With an abandoned collective still pending the duplicate is kept
   * (with its requests and buffers) until MPI_Finalize: freeing it makes
   * MPI's progress engine touch the freed communicator (a crash at the
   * next MPI call). The leak is one communicator per timed-out
   * agreement. */
  if (!finalized && !abandoned_done(m)) {
    free(m);
    c->impl = NULL;
    return;
  }
  if (!finalized) MPI_Comm_free(&m->comm);
  abandoned_free(m);
  free(m);
  c->impl = NULL;
}

static const rs_transport_ops rs_mpi_ops = {
    .name = "mpi",
    .isend = mpi_isend,
    .irecv = mpi_irecv,
    .test = mpi_test,
    .wait = mpi_wait,
    .cancel = mpi_cancel,
    .allreduce_max_u64 = mpi_allreduce,
    .allreduce_late = mpi_allreduce_late,
    .destroy = mpi_destroy,
    .isend_boxes = mpi_isend_boxes,
    .irecv_boxes = mpi_irecv_boxes,
};

/* The same without boxes, for RESHARD_MPI_DATATYPES=0: every message is
 * packed into staging, except direct ones (one contiguous run), which
 * the executor sends and receives in place (exec/execute.c). */
static const rs_transport_ops rs_mpi_ops_bytes = {
    .name = "mpi",
    .isend = mpi_isend,
    .irecv = mpi_irecv,
    .test = mpi_test,
    .wait = mpi_wait,
    .cancel = mpi_cancel,
    .allreduce_max_u64 = mpi_allreduce,
    .allreduce_late = mpi_allreduce_late,
    .destroy = mpi_destroy,
};

reshard_result_t reshard_comm_create_mpi(MPI_Comm comm, reshard_comm_t **out) {
  rs_error_clear();
  if (!out) return rs_error(RESHARD_ERROR_INVALID_ARGUMENT, "comm_create_mpi: out is NULL");
  *out = NULL;
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (!initialized) return rs_error(RESHARD_ERROR_INVALID_USAGE, "comm_create_mpi: MPI is not initialized");
  if (comm == MPI_COMM_NULL) return rs_error(RESHARD_ERROR_INVALID_ARGUMENT, "comm_create_mpi: comm is MPI_COMM_NULL");
  reshard_comm_t *c = calloc(1, sizeof *c);
  rs_mpi_comm *m = calloc(1, sizeof *m);
  if (!c || !m) {
    free(c);
    free(m);
    return rs_error(RESHARD_ERROR_OUT_OF_MEMORY, "comm_create_mpi: out of memory");
  }
  int err = MPI_Comm_dup(comm, &m->comm);
  if (err != MPI_SUCCESS) {
    free(c);
    free(m);
    return mpi_fail(err, "MPI_Comm_dup", -1, -1);
  }
  MPI_Comm_set_errhandler(m->comm, MPI_ERRORS_RETURN);
  MPI_Comm_rank(m->comm, &c->rank);
  MPI_Comm_size(m->comm, &c->size);
  int *ub = NULL, flag = 0;
  MPI_Comm_get_attr(m->comm, MPI_TAG_UB, &ub, &flag);
  m->tag_ub = flag && ub && *ub > 0 ? *ub : 32767;
  int64_t dt = 1;
  rs_param_get(RS_PARAM_MPI_DATATYPES, &dt);
  m->datatypes = dt != 0;
  c->ops = m->datatypes ? &rs_mpi_ops : &rs_mpi_ops_bytes;
  c->impl = m;
  *out = c;
  return RESHARD_SUCCESS;
}
