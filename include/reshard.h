/*
 * reshard: move sharded model weights from one parallel layout to another.
 *
 * Copyright (c) 2026, the reshard authors. BSD-3-Clause (see LICENSE).
 *
 * The whole public C API. Usage in five lines:
 *
 *   reshard_layout_t *src, *dst;      describe both sides (every rank
 *                                     describes the same global picture)
 *   reshard_plan_create(comm, src, dst, &opts, &plan);   once, collective
 *   reshard_plan_execute(plan, src_ptrs, nsrc, dst_ptrs, ndst, NULL);  every step
 *   reshard_plan_destroy(plan);
 *
 * Concepts (see docs/ARCHITECTURE.md):
 *   - a logical tensor is a named global array (dtype, up to 8 dims);
 *   - a mesh is a grid of communicator ranks;
 *   - a placement says, per mesh axis, whether the tensor is replicated along
 *     it or sharded along one of its dims (DTensor vocabulary);
 *   - a buffer is the memory a rank hands us a pointer to at execute time;
 *     it holds one or several fragments (boxes of logical tensors);
 *   - a plan is this rank's precomputed list of messages and copies.
 *
 * All functions return a reshard_result_t; on failure, reshard_last_error()
 * says which tensor, rank and field were at fault, and nothing was changed.
 */
#ifndef RESHARD_H
#define RESHARD_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------------ */
/* Versions                                                            */
/* ------------------------------------------------------------------ */

/* The one place the version is written (CMake, pyproject.toml and the
 * Python package read it from here). */
#define RESHARD_VERSION_MAJOR 0
#define RESHARD_VERSION_MINOR 1
#define RESHARD_VERSION_PATCH 0
#define RESHARD_VERSION_CODE(major, minor, patch) \
  ((major) * 10000 + (minor) * 100 + (patch))
#define RESHARD_VERSION \
  RESHARD_VERSION_CODE(RESHARD_VERSION_MAJOR, RESHARD_VERSION_MINOR, \
                       RESHARD_VERSION_PATCH)

/* The version of the library actually linked, as RESHARD_VERSION_CODE. */
int reshard_version(void);

/* ------------------------------------------------------------------ */
/* Results and errors                                                  */
/* ------------------------------------------------------------------ */

typedef enum reshard_result {
  RESHARD_SUCCESS = 0,
  /* An argument is malformed (NULL, negative, out of range, overflowing). */
  RESHARD_ERROR_INVALID_ARGUMENT = 1,
  /* Arguments are well formed but the call is not allowed in this state
   * (e.g. executing a plan that failed, wrong buffer count). */
  RESHARD_ERROR_INVALID_USAGE = 2,
  RESHARD_ERROR_OUT_OF_MEMORY = 3,
  /* Ranks disagree: different global descriptions or plans. */
  RESHARD_ERROR_MISMATCH = 4,
  /* The transport (MPI, NCCL, CUDA) reported an error on this rank. */
  RESHARD_ERROR_BACKEND = 5,
  /* Another rank failed; this rank stopped without changing its buffers
   * beyond what reshard_last_error() reports. */
  RESHARD_ERROR_REMOTE = 6,
  /* A wait passed its deadline (options.timeout_ms). */
  RESHARD_ERROR_TIMEOUT = 7,
  /* A valid request that this build or version cannot serve. */
  RESHARD_ERROR_UNSUPPORTED = 8,
  /* A bug in reshard: please report it with reshard_last_error(). */
  RESHARD_ERROR_INTERNAL = 9,
  /* RESHARD_FLAG_DOUBLE_BUFFER: this rank voted to commit the execute's
   * version and could not learn before the deadline whether every rank
   * did. Nothing flipped here; both copies are kept. The version is
   * settled by reshard_plan_resolve or at the plan's next execute (see
   * docs/RELIABILITY.md, "The commit protocol"). */
  RESHARD_ERROR_IN_DOUBT = 10,
  RESHARD_NUM_RESULTS = 11
} reshard_result_t;

/* A fixed string for each result, saying what to do next. Never NULL. */
const char *reshard_result_string(reshard_result_t result);

/* Detail of the last failure on the calling thread ("" if none). The text
 * names the tensor, rank and field at fault. Valid until the next reshard
 * call on this thread. */
const char *reshard_last_error(void);

/* ------------------------------------------------------------------ */
/* Data types                                                          */
/* ------------------------------------------------------------------ */

typedef enum reshard_dtype {
  RESHARD_BF16 = 0,
  RESHARD_FP16 = 1,
  RESHARD_FP32 = 2,
  RESHARD_FP64 = 3,
  RESHARD_FP8_E4M3 = 4,
  RESHARD_FP8_E5M2 = 5,
  RESHARD_INT8 = 6,
  RESHARD_UINT8 = 7,
  RESHARD_INT32 = 8,
  RESHARD_UINT32 = 9,
  RESHARD_INT64 = 10,
  RESHARD_UINT64 = 11,
  RESHARD_BOOL = 12, /* one byte per element */
  RESHARD_NUM_DTYPES = 13
} reshard_dtype_t;

/* Bytes per element; 0 for an invalid dtype. */
size_t reshard_dtype_size(reshard_dtype_t dtype);
/* Short name ("bf16", "f32", ...); "invalid" for an invalid dtype. */
const char *reshard_dtype_name(reshard_dtype_t dtype);

/* ------------------------------------------------------------------ */
/* Layouts: one side's description                                     */
/* ------------------------------------------------------------------ */

#define RESHARD_MAX_DIMS 8      /* tensor dims */
#define RESHARD_MAX_MESH_DIMS 8 /* mesh axes */

/* One side (source or destination) of a reshard: its logical tensors, its
 * meshes and the buffers that hold the tensors' fragments. Every rank of the
 * communicator builds the same two layouts (the global description); ranks
 * that disagree get RESHARD_ERROR_MISMATCH from reshard_plan_create. */
typedef struct reshard_layout reshard_layout_t;

reshard_result_t reshard_layout_create(reshard_layout_t **layout);
void reshard_layout_destroy(reshard_layout_t *layout); /* NULL is a no-op */

/* Declares a logical tensor. Names are unique within a layout and match
 * tensors across the two sides. 0 <= ndim <= RESHARD_MAX_DIMS, shape[i] >= 0,
 * and the byte size must fit in int64. *tensor_id receives a dense index
 * (0, 1, ...). */
reshard_result_t reshard_layout_add_tensor(reshard_layout_t *layout,
                                           const char *name,
                                           reshard_dtype_t dtype, int ndim,
                                           const int64_t *shape,
                                           int *tensor_id);

