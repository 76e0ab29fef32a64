/* Keeping a plan across a rank's replacement (reshard_plan_rejoin): the
 * kept plan's side of the newcomer's creation of the same plan.
 *
 * A newcomer (reshard_comm_create_ucx_joining) creates the plan with
 * reshard_plan_create, which plans its own side and runs creation's
 * collectives over every rank. A staying rank has its side planned
 * already: it replays its creation's transcript (plan/transcript.c),
 * contributing to each collective the words it contributed then. The
 * newcomer, planning the same layouts like-for-like, brings the replaced
 * rank's words, so every reduction gives what it gave then (checked):
 * the newcomer's creation takes every branch the first one took (relay
 * -1's choice, spreading's verdict, the pre-plans) and ends where it
 * ended, with the kept plans' numbers (their message tags). The words
 * that differ on purpose are the execute count and versions in each
 * plan's first agreement: the kept plan and its pre-plans bring their
 * live ones, which the newcomer's plans start from. Nothing of the plan
 * changes here: the caller (api/rejoin.c) applies the agreed counters
 * once every collective passed. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/blame.h"
#include "common/clock.h"
#include "common/error.h"
#include "plan/planner.h"
#include "transport/transport.h"

reshard_result_t rs_plan_current(const reshard_plan_t *p, const char *op) {
  if (p->comm->resizes != p->resizes)
    return rs_error(RESHARD_ERROR_INVALID_USAGE,
                    "%s rank %d: the communicator was resized since this plan was created (reshard_comm_ucx_resize; "
                    "%d ranks then, %d now, this process rank %d now): the plan names ranks of before; destroy it "
                    "and create it again", op, p->rank, p->size, p->comm->size, p->comm->rank);
  return RESHARD_SUCCESS;
}

/* The live plan whose first agreement entry i (plus one) is, or -1. */
static int live_of(reshard_plan_t *const *live, int nlive, size_t i) {
  for (int k = 0; k < nlive; k++)
    if (live[k]->agree_entry == i + 1) return k;
  return -1;
}

/* One entry replayed. *pending: a finding of the staying ranks alone (the
 * newcomer would plan otherwise), carried into the first entry that can
 * fail every rank (and into the last agreement), with its message in
 * why. Returns a failure every rank knows. */
static reshard_result_t replay_one(reshard_plan_t *p, reshard_plan_t *const *live, int nlive, size_t i,
                                   uint64_t *v, uint64_t (*agreed)[3], reshard_result_t *pending, char *why,
                                   size_t len) {
  reshard_comm_t *comm = p->comm;
  const rs_transcript *t = p->transcript;
  const rs_reduce_entry *e = &t->e[i];
  const uint64_t *mine = t->words + e->at, *want = mine + e->n;
  memcpy(v, mine, (size_t)e->n * sizeof *v);
  const int k = live_of(live, nlive, i);
  if (e->agree) rs_rejoin_agree_fill(v, k >= 0 ? live[k] : NULL);
  const int carry = *pending && e->code_at >= 0;
  if (carry) {
    v[e->code_at] = (uint64_t)*pending;
    rs_blame_put(v + e->blame_at, comm->rank, why, rs_blame_first_cause(*pending));
  }
  RS_CHECK(comm->ops->allreduce_max_u64(comm, v, e->n, rs_deadline_after_ms(p->opts.timeout_ms)));
  if (carry) return rs_error(*pending, "%s", why);
  if (e->code_at >= 0 && v[e->code_at] && !want[e->code_at]) /* the newcomer failed, as every rank sees */
    return rs_create_another_failed(comm, v[e->code_at], v + e->blame_at, "");
  if (*pending) return RESHARD_SUCCESS;
  if (e->agree) {
    uint64_t a[3] = {0, 0, 0};
    RS_CHECK(rs_rejoin_agree_check(comm, mine, v, want, e->desc, p->opts.timeout_ms, a, why, len));
    if (why[0]) *pending = RESHARD_ERROR_MISMATCH;
    else if (k >= 0) memcpy(agreed[k], a, sizeof a);
  } else if (memcmp(v, want, (size_t)e->n * sizeof *v)) {
    *pending = RESHARD_ERROR_MISMATCH;
    snprintf(why, len, "plan_rejoin rank %d: the newcomer's plan of the same layouts would differ from this kept "
             "plan (collective %zu of its creation's %zu reduced other words: a different build or environment, "
             "e.g. RESHARD_* settings?)", comm->rank, i + 1, t->n);
  }
  return RESHARD_SUCCESS;
}

reshard_result_t rs_plan_rejoin_agree(reshard_plan_t *p, reshard_plan_t *const *live, int nlive,
                                      uint64_t (*agreed)[3]) {
  reshard_comm_t *comm = p->comm;
  const rs_transcript *t = p->transcript;
  comm->plans_created += t->plans; /* as the newcomer's creation numbers them */
  int most = 1;
  for (size_t i = 0; i < t->n; i++)
    if (t->e[i].n > most) most = t->e[i].n;
  uint64_t v[RS_AGREE_MAX_WORDS];
  if (most > RS_AGREE_MAX_WORDS)
    return rs_error(RESHARD_ERROR_INTERNAL, "plan_rejoin rank %d: a recorded collective of %d words", p->rank, most);
  reshard_result_t pending = RESHARD_SUCCESS;
  char why[1024] = "";
  for (size_t i = 0; i < t->n; i++)
    RS_CHECK(replay_one(p, live, nlive, i, v, agreed, &pending, why, sizeof why));
  /* the creation's last agreement (plan/create.c, rs_plan_create) */
  return rs_create_agree_outcome(comm, p, pending ? rs_error(pending, "%s", why) : RESHARD_SUCCESS,
                                 "keeping its plan for a rejoin");
}
