/* Internal representation of a layout, and its lowering to fragments.
 *
 * A layout stays in its compact, placement-level form: lowering to
 * fragments happens on demand, for one rank (rs_layout_rank_fragments) or
 * for the holders of one box (rs_layout_find_holders), so that planning
 * costs O(this rank's fragments + the fragments that touch them), never
 * O(all fragments of all ranks). */
#ifndef RS_LAYOUT_LAYOUT_H
#define RS_LAYOUT_LAYOUT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "layout/name_map.h"
#include "reshard.h"

typedef struct rs_tensor {
  char *name;
  uint64_t name_hash;
  reshard_dtype_t dtype;
  int ndim;
  int64_t shape[RESHARD_MAX_DIMS];
  /* parts and raw fragments that hold this tensor (indices) */
  int32_t *parts;
  int32_t nparts, cap_parts;
  int32_t *raws;
  int32_t nraws, cap_raws;
  int partial; /* reshard_layout_allow_partial: need not be held whole */
  /* reshard_layout_add_tensor_blocked: fp8 block quantization with blocks
   * of block[0] x block[1] over the last two dims (0: none), and the id of
   * the tensor holding the block scales (its weight_scale_inv). */
  int32_t block[2];
  int32_t scale_id;
} rs_tensor;

typedef struct rs_mesh {
  int ndim;
  int shape[RESHARD_MAX_MESH_DIMS];
  int size;
  int *ranks;       /* size entries, row-major over shape */
  int *sorted;      /* (rank, position) pairs sorted by rank: 2*size ints */
} rs_mesh;

typedef struct rs_part {
  int tensor;
  int mesh;
  int buffer;
  int index; /* position in its buffer */
  reshard_placement_t pl[RESHARD_MAX_MESH_DIMS];
  int64_t *split_pool; /* copies of the split sizes, owned */
  /* The box of the tensor the placements split: [vstart, vstart + vshape).
   * vstart is 0 unless the part is a window (reshard_layout_add_windows);
   * vshape is the padded (virtual) shape, or the window's. Elements past
   * the tensor's shape are padding. */
  int64_t vstart[RESHARD_MAX_DIMS];
  int64_t vshape[RESHARD_MAX_DIMS];
} rs_part;

enum { RS_BUFFER_FUSED = 0, RS_BUFFER_RAW = 1 };

typedef struct rs_buffer {
  char *name;
  uint64_t name_hash;
  int32_t next_same_name; /* the next buffer of this name, or -1 */
  int32_t last_same_name; /* on the first of a name: the last one */
  int kind;
  /* fused */
  int concat_dim;
  int num_groups;
  int first_part, nparts;
  /* raw */
  int raw_rank;
  size_t raw_bytes;
  int32_t *raws;
  int32_t nraws, cap_raws;
  /* Scratch of source-side spreading (src/plan/spread.h): the rank whose
   * data this raw buffer holds a copy of, plus one; 0 for every other
   * buffer. Replica choice sends from it, not from the origin, to
   * receivers outside the origin's NVLink domain. */
  int32_t spread_origin;
} rs_buffer;

typedef struct rs_raw {
  int tensor;
  int buffer;
  int64_t start[RESHARD_MAX_DIMS];
  int64_t extent[RESHARD_MAX_DIMS];
  int64_t strides[RESHARD_MAX_DIMS];
  uint64_t byte_offset;
} rs_raw;

struct reshard_layout {
  rs_tensor *tensors;
  int ntensors, cap_tensors;
  rs_mesh *meshes;
  int nmeshes, cap_meshes;
  rs_part *parts;
  int nparts, cap_parts;
  rs_buffer *buffers;
  int nbuffers, cap_buffers;
  rs_raw *raws;
  int nraws, cap_raws;
  rs_name_map names;   /* tensors */
  rs_name_map bnames;  /* buffers: the first of each name */
};

/* A lowered fragment. `key` orders fragments canonically within a rank:
 * (buffer, position in buffer). */
typedef struct rs_frag {
  int32_t tensor;
  int32_t rank;
  int32_t buffer;
  int32_t ndim;
  int64_t pos; /* position in the buffer: part*groups+group, or raw index */
  int64_t start[RESHARD_MAX_DIMS];
  int64_t extent[RESHARD_MAX_DIMS];
  int64_t strides[RESHARD_MAX_DIMS]; /* elements */
  uint64_t byte_offset;
} rs_frag;

typedef struct rs_frag_vec {
  rs_frag *v;
  size_t n, cap;
} rs_frag_vec;

reshard_result_t rs_frag_vec_push(rs_frag_vec *vec, const rs_frag *f);
void rs_frag_vec_free(rs_frag_vec *vec);

/* A deep copy of L (*out NULL on failure, error set). */
reshard_result_t rs_layout_clone(const reshard_layout_t *L, reshard_layout_t **out);

/* A new layout declaring every tensor of L (same ids, names, dtypes,
 * shapes), each allowed partial, and no buffer: the destination of a
 * pre-plan that fills scratch (block quantization's gather, source-side
 * spreading's copies), whose buffers the caller adds. */
reshard_result_t rs_layout_tensors_only(const reshard_layout_t *L, reshard_layout_t **out);

