/* The in-doubt state of the double-buffer commit (docs/RELIABILITY.md,
 * "The commit protocol").
 *
 * The commit is one allreduce of every rank's vote: the outcome is a
 * function of all the votes, and a rank learns it only when the
 * collective completes. A rank whose own vote was a failure knows the
 * outcome at once (nothing commits). A rank that voted to commit and
 * whose collective passed its deadline does not: on MPI that collective
 * stays pending and completes when the late ranks arrive, and they then
 * commit if every vote was a success. Such a rank reports
 * RESHARD_ERROR_IN_DOUBT, flips nothing and remembers the collective; it
 * settles the version later from that same collective's result, so it
 * ends where the ranks that learned the outcome in time ended. Where a
 * timed-out collective is over for every rank (the in-process world,
 * NCCL: rs_transport_ops.allreduce_late is NULL) nobody can complete it
 * later, and the rank that timed out knows that nothing committed. */
#include <stdio.h>

#include "common/clock.h"
#include "common/error.h"
#include "exec/exec_state.h"
#include "kernels/rs_agree.h"
#include "transport/transport.h"

static reshard_plan_t *mut(const reshard_plan_t *p) { return (reshard_plan_t *)p; }

/* What the active copy holds, for messages. */
static void copies_say(const reshard_plan_t *p, char *out, size_t n) {
  const int active = __atomic_load_n(&p->active_copy, __ATOMIC_ACQUIRE);
  if (active < 0)
    snprintf(out, n, "no version was committed before");
  else
    snprintf(out, n, "copy %d still holds version %llu", active,
             (unsigned long long)__atomic_load_n(&p->committed_version, __ATOMIC_ACQUIRE));
}

reshard_result_t rs_commit_refusal(const reshard_plan_t *p, const uint64_t *v, uint64_t call, uint64_t version,
                                   int outcome, const char *lead) {
  char held[96];
  copies_say(p, held, sizeof held);
  if (outcome == RS_COMMIT_FAILED) {
    char why[RS_BLAME_WORDS * RS_BLAME_BYTES_PER_WORD + 4];
    const int who = rs_blame_get(v + RS_COMMIT_WORDS, why, sizeof why);
    if (who < 0)
      return rs_error(RESHARD_ERROR_REMOTE, "%s: another rank failed execute call %llu with '%s'; nothing committed, %s",
                      lead, (unsigned long long)call, reshard_result_string((reshard_result_t)v[0]), held);
    return rs_error(RESHARD_ERROR_REMOTE, "%s: rank %d failed execute call %llu (%s); nothing committed, %s", lead, who,
                    (unsigned long long)call, why, held);
  }
  return rs_error(RESHARD_ERROR_MISMATCH,
                  "%s: ranks are at different executes: this rank call %llu version %llu, others up to call %llu "
                  "version %llu, from call %llu version %llu",
                  lead, (unsigned long long)call, (unsigned long long)version, (unsigned long long)v[3],
                  (unsigned long long)v[1], (unsigned long long)~v[4], (unsigned long long)~v[2]);
}

reshard_result_t rs_plan_doubt(const reshard_plan_t *p, uint64_t ticket, uint64_t call, uint64_t version,
                               int copy) {
  reshard_plan_t *m = mut(p);
  m->doubt_ticket = ticket;
  m->doubt_call = call;
  m->doubt_copy = copy;
  __atomic_store_n(&m->doubt_version, version, __ATOMIC_RELEASE);
  char held[96];
  copies_say(p, held, sizeof held);
  return rs_error(RESHARD_ERROR_IN_DOUBT,
                  "execute rank %d (double-buffer commit): version %llu (call %llu) is in doubt: this rank voted to "
                  "commit it and its commit collective passed the deadline without every rank's vote. Nothing flipped "
                  "here: %s, "
                  "copy %d holds version %llu. reshard_plan_resolve (or this plan's next execute) settles it from "
                  "the same vote once the late ranks arrive",
                  p->rank, (unsigned long long)version, (unsigned long long)call, held, copy,
                  (unsigned long long)version);
}

reshard_result_t rs_plan_settle(const reshard_plan_t *p, int64_t deadline) {
  reshard_plan_t *m = mut(p);
  const uint64_t version = __atomic_load_n(&p->doubt_version, __ATOMIC_ACQUIRE);
  if (!version) return RESHARD_SUCCESS;
  uint64_t v[RS_HOST_COMMIT_WORDS], ticket = p->doubt_ticket;
  int done = 0;
  reshard_result_t r = p->comm->ops->allreduce_late(p->comm, &ticket, v, RS_HOST_COMMIT_WORDS, deadline, &done);
  if (r != RESHARD_SUCCESS) {
    rs_error_prefix("resolve rank %d (version %llu in doubt): ", p->rank, (unsigned long long)version);
    return r;
  }
  char held[96];
  copies_say(p, held, sizeof held);
  if (!done)
    return rs_error(RESHARD_ERROR_IN_DOUBT,
                    "resolve rank %d: version %llu (call %llu) is still in doubt: the commit vote of every rank has "
                    "not arrived (a rank is late, stopped or gone). Nothing flipped here: %s, copy %d holds version "
                    "%llu; no rank commits it before every vote is in",
                    p->rank, (unsigned long long)version, (unsigned long long)p->doubt_call, held, p->doubt_copy,
                    (unsigned long long)version);
  const uint64_t call = p->doubt_call;
  const int outcome = rs_commit_outcome(v, version, call);
  __atomic_store_n(&m->doubt_version, 0, __ATOMIC_RELEASE);
  if (outcome == RS_COMMIT_OK) {
    /* every rank voted to commit: roll forward, as they did */
    __atomic_store_n(&m->active_copy, p->doubt_copy, __ATOMIC_RELEASE);
    rs_plan_record_success(p, version);
    m->doubt_copy = -1;
    return RESHARD_SUCCESS;
  }
  m->doubt_copy = -1;
  char lead[128];
  snprintf(lead, sizeof lead, "execute rank %d: version %llu (call %llu), in doubt here, was not committed", p->rank,
           (unsigned long long)version, (unsigned long long)call);
  reshard_result_t why = rs_commit_refusal(p, v, call, version, outcome, lead);
  rs_plan_mark_failed(p, call, version, why, reshard_last_error());
  return RESHARD_SUCCESS;
}
