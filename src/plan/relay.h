/* Relay plans: each unique byte leaves the source side once and enters
 * each destination NVLink domain once; destination replicas forward to
 * each other.
 *
 * The relay group of a destination fragment D is the set of ranks holding
 * a fragment of D's tensor with exactly D's box (its replicas: same
 * elements, same row-major order, any buffer, offset or strides). Every
 * member, and every source rank, finds the same group from the global
 * description. D is relayed when the group has m >= 2 members, D has at
 * least rs_relay_min_part_bytes, no member holds source data intersecting
 * D (colocated cases stay direct, they copy locally) and no member holds
 * two replicas of the box.
 *
 * D is cut into n = min(m, D's bytes / rs_relay_min_part_bytes) parts
 * (n = m when min_part is 0), so that a small fragment with many replicas
 * (a KV head or a latent projection replicated on every rank of a TP
 * group) still leaves the sources once instead of m times; n < m only
 * when two members share a domain (without a topology every rank is its
 * own domain, so never) and the members span at most
 * RS_RELAY_FEW_PARTS_MAX_DOMAINS domains: otherwise D stays direct. Part j's owner
 * is G[(rot + j * m / n) mod m], with rot = 0 when n = m and otherwise a
 * hash of D's box, so that small fragments do not all land on the lowest
 * rank. The assignment of the group's canonical fragment (its lowest
 * rank's) splits each cell's element range over the n owners and each
 * owner's range over the source holders, so source egress stays balanced
 * and every party computes the same pieces. A source sends part j only to
 * its owner. Forward tree of part j: the owner sends to every other member
 * of its domain and to one entry member of each other domain that has
 * members (round robin by j + rot over that domain's members, by rank);
 * an entry sends to the other members of its domain. Without a topology
 * every rank is its own domain, so the owner sends to every member.
 *
 * Streams and rounds: the relay stream (s -> o, G) of source s and owner
 * o holds the pieces s provides for o's parts of G's fragments; the
 * forward stream (p -> c, G) holds everything p forwards to c in G (parts
 * it owns, and parts it entered its domain with). Every party orders a
 * stream by (fragment box, piece) (a forward stream then by when its data
 * lands: chunk.c ready_order), builds it from its own fragment (same
 * boxes, its own strides) and cuts it identically (src/plan/chunk.c). A
 * forwarded piece travels no earlier than the round after the one it
 * arrived in at its sender: both executors post round q + 1's forwards
 * once round q is in the destination buffers (src/exec/schedule.h).
 * Members also cut, without sending, the streams of other pairs whose
 * rounds they wait on. A member has O(m) forward streams, however many
 * source ranks there are.
 */
#ifndef RS_PLAN_RELAY_H
#define RS_PLAN_RELAY_H

#include <stddef.h>
#include <stdint.h>

#include "layout/layout.h"
#include "plan/plan.h"
#include "reshard.h"

/* A relayed fragment's parts have at least this many bytes (a fragment
 * smaller than one part stays direct). Relaying adds a hop (one more
 * message latency, ~5 us over the network) to the bytes it forwards; a
 * 256 KiB part is about that much NIC time (at 50 GB/s per GPU), so
 * smaller parts save less egress time than their extra hop costs. Tests lower it to
 * relay tiny tensors; it must be the same on every rank (it is part of
 * the plan digest). */
#define RS_RELAY_MIN_PART_DEFAULT ((uint64_t)256 << 10)

/* Fewer parts than members only across this many domains at most (see
 * few_parts_pay in relay.c): the panel's Kimi-K2 spans 16 destination
 * domains, the 2048-rank planning benchmark 128. */
#define RS_RELAY_FEW_PARTS_MAX_DOMAINS 16

/* A source -> owner relay stream is cut into at least this many messages
 * (each at least the relay part size; src/plan/chunk.c), so that its
 * owner's forwards, which leave the round after their bytes land,
 * overlap it: a fan-out then takes about 1.28 x its source's time in the
 * plan replay (chunk.c). */
#define RS_RELAY_PIPELINE_ROUNDS 8
extern uint64_t rs_relay_min_part_bytes;

typedef struct rs_relay_role {
  int32_t parent;       /* who sends this rank the part (the source for hop 0) */
  int32_t hop;          /* 0: owner, 1: from the owner, 2: from an entry */
  uint32_t first_child; /* into rs_relay_ctx.children */
  uint32_t nchildren;
} rs_relay_role;

/* Scratch reused across fragments. */
typedef struct rs_relay_ctx {
  const reshard_layout_t *src, *dst;
  const int32_t *domain; /* rank -> domain, or NULL: every rank its own */
  uint64_t min_part_bytes;
  rs_frag_vec same, held;
  int32_t *ranks, *local, *children, *owners;
  rs_relay_role *roles;
  size_t cap; /* entries of ranks, local, owners, roles; children has 2x */
  /* memo != 0: groups are remembered by (tensor, box), for a source rank,
   * which meets every box once per member. */
  int memo;
  struct rs_relay_memo *memos;
  size_t nmemos, cap_memos;
  int32_t *memo_slots; /* open addressing over memos, -1 empty */
  size_t nslots;
  int32_t *memo_ranks;
  size_t nmemo_ranks, cap_memo_ranks;
} rs_relay_ctx;

