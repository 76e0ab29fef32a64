/* The cost section of reshard_plan --topology (cost_report.h). */
#include "cost_report.h"

#include <math.h>
#include <string.h>

#include "reshard_internal.h"
#include "plan_cost.h"

static double maxd(double a, double b) { return a > b ? a : b; }

/* Gather then broadcast, priced on the topology:
 *   gather   the root (the lowest source rank) receives every byte it
 *            lacks: from source ranks of its own domain over its NVLink,
 *            the rest over its NIC, both at once; on the cpu preset also
 *            bounded by the host's memory bandwidth;
 *   chain    root -> each destination rank in rank order (consecutive
 *            ranks share a domain, so only domain changes cross a NIC),
 *            pipelined in chunks of c bytes: B / (slowest hop) + the sum
 *            over hops of (latency + c / hop bandwidth), the fill and
 *            drain of the pipe; on the cpu preset at least hops x B /
 *            the host's memory bandwidth (each hop is one copy of B).
 * B counts every element some destination rank holds, once: each
 * destination receives the whole model and keeps its part. */
static double gather_broadcast(const rs_volume *v, const cli_layouts *L, double *gather_s, double *chain_s, int *hops_out) {
  const rs_topology *t = &v->topo;
  const double nic = rs_topology_rank_nic_bw(t), nvl = t->nvlink_bw, B = (double)v->total;
  double g = 0;
  uint64_t by_nvl = v->root_domain_holds - v->root_holds, by_net = v->total - v->root_domain_holds;
  if (by_nvl) g = maxd(g, (double)by_nvl / nvl);
  if (by_net) g = maxd(g, nic > 0 ? (double)by_net / nic : INFINITY);
  if (t->node_copy_bw > 0) g = maxd(g, (double)(v->total - v->root_holds) / t->node_copy_bw);
  int prev = v->root, hops = 0;
  double slowest = INFINITY, fill = 0, c = B < CR_CHAIN_CHUNK_BYTES ? B : CR_CHAIN_CHUNK_BYTES;
  for (int r = L->first_dst; r < L->first_dst + L->ndst; r++) {
    if (r == v->root) continue;
    int same = v->map.domain[prev] == v->map.domain[r];
    double bw = same ? nvl : nic, lat = same ? t->nvlink_latency_s + t->nvlink_msg_s : t->net_latency_s + t->net_msg_s;
    if (!(bw > 0)) bw = 0;
    slowest = bw < slowest ? bw : slowest;
    fill += lat + (bw > 0 ? c / bw : INFINITY);
    hops++;
    prev = r;
  }
  double ch = hops ? (slowest > 0 ? B / slowest : INFINITY) + fill : 0;
  if (t->node_copy_bw > 0) ch = maxd(ch, hops * B / t->node_copy_bw);
  *gather_s = g;
  *chain_s = ch;
  *hops_out = hops;
  return g + ch;
}

static void print_estimate(FILE *out, const char *what, const reshard_estimate_t *e) {
  fprintf(out, "# %s: predicted %.6g s over %d rounds, longest round bound by %s", what, e->seconds, e->num_rounds,
          reshard_bound_name(e->bound));
  if (e->bound_where >= 0) fprintf(out, " (%s %d)", e->bound == RESHARD_BOUND_NODE_MEMORY ? "node" : "rank", e->bound_where);
  fprintf(out, "; %.3f GiB moved; time bound by:", (double)e->bytes / 1073741824.0);
  for (int k = RESHARD_BOUND_NIC_EGRESS; k <= RESHARD_BOUND_NODE_MEMORY; k++)
    if (e->bound_seconds[k] > 0) fprintf(out, " %s %.4g s", reshard_bound_name((reshard_bound_t)k), e->bound_seconds[k]);
  fprintf(out, " (latency %.4g s)\n", e->latency_seconds);
}

static double ratio(double x, double lower) { return lower > 0 ? x / lower : INFINITY; }

