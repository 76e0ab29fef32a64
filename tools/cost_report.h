/* reshard_plan --topology: the plan's predicted time against the physical
 * limit T_lower and three baselines, priced with the same cost model on
 * the same topology (src/plan/cost.h, src/plan/lower_bound.h):
 *
 *   gather-broadcast  every byte gathered to the lowest source rank, then
 *                     broadcast to every destination rank by a pipelined
 *                     chain (what most RL frameworks do today);
 *   replica0-direct   direct point-to-point, every cell from the first
 *                     source replica holding it (RESHARD_FLAG_FIRST_REPLICA);
 *   balanced-direct   this library's planner without relays (relay = 0).
 *
 * The last lines printed are exactly
 *   # reshard_plan: predicted_s=<x> lower_s=<y> ratio=<x/y>
 *   # baseline <name>: predicted_s=<x> ratio=<x/lower>     (one per baseline)
 */
#ifndef RESHARD_TOOLS_COST_REPORT_H
#define RESHARD_TOOLS_COST_REPORT_H

#include <stdio.h>

#include "cli.h"
#include "reshard.h"

/* Bytes a pipelined chain moves per step (the broadcast baseline). */
#define CR_CHAIN_CHUNK_BYTES ((double)(4u << 20))

/* What the report prints, for reshard_plan --json. */
typedef struct cr_figures {
  reshard_estimate_t lower;      /* T_lower and its terms */
  double gather_broadcast_s;     /* the gather-broadcast baseline */
  reshard_estimate_t replica0;   /* the replica0-direct baseline */
  reshard_estimate_t balanced;   /* the balanced-direct baseline */
  int nnodes, ndomains;          /* of the rank map */
} cr_figures;

/* Prints the report for our plan's estimate `ours` (priced by the caller
 * from the plans it checked). opts: the options our plan was made with.
 * balanced: the balanced-direct baseline if the caller priced it already
 * (the relay choice does), else NULL. fig (may be NULL) receives the
 * figures printed. Returns 0, or -1 with a message on stderr. */
int cr_report(const cli_layouts *L, int world, const reshard_options_t *opts,
              const reshard_estimate_t *ours,
              const reshard_estimate_t *balanced, FILE *out, cr_figures *fig);

#endif