/* Declares an fp8 weight quantized in blocks (issue 19), as DeepSeek-V3's
 * and Kimi-K2's fp8 checkpoints and vLLM's block-fp8 linear layers hold
 * it: `name` (dtype RESHARD_FP8_E4M3, ndim >= 2) and beside it the f32
 * tensor `<name>_scale_inv` (its weight_scale_inv), of the same shape
 * but for the last two dims, ceil(shape / block) (block = {rows, cols},
 * e.g. {128, 128}): one scale per block, blocks counted from the origin,
 * the last ones ragged. *tensor_id receives the weight's id; the scale
 * tensor's follows it (reshard_layout_find_tensor or
 * reshard_layout_tensor_block). Both are placed like any tensor (vLLM
 * splits the scales like their weight).
 *
 * When the destination declares a weight this way and the source holds
 * it in a wider float dtype (bf16, f16, f32; no scale tensor), the plan
 * quantizes on the source ranks and sends fp8 codes and scales: for each
 * block of the global tensor, over its elements read as f32,
 * amax = max(max |x|, 1e-4), code = e4m3fn(x * (448 / amax)) (the factor
 * and the product in f32, round to nearest even), scale = amax / 448
 * (DeepSeek's per_block_cast_to_fp8). A block holding a NaN has a NaN
 * scale and every code 0x7f; a block whose amax is infinite has the
 * factor 0, so its finite elements' codes are signed zeros and its infinities'
 * 0x7f (NaN), on hosts and GPUs alike. A block held whole by a source rank
 * is quantized there (by each replica: the planner then picks among
 * them); a block split across source ranks is first gathered, in the
 * source dtype, to the rank that holds most of it (only blocks some
 * destination rank needs). Each source rank keeps a scratch of its codes
 * and scales. On device transports (NCCL, CUDA IPC) the scratch is device
 * memory and a kernel quantizes at the start of each execute, in stream
 * order on the caller's stream; reshard_plan_register_buffers (CUDA IPC)
 * registers the scratch along with the caller's buffers.
 * When both sides declare it blocked (same block), codes and scales
 * move as they are. */
reshard_result_t reshard_layout_add_tensor_blocked(reshard_layout_t *layout,
                                                   const char *name,
                                                   reshard_dtype_t dtype,
                                                   int ndim,
                                                   const int64_t *shape,
                                                   const int64_t *block,
                                                   int *tensor_id);

/* A tensor's block ({0, 0} and *scale_id -1 unless it was declared by
 * reshard_layout_add_tensor_blocked); outputs may be NULL. */
reshard_result_t reshard_layout_tensor_block(const reshard_layout_t *layout,
                                             int tensor_id, int64_t *block,
                                             int *scale_id);

/* By default every tensor declared on a side must be held whole by that
 * side's buffers, so that a destination tensor declared but placed nowhere
 * (or only in part) fails plan creation with RESHARD_ERROR_INVALID_ARGUMENT
 * naming it and a box no rank holds, instead of going silently undelivered.
 * This marks tensor_id as one the side may hold only part of, or none of
 * (a tensor the inference engine does not load, a slice a rank needs). */
reshard_result_t reshard_layout_allow_partial(reshard_layout_t *layout,
                                              int tensor_id);

/* Looks a tensor up by name; RESHARD_ERROR_INVALID_ARGUMENT if absent. */
reshard_result_t reshard_layout_find_tensor(const reshard_layout_t *layout,
                                            const char *name, int *tensor_id);

/* Number of tensors declared (ids are 0 .. n-1). */
int reshard_layout_num_tensors(const reshard_layout_t *layout);

/* A tensor's name (owned by the layout), dtype, ndim and shape (up to
 * RESHARD_MAX_DIMS entries written); any output may be NULL. */
reshard_result_t reshard_layout_tensor_info(const reshard_layout_t *layout,
                                            int tensor_id, const char **name,
                                            reshard_dtype_t *dtype, int *ndim,
                                            int64_t *shape);

/* Declares a mesh: an ndim-dimensional grid (row-major, last axis fastest)
 * of communicator ranks. ranks lists shape[0]*...*shape[ndim-1] ranks; a
 * rank appears at most once in a mesh. A side may have several meshes
 * (pipeline stages, or different grids over the same ranks). */
reshard_result_t reshard_layout_add_mesh(reshard_layout_t *layout, int ndim,
                                         const int *shape, const int *ranks,
                                         int *mesh_id);

/* The same with ranks start, start+stride, start+2*stride, ... */
reshard_result_t reshard_layout_add_mesh_strided(reshard_layout_t *layout,
                                                 int ndim, const int *shape,
                                                 int start, int stride,
                                                 int *mesh_id);

typedef enum reshard_placement_kind {
  RESHARD_PLACEMENT_REPLICATE = 0,
  RESHARD_PLACEMENT_SHARD = 1
} reshard_placement_kind_t;

/* How a tensor lies along one mesh axis. Shard(dim) splits the current
 * extent of dim into as many pieces as the axis has ranks: evenly with
 * torch.chunk semantics (pieces of ceil(n/k), the last ones smaller or
 * empty) when split_sizes is NULL, or with the given sizes (one per rank of
 * the axis, summing to the extent). Axes apply in mesh order, so several
 * axes may shard the same dim (the later axis splits the earlier one's
 * piece: TP x EP) or different dims (2-D sharding). */
typedef struct reshard_placement {
  reshard_placement_kind_t kind;
  int dim;
  const int64_t *split_sizes;
} reshard_placement_t;

static inline reshard_placement_t reshard_replicate(void) {
  reshard_placement_t p = {RESHARD_PLACEMENT_REPLICATE, 0, NULL};
  return p;
}
static inline reshard_placement_t reshard_shard(int dim) {
  reshard_placement_t p = {RESHARD_PLACEMENT_SHARD, dim, NULL};
  return p;
}
static inline reshard_placement_t reshard_shard_sizes(int dim,
                                                      const int64_t *sizes) {
  reshard_placement_t p = {RESHARD_PLACEMENT_SHARD, dim, sizes};
  return p;
}

/* The simplest buffer: every rank of the mesh holds its piece of the tensor
 * in a buffer of its own, dense and row-major. placements has one entry per
 * mesh axis. *buffer_id receives the buffer's index in this layout. */
reshard_result_t reshard_layout_place(reshard_layout_t *layout, int tensor_id,
                                      int mesh_id,
                                      const reshard_placement_t *placements,
                                      int *buffer_id);

/* reshard_layout_place with the buffer's name (NULL: the tensor's), e.g.
 * the framework's parameter name, for reshard_layout_find_buffer. */
reshard_result_t reshard_layout_place_named(reshard_layout_t *layout,
                                            const char *name, int tensor_id,
                                            int mesh_id,
                                            const reshard_placement_t *placements,
                                            int *buffer_id);

/* One tensor's share of a fused buffer. */
typedef struct reshard_part {
  int tensor_id;
  int mesh_id; /* the part's own grid; may differ from its siblings', e.g.
                  vLLM K/V on [kv_heads, tp/kv_heads] with (Shard(0), R) when
                  tp > kv_heads while Q uses [tp] with Shard(0) */
  const reshard_placement_t *placements; /* one per axis of mesh_id */
  /* NULL, or the padded shape the placements split (>= the tensor's shape,
   * e.g. a vocabulary padded to a multiple of 64): elements past the real
   * shape occupy buffer space but belong to no tensor and are never
   * written. */
  const int64_t *padded_shape;
} reshard_part_t;

