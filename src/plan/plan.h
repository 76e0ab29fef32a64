/* The plan: this rank's precomputed messages and copies.
 *
 * Messages are grouped in rounds (chunks). A stream is everything one rank
 * sends another under one key: the direct traffic of the pair, or a relay
 * stream (source -> owner, or forwards, of one relay group; see
 * plan/relay.h). A stream's k-th piece travels in its k-th round (later
 * for forwards that wait on their data; see chunk.c), so sender and
 * receiver agree on the cut without talking; a piece never exceeds
 * chunk_bytes, which the ranks agree on at creation from the staging
 * budget and the largest stream count. Messages of one pair in one round
 * share a tag; both sides order them by stream key, and transports match
 * equal tags in posting order.
 * Execution double-buffers the staging: round k is packed while round k-1
 * is in flight, and unpacked while round k+1 is.
 *
 * This header is what executors, kernels' hosts and the tools read; the
 * "planning internals" section below is the planner's own, still here
 * because the tools and tests reach into it. Declarations only the
 * planner's files share live in plan/planner.h. */
#ifndef RS_PLAN_PLAN_H
#define RS_PLAN_PLAN_H

#include <stddef.h>
#include <stdint.h>

#include "kernels/rs_verify.h"
#include "layout/layout.h"
#include "plan/executor.h"
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
  /* A relay forward's message, at both ends (its stream is a forward
   * between relay members: group >= 0, origin -1). On a send the copies
   * read this rank's destination buffers (data it received in an earlier
   * round), not its source buffers. A round's forwards come after its
   * other messages (chunk.c) and travel apart from them, once the round
   * before has landed (exec/schedule.h). */
  uint32_t fwd;
} rs_msg;

/* rs_vbox and rs_vtensor, verify mode's view of a copy and of a tensor:
 * kernels/rs_verify.h (the kernels read them too). */

typedef struct rs_used_buffer {
  int32_t id;
  uint64_t bytes;
  char *name;
} rs_used_buffer;

/* Phase candidates (phases.c): the counts 1, 2, 4, ..., 64, each with
 * every wide-stream threshold: none, then 1 GiB down to 1 MiB by 2x.
 * Candidate k * RS_WIDE_CANDIDATES + w is 2^k phases, threshold w. */
enum { RS_PHASE_MARGIN = 100 }; /* more phases must estimate 1/100 lower (rs_phases_choose) */
enum { RS_PHASE_COUNTS = 7, RS_WIDE_CANDIDATES = 12, RS_PHASE_CANDIDATES = RS_PHASE_COUNTS * RS_WIDE_CANDIDATES };

/* What sets a plan's horizon (rs_pace_rounds): the bytes of its longest
 * narrow network stream and of its longest wide one (0: none), and of its
 * longest stream inside a domain, which sets it in a plan without network
 * streams (a spreading pre-plan: all its copies go over NVLink). */
typedef struct rs_pace {
  uint64_t narrow, wide, inside;
} rs_pace;

