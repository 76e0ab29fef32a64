/* Pricing a reshard in one process: every rank's plan is created against
 * the fake communicator (fake_comm.h) and priced with the cost model
 * (src/plan/cost.h), exactly as reshard_plan_estimate would price the
 * plans of a real run. */
#ifndef RESHARD_BENCH_PLAN_COST_H
#define RESHARD_BENCH_PLAN_COST_H

#include <stddef.h>

#include "reshard_internal.h"
#include "plan_world.h"
#include "reshard.h"

/* Plans every rank with what the ranks agree on (plan_world.h) and
 * prices the plans. opts must name a topology (or RESHARD_TOPOLOGY
 * must). *chunk (may be NULL) receives the agreed chunk. With relay -1,
 * the plan pc_choose_relay keeps is priced. */
reshard_result_t pc_estimate_global(const reshard_layout_t *src,
                                    const reshard_layout_t *dst, int nranks,
                                    const reshard_options_t *opts,
                                    reshard_estimate_t *out, size_t *chunk);

/* relay -1 (auto) as a real run resolves it: the fake communicator's
 * allreduce returns each rank's own share, so a rank planned alone would
 * choose from its own share only and the ranks would disagree (sources
 * picking relay, destinations direct). This prices the direct and the
 * relay plan over all ranks and sets *relay to the library's choice (a
 * tie keeps direct); *direct and *relayed receive the two estimates.
 * opts->relay must be -1 and opts must name a topology. Each plan priced
 * also goes, in rank order, to also(rank, plan, also_args[relay]) (also
 * may be NULL). kept (may be NULL) receives the run of the plan kept,
 * for more passes over it. */
reshard_result_t pc_choose_relay(const reshard_layout_t *src,
                                 const reshard_layout_t *dst, int nranks,
                                 const reshard_options_t *opts, int *relay,
                                 reshard_estimate_t *direct,
                                 reshard_estimate_t *relayed, pw_plan_fn also,
                                 void *const *also_args, pw_run **kept);

/* Prices the plans of a run (its pass 3), as pc_estimate_global; each
 * plan also goes to also(rank, plan, also_arg) in rank order (also may
 * be NULL). */
reshard_result_t pc_price_run(pw_run *run, const reshard_layout_t *src,
                              const reshard_layout_t *dst, int nranks,
                              const reshard_options_t *opts, pw_plan_fn also,
                              void *also_arg, reshard_estimate_t *out);

/* Source-side spreading as reshard_plan_create decides it (plan/spread.h):
 * every rank's egress out of its NVLink domain from the plans of run
 * (one more pass 3), then the decision and the rewritten layouts (*out
 * src NULL: nothing to spread, or no topology). Whether to keep them is
 * the caller's: price the pre-plan (src -> out->pre, relay 0) and the
 * main plan (out->src -> dst) and compare, as create.c does. */
reshard_result_t pc_spread_decide(pw_run *run, const reshard_layout_t *src, const reshard_layout_t *dst, int nranks,
                                  const reshard_options_t *opts, rs_spread_layouts *out);

/* The pieces, for a caller that plans the ranks itself (reshard_plan):
 * a pricing session over nranks ranks, fed one plan at a time. */
typedef struct pc_session pc_session;
reshard_result_t pc_session_create(const reshard_layout_t *src,
                                   const reshard_layout_t *dst, int nranks,
                                   const reshard_options_t *opts,
                                   pc_session **out);
reshard_result_t pc_session_add(pc_session *s, const reshard_plan_t *plan);
void pc_session_finish(const pc_session *s, reshard_estimate_t *out);
void pc_session_free(pc_session *s);

#endif