/* A buffer holding several tensors' pieces, fused along concat_dim:
 *   num_groups == 1: each rank's buffer is the concatenation along
 *     concat_dim of its pieces of parts[0], parts[1], ... (vLLM qkv_proj,
 *     gate_up_proj). Ranks outside a part's mesh hold nothing of it.
 *   num_groups  > 1: each part's concat_dim is num_groups equal blocks; the
 *     placements' Shard(concat_dim) split the groups (not elements), and
 *     each rank's buffer holds, for each of its groups g in order, the
 *     block g of every part (Megatron fused QKV with GQA: [q of g, k of g,
 *     v of g] per KV group). All parts must then share one grid of groups.
 * Dims other than concat_dim must have equal local extents in all parts. */
reshard_result_t reshard_layout_add_fused(reshard_layout_t *layout,
                                          const char *name, int concat_dim,
                                          int num_groups, int num_parts,
                                          const reshard_part_t *parts,
                                          int *buffer_id);

/* reshard_layout_add_fused (num_groups 1) where a part may hold a window
 * of its tensor instead of the whole tensor. origins has num_parts entries:
 * NULL for a whole tensor (as in reshard_layout_add_fused), or the window's
 * first element, one coordinate per tensor dim in [0, shape]. A windowed
 * part's padded_shape is the window's shape (NULL: up to the end of every
 * dim); its placements split the box [origin, origin + window shape), and
 * elements of that box past the tensor's shape are padding. A tensor may
 * appear in several parts of one buffer when no rank holds an element twice:
 * their windows are disjoint, or their meshes share no rank.
 *
 * Example, Megatron-core's grouped experts (TEGroupedMLP): parameter
 * decoder.layers.N.mlp.experts.linear_fc1.weight<i> is one tensor per
 * local expert i; on EP rank r it holds expert r * E/ep + i. Over stacked
 * gate and up tensors [E, I, H], that buffer is, for every EP rank r, the
 * parts (gate, r) and (up, r) on r's [expert-DP, ETP] mesh with placements
 * (Replicate, Shard(1)), origin (r * E/ep + i, 0, 0) and window shape
 * (1, I, H), concatenated along dim 1. */
reshard_result_t reshard_layout_add_windows(reshard_layout_t *layout,
                                            const char *name, int concat_dim,
                                            int num_parts,
                                            const reshard_part_t *parts,
                                            const int64_t *const *origins,
                                            int *buffer_id);

/* ---- Builders: the fused layouts of Megatron-core and vLLM from the
 * model's own numbers. They do the group arithmetic that a hand-written
 * reshard_layout_add_fused gets wrong without a trace (num_groups = query
 * heads instead of KV heads moves every byte, to the wrong place), and
 * refuse tensors whose shapes disagree with the numbers, naming the buffer,
 * tensor and field. reshard_layout_add_fused remains for everything else.
 *
 * Each builder places its parts on mesh_id with Shard on axis tp_axis (the
 * tensor-parallel axis; every other axis holds replicas, e.g. data
 * parallelism), or replicated on the whole mesh when tp_axis is -1. */

/* The Q, K and V projections of one attention layer (GQA, MQA or MHA):
 * tensor ids q [num_heads * head_dim, ...], k and v [num_kv_heads *
 * head_dim, ...], with equal trailing dims (weights [rows, hidden]; biases
 * [rows]). */
typedef struct reshard_attention {
  int q, k, v;
  int num_heads;    /* num_attention_heads */
  int num_kv_heads; /* num_key_value_heads (Megatron: num_query_groups) */
  int64_t head_dim; /* rows per head (Megatron: kv_channels) */
} reshard_attention_t;

/* Megatron-core's linear_qkv (megatron/core/transformer/attention.py,
 * SelfAttention.get_query_key_value_tensors): rows grouped per KV group,
 * [q of g (num_heads / num_kv_heads heads); k of g; v of g] for g = 0 ..
 * num_kv_heads - 1, split column-parallel so that each TP rank holds
 * num_kv_heads / tp whole groups. Needs num_heads % num_kv_heads == 0 and
 * num_kv_heads % tp == 0 (with fewer groups than ranks Megatron splits
 * the rows evenly and gathers them back in the forward: not modelled). */
reshard_result_t reshard_layout_add_megatron_qkv(reshard_layout_t *layout,
                                                 const char *name,
                                                 const reshard_attention_t *attn,
                                                 int mesh_id, int tp_axis,
                                                 int *buffer_id);

/* vLLM's qkv_proj (vllm/model_executor/layers/linear.py,
 * QKVParallelLinear): [q shard; k shard; v shard] on each TP rank, with
 * num_heads / tp query heads; when tp > num_kv_heads each KV head is
 * replicated on tp / num_kv_heads consecutive TP ranks (the rank holds KV
 * head tp_rank / (tp / num_kv_heads)), else each rank holds num_kv_heads /
 * tp of them. Needs tp | num_heads, and tp and num_kv_heads to divide one
 * another. With replication the builder adds a mesh to the layout (the TP
 * axis split into [num_kv_heads, tp / num_kv_heads], same ranks), or
 * reuses an identical one. */
reshard_result_t reshard_layout_add_vllm_qkv(reshard_layout_t *layout,
                                             const char *name,
                                             const reshard_attention_t *attn,
                                             int mesh_id, int tp_axis,
                                             int *buffer_id);

/* A gated MLP's [gate shard; up shard]: Megatron-core's linear_fc1 with
 * gated_linear_unit (megatron/core/transformer/mlp.py: the forward chunks
 * it in two) and vLLM's gate_up_proj (MergedColumnParallelLinear). gate
 * and up are tensor ids of one shape [intermediate, ...]; tp must divide
 * intermediate. */
reshard_result_t reshard_layout_add_gate_up(reshard_layout_t *layout,
                                            const char *name, int gate,
                                            int up, int mesh_id, int tp_axis,
                                            int *buffer_id);

/* The escape hatch: a raw buffer of `bytes` bytes on one rank, filled by
 * explicit fragments. */
reshard_result_t reshard_layout_add_buffer(reshard_layout_t *layout,
                                           const char *name, int rank,
                                           size_t bytes, int *buffer_id);

/* An explicit fragment: the box [start, start+extent) of a tensor lies in
 * a raw buffer at byte_offset with the given element strides (NULL: dense
 * row-major). Fragments of a buffer must not overlap. */
typedef struct reshard_fragment {
  int tensor_id;
  int buffer_id;
  const int64_t *start;
  const int64_t *extent;
  size_t byte_offset;
  const int64_t *strides;
} reshard_fragment_t;

reshard_result_t reshard_layout_add_fragment(reshard_layout_t *layout,
                                             const reshard_fragment_t *frag);

