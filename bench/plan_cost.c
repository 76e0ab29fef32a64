#include "plan_cost.h"

#include <stdlib.h>
#include <string.h>

#include "common/error.h"
#include "plan/cost.h"
#include "plan/plan.h"
#include "plan/topology.h"
#include "plan_measure.h"

struct pc_session {
  rs_topology topo;
  rs_rank_map map;
  rs_cost_acc acc;
};

reshard_result_t pc_session_create(const reshard_layout_t *src, const reshard_layout_t *dst, int nranks,
                                   const reshard_options_t *opts, pc_session **out) {
  *out = NULL;
  pc_session *s = calloc(1, sizeof *s);
  if (!s) return rs_error(RESHARD_ERROR_OUT_OF_MEMORY, "cost: out of memory");
  int has = 0;
  reshard_result_t r = rs_topology_resolve(opts, &s->topo, &has);
  if (!r && !has) r = rs_error(RESHARD_ERROR_INVALID_USAGE, "cost: no topology (options.topology or RESHARD_TOPOLOGY)");
  if (!r) r = rs_rank_map_build(&s->topo, src, dst, nranks, &s->map);
  if (r) {
    free(s);
    return r;
  }
  rs_cost_acc_init(&s->acc, &s->topo, &s->map, nranks);
  *out = s;
  return RESHARD_SUCCESS;
}

reshard_result_t pc_session_add(pc_session *s, const reshard_plan_t *plan) {
  rs_cost_rank c;
  RS_CHECK(rs_cost_rank_compute(plan, &c));
  reshard_result_t r = rs_cost_acc_add(&s->acc, &c);
  rs_cost_rank_free(&c);
  return r;
}

void pc_session_finish(const pc_session *s, reshard_estimate_t *out) { rs_cost_acc_finish(&s->acc, out); }

void pc_session_free(pc_session *s) {
  if (!s) return;
  rs_cost_acc_free(&s->acc);
  rs_rank_map_free(&s->map);
  free(s);
}

/* Plans every rank with rs_plan_force set to force; keeps the largest
 * spread and phase estimates (each rank's own, against the fake
 * communicator), or the smallest chunk the ranks derive. */
static reshard_result_t each_rank(const reshard_layout_t *src, const reshard_layout_t *dst, int nranks,
                                  const reshard_options_t *opts, rs_plan_agreed force, int32_t *spread,
                                  uint64_t *est, rs_pace *pace, size_t *chunk) {
  reshard_result_t r = RESHARD_SUCCESS;
  rs_plan_force = force;
  for (int k = 0; k < nranks && !r; k++) {
    reshard_comm_t *comm;
    reshard_plan_t *plan;
    r = pm_plan_rank(src, dst, k, nranks, opts, &comm, &plan);
    if (r) break;
    if (spread && plan->spread_rounds > *spread) *spread = plan->spread_rounds;
    for (int j = 0; est && j < RS_PHASE_CANDIDATES; j++)
      if (plan->phase_est[j] > est[j]) est[j] = plan->phase_est[j];
    if (pace) rs_pace_merge(pace, plan->pace_cand);
    if (chunk && (!*chunk || plan->chunk_bytes < *chunk)) *chunk = plan->chunk_bytes;
    pm_plan_free(comm, plan);
  }
  rs_plan_force = (rs_plan_agreed){0};
  return r;
}

reshard_result_t pc_agreed_chunk(const reshard_layout_t *src, const reshard_layout_t *dst, int nranks,
                                 const reshard_options_t *opts, int32_t spread, int32_t phases, uint64_t wide,
                                 rs_pace pace, size_t *chunk) {
  *chunk = 0;
  rs_plan_agreed force = {.set_spread = 1, .spread = spread, .set_phases = 1, .phases = phases, .wide = wide, .pace = pace};
  return each_rank(src, dst, nranks, opts, force, NULL, NULL, NULL, chunk);
}

