/* The physical limit T_lower of a reshard (DESIGN section 4), and the
 * byte counts behind it, from the two layouts alone.
 *
 * Every byte a destination rank needs and does not hold itself must reach
 * it over some link. Counting unique elements: each tensor is cut into
 * cells by every fragment boundary of both sides (per dim), and each cell's
 * holders are counted, so an element held or needed by many ranks counts
 * once where the bound says once. With in(r) the bytes rank r needs and
 * does not hold, N(d) the bytes the ranks of domain d need that no source
 * rank of d holds, and U the unique bytes some rank needs and does not
 * hold:
 *
 *   T_lower = max( U_net / (sum of the source ranks' NIC bandwidth),
 *                  max_d N(d) / (sum of d's ranks' NIC bandwidth),
 *                  max_r in(r) / (r's fastest ingress link),
 *                  max_s (bytes only s holds, needed elsewhere) / (s's
 *                        fastest egress link),
 *                  [node_copy_bw] max_node sum of its ranks' in(r) /
 *                        node_copy_bw )
 *
 * U_net is the part of U that must cross the network: the union over
 * domains d of what N(d) counts. When the sides are on separate domains
 * (the rank map's placement unless ranks are colocated) no destination rank
 * shares a domain with a source rank, so U_net = U, DESIGN's term; with
 * colocated ranks, bytes that stay inside a domain need no NIC and are
 * bounded by the in(r) term instead. A rank's fastest link is the larger
 * of its NIC share and (when its domain has another rank) its NVLink. The
 * last term is the cpu preset's: every received byte is one copy through
 * the host's shared memory. */
#ifndef RS_PLAN_LOWER_BOUND_H
#define RS_PLAN_LOWER_BOUND_H

#include <stdint.h>

#include "plan/topology.h"
#include "reshard.h"

typedef struct rs_volume {
  rs_topology topo;
  rs_rank_map map;
  int nranks;
  uint64_t total;      /* bytes of every element some destination holds, once */
  uint64_t unique;     /* U */
  uint64_t unique_net; /* U_net */
  uint64_t *in;        /* per rank: in(r) */
  uint64_t *only;      /* per rank: bytes only r holds, needed by another */
  uint64_t *domain_in; /* per domain: N(d) */
  uint64_t *domain_out; /* per domain: bytes only its source ranks hold,
                           needed by a rank outside it (rs_volume_domain_cut) */
  uint64_t *node_in;   /* per node: sum of its ranks' in(r) */
  int *domain_ranks;   /* per domain: ranks placed there */
  int nsrc_ranks;      /* ranks holding source fragments */
  int root;            /* the lowest of them, or -1 */
  uint64_t root_holds; /* of total: bytes the root holds */
  uint64_t root_domain_holds; /* of total: bytes source ranks of the
                                 root's domain hold */
} rs_volume;

/* Counts the bytes of a reshard of src to dst on nranks ranks placed on
 * topo (rs_rank_map_build), each element at its size on the wire (the
 * narrower dtype of a float tensor that converts). Tensors must match by
 * name, shape and dtype but for float dtypes
 * (RESHARD_ERROR_INVALID_ARGUMENT otherwise, as must a destination
 * element no source rank holds). A destination weight that quantizes to
 * fp8 blocks (plan/quant.h) counts as its codes and scales, sent from
 * every source replica that holds its blocks whole. */
reshard_result_t rs_volume_compute(const reshard_layout_t *src,
                                   const reshard_layout_t *dst, int nranks,
                                   const rs_topology *topo, rs_volume *out);
void rs_volume_free(rs_volume *v);

/* T_lower and its terms (every field of the current version). */
void rs_lower_bound_of(const rs_volume *v, reshard_estimate_t *out);

/* A bound DESIGN's T_lower leaves out, reported beside it: the bytes
 * that only the source ranks of one domain hold, and that a rank outside
 * the domain needs, must leave through that domain's NICs, whatever
 * forwarding a plan does. Max over domains of domain_out(d) / (d's ranks'
 * NIC bandwidth); *where is the domain (-1 when no byte leaves one).
 * T_lower's source-egress term is the same cut around all source domains
 * together, so this is larger when the sources' domains hold unequal
 * shares (pipeline stages of different sizes placed on different
 * domains). */
double rs_volume_domain_cut(const rs_volume *v, int *where);

/* A rank's fastest link of one direction (links are symmetric). */
double rs_volume_fastest_link(const rs_volume *v, int rank);

#endif