/* Number of buffers in the layout: the length of the pointer arrays given
 * to reshard_plan_execute. */
int reshard_layout_num_buffers(const reshard_layout_t *layout);

/* A buffer's name (owned by the layout; the name given when it was added,
 * the tensor's for reshard_layout_place). */
reshard_result_t reshard_layout_buffer_name(const reshard_layout_t *layout,
                                            int buffer_id, const char **name);

/* The buffer named `name` that `rank` holds. Names need not be unique in a
 * layout (the model front-end names buffers as the framework names its
 * parameters, and Megatron numbers layers from 0 on every pipeline stage);
 * rank < 0: the only buffer of that name. RESHARD_ERROR_INVALID_ARGUMENT
 * naming the buffer and rank when there is none, or several (two that the
 * rank holds, or several names with rank < 0: give names a rank can tell
 * apart). */
reshard_result_t reshard_layout_find_buffer(const reshard_layout_t *layout,
                                            const char *name, int rank,
                                            int *buffer_id);

/* A mesh's shape: *ndim axes in shape[0 .. *ndim) (room for
 * RESHARD_MAX_MESH_DIMS). */
reshard_result_t reshard_layout_mesh_shape(const reshard_layout_t *layout,
                                           int mesh_id, int *ndim, int *shape);

/* Bytes of buffer_id on rank (0 when that rank holds no part of it). */
reshard_result_t reshard_layout_buffer_bytes(const reshard_layout_t *layout,
                                             int buffer_id, int rank,
                                             size_t *bytes);

/* A lowered fragment, for introspection and tests. */
typedef struct reshard_fragment_info {
  int tensor_id;
  int buffer_id;
  int ndim;
  int64_t start[RESHARD_MAX_DIMS];
  int64_t extent[RESHARD_MAX_DIMS];
  int64_t strides[RESHARD_MAX_DIMS]; /* elements */
  size_t byte_offset;
} reshard_fragment_info_t;

/* The fragments rank holds, in canonical order (buffer, then position in
 * the buffer). Writes at most capacity entries to out (which may be NULL
 * when capacity is 0) and the total count to *count. Empty fragments
 * (zero elements) are omitted. */
reshard_result_t reshard_layout_fragments(const reshard_layout_t *layout,
                                          int rank,
                                          reshard_fragment_info_t *out,
                                          size_t capacity, size_t *count);

/* ------------------------------------------------------------------ */
/* Communicators                                                       */
/* ------------------------------------------------------------------ */

/* A communicator holding both sides' ranks (they may overlap: colocated).
 * Created by a transport: in-process (reshard_inproc.h), MPI, UCX, NCCL
 * or CUDA IPC. */
typedef struct reshard_comm reshard_comm_t;

int reshard_comm_rank(const reshard_comm_t *comm);
int reshard_comm_size(const reshard_comm_t *comm);
void reshard_comm_destroy(reshard_comm_t *comm); /* NULL is a no-op */

/* The in-process transport (ranks as threads of one process) is in
 * reshard_inproc.h. */

/* ------------------------------------------------------------------ */
/* Options                                                             */
/* ------------------------------------------------------------------ */

#define RESHARD_OPTIONS_VERSION 2

/* Plan options. Always start from RESHARD_OPTIONS_INITIALIZER so that
 * fields added later get their defaults; struct_size and version let the
 * library reject (or adapt to) a caller built against another header.
 * staging_bytes and chunk_bytes must be the same on all ranks (they are part
 * of the plan digest); timeout_ms may differ. */
typedef struct reshard_options {
  uint32_t struct_size; /* sizeof(reshard_options_t) */
  uint32_t version;     /* RESHARD_OPTIONS_VERSION */
  /* Staging memory per rank for packed messages, send and receive, double
   * buffered. Bounds every message: the bound is the largest size at
   * which every rank's streams (one per peer in a direct plan, plus relay
   * streams), each sending at most min(its bytes, the bound) per round,
   * fit staging_bytes / 2, or a larger size at which the actual cut of
   * every rank still fits staging_bytes; never below 64 bytes, so a budget
   * under 128 bytes per stream can be exceeded. Default 256 MiB; minimum
   * 4096. */
  size_t staging_bytes;
  /* Upper bound on one message (one stream, one chunk); 0: derived from
   * the staging budget as above. */
  size_t chunk_bytes;
  /* Deadline of every wait, in milliseconds, >= 1: there is no "wait
   * forever" (0 and negative values are RESHARD_ERROR_INVALID_ARGUMENT at
   * plan creation). Default 60000. */
  int64_t timeout_ms;
  /* ---- version 2 ---- */
  /* The machine, for replica choice, relays and the cost model: a preset
   * name ("h100-8x400g", "gb200-nvl72", "flat": one GPU per node behind its
   * own 400 Gb/s NIC, no NVLink; "cpu") or NULL for none.
   * RESHARD_TOPOLOGY overrides it. Same on all ranks (part of the digest). */
  const char *topology;
  /* Relays between destination replicas: -1 (default) with a topology
   * builds the direct and the relay plan and keeps the one the cost model
   * predicts faster (without a topology: direct), 0 never, 1 whenever destination
   * replicas need the same bytes: each destination fragment held with the
   * same box by m >= 2 ranks (none of which holds its source data, and
   * each part at least 256 KiB) is split into m parts, the source side
   * sends each part to one replica and the replicas forward to each other,
   * entering each NVLink domain of the topology once. Every transport
   * relays (on NCCL the forwards leave the destination buffers on the
   * GPU). Stats count forwards in send_bytes and recv_bytes. RESHARD_RELAY
   * overrides it. */
  int relay;
  /* RESHARD_FLAG_* bits; 0 by default. */
  uint32_t flags;
} reshard_options_t;

/* options.flags bits. */
/* Double-buffered destinations with an atomic commit. dst_buffers then has
 * 2 * num_dst_buffers entries: copy 0 of every destination buffer (indexed
 * by buffer id), then copy 1 (num_dst = 2 * the layout's count). Each
 * execute writes only into the inactive copy (copy 0 at the first execute)
 * and, after the transfer, every rank of the communicator agrees (an
 * allreduce with the deadline) before the copies flip: the inactive copy
 * becomes active and the committed version advances only if every rank
 * succeeded. After any failure the active copy still holds the previously
 * committed version, untouched. Every rank of the communicator must call
 * each execute (ranks without traffic too).
 * On device transports the commit is stream-ordered: the copy to write is
 * chosen on the GPU, and after the call's last write every rank's verdict
 * is max-reduced on the GPU (8 bytes) and the copies flip there;
 * reshard_plan_get_status reports the committed version and the active
 * copy once the GPU has done that (after the stream completed, or with
 * RESHARD_FLAG_SYNC). reshard_plan_get_status says which copy is active. */
