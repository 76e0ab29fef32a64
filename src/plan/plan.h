/* The plan: this rank's precomputed messages and copies.
 *
 * Messages are grouped in rounds (chunks). Round k carries the k-th piece
 * of every (peer) stream that has one, so sender and receiver agree on the
 * cut without talking; a piece never exceeds chunk_bytes, which the ranks
 * agree on at creation from the staging budget and the largest peer count.
 * Execution double-buffers the staging: round k is packed while round k-1
 * is in flight, and unpacked while round k+1 is. */
#ifndef RS_PLAN_PLAN_H
#define RS_PLAN_PLAN_H

#include <stddef.h>
#include <stdint.h>

#include "layout/layout.h"
#include "plan/topology.h"
#include "pack/copy.h"
#include "reshard.h"

typedef struct rs_msg {
  int32_t peer;
  int32_t round;
  uint64_t bytes;
  uint64_t staging_off; /* within the round's staging area */
  uint32_t first_copy;  /* in send_copies or recv_copies */
  uint32_t ncopies;
  /* Host executor: the message is one contiguous run of its buffer, so it
   * is sent from (received into) the buffer itself, skipping the pack (or
   * unpack) copy. Its staging area stays reserved for device executors,
   * which ignore the flag. */
  uint32_t direct;
} rs_msg;

typedef struct rs_used_buffer {
  int32_t id;
  uint64_t bytes;
  char *name;
} rs_used_buffer;

struct reshard_plan {
  reshard_comm_t *comm;
  int rank, size;
  reshard_options_t opts;
  uint64_t digest;
  uint64_t tag_base;
  /* The machine, when options or RESHARD_TOPOLOGY name one. */
  int has_topo;
  rs_topology topo;
  rs_rank_map map; /* empty without a topology */
  size_t chunk_bytes;

  int nrounds;
  rs_msg *sends, *recvs; /* sorted by round, then schedule order */
  size_t nsends, nrecvs;
  size_t *send_round, *recv_round; /* nrounds+1 starts */
  rs_copy *send_copies, *recv_copies, *local_copies;
  size_t nsend_copies, nrecv_copies, nlocal_copies;
  uint64_t send_half, recv_half; /* staging bytes per round, per half */
  size_t max_round_sends;        /* of the busiest round */
  size_t max_round_msgs;         /* max sends + max receives per round */

  /* Buffers this rank reads and writes, checked at execute. */
  int num_src_buffers, num_dst_buffers; /* layout counts */
  rs_used_buffer *src_used, *dst_used;
  int nsrc_used, ndst_used;

  reshard_plan_stats_t stats;
  reshard_peer_stats_t *peers;
  size_t npeers;

  /* A staging block reused across executes; taken with an atomic flag so
   * that concurrent executes of one plan fall back to their own. This is
   * the only state execute touches, and it does not change the plan's
   * meaning. */
  int staging_busy;
  void *staging_cache;
  size_t staging_cache_bytes;

  /* Execute calls so far (atomic), also touched by execute: the epoch in
   * every tag, so messages a failed call left behind never match a later
   * call. Every rank must make the same number of calls. */
  uint64_t exec_calls;

  /* Device backends: state cached with the plan at first execute (device
   * copies of the descriptors, staging, streams), freed by device_free
   * from reshard_plan_destroy. NULL on host transports. */
  void *device;
  void (*device_free)(struct reshard_plan *plan);
};

/* The RESHARD_FLAG_* bits this library implements; others are rejected. */
#define RS_KNOWN_FLAGS RESHARD_FLAG_FIRST_REPLICA

/* ---- planning internals (plan_build.c, plan_assign.c, plan_chunk.c) ---- */

/* A box this rank packs or unpacks, before chunking: the side's buffer,
 * the byte offset of the box's first element and its element strides. */
typedef struct rs_seg {
  int32_t peer;
  int32_t buffer;
  int32_t ndim;
  int32_t tensor; /* for the dump */
  uint32_t esize;
  uint64_t off;
  uint64_t bytes;
  int64_t extent[RESHARD_MAX_DIMS];
  int64_t strides[RESHARD_MAX_DIMS];
} rs_seg;

typedef struct rs_seg_vec {
  rs_seg *v;
  size_t n, cap;
} rs_seg_vec;

reshard_result_t rs_seg_vec_push(rs_seg_vec *vec, const rs_seg *s);
void rs_seg_vec_free(rs_seg_vec *vec);

/* One piece of a destination fragment and the source fragment chosen to
 * provide it. */
typedef struct rs_piece {
  int64_t start[RESHARD_MAX_DIMS];
  int64_t extent[RESHARD_MAX_DIMS];
  rs_frag src; /* the chosen holder */
} rs_piece;

typedef struct rs_piece_vec {
  rs_piece *v;
  size_t n, cap;
} rs_piece_vec;

void rs_piece_vec_free(rs_piece_vec *vec);

/* Scratch reused across calls of rs_assign_pieces. */
typedef struct rs_assign_ctx {
  const reshard_layout_t *src;
  rs_frag_vec holders;
  int64_t *bounds; /* per-dim boundary lists */
  size_t bounds_cap;
  int *cands;
  size_t cands_cap;
  int first_only; /* RESHARD_FLAG_FIRST_REPLICA: the lowest holder only */
} rs_assign_ctx;

void rs_assign_ctx_free(rs_assign_ctx *ctx);

/* Splits destination fragment D (whose tensor is src_tensor on the source
 * side) into pieces, each provided by one source rank: the box is cut into
 * cells by the source fragments' boundaries; a cell the receiver itself
 * holds is copied locally; otherwise it is split evenly along its
 * outermost non-trivial dim across all ranks holding it. Deterministic:
 * sender and receiver compute the same pieces. Appends to out (cleared
 * first). A cell no source holds is RESHARD_ERROR_INVALID_ARGUMENT. */
reshard_result_t rs_assign_pieces(rs_assign_ctx *ctx, const rs_frag *D,
                                  int src_tensor, const char *name,
                                  rs_piece_vec *out);

/* Cuts every peer's stream (segments sorted by peer, stable) into pieces
 * of at most chunk_bytes, assigns rounds, and fills the plan's message and
 * copy arrays for one direction. is_send selects which side of the copies
 * is the staging area. */
reshard_result_t rs_chunk_streams(reshard_plan_t *plan, rs_seg_vec *segs,
                                  int is_send, size_t chunk_bytes);

/* Byte offset of element `start` (tensor coordinates) of fragment f. */
uint64_t rs_frag_offset_of(const rs_frag *f, const int64_t *start,
                           size_t esize);

#endif
