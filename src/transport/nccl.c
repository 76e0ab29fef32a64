/* The NCCL transport: stream-ordered transfers for the device executor.
 *
 * It implements only the stream half of the seam (transport/stream.h): a
 * round is one ncclGroupStart/End batch of ncclSend/ncclRecv, enqueued on
 * the executor's transfer stream. The host half (isend, irecv, ...) is
 * never used: execute dispatches to the device executor.
 *
 * Every NCCL call's result is checked. ncclInProgress (nonblocking
 * communicators) is polled with ncclCommGetAsyncError until the deadline,
 * then the communicator is aborted: a peer that never shows up costs a
 * timeout, not a hang. */
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
#include "device/device.h"
#include "reshard_nccl.h"
#include "transport/stream.h"
#include "transport/transport.h"

#if NCCL_VERSION_CODE < NCCL_VERSION(2, 19, 0)
#error "reshard's NCCL transport needs NCCL 2.19 or later (ncclMemAlloc)"
#endif

/* Plan agreement exchanges at most this many words (transport.h). */
#define RS_NCCL_SCRATCH_WORDS RS_AGREE_MAX_WORDS

/* A staging block registered with the communicator (optional). */
typedef struct rs_nccl_reg {
  void *ptr, *handle;
  struct rs_nccl_reg *next;
} rs_nccl_reg;

