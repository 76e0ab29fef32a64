/* Pricing a reshard in one process: every rank's plan is created against
 * the fake communicator (fake_comm.h) and priced with the cost model
 * (src/plan/cost.h), exactly as reshard_plan_estimate would price the
 * plans of a real run. */
#ifndef RESHARD_BENCH_PLAN_COST_H
#define RESHARD_BENCH_PLAN_COST_H

#include <stddef.h>

#include "plan/plan.h" /* rs_pace */
#include "reshard.h"

/* The spread, phases, wide-stream threshold and chunk a real run of
 * nranks agrees on: every rank planned as given (the largest spread; the
 * phases and threshold from the largest phase estimates), then again
 * with those (the smallest chunk). */
reshard_result_t pc_agreed_sizes(const reshard_layout_t *src,
                                 const reshard_layout_t *dst, int nranks,
                                 const reshard_options_t *opts,
                                 int32_t *spread, int32_t *phases,
                                 uint64_t *wide, rs_pace *pace, size_t *chunk);

/* The chunk a real run of nranks agrees on once the spread, phases and
 * threshold are agreed: every rank planned with them, the smallest chunk
 * kept. */
reshard_result_t pc_agreed_chunk(const reshard_layout_t *src,
                                 const reshard_layout_t *dst, int nranks,
                                 const reshard_options_t *opts,
                                 int32_t spread, int32_t phases,
                                 uint64_t wide, rs_pace pace, size_t *chunk);

/* Plans every rank with the agreed spread and chunk (pc_agreed_sizes) and
 * prices the plans. opts must name a topology (or RESHARD_TOPOLOGY
 * must). *chunk (may be NULL) receives the agreed chunk. */
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
 * opts->relay must be -1 and opts must name a topology. */
reshard_result_t pc_choose_relay(const reshard_layout_t *src,
                                 const reshard_layout_t *dst, int nranks,
                                 const reshard_options_t *opts, int *relay,
                                 reshard_estimate_t *direct,
                                 reshard_estimate_t *relayed);

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