struct reshard_plan {
  reshard_comm_t *comm;
  int rank, size;
  reshard_options_t opts;
  uint64_t digest;
  uint64_t tag_base;
  /* Keeping the plan across a rank's replacement (reshard_plan_rejoin,
   * plan/rejoin.c). seq: its number among the communicator's plans (bits
   * 32-47 of tag_base are its low 16), agreed at creation. rejoins: the
   * communicator's rejoins the plan is current with. transcript: its
   * creation's collectives (plan/transcript.c), on the plan the caller
   * holds only, NULL where the transport replaces no rank. agree_entry:
   * the transcript entry (plus one) of this plan's first agreement, on
   * the held plan and the pre-plans it runs alike. */
  uint32_t seq, rejoins;
  int rejoined; /* rejoins was set by a rejoin, not by the creation */
  /* The communicator's resizes when the plan was made: a resize renumbers
   * the ranks, so a plan of before names the wrong ones and every call of
   * it that reaches a peer is refused (plan/rejoin.c rs_plan_current). */
  uint32_t resizes;
  uint32_t agree_entry;
  struct rs_transcript *transcript;
  /* The machine, when options or RESHARD_TOPOLOGY name one. */
  /* relay -1 (auto) chose the relay plan over the direct one */
  int relay_chosen;
  int has_topo;
  rs_topology topo;
  rs_rank_map map; /* empty without a topology */
  size_t chunk_bytes;
  /* Rounds over which a long stream spreads (0: off): a stream of B bytes
   * takes messages of up to max(chunk_bytes, B / spread_rounds), so long
   * streams finish with the short ones instead of trickling one chunk a
   * round after them (see chunk.c). Agreed at creation like chunk_bytes. */
  int32_t spread_rounds;
  /* Streams between two ranks of one NVLink domain take messages of up
   * to chunk_bytes / domain_div (rs_topology_domain_chunk_div; 1 without
   * a topology), before the spread and the pace (rs_chunk_cap). */
  int32_t domain_div;
  /* Phases (1: off): the stream from -> to sends only in the rounds
   * congruent to rs_stream_phase(plan, ...) modulo phases, so that a
   * rank has about 1/phases of its streams in flight a round, each with
   * a chunk phases times larger: as many bytes a round in fewer, larger
   * messages (see chunk.c). Agreed at creation like chunk_bytes. */
  int32_t phases;
  /* Some tensor changes dtype between the sides (the same on every rank:
   * from the layouts). */
  int32_t casts;
  /* With phases, a stream of more than wide_bytes (a multiple of 64; 0:
   * none) sends in every round rather than in its phase's: one long
   * stream in one phase would make that phase its links' busiest. */
  uint64_t wide_bytes;
  /* rs_phase_estimates of this rank, then their maxima over the ranks
   * (after the agreement: what chose phases and wide_bytes). */
  uint64_t phase_est[RS_PHASE_CANDIDATES];
  /* Pace: the longest narrow and wide network streams of the plan, and
   * its longest stream inside a domain (agreed as the maxima over the
   * ranks, for the chosen wide_bytes; zeros: no pacing). The rounds they
   * take at a chunk are the plan's horizon (rs_pace_rounds: the
   * network's, or without network streams the longest inside stream's),
   * within which streams inside a domain finish and over which wide and
   * free network streams spread (rs_chunk_cap). pace_cand: this rank's
   * per wide candidate, then their maxima over the ranks. */
  rs_pace pace;
  rs_pace pace_cand[RS_WIDE_CANDIDATES];

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

  /* A staging block reused across executes (one runs at a time: busy).
   * It does not change the plan's meaning. */
  void *staging_cache;
  size_t staging_cache_bytes;

  /* Verify mode only (NULL otherwise): one rs_vbox per copy of
   * send_copies, recv_copies and local_copies, and the destination
   * layout's tensors. */
  rs_vbox *send_vbox, *recv_vbox, *local_vbox;
  rs_vtensor *vtensors;
  int nvtensors;

  /* Per-call state, touched by execute through atomics (the plan is const
   * there, and other threads read the status). See src/exec/exec_state.h. */
  /* Executes that passed their argument checks (atomic): the call number
   * in the agreement header and the epoch in every data tag, so messages
   * a failed call left behind never match a later call. */
  uint64_t exec_calls;
  uint64_t last_version;      /* passed to the latest agreement */
  uint64_t completed;         /* executes that succeeded */
  uint64_t committed_version; /* of the latest successful execute */
  int active_copy;            /* double buffering: -1 before the first commit */
  /* An execute (or resolve) of this plan is running on this rank: the
   * next one is refused (reshard_plan_execute), since two calls of one
   * plan in flight would pair with their partners' calls in whatever
   * order the threads ran. Calls of a plan are therefore strictly one at
   * a time: agreement headers, staging and scratch need no turns. */
  int busy;
  /* Double buffering: a version this rank voted to commit without
   * learning the outcome (src/exec/doubt.c); 0: none. Written under
   * busy; doubt_copy holds it here, doubt_ticket names the pending
   * collective (rs_transport_ops.allreduce_late). */
  uint64_t doubt_version, doubt_call, doubt_ticket;
  int doubt_copy;
  /* Executes inside the library now (atomic): reshard_plan_destroy waits
   * for them to return (each ends by its deadline) before freeing. */
  int in_use;
  /* The first failure: claimed by CAS on fail_claim, published by the
   * release store of fail_result (fail_msg is complete by then). */
  int fail_claim;
  reshard_result_t fail_result;
  uint64_t fail_call, fail_version;
  char fail_msg[768];

