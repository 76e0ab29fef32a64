/* The device executor's host waits and polls: every wait with a deadline
 * (poll_done, streams_idle), the deadline of a plan's latest work, the
 * commit of double buffering read back (commit_poll) and the executor's
 * poll (device_poll). Apart so that every host wait is in one file. */
#include <cuda_runtime.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/clock.h"
#include "common/debug.h"
#include "common/error.h"
#include "transport/dev_comm.h"
#include "device/device.h"
#include "device/device_internal.h"
#include "exec/direct.h"
#include "kernels/rs_kernels.h"
#include "exec/exec_state.h"
#include "exec/schedule.h"
#include "plan/quant.h"
#include "transport/stream.h"

/* Every host wait of the device executor: polls a stream (or, with
 * s NULL, an event) until its work is done or the deadline passes. Returns
 * the query's result: cudaSuccess, an error, or cudaErrorNotReady when the
 * deadline passed first. */
cudaError_t poll_done(cudaStream_t s, cudaEvent_t e, int64_t deadline) {
  for (unsigned spin = 0;; spin++) {
    cudaError_t q = (cudaError_t)rs_cuda_query(s, e);
    if (q != cudaErrorNotReady || rs_now_ns() > deadline) return q;
    rs_nap(spin);
  }
}

/* Whether the plan's work went idle before the deadline: its streams, and
 * the ends of its last execute (ev_end, which a graph's launches record
 * too: their work runs on the graph's streams, not these). A stream or
 * event whose query fails counts as idle: nothing more will run there.
 * Streams in an open capture count as busy. */
int streams_idle(rs_dev *d, int64_t deadline) {
  if (in_capture(d)) return 0;
  for (int i = 0; i < S_COUNT; i++) {
    if (d->s[i] && poll_done(d->s[i], NULL, deadline) == cudaErrorNotReady) return 0;
    if (d->ev_end[i] && poll_done(NULL, d->ev_end[i], deadline) == cudaErrorNotReady) return 0;
  }
  return 1;
}

/* The deadline of the plan's latest work: its last execute's, or a
 * graph's latest launch's. */
int64_t work_deadline(rs_dev *d) {
  int64_t dl = __atomic_load_n(&d->launch_deadline, __ATOMIC_ACQUIRE);
  return d->last_deadline > dl ? d->last_deadline : dl;
}

/* Whether the plan's streams hold work not done (outside a capture). */
static int streams_busy(rs_dev *d) {
  for (int i = 0; i < S_COUNT; i++)
    if (d->s[i] && rs_cuda_query(d->s[i], NULL) == cudaErrorNotReady) return 1;
  return 0;
}

/* Double buffering: the committed version and active copy, once the GPU
 * has done the latest enqueued commit (d->mu held; never blocks). */
void commit_poll(const reshard_plan_t *p, rs_dev *d) {
  const uint64_t launches = __atomic_load_n(&d->launches_started, __ATOMIC_ACQUIRE);
  if (!d->dbuf || !d->committed_once || rs_cuda_query(NULL, d->ev_committed) != cudaSuccess) return;
  rs_dev_commit snap; /* (kept only if no later copy began: agreement_verdict) */
  memcpy(&snap, (const void *)d->h_commit, sizeof snap);
  if (rs_cuda_query(NULL, d->ev_committed) != cudaSuccess ||
      __atomic_load_n(&d->launches_started, __ATOMIC_ACQUIRE) != launches)
    return;
  const rs_dev_commit *c = &snap;
  if (!c->commits) return;
  reshard_plan_t *m = (reshard_plan_t *)p;
  __atomic_store_n(&m->committed_version, c->version, __ATOMIC_RELEASE);
  __atomic_store_n(&m->active_copy, c->active, __ATOMIC_RELEASE);
}

void device_poll(const reshard_plan_t *p) {
  rs_dev *d = p->device;
  if (!d) return;
  /* a composite plan fails with its earlier stage (a quantizing plan's
   * gather, a spreading plan's copies; which fails with the one before
   * it), whose gate closes this plan's only where this plan has one
   * (partners, a commit) */
  const reshard_plan_t *pre = p->after;
  reshard_result_t pre_failed = RESHARD_SUCCESS;
  if (pre && pre->device) {
    device_poll(pre);
    pre_failed = rs_plan_failed(pre); /* (its message is complete once its result reads failed) */
  }
  pthread_mutex_lock(&d->mu);
  uint64_t calls = __atomic_load_n(&p->exec_calls, __ATOMIC_ACQUIRE);
  if (pre_failed && !rs_plan_failed(p)) {
    rs_error(pre_failed, "execute rank %d: the plan %s failed: %s: %s", p->rank,
             pre->stage_what ? pre->stage_what : "before this one", reshard_result_string(pre_failed), pre->fail_msg);
    dev_failed(p, d, pre_failed, calls ? calls - 1 : 0, p->committed_version);
  }
  commit_poll(p, d);
  reshard_result_t v = rs_plan_failed(p) ? RESHARD_SUCCESS : agreement_verdict(p, d);
  /* the call whose check failed, not the latest enqueued */
  if (v) dev_failed(p, d, v, d->verdict.want.call, d->verdict.want.version);
  /* Past its deadline: a launch of a graph that started and has not
   * finished, or else uncaptured work on the plan's streams (a launch
   * queued behind the caller's work has not started: no deadline yet; a
   * capture still open has no status to ask for). */
  uint64_t landed_n = __atomic_load_n(&d->launches_landed, __ATOMIC_ACQUIRE);
  uint64_t started_n = __atomic_load_n(&d->launches_started, __ATOMIC_ACQUIRE);
  int64_t now = rs_now_ns();
  int late = started_n > landed_n ? now > __atomic_load_n(&d->launch_deadline, __ATOMIC_ACQUIRE)
                                  : d->last_deadline && now > d->last_deadline && !in_capture(d) && streams_busy(d);
  if (!rs_plan_failed(p) && late) {
    v = rs_error(RESHARD_ERROR_TIMEOUT, "execute rank %d: the plan's last execute did not finish before its deadline "
                 "(a peer did not run its part, or issued its calls in another order); reshard's NCCL communicator "
                 "was aborted, which ends the work", p->rank);
    dev_failed(p, d, v, calls ? calls - 1 : 0, p->committed_version);
  }
  pthread_mutex_unlock(&d->mu);
}
