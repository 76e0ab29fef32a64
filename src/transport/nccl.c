/* The NCCL transport: stream-ordered transfers for the device executor.
 *
 * It implements only the stream half of the seam (transport/stream.h): a
 * round is one ncclGroupStart/End batch of ncclSend/ncclRecv, enqueued on
 * the executor's transfer stream. The host half (isend, irecv, ...) is
 * never used: execute dispatches to the device executor.
 *
 * reshard never uses the caller's NCCL communicator for its traffic: it
 * splits a private one off it (ncclCommSplit, nonblocking), which it alone
 * may abort. That is what makes a failure safe: NCCL pairs point-to-point
 * work by issue order, without tags, so once one rank's work stops
 * matching its peers' (a call failed halfway, or was refused while peers
 * queued theirs), the only safe move is to abort the communicator that
 * carries it, and the caller's must survive that.
 *
 * Every NCCL call's result is checked. Every wait (ncclInProgress of the
 * nonblocking communicator, the agreement, the previous executes' work)
 * is polled until a deadline; past it the private communicator is aborted:
 * a peer that never shows up costs a timeout, not a hang. */
#include <cuda_runtime.h>
#include <nccl.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#ifdef RESHARD_HAVE_MPI
#include <mpi.h>
#endif

#include "common/clock.h"
#include "common/error.h"
#include "common/params.h"
#include "transport/dev_comm.h"
#include "cuda/cuda_util.h"
#include "reshard_nccl.h"
#include "transport/stream.h"
#include "transport/transport.h"

#if NCCL_VERSION_CODE < NCCL_VERSION(2, 19, 0)
#error "reshard's NCCL transport needs NCCL 2.19 or later (ncclMemAlloc)"
#endif

/* Plan agreement exchanges at most this many words (transport.h). */
#define RS_NCCL_SCRATCH_WORDS RS_AGREE_MAX_WORDS

typedef struct rs_nccl {
  rs_dev_comm dev; /* first (src/transport/dev_comm.h): execute order, staging pool */
  ncclComm_t comm; /* reshard's private communicator (nonblocking) */
  int aborted;     /* ncclCommAbort freed it (poisoned) */
  int device;      /* its CUDA device */
  cudaStream_t stream; /* agreement collectives (none with an MPI comm) */
  uint64_t *d_scratch, *h_scratch;
  /* ncclCommRegister handles of the pools alive (RESHARD_NCCL_REGISTER=1):
   * at most the current one and its replacement */
  void *reg_ptr[2], *reg_handle[2];
#ifdef RESHARD_HAVE_MPI
  /* reshard_comm_create_nccl_with_mpi: plan agreement runs on the host over
   * a duplicate of the caller's MPI communicator, not through NCCL. */
  MPI_Comm mpi;
  int have_mpi;
  int mpi_stuck; /* an agreement timed out: its collective is still pending */
  /* The agreement's buffer: not the caller's stack, since a timed-out
   * collective may still write into it when the late ranks arrive (it is
   * then never freed). */
  uint64_t *mpi_buf;
#endif
} rs_nccl;

/* Default deadline of communicator creation and destruction, which take
 * no options: RESHARD_TIMEOUT_MS when set, else the options' default. */
static int64_t comm_deadline(void) {
  int64_t ms = 60000;
  /* (a value below 1 is refused at plan creation; here it keeps the default) */
  if (rs_param_get(RS_PARAM_TIMEOUT_MS, &ms) && ms < 1) ms = 60000;
  return rs_deadline_after_ms(ms);
}

static reshard_result_t nccl_code(ncclResult_t e) {
  switch (e) {
  case ncclRemoteError: return RESHARD_ERROR_REMOTE;
  case ncclInvalidArgument:
  case ncclInvalidUsage: return RESHARD_ERROR_INTERNAL; /* reshard's own calls */
  default: return RESHARD_ERROR_BACKEND;
  }
}

#define PROBE_WARNING "ncclSimInfo_t" /* what NCCL records of in_caller_group's probe */

static reshard_result_t nccl_fail(ncclResult_t e, const char *what, int rank, rs_nccl *n) {
  const char *last = n && !n->aborted ? ncclGetLastError(n->comm) : NULL;
  if (last && strstr(last, PROBE_WARNING)) last = NULL; /* not about this failure */
  return rs_error(nccl_code(e), "rank %d: %s failed: %s%s%s", rank, what, ncclGetErrorString(e),
                  last && *last ? ": " : "", last && *last ? last : "");
}