  /* What runs the plan (plan/executor.h), chosen at creation. */
  const rs_executor *executor;
  /* The device executor's state of the plan (device copies of the
   * descriptors, streams, events), set up by its prepare_local and freed
   * by its free from reshard_plan_destroy. NULL on host transports. */
  void *device;
  /* The host executor's registered buffers (exec/register.c; a
   * transport with one-sided reads, UCX), freed by its free. NULL: none. */
  struct rs_host_reg *host_reg;
  /* One held over a rejoin (not used by executes), until the next
   * registration keeps what it can of it (exec/register.h). */
  struct rs_host_reg *host_reg_kept;
  /* Set to 1 by the device executor's free when the GPU did not let go of the plan's
   * work and its memory was left allocated: memory others own that the
   * work uses must stay too (a quantizing plan's scratch, a spreading
   * plan's; NULL: none). */
  int *stuck_out[2];
  /* Composite plans on the device executor (set by plan creation): the
   * stage whose calls run just before this plan's on the caller's stream
   * and write what it reads (a quantizing plan's gather, a spreading
   * plan's copies), whose failures this plan inherits, its own and those
   * of the stage before it (NULL: none); and the quantization this plan's
   * execute launches first (the first stage that reads the codes: the
   * quantizing main plan, or its spreading pre-plan; NULL: none). */
  const reshard_plan_t *after;
  const struct rs_quant *quantize_first;
  /* A pre-plan's task, in messages ("gathering ..."; NULL: a main plan). */
  const char *stage_what;

  /* Block quantization (plan/quant.h): the pre-plan, this rank's boxes
   * and scratch; NULL when no destination weight is quantized. */
  struct rs_quant *quant;
  /* Source-side spreading (plan/spread.h): the pre-plan and this rank's
   * scratch; NULL when the plan spreads nothing. */
  struct rs_spread *spread;
};

/* Internal: every rank of a plan on a device transport takes part in its
 * verdict (reduced over the communicator before any unpack), as in relay
 * plans. Set by plan creation for a quantizing main plan, whose rank
 * whose pre-plan failed must close every gate: its partners' headers
 * alone would not say so. Never taken from the caller's options. */
#define RS_FLAG_GLOBAL_VERDICT 0x80000000u

/* The staging of one call, for every executor and the statistics: two
 * halves per direction, laid out [send 0][send 1][recv 0][recv 1] (round
 * k uses half k & 1). rs_staging_bytes: their size. rs_staging_split: the
 * halves of a block at base (all NULL for a NULL base); returns the first
 * byte after them (NULL for a NULL base). Written once (staging.c). */
size_t rs_staging_bytes(const reshard_plan_t *p);
unsigned char *rs_staging_split(const reshard_plan_t *p, unsigned char *base, unsigned char *send[2],
                                unsigned char *recv[2]);

/* The RESHARD_FLAG_* bits this library implements; others are rejected. */
#define RS_KNOWN_FLAGS \
  (RESHARD_FLAG_DOUBLE_BUFFER | RESHARD_FLAG_VERIFY | RESHARD_FLAG_FIRST_REPLICA | RESHARD_FLAG_SYNC | \
   RESHARD_FLAG_NO_SPREAD | RESHARD_FLAG_SPREAD_ALWAYS)

/* ---- planning internals (create.c, assign.c, chunk.c, relay_plan.c) ---- */

/* A box this rank packs or unpacks, before chunking: the side's buffer,
 * the byte offset of the box's first element and its element strides. */
/* Which stream a segment belongs to, seen from this rank. */
enum {
  RS_SEG_RECV = 0,   /* this rank receives it */
  RS_SEG_SEND = 1,   /* this rank sends it */
  RS_SEG_VIRTUAL = 2 /* another pair's relay stream, cut only for its rounds */
};

