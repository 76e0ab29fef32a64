/* The device transports' shared communicator state: see dev_comm.h. */
#include "transport/dev_comm.h"

#include <cuda_runtime.h>

#include <stdlib.h>

#include "common/clock.h"
#include "common/debug.h"
#include "common/error.h"
#include "common/params.h"
#include "cuda/cuda_util.h"
#include "kernels/rs_agree.h"

static rs_dev_comm *dc(reshard_comm_t *c) { return (rs_dev_comm *)c->impl; }

reshard_result_t rs_dev_comm_init(reshard_comm_t *c, const rs_dev_comm_hooks *h) {
  rs_dev_comm *d = dc(c);
  pthread_mutex_init(&d->gates_mu, NULL);
  d->hooks = h;
  cudaEvent_t ev = NULL;
  cudaError_t ce = cudaEventCreateWithFlags(&ev, cudaEventDisableTiming);
  if (ce) return rs_cuda_error(ce, "cudaEventCreateWithFlags(execute order)", c->rank);
  d->last_end = ev;
  return RESHARD_SUCCESS;
}

/* The pool goes (the last plan went, or the communicator: final). Pools
 * retired under a capture go only with the communicator: the peers keep
 * their mappings of them until then (cuda_ipc.c, exchange_pools), and
 * memory must not be freed while another process has it mapped. */
/* A pool this communicator no longer uses: freed, or with a capture on it
 * (and not final) kept with the retired ones (leaked if even that list
 * cannot grow: never freed under a peer's mapping). */
static void pool_retire(reshard_comm_t *c, rs_dev_comm *d, void *p, int final) {
  if (!d->pool_captured || final) {
    d->hooks->pool_free(c, p);
    return;
  }
  void **kept = realloc(d->retired, (d->nretired + 1) * sizeof *kept);
  if (!kept) return;
  d->retired = kept;
  d->retired[d->nretired++] = p;
}

static void pool_drop(reshard_comm_t *c, rs_dev_comm *d, int final) {
  if (d->pool && !d->pool_abandoned) pool_retire(c, d, d->pool, final);
  if (final) {
    for (size_t i = 0; i < d->nretired && !d->pool_abandoned; i++) d->hooks->pool_free(c, d->retired[i]);
    free(d->retired);
    d->retired = NULL;
    d->nretired = 0;
  }
  d->pool = NULL;
  d->pool_bytes = 0;
  d->pool_abandoned = 0;
}

void rs_dev_comm_free_exported(reshard_comm_t *c, void *p) {
  if (!p) return;
  rs_dev_comm *d = dc(c);
  if (d && d->hooks && d->hooks->free_exported) d->hooks->free_exported(c, p);
  else cudaFree(p);
}

void rs_dev_comm_launched(reshard_comm_t *c, int64_t deadline) {
  rs_dev_comm *d = dc(c);
  int64_t cur = __atomic_load_n(&d->last_deadline, __ATOMIC_ACQUIRE);
  while (deadline > cur &&
         !__atomic_compare_exchange_n(&d->last_deadline, &cur, deadline, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)) {
  }
}

void rs_dev_comm_fini(reshard_comm_t *c) {
  rs_dev_comm *d = dc(c);
  if (!d || !d->hooks) return;
  pool_drop(c, d, 1); /* plans still alive (leaked by the caller) lose theirs */
  if (d->last_end) cudaEventDestroy((cudaEvent_t)d->last_end);
  d->last_end = NULL;
  free(d->gates);
  d->gates = NULL;
  d->ngates = d->gates_cap = 0;
  pthread_mutex_destroy(&d->gates_mu);
  d->hooks = NULL;
}

