#include "plan/topology.h"

#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"
#include "common/error.h"
#include "common/params.h"

/* Published figures: NVLink per GPU per direction; one 400 Gb/s NIC per
 * GPU; latencies of RDMA and NVLink transfers (5 and 2 us), paid once a
 * round. Each message's own cost (1 us on the network: its work request,
 * proxy step and completion; 0.5 us inside a domain) is an assumption not
 * yet measured on GPUs: the fluid simulation (scripts/simulate.sh) charges
 * none, and charging the whole latency per message, as the model did
 * before, made it 18% pessimistic there (docs/PERFORMANCE.md). The cpu preset
 * describes this project's CI machine (one host, ranks copying through
 * shared memory) and is calibrated against reshard_perf runs there (see
 * docs/PERFORMANCE.md). */
static const rs_topology presets[] = {
    {"h100-8x400g", 8, 8, 8, 450e9, 50e9, 8, 5e-6, 2e-6, 1e-6, 0.5e-6, 0},
    {"gb200-nvl72", 4, 72, 64, 900e9, 50e9, 4, 5e-6, 2e-6, 1e-6, 0.5e-6, 0},
    /* a network without NVLink domains: every rank its own node behind
     * one 400 Gb/s NIC (the presets' per-GPU share), the same latencies;
     * its NVLink figure only prices a colocated rank's local copies */
    {"flat", 1, 1, 1, 450e9, 50e9, 1, 5e-6, 2e-6, 1e-6, 0.5e-6, 0},
    /* one host: every rank in one node and domain (domain_used 0);
     * calibrated on the 2-core CI VM, quiet, by scripts/validate_cost.sh
     * calibrate (per-rank copy 5.4 GB/s, shared 7.0 GB/s, 1.6 us per
     * message: medians of 3 calibration runs, see docs/PERFORMANCE.md);
     * a process copies its messages one after another, so the 1.6 us is
     * each message's own cost and there is no latency once a round */
    {"cpu", 0, 0, 0, 5.4e9, 0, 0, 0, 0, 1.6e-6, 1.6e-6, 7.0e9},
};

const char *rs_topology_preset_names(void) { return "h100-8x400g, gb200-nvl72, flat, cpu"; }

reshard_result_t rs_topology_preset(const char *name, rs_topology *t) {
  for (size_t i = 0; i < sizeof presets / sizeof *presets; i++)
    if (name && !strcmp(name, presets[i].name)) {
      *t = presets[i];
      return RESHARD_SUCCESS;
    }
  return rs_error(RESHARD_ERROR_INVALID_ARGUMENT, "options: topology '%s' is not a preset (known: %s, or none)",
                  name ? name : "(null)", rs_topology_preset_names());
}

reshard_result_t rs_topology_resolve(const reshard_options_t *options,
                                     rs_topology *t, int *has) {
  const char *name = rs_param_get_string(RS_PARAM_TOPOLOGY);
  if (!name) name = options ? options->topology : NULL;
  *has = 0;
  memset(t, 0, sizeof *t);
  if (!name || !*name || !strcmp(name, "none")) return RESHARD_SUCCESS;
  RS_CHECK(rs_topology_preset(name, t));
  *has = 1;
  return RESHARD_SUCCESS;
}

double rs_topology_rank_nic_bw(const rs_topology *t) {
  if (t->ranks_per_node <= 0 || t->nics_per_node <= 0) return 0;
  return t->nic_bw * t->nics_per_node / t->ranks_per_node;
}

int rs_topology_domain_chunk_div(const rs_topology *t) {
  double nic = rs_topology_rank_nic_bw(t);
  if (!(nic > 0) || !(t->nvlink_bw > 0)) return 1;
  double k = t->nvlink_bw / (2 * nic);
  return k >= 8 ? 8 : k < 1 ? 1 : (int)k;
}

/* Marks the ranks a side's meshes (those some part uses) and raw buffers
 * name. */