typedef struct rs_seg {
  int32_t peer; /* the other rank of a send or receive */
  int32_t buffer;
  int32_t ndim;
  int32_t tensor; /* for the dump */
  int32_t vtensor; /* destination-layout tensor id (verify mode) */
  /* Element sizes: on the wire (esize, what bytes and the staging count)
   * and in the segment's buffer (besize, what off and strides scale by);
   * and the two dtypes. They differ only where the tensor's dtype does
   * between the sides (src/pack/convert.h): the pack casts the buffer's
   * elements to the wire's, the unpack the wire's to the buffer's. */
  uint32_t esize, besize;
  int32_t bdtype, wdtype;
  uint64_t off;
  uint64_t bytes;
  int64_t extent[RESHARD_MAX_DIMS];
  int64_t strides[RESHARD_MAX_DIMS];
  int64_t gstart[RESHARD_MAX_DIMS]; /* the box's first element, global */
  /* The stream: (from, to, group, origin). group -1: direct traffic, kept
   * in push order. Otherwise relay traffic of a group (plan/relay.h):
   * origin is the source rank of a source -> owner stream, -1 for
   * forwards between members; every party orders a relay stream's
   * segments by (fragment box, piece), box being the ordinal of the
   * fragment's (tensor, start, extent) among those this rank met. */
  int32_t dir, from, to;
  int32_t group, origin;
  /* Streams are cut in level order (0: direct and source -> owner, 1:
   * forwards between domains, 2: forwards within a domain); a segment
   * with dep >= 0 travels no earlier than the round after the last of
   * segments dep .. dep+ndep-1 (what its sender receives it in) arrives. */
  int32_t level;
  int64_t dep;   /* the first of ndep consecutive segments */
  int32_t ndep;
  /* A forward's bytes are bytes dep_off .. dep_off + bytes of its
   * dependencies laid end to end (a part's pieces, or the boxes its
   * sender received it in, all in the part's row-major order): each of
   * its bytes travels the round after the message that brought that
   * byte, not after the whole part (chunk.c). */
  uint64_t dep_off;
  /* A source -> owner relay segment whose group spans more than one
   * NVLink domain (every rank is its own without a topology): its part is
   * forwarded over the network, at the cost of the stream itself, so its
   * stream is cut to pipeline (chunk.c, RS_RELAY_PIPELINE_ROUNDS); inside
   * one domain NVLink forwards it in a fraction of that time. */
  int32_t pipe;
  int32_t fwd; /* sends: buffer is a destination buffer */
  int32_t box;
  uint32_t piece;
} rs_seg;

typedef struct rs_seg_vec {
  rs_seg *v;
  size_t n, cap;
  /* chunk.c's sort of the segments (by level, stream, then their order
   * in the stream), made once and kept while they do not change: a push
   * drops it, and so must code that rewrites segments in place
   * (rs_seg_vec_changed). */
  void *sorted;
} rs_seg_vec;

reshard_result_t rs_seg_vec_push(rs_seg_vec *vec, const rs_seg *s);
/* Drops the kept sort after segments were rewritten in place. */
void rs_seg_vec_changed(rs_seg_vec *vec);
/* The kept sort: for each place k in it, the segment's index in the
 * vector and its push order (what a direct stream's order and dep count
 * in); 0, or -1 when none is kept. */
int rs_seg_vec_order(const rs_seg_vec *vec, uint32_t *index_of, uint32_t *orig_of);
/* Installs the sort of a vector already laid out in it (the tools' stage
 * store writes segments in stream order, so that later cuts read them in
 * sequence), segment by segment while each is still in cache: begin for
 * n segments (n <= vec->cap), put(k, orig) once vec->v[k] is written
 * (orig: its push order), then end with vec->n = n, which checks that the
 * segments are in order and the push orders a permutation (else INTERNAL,
 * and no sort is kept). Until end succeeds the sort is not to be used.
 * Code that reads segments by push order must go through the sort
 * (chunk.c does). */