reshard_result_t rs_dev_comm_gate_add(reshard_comm_t *c, void *agree) {
  rs_dev_comm *d = dc(c);
  reshard_result_t r = RESHARD_SUCCESS;
  pthread_mutex_lock(&d->gates_mu);
  if (d->ngates == d->gates_cap) {
    size_t cap = d->gates_cap ? 2 * d->gates_cap : 8;
    void **g = realloc(d->gates, cap * sizeof *g);
    if (g) d->gates = g, d->gates_cap = cap;
    else r = rs_error(RESHARD_ERROR_OUT_OF_MEMORY, "rank %d: out of memory", c->rank);
  }
  if (!r) d->gates[d->ngates++] = agree;
  pthread_mutex_unlock(&d->gates_mu);
  return r;
}

void rs_dev_comm_gate_remove(reshard_comm_t *c, void *agree) {
  rs_dev_comm *d = dc(c);
  pthread_mutex_lock(&d->gates_mu);
  for (size_t i = 0; i < d->ngates; i++)
    if (d->gates[i] == agree) {
      d->gates[i] = d->gates[--d->ngates];
      break;
    }
  pthread_mutex_unlock(&d->gates_mu);
}

void rs_dev_comm_close_gates(rs_dev_comm *d) {
  if (!d->hooks) return;
  /* {ok, bad_index}: the first two words of rs_dev_agree (pageable: the
   * copy takes it at the call) */
  static const uint32_t closed[2] = {0, RS_DEV_AGREE_POISONED};
  pthread_mutex_lock(&d->gates_mu);
  cudaStream_t s = NULL;
  if (d->ngates && cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) == cudaSuccess) {
    for (size_t i = 0; i < d->ngates; i++) cudaMemcpyAsync(d->gates[i], closed, sizeof closed, cudaMemcpyHostToDevice, s);
    int64_t until = rs_now_ns() + 1000000000;
    unsigned spin = 0;
    while (rs_cuda_query(s, NULL) == cudaErrorNotReady && rs_now_ns() < until) rs_nap(spin++);
    if (rs_cuda_query(s, NULL) == cudaErrorNotReady)
      RS_LOG(RS_LOG_WARN, RS_SUBSYS_EXEC, "closing the plans' gates before an abort did not finish in 1 s");
    cudaStreamDestroy(s);
  }
  pthread_mutex_unlock(&d->gates_mu);
}

reshard_result_t rs_dev_comm_on_device(reshard_comm_t *c, int device) {
  int dev = -1;
  cudaError_t ce = cudaGetDevice(&dev);
  if (ce) return rs_cuda_error(ce, "cudaGetDevice", c->rank);
  if (dev != device)
    return rs_error(RESHARD_ERROR_INVALID_USAGE, "rank %d: the current CUDA device is device %d but the %s "
                    "communicator's is device %d; call cudaSetDevice(%d) before every reshard call on it",
                    c->rank, dev, dc(c)->hooks->name, device, device);
  return RESHARD_SUCCESS;
}

reshard_result_t rs_dev_comm_wait(reshard_comm_t *c, void *stream, void *event, int64_t deadline, const char *what,
                                  const char *late) {
  rs_dev_comm *d = dc(c);
  for (unsigned spin = 0;; spin++) {
    cudaError_t ce = (cudaError_t)rs_cuda_query(stream, event);
    if (ce == cudaSuccess) return RESHARD_SUCCESS;
    if (ce != cudaErrorNotReady) return rs_cuda_error(ce, what, c->rank);
    RS_CHECK(d->hooks->health(c));
    if (spin > 64 && rs_now_ns() > deadline) {
      d->hooks->poison(c);
      return rs_error(RESHARD_ERROR_TIMEOUT, "rank %d: %s; reshard's %s communicator was aborted", c->rank, late,
                      d->hooks->name);
    }
    if (d->hooks->idle) d->hooks->idle(c);
    rs_nap(spin);
  }
}

