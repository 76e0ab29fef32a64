/* The machine a plan runs on: how ranks group into nodes and NVLink
 * domains, and the bandwidth and latency of their links.
 *
 * Used by replica choice (prefer a holder in the receiver's domain), by
 * relay plans (a byte enters each destination domain once) and by the cost
 * model. Each GPU has its own NVLink port and its own share of the node's
 * NICs, so every link the model knows is per rank and per direction.
 *
 * Placement follows the published setups: the source side's ranks, in
 * increasing order, fill nodes and domains from the first; the ranks only
 * on the destination side start on a fresh node and domain. A colocated
 * rank (on both sides) stays where the source side put it. */
#ifndef RS_PLAN_TOPOLOGY_H
#define RS_PLAN_TOPOLOGY_H

#include <stdint.h>

#include "layout/layout.h"
#include "reshard.h"

typedef struct rs_topology {
  char name[32];
  int ranks_per_node;  /* GPUs (ranks) per node */
  int domain_size;     /* ranks per NVLink domain, physically */
  int domain_used;     /* ranks of each domain one side fills (<= size) */
  double nvlink_bw;    /* bytes/s per rank per direction, inside a domain */
  double nic_bw;       /* bytes/s per NIC per direction */
  int nics_per_node;
  /* A round's latency on a link that carries any message in it: messages
   * posted together are in flight together, so they wait it out once. */
  double net_latency_s;    /* over the network */
  double nvlink_latency_s; /* inside a domain */
  /* Each message's own cost on its link, paid one after another: the
   * posting rank issues its messages in turn. */
  double net_msg_s;
  double nvlink_msg_s;
  /* Memory bandwidth a node's ranks share when they copy (bytes/s, read +
   * write counted once), or 0 for no shared limit: the cpu preset, where
   * every "link" is a memory copy. */
  double node_copy_bw;
} rs_topology;

/* Fills *t from a preset name: "h100-8x400g", "gb200-nvl72", "flat", "cpu".
 * Unknown names are RESHARD_ERROR_INVALID_ARGUMENT, listing the presets. */
reshard_result_t rs_topology_preset(const char *name, rs_topology *t);

/* The presets, comma-separated, for messages and --help. */
const char *rs_topology_preset_names(void);

/* The topology in force for plan options: RESHARD_TOPOLOGY, else
 * options->topology; NULL, "" and "none" mean none (*has = 0). */
reshard_result_t rs_topology_resolve(const reshard_options_t *options,
                                     rs_topology *t, int *has);

/* NIC bandwidth available to one rank, per direction. */
double rs_topology_rank_nic_bw(const rs_topology *t);

/* How many times smaller than the chunk a plan cuts the messages of
 * streams inside one NVLink domain: floor(NVLink / (2 x a rank's NIC
 * share)), within 1 .. 8 (4 on h100-8x400g, 8 on gb200-nvl72; 1 without a
 * network, as on the cpu preset). Such a message still takes at most half
 * the link time of a network chunk, and the staging it frees goes to the
 * network streams: relay forwards inside a domain otherwise shrink the
 * chunk of every stream. */
int rs_topology_domain_chunk_div(const rs_topology *t);

/* Where every rank of the communicator sits. */
typedef struct rs_rank_map {
  int nranks;
  int32_t *node;   /* nranks entries */
  int32_t *domain; /* nranks entries */
  int nnodes, ndomains;
} rs_rank_map;

/* Places the nranks ranks of the communicator as described above. Ranks
 * on neither side are placed after the destination side. */
reshard_result_t rs_rank_map_build(const rs_topology *t,
                                   const reshard_layout_t *src,
                                   const reshard_layout_t *dst, int nranks,
                                   rs_rank_map *out);
void rs_rank_map_free(rs_rank_map *m);

#endif