reshard_result_t rs_seg_vec_lay_out_begin(rs_seg_vec *vec, size_t n);
void rs_seg_vec_lay_out_put(rs_seg_vec *vec, size_t k, uint32_t orig);
reshard_result_t rs_seg_vec_lay_out_end(rs_seg_vec *vec);

/* Segment of box p of fragment f (this rank's: its buffer, of dtype
 * bdtype, and strides) in the direct stream from -> to, travelling as
 * wdtype (the same but for a cast, rs_cvt_wire_dtype); dir is
 * RS_SEG_SEND or RS_SEG_RECV. */
struct rs_piece;
void rs_seg_init(rs_seg *s, int dir, int32_t from, int32_t to,
                 const rs_frag *f, const struct rs_piece *p,
                 reshard_dtype_t bdtype, reshard_dtype_t wdtype);
void rs_seg_vec_free(rs_seg_vec *vec);

/* One piece of a destination fragment and the source fragment chosen to
 * provide it. */
typedef struct rs_piece {
  int64_t start[RESHARD_MAX_DIMS];
  int64_t extent[RESHARD_MAX_DIMS];
  rs_frag src;   /* the chosen holder */
  int32_t owner; /* index into the owners it was assigned for */
  int32_t part;  /* the (cell, owner) range it belongs to; -1 local */
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
  rs_lower_cache lowered; /* of src */
  int64_t *bounds; /* per-dim boundary lists */
  size_t bounds_cap;
  int *cands;
  size_t cands_cap;
  /* holders by interval of the outermost dim (CSR over the canonical
   * order): a cell looks only at those covering its outermost interval */
  int *bucket_at, *bucket;
  size_t bucket_at_cap, bucket_cap;
  /* rank -> NVLink domain (the plan's rank map), or NULL without a
   * topology: a cell held in the receiver's domain is split only over
   * those holders. */
  const int32_t *domain;
  /* src has scratch buffers of source-side spreading (spread.h): cells
   * held by one go from it or from its origin by the receiver's domain */
  int spread;
  /* NULL, or receives the boxes of every (cell, owner) range (src unset):
   * relay forwards move a range whole, whichever holders provided it. */
  struct rs_piece_vec *parts;
  int first_only; /* RESHARD_FLAG_FIRST_REPLICA: the lowest holder only */
  /* 0: every cell; r + 1: only rank r's pieces, of the cells inside the
   * hull of its holders (a sender's own; the other cells are skipped,
   * the pieces kept are the same as without). Not with parts. */
  int32_t sender;
  unsigned char *marks; /* scratch of the boundary sort */
  size_t marks_cap;
  /* The box whose holders, cell bounds, canonical order and buckets the
   * scratch above holds (they depend on the box alone, not on who
   * receives it): a call for the same box again reuses them. */
  int prep_valid;
  int32_t prep_tensor, prep_ndim, prep_sender;
  int64_t prep_start[RESHARD_MAX_DIMS], prep_extent[RESHARD_MAX_DIMS];
  size_t prep_nb[RESHARD_MAX_DIMS], prep_per_dim;
  /* Senders: every holder of one source tensor (assign.c
   * tensor_holders); tix_valid 1 kept, -1 too many (walk per box). */
  rs_frag_vec tix;
  int tix_valid;
  int32_t tix_tensor;
} rs_assign_ctx;

void rs_assign_ctx_free(rs_assign_ctx *ctx);

/* Splits destination fragment D (whose tensor is src_tensor on the source
 * side) into pieces, each provided by one source rank: the box is cut into
 * cells by the source fragments' boundaries; a cell the receiver itself
 * holds is copied locally; otherwise its row-major element range is split
 * into nowners consecutive ranges, range j for owners[j] (piece.owner =
 * j), and each range evenly across the ranks holding the cell (those in
 * the owner's domain when the topology puts some there). owners NULL: the
 * one receiver D->rank (direct). A relay group passes its members and
 * the group's canonical fragment as D, so that every member computes the
 * same pieces. Deterministic: sender and receiver compute the same
 * pieces. Appends to out (cleared first). A cell no source holds is
 * RESHARD_ERROR_INVALID_ARGUMENT. */