#define RESHARD_FLAG_DOUBLE_BUFFER 0x1u
/* End-to-end integrity check. For every box that crosses the network (and
 * every local copy) both ends checksum the elements: per box, the sum mod
 * 2^64 over its elements of a hash of (tensor, global linear element
 * index, element bytes), the sender over its source buffer, the receiver
 * over its destination buffer after the data landed. Senders ship their
 * sums in a small extra message per message. A difference is
 * RESHARD_ERROR_MISMATCH naming the tensor, the peer and the box, so it
 * catches corrupted bytes and elements written at the wrong coordinates.
 * Costs one more read of every element on both sides (see reshard_perf
 * --verify). On device transports (NCCL, CUDA IPC) the sums are kernels
 * on both sides and the comparison runs on the GPU after the call's last
 * transfer: the mismatch comes from the next execute or
 * reshard_plan_get_status (or the call itself with RESHARD_FLAG_SYNC),
 * and every later call writes nothing. Not with registered buffers
 * (UNSUPPORTED). */
#define RESHARD_FLAG_VERIFY 0x2u
/* Every cell a destination rank needs (and does not hold itself) comes
 * from the first source replica holding it (lowest rank) instead of being
 * split evenly across all of them: the "direct P2P from replica 0"
 * baseline, for comparisons (reshard_plan --topology prices it). */
#define RESHARD_FLAG_FIRST_REPLICA 0x4u
/* Device transports: execute returns only when its work is done (or its
 * deadline passed), with the call's own result: RESHARD_ERROR_MISMATCH
 * when the agreement with a partner failed (nothing was written), TIMEOUT
 * past the deadline. Without it an execute returns once enqueued and such
 * results come from the next execute or reshard_plan_get_status. Costs a
 * host wait per execute (polled). Host transports: no effect (their
 * executes always return the call's result). */
#define RESHARD_FLAG_SYNC 0x8u
/* Source-side spreading (plans with a topology, host and device
 * transports): where some source ranks of an NVLink domain send far more
 * out of the domain than the others (an MoE layer whose experts have one
 * replica), plan creation copies slices of their sole-held data over
 * NVLink to the domain's less busy ranks first (into scratch memory
 * there: device memory on device transports), and those send them on,
 * when the cost model predicts that faster (docs/TUNING.md, "Source-side
 * spreading"). This flag turns it off (RESHARD_SPREAD=0 in the
 * environment sets it). */
#define RESHARD_FLAG_NO_SPREAD 0x10u
/* Keeps the spread plan wherever some rank is over its domain's mean,
 * whatever the cost model predicts (tests and comparisons;
 * RESHARD_SPREAD=2). Not with RESHARD_FLAG_NO_SPREAD. */
#define RESHARD_FLAG_SPREAD_ALWAYS 0x20u

#define RESHARD_OPTIONS_INITIALIZER \
  {sizeof(reshard_options_t), RESHARD_OPTIONS_VERSION, (size_t)256 << 20, 0, \
   60000, NULL, -1, 0}

/* ------------------------------------------------------------------ */
/* Plans                                                               */
/* ------------------------------------------------------------------ */

typedef struct reshard_plan reshard_plan_t;

/* Collective over comm: every rank calls it with the same layouts and
 * options. Validates the description, compares a digest of it across ranks
 * (RESHARD_ERROR_MISMATCH on every rank if any two differ) and computes this
 * rank's messages and local copies. The layouts may be destroyed afterwards;
 * comm must outlive the plan. */
reshard_result_t reshard_plan_create(reshard_comm_t *comm,
                                     const reshard_layout_t *src,
                                     const reshard_layout_t *dst,
                                     const reshard_options_t *options,
                                     reshard_plan_t **plan);

#define RESHARD_EXECUTE_ARGS_VERSION 1

/* A buffer and its size in bytes (reshard_execute_args_t's src and dst). */
typedef struct reshard_buffer {
  void *ptr;
  size_t bytes;
} reshard_buffer_t;

/* The arguments of one execute. Always start from
 * RESHARD_EXECUTE_ARGS_INITIALIZER so that fields added later get their
 * defaults; struct_size and version let the library reject (or adapt to)
 * a caller built against another header, as for reshard_options_t. */
typedef struct reshard_execute_args {
  uint32_t struct_size; /* sizeof(reshard_execute_args_t) */
  uint32_t version;     /* RESHARD_EXECUTE_ARGS_VERSION */
  uint32_t flags;       /* RESHARD_EXECUTE_FLAG_* bits; 0 by default */
  /* The call's weight version, read with
   * RESHARD_EXECUTE_FLAG_EXPLICIT_VERSION only. */
  uint64_t weight_version;
  /* This rank's buffers with their sizes, indexed by buffer id: num_src
   * entries for the source layout's buffers, num_dst for the
   * destination's (2 * its count with RESHARD_FLAG_DOUBLE_BUFFER: copy 0
   * of every buffer, then copy 1). Entries of buffers this rank does not
   * hold are ignored and may be {NULL, 0}; a rank on one side only may
   * pass NULL, 0 for the other. Before anything moves, every buffer the
   * plan reads or writes here is checked to be at least as large as the
   * layout makes it on this rank (reshard_layout_buffer_bytes), else
   * RESHARD_ERROR_INVALID_ARGUMENT names the side, the buffer id and
   * name, and both sizes; a count the layout cannot have is
   * RESHARD_ERROR_INVALID_USAGE, the arrays read no further than it. */
  const reshard_buffer_t *src;
  size_t num_src;
  const reshard_buffer_t *dst;
  size_t num_dst;
  /* With RESHARD_EXECUTE_FLAG_UNSIZED: bare pointers instead of src and
   * dst (which must then be NULL), num_src / num_dst entries, sizes
   * unknown and unchecked (a short buffer faults inside the transport).
   * Without the flag both must be NULL. */
  void *const *src_ptrs;
  void *const *dst_ptrs;
  /* The CUDA stream for device transports; NULL on host transports. */
  void *stream;
} reshard_execute_args_t;

/* reshard_execute_args_t.flags bits. */
/* weight_version is the call's weight version (e.g. the training step):
 * every rank passes the same version for the same step, and the
 * agreement headers check it, so a rank that skipped a step (or is at
 * another one) fails with RESHARD_ERROR_MISMATCH instead of mixing
 * steps. Without it the version is the previous call's + 1 (1 for the
 * first): calls are numbered, which cannot tell a skipped step. Versions
 * need not be consecutive. On success the version becomes the plan's
 * committed version (reshard_plan_get_status). On device transports the
 * headers are checked on the device (no host wait): the version is
 * recorded when the work is enqueued, and a mismatch is reported by the
 * next execute or reshard_plan_get_status (see reshard_nccl.h); no
 * destination byte of the mismatched call is written. */
#define RESHARD_EXECUTE_FLAG_EXPLICIT_VERSION 0x1u
/* src_ptrs and dst_ptrs instead of src and dst (sizes unknown). */
#define RESHARD_EXECUTE_FLAG_UNSIZED 0x2u

