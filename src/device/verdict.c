/* The device executor's verdicts and failures: the decoder of the
 * agreement's sticky verdict into a MISMATCH message (agreement_verdict),
 * the failure record of a plan (dev_failed) and the refusal of a call
 * (device_refuse). Apart so that what an execute reports is read in one
 * place. */
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

/* The verdict of the agreement of the plan's latest finished execute:
 * MISMATCH naming the partner, the calls and the versions, once a
 * partner's header differed (sticky: the first difference). Never
 * blocks. */
reshard_result_t agreement_verdict(const reshard_plan_t *p, rs_dev *d) {
  /* a snapshot, kept only if no later copy began meanwhile: a launch of a
   * graph, enqueued by another thread, re-records the event first, and
   * one that ran whole meanwhile counted its start */
  const uint64_t launches = __atomic_load_n(&d->launches_started, __ATOMIC_ACQUIRE);
  if (!d->h_agree || !d->agreed_once || rs_cuda_query(NULL, d->ev_agreed) != cudaSuccess) return RESHARD_SUCCESS;
  rs_dev_agree snap;
  memcpy(&snap, (const void *)d->h_agree, sizeof snap);
  if (rs_cuda_query(NULL, d->ev_agreed) != cudaSuccess ||
      __atomic_load_n(&d->launches_started, __ATOMIC_ACQUIRE) != launches)
    return RESHARD_SUCCESS;
  d->verdict = snap;
  const rs_dev_agree *a = &d->verdict;
  if (a->ok) return RESHARD_SUCCESS;
  if (a->bad_index == RS_DEV_AGREE_ELSEWHERE)
    return rs_error(RESHARD_ERROR_MISMATCH, "execute rank %d: call %llu (weight version %llu): a rank elsewhere in "
                    "this plan failed its agreement (in a relay plan its data reaches this rank through forwards; in "
                    "a quantizing plan its gathering of fp8 blocks may have failed; its partners name it); no "
                    "destination byte of that call or a later one was written", p->rank,
                    (unsigned long long)a->want.call, (unsigned long long)a->want.version);
  if (a->bad_index == RS_DEV_AGREE_POISONED)
    return rs_error(RESHARD_ERROR_REMOTE, "execute rank %d: at or after call %llu (weight version %llu): reshard's "
                    "communicator was aborted (a failed or timed-out call on it, this plan's or another's) while "
                    "this plan's work was pending; its later unpacks wrote nothing (destination buffers may be "
                    "partly updated)", p->rank, (unsigned long long)a->want.call, (unsigned long long)a->want.version);
  if (a->bad_index == RS_DEV_AGREE_PRIOR)
    return rs_error(RESHARD_ERROR_REMOTE, "execute rank %d: call %llu (weight version %llu): the plan %s (or a "
                    "stage before it) failed at its call %llu (its status says why); nothing of this plan that "
                    "depends on it was written", p->rank, (unsigned long long)a->want.call,
                    (unsigned long long)a->want.version, p->after && p->after->stage_what ? p->after->stage_what
                    : "before this one", (unsigned long long)a->got.call);
  if (a->bad_index == RS_DEV_AGREE_TRANSPORT) {
    int peer = (int)(int64_t)a->got.digest;
    uint64_t why = a->got.magic;
    reshard_result_t code = why == RS_IPC_ABORTED ? RESHARD_ERROR_REMOTE
                            : why == RS_IPC_BAD_SIZE ? RESHARD_ERROR_MISMATCH
                            : why == RS_IPC_STALE   ? RESHARD_ERROR_BACKEND
                                                     : RESHARD_ERROR_TIMEOUT;
    const char *what = why == RS_IPC_ABORTED ? "was given up: the communicator was poisoned (a failed or refused "
                                               "call here or on a peer)"
                       : why == RS_IPC_BAD_SIZE ? "failed: the message's size differs from the receive's (the "
                                                  "ranks' plans differ)"
                       : why == RS_IPC_STALE ? "failed: the peer's staging pool changed and was not exchanged again "
                                               "(a plan creation that failed after growing it); recreate the "
                                               "communicator"
                                                : "did not complete within the plan's timeout (the peer did not run "
                                                  "its part)";
    return rs_error(code, "execute rank %d: at or after call %llu (weight version %llu): a transfer with rank %d %s; "
                    "the later unpacks of that call and every later call wrote nothing (destination buffers may be "
                    "partly updated)", p->rank, (unsigned long long)a->want.call,
                    (unsigned long long)a->want.version, peer, what);
  }
  if (a->bad_index == RS_DEV_AGREE_APART)
    return rs_error(RESHARD_ERROR_MISMATCH, "execute rank %d (double-buffer commit): ranks are at different "
                    "executes: this rank call %llu version %llu, others from call %llu version %llu up to call %llu "
                    "version %llu; nothing committed, and no destination byte of a later call written", p->rank,
                    (unsigned long long)a->want.call, (unsigned long long)a->want.version,
                    (unsigned long long)a->got.digest, (unsigned long long)a->got.magic,
                    (unsigned long long)a->got.call, (unsigned long long)a->got.version);
  if (a->bad_index == RS_DEV_AGREE_NOCOMMIT)
    return rs_error(RESHARD_ERROR_REMOTE, "execute rank %d: call %llu (weight version %llu): another rank failed it "
                    "(its status says why); nothing committed (double buffering), and no destination byte of a "
                    "later call written", p->rank, (unsigned long long)a->want.call,
                    (unsigned long long)a->want.version);
  if (a->bad_index == RS_DEV_AGREE_VERIFY) {
    /* the descriptor: a receive (its message names the peer) or a local copy */
    uint64_t desc = a->got.digest;
    const rs_vbox *v = NULL;
    int peer = p->rank;
    if (a->got.magic == 0 && desc >= p->nsend_copies && desc - p->nsend_copies < p->nrecv_copies) {
      uint64_t rc = desc - p->nsend_copies;
      v = &p->recv_vbox[rc];
      for (size_t i = 0; i < p->nrecvs; i++)
        if (rc >= p->recvs[i].first_copy && rc < p->recvs[i].first_copy + p->recvs[i].ncopies) peer = p->recvs[i].peer;
    } else if (a->got.magic == 1 && desc >= p->nsend_copies + p->nrecv_copies &&
               desc - p->nsend_copies - p->nrecv_copies < p->nlocal_copies) {
      v = &p->local_vbox[desc - p->nsend_copies - p->nrecv_copies];
    }
    char when[96];
    snprintf(when, sizeof when, "at or after call %llu (weight version %llu): ", (unsigned long long)a->want.call,
             (unsigned long long)a->want.version);
    /* (the kernel leaves the sums in the got header: here in call, the source's in version) */
    return rs_verdict_verify(p, when, v, a->got.magic == 0, peer, a->got.call, a->got.version,
                             "; the writes of every later call were skipped (and the call's commit, with double "
                             "buffering)");
  }
  int peer = a->bad_index < p->npeers ? p->peers[a->bad_index].peer : -1;
  return rs_verdict_header(p, peer, &a->got, &a->want,
                           "; no destination byte of that call or a later one was written");
}

