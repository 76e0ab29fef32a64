/* reshard_plan_destroy: a plan's memory back, after the executes still
 * running on it have ended, with what hangs off it (the executor's state,
 * block quantization's and source-side spreading's scratch and pre-plans,
 * the staging cache). Apart from create.c because a plan is destroyed
 * long after creation and from everywhere: the caller, every failure path
 * of creation, and here for a composite plan's pre-plans. */
#include <stdio.h>
#include <stdlib.h>

#include "common/alloc.h"
#include "common/clock.h"
#include "plan/plan.h"
#include "plan/planner.h"
#include "plan/quant.h"
#include "plan/spread.h"
#include "plan/topology.h"

/* A composite plan's stages: each pre-plan first (its work writes the
 * scratch), then the scratch and the rest of the stage. The pre-plans are
 * plan creation's (create.c attaches them), so they are destroyed here,
 * not by quant.c or spread.c. */
static void destroy_stages(reshard_plan_t *p) {
  if (p->quant) reshard_plan_destroy(p->quant->pre);
  rs_quant_free(p->quant);
  if (p->spread) reshard_plan_destroy(p->spread->pre);
  rs_spread_free(p->spread);
}

void reshard_plan_destroy(reshard_plan_t *p) {
  if (!p) return;
  /* Executes still running on other threads (counted by execute) end by
   * their deadline: wait for them, with a margin, rather than free the
   * plan under them. One still inside past that is a bug elsewhere: the
   * plan is then leaked, said on stderr, not freed under it. */
  if (__atomic_load_n(&p->in_use, __ATOMIC_ACQUIRE)) {
    const int64_t until = rs_deadline_after_ms(2 * p->opts.timeout_ms + 5000);
    for (unsigned spin = 0; __atomic_load_n(&p->in_use, __ATOMIC_ACQUIRE); spin++) {
      if (rs_now_ns() > until) {
        fprintf(stderr, "reshard: plan_destroy rank %d: %d execute(s) of the plan still running past their "
                        "deadline; the plan is left allocated, not freed under them\n",
                p->rank, __atomic_load_n(&p->in_use, __ATOMIC_ACQUIRE));
        return;
      }
      rs_nap(spin);
    }
  }
  if (p->executor && p->executor->free) p->executor->free(p);
  destroy_stages(p);
  rs_transcript_free(p->transcript);
  free(p->sends);
  free(p->recvs);
  free(p->send_round);
  free(p->recv_round);
  free(p->send_copies);
  free(p->recv_copies);
  free(p->local_copies);
  free(p->send_vbox);
  free(p->recv_vbox);
  free(p->local_vbox);
  for (int i = 0; i < p->nvtensors; i++) free(p->vtensors[i].name);
  free(p->vtensors);
  for (int i = 0; i < p->nsrc_used; i++) free(p->src_used[i].name);
  for (int i = 0; i < p->ndst_used; i++) free(p->dst_used[i].name);
  free(p->src_used);
  free(p->dst_used);
  free(p->peers);
  rs_bulk_free(p->staging_cache);
  rs_rank_map_free(&p->map);
  free(p);
}
