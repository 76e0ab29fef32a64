/* The cost model of cost.h: each rank's share, and the global sum of the
 * rounds. */
#include "plan/cost.h"

#include <stdlib.h>
#include <string.h>

#include "common/error.h"
#include "pack/copy.h"

uint64_t rs_cost_ps(double seconds) {
  if (!(seconds > 0)) return 0;
  double ps = seconds * 1e12 + 0.5;
  return ps >= 1.8e19 ? UINT64_MAX : (uint64_t)ps;
}

static double link_bw(const rs_topology *t, int link) {
  if (link == RS_LINK_NIC_OUT || link == RS_LINK_NIC_IN) return rs_topology_rank_nic_bw(t);
  return t->nvlink_bw; /* NVLink both ways, and local copies */
}

/* A link's latency in a round that uses it, and each message's own cost. */
static double link_latency(const rs_topology *t, int link) {
  if (link == RS_LINK_NIC_OUT || link == RS_LINK_NIC_IN) return t->net_latency_s;
  if (link == RS_LINK_COPY) return 0;
  return t->nvlink_latency_s;
}

static double link_msg(const rs_topology *t, int link) {
  if (link == RS_LINK_NIC_OUT || link == RS_LINK_NIC_IN) return t->net_msg_s;
  if (link == RS_LINK_COPY) return 0;
  return t->nvlink_msg_s;
}

void rs_cost_rank_free(rs_cost_rank *c) {
  if (!c) return;
  free(c->ps);
  free(c->lat_ps);
  free(c->node_bytes);
  memset(c, 0, sizeof *c);
}

reshard_result_t rs_cost_rank_compute(const reshard_plan_t *plan, rs_cost_rank *out) {
  memset(out, 0, sizeof *out);
  if (!plan->has_topo)
    return rs_error(RESHARD_ERROR_INVALID_USAGE, "plan_estimate rank %d: the plan has no topology (set options.topology or RESHARD_TOPOLOGY)",
                    plan->rank);
  const rs_topology *t = &plan->topo;
  const int me = plan->rank;
  int nrounds = plan->nrounds;
  if (plan->nlocal_copies && nrounds < 1) nrounds = 1;
  size_t n = (size_t)nrounds * RS_NLINKS;
  uint64_t *bytes = calloc(n + 1, sizeof *bytes), *msgs = calloc(n + 1, sizeof *msgs);
  out->ps = calloc(n + 1, sizeof *out->ps);
  out->lat_ps = calloc(n + 1, sizeof *out->lat_ps);
  if (t->node_copy_bw > 0) out->node_bytes = calloc((size_t)nrounds + 1, sizeof *out->node_bytes);
  if (!bytes || !msgs || !out->ps || !out->lat_ps || (t->node_copy_bw > 0 && !out->node_bytes)) {
    free(bytes);
    free(msgs);
    rs_cost_rank_free(out);
    return rs_error(RESHARD_ERROR_OUT_OF_MEMORY, "plan_estimate rank %d: out of memory (%d rounds)", me, nrounds);
  }
  out->rank = me;
  out->nrounds = nrounds;
  for (int dir = 0; dir < 2; dir++) {
    const rs_msg *m = dir ? plan->recvs : plan->sends;
    size_t nm = dir ? plan->nrecvs : plan->nsends;
    for (size_t i = 0; i < nm; i++) {
      int same = plan->map.domain[m[i].peer] == plan->map.domain[me];
      int link = same ? (dir ? RS_LINK_NVL_IN : RS_LINK_NVL_OUT) : (dir ? RS_LINK_NIC_IN : RS_LINK_NIC_OUT);
      size_t k = (size_t)m[i].round * RS_NLINKS + (size_t)link;
      bytes[k] += m[i].bytes;
      msgs[k]++;
      if (dir && out->node_bytes) out->node_bytes[m[i].round] += m[i].bytes;
      if (!dir) out->bytes += m[i].bytes;
    }
  }
  for (size_t i = 0; i < plan->nlocal_copies; i++) {
    uint64_t b = rs_copy_bytes(&plan->local_copies[i]);
    bytes[RS_LINK_COPY] += b;
    out->bytes += b;
    if (out->node_bytes) out->node_bytes[0] += b;
  }
  reshard_result_t r = RESHARD_SUCCESS;
  for (size_t k = 0; k < n; k++) {
    if (!bytes[k] && !msgs[k]) continue;
    int link = (int)(k % RS_NLINKS);
    double bw = link_bw(t, link);
    if (!(bw > 0)) {
      r = rs_error(RESHARD_ERROR_INVALID_USAGE, "plan_estimate rank %d: topology '%s' has no %s link, but round %zu uses one",
                   me, t->name, link <= RS_LINK_NIC_IN ? "network" : "domain", k / RS_NLINKS);
      break;
    }
    double lat = msgs[k] ? link_latency(t, link) + (double)msgs[k] * link_msg(t, link) : 0;
    out->ps[k] = rs_cost_ps((double)bytes[k] / bw + lat);
    out->lat_ps[k] = rs_cost_ps(lat);
  }
  free(bytes);
  free(msgs);
  if (r) rs_cost_rank_free(out);
  return r;
}