/* Only ever reshard's private communicator (see the top). */
static void nccl_abort(rs_nccl *n) {
  if (n->aborted) return;
  /* the aborted transfers end early and the unpacks behind them run:
   * their gates close first */
  rs_dev_comm_close_gates(&n->dev);
  ncclCommAbort(n->comm);
  n->aborted = 1;
}

static void nccl_poison(reshard_comm_t *c) { nccl_abort(c->impl); }

/* Every wait on NCCL's host side: polls the asynchronous state of nc
 * until it leaves ncclInProgress or the deadline passes. Returns the
 * state (ncclSuccess or the failure; a failing query counts as the state)
 * or ncclInProgress when the deadline passed first. */
static ncclResult_t poll_state(ncclComm_t nc, int64_t deadline) {
  for (unsigned spin = 0;; spin++) {
    ncclResult_t st = ncclInProgress;
    ncclResult_t e = ncclCommGetAsyncError(nc, &st);
    if (e != ncclSuccess) return e;
    if (st != ncclInProgress) return st;
    if (spin > 64 && rs_now_ns() > deadline) return ncclInProgress;
    rs_nap(spin);
  }
}

/* Waits for a nonblocking communicator's pending operation. */
static reshard_result_t wait_in_progress(reshard_comm_t *c, const char *what, int64_t deadline) {
  rs_nccl *n = c->impl;
  ncclResult_t st = poll_state(n->comm, deadline);
  if (st == ncclSuccess) return RESHARD_SUCCESS;
  reshard_result_t r = st == ncclInProgress
                           ? rs_error(RESHARD_ERROR_TIMEOUT, "rank %d: %s did not complete before the deadline; "
                                      "reshard's NCCL communicator was aborted (yours is untouched)", c->rank, what)
                           : nccl_fail(st, what, c->rank, n);
  nccl_abort(n);
  return r;
}

/* Whether the calling thread is inside the caller's own
 * ncclGroupStart/ncclGroupEnd: reshard's ncclGroupEnd would then launch
 * nothing (NCCL launches at the outermost end) while its events and
 * unpacks went ahead. NCCL has no query for the depth; a probe tells:
 * ncclGroupSimulateEnd checks its argument only when it closes the
 * outermost group (NCCL src/group.cc, ncclGroupEndInternal: the depth is
 * decremented and nested ends return before the NCCL_SIM_INFO_INITIALIZER
 * magic is checked; so since 2.22, the first release with
 * ncclGroupSimulateEnd). An invalid magic thus returns ncclInvalidArgument
 * at depth 0 (nothing was queued: no effect) and ncclSuccess inside a
 * group (the depth is back where it was). Its one side effect: at depth 0
 * NCCL records its warning as the thread's last NCCL error (printed with
 * NCCL_DEBUG=WARN), so it runs once per call that enqueues, never in a
 * polling loop, and nccl_fail leaves that text out. */
static int in_caller_group(void) {
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 22, 0)
  ncclSimInfo_t probe;
  memset(&probe, 0, sizeof probe);
  probe.size = sizeof probe; /* magic 0: invalid on purpose */
  if (ncclGroupStart() != ncclSuccess) return 0;
  return ncclGroupSimulateEnd(&probe) == ncclSuccess;
#else
  return 0;
#endif
}

/* Whether the communicator is alive: not poisoned, no asynchronous error
 * (which NCCL says must end in an abort). */
static reshard_result_t nccl_health(reshard_comm_t *c) {
  rs_nccl *n = c->impl;
  if (n->aborted)
    return rs_error(RESHARD_ERROR_INVALID_USAGE, "rank %d: reshard's NCCL communicator was aborted after an earlier "
                    "failure; destroy the plans and the reshard communicator (your NCCL communicator is untouched)",
                    c->rank);
  ncclResult_t st = ncclSuccess;
  ncclResult_t e = ncclCommGetAsyncError(n->comm, &st);
  if (e != ncclSuccess) return nccl_fail(e, "ncclCommGetAsyncError", c->rank, n);
  if (st != ncclSuccess && st != ncclInProgress) {
    reshard_result_t r = nccl_fail(st, "NCCL communicator (asynchronous error)", c->rank, n);
    nccl_abort(n);
    return r;
  }
  return RESHARD_SUCCESS;
}

/* nccl_health, and the caller's side: the current device is the
 * communicator's, and no ncclGroupStart of the caller's is open. */
static reshard_result_t nccl_check(reshard_comm_t *c) {
  rs_nccl *n = c->impl;
  RS_CHECK(nccl_health(c));
  RS_CHECK(rs_dev_comm_on_device(c, n->device));
  if (in_caller_group())
    return rs_error(RESHARD_ERROR_INVALID_USAGE, "rank %d: called between your ncclGroupStart and ncclGroupEnd; "
                    "reshard's transfers would not be launched before its unpacks: call it outside the group",
                    c->rank);
  return RESHARD_SUCCESS;
}