#define RESHARD_EXECUTE_ARGS_INITIALIZER \
  {sizeof(reshard_execute_args_t), RESHARD_EXECUTE_ARGS_VERSION, 0, 0, \
   NULL, 0, NULL, 0, NULL, NULL, NULL}

/* The execute: every form below is a thin wrapper over it.
 * Collective over the ranks that exchange data with this one. Moves every
 * destination fragment's elements from the source buffers (args: see
 * reshard_execute_args_t). Bytes of destination buffers outside fragments
 * (padding, other data) are never written. Destination buffers (and, with
 * RESHARD_FLAG_DOUBLE_BUFFER, their copies) must not share memory, each
 * taken as large as the layout makes it on this rank: such a call is
 * refused (RESHARD_ERROR_INVALID_ARGUMENT naming both buffers). Does not
 * modify the plan: the same plan serves every step.
 * args that cannot be read as a call (args NULL; struct_size or version
 * not one this library knows; flags bits it does not know; src / dst and
 * src_ptrs / dst_ptrs given against RESHARD_EXECUTE_FLAG_UNSIZED) are
 * RESHARD_ERROR_INVALID_ARGUMENT naming this rank and the field, and
 * change nothing: the call is not made (no call number or version is
 * used, the plan stays as it was, no partner is told: theirs waits for
 * this rank's next call, or reshard_plan_execute_refused to fail it at
 * once).
 * Calls of one plan (execute in any form, reshard_plan_resolve) must not
 * overlap: a call made while another thread of this rank is inside one
 * returns RESHARD_ERROR_INVALID_USAGE at once and changes nothing (the
 * running call goes on, the plan stays usable), since two calls in flight
 * would pair with the partners' calls in whatever order the threads ran.
 * Different plans may run concurrently. Each call is numbered, so
 * messages of a call that failed never match a later one (on NCCL, which
 * has no tags, a failed call aborts reshard's private communicator
 * instead: see reshard_nccl.h). On host transports a call this rank
 * rejects (its buffers, its staging memory) writes nothing but still
 * takes its place: its partners fail with RESHARD_ERROR_REMOTE naming
 * this rank and why, and the plan fails on every rank (see
 * reshard_plan_get_status); with no partners and no double buffering it
 * returns and the plan stays usable. */
reshard_result_t reshard_plan_execute_args(const reshard_plan_t *plan,
                                           const reshard_execute_args_t *args);

/* The older forms, kept for compatibility: each builds its
 * reshard_execute_args_t and calls reshard_plan_execute_args, nothing
 * else. */

/* Bare pointers, versions numbered by the plan:
 * flags RESHARD_EXECUTE_FLAG_UNSIZED, src_ptrs = src_buffers,
 * dst_ptrs = dst_buffers. */
reshard_result_t reshard_plan_execute(const reshard_plan_t *plan,
                                      void *const *src_buffers,
                                      size_t num_src,
                                      void *const *dst_buffers,
                                      size_t num_dst, void *stream);

/* Bare pointers and an explicit weight version: flags
 * RESHARD_EXECUTE_FLAG_UNSIZED | RESHARD_EXECUTE_FLAG_EXPLICIT_VERSION,
 * weight_version = version (0 included). */
reshard_result_t reshard_plan_execute_version(const reshard_plan_t *plan,
                                              uint64_t version,
                                              void *const *src_buffers,
                                              size_t num_src,
                                              void *const *dst_buffers,
                                              size_t num_dst, void *stream);

/* Sized buffers: src, dst as given; version > 0 is an explicit weight
 * version (RESHARD_EXECUTE_FLAG_EXPLICIT_VERSION), 0 the plan's next. */
reshard_result_t reshard_plan_execute_sized(const reshard_plan_t *plan,
                                            uint64_t version,
                                            const reshard_buffer_t *src,
                                            size_t num_src,
                                            const reshard_buffer_t *dst,
                                            size_t num_dst, void *stream);

/* For bindings that check their arguments before calling execute: this
 * rank refuses its next execute call, with why (an error result; SUCCESS
 * reads as RESHARD_ERROR_INVALID_ARGUMENT) and reason (the caller's
 * message, naming what is wrong). The call takes its place as an execute
 * whose arguments reshard refused would: nothing moves, and on host
 * transports its partners fail at once with RESHARD_ERROR_REMOTE naming
 * this rank and the reason, and the plan fails on every rank (with no
 * partners and no double buffering it returns and the plan stays
 * usable); on device transports the communicator is poisoned. version as
 * for reshard_plan_execute_sized (0: the next plain call). Returns why. */
reshard_result_t reshard_plan_execute_refused(const reshard_plan_t *plan,
                                              uint64_t version,
                                              reshard_result_t why,
                                              const char *reason);

/* What the executes of a plan did so far, on this rank. */
typedef struct reshard_plan_status {
  uint32_t struct_size;     /* set by the caller: sizeof(reshard_plan_status_t) */
  int failed;               /* an execute failed: the plan refuses executes */
  reshard_result_t failure; /* the first failure's result (SUCCESS if none) */
  uint64_t failed_call;     /* its call number (0-based) */
  uint64_t failed_version;  /* its weight version */
  const char *failure_message; /* why ("" if none); owned by the plan */
  uint64_t executes_completed; /* successful executes */
  uint64_t committed_version;  /* of the last successful execute; 0: none */
  /* RESHARD_FLAG_DOUBLE_BUFFER: the copy (0 or 1) holding the committed
   * version; -1 before the first commit and without the flag. */
  int active_copy;
  /* RESHARD_FLAG_DOUBLE_BUFFER: the version this rank reported
   * RESHARD_ERROR_IN_DOUBT for and has not settled yet (0: none), and the
   * copy holding it on this rank (-1: none). */
  uint64_t in_doubt_version;
  int in_doubt_copy;
} reshard_plan_status_t;

/* Fills *status (status->struct_size must be set; fields past it are not
 * written). Safe to call while executes run (values then may lag). Never
 * blocks. On device transports executes count as completed when enqueued,
 * and the call also checks the plan's last execute against its deadline:
 * one still running past it fails the plan with RESHARD_ERROR_TIMEOUT and
 * ends its work (see reshard_nccl.h, Deadlines). */
reshard_result_t reshard_plan_get_status(const reshard_plan_t *plan,
                                         reshard_plan_status_t *status);

/* Settles a version this rank reported RESHARD_ERROR_IN_DOUBT for (a
 * double-buffered execute whose commit collective passed its deadline
 * after this rank voted to commit; MPI only, where such a collective can
 * still complete when the late ranks arrive). Waits up to timeout_ms (< 1:
 * the plan's timeout) for the outcome every rank's vote decided:
 *   - every rank voted to commit: the version commits here too (the copy
 *     holding it becomes active, committed_version is it) and the plan
 *     stays usable;
 *   - a rank voted against: the version is dropped (the active copy is
 *     unchanged) and the plan is failed with RESHARD_ERROR_REMOTE, as on
 *     the ranks that failed.
 * Returns RESHARD_SUCCESS once nothing is in doubt (also when nothing
 * was), RESHARD_ERROR_IN_DOUBT if the outcome is still unknown at the
 * deadline (call it again, or see docs/RELIABILITY.md for a rank that
 * never arrives), RESHARD_ERROR_INVALID_USAGE while an execute of the
 * plan runs. reshard_plan_get_status says which way it went. The next
 * execute of the plan settles first by itself, within its deadline. Not
 * collective: only the ranks in doubt call it. */
