/* reshard_plan_estimate: the cost model of cost.h, computed collectively
 * from every rank's own messages. The transport offers one collective, an
 * element-wise maximum, so sums (a node's copies, the bytes moved) travel
 * as one slot per rank, and the bounding rank of each round is found with
 * (size - rank) keys: the lowest rank wins, as in the global computation. */
#include <stdlib.h>
#include <string.h>

#include "common/clock.h"
#include "common/error.h"
#include "plan/cost.h"
#include "plan/plan.h"
#include "plan/planner.h"
#include "plan/quant.h"
#include "plan/spread.h"
#include "transport/transport.h"

/* In slices: transports bound one reduction to RS_AGREE_MAX_WORDS values
 * (transport.h; NCCL's preallocated scratch). One deadline for the whole. */
#define REDUCE_SLICE RS_AGREE_MAX_WORDS

static reshard_result_t reduce(const reshard_plan_t *plan, uint64_t *v, size_t n) {
  reshard_comm_t *comm = plan->comm;
  int64_t deadline = rs_deadline_after_ms(plan->opts.timeout_ms);
  for (size_t at = 0; at < n; at += REDUCE_SLICE) {
    size_t k = n - at < REDUCE_SLICE ? n - at : REDUCE_SLICE;
    reshard_result_t r = rs_create_reduce(comm, v + at, (int)k, deadline, -1, 0); /* (recorded in a creation) */
    if (r) {
      rs_error_prefix("plan_estimate rank %d: ", plan->rank);
      return r;
    }
  }
  return RESHARD_SUCCESS;
}

static reshard_result_t estimate_one(const reshard_plan_t *plan, reshard_estimate_t *out) {
  if (!plan->has_topo) /* the same on every rank: the topology is part of the digest */
    return rs_error(RESHARD_ERROR_INVALID_USAGE,
                    "plan_estimate rank %d: the plan has no topology (set options.topology or RESHARD_TOPOLOGY to a preset)",
                    plan->rank);
  const int N = plan->size, me = plan->rank;
  const int node = plan->topo.node_copy_bw > 0;
  rs_cost_rank mine;
  reshard_result_t local = rs_cost_rank_compute(plan, &mine);
  char msg[512] = "";
  if (local) snprintf(msg, sizeof msg, "%s", reshard_last_error());

  uint64_t a[2] = {local ? 0 : (uint64_t)mine.nrounds, (uint64_t)local};
  reshard_result_t r = reduce(plan, a, 2);
  if (r || a[1]) {
    rs_cost_rank_free(&mine);
    if (r) return r;
    if (local) return rs_error(local, "%s", msg);
    return rs_error(RESHARD_ERROR_REMOTE, "plan_estimate rank %d: another rank failed with '%s'", me,
                    reshard_result_string((reshard_result_t)a[1]));
  }
  const int n = (int)a[0];
  const size_t nn = (size_t)plan->map.nnodes;
  const size_t off_node = (size_t)n * RS_NLINKS, off_bytes = off_node + (node ? (size_t)n * (size_t)N : 0);
  const size_t len = off_bytes + (size_t)N;
  uint64_t *v = calloc(len + 1, sizeof *v), *sums = calloc((node ? (size_t)n * nn : 0) + 1, sizeof *sums);
  uint64_t *dur = calloc((size_t)n + 1, sizeof *dur), *lat = calloc((size_t)n + 1, sizeof *lat);
  uint64_t *key = calloc((size_t)n + 1, sizeof *key);
  int *kind = calloc((size_t)n + 1, sizeof *kind);
  int32_t *where = calloc((size_t)n + 1, sizeof *where);
  uint64_t bad = !v || !sums || !dur || !lat || !key || !kind || !where;
  r = reduce(plan, &bad, 1);
  if (!r && bad)
    r = rs_error(RESHARD_ERROR_OUT_OF_MEMORY, "plan_estimate rank %d: out of memory (here or on another rank) for %d rounds",
                 me, n);
  if (r) goto done;

  memcpy(v, mine.ps, (size_t)mine.nrounds * RS_NLINKS * sizeof *v);
  if (node)
    for (int k = 0; k < mine.nrounds; k++) v[off_node + (size_t)k * (size_t)N + (size_t)me] = mine.node_bytes[k];
  v[off_bytes + (size_t)me] = mine.bytes;
  if ((r = reduce(plan, v, len))) goto done;
  uint64_t bytes = 0;
  for (int q = 0; q < N; q++) bytes += v[off_bytes + (size_t)q];
  if (node)
    for (int k = 0; k < n; k++)
      for (int q = 0; q < N; q++) sums[(size_t)k * nn + (size_t)plan->map.node[q]] += v[off_node + (size_t)k * (size_t)N + (size_t)q];
  rs_cost_round_bounds(&plan->topo, (int)nn, n, v, node ? sums : NULL, kind, dur, where);

  /* the lowest rank on each round's bounding link, then its latency */
  for (int k = 0; k < n; k++) {
    int l = kind[k];
    key[k] = l >= 0 && l < RS_NLINKS && k < mine.nrounds && mine.ps[(size_t)k * RS_NLINKS + (size_t)l] == dur[k]
                 ? (uint64_t)(N - me)
                 : 0;
  }
  if ((r = reduce(plan, key, (size_t)n))) goto done;
  for (int k = 0; k < n; k++) {
    int l = kind[k];
    if (l < 0 || l >= RS_NLINKS) continue;
    where[k] = key[k] ? (int32_t)(N - (int)key[k]) : -1;
    lat[k] = where[k] == me ? mine.lat_ps[(size_t)k * RS_NLINKS + (size_t)l] : 0;
  }
  if ((r = reduce(plan, lat, (size_t)n))) goto done;
  rs_cost_assemble(n, kind, dur, where, lat, bytes, out);
done:
  free(v);
  free(sums);
  free(dur);
  free(lat);
  free(key);
  free(kind);
  free(where);
  rs_cost_rank_free(&mine);
  return r;
}

reshard_result_t reshard_plan_estimate(const reshard_plan_t *plan, reshard_estimate_t *out) {
  rs_error_clear();
  if (!plan) return rs_error(RESHARD_ERROR_INVALID_ARGUMENT, "plan_estimate: plan is NULL");
  RS_CHECK(rs_estimate_check(out, "plan_estimate"));
  RS_CHECK(rs_plan_current(plan, "plan_estimate"));
  reshard_estimate_t e;
  RS_CHECK(estimate_one(plan, &e));
  if (plan->spread && plan->spread->pre) {
    /* source-side spreading: the pre-plan's copies run first, then the
     * main plan (src/api/stages.c); the bound named stays the main
     * plan's */
    reshard_estimate_t p;
    reshard_result_t r = estimate_one(plan->spread->pre, &p);
    if (r) {
      rs_error_prefix("(the spreading pre-plan) ");
      return r;
    }
    rs_cost_add_before(&e, &p);
  }
  if (plan->quant && plan->quant->pre) {
    /* fp8 quantization: the blocks split across source ranks are
     * gathered before anything else runs (src/api/stages.c) */
    reshard_estimate_t p;
    reshard_result_t r = estimate_one(plan->quant->pre, &p);
    if (r) {
      rs_error_prefix("(the fp8 gathering pre-plan) ");
      return r;
    }
    rs_cost_add_before(&e, &p);
  }
  rs_estimate_store(out, &e);
  return RESHARD_SUCCESS;
}