/* The bytes of the fragments `rank` holds (elements x dtype size) and
 * their count. */
reshard_result_t rs_layout_rank_bytes(const reshard_layout_t *L, int rank, uint64_t *bytes, size_t *nfrags);

/* Renames tensors ids[0 .. n) to names[0 .. n) (taken over: freed by the
 * layout, also on failure). The new names must be unused. */
reshard_result_t rs_layout_rename_tensors(reshard_layout_t *L, size_t n, const int *ids, char **names);

/* Removes the layout's last mesh, which nothing may use yet (a builder
 * undoing the mesh it added when its buffer is refused). */
void rs_layout_drop_last_mesh(reshard_layout_t *L);

/* Position of rank in mesh m, or -1. O(log size). */
int rs_mesh_position(const rs_mesh *m, int rank);

/* Which meshes hold rank: a calloc'ed flag per mesh (free it), or NULL
 * (out of memory, error set). */
unsigned char *rs_layout_rank_meshes(const reshard_layout_t *L, int rank);
/* Whether rank holds any part of buffer b, given its rs_layout_rank_meshes. */
int rs_layout_buffer_on_rank(const reshard_layout_t *L, int b, int rank,
                             const unsigned char *in_mesh);

/* Calls visit(L, b, rank, arg) on each buffer b that rank holds, in
 * buffer order, until one returns an error; returns that, or success
 * (RESHARD_ERROR_OUT_OF_MEMORY, error set, when the rank's meshes cannot
 * be found). */
typedef reshard_result_t (*rs_rank_buffer_fn)(const reshard_layout_t *L, int b, int rank, void *arg);
reshard_result_t rs_layout_each_rank_buffer(const reshard_layout_t *L, int rank, rs_rank_buffer_fn visit, void *arg);

/* Appends the non-empty fragments held by `rank`, in canonical order. */
reshard_result_t rs_layout_rank_fragments(const reshard_layout_t *L, int rank,
                                          rs_frag_vec *out);

/* Lowered fused buffers by (buffer, rank), for rs_layout_find_holders: a
 * holder in a buffer of several parts needs its whole buffer lowered on
 * its rank, and a planner asks for the same ones again and again (a stacked
 * expert tensor held in a window per expert: every destination fragment
 * finds every window). Bounded: emptied when full. One per thread. */
typedef struct rs_lower_cache {
  uint64_t *keys; /* (buffer << 32 | rank) + 1; 0: empty */
  uint32_t *first, *count; /* their fragments in frags */
  size_t cap, n;
  rs_frag_vec frags;
} rs_lower_cache;
void rs_lower_cache_free(rs_lower_cache *c);

/* Appends every non-empty fragment of `tensor` (any rank) whose box
 * intersects [start, start+extent). Output-sensitive for placement parts:
 * only mesh coordinates whose shard intersects the box are visited, and
 * windows that miss the box are skipped. cache may be NULL. */
reshard_result_t rs_layout_find_holders(const reshard_layout_t *L, int tensor,
                                        const int64_t *start,
                                        const int64_t *extent,
                                        rs_lower_cache *cache,
                                        rs_frag_vec *out);

/* Appends the non-empty fragments of raw buffer b, in the order added. */
reshard_result_t rs_layout_raw_fragments(const reshard_layout_t *L, int b,
                                         rs_frag_vec *out);

/* The first buffer named `name` (the others follow through
 * next_same_name), or -1. */
int32_t rs_layout_first_buffer_named(const reshard_layout_t *L, const char *name);

/* Byte size of buffer b on rank (0 if not held). */
reshard_result_t rs_layout_buffer_bytes(const reshard_layout_t *L, int b,
                                        int rank, uint64_t *bytes);

/* The largest rank mentioned by any mesh or raw buffer, or -1. */
int rs_layout_max_rank(const reshard_layout_t *L);

/* Full validation that does not depend on the communicator: fragments in
 * range, buffers consistent, fragments of a buffer not overlapping, for the
 * given rank's buffers only (each rank checks its own). */
reshard_result_t rs_layout_validate_rank(const reshard_layout_t *L,
                                         const char *side, int rank);

/* Every tensor of the side not allowed to be partial is held whole by the
 * union of its parts (their windows) and raw fragments: otherwise
 * RESHARD_ERROR_INVALID_ARGUMENT naming the tensor, the side and a box no
 * rank holds. The same answer on every rank. */
reshard_result_t rs_layout_check_coverage(const reshard_layout_t *L, const char *side);

/* Digests of parts of the description, to name where two ranks' layouts
 * differ: a tensor (name, dtype, shape, partial), a buffer (its kind,
 * name, parts with their meshes' ranks, placements and windows, raw
 * fragments), and the counts of everything. */
uint64_t rs_layout_tensor_digest(const reshard_layout_t *L, int t);
uint64_t rs_layout_buffer_digest(const reshard_layout_t *L, int b);
void rs_layout_counts(const reshard_layout_t *L, uint64_t out[5]);

/* 64-bit digest of the whole description. */
uint64_t rs_layout_digest(const reshard_layout_t *L, uint64_t seed);

uint64_t rs_hash_bytes(const void *data, size_t len, uint64_t seed);

#endif