typedef struct rs_nccl {
  ncclComm_t comm;
  rs_nccl_reg *regs;
  int owned;   /* created by reshard: destroyed with it */
  int aborted; /* ncclCommAbort freed it */
  cudaStream_t stream; /* agreement collectives (none with an MPI comm) */
  uint64_t *d_scratch, *h_scratch;
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

static reshard_result_t nccl_code(ncclResult_t e) {
  switch (e) {
  case ncclRemoteError: return RESHARD_ERROR_REMOTE;
  case ncclInvalidArgument:
  case ncclInvalidUsage: return RESHARD_ERROR_INTERNAL; /* reshard's own calls */
  default: return RESHARD_ERROR_BACKEND;
  }
}

static reshard_result_t nccl_fail(ncclResult_t e, const char *what, int rank, rs_nccl *n) {
  const char *last = n && !n->aborted ? ncclGetLastError(n->comm) : NULL;
  return rs_error(nccl_code(e), "rank %d: %s failed: %s%s%s", rank, what, ncclGetErrorString(e),
                  last && *last ? ": " : "", last && *last ? last : "");
}

static void nccl_abort(rs_nccl *n) {
  if (n->aborted) return;
  ncclCommAbort(n->comm);
  n->aborted = 1;
}

static void nap(unsigned spin) {
  if (spin < 64) return;
  if (spin < 256) {
    sched_yield();
    return;
  }
  struct timespec ts = {0, 20000};
  nanosleep(&ts, NULL);
}

/* Waits for a nonblocking communicator's pending operation. */
static reshard_result_t wait_in_progress(reshard_comm_t *c, const char *what, int64_t deadline) {
  rs_nccl *n = c->impl;
  for (unsigned spin = 0;; spin++) {
    ncclResult_t st = ncclInProgress;
    ncclResult_t e = ncclCommGetAsyncError(n->comm, &st);
    if (e != ncclSuccess) return nccl_fail(e, "ncclCommGetAsyncError", c->rank, n);
    if (st == ncclSuccess) return RESHARD_SUCCESS;
    if (st != ncclInProgress) {
      reshard_result_t r = nccl_fail(st, what, c->rank, n);
      nccl_abort(n);
      return r;
    }
    if (spin > 64 && rs_now_ns() > deadline) {
      nccl_abort(n);
      return rs_error(RESHARD_ERROR_TIMEOUT, "rank %d: %s did not complete before the deadline; "
                      "the NCCL communicator was aborted", c->rank, what);
    }
    nap(spin);
  }
}

static reshard_result_t nccl_check(reshard_comm_t *c) {
  rs_nccl *n = c->impl;
  if (n->aborted)
    return rs_error(RESHARD_ERROR_INVALID_USAGE, "rank %d: the NCCL communicator was aborted after an earlier failure",
                    c->rank);
  ncclResult_t st = ncclSuccess;
  ncclResult_t e = ncclCommGetAsyncError(n->comm, &st);
  if (e != ncclSuccess) return nccl_fail(e, "ncclCommGetAsyncError", c->rank, n);
  if (st != ncclSuccess && st != ncclInProgress) return nccl_fail(st, "NCCL communicator (asynchronous error)", c->rank, n);
  return RESHARD_SUCCESS;
}

static reshard_result_t nccl_group(reshard_comm_t *c, const rs_p2p *ops, size_t nops, void *stream,
                                   int64_t deadline) {
  rs_nccl *n = c->impl;
  if (nops == 0) return RESHARD_SUCCESS;
  for (size_t i = 0; i < nops; i++)
    if (ops[i].peer == c->rank || ops[i].peer < 0 || ops[i].peer >= c->size)
      return rs_error(RESHARD_ERROR_INTERNAL, "rank %d: a transfer to peer %d (self-sends are local copies)", c->rank,
                      ops[i].peer);
  ncclResult_t e = ncclGroupStart();
  if (e != ncclSuccess) return nccl_fail(e, "ncclGroupStart", c->rank, n);
  for (size_t i = 0; i < nops && e == ncclSuccess; i++) {
    /* ncclInt8 counts bytes: size_t counts cover any message. */
    if (ops[i].is_recv)
      e = ncclRecv(ops[i].buf, (size_t)ops[i].bytes, ncclInt8, ops[i].peer, n->comm, (cudaStream_t)stream);
    else
      e = ncclSend(ops[i].buf, (size_t)ops[i].bytes, ncclInt8, ops[i].peer, n->comm, (cudaStream_t)stream);
  }
  /* The group must be closed even after a failed call inside it. */
  ncclResult_t ge = ncclGroupEnd();
  if (e != ncclSuccess && e != ncclInProgress) return nccl_fail(e, "ncclSend/ncclRecv", c->rank, n);
  if (ge == ncclInProgress) return wait_in_progress(c, "ncclGroupEnd", deadline);
  if (ge != ncclSuccess) return nccl_fail(ge, "ncclGroupEnd", c->rank, n);
  return RESHARD_SUCCESS;
}

static reshard_result_t nccl_mem_alloc(reshard_comm_t *c, size_t bytes, void **ptr) {
  rs_nccl *n = c->impl;
  *ptr = NULL;
  ncclResult_t e = ncclMemAlloc(ptr, bytes);
  if (e != ncclSuccess) {
    *ptr = NULL;
    /* ncclMemAlloc reports a failed cuMem allocation as a CUDA or system
     * error: at this point it can only be the memory. */
    return rs_error(RESHARD_ERROR_OUT_OF_MEMORY, "rank %d: ncclMemAlloc of %zu bytes of staging failed: %s", c->rank,
                    bytes, ncclGetErrorString(e));
  }
  /* Registration (RESHARD_NCCL_REGISTER=1) lets NCCL skip its own copies
   * on some transports; it is an optimization, so a failure only costs
   * that. */
  int64_t reg = 0;
  if (rs_param_get(RS_PARAM_NCCL_REGISTER, &reg) && reg == 1) {
    rs_nccl_reg *r = calloc(1, sizeof *r);
    if (r && ncclCommRegister(n->comm, *ptr, bytes, &r->handle) == ncclSuccess) {
      r->ptr = *ptr;
      r->next = n->regs;
      n->regs = r;
    } else {
      free(r);
    }
  }
  return RESHARD_SUCCESS;
}

static void nccl_mem_free(reshard_comm_t *c, void *ptr) {
  rs_nccl *n = c->impl;
  if (!ptr) return;
  for (rs_nccl_reg **pr = &n->regs; *pr; pr = &(*pr)->next)
    if ((*pr)->ptr == ptr) {
      rs_nccl_reg *r = *pr;
      if (!n->aborted) ncclCommDeregister(n->comm, r->handle);
      *pr = r->next;
      free(r);
      break;
    }
  ncclMemFree(ptr);
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
    nap(spin);
  }
}
#endif