static reshard_result_t nccl_group(reshard_comm_t *c, const rs_p2p *ops, size_t nops, void *stream,
                                   int64_t deadline, void *gate) {
  rs_nccl *n = c->impl;
  (void)gate; /* NCCL's waits end by abort (poison) */
  if (nops == 0) return RESHARD_SUCCESS;
  for (size_t i = 0; i < nops; i++)
    if (ops[i].peer == c->rank || ops[i].peer < 0 || ops[i].peer >= c->size)
      return rs_error(RESHARD_ERROR_INTERNAL, "rank %d: a transfer to peer %d (self-sends are local copies)", c->rank,
                      ops[i].peer);
  ncclResult_t e = ncclGroupStart();
  if (e != ncclSuccess) return nccl_fail(e, "ncclGroupStart", c->rank, n);
  /* ncclInProgress (a nonblocking communicator still busy) is not a
   * failure: every operation of the round is posted, whatever it returns,
   * until one fails outright. */
  ncclResult_t bad = ncclSuccess;
  for (size_t i = 0; i < nops && (bad == ncclSuccess); i++) {
    /* ncclInt8 counts bytes: size_t counts cover any message. */
    if (ops[i].is_recv)
      e = ncclRecv(ops[i].buf, (size_t)ops[i].bytes, ncclInt8, ops[i].peer, n->comm, (cudaStream_t)stream);
    else
      e = ncclSend(ops[i].buf, (size_t)ops[i].bytes, ncclInt8, ops[i].peer, n->comm, (cudaStream_t)stream);
    if (e != ncclSuccess && e != ncclInProgress) bad = e;
  }
  /* The group must be closed even after a failed call inside it. */
  ncclResult_t ge = ncclGroupEnd();
  if (bad != ncclSuccess) return nccl_fail(bad, "ncclSend/ncclRecv", c->rank, n);
  if (ge == ncclInProgress) return wait_in_progress(c, "ncclGroupEnd", deadline);
  if (ge != ncclSuccess) return nccl_fail(ge, "ncclGroupEnd", c->rank, n);
  return RESHARD_SUCCESS;
}

static reshard_result_t nccl_reduce_words(reshard_comm_t *c, uint64_t *words, uint32_t nw, void *stream,
                                          int64_t deadline, void *gate) {
  rs_nccl *n = c->impl;
  (void)gate;
  ncclResult_t e = ncclAllReduce(words, words, nw, ncclUint64, ncclMax, n->comm, (cudaStream_t)stream);
  if (e == ncclInProgress) return wait_in_progress(c, "ncclAllReduce(agreement verdict)", deadline);
  if (e != ncclSuccess) return nccl_fail(e, "ncclAllReduce(agreement verdict)", c->rank, n);
  return RESHARD_SUCCESS;
}

/* The staging pool's memory: ncclMemAlloc, registered with the
 * communicator when RESHARD_NCCL_REGISTER=1 (NCCL can then skip its own
 * copies on some transports; a failed registration only costs that). */
static reshard_result_t nccl_pool_alloc(reshard_comm_t *c, size_t bytes, void **out) {
  rs_nccl *n = c->impl;
  void *p = NULL;
  ncclResult_t e = ncclMemAlloc(&p, bytes);
  if (e != ncclSuccess)
    /* ncclMemAlloc reports a failed cuMem allocation as a CUDA or system
     * error: at this point it can only be the memory. */
    return rs_error(RESHARD_ERROR_OUT_OF_MEMORY, "rank %d: ncclMemAlloc of %zu bytes of staging failed: %s", c->rank,
                    bytes, ncclGetErrorString(e));
  int64_t reg = 0;
  void *h = NULL;
  if (rs_param_get(RS_PARAM_NCCL_REGISTER, &reg) && reg == 1 && !n->aborted &&
      ncclCommRegister(n->comm, p, bytes, &h) == ncclSuccess)
    for (int i = 0; i < 2; i++)
      if (!n->reg_ptr[i]) {
        n->reg_ptr[i] = p, n->reg_handle[i] = h;
        h = NULL;
        break;
      }
  if (h) ncclCommDeregister(n->comm, h);
  *out = p;
  return RESHARD_SUCCESS;
}

static void nccl_pool_free(reshard_comm_t *c, void *p) {
  rs_nccl *n = c->impl;
  for (int i = 0; i < 2; i++)
    if (n->reg_ptr[i] == p) {
      if (n->comm && !n->aborted) ncclCommDeregister(n->comm, n->reg_handle[i]);
      n->reg_ptr[i] = n->reg_handle[i] = NULL;
    }
  ncclMemFree(p);
}