void rs_cost_acc_init(rs_cost_acc *acc, const rs_topology *topo, const rs_rank_map *map, int nranks) {
  memset(acc, 0, sizeof *acc);
  acc->topo = *topo;
  acc->map = map;
  acc->nranks = nranks;
}

void rs_cost_acc_free(rs_cost_acc *acc) {
  free(acc->max_ps);
  free(acc->where);
  free(acc->where_lat);
  free(acc->node_bytes);
  memset(acc, 0, sizeof *acc);
}

static reshard_result_t acc_grow(rs_cost_acc *acc, int nrounds) {
  if (nrounds <= acc->cap_rounds) {
    if (nrounds > acc->nrounds) acc->nrounds = nrounds;
    return RESHARD_SUCCESS;
  }
  int cap = acc->cap_rounds ? acc->cap_rounds : 16;
  while (cap < nrounds) cap *= 2;
  size_t nn = acc->map->nnodes > 0 ? (size_t)acc->map->nnodes : 1;
  size_t old = (size_t)acc->cap_rounds, nw = (size_t)cap;
  uint64_t *a = realloc(acc->max_ps, nw * RS_NLINKS * sizeof *a);
  if (a) acc->max_ps = a;
  int32_t *w = realloc(acc->where, nw * RS_NLINKS * sizeof *w);
  if (w) acc->where = w;
  uint64_t *l = realloc(acc->where_lat, nw * RS_NLINKS * sizeof *l);
  if (l) acc->where_lat = l;
  uint64_t *nb = realloc(acc->node_bytes, nw * nn * sizeof *nb);
  if (nb) acc->node_bytes = nb;
  if (!a || !w || !l || !nb) return rs_error(RESHARD_ERROR_OUT_OF_MEMORY, "cost model: out of memory (%d rounds)", nrounds);
  memset(acc->max_ps + old * RS_NLINKS, 0, (nw - old) * RS_NLINKS * sizeof *a);
  memset(acc->where_lat + old * RS_NLINKS, 0, (nw - old) * RS_NLINKS * sizeof *l);
  for (size_t i = old * RS_NLINKS; i < nw * RS_NLINKS; i++) acc->where[i] = -1;
  memset(acc->node_bytes + old * nn, 0, (nw - old) * nn * sizeof *nb);
  acc->cap_rounds = cap;
  if (nrounds > acc->nrounds) acc->nrounds = nrounds;
  return RESHARD_SUCCESS;
}

reshard_result_t rs_cost_acc_add(rs_cost_acc *acc, const rs_cost_rank *c) {
  RS_CHECK(acc_grow(acc, c->nrounds));
  for (size_t k = 0; k < (size_t)c->nrounds * RS_NLINKS; k++) {
    if (!c->ps[k]) continue;
    if (c->ps[k] > acc->max_ps[k] || (c->ps[k] == acc->max_ps[k] && (acc->where[k] < 0 || c->rank < acc->where[k]))) {
      acc->max_ps[k] = c->ps[k];
      acc->where[k] = c->rank;
      acc->where_lat[k] = c->lat_ps[k];
    }
  }
  if (c->node_bytes) {
    size_t nn = (size_t)acc->map->nnodes;
    int node = acc->map->node[c->rank];
    for (int k = 0; k < c->nrounds; k++) acc->node_bytes[(size_t)k * nn + (size_t)node] += c->node_bytes[k];
  }
  acc->bytes += c->bytes;
  return RESHARD_SUCCESS;
}

void rs_cost_round_bounds(const rs_topology *topo, int nnodes, int nrounds, const uint64_t *max_ps,
                          const uint64_t *node_bytes, int *kind, uint64_t *dur, int32_t *node_where) {
  for (int k = 0; k < nrounds; k++) {
    int best = -1;
    uint64_t d = 0;
    for (int l = 0; l < RS_NLINKS; l++)
      if (max_ps[(size_t)k * RS_NLINKS + (size_t)l] > d) {
        d = max_ps[(size_t)k * RS_NLINKS + (size_t)l];
        best = l;
      }
    node_where[k] = -1;
    if (topo->node_copy_bw > 0 && node_bytes) {
      for (int n = 0; n < nnodes; n++) {
        uint64_t ps = rs_cost_ps((double)node_bytes[(size_t)k * (size_t)nnodes + (size_t)n] / topo->node_copy_bw);
        if (ps > d) {
          d = ps;
          best = RS_NLINKS;
          node_where[k] = n;
        }
      }
    }
    kind[k] = best;
    dur[k] = d;
  }
}

