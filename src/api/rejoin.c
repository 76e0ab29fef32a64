/* reshard_plan_rejoin's front door: the refusals that need no peer, the
 * plan's busy flag, the kept plan's side of the newcomer's creation
 * (plan/rejoin.c), then the agreed counters and the cleared failure
 * (exec/state.c), applied only once every collective passed. */
#include "api/front.h"
#include "common/error.h"
#include "exec/exec_state.h"
#include "plan/planner.h"
#include "transport/transport.h"

static reshard_result_t refuse_at_once(const reshard_plan_t *p) {
  const reshard_comm_t *c = p->comm;
  if (!c->ops->replaces_ranks)
    return rs_error(RESHARD_ERROR_INVALID_ARGUMENT, "plan_rejoin rank %d: the plan's communicator (%s) replaces no "
                    "ranks; only UCX communicators do (reshard_comm_ucx_rejoin)", p->rank, c->ops->name);
  if (c->rejoins == p->rejoins && p->rejoined)
    return rs_error(RESHARD_ERROR_INVALID_USAGE, "plan_rejoin rank %d: this plan was rejoined already for the "
                    "communicator's latest rejoin (number %u)", p->rank, c->rejoins);
  if (c->rejoins == p->rejoins)
    return rs_error(RESHARD_ERROR_INVALID_USAGE, "plan_rejoin rank %d: no rejoin happened since this plan was "
                    "created (the communicator's rejoins: %u); nothing to do", p->rank, c->rejoins);
  if (c->rejoins > p->rejoins + 1)
    return rs_error(RESHARD_ERROR_INVALID_USAGE, "plan_rejoin rank %d: %u rejoins passed since this plan was last "
                    "current; only one can be caught up with (destroy it and create it again)", p->rank,
                    c->rejoins - p->rejoins);
  return RESHARD_SUCCESS;
}

reshard_result_t reshard_plan_rejoin(reshard_plan_t *p) {
  rs_error_clear();
  if (!p) return rs_error(RESHARD_ERROR_INVALID_ARGUMENT, "plan_rejoin: plan is NULL");
  RS_CHECK(refuse_at_once(p));
  RS_CHECK(rs_api_enter(p, "plan_rejoin"));
  /* a plan of several creation steps: every rank is told, the newcomer's
   * creation too (it fails at its first agreement) */
  reshard_result_t local =
      p->rejoinable ? RESHARD_SUCCESS
                    : rs_error(RESHARD_ERROR_UNSUPPORTED, "plan_rejoin rank %d: this plan was made in several "
                               "creation steps (relay -1 with a topology, source-side spreading or fp8 block "
                               "quantization), which a rejoin does not mirror: destroy it and create it again on "
                               "every rank", p->rank);
  uint64_t agreed[3] = {0, 0, 0};
  reshard_result_t r = rs_plan_rejoin_agree(p, local, agreed);
  if (!r) {
    rs_plan_rejoin_state(p, agreed);
    p->rejoins = p->comm->rejoins;
    p->rejoined = 1;
  }
  rs_api_leave(p);
  return r;
}