reshard_result_t pc_agreed_sizes(const reshard_layout_t *src, const reshard_layout_t *dst, int nranks,
                                 const reshard_options_t *opts, int32_t *spread, int32_t *phases, uint64_t *wide,
                                 rs_pace *pace, size_t *chunk) {
  /* as the two agreements: the largest spread and phase estimates first,
   * then each rank's chunk with those, the smallest kept */
  uint64_t est[RS_PHASE_CANDIDATES] = {0};
  rs_pace cand[RS_WIDE_CANDIDATES] = {{0, 0}};
  *spread = 0;
  RS_CHECK(each_rank(src, dst, nranks, opts, (rs_plan_agreed){0}, spread, est, cand, NULL));
  *phases = rs_phases_choose(est, wide);
  *pace = rs_pace_choose(cand, *wide);
  return pc_agreed_chunk(src, dst, nranks, opts, *spread, *phases, *wide, *pace, chunk);
}

static reshard_result_t estimate_global(const reshard_layout_t *src, const reshard_layout_t *dst, int nranks,
                                       const reshard_options_t *opts, reshard_estimate_t *out, size_t *chunk);

reshard_result_t pc_choose_relay(const reshard_layout_t *src, const reshard_layout_t *dst, int nranks,
                                 const reshard_options_t *opts, int *relay, reshard_estimate_t *direct,
                                 reshard_estimate_t *relayed) {
  reshard_options_t o = *opts;
  reshard_estimate_t *e[2] = {direct, relayed};
  for (int k = 0; k < 2; k++) {
    o.relay = k;
    *e[k] = (reshard_estimate_t)RESHARD_ESTIMATE_INITIALIZER;
    RS_CHECK(estimate_global(src, dst, nranks, &o, e[k], NULL));
  }
  *relay = relayed->seconds < direct->seconds;
  return RESHARD_SUCCESS;
}

reshard_result_t pc_estimate_global(const reshard_layout_t *src, const reshard_layout_t *dst, int nranks,
                                    const reshard_options_t *opts, reshard_estimate_t *out, size_t *chunk) {
  if (opts->relay != -1) return estimate_global(src, dst, nranks, opts, out, chunk);
  int relay;
  reshard_estimate_t ed, er;
  RS_CHECK(pc_choose_relay(src, dst, nranks, opts, &relay, &ed, &er));
  reshard_options_t o = *opts;
  o.relay = relay;
  return estimate_global(src, dst, nranks, &o, out, chunk);
}

static reshard_result_t estimate_global(const reshard_layout_t *src, const reshard_layout_t *dst, int nranks,
                                        const reshard_options_t *opts, reshard_estimate_t *out, size_t *chunk) {
  size_t agreed = 0;
  int32_t spread = 0, phases = 1;
  uint64_t wide = 0;
  rs_pace pace = {0, 0};
  RS_CHECK(pc_agreed_sizes(src, dst, nranks, opts, &spread, &phases, &wide, &pace, &agreed));
  pc_session *s;
  RS_CHECK(pc_session_create(src, dst, nranks, opts, &s));
  reshard_result_t res = RESHARD_SUCCESS;
  /* what the ranks would agree on */
  rs_plan_force = (rs_plan_agreed){.set_spread = 1, .spread = spread, .set_chunk = 1, .chunk = agreed,
                                   .set_phases = 1, .phases = phases, .wide = wide, .pace = pace};
  for (int r = 0; r < nranks && !res; r++) {
    reshard_comm_t *comm;
    reshard_plan_t *plan;
    res = pm_plan_rank(src, dst, r, nranks, opts, &comm, &plan);
    if (res) break;
    res = pc_session_add(s, plan);
    pm_plan_free(comm, plan);
  }
  rs_plan_force = (rs_plan_agreed){0};
  if (!res) {
    reshard_estimate_t e;
    pc_session_finish(s, &e);
    memcpy(out, &e, sizeof e);
  }
  pc_session_free(s);
  if (chunk) *chunk = agreed;
  return res;
}