void rs_relay_ctx_free(rs_relay_ctx *ctx);

typedef struct rs_relay_group {
  int m;                /* members; 0: D stays direct */
  int nparts;           /* 1 .. m */
  int rot;              /* 0 .. m-1: where the owners start */
  const int32_t *ranks; /* m ranks, ascending (ctx scratch) */
  rs_frag canon;        /* the lowest rank's replica: the assignment's D */
} rs_relay_group;

/* The owner of part j < g->nparts. */
static inline int32_t rs_relay_owner(const rs_relay_group *g, int j) {
  return g->ranks[(g->rot + (int)((int64_t)j * g->m / g->nparts)) % g->m];
}

/* The owners of g's parts, in part order (ctx scratch, valid until the
 * next call). */
const int32_t *rs_relay_owners(rs_relay_ctx *ctx, const rs_relay_group *g);

/* The relay group of D (whose tensor is src_tensor on the source side,
 * elements of esize bytes); g->m = 0 when D stays direct. */
reshard_result_t rs_relay_group_of(rs_relay_ctx *ctx, const rs_frag *D,
                                   int src_tensor, size_t esize,
                                   rs_relay_group *g);

/* This rank's place in the forward tree of every part of g: fills
 * ctx->roles[j] for j < g->nparts (me must be a member). */
reshard_result_t rs_relay_roles(rs_relay_ctx *ctx, const rs_relay_group *g,
                                int32_t me);

/* Relay groups met while planning, interned so that segments name them by
 * id. */
typedef struct rs_relay_table {
  int32_t *pool;
  size_t npool, cap_pool;
  struct rs_relay_entry {
    size_t off;
    int32_t m;
    uint64_t hash;
  } *v;
  size_t n, cap;
  int32_t *slots; /* open addressing over v, -1 empty */
  size_t nslots;
} rs_relay_table;

reshard_result_t rs_relay_table_intern(rs_relay_table *t,
                                       const int32_t *ranks, int m,
                                       int32_t *id);

/* Ordinal of every interned group in the lexicographic order of the rank
 * lists: *ordinal gets t->n entries (caller frees). Two ranks order the
 * groups they share alike, whatever else they met. */
reshard_result_t rs_relay_table_order(const rs_relay_table *t,
                                      int32_t **ordinal);

void rs_relay_table_free(rs_relay_table *t);

/* ---- building a rank's relay segments (relay_plan.c) ---- */

typedef struct rs_relay_plan {
  rs_relay_ctx ctx;
  rs_relay_table groups;
  /* The relayed fragment boxes met, by id (rs_seg.box until
   * rs_relay_plan_order turns ids into ordinals). */
  struct rs_relay_box {
    int32_t tensor, ndim;
    int64_t start[RESHARD_MAX_DIMS], extent[RESHARD_MAX_DIMS];
  } *boxes;
  size_t nboxes, cap_boxes;
  rs_piece_vec parts; /* the (cell, owner) ranges of a fragment */
  size_t *part_segs;  /* per range, 4 segment indices */
  size_t cap_part_segs;
} rs_relay_plan;

/* Relayed fragment D of member me (group g): appends the source -> owner
 * segments of every piece (me's receives, or virtual), and me's forwards
 * and receives of each (cell, owner) range along its tree. */
reshard_result_t rs_relay_plan_member(rs_relay_plan *rp, rs_assign_ctx *actx,
                                      rs_piece_vec *pieces, rs_seg_vec *segs,
                                      int32_t me, const rs_frag *D,
                                      const rs_relay_group *g, int src_tensor,
                                      const char *name, reshard_dtype_t dt);

/* Source rank me: appends what it sends each owner of relayed box D
 * (call once per box). With actx->sender = me + 1 only me's cells are
 * assigned: its segments' piece numbers are then their ordinals among
 * me's pieces, in the order the members' full assignment numbers them,
 * which is all the order of a stream from me needs. */
reshard_result_t rs_relay_plan_source(rs_relay_plan *rp, rs_assign_ctx *actx,
                                      rs_piece_vec *pieces, rs_seg_vec *segs,
                                      int32_t me, const rs_frag *D,
                                      const rs_relay_group *g, int src_tensor,
                                      const char *name, reshard_dtype_t dt);

/* Turns group and box ids of segs into ordinals (rs_chunk_plan orders by
 * them). */
reshard_result_t rs_relay_plan_order(rs_relay_plan *rp, rs_seg_vec *segs);

void rs_relay_plan_free(rs_relay_plan *rp);

#endif