reshard_result_t rs_assign_pieces(rs_assign_ctx *ctx, const rs_frag *D,
                                  int src_tensor, const char *name,
                                  const int32_t *owners, int nowners,
                                  rs_piece_vec *out);

/* Cuts every stream into messages of at most chunk_bytes, assigns their
 * rounds (see chunk.c), schedules them and fills the plan's message and
 * copy arrays of both directions. Relay segments' group must already be
 * the group's ordinal (rs_relay_table_order), so that all parties order
 * streams alike. */
reshard_result_t rs_chunk_plan(reshard_plan_t *plan, rs_seg_vec *segs,
                               size_t chunk_bytes);

/* The phase of the stream from -> to of `bytes` (all its segments' bytes,
 * or those padded to 64: the same answer): its messages go in rounds
 * congruent to it modulo plan->phases (0 when phases <= 1); -1 for a
 * wide stream (over plan->wide_bytes), which sends in every round. */
int32_t rs_stream_phase(const reshard_plan_t *plan, int32_t from, int32_t to, uint64_t bytes);

/* Whether a stream of `bytes` is wide: phases > 1 and over wide_bytes. */
int rs_stream_wide(const reshard_plan_t *plan, uint64_t bytes);

/* The plan's network horizon at `chunk`: the rounds its longest narrow
 * network stream spans (one in `phases`), or its longest wide one (every
 * round) when that is more; 0 without pacing. */
uint64_t rs_pace_rounds(const reshard_plan_t *plan, uint64_t chunk);

/* This rank's streams (one per pair and relay group, virtual ones
 * excluded: they take no staging here), each with its bytes padded to
 * 64 as its staging slots are, whether it stays inside an NVLink domain
 * (with a plan whose domain_div > 1), and its ends. */
typedef struct rs_streams {
  size_t n;
  uint64_t total;
  uint64_t *bytes;
  unsigned char *inside;
  /* RS_PACE_INSIDE, RS_PACE_FREE or RS_PACE_NONE: how rs_chunk_cap paces
   * the stream when it is cut (stream_cap in chunk.c) */
  unsigned char *kind;
  int32_t *from, *to;
} rs_streams;
reshard_result_t rs_streams_size(const reshard_plan_t *plan, rs_seg_vec *segs, rs_streams *out);
void rs_streams_free(rs_streams *s);

/* Phases (phases.c). est[c] is this rank's estimate, in picoseconds, of
 * its busiest link's time at candidate c (RS_PHASE_CANDIDATES): the
 * bytes of the link's busiest phase, times the phases, over its
 * bandwidth (a wide stream's bytes spread over every phase), plus its
 * messages at the chunk this rank would size (with this rank's spread)
 * times each message's cost, and the link's latency once per round its
 * longest stream spans. UINT64_MAX marks c as no candidate: over
 * `most` phases, a threshold at one phase, or no topology with links
 * (est[0] is then 0). */
reshard_result_t rs_phase_estimates(const reshard_plan_t *plan, const rs_streams *st, int32_t spread, int32_t most,
                                    uint64_t *est);

/* Candidate c's wide-stream threshold in bytes (0: none). */
uint64_t rs_phase_wide_bytes(int c);

/* This rank's pace candidates: per wide candidate w (threshold
 * rs_phase_wide_bytes(w)), its longest network streams that are narrow
 * and wide under it (streams inside a domain do not count). */
void rs_pace_candidates(const rs_streams *st, rs_pace *cand);

/* into = the maxima of into and from, candidate by candidate (what the
 * agreement computes; the single-process tools merge ranks with it). */
void rs_pace_merge(rs_pace *into, const rs_pace *from);

/* The pace for the chosen wide_bytes from the agreed candidates. */
rs_pace rs_pace_choose(const rs_pace *cand, uint64_t wide);

/* The phases and wide threshold for estimates that are the maxima over
 * all ranks: the candidate with the lowest, where more phases must be
 * lower by 1/RS_PHASE_MARGIN; on a tie the fewer phases, then the fewer
 * wide streams. Returns the phases; *wide its threshold. */
