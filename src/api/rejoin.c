/* reshard_plan_rejoin's front door: the refusals that need no peer, the
 * plan's busy flag, the kept plan's side of the newcomer's creation
 * (plan/rejoin.c), then the agreed counters and the cleared failure
 * (exec/state.c) of the plan and its pre-plans, applied only once every
 * collective passed; registered buffers are held (exec/register.h). */
#include "api/front.h"
#include "common/error.h"
#include "exec/exec_state.h"
#include "exec/register.h"
#include "plan/planner.h"
#include "plan/quant.h"
#include "plan/spread.h"
#include "transport/transport.h"

static reshard_result_t refuse_at_once(const reshard_plan_t *p) {
  const reshard_comm_t *c = p->comm;
  RS_CHECK(rs_plan_current(p, "plan_rejoin"));
  if (!c->ops->replaces_ranks)
    return rs_error(RESHARD_ERROR_INVALID_ARGUMENT, "plan_rejoin rank %d: the plan's communicator (%s) replaces no "
                    "ranks; only UCX communicators do (reshard_comm_ucx_rejoin)", p->rank, c->ops->name);
  if (c->rejoins == p->rejoins && p->rejoined)
    return rs_error(RESHARD_ERROR_INVALID_USAGE, "plan_rejoin rank %d: this plan was rejoined already for the "
                    "communicator's latest rejoin (number %u)", p->rank, c->rejoins);
  if (c->rejoins == p->rejoins)
    return rs_error(RESHARD_ERROR_INVALID_USAGE, "plan_rejoin rank %d: no rejoin happened since this plan was "
                    "created (the communicator's rejoins: %u); nothing to do", p->rank, c->rejoins);
  if (!p->transcript) /* (every plan made on such a communicator has one) */
    return rs_error(RESHARD_ERROR_INTERNAL, "plan_rejoin rank %d: the plan kept no transcript of its creation",
                    p->rank);
  if (c->rejoins > p->rejoins + 1)
    return rs_error(RESHARD_ERROR_INVALID_USAGE, "plan_rejoin rank %d: %u rejoins passed since this plan was last "
                    "current; only one can be caught up with (destroy it and create it again)", p->rank,
                    c->rejoins - p->rejoins);
  return RESHARD_SUCCESS;
}

/* The plans a kept plan runs: itself and its pre-plans (spreading's,
 * quantization's gathering), each with its own execute count, versions
 * and message tags, which the newcomer's plans take over. */
static int live_plans(reshard_plan_t *p, reshard_plan_t **live) {
  int n = 0;
  live[n++] = p;
  if (p->spread && p->spread->pre) live[n++] = p->spread->pre;
  if (p->quant && p->quant->pre) live[n++] = p->quant->pre;
  return n;
}

reshard_result_t reshard_plan_rejoin(reshard_plan_t *p) {
  rs_error_clear();
  if (!p) return rs_error(RESHARD_ERROR_INVALID_ARGUMENT, "plan_rejoin: plan is NULL");
  RS_CHECK(refuse_at_once(p));
  RS_CHECK(rs_api_enter(p, "plan_rejoin"));
  reshard_plan_t *live[3];
  const int nlive = live_plans(p, live);
  uint64_t agreed[3][3] = {{0}};
  reshard_result_t r = rs_plan_rejoin_agree(p, live, nlive, agreed);
  if (!r) {
    for (int k = 0; k < nlive; k++) {
      rs_plan_rejoin_state(live[k], agreed[k]);
      live[k]->rejoins = p->comm->rejoins;
    }
    p->rejoined = 1;
    /* Registered buffers (exec/register.h) are held, not used: the
     * replaced rank's keys are gone and the newcomer registered nothing.
     * The plan executes through staging until every rank registers
     * again (collective, the newcomer included), which keeps this rank's
     * registrations of the same buffers and trades keys with the
     * newcomer only. */
    rs_host_reg_hold(p);
  }
  rs_api_leave(p);
  return r;
}
