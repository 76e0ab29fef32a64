/* The cost model: the predicted time of a plan on a topology.
 *
 * Round-synchronous fluid model. Every message of round k starts with the
 * round and shares its links with the others fairly; when all flows of a
 * round start together, max-min fair sharing finishes the round when its
 * most loaded link has drained, so round k lasts
 *
 *   max over ranks r and links l of r:  bytes(r, l, k) / bw(l)
 *                                       + latency(l)
 *                                       + messages(r, l, k) x msg(l)
 *
 * with, per rank, four links: NIC egress and ingress (its share of the
 * node's NICs: a message between two NVLink domains), NVLink egress and
 * ingress (a message inside one domain), plus its local copies (colocated
 * ranks, in round 0, at the NVLink rate: a device copy is at least that
 * fast). A link used in a round waits out its latency once: the messages
 * posted together are in flight together (charging every message its
 * whole latency made the model 18% pessimistic against the fluid
 * simulation of scripts/simulate.sh). Each message's own cost is charged
 * on the link it uses: the posting rank issues its messages one after
 * another, so those costs add up. Where the topology has a shared memory
 * bandwidth (node_copy_bw, the cpu preset: ranks are processes copying
 * through one host's memory), every byte received or copied locally is
 * one copy, and a node's copies of a round share that bandwidth: one more
 * term per node. The makespan is the sum of the rounds. Execution double-buffers
 * (round k+1 is packed while round k is in flight), so rounds overlap in
 * reality and this slightly over-estimates.
 *
 * Times are kept in integer picoseconds, each link's term rounded once, so
 * that the global computation (every rank's plan in one process, for the
 * tools) and the collective one (reshard_plan_estimate) reduce the same
 * integers with the same maxima and agree exactly. */
#ifndef RS_PLAN_COST_H
#define RS_PLAN_COST_H

#include <stdint.h>

#include "plan/plan.h"
#include "plan/topology.h"
#include "reshard.h"

enum {
  RS_LINK_NIC_OUT = 0,
  RS_LINK_NIC_IN,
  RS_LINK_NVL_OUT,
  RS_LINK_NVL_IN,
  RS_LINK_COPY,
  RS_NLINKS
};

/* One rank's share of the model: per round and link, its time and the
 * latency part of it (picoseconds), and the bytes it copies into its
 * node's memory (only when the topology has node_copy_bw). */
typedef struct rs_cost_rank {
  int rank;
  int nrounds;
  uint64_t *ps;         /* nrounds * RS_NLINKS */
  uint64_t *lat_ps;     /* nrounds * RS_NLINKS */
  uint64_t *node_bytes; /* nrounds, or NULL */
  uint64_t bytes;       /* sent + copied locally */
} rs_cost_rank;

/* Computes plan's share from its messages and local copies. The plan must
 * have a topology. RESHARD_ERROR_INVALID_USAGE when a message crosses a
 * link the topology lacks. */
reshard_result_t rs_cost_rank_compute(const reshard_plan_t *plan,
                                      rs_cost_rank *out);
void rs_cost_rank_free(rs_cost_rank *c);

/* The global computation: add every rank's share, then finish. */
typedef struct rs_cost_acc {
  rs_topology topo;
  const rs_rank_map *map;
  int nranks;
  int nrounds, cap_rounds;
  uint64_t *max_ps;     /* nrounds * RS_NLINKS */
  int32_t *where;       /* lowest rank attaining max_ps */
  uint64_t *where_lat;  /* that rank's latency part */
  uint64_t *node_bytes; /* nrounds * map->nnodes, summed */
  uint64_t bytes;
} rs_cost_acc;

void rs_cost_acc_init(rs_cost_acc *acc, const rs_topology *topo,
                      const rs_rank_map *map, int nranks);
/* Adds one rank's share; ranks may come in any order. */
reshard_result_t rs_cost_acc_add(rs_cost_acc *acc, const rs_cost_rank *c);
/* Fills the estimate (every field of the current version). */
void rs_cost_acc_finish(const rs_cost_acc *acc, reshard_estimate_t *out);
void rs_cost_acc_free(rs_cost_acc *acc);

/* The steps both computations share, once the per-round maxima over ranks
 * are known. For each round: the bounding kind (an RS_LINK_* or
 * RS_NLINKS for the node term; the first in that order on ties), its
 * duration, and for the node term the lowest node attaining it. */
void rs_cost_round_bounds(const rs_topology *topo, int nnodes, int nrounds,
                          const uint64_t *max_ps, const uint64_t *node_bytes,
                          int *kind, uint64_t *dur, int32_t *node_where);
/* The estimate from each round's kind, duration, bounding rank (or node)
 * and that rank's latency part. */
void rs_cost_assemble(int nrounds, const int *kind, const uint64_t *dur,
                      const int32_t *where, const uint64_t *lat,
                      uint64_t bytes, reshard_estimate_t *out);

/* Adds the estimate of a plan that runs first (source-side spreading's
 * pre-plan) to *into: times, rounds and bytes add up; the bound named
 * stays into's. */
void rs_cost_add_before(reshard_estimate_t *into, const reshard_estimate_t *first);

/* Seconds -> the model's picoseconds (rounded to nearest). */
uint64_t rs_cost_ps(double seconds);

/* Copies a full estimate into the caller's, honouring its struct_size and
 * version; RESHARD_ERROR_INVALID_ARGUMENT for NULL or an unknown version
 * (naming `what`). */
reshard_result_t rs_estimate_check(const reshard_estimate_t *out,
                                   const char *what);
void rs_estimate_store(reshard_estimate_t *out, const reshard_estimate_t *full);

#endif