int32_t rs_phases_choose(const uint64_t *est, uint64_t *wide);


/* What rs_chunk_cap knows of a stream. RS_PACE_NONE: a network stream
 * others wait on (a relay stream that pipelines, a forward), or one whose
 * kind the caller does not know (its cap is then the largest a network
 * stream gets); RS_PACE_INSIDE: inside an NVLink domain; RS_PACE_FREE: a
 * network stream nothing waits on past NVLink (direct traffic, a source
 * -> owner stream of a group inside one domain). */
enum { RS_PACE_NONE = 0, RS_PACE_INSIDE = 1, RS_PACE_FREE = 2 };

/* A stream's largest message at chunk c: the chunk (divided by
 * domain_div inside a domain), or its share of the spread rounds (a
 * stream sends one round in `phases`, a wide one every round) when that
 * is larger, never above options.chunk_bytes or an int's count. With a
 * pace (plan->pace): a stream inside a domain takes at least, and a wide
 * or free (kind RS_PACE_FREE) network stream at most, what finishes it
 * within the horizon (rs_pace_rounds), never above c; in a plan without
 * network streams, a stream inside takes at most that. Free and inside-
 * only paced messages are not cut under RS_RELAY_MIN_PART_DEFAULT. */
uint64_t rs_chunk_cap(const reshard_plan_t *plan, uint64_t chunk, uint64_t bytes, int kind);

/* rs_chunk_limit on sized streams, stream i in phase[i] (NULL: all in
 * phase 0) of plan->phases; sums: 2 x plan->phases scratch. */
uint64_t rs_streams_limit(const reshard_plan_t *plan, const rs_streams *st, const int32_t *phase, uint64_t half,
                          uint64_t *sums);

/* The largest chunk (a multiple of 64) at which every round of this
 * rank's streams fits `half` staging bytes: a stream has at most one
 * message per round, of at most min(its bytes, its cap), the cap being
 * the chunk or, inside a domain, the chunk / plan->domain_div; so a round
 * holds at most the sum over streams of min(bytes, cap), which must not
 * exceed half. With phases, the send half and the receive half are each
 * their direction's busiest phase, so the sum is that of the busiest
 * send phase's streams plus the busiest receive phase's, each with the
 * wide streams of its direction (in every phase). UINT64_MAX when
 * all the streams fit at once; 0 when even 64-byte messages would not
 * fit. */
reshard_result_t rs_chunk_limit(const reshard_plan_t *plan, rs_seg_vec *segs,
                                uint64_t half, uint64_t *out);

/* For the single-process planning tools (bench/), which plan every rank
 * of a job in turn against a fake communicator whose allreduce returns
 * the rank's own values: plan creation takes this spread (when
 * set_spread) and chunk (when set_chunk) instead of the agreed ones, so
 * that the tools reproduce the plans of a real run: the largest spread of
 * all ranks, then the smallest chunk the ranks size with that spread.
 * Per thread; never set by the library itself. */
/* A plan's first stage: what this rank sends, receives and forwards
 * (segments, relay groups already ordinals) and its local copies, before
 * any agreement, with what it brings to the agreement. The expensive
 * part of planning (replica choice, relay trees); what follows (the
 * agreed chunk, the cut into rounds) is cheap beside it. */
typedef struct rs_plan_stage {
  rs_seg_vec segs;
  rs_copy *locals;
  rs_vbox *local_vbox; /* verify mode, parallel to locals; else NULL */
  size_t nlocals;
  int32_t spread;
  uint64_t phase_est[RS_PHASE_CANDIDATES];
  rs_pace pace_cand[RS_WIDE_CANDIDATES];
  uint64_t digest; /* of the layouts and options (the agreement's) */
} rs_plan_stage;
void rs_plan_stage_free(rs_plan_stage *s);

/* Where plan creation stops for the tools (rs_plan_agreed.stop). */
enum {
  RS_PLAN_STOP_NONE = 0,
  /* after the first stage: the plan has spread_rounds, phase_est and
   * pace_cand (this rank's own) and nothing else; no agreement ran */
  RS_PLAN_STOP_STAGE,
  /* after the chunk agreement: the plan has chunk_bytes (this rank's,
   * against the fake communicator) too, but no messages */
  RS_PLAN_STOP_CHUNK
};