#ifdef RESHARD_HAVE_MPI
/* Plan agreement over MPI, polled like src/transport/mpi.c's: a missing
 * rank costs a timeout, not a hang. */
static reshard_result_t mpi_agree(reshard_comm_t *c, uint64_t *vals, int nvals, int64_t deadline) {
  rs_nccl *n = c->impl;
  if (n->mpi_stuck)
    return rs_error(RESHARD_ERROR_INVALID_USAGE, "rank %d: an earlier plan agreement over MPI timed out; this "
                    "communicator cannot agree on plans again", c->rank);
  if (nvals < 0 || nvals > RS_NCCL_SCRATCH_WORDS)
    return rs_error(RESHARD_ERROR_INTERNAL, "rank %d: allreduce of %d words", c->rank, nvals);
  memcpy(n->mpi_buf, vals, (size_t)nvals * sizeof *vals);
  MPI_Request req;
  int err = MPI_Iallreduce(MPI_IN_PLACE, n->mpi_buf, nvals, MPI_UINT64_T, MPI_MAX, n->mpi, &req);
  if (err != MPI_SUCCESS)
    return rs_error(RESHARD_ERROR_BACKEND, "rank %d: MPI_Iallreduce(agreement) failed (MPI error %d)", c->rank, err);
  for (unsigned spin = 0;; spin++) {
    int flag = 0;
    err = MPI_Test(&req, &flag, MPI_STATUS_IGNORE);
    if (err != MPI_SUCCESS)
      return rs_error(RESHARD_ERROR_BACKEND, "rank %d: MPI_Test(agreement) failed (MPI error %d)", c->rank, err);
    if (flag) {
      memcpy(vals, n->mpi_buf, (size_t)nvals * sizeof *vals);
      return RESHARD_SUCCESS;
    }
    if (spin > 64 && rs_now_ns() > deadline) {
      /* A collective cannot be cancelled: the next one would pair with
       * the wrong call on the other ranks. */
      n->mpi_stuck = 1;
      return rs_error(RESHARD_ERROR_TIMEOUT, "rank %d: plan agreement over MPI did not complete before the deadline "
                      "(a rank is missing or stuck); this communicator cannot agree on plans again", c->rank);
    }
    rs_nap(spin);
  }
}
#endif

static reshard_result_t nccl_allreduce_on_device(reshard_comm_t *c, uint64_t *vals, int nvals, int64_t deadline);

/* Plan agreement. Runs on the communicator's device whatever the current
 * one (restored after): a rank on the wrong device then still takes part,
 * and learns of its mistake with everybody else at the agreement on its
 * device setup (prepare_local). */
static reshard_result_t nccl_allreduce(reshard_comm_t *c, uint64_t *vals, int nvals, int64_t deadline) {
  rs_nccl *n = c->impl;
  int dev = -1;
  if (cudaGetDevice(&dev) || dev == n->device) return nccl_allreduce_on_device(c, vals, nvals, deadline);
  cudaError_t ce = cudaSetDevice(n->device);
  if (ce) return rs_cuda_error(ce, "cudaSetDevice(the communicator's)", c->rank);
  reshard_result_t r = nccl_allreduce_on_device(c, vals, nvals, deadline);
  cudaSetDevice(dev);
  return r;
}