int64_t rs_dev_comm_busy_until(reshard_comm_t *c) {
  rs_dev_comm *d = dc(c);
  int64_t dl = __atomic_load_n(&d->last_deadline, __ATOMIC_ACQUIRE);
  if (d->pool_captured) {
    /* a launch of a graph may be queued behind its caller's work, its
     * deadline not stamped yet: it gets RESHARD_TIMEOUT_MS (default 60 s)
     * from now to start and finish */
    int64_t ms = 60000;
    /* (a value below 1 is refused at plan creation; here it keeps the default) */
    if (rs_param_get(RS_PARAM_TIMEOUT_MS, &ms) && ms < 1) ms = 60000;
    int64_t floor = rs_deadline_after_ms(ms);
    if (floor > dl) dl = floor;
  }
  return dl;
}

reshard_result_t rs_dev_comm_drain(reshard_comm_t *c) {
  rs_dev_comm *d = dc(c);
  if (!d->have_last) return RESHARD_SUCCESS;
  RS_CHECK(rs_dev_comm_wait(c, NULL, d->last_end, rs_dev_comm_busy_until(c), "cudaEventQuery(previous execute)",
                            "an earlier execute on this communicator did not finish before its deadline (a peer is "
                            "missing or its calls come in another order)"));
  d->have_last = 0;
  return RESHARD_SUCCESS;
}

reshard_result_t rs_dev_comm_begin(reshard_comm_t *c, void *stream, void **staging) {
  rs_dev_comm *d = dc(c);
  *staging = d->pool;
  int cap = rs_stream_capturing(stream);
  if (cap) d->pool_captured = 1;
  /* (in a graph: each launch waits for the execute before it, captured or
   * not; an event never recorded is no wait) */
  if (!d->have_last && !cap) return RESHARD_SUCCESS;
  cudaError_t ce = cudaStreamWaitEvent((cudaStream_t)stream, (cudaEvent_t)d->last_end, cap ? cudaEventWaitExternal : 0);
  if (ce) return rs_cuda_error(ce, "cudaStreamWaitEvent(previous execute)", c->rank);
  return RESHARD_SUCCESS;
}

reshard_result_t rs_dev_comm_end(reshard_comm_t *c, void *stream, int64_t deadline) {
  rs_dev_comm *d = dc(c);
  /* in a graph, recorded by each launch; its deadline is the launch's
   * (rs_dev_comm_launched) */
  int cap = rs_stream_capturing(stream);
  cudaError_t ce = cap ? cudaEventRecordWithFlags((cudaEvent_t)d->last_end, (cudaStream_t)stream, cudaEventRecordExternal)
                       : cudaEventRecord((cudaEvent_t)d->last_end, (cudaStream_t)stream);
  if (ce) return rs_cuda_error(ce, "cudaEventRecord(execute end)", c->rank);
  d->have_last = 1;
  if (!cap) __atomic_store_n(&d->last_deadline, deadline, __ATOMIC_RELEASE);
  return RESHARD_SUCCESS;
}

reshard_result_t rs_dev_comm_staging_acquire(reshard_comm_t *c, size_t bytes) {
  rs_dev_comm *d = dc(c);
  if (bytes > d->pool_bytes) {
    /* The new pool first: when it cannot be had, the plans alive keep the
     * old one. The old one may still feed earlier executes: freed after
     * them. */
    void *p = NULL;
    RS_CHECK(d->hooks->pool_alloc(c, bytes, &p));
    reshard_result_t r = rs_dev_comm_drain(c);
    if (r) {
      d->hooks->pool_free(c, p);
      return r;
    }
    /* (a graph's launches may still use it: kept, see pool_retire) */
    if (d->pool && !d->pool_abandoned) pool_retire(c, d, d->pool, 0);
    d->pool_abandoned = 0;
    d->pool = p;
    d->pool_bytes = bytes;
    d->pool_gen++;
  }
  d->pool_users++;
  return RESHARD_SUCCESS;
}

void rs_dev_comm_staging_release(reshard_comm_t *c, int in_use) {
  rs_dev_comm *d = dc(c);
  if (in_use) d->pool_abandoned = 1; /* leaked rather than freed under running work */
  if (d->pool_users > 0 && --d->pool_users == 0) pool_drop(c, d, 0);
}