static reshard_result_t nccl_allreduce(reshard_comm_t *c, uint64_t *vals, int nvals, int64_t deadline) {
  rs_nccl *n = c->impl;
  reshard_result_t r = nccl_check(c);
  if (r) return r;
#ifdef RESHARD_HAVE_MPI
  if (n->have_mpi) return mpi_agree(c, vals, nvals, deadline);
#endif
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
  /* Poll rather than cudaStreamSynchronize: a missing rank must end in a
   * timeout, and NCCL errors surface through the communicator. */
  for (unsigned spin = 0;; spin++) {
    ce = cudaStreamQuery(n->stream);
    if (ce == cudaSuccess) break;
    if (ce != cudaErrorNotReady) return rs_cuda_error(ce, "cudaStreamQuery(agreement)", c->rank);
    RS_CHECK(nccl_check(c));
    if (spin > 64 && rs_now_ns() > deadline) {
      nccl_abort(n);
      return rs_error(RESHARD_ERROR_TIMEOUT, "rank %d: plan agreement over NCCL did not complete before the deadline "
                      "(a rank is missing or stuck); the NCCL communicator was aborted", c->rank);
    }
    nap(spin);
  }
  memcpy(vals, n->h_scratch, (size_t)nvals * sizeof *vals);
  return RESHARD_SUCCESS;
}

/* The host half of the seam: unreachable, since execute dispatches to the
 * device executor. Kept failing loudly rather than NULL. */
static reshard_result_t nccl_no_isend(reshard_comm_t *c, int peer, uint64_t tag, const void *buf, size_t bytes,
                                      rs_request **req) {
  (void)peer, (void)tag, (void)buf, (void)bytes, (void)req;
  return rs_error(RESHARD_ERROR_INTERNAL, "rank %d: host send on the NCCL transport", c->rank);
}
static reshard_result_t nccl_no_irecv(reshard_comm_t *c, int peer, uint64_t tag, void *buf, size_t bytes,
                                      rs_request **req) {
  (void)peer, (void)tag, (void)buf, (void)bytes, (void)req;
  return rs_error(RESHARD_ERROR_INTERNAL, "rank %d: host receive on the NCCL transport", c->rank);
}
static reshard_result_t nccl_no_test(reshard_comm_t *c, rs_request *req, int *done) {
  (void)req;
  *done = 1;
  return rs_error(RESHARD_ERROR_INTERNAL, "rank %d: host test on the NCCL transport", c->rank);
}
static reshard_result_t nccl_no_wait(reshard_comm_t *c, rs_request *req, int64_t deadline) {
  (void)req, (void)deadline;
  return rs_error(RESHARD_ERROR_INTERNAL, "rank %d: host wait on the NCCL transport", c->rank);
}
static void nccl_no_cancel(reshard_comm_t *c, rs_request *req) { (void)c, (void)req; }

static void nccl_release(rs_nccl *n) {
  if (n->stream) cudaStreamDestroy(n->stream);
  if (n->d_scratch) cudaFree(n->d_scratch);
  if (n->h_scratch) cudaFreeHost(n->h_scratch);
  if (n->owned && !n->aborted) ncclCommDestroy(n->comm);
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
  nccl_release(n);
  free(n);
  c->impl = NULL;
}

static const rs_stream_ops rs_nccl_stream_ops = {
    rs_device_execute, nccl_group, nccl_mem_alloc, nccl_mem_free, nccl_check,
};

static const rs_transport_ops rs_nccl_ops = {
    .name = "nccl",
    .isend = nccl_no_isend,
    .irecv = nccl_no_irecv,
    .test = nccl_no_test,
    .wait = nccl_no_wait,
    .cancel = nccl_no_cancel,
    .allreduce_max_u64 = nccl_allreduce,
    .destroy = nccl_destroy,
    .stream_ops = &rs_nccl_stream_ops,
};

/* mpi_agreement: no agreement resources here (the caller attaches an MPI
 * communicator). */