static reshard_result_t nccl_allreduce_on_device(reshard_comm_t *c, uint64_t *vals, int nvals, int64_t deadline) {
  rs_nccl *n = c->impl;
#ifdef RESHARD_HAVE_MPI
  /* Over MPI the agreement needs nothing of NCCL: even a poisoned rank
   * takes part, so that its partners learn of its failure from the
   * values it brings (plan creation fails on it at prepare_local, and the
   * last agreement carries that), instead of waiting for it. */
  if (n->have_mpi) return mpi_agree(c, vals, nvals, deadline);
#endif
  reshard_result_t r = nccl_health(c);
  if (r) return r;
  /* NCCL would run the allreduce after the executes already queued on
   * this communicator: wait for them (until their own deadline) so that
   * the agreement's deadline measures the agreement. The peers drain
   * theirs too, which may end later than this rank's (up to the same
   * deadline): the agreement's timeout then counts from there. */
  int64_t t0 = rs_now_ns(), busy_until = n->dev.have_last ? rs_dev_comm_busy_until(c) : 0;
  RS_CHECK(rs_dev_comm_drain(c));
  int64_t span = deadline > t0 ? deadline - t0 : 0;
  if (busy_until > t0 && deadline != RS_NO_DEADLINE && busy_until < RS_NO_DEADLINE - span) deadline = busy_until + span;
  if (nvals < 0 || nvals > RS_NCCL_SCRATCH_WORDS)
    return rs_error(RESHARD_ERROR_INTERNAL, "rank %d: allreduce of %d words", c->rank, nvals);
  memcpy(n->h_scratch, vals, (size_t)nvals * sizeof *vals);
  cudaError_t ce = cudaMemcpyAsync(n->d_scratch, n->h_scratch, (size_t)nvals * 8, cudaMemcpyHostToDevice, n->stream);
  if (ce) return rs_cuda_error(ce, "cudaMemcpyAsync(agreement)", c->rank);
  ncclResult_t e = ncclAllReduce(n->d_scratch, n->d_scratch, (size_t)nvals, ncclUint64, ncclMax, n->comm, n->stream);
  if (e == ncclInProgress) {
    RS_CHECK(wait_in_progress(c, "ncclAllReduce(agreement)", deadline));
  } else if (e != ncclSuccess) {
    return nccl_fail(e, "ncclAllReduce(agreement)", c->rank, n);
  }
  ce = cudaMemcpyAsync(n->h_scratch, n->d_scratch, (size_t)nvals * 8, cudaMemcpyDeviceToHost, n->stream);
  if (ce) return rs_cuda_error(ce, "cudaMemcpyAsync(agreement)", c->rank);
  RS_CHECK(rs_dev_comm_wait(c, n->stream, NULL, deadline, "cudaStreamQuery(agreement)",
                    "plan agreement over NCCL did not complete before the deadline (a rank is missing or stuck)"));
  memcpy(vals, n->h_scratch, (size_t)nvals * sizeof *vals);
  return RESHARD_SUCCESS;
}

/* Finalizes and destroys reshard's private communicator, polled until
 * the deadline (then aborted): destruction never hangs either. */
static void close_private(rs_nccl *n) {
  if (!n->comm || n->aborted) return;
  ncclResult_t e = ncclCommFinalize(n->comm);
  if ((e == ncclSuccess || e == ncclInProgress) && poll_state(n->comm, comm_deadline()) == ncclSuccess) {
    ncclCommDestroy(n->comm);
    n->comm = NULL;
    return;
  }
  nccl_abort(n);
}

static void nccl_release(reshard_comm_t *c, rs_nccl *n) {
  /* The communicator first: if any of its work is still stuck, finalize
   * times out and the abort ends it, before anything it uses is freed. */
  close_private(n);
  if (n->d_scratch) cudaFreeAsync(n->d_scratch, n->stream); /* no device-wide sync, unlike cudaFree */
  if (n->stream) cudaStreamDestroy(n->stream);
  if (n->h_scratch) cudaFreeHost(n->h_scratch);
  rs_dev_comm_fini(c);
#ifdef RESHARD_HAVE_MPI
  int finalized = 0;
  if (n->have_mpi && !MPI_Finalized(&finalized) && !finalized) MPI_Comm_free(&n->mpi);
  n->have_mpi = 0;
  if (!n->mpi_stuck) free(n->mpi_buf);
  n->mpi_buf = NULL;
#endif
}

static void nccl_destroy(reshard_comm_t *c) {
  rs_nccl *n = c->impl;
  if (!n) return;
  nccl_release(c, n);
  free(n);
  c->impl = NULL;
}

static const rs_dev_comm_hooks rs_nccl_hooks = {
    .name = "NCCL",
    .health = nccl_health,
    .poison = nccl_poison,
    .pool_alloc = nccl_pool_alloc,
    .pool_free = nccl_pool_free,
};

static const rs_stream_ops rs_nccl_stream_ops = {
    .group = nccl_group,
    .reduce_words = nccl_reduce_words,
    .check = nccl_check,
    .poison = nccl_poison,
    .graphs = 1,
};

static const rs_transport_ops rs_nccl_ops = {
    .name = "nccl",
    .allreduce_max_u64 = nccl_allreduce,
    .destroy = nccl_destroy,
    .stream_ops = &rs_nccl_stream_ops,
};

/* Waits until a nonblocking communicator being created is ready (or
 * fails, or the deadline passes: then it is aborted, being reshard's). */
static reshard_result_t wait_ready(ncclComm_t nc, const char *what, int64_t deadline) {
  ncclResult_t st = poll_state(nc, deadline);
  if (st == ncclSuccess) return RESHARD_SUCCESS;
  ncclCommAbort(nc);
  if (st == ncclInProgress)
    return rs_error(RESHARD_ERROR_TIMEOUT, "%s did not complete before the deadline (RESHARD_TIMEOUT_MS, default "
                    "60 s): a rank did not call it", what);
  return rs_error(nccl_code(st), "%s failed: %s", what, ncclGetErrorString(st));
}