/* The plan fails at call `call` (d->mu held; r's detail is the current
 * error), in the plan's one failure record (exec/state.c), whatever r is:
 * a plan whose enqueued work may be half done (or whose communicator
 * failed) cannot run again, and execute then returns INVALID_USAGE. When
 * it does NCCL work, the communicator is poisoned: some of a failed call
 * may be enqueued and the peers may have queued their half, a plan out
 * of step or past its deadline has partners waiting, so nothing this rank
 * sends later could be trusted to pair with the right call. */
void dev_failed(const reshard_plan_t *p, rs_dev *d, reshard_result_t r, uint64_t call, uint64_t version) {
  if (d->d_agree) p->comm->ops->stream_ops->poison(p->comm);
  rs_plan_mark_failed(p, call, version, r, reshard_last_error());
}

/* refuse: the partners cannot be told (no headers yet), and their half of
 * this call may be queued already, which NCCL would pair with this rank's
 * next call: the communicator is poisoned instead. */
reshard_result_t device_refuse(const reshard_plan_t *plan, int explicit_version, uint64_t version_in,
                               reshard_result_t r) {
  (void)explicit_version, (void)version_in;
  if (plan->nsends + plan->nrecvs) {
    plan->comm->ops->stream_ops->poison(plan->comm);
    rs_error_prefix("(reshard's %s communicator is now poisoned: its peers may have queued this call) ",
                    plan->comm->ops->name);
  }
  return r;
}