static reshard_result_t wrap_comm(ncclComm_t comm, int owned, int mpi_agreement, reshard_comm_t **out) {
  reshard_comm_t *c = calloc(1, sizeof *c);
  rs_nccl *n = calloc(1, sizeof *n);
  reshard_result_t r = RESHARD_SUCCESS;
  if (!c || !n) {
    r = rs_error(RESHARD_ERROR_OUT_OF_MEMORY, "comm_create_nccl: out of memory");
    goto fail;
  }
  n->comm = comm;
  n->owned = owned;
  ncclResult_t e = ncclCommCount(comm, &c->size);
  if (e == ncclSuccess) e = ncclCommUserRank(comm, &c->rank);
  if (e != ncclSuccess) {
    r = rs_error(RESHARD_ERROR_INVALID_ARGUMENT, "comm_create_nccl: not a usable NCCL communicator: %s",
                 ncclGetErrorString(e));
    goto fail;
  }
  cudaError_t ce = cudaSuccess;
  if (!mpi_agreement) {
    ce = cudaStreamCreateWithFlags(&n->stream, cudaStreamNonBlocking);
    if (!ce) ce = cudaMalloc((void **)&n->d_scratch, RS_NCCL_SCRATCH_WORDS * 8);
    if (!ce) ce = cudaMallocHost((void **)&n->h_scratch, RS_NCCL_SCRATCH_WORDS * 8);
  }
  if (ce) {
    r = rs_cuda_error(ce, "comm_create_nccl: CUDA setup", c->rank);
    goto fail;
  }
  c->ops = &rs_nccl_ops;
  c->impl = n;
  *out = c;
  return RESHARD_SUCCESS;
fail:
  if (n) {
    n->owned = 0; /* the caller's comm on failure paths, or destroyed below */
    nccl_release(n);
  }
  free(n);
  free(c);
  return r;
}

reshard_result_t reshard_comm_create_nccl(ncclComm_t comm, reshard_comm_t **out) {
  rs_error_clear();
  if (!out) return rs_error(RESHARD_ERROR_INVALID_ARGUMENT, "comm_create_nccl: out is NULL");
  *out = NULL;
  if (!comm) return rs_error(RESHARD_ERROR_INVALID_ARGUMENT, "comm_create_nccl: comm is NULL");
  return wrap_comm(comm, 0, 0, out);
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
  ncclComm_t nc = NULL;
  ncclResult_t e = ncclCommInitRank(&nc, size, msg.id, rank);
  if (e != ncclSuccess)
    return rs_error(nccl_code(e), "comm_create_nccl_mpi rank %d: ncclCommInitRank failed: %s", rank,
                    ncclGetErrorString(e));
  reshard_result_t r = wrap_comm(nc, 1, 0, out);
  if (r) ncclCommDestroy(nc);
  return r;
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
  int mrank, msize;
  MPI_Comm_rank(dup, &mrank);
  MPI_Comm_size(dup, &msize);
  reshard_comm_t *c = NULL;
  uint64_t *buf = malloc(RS_NCCL_SCRATCH_WORDS * sizeof *buf);
  reshard_result_t r = buf ? wrap_comm(nccl, 0, 1, &c)
                           : rs_error(RESHARD_ERROR_OUT_OF_MEMORY, "comm_create_nccl_with_mpi: out of memory");
  if (!r && (c->rank != mrank || c->size != msize))
    r = rs_error(RESHARD_ERROR_INVALID_ARGUMENT, "comm_create_nccl_with_mpi: NCCL rank %d of %d but MPI rank %d of %d: "
                 "the MPI communicator must have the NCCL communicator's ranks, in the same order", c->rank, c->size,
                 mrank, msize);
  /* Every rank learns whether any failed: either all get a communicator
   * or none does, and a failing rank never leaves the others waiting in a
   * later agreement. */
  int bad = r != RESHARD_SUCCESS, any = bad;
  err = MPI_Allreduce(&bad, &any, 1, MPI_INT, MPI_MAX, dup);
  if (!r && err != MPI_SUCCESS)
    r = rs_error(RESHARD_ERROR_BACKEND, "comm_create_nccl_with_mpi rank %d: MPI_Allreduce failed (MPI error %d)",
                 mrank, err);
  else if (!r && any)
    r = rs_error(RESHARD_ERROR_REMOTE, "comm_create_nccl_with_mpi rank %d: another rank failed to create its "
                 "communicator", mrank);
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