/* reshard's private communicator: the caller's split into one (every rank,
 * in rank order), nonblocking, sharing nothing with it (not even the abort
 * flag, which splitShare would share: NCCL src/init.cc,
 * ncclCommInitChildComm). Collective over `parent`, like ncclCommSplit:
 * it blocks as the parent's own calls do (NCCL launches the split with the
 * parent's blocking mode); a nonblocking parent is polled until the
 * deadline. */
static reshard_result_t split_private(ncclComm_t parent, const char *who, ncclComm_t *out) {
  *out = NULL;
  int rank = 0;
  ncclResult_t e = ncclCommUserRank(parent, &rank);
  if (e != ncclSuccess)
    return rs_error(RESHARD_ERROR_INVALID_ARGUMENT, "%s: not a usable NCCL communicator: %s", who,
                    ncclGetErrorString(e));
  /* Two settings of the environment would break the promises reshard
   * makes: NCCL_COMM_SPLIT_SHARE_RESOURCES=1 shares the parent's abort flag
   * with the child (splitShare is the parent's setting, NCCL src/init.cc,
   * ncclCommInitChildComm: a parent created with config.splitShare = 1 is
   * the caller's to avoid), and NCCL_COMM_BLOCKING=1 overrides the child's
   * nonblocking config (envConfigOverride), so its waits could not have
   * deadlines. */
  const char *share = getenv("NCCL_COMM_SPLIT_SHARE_RESOURCES"), *blocking = getenv("NCCL_COMM_BLOCKING");
  if (share && atoi(share) == 1)
    return rs_error(RESHARD_ERROR_INVALID_USAGE, "%s rank %d: NCCL_COMM_SPLIT_SHARE_RESOURCES=1 makes split "
                    "communicators share the parent's abort flag, so reshard could not abort its own without "
                    "aborting yours; unset it (and create your communicator with splitShare = 0)", who, rank);
  if (blocking && atoi(blocking) == 1)
    return rs_error(RESHARD_ERROR_INVALID_USAGE, "%s rank %d: NCCL_COMM_BLOCKING=1 would make reshard's NCCL "
                    "communicator blocking, and its waits could then not end at a deadline; unset it", who, rank);
  ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
  cfg.blocking = 0;
  cfg.splitShare = 0;
  /* NCCL stores the new communicator when the split is done, which with a
   * nonblocking parent may be after a timeout here: the slot is on the
   * heap and is given up (never freed) then. */
  ncclComm_t *slot = calloc(1, sizeof *slot);
  if (!slot) return rs_error(RESHARD_ERROR_OUT_OF_MEMORY, "%s rank %d: out of memory", who, rank);
  e = ncclCommSplit(parent, 0, rank, slot, &cfg);
  if (e != ncclSuccess && e != ncclInProgress) {
    free(slot);
    return rs_error(nccl_code(e), "%s rank %d: ncclCommSplit failed: %s", who, rank, ncclGetErrorString(e));
  }
  int64_t deadline = comm_deadline();
  /* A nonblocking parent: the split's progress and result are the
   * parent's asynchronous state (NCCL launches the split on the parent). */
  ncclResult_t st = e == ncclInProgress ? poll_state(parent, deadline) : ncclSuccess;
  if (st == ncclInProgress) /* the slot is NCCL's now: given up */
    return rs_error(RESHARD_ERROR_TIMEOUT, "%s rank %d: ncclCommSplit did not complete before the deadline: a rank "
                    "did not call it; your communicator then still has the split pending (abort it)", who, rank);
  if (st != ncclSuccess) {
    if (__atomic_load_n(slot, __ATOMIC_ACQUIRE)) ncclCommAbort(*slot);
    free(slot);
    return rs_error(nccl_code(st), "%s rank %d: ncclCommSplit failed: %s", who, rank, ncclGetErrorString(st));
  }
  ncclComm_t child = __atomic_load_n(slot, __ATOMIC_ACQUIRE);
  free(slot);
  if (!child)
    return rs_error(RESHARD_ERROR_BACKEND, "%s rank %d: ncclCommSplit returned no communicator", who, rank);
  char what[96];
  snprintf(what, sizeof what, "%s rank %d: ncclCommSplit", who, rank);
  RS_CHECK(wait_ready(child, what, deadline));
  *out = child;
  return RESHARD_SUCCESS;
}