reshard_result_t reshard_plan_resolve(const reshard_plan_t *plan, int timeout_ms);

/* Keeps a plan across a rank's replacement (reshard_comm_ucx_rejoin,
 * reshard_comm_create_ucx_joining in reshard_ucx.h): a staying rank calls
 * it on a plan it made before the rejoin, while the newcomer calls
 * reshard_plan_create with the same layouts and options; kept plans are
 * rejoined in the order the newcomer creates them (and every staying rank
 * rejoins the same plans in the same order). Nothing is planned again
 * here: the kept plan takes part in the newcomer's creation by replaying
 * the collectives its own creation ran (recorded at creation on a
 * communicator that replaces ranks), each with the words it contributed
 * then, so the newcomer's creation takes the same branches (relay -1's
 * choice, spreading, the pre-plans of spreading and fp8 block
 * quantization: any plan can be kept) and its plan gets the same chunk,
 * phases, pace and message tags, and starts at the kept plans' (and
 * their pre-plans') execute count and version. Collective over every rank; the plan's
 * timeout bounds every wait. On success a failure the replaced rank's
 * death left (REMOTE, TIMEOUT, ...) is cleared, a version in doubt is
 * rolled forward if any rank committed it and dropped otherwise (with
 * double buffering the active copy still holds the last committed
 * version), and the next execute (the next version) works on every rank.
 * The newcomer's plan reports no committed version (0) and no active copy
 * until its first execute commits: its buffers hold nothing yet.
 * Failures change nothing of the plan: RESHARD_ERROR_MISMATCH when the
 * newcomer passed other layouts or options (naming the rank and what
 * differs, on every rank; its creation fails alike) or would plan them
 * otherwise (another build or RESHARD_* setting: a collective reduced
 * other words than at creation; every rank, the newcomer by its next
 * agreement), REMOTE when the newcomer failed, TIMEOUT. Refused at once, nothing done: INVALID_ARGUMENT for NULL or a plan whose
 * communicator replaces no ranks (not UCX); INVALID_USAGE when no rejoin
 * happened since the plan was made, when it was rejoined already for the
 * latest rejoin, when more than one rejoin passed since, or while another
 * call of the plan runs. A kept plan's registered buffers
 * (reshard_plan_register_buffers) are held by a successful rejoin, not
 * used: the plan executes through staging until every rank, the newcomer
 * included, registers again. In that registration a staying rank that
 * passes the buffers it had registered keeps their registrations (no
 * ucp_mem_map again) and its partners' keys, and trades keys with the
 * newcomer only, when every staying rank does so; when one passes other
 * buffers (or held none), every rank registers anew. To register again
 * buffers reallocated at the same addresses, unregister first. */
reshard_result_t reshard_plan_rejoin(reshard_plan_t *plan);

/* Registers this rank's buffers for the plan's executes: src and dst as
 * execute takes them (one copy of each destination buffer; NULL where the
 * rank holds none). Collective over the plan's communicator: every rank
 * calls it at the same point of its sequence of calls, and either every
 * rank's registration takes effect or none does (the previous one stays).
 * On the CUDA IPC transport (reshard_cuda_ipc.h) every later execute
 * copies each received box straight from the sender's buffer into this
 * rank's: one pass over each byte, no staging. Such executes must pass
 * exactly the registered pointers (others are refused with
 * RESHARD_ERROR_INVALID_ARGUMENT, which poisons the communicator like any
 * refused call: the partners read this rank's registered buffers, so a
 * rank cannot fall back to staging alone). Call it again after
 * reallocating buffers (vLLM sleep/wake), even when the new addresses
 * equal the old ones (a peer's mapping is of the old allocation), or with
 * NULL, 0, NULL, 0 to unregister (executes go through staging again); the
 * mappings of the old buffers are released. Buffers must be cudaMalloc
 * allocations or pieces of them (PyTorch's caching allocator without
 * expandable_segments): others give RESHARD_ERROR_BACKEND naming the
 * buffer. A plan that converts dtypes casts inside the direct copy (the
 * same conversion, on the same side of the wire's dtype, as its staged
 * executes). With RESHARD_FLAG_VERIFY each receiver sums the senders'
 * boxes through the mapping and its own after the copy. Not with
 * RESHARD_FLAG_DOUBLE_BUFFER (UNSUPPORTED). Like execute, it is refused
 * with RESHARD_ERROR_INVALID_USAGE, changing nothing, while another call
 * of the plan runs on another thread of the rank. On the UCX transport
 * (reshard_ucx.h) the buffers are host memory registered with UCP
 * (ucp_mem_map; their remote keys exchanged with the partners here), and
 * every later execute reads each received box one-sided
 * (ucp_get_nbx) straight from the sender's buffer into this rank's: no
 * packing, no staging (a box of short runs whose source is one dense
 * span is read whole into staging and unpacked), a token each way per
 * round (the sender's data is ready; the receiver is done reading, so a
 * sender's call returns only once no partner reads its buffers). Same
 * rules as above (exact pointers, again after reallocating, all or
 * nothing, not double-buffered; verify's sums ride on the tokens), and a
 * plan that converts dtypes is refused with RESHARD_ERROR_UNSUPPORTED on
 * the ranks that receive a cast box (a read moves bytes as they are;
 * REMOTE on the others): execute it unregistered. A plan that quantizes
 * or spreads registers its pre-plans' scratch beside the caller's buffers
 * (as on CUDA IPC). After a rejoin the staying ranks keep what they
 * registered (reshard_plan_rejoin). A rank that fails before the
 * exchange (a wrong buffer count: INVALID_ARGUMENT) makes its partners
 * fail with RESHARD_ERROR_REMOTE naming it. Other transports:
 * RESHARD_ERROR_UNSUPPORTED on every rank, nothing changes (their
 * executes need no registration). */
reshard_result_t reshard_plan_register_buffers(reshard_plan_t *plan,
                                               void *const *src, size_t nsrc,
                                               void *const *dst, size_t ndst);

/* Frees the plan (NULL is a no-op). Executes of the plan still running on
 * other threads are waited for (each ends by its deadline) before
 * anything is freed; calling execute (or any other plan function) after
 * destroy began, or concurrently with it, is a use after free. */
void reshard_plan_destroy(reshard_plan_t *plan);

/* ------------------------------------------------------------------ */
/* Cost model and the physical limit                                   */
/* ------------------------------------------------------------------ */

#define RESHARD_ESTIMATE_VERSION 1