static reshard_result_t mark_side(const reshard_layout_t *L, int nranks, unsigned char *on) {
  /* each mesh once: a model's thousands of parts share a few meshes */
  unsigned char *used = rs_calloc((size_t)L->nmeshes + 1, 1);
  if (!used) return rs_error(RESHARD_ERROR_OUT_OF_MEMORY, "plan_create: out of memory (rank map)");
  for (int i = 0; i < L->nparts; i++) used[L->parts[i].mesh] = 1;
  for (int i = 0; i < L->nmeshes; i++) {
    const rs_mesh *m = &L->meshes[i];
    for (int k = 0; used[i] && k < m->size; k++)
      if (m->ranks[k] >= 0 && m->ranks[k] < nranks) on[m->ranks[k]] = 1;
  }
  free(used);
  for (int b = 0; b < L->nbuffers; b++)
    if (L->buffers[b].kind == RS_BUFFER_RAW && L->buffers[b].raw_rank >= 0 && L->buffers[b].raw_rank < nranks)
      on[L->buffers[b].raw_rank] = 1;
  return RESHARD_SUCCESS;
}

void rs_rank_map_free(rs_rank_map *m) {
  if (!m) return;
  free(m->node);
  free(m->domain);
  memset(m, 0, sizeof *m);
}

reshard_result_t rs_rank_map_build(const rs_topology *t,
                                   const reshard_layout_t *src,
                                   const reshard_layout_t *dst, int nranks,
                                   rs_rank_map *out) {
  memset(out, 0, sizeof *out);
  size_t n = nranks > 0 ? (size_t)nranks : 1;
  out->node = rs_calloc(n, sizeof *out->node);
  out->domain = rs_calloc(n, sizeof *out->domain);
  unsigned char *side = rs_calloc(n, 1);
  if (!out->node || !out->domain || !side) {
    free(side);
    rs_rank_map_free(out);
    return rs_error(RESHARD_ERROR_OUT_OF_MEMORY, "plan_create: out of memory (rank map of %d ranks)", nranks);
  }
  out->nranks = nranks;
  if (t->domain_used <= 0 || t->ranks_per_node <= 0) { /* one host */
    out->nnodes = out->ndomains = 1;
    free(side);
    return RESHARD_SUCCESS;
  }
  /* side[r]: 1 source (colocated included), 2 destination only, 0 neither */
  unsigned char *on = rs_calloc(n, 1);
  if (!on) {
    free(side);
    rs_rank_map_free(out);
    return rs_error(RESHARD_ERROR_OUT_OF_MEMORY, "plan_create: out of memory (rank map of %d ranks)", nranks);
  }
  reshard_result_t r0 = mark_side(src, nranks, on);
  for (int r = 0; r < nranks; r++) side[r] = on[r] ? 1 : 0;
  memset(on, 0, n);
  if (!r0) r0 = mark_side(dst, nranks, on);
  if (r0) {
    free(on);
    free(side);
    rs_rank_map_free(out);
    return r0;
  }
  for (int r = 0; r < nranks; r++)
    if (!side[r] && on[r]) side[r] = 2;
  free(on);
  int nodes_per_domain = (t->domain_used + t->ranks_per_node - 1) / t->ranks_per_node;
  int domain0 = 0, node0 = 0;
  static const unsigned char order[3] = {1, 2, 0};
  for (int g = 0; g < 3; g++) {
    int i = 0;
    for (int r = 0; r < nranks; r++) {
      if (side[r] != order[g]) continue;
      int d = i / t->domain_used, within = i % t->domain_used;
      out->domain[r] = domain0 + d;
      out->node[r] = node0 + d * nodes_per_domain + within / t->ranks_per_node;
      i++;
    }
    if (i) { /* the next group starts on a fresh domain and node */
      int doms = (i + t->domain_used - 1) / t->domain_used;
      domain0 += doms;
      node0 += doms * nodes_per_domain;
    }
  }
  out->ndomains = domain0;
  out->nnodes = node0;
  free(side);
  return RESHARD_SUCCESS;
}