/* Wraps reshard's private communicator `comm` (destroyed on failure).
 * mpi_agreement: no agreement resources here (the caller attaches an MPI
 * communicator). */
static reshard_result_t wrap_comm(ncclComm_t comm, int mpi_agreement, reshard_comm_t **out) {
  reshard_comm_t *c = calloc(1, sizeof *c);
  rs_nccl *n = calloc(1, sizeof *n);
  reshard_result_t r = RESHARD_SUCCESS;
  if (!c || !n) {
    r = rs_error(RESHARD_ERROR_OUT_OF_MEMORY, "comm_create_nccl: out of memory");
    if (n) free(n);
    n = NULL;
    ncclCommAbort(comm);
    goto fail;
  }
  n->comm = comm;
  c->impl = n;
  ncclResult_t e = ncclCommCount(comm, &c->size);
  if (e == ncclSuccess) e = ncclCommUserRank(comm, &c->rank);
  if (e == ncclSuccess) e = ncclCommCuDevice(comm, &n->device);
  if (e != ncclSuccess) {
    r = rs_error(RESHARD_ERROR_INVALID_ARGUMENT, "comm_create_nccl: not a usable NCCL communicator: %s",
                 ncclGetErrorString(e));
    goto fail;
  }
  r = rs_dev_comm_init(c, &rs_nccl_hooks);
  if (r) goto fail;
  cudaError_t ce = cudaSuccess;
  if (!mpi_agreement) {
    ce = cudaStreamCreateWithFlags(&n->stream, cudaStreamNonBlocking);
    if (!ce) ce = cudaMallocAsync((void **)&n->d_scratch, RS_NCCL_SCRATCH_WORDS * 8, n->stream);
    if (!ce) ce = cudaMallocHost((void **)&n->h_scratch, RS_NCCL_SCRATCH_WORDS * 8);
  }
  if (ce) {
    r = rs_cuda_error(ce, "comm_create_nccl: CUDA setup", c->rank);
    goto fail;
  }
  c->ops = &rs_nccl_ops;
  *out = c;
  return RESHARD_SUCCESS;
fail:
  if (n) nccl_release(c, n);
  free(n);
  free(c);
  return r;
}

reshard_result_t reshard_comm_create_nccl(ncclComm_t comm, reshard_comm_t **out) {
  rs_error_clear();
  if (!out) return rs_error(RESHARD_ERROR_INVALID_ARGUMENT, "comm_create_nccl: out is NULL");
  *out = NULL;
  if (!comm) return rs_error(RESHARD_ERROR_INVALID_ARGUMENT, "comm_create_nccl: comm is NULL");
  ncclComm_t mine = NULL;
  RS_CHECK(split_private(comm, "comm_create_nccl", &mine));
  return wrap_comm(mine, 0, out);
}

#ifdef RESHARD_HAVE_MPI
reshard_result_t reshard_comm_create_nccl_mpi(MPI_Comm comm, reshard_comm_t **out) {
  rs_error_clear();
  if (!out) return rs_error(RESHARD_ERROR_INVALID_ARGUMENT, "comm_create_nccl_mpi: out is NULL");
  *out = NULL;
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (!initialized) return rs_error(RESHARD_ERROR_INVALID_USAGE, "comm_create_nccl_mpi: MPI is not initialized");
  if (comm == MPI_COMM_NULL) return rs_error(RESHARD_ERROR_INVALID_ARGUMENT, "comm_create_nccl_mpi: comm is MPI_COMM_NULL");
  int rank, size;
  MPI_Comm_rank(comm, &rank);
  MPI_Comm_size(comm, &size);
  /* Every rank takes part in the broadcast even if rank 0 failed to get an
   * id, so that the failure is collective instead of a hang. */
  struct {
    ncclUniqueId id;
    int ok;
  } msg;
  memset(&msg, 0, sizeof msg);
  if (rank == 0) msg.ok = ncclGetUniqueId(&msg.id) == ncclSuccess;
  int err = MPI_Bcast(&msg, (int)sizeof msg, MPI_BYTE, 0, comm);
  if (err != MPI_SUCCESS) return rs_error(RESHARD_ERROR_BACKEND, "comm_create_nccl_mpi rank %d: MPI_Bcast failed", rank);
  if (!msg.ok) return rs_error(RESHARD_ERROR_BACKEND, "comm_create_nccl_mpi rank %d: ncclGetUniqueId failed on rank 0", rank);
  /* reshard's own communicator from the start: nonblocking, polled. */
  ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
  cfg.blocking = 0;
  ncclComm_t nc = NULL;
  ncclResult_t e = ncclCommInitRankConfig(&nc, size, msg.id, rank, &cfg);
  if (e != ncclSuccess && e != ncclInProgress) {
    if (nc) ncclCommAbort(nc);
    return rs_error(nccl_code(e), "comm_create_nccl_mpi rank %d: ncclCommInitRankConfig failed: %s", rank,
                    ncclGetErrorString(e));
  }
  char what[96];
  snprintf(what, sizeof what, "comm_create_nccl_mpi rank %d: ncclCommInitRankConfig", rank);
  RS_CHECK(wait_ready(nc, what, comm_deadline()));
  return wrap_comm(nc, 0, out);
}

