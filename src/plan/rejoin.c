/* Keeping a plan across a rank's replacement (reshard_plan_rejoin): the
 * kept plan's side of the newcomer's creation of the same plan.
 *
 * A newcomer (reshard_comm_create_ucx_joining) creates the plan with
 * reshard_plan_create, which plans its own side and runs creation's
 * collectives over every rank. A staying rank has its side planned
 * already: it takes part in those same collectives with the words its
 * plan's creation reduced (create_agree.c, rs_rejoin_agree*), in the
 * order create.c runs them for a plan made in one step (plan_create_one:
 * the first agreement, the chunk's, the outcome of building, and the
 * peers' where the executor connects any), so that the newcomer's
 * creation ends where the first one ended: the same agreed spread,
 * phases, pace and chunk, the kept plan's number (its message tags) and
 * its execute count and versions. Nothing of the plan changes here: the
 * caller (api/rejoin.c) applies the agreed counters once every
 * collective passed. */
#include "common/error.h"
#include "plan/planner.h"
#include "transport/transport.h"

reshard_result_t rs_plan_rejoin_agree(reshard_plan_t *p, reshard_result_t local, uint64_t agreed[3]) {
  reshard_comm_t *comm = p->comm;
  comm->plans_created++; /* as the newcomer's creation counts one */
  int knows = 1;
  reshard_result_t r = rs_rejoin_agree(comm, p, local, agreed, &knows);
  if (r && knows) return r;
  /* this rank's finding alone (the newcomer would plan otherwise): the
   * next agreement tells the newcomer, whose creation then fails too */
  reshard_result_t mine = r;
  r = rs_rejoin_agree_chunk(comm, p, mine, &knows);
  if (r && knows) return r;
  mine = r;
  r = rs_create_agree_outcome(comm, p, mine, "building its plan");
  if (r) return r;
  if (p->executor->prepare_peers) r = rs_create_agree_outcome(comm, p, RESHARD_SUCCESS, "connecting its plan's peers");
  return r;
}