int cr_report(const cli_layouts *L, int world, const reshard_options_t *opts, const reshard_estimate_t *ours,
              const reshard_estimate_t *balanced, FILE *out, cr_figures *fig) {
  rs_topology t;
  int has = 0;
  if (rs_topology_resolve(opts, &t, &has) || !has) {
    fprintf(stderr, "reshard_plan: error: no topology: %s\n", reshard_last_error());
    return -1;
  }
  rs_volume v;
  reshard_result_t r = rs_volume_compute(L->src, L->dst, world, &t, &v);
  if (r) {
    fprintf(stderr, "reshard_plan: error: T_lower: %s: %s\n", reshard_result_string(r), reshard_last_error());
    return -1;
  }
  reshard_estimate_t lb;
  rs_lower_bound_of(&v, &lb);
  double gather, chain;
  int hops;
  double gb = gather_broadcast(&v, L, &gather, &chain, &hops);

  reshard_estimate_t base[2];
  static const char *names[2] = {"replica0-direct", "balanced-direct"};
  for (int i = 0; i < 2; i++) {
    reshard_options_t o = *opts;
    o.relay = 0;
    if (i == 0) o.flags |= RESHARD_FLAG_FIRST_REPLICA;
    base[i] = (reshard_estimate_t)RESHARD_ESTIMATE_INITIALIZER;
    if (i == 1 && balanced) {
      base[i] = *balanced;
      continue;
    }
    r = pc_estimate_global(L->src, L->dst, world, &o, &base[i], NULL);
    if (r) {
      fprintf(stderr, "reshard_plan: error: baseline %s: %s: %s\n", names[i], reshard_result_string(r), reshard_last_error());
      rs_volume_free(&v);
      return -1;
    }
  }

  fprintf(out, "# cost model on %s: %d ranks per node, %d per NVLink domain (%d used), NIC %.3g GB/s and NVLink %.3g GB/s "
               "per rank and direction, latency %.3g/%.3g us a round and %.3g/%.3g us a message (network/domain)",
          t.name, t.ranks_per_node, t.domain_size, t.domain_used, rs_topology_rank_nic_bw(&t) / 1e9, t.nvlink_bw / 1e9,
          t.net_latency_s * 1e6, t.nvlink_latency_s * 1e6, t.net_msg_s * 1e6, t.nvlink_msg_s * 1e6);
  if (t.node_copy_bw > 0) fprintf(out, ", host memory %.3g GB/s shared", t.node_copy_bw / 1e9);
  fprintf(out, "; %d nodes, %d domains\n", v.map.nnodes, v.map.ndomains);
  fprintf(out, "# T_lower: %.6g s, bound by %s", lb.seconds, reshard_bound_name(lb.bound));
  if (lb.bound_where >= 0)
    fprintf(out, " (%s %d)", lb.bound == RESHARD_BOUND_DOMAIN_INGRESS ? "domain" : lb.bound == RESHARD_BOUND_NODE_MEMORY ? "node" : "rank",
            lb.bound_where);
  fprintf(out, "; U = %.3f GiB (%.3f GiB over the network), model %.3f GiB; terms:", (double)v.unique / 1073741824.0,
          (double)v.unique_net / 1073741824.0, (double)v.total / 1073741824.0);
  for (int k = RESHARD_BOUND_NODE_MEMORY; k < RESHARD_NUM_BOUNDS; k++)
    if (lb.bound_seconds[k] > 0) fprintf(out, " %s %.4g s", reshard_bound_name((reshard_bound_t)k), lb.bound_seconds[k]);
  fprintf(out, "\n");
  int cut_where;
  double cut = rs_volume_domain_cut(&v, &cut_where);
  if (cut_where >= 0)
    fprintf(out, "# source-domain cut (not in T_lower): %.6g s = %.3f x T_lower, domain %d: %.3f GiB only its sources hold leave "
                 "through its %d NICs; no plan is faster\n",
            cut, ratio(cut, lb.seconds), cut_where, (double)v.domain_out[cut_where] / 1073741824.0, v.domain_ranks[cut_where]);
  char what[64];
  snprintf(what, sizeof what, "plan (relay %d)", opts->relay);
  print_estimate(out, what, ours);
  fprintf(out, "# baseline gather-broadcast: gather to rank %d %.6g s + chain broadcast to %d ranks %.6g s (%.3f GiB each, "
               "chunks of %.0f MiB)\n",
          v.root, gather, hops, chain, (double)v.total / 1073741824.0, CR_CHAIN_CHUNK_BYTES / 1048576.0);
  for (int i = 0; i < 2; i++) {
    snprintf(what, sizeof what, "baseline %s", names[i]);
    print_estimate(out, what, &base[i]);
  }
  fprintf(out, "# reshard_plan: predicted_s=%.6g lower_s=%.6g ratio=%.3f\n", ours->seconds, lb.seconds, ratio(ours->seconds, lb.seconds));
  fprintf(out, "# baseline gather-broadcast: predicted_s=%.6g ratio=%.3f\n", gb, ratio(gb, lb.seconds));
  for (int i = 0; i < 2; i++)
    fprintf(out, "# baseline %s: predicted_s=%.6g ratio=%.3f\n", names[i], base[i].seconds, ratio(base[i].seconds, lb.seconds));
  if (fig) {
    fig->lower = lb;
    fig->gather_broadcast_s = gb;
    fig->replica0 = base[0];
    fig->balanced = base[1];
    fig->nnodes = v.map.nnodes;
    fig->ndomains = v.map.ndomains;
  }
  rs_volume_free(&v);
  return 0;
}