reshard_result_t reshard_comm_create_nccl_with_mpi(ncclComm_t nccl, MPI_Comm mpi, reshard_comm_t **out) {
  rs_error_clear();
  if (!out) return rs_error(RESHARD_ERROR_INVALID_ARGUMENT, "comm_create_nccl_with_mpi: out is NULL");
  *out = NULL;
  if (!nccl) return rs_error(RESHARD_ERROR_INVALID_ARGUMENT, "comm_create_nccl_with_mpi: nccl is NULL");
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (!initialized) return rs_error(RESHARD_ERROR_INVALID_USAGE, "comm_create_nccl_with_mpi: MPI is not initialized");
  if (mpi == MPI_COMM_NULL)
    return rs_error(RESHARD_ERROR_INVALID_ARGUMENT, "comm_create_nccl_with_mpi: mpi is MPI_COMM_NULL");
  /* A duplicate keeps reshard's agreement out of the caller's collectives
   * and lets it return errors rather than abort. */
  MPI_Comm dup;
  int err = MPI_Comm_dup(mpi, &dup);
  if (err != MPI_SUCCESS)
    return rs_error(RESHARD_ERROR_BACKEND, "comm_create_nccl_with_mpi: MPI_Comm_dup failed (MPI error %d)", err);
  MPI_Comm_set_errhandler(dup, MPI_ERRORS_RETURN);
  int mrank, msize, nrank = -1, nsize = -1;
  MPI_Comm_rank(dup, &mrank);
  MPI_Comm_size(dup, &msize);
  reshard_result_t r = RESHARD_SUCCESS;
  ncclResult_t e = ncclCommCount(nccl, &nsize);
  if (e == ncclSuccess) e = ncclCommUserRank(nccl, &nrank);
  if (e != ncclSuccess)
    r = rs_error(RESHARD_ERROR_INVALID_ARGUMENT, "comm_create_nccl_with_mpi: not a usable NCCL communicator: %s",
                 ncclGetErrorString(e));
  else if (nrank != mrank || nsize != msize)
    r = rs_error(RESHARD_ERROR_INVALID_ARGUMENT, "comm_create_nccl_with_mpi: NCCL rank %d of %d but MPI rank %d of %d: "
                 "the MPI communicator must have the NCCL communicator's ranks, in the same order", nrank, nsize,
                 mrank, msize);
  /* Every rank learns whether any failed, before the split (collective
   * over NCCL, it would wait for a rank that gave up) and after it: either
   * all get a communicator or none does. */
  reshard_comm_t *c = NULL;
  uint64_t *buf = NULL;
  for (int stage = 0; stage < 2; stage++) {
    if (stage == 1 && !r) {
      buf = malloc(RS_NCCL_SCRATCH_WORDS * sizeof *buf);
      ncclComm_t mine = NULL;
      r = buf ? split_private(nccl, "comm_create_nccl_with_mpi", &mine)
              : rs_error(RESHARD_ERROR_OUT_OF_MEMORY, "comm_create_nccl_with_mpi: out of memory");
      if (!r) r = wrap_comm(mine, 1, &c);
    }
    int bad = r != RESHARD_SUCCESS, any = bad;
    err = MPI_Allreduce(&bad, &any, 1, MPI_INT, MPI_MAX, dup);
    if (!r && err != MPI_SUCCESS)
      r = rs_error(RESHARD_ERROR_BACKEND, "comm_create_nccl_with_mpi rank %d: MPI_Allreduce failed (MPI error %d)",
                   mrank, err);
    else if (!r && any)
      r = rs_error(RESHARD_ERROR_REMOTE, "comm_create_nccl_with_mpi rank %d: another rank failed to create its "
                   "communicator", mrank);
  }
  if (r) {
    reshard_comm_destroy(c);
    MPI_Comm_free(&dup);
    free(buf);
    return r;
  }
  rs_nccl *n = c->impl;
  n->mpi = dup;
  n->have_mpi = 1;
  n->mpi_buf = buf;
  *out = c;
  return RESHARD_SUCCESS;
}
#endif
