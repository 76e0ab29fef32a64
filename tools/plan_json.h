/* reshard_plan --json FILE: the planned world, machine-readable.
 *
 * The tool hands every rank's final plan (the one a real run executes) to
 * pj_add as it walks them (plan_world.h pass 3); the collector keeps what
 * the picture needs: each rank's traffic per peer and per round and, when
 * the plan has a topology, its share of the cost model
 * (src/plan/cost.h rs_cost_rank_compute, summed by rs_cost_acc_add: the
 * same maxima per round and link that reshard_plan_estimate reduces).
 * pj_write then writes the whole description with the figures the tool
 * printed (stats, the estimate, T_lower, the baselines). The schema is in
 * tools/README.md; python/reshard/plot.py draws it. */
#ifndef RESHARD_TOOLS_PLAN_JSON_H
#define RESHARD_TOOLS_PLAN_JSON_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "cli.h"
#include "cost_report.h"
#include "reshard.h"

typedef struct pj_world pj_world;

/* A collector for a world of `world` ranks; NULL when out of memory. */
pj_world *pj_create(int world);
/* One rank's plan. Only a rank's first plan counts (the tool may walk the
 * same plans twice: once to price them, once to check them). */
reshard_result_t pj_add(pj_world *w, int rank, const reshard_plan_t *plan);
void pj_free(pj_world *w);

/* What the tool knows besides the plans. */
typedef struct pj_meta {
  const cli_layouts *L;
  int world, colocated, relay;
  const reshard_options_t *opts;
  size_t chunk;
  int spread_rounds, phases, pace_rounds;
  uint64_t wide_bytes;
  const uint64_t *phase_est;          /* RS_PHASE_CANDIDATES, the largest of the ranks' */
  const reshard_plan_stats_t *stats;  /* per rank, as the table prints them */
  const reshard_estimate_t *ours;     /* NULL without --topology */
  const cr_figures *cost;             /* NULL without --topology */
  int spread_kept;                    /* source-side spreading kept */
  double spread_pre_s;                /* its pre-plan's predicted time */
  uint64_t spread_moved_bytes;
  int gather_priced;                  /* fp8 gathering pre-plan, priced (--topology) */
  double gather_pre_s;                /* its predicted time */
  uint64_t gather_bytes;              /* and the bytes it moves */
} pj_meta;

/* Writes the description to path. 0, or -1 with a message on stderr. */
int pj_write(const pj_world *w, const pj_meta *m, const char *path);

#endif