/* What limits a time. The first six are links of the cost model; the
 * next four are the terms of the lower bound (docs/ARCHITECTURE.md, "Cost
 * model"); NODE_MEMORY serves both. */
typedef enum reshard_bound {
  RESHARD_BOUND_NONE = 0,
  RESHARD_BOUND_NIC_EGRESS = 1,     /* a rank's share of its node's NICs */
  RESHARD_BOUND_NIC_INGRESS = 2,
  RESHARD_BOUND_NVLINK_EGRESS = 3,  /* a rank's link inside its domain */
  RESHARD_BOUND_NVLINK_INGRESS = 4,
  RESHARD_BOUND_LOCAL_COPY = 5,     /* a rank's own copies (colocated) */
  RESHARD_BOUND_NODE_MEMORY = 6,    /* the memory a node's ranks share (cpu) */
  RESHARD_BOUND_SOURCE_EGRESS = 7,  /* U / the source side's NICs */
  RESHARD_BOUND_DOMAIN_INGRESS = 8, /* N(d) / domain d's NICs */
  RESHARD_BOUND_RANK_INGRESS = 9,   /* in(r) / r's fastest ingress link */
  RESHARD_BOUND_SOLE_HOLDER = 10,   /* bytes only s holds / s's egress */
  RESHARD_NUM_BOUNDS = 11
} reshard_bound_t;

/* A predicted time and what it is made of. Set struct_size and version
 * (RESHARD_ESTIMATE_INITIALIZER) before the call: the library writes only
 * the fields the caller's version has. */
typedef struct reshard_estimate {
  uint32_t struct_size; /* sizeof(reshard_estimate_t) */
  uint32_t version;     /* RESHARD_ESTIMATE_VERSION */
  double seconds;       /* the predicted time, or the lower bound */
  /* What limits `seconds` most: the link that bounds the longest round
   * (plans) or the largest term (lower bound), and where: a rank, a node
   * (NODE_MEMORY), a domain (DOMAIN_INGRESS), or -1 (SOURCE_EGRESS). */
  reshard_bound_t bound;
  int bound_where;
  /* Plans: for each link kind, the summed duration of the rounds it
   * bounded (the entries sum to seconds). Lower bound: each term's value
   * (seconds is their maximum). */
  double bound_seconds[RESHARD_NUM_BOUNDS];
  /* Plans: the part of seconds spent in latency (once a round) and in
   * each message's own cost on the bounding links. Lower bound: 0. */
  double latency_seconds;
  int num_rounds; /* plans: rounds priced; lower bound: 0 */
  /* Plans: bytes sent between ranks plus bytes copied locally, over all
   * ranks. Lower bound: U, the unique bytes some destination rank needs
   * and does not hold itself. */
  uint64_t bytes;
} reshard_estimate_t;

#define RESHARD_ESTIMATE_INITIALIZER \
  {sizeof(reshard_estimate_t), RESHARD_ESTIMATE_VERSION, 0, RESHARD_BOUND_NONE, -1, {0}, 0, 0, 0}

/* Predicted time of one execute of the plan on its topology (options'
 * topology or RESHARD_TOPOLOGY), collective over the plan's communicator
 * like plan creation: every rank gets the same answer. The model is
 * round-synchronous: each round of messages lasts as long as its busiest
 * link (bytes / bandwidth + its latency once + messages x each one's
 * cost, over every rank's NIC and NVLink directions, its local copies,
 * and on the cpu preset the node's shared memory bandwidth); the rounds
 * add up, a composite plan's pre-plans (fp8 gathering, source-side
 * spreading) before its main plan's. Rounds overlap in reality
 * (double buffering), so this slightly over-estimates. A plan without a
 * topology is RESHARD_ERROR_INVALID_USAGE (on every rank). Costs a few
 * small allreduces over the communicator (values per round); call it
 * once, not every step. Every rank must call it, in the same order as its
 * other collective calls. The plan is not modified. */
reshard_result_t reshard_plan_estimate(const reshard_plan_t *plan,
                                       reshard_estimate_t *out);

/* The physical limit T_lower of a reshard between the two layouts on a
 * communicator of nranks ranks placed on the named topology preset (the
 * same placement as plan creation): no plan, relayed or not, can be
 * faster on that machine. Not collective: every rank may call it, or a
 * tool alone; it walks every rank's fragments (O(all fragments)). */
reshard_result_t reshard_lower_bound(const reshard_layout_t *src,
                                     const reshard_layout_t *dst, int nranks,
                                     const char *topology,
                                     reshard_estimate_t *out);

/* Name of a bound ("nic-egress", ...; "invalid" when out of range). */
const char *reshard_bound_name(reshard_bound_t bound);

/* ------------------------------------------------------------------ */
/* Introspection                                                       */
/* ------------------------------------------------------------------ */

typedef struct reshard_plan_stats {
  int rank;
  int num_send_peers;
  int num_recv_peers;
  int num_chunks;             /* rounds of messages */
  size_t send_bytes;          /* bytes this rank sends to other ranks */
  size_t recv_bytes;          /* bytes it receives from other ranks */
  size_t send_messages;       /* (peer, chunk) messages sent */
  size_t recv_messages;
  size_t local_copy_bytes;    /* bytes copied locally (colocated ranks) */
  size_t segments;            /* boxes packed, unpacked or copied */
  size_t chunk_bytes;         /* the message size bound in force */
  size_t staging_bytes;       /* staging memory execute uses */
  int phases;                 /* a stream sends one round in this many (1:
                                 every round; RESHARD_MAX_PHASES) */
  size_t wide_bytes;          /* with phases, a stream of more bytes sends
                                 in every round (0: none) */
  int pace_rounds;            /* with a topology: the network's horizon
                                 (the rounds of its longest narrow stream, one
                                 in `phases`, or of its longest wide one; with
                                 no network stream, of its longest stream
                                 inside a domain, which all keep to),
                                 within which streams inside an NVLink domain
                                 finish and over which wide network streams,
                                 and those nothing waits on past NVLink,
                                 spread (0: no pacing) */
} reshard_plan_stats_t;

reshard_result_t reshard_plan_get_stats(const reshard_plan_t *plan,
                                        reshard_plan_stats_t *stats);

typedef struct reshard_peer_stats {
  int peer;
  size_t send_bytes;
  size_t recv_bytes;
  size_t send_messages;
  size_t recv_messages;
} reshard_peer_stats_t;

/* Per-peer traffic, sorted by peer. Two-call pattern like
 * reshard_layout_fragments. */
reshard_result_t reshard_plan_get_peer_stats(const reshard_plan_t *plan,
                                             reshard_peer_stats_t *out,
                                             size_t capacity, size_t *count);

/* A human-readable dump of the plan (totals, peers, chunks, and up to
 * max_segments segments; -1 for all). */
reshard_result_t reshard_plan_dump(const reshard_plan_t *plan, FILE *out,
                                   long max_segments);

#ifdef __cplusplus
}
#endif

#endif /* RESHARD_H */