typedef struct rs_plan_agreed {
  int set_spread, set_chunk, set_phases;
  int32_t spread;
  size_t chunk;
  int32_t phases;
  uint64_t wide; /* with set_phases: wide_bytes */
  rs_pace pace;  /* with set_phases: plan->pace */
  /* A tool plans each rank several times (to learn what the ranks agree
   * on, then with it); these let it compute the first stage once:
   * with stop RS_PLAN_STOP_STAGE, keep (non-NULL) receives the rank's
   * first stage, moved out of the creation; use (non-NULL) is moved into
   * a later creation instead of computing the first stage (and its
   * layout checks, which the creation that kept it ran), and is left
   * empty; the options must be the same. stop: RS_PLAN_STOP_*; a plan
   * stopped early serves only to read those fields and to be destroyed.
   * Not with options.relay -1 and a topology, where a creation builds
   * two plans. */
  int stop;
  rs_plan_stage *keep, *use;
  /* With use: where the creation hands use's segment memory when it ends
   * (the vector emptied, its capacity kept) instead of freeing it, so
   * that a tool decodes the next rank's stage into memory it has already
   * touched (a vector of hundreds of MiB, grown by doubling, is copied
   * and faulted in again otherwise). May be use itself. With keep: the
   * creation builds its segments in back's segment memory (taken, and
   * moved to keep with the stage). */
  rs_plan_stage *back;
  /* A tool that plans every rank of one job in one process does the
   * work that is the same for all of them once: covered (non-zero) says
   * both layouts passed rs_layout_check_coverage, which the creation
   * then skips; digest (non-zero) is the creation digest of these
   * layouts and options (rs_plan_stage.digest of an earlier creation). */
  int covered;
  uint64_t digest;
  /* With stop RS_PLAN_STOP_STAGE, keep and a direct plan (relay 0, no
   * RESHARD_FLAG_FIRST_REPLICA): twin (non-NULL) receives the first stage
   * the same creation with RESHARD_FLAG_FIRST_REPLICA would keep (the
   * replica0 baseline), its pieces assigned right after this plan's, box
   * by box, from the same prepared holders; twin_digest, when non-zero,
   * is its creation digest. */
  rs_plan_stage *twin;
  uint64_t twin_digest;
} rs_plan_agreed;
#ifndef __cplusplus /* the CUDA tests include this header; they never use it */
extern _Thread_local rs_plan_agreed rs_plan_force;
#endif

/* This rank's spread (plan.h spread_rounds): the fewest rounds over which
 * its streams, each at bytes / rounds per round, fit `share` staging
 * bytes per round: ceil(total / share), at least 1. */
int32_t rs_chunk_spread(const rs_streams *st, uint64_t share);

/* The chunk for a limit (rs_chunk_limit's, or the agreed smallest): at
 * most half the staging and options.chunk_bytes, a multiple of 64 that an
 * int counts, at least 64. */
size_t rs_chunk_bound(const reshard_options_t *o, uint64_t limit);

/* The staging bytes (2 x (busiest send round + busiest receive round))
 * this rank's plan would use when cut with `chunk`: the cut itself, on
 * scratch arrays. */
reshard_result_t rs_chunk_staging(const reshard_plan_t *plan, rs_seg_vec *segs,
                                  size_t chunk, uint64_t *staging);

/* Byte offset of element `start` (tensor coordinates) of fragment f. */
uint64_t rs_frag_offset_of(const rs_frag *f, const int64_t *start,
                           size_t esize);

/* reshard_plan_create (src/plan/create.c) with its executor chosen: the
 * front door (src/api/create.c) picks it from the communicator's kind, so
 * that the planner names no executor. */
reshard_result_t rs_plan_create(reshard_comm_t *comm, const rs_executor *ex, const reshard_layout_t *src,
                                const reshard_layout_t *dst, const reshard_options_t *options, reshard_plan_t **out);

#endif
