#include "plan_cost.h"

#include <stdlib.h>
#include <string.h>

#include "reshard_internal.h"
#include "plan_measure.h"
#include "plan_world.h"

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

/* Pass 3 of a run, priced: each rank's share is added as its plan is
 * built (the sums and maxima do not depend on the order), then the plan
 * goes to the caller's `also`. */
typedef struct price_pass {
  pc_session *s;
  pw_plan_fn also;
  void *also_arg;
} price_pass;

static reshard_result_t add_plan(int rank, reshard_plan_t *plan, void *arg) {
  price_pass *pp = arg;
  RS_CHECK(pc_session_add(pp->s, plan));
  return pp->also ? pp->also(rank, plan, pp->also_arg) : RESHARD_SUCCESS;
}

reshard_result_t pc_price_run(pw_run *run, const reshard_layout_t *src, const reshard_layout_t *dst, int nranks,
                              const reshard_options_t *opts, pw_plan_fn also, void *also_arg, reshard_estimate_t *out) {
  price_pass pp = {NULL, also, also_arg};
  RS_CHECK(pc_session_create(src, dst, nranks, opts, &pp.s));
  reshard_result_t r = pw_run_plans(run, add_plan, &pp);
  if (!r) {
    reshard_estimate_t e;
    pc_session_finish(pp.s, &e);
    memcpy(out, &e, sizeof e);
  }
  pc_session_free(pp.s);
  return r;
}

static reshard_result_t estimate_global(const reshard_layout_t *src, const reshard_layout_t *dst, int nranks,
                                        const reshard_options_t *opts, pw_plan_fn also, void *also_arg,
                                        reshard_estimate_t *out, size_t *chunk, pw_run **keep) {
  pw_run *run;
  RS_CHECK(pw_run_create(src, dst, nranks, opts, &run));
  reshard_result_t r = pc_price_run(run, src, dst, nranks, opts, also, also_arg, out);
  if (chunk) *chunk = pw_run_agreed(run)->chunk;
  if (!r && keep) *keep = run;
  else pw_run_free(run);
  return r;
}

reshard_result_t pc_choose_relay(const reshard_layout_t *src, const reshard_layout_t *dst, int nranks,
                                 const reshard_options_t *opts, int *relay, reshard_estimate_t *direct,
                                 reshard_estimate_t *relayed, pw_plan_fn also, void *const *also_args,
                                 pw_run **kept) {
  reshard_options_t o = *opts;
  reshard_estimate_t *e[2] = {direct, relayed};
  pw_run *runs[2] = {NULL, NULL};
  reshard_result_t r = RESHARD_SUCCESS;
  for (int k = 0; k < 2 && !r; k++) {
    o.relay = k;
    *e[k] = (reshard_estimate_t)RESHARD_ESTIMATE_INITIALIZER;
    r = estimate_global(src, dst, nranks, &o, also, also ? also_args[k] : NULL, e[k], NULL, kept ? &runs[k] : NULL);
  }
  if (!r) {
    *relay = relayed->seconds < direct->seconds;
    if (kept) {
      *kept = runs[*relay];
      runs[*relay] = NULL;
    }
  }
  pw_run_free(runs[0]);
  pw_run_free(runs[1]);
  return r;
}

reshard_result_t pc_estimate_global(const reshard_layout_t *src, const reshard_layout_t *dst, int nranks,
                                    const reshard_options_t *opts, reshard_estimate_t *out, size_t *chunk) {
  if (opts->relay != -1) return estimate_global(src, dst, nranks, opts, NULL, NULL, out, chunk, NULL);
  int relay;
  pw_run *run = NULL;
  reshard_estimate_t ed, er;
  RS_CHECK(pc_choose_relay(src, dst, nranks, opts, &relay, &ed, &er, NULL, NULL, &run));
  *out = relay ? er : ed;
  if (chunk) *chunk = pw_run_agreed(run)->chunk;
  pw_run_free(run);
  return RESHARD_SUCCESS;
}

/* ---- source-side spreading (plan/spread.h), decided as a real run ---- */

typedef struct egress_ctx {
  uint64_t *egress;
} egress_ctx;

static reshard_result_t egress_rank(int rank, reshard_plan_t *plan, void *arg) {
  ((egress_ctx *)arg)->egress[rank] = rs_spread_egress(plan);
  return RESHARD_SUCCESS;
}

reshard_result_t pc_spread_decide(pw_run *run, const reshard_layout_t *src, const reshard_layout_t *dst, int nranks,
                                  const reshard_options_t *opts, rs_spread_layouts *out) {
  memset(out, 0, sizeof *out);
  rs_topology topo;
  int has = 0;
  RS_CHECK(rs_topology_resolve(opts, &topo, &has));
  if (!has) return RESHARD_SUCCESS;
  uint64_t *w = calloc(2 * (size_t)nranks + 1, sizeof *w);
  if (!w) return rs_error(RESHARD_ERROR_OUT_OF_MEMORY, "spreading: out of memory");
  egress_ctx c = {w};
  reshard_result_t r = pw_run_plans(run, egress_rank, &c);
  /* as create_agree.c rs_create_agree_loads: egress + 1 where the rank holds source data,
   * and its held bytes */
  for (int q = 0; !r && q < nranks; q++) {
    uint64_t held = 0;
    size_t nfrags = 0;
    r = rs_layout_rank_bytes(src, q, &held, &nfrags);
    w[q] = nfrags ? w[q] + 1 : 0;
    w[nranks + q] = held;
  }
  rs_rank_map map;
  memset(&map, 0, sizeof map);
  if (!r) r = rs_rank_map_build(&topo, src, dst, nranks, &map);
  if (!r)
    r = rs_spread_layouts_make(src, dst, &map, nranks, -1, w, w + nranks,
                               (opts->flags & RESHARD_FLAG_SPREAD_ALWAYS) != 0, out);
  rs_rank_map_free(&map);
  free(w);
  return r;
}