void rs_cost_assemble(int nrounds, const int *kind, const uint64_t *dur, const int32_t *where, const uint64_t *lat,
                      uint64_t bytes, reshard_estimate_t *out) {
  reshard_estimate_t e = RESHARD_ESTIMATE_INITIALIZER;
  uint64_t total = 0, lat_total = 0, longest = 0;
  uint64_t per_kind[RS_NLINKS + 1] = {0};
  for (int k = 0; k < nrounds; k++) {
    if (kind[k] < 0) continue;
    total += dur[k];
    per_kind[kind[k]] += dur[k];
    if (kind[k] < RS_NLINKS) lat_total += lat[k];
    if (dur[k] > longest) {
      longest = dur[k];
      e.bound = (reshard_bound_t)(kind[k] + 1); /* RS_LINK_* + 1; RS_NLINKS + 1 is NODE_MEMORY */
      e.bound_where = where[k];
    }
  }
  e.seconds = (double)total * 1e-12;
  for (int l = 0; l <= RS_NLINKS; l++) e.bound_seconds[l + 1] = (double)per_kind[l] * 1e-12;
  e.latency_seconds = (double)lat_total * 1e-12;
  e.num_rounds = nrounds;
  e.bytes = bytes;
  *out = e;
}

void rs_cost_acc_finish(const rs_cost_acc *acc, reshard_estimate_t *out) {
  int n = acc->nrounds;
  size_t m = (size_t)n + 1;
  int *kind = malloc(m * sizeof *kind);
  uint64_t *dur = malloc(m * sizeof *dur), *lat = malloc(m * sizeof *lat);
  int32_t *where = malloc(m * sizeof *where);
  if (!kind || !dur || !lat || !where) {
    /* too small to fail in practice; report nothing rather than garbage */
    reshard_estimate_t e = RESHARD_ESTIMATE_INITIALIZER;
    e.seconds = -1;
    *out = e;
  } else {
    rs_cost_round_bounds(&acc->topo, acc->map->nnodes, n, acc->max_ps, acc->node_bytes, kind, dur, where);
    for (int k = 0; k < n; k++) {
      lat[k] = 0;
      if (kind[k] >= 0 && kind[k] < RS_NLINKS) {
        where[k] = acc->where[(size_t)k * RS_NLINKS + (size_t)kind[k]];
        lat[k] = acc->where_lat[(size_t)k * RS_NLINKS + (size_t)kind[k]];
      }
    }
    rs_cost_assemble(n, kind, dur, where, lat, acc->bytes, out);
  }
  free(kind);
  free(dur);
  free(lat);
  free(where);
}

static size_t estimate_size_of_version(uint32_t version) {
  return version == 1 ? sizeof(reshard_estimate_t) : 0;
}

reshard_result_t rs_estimate_check(const reshard_estimate_t *out, const char *what) {
  if (!out) return rs_error(RESHARD_ERROR_INVALID_ARGUMENT, "%s: out is NULL", what);
  if (out->version < 1 || out->version > RESHARD_ESTIMATE_VERSION || out->struct_size != estimate_size_of_version(out->version))
    return rs_error(RESHARD_ERROR_INVALID_ARGUMENT,
                    "%s: out->version %u / struct_size %u unknown (library has version %d, size %zu); start from "
                    "RESHARD_ESTIMATE_INITIALIZER",
                    what, out->version, out->struct_size, RESHARD_ESTIMATE_VERSION, sizeof(reshard_estimate_t));
  return RESHARD_SUCCESS;
}

void rs_estimate_store(reshard_estimate_t *out, const reshard_estimate_t *full) {
  uint32_t size = out->struct_size, version = out->version;
  memcpy(out, full, size);
  out->struct_size = size;
  out->version = version;
}

const char *reshard_bound_name(reshard_bound_t b) {
  static const char *names[RESHARD_NUM_BOUNDS] = {"none",          "nic-egress",      "nic-ingress",  "nvlink-egress",
                                                  "nvlink-ingress", "local-copy",      "node-memory",  "source-egress",
                                                  "domain-ingress", "rank-ingress",    "sole-holder"};
  return (int)b >= 0 && b < RESHARD_NUM_BOUNDS ? names[b] : "invalid";
}

void rs_cost_add_before(reshard_estimate_t *into, const reshard_estimate_t *first) {
  into->seconds += first->seconds;
  for (int k = 0; k < RESHARD_NUM_BOUNDS; k++) into->bound_seconds[k] += first->bound_seconds[k];
  into->latency_seconds += first->latency_seconds;
  into->num_rounds += first->num_rounds;
  into->bytes += first->bytes;
}
