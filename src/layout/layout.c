/* Layout builders: every argument is checked here, before anything is
 * stored, so that a failed call leaves the layout unchanged. */
#include "layout/layout.h"

#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"
#include "common/checked.h"
#include "common/error.h"

#define RS_GROW(ptr, n, cap)                                              \
  rs_grow((void **)&(ptr), (size_t)(n) + 1, (size_t *)NULL, &(cap),       \
          sizeof(*(ptr)))

/* Makes room for `need` elements; cap is an int. */
static reshard_result_t rs_grow(void **ptr, size_t need, size_t *unused,
                                int *cap, size_t elem) {
  (void)unused;
  if (need <= (size_t)*cap) return RESHARD_SUCCESS;
  size_t ncap = *cap ? (size_t)*cap * 2 : 16;
  while (ncap < need) ncap *= 2;
  if (ncap > INT32_MAX) return rs_error(RESHARD_ERROR_OUT_OF_MEMORY, "layout too large");
  void *p = rs_realloc(*ptr, ncap * elem);
  if (!p) return rs_error(RESHARD_ERROR_OUT_OF_MEMORY, "layout: out of memory growing to %zu entries", ncap);
  *ptr = p;
  *cap = (int)ncap;
  return RESHARD_SUCCESS;
}

static reshard_result_t rs_grow_i32(int32_t **ptr, int32_t n, int32_t *cap) {
  int c = *cap;
  reshard_result_t r = rs_grow((void **)ptr, (size_t)n + 1, NULL, &c, sizeof(int32_t));
  *cap = c;
  return r;
}

uint64_t rs_hash_bytes(const void *data, size_t len, uint64_t seed) {
  /* FNV-1a with a final avalanche: deterministic on every platform. */
  const unsigned char *p = data;
  uint64_t h = 1469598103934665603ULL ^ seed;
  for (size_t i = 0; i < len; i++) {
    h ^= p[i];
    h *= 1099511628211ULL;
  }
  h ^= h >> 33;
  h *= 0xff51afd7ed558ccdULL;
  h ^= h >> 33;
  return h;
}

/* ---------------- names ---------------- */

static const char *tensor_name(const void *ctx, int32_t id) {
  return ((const reshard_layout_t *)ctx)->tensors[id].name;
}

static const char *buffer_name(const void *ctx, int32_t id) {
  return ((const reshard_layout_t *)ctx)->buffers[id].name;
}

int32_t rs_layout_first_buffer_named(const reshard_layout_t *L, const char *name) {
  return rs_name_map_find(&L->bnames, name, rs_name_hash(name), buffer_name, L);
}

/* ---------------- create / destroy ---------------- */

reshard_result_t reshard_layout_create(reshard_layout_t **layout) {
  rs_error_clear();
  if (!layout) return rs_error(RESHARD_ERROR_INVALID_ARGUMENT, "reshard_layout_create: layout is NULL");
  reshard_layout_t *L = rs_calloc(1, sizeof *L);
  if (!L) return rs_error(RESHARD_ERROR_OUT_OF_MEMORY, "reshard_layout_create: out of memory");
  *layout = L;
  return RESHARD_SUCCESS;
}

void reshard_layout_destroy(reshard_layout_t *L) {
  if (!L) return;
  for (int i = 0; i < L->ntensors; i++) {
    free(L->tensors[i].name);
    free(L->tensors[i].parts);
    free(L->tensors[i].raws);
  }
  for (int i = 0; i < L->nmeshes; i++) {
    free(L->meshes[i].ranks);
    free(L->meshes[i].sorted);
  }
  for (int i = 0; i < L->nparts; i++) free(L->parts[i].split_pool);
  for (int i = 0; i < L->nbuffers; i++) {
    free(L->buffers[i].name);
    free(L->buffers[i].raws);
  }
  free(L->tensors);
  free(L->meshes);
  free(L->parts);
  free(L->buffers);
  free(L->raws);
  rs_name_map_free(&L->names);
  rs_name_map_free(&L->bnames);
  free(L);
}

/* ---------------- tensors ---------------- */

/* A tensor's arguments, checked before anything is stored. */
static reshard_result_t check_tensor(const reshard_layout_t *L, const char *name, reshard_dtype_t dtype, int ndim,
                                     const int64_t *shape) {
  if (!L) return rs_error(RESHARD_ERROR_INVALID_ARGUMENT, "add_tensor: layout is NULL");
  if (!name || !*name) return rs_error(RESHARD_ERROR_INVALID_ARGUMENT, "add_tensor: name is NULL or empty");
  if (reshard_dtype_size(dtype) == 0)
    return rs_error(RESHARD_ERROR_INVALID_ARGUMENT, "tensor '%s': invalid dtype %d", name, (int)dtype);
  if (ndim < 0 || ndim > RESHARD_MAX_DIMS)
    return rs_error(RESHARD_ERROR_INVALID_ARGUMENT, "tensor '%s': ndim %d outside [0, %d]", name, ndim, RESHARD_MAX_DIMS);
  if (ndim > 0 && !shape) return rs_error(RESHARD_ERROR_INVALID_ARGUMENT, "tensor '%s': shape is NULL", name);
  int64_t bytes = (int64_t)reshard_dtype_size(dtype);
  for (int d = 0; d < ndim; d++) {
    if (shape[d] < 0)
      return rs_error(RESHARD_ERROR_INVALID_ARGUMENT, "tensor '%s': shape[%d] = %lld is negative", name, d, (long long)shape[d]);
    if (rs_mul_overflow_i64(bytes, shape[d], &bytes))
      return rs_error(RESHARD_ERROR_INVALID_ARGUMENT, "tensor '%s': byte size overflows int64 at shape[%d]", name, d);
  }
  if (rs_name_map_find(&L->names, name, rs_name_hash(name), tensor_name, L) >= 0)
    return rs_error(RESHARD_ERROR_INVALID_ARGUMENT, "tensor '%s': name already declared in this layout", name);
  return RESHARD_SUCCESS;
}

/* Room for n more tensors, so that insert_tensor cannot fail. */
static reshard_result_t reserve_tensors(reshard_layout_t *L, int n) {
  RS_CHECK(rs_grow((void **)&L->tensors, (size_t)L->ntensors + (size_t)n, NULL, &L->cap_tensors, sizeof *L->tensors));
  return rs_name_map_reserve(&L->names, (size_t)L->ntensors + (size_t)n);
}

/* Stores a checked tensor under its name (owned from now on). */
static int insert_tensor(reshard_layout_t *L, char *name, reshard_dtype_t dtype, int ndim, const int64_t *shape) {
  rs_tensor *t = &L->tensors[L->ntensors];
  memset(t, 0, sizeof *t);
  t->name = name;
  t->name_hash = rs_name_hash(name);
  t->dtype = dtype;
  t->ndim = ndim;
  t->scale_id = -1;
  for (int d = 0; d < ndim; d++) t->shape[d] = shape[d];
  int id = L->ntensors++;
  rs_name_map_put(&L->names, id, t->name_hash);
  return id;
}

reshard_result_t reshard_layout_add_tensor(reshard_layout_t *L,
                                           const char *name,
                                           reshard_dtype_t dtype, int ndim,
                                           const int64_t *shape,
                                           int *tensor_id) {
  rs_error_clear();
  RS_CHECK(check_tensor(L, name, dtype, ndim, shape));
  RS_CHECK(reserve_tensors(L, 1));
  char *copy = rs_strdup(name);
  if (!copy) return rs_error(RESHARD_ERROR_OUT_OF_MEMORY, "tensor '%s': out of memory", name);
  int id = insert_tensor(L, copy, dtype, ndim, shape);
  if (tensor_id) *tensor_id = id;
  return RESHARD_SUCCESS;
}

reshard_result_t reshard_layout_add_tensor_blocked(reshard_layout_t *L, const char *name, reshard_dtype_t dtype,
                                                   int ndim, const int64_t *shape, const int64_t *block,
                                                   int *tensor_id) {
  rs_error_clear();
  if (!L) return rs_error(RESHARD_ERROR_INVALID_ARGUMENT, "add_tensor_blocked: layout is NULL");
  if (!name || !*name) return rs_error(RESHARD_ERROR_INVALID_ARGUMENT, "add_tensor_blocked: name is NULL or empty");
  if (dtype != RESHARD_FP8_E4M3)
    return rs_error(RESHARD_ERROR_INVALID_ARGUMENT,
                    "tensor '%s': block scales are defined for fp8e4m3 weights only, not %s", name,
                    reshard_dtype_name(dtype));
  if (ndim < 2 || ndim > RESHARD_MAX_DIMS || !shape)
    return rs_error(RESHARD_ERROR_INVALID_ARGUMENT,
                    "tensor '%s': block scales need 2 to %d dims and a shape, not ndim %d%s", name, RESHARD_MAX_DIMS,
                    ndim, shape ? "" : " (shape is NULL)");
  if (!block)
    return rs_error(RESHARD_ERROR_INVALID_ARGUMENT, "tensor '%s': block is NULL (two sizes: rows, columns)", name);
  if (block[0] < 1 || block[1] < 1 || block[0] > INT32_MAX || block[1] > INT32_MAX)
    return rs_error(RESHARD_ERROR_INVALID_ARGUMENT,
                    "tensor '%s': block %lld x %lld: each size must be from 1 to %d (rows, columns)", name,
                    (long long)block[0], (long long)block[1], INT32_MAX);
  size_t n = strlen(name);
  char *sname = rs_malloc(n + sizeof "_scale_inv");
  if (!sname) return rs_error(RESHARD_ERROR_OUT_OF_MEMORY, "tensor '%s': out of memory", name);
  memcpy(sname, name, n);
  memcpy(sname + n, "_scale_inv", sizeof "_scale_inv");
  int64_t sshape[RESHARD_MAX_DIMS];
  for (int d = 0; d < ndim; d++) sshape[d] = shape[d];
  for (int k = 0; k < 2; k++) {
    int d = ndim - 2 + k;
    sshape[d] = shape[d] < 0 ? shape[d] : shape[d] / block[k] + (shape[d] % block[k] != 0); /* no overflow */
  }
  /* both are checked, and room made for both, before either is added:
   * a failure leaves the layout as it was */
  reshard_result_t r = check_tensor(L, name, dtype, ndim, shape);
  if (!r) r = check_tensor(L, sname, RESHARD_FP32, ndim, sshape);
  if (!r) r = reserve_tensors(L, 2);
  char *wname = r ? NULL : rs_strdup(name);
  if (!r && !wname) r = rs_error(RESHARD_ERROR_OUT_OF_MEMORY, "tensor '%s': out of memory", name);
  if (r) {
    free(sname);
    return r;
  }
  int id = insert_tensor(L, wname, dtype, ndim, shape);
  int sid = insert_tensor(L, sname, RESHARD_FP32, ndim, sshape);
  L->tensors[id].block[0] = (int32_t)block[0];
  L->tensors[id].block[1] = (int32_t)block[1];
  L->tensors[id].scale_id = sid;
  if (tensor_id) *tensor_id = id;
  return RESHARD_SUCCESS;
}

reshard_result_t reshard_layout_tensor_block(const reshard_layout_t *L, int tensor_id, int64_t *block,
                                             int *scale_id) {
  rs_error_clear();
  if (!L || tensor_id < 0 || tensor_id >= L->ntensors)
    return rs_error(RESHARD_ERROR_INVALID_ARGUMENT, "tensor_block: no tensor %d in this layout", tensor_id);
  const rs_tensor *t = &L->tensors[tensor_id];
  if (block) block[0] = t->block[0], block[1] = t->block[1];
  if (scale_id) *scale_id = t->block[0] ? t->scale_id : -1;
  return RESHARD_SUCCESS;
}

reshard_result_t reshard_layout_find_tensor(const reshard_layout_t *L,
                                            const char *name, int *tensor_id) {
  rs_error_clear();
  if (!L || !name || !tensor_id)
    return rs_error(RESHARD_ERROR_INVALID_ARGUMENT, "find_tensor: NULL argument");
  int id = rs_name_map_find(&L->names, name, rs_name_hash(name), tensor_name, L);
  if (id < 0) return rs_error(RESHARD_ERROR_INVALID_ARGUMENT, "find_tensor: no tensor named '%s'", name);
  *tensor_id = id;
  return RESHARD_SUCCESS;
}

/* ---------------- meshes ---------------- */

static int cmp_pair(const void *a, const void *b) {
  const int *x = a, *y = b;
  return (x[0] > y[0]) - (x[0] < y[0]);
}

int rs_mesh_position(const rs_mesh *m, int rank) {
  int lo = 0, hi = m->size - 1;
  while (lo <= hi) {
    int mid = (lo + hi) / 2;
    int r = m->sorted[2 * mid];
    if (r == rank) return m->sorted[2 * mid + 1];
    if (r < rank) lo = mid + 1;
    else hi = mid - 1;
  }
  return -1;
}

static reshard_result_t add_mesh(reshard_layout_t *L, int ndim,
                                 const int *shape, const int *ranks,
                                 int start, int stride, int *mesh_id) {
  rs_error_clear();
  if (!L) return rs_error(RESHARD_ERROR_INVALID_ARGUMENT, "add_mesh: layout is NULL");
  if (ndim < 1 || ndim > RESHARD_MAX_MESH_DIMS)
    return rs_error(RESHARD_ERROR_INVALID_ARGUMENT, "mesh %d: ndim %d outside [1, %d]", L->nmeshes, ndim, RESHARD_MAX_MESH_DIMS);
  if (!shape) return rs_error(RESHARD_ERROR_INVALID_ARGUMENT, "mesh %d: shape is NULL", L->nmeshes);
  int64_t size = 1;
  for (int a = 0; a < ndim; a++) {
    if (shape[a] < 1)
      return rs_error(RESHARD_ERROR_INVALID_ARGUMENT, "mesh %d: shape[%d] = %d must be >= 1", L->nmeshes, a, shape[a]);
    size *= shape[a];
    if (size > INT32_MAX) return rs_error(RESHARD_ERROR_INVALID_ARGUMENT, "mesh %d: more than 2^31 ranks", L->nmeshes);
  }
  int *rk = rs_malloc((size_t)size * sizeof *rk);
  int *sorted = rs_malloc((size_t)size * 2 * sizeof *sorted);
  if (!rk || !sorted) {
    free(rk);
    free(sorted);
    return rs_error(RESHARD_ERROR_OUT_OF_MEMORY, "mesh %d: out of memory", L->nmeshes);
  }
  reshard_result_t r = RESHARD_SUCCESS;
  for (int64_t i = 0; i < size; i++) {
    int64_t v = ranks ? ranks[i] : (int64_t)start + i * (int64_t)stride;
    if (v < 0 || v > INT32_MAX) {
      r = rs_error(RESHARD_ERROR_INVALID_ARGUMENT, "mesh %d: rank %lld at position %lld is negative or too large", L->nmeshes, (long long)v, (long long)i);
      goto fail;
    }
    rk[i] = (int)v;
    sorted[2 * i] = (int)v;
    sorted[2 * i + 1] = (int)i;
  }
  qsort(sorted, (size_t)size, 2 * sizeof(int), cmp_pair);
  for (int64_t i = 1; i < size; i++)
    if (sorted[2 * i] == sorted[2 * i - 2]) {
      r = rs_error(RESHARD_ERROR_INVALID_ARGUMENT, "mesh %d: rank %d appears twice (positions %d and %d)", L->nmeshes, sorted[2 * i], sorted[2 * i - 1], sorted[2 * i + 1]);
      goto fail;
    }
  RS_CHECK_GOTO(RS_GROW(L->meshes, L->nmeshes, L->cap_meshes), r, fail);
  rs_mesh *m = &L->meshes[L->nmeshes];
  memset(m, 0, sizeof *m);
  m->ndim = ndim;
  for (int a = 0; a < ndim; a++) m->shape[a] = shape[a];
  m->size = (int)size;
  m->ranks = rk;
  m->sorted = sorted;
  if (mesh_id) *mesh_id = L->nmeshes;
  L->nmeshes++;
  return RESHARD_SUCCESS;
fail:
  free(rk);
  free(sorted);
  return r;
}

void rs_layout_drop_last_mesh(reshard_layout_t *L) {
  rs_mesh *m = &L->meshes[--L->nmeshes];
  free(m->ranks);
  free(m->sorted);
  memset(m, 0, sizeof *m);
}

reshard_result_t reshard_layout_add_mesh(reshard_layout_t *L, int ndim,
                                         const int *shape, const int *ranks,
                                         int *mesh_id) {
  if (!ranks) return rs_error(RESHARD_ERROR_INVALID_ARGUMENT, "add_mesh: ranks is NULL (use reshard_layout_add_mesh_strided)");
  return add_mesh(L, ndim, shape, ranks, 0, 0, mesh_id);
}

reshard_result_t reshard_layout_add_mesh_strided(reshard_layout_t *L,
                                                 int ndim, const int *shape,
                                                 int start, int stride,
                                                 int *mesh_id) {
  return add_mesh(L, ndim, shape, NULL, start, stride, mesh_id);
}

/* ---------------- buffers ---------------- */

static reshard_result_t check_part(const reshard_layout_t *L,
                                   const char *bname, int k,
                                   const reshard_part_t *p, const int64_t *origin,
                                   int concat_dim, int num_groups) {
  if (p->tensor_id < 0 || p->tensor_id >= L->ntensors)
    return rs_error(RESHARD_ERROR_INVALID_ARGUMENT, "buffer '%s' part %d: tensor_id %d is not a tensor of this layout", bname, k, p->tensor_id);
  const rs_tensor *t = &L->tensors[p->tensor_id];
  if (p->mesh_id < 0 || p->mesh_id >= L->nmeshes)
    return rs_error(RESHARD_ERROR_INVALID_ARGUMENT, "tensor '%s': mesh_id %d is not a mesh of this layout", t->name, p->mesh_id);
  const rs_mesh *m = &L->meshes[p->mesh_id];
  if (!p->placements)
    return rs_error(RESHARD_ERROR_INVALID_ARGUMENT, "tensor '%s': placements is NULL", t->name);
  for (int a = 0; a < m->ndim; a++) {
    const reshard_placement_t *pl = &p->placements[a];
    if (pl->kind == RESHARD_PLACEMENT_REPLICATE) continue;
    if (pl->kind != RESHARD_PLACEMENT_SHARD)
      return rs_error(RESHARD_ERROR_INVALID_ARGUMENT, "tensor '%s': placement of mesh axis %d has invalid kind %d", t->name, a, (int)pl->kind);
    if (pl->dim < 0 || pl->dim >= t->ndim)
      return rs_error(RESHARD_ERROR_INVALID_ARGUMENT, "tensor '%s': placement of mesh axis %d shards dim %d, tensor has %d dims", t->name, a, pl->dim, t->ndim);
    if (pl->split_sizes)
      for (int i = 0; i < m->shape[a]; i++)
        if (pl->split_sizes[i] < 0)
          return rs_error(RESHARD_ERROR_INVALID_ARGUMENT, "tensor '%s': split_sizes[%d] of mesh axis %d is negative", t->name, i, a);
  }
  if (origin) {
    if (num_groups > 1)
      return rs_error(RESHARD_ERROR_INVALID_ARGUMENT, "buffer '%s' part %d (tensor '%s'): windows need num_groups 1, not %d", bname, k, t->name, num_groups);
    for (int d = 0; d < t->ndim; d++) {
      int64_t end;
      if (origin[d] < 0 || origin[d] > t->shape[d])
        return rs_error(RESHARD_ERROR_INVALID_ARGUMENT, "buffer '%s' part %d (tensor '%s'): window origin[%d] = %lld lies outside [0, %lld]", bname, k, t->name, d, (long long)origin[d], (long long)t->shape[d]);
      if (p->padded_shape && (p->padded_shape[d] < 0 || rs_add_overflow_i64(origin[d], p->padded_shape[d], &end)))
        return rs_error(RESHARD_ERROR_INVALID_ARGUMENT, "buffer '%s' part %d (tensor '%s'): window shape[%d] = %lld is negative or overflows", bname, k, t->name, d, (long long)p->padded_shape[d]);
    }
  } else if (p->padded_shape) {
    for (int d = 0; d < t->ndim; d++)
      if (p->padded_shape[d] < t->shape[d])
        return rs_error(RESHARD_ERROR_INVALID_ARGUMENT, "tensor '%s': padded_shape[%d] = %lld is smaller than shape %lld", t->name, d, (long long)p->padded_shape[d], (long long)t->shape[d]);
  }
  if (num_groups > 1) {
    if (t->ndim <= concat_dim)
      return rs_error(RESHARD_ERROR_INVALID_ARGUMENT, "tensor '%s': concat_dim %d out of range", t->name, concat_dim);
    if (t->shape[concat_dim] % num_groups)
      return rs_error(RESHARD_ERROR_INVALID_ARGUMENT, "tensor '%s': dim %d of size %lld is not divisible into %d groups", t->name, concat_dim, (long long)t->shape[concat_dim], num_groups);
    if (p->padded_shape && p->padded_shape[concat_dim] != t->shape[concat_dim])
      return rs_error(RESHARD_ERROR_INVALID_ARGUMENT, "tensor '%s': padding along the grouped dim %d is not supported", t->name, concat_dim);
  }
  return RESHARD_SUCCESS;
}

/* The buffer that will get id L->nbuffers, named and indexed by name
 * (the last step of an add: nothing after it can fail). */
static reshard_result_t new_buffer(reshard_layout_t *L, const char *name,
                                   rs_buffer **out) {
  RS_CHECK(RS_GROW(L->buffers, L->nbuffers, L->cap_buffers));
  uint64_t h = rs_name_hash(name);
  int32_t same = rs_name_map_find(&L->bnames, name, h, buffer_name, L);
  if (same < 0) RS_CHECK(rs_name_map_reserve(&L->bnames, L->bnames.n + 1));
  char *copy = rs_strdup(name);
  if (!copy) return rs_error(RESHARD_ERROR_OUT_OF_MEMORY, "buffer '%s': out of memory", name);
  rs_buffer *b = &L->buffers[L->nbuffers];
  memset(b, 0, sizeof *b);
  b->name = copy;
  b->name_hash = h;
  b->next_same_name = -1;
  b->last_same_name = L->nbuffers;
  if (same < 0) {
    rs_name_map_put(&L->bnames, L->nbuffers, h);
  } else { /* append to the chain in O(1): its head knows its tail */
    L->buffers[L->buffers[same].last_same_name].next_same_name = L->nbuffers;
    L->buffers[same].last_same_name = L->nbuffers;
  }
  *out = b;
  return RESHARD_SUCCESS;
}

/* The box [lo, hi) a part holds of its tensor, clipped to the shape. */
static void window_box(const rs_tensor *t, const reshard_part_t *p, const int64_t *origin, int64_t *lo, int64_t *hi) {
  for (int d = 0; d < t->ndim; d++) {
    lo[d] = origin ? origin[d] : 0;
    int64_t n = p->padded_shape ? p->padded_shape[d] : t->shape[d] - lo[d];
    hi[d] = rs_min_i64(t->shape[d], lo[d] + n);
  }
}

/* Parts j and k hold the same tensor: allowed only when no rank could hold
 * an element twice in this buffer, i.e. their windows are disjoint or
 * their meshes share no rank (an expert replicated on two EP ranks). */
static int parts_collide(const reshard_layout_t *L, const reshard_part_t *pj, const int64_t *oj,
                         const reshard_part_t *pk, const int64_t *ok) {
  const rs_tensor *t = &L->tensors[pk->tensor_id];
  int64_t jl[RESHARD_MAX_DIMS], jh[RESHARD_MAX_DIMS], kl[RESHARD_MAX_DIMS], kh[RESHARD_MAX_DIMS];
  window_box(t, pj, oj, jl, jh);
  window_box(t, pk, ok, kl, kh);
  for (int d = 0; d < t->ndim; d++) /* disjoint, or either one empty */
    if (jh[d] <= kl[d] || kh[d] <= jl[d] || jh[d] <= jl[d] || kh[d] <= kl[d]) return 0;
  const rs_mesh *a = &L->meshes[pj->mesh_id], *b = &L->meshes[pk->mesh_id];
  for (int i = 0; i < a->size; i++)
    if (rs_mesh_position(b, a->ranks[i]) >= 0) return 1;
  return 0;
}

static reshard_result_t add_fused(reshard_layout_t *L, const char *name, int concat_dim, int num_groups,
                                  int num_parts, const reshard_part_t *parts, const int64_t *const *origins,
                                  int *buffer_id) {
  rs_error_clear();
  if (!L) return rs_error(RESHARD_ERROR_INVALID_ARGUMENT, "add_fused: layout is NULL");
  if (!name) name = "(unnamed)";
  if (num_parts < 1 || !parts)
    return rs_error(RESHARD_ERROR_INVALID_ARGUMENT, "buffer '%s': needs at least one part (num_parts %d, parts %p)", name, num_parts, (const void *)parts);
  if (num_groups < 1)
    return rs_error(RESHARD_ERROR_INVALID_ARGUMENT, "buffer '%s': num_groups %d must be >= 1", name, num_groups);
  if (num_groups > 1 && (parts[0].tensor_id < 0 || parts[0].tensor_id >= L->ntensors ||
                         concat_dim < 0 || concat_dim >= L->tensors[parts[0].tensor_id].ndim))
    return rs_error(RESHARD_ERROR_INVALID_ARGUMENT, "buffer '%s': grouped (num_groups %d) needs concat_dim %d inside the tensors' dims",
                    name, num_groups, concat_dim);
  const rs_tensor *t0 = NULL;
  for (int k = 0; k < num_parts; k++) {
    const rs_tensor *t;
    if (parts[k].tensor_id < 0 || parts[k].tensor_id >= L->ntensors)
      return rs_error(RESHARD_ERROR_INVALID_ARGUMENT, "buffer '%s' part %d: tensor_id %d is not a tensor of this layout", name, k, parts[k].tensor_id);
    t = &L->tensors[parts[k].tensor_id];
    if (k == 0) {
      t0 = t;
      if (t->ndim > 0 && (concat_dim < 0 || concat_dim >= t->ndim))
        return rs_error(RESHARD_ERROR_INVALID_ARGUMENT, "buffer '%s': concat_dim %d outside tensor '%s''s %d dims", name, concat_dim, t->name, t->ndim);
    } else {
      if (t->ndim != t0->ndim)
        return rs_error(RESHARD_ERROR_INVALID_ARGUMENT, "buffer '%s': tensor '%s' has %d dims, '%s' has %d", name, t->name, t->ndim, t0->name, t0->ndim);
      if (reshard_dtype_size(t->dtype) != reshard_dtype_size(t0->dtype))
        return rs_error(RESHARD_ERROR_INVALID_ARGUMENT, "buffer '%s': tensor '%s' (%s) and '%s' (%s) differ in element size", name, t->name, reshard_dtype_name(t->dtype), t0->name, reshard_dtype_name(t0->dtype));
    }
    if (t->ndim == 0 && num_parts > 1)
      return rs_error(RESHARD_ERROR_INVALID_ARGUMENT, "buffer '%s': scalar tensor '%s' cannot be fused", name, t->name);
    const int64_t *ok = origins ? origins[k] : NULL;
    RS_CHECK(check_part(L, name, k, &parts[k], ok, concat_dim, num_groups));
    for (int d = 0; ok && num_parts > 1 && d < t->ndim; d++) {
      int64_t w = parts[k].padded_shape ? parts[k].padded_shape[d] : t->shape[d] - ok[d];
      if (d != concat_dim && w == 0 && t->shape[d] > 0)
        return rs_error(RESHARD_ERROR_INVALID_ARGUMENT,
                        "buffer '%s' part %d (tensor '%s'): the window is empty on dim %d beside other parts, whose "
                        "extents off the concat dim %d it would have to match",
                        name, k, t->name, d, concat_dim);
    }
    for (int j = 0; j < k; j++) {
      if (parts[j].tensor_id != parts[k].tensor_id) continue;
      const int64_t *oj = origins ? origins[j] : NULL;
      if (!oj || !ok)
        return rs_error(RESHARD_ERROR_INVALID_ARGUMENT, "buffer '%s': tensor '%s' appears twice", name, t->name);
      if (parts_collide(L, &parts[j], oj, &parts[k], ok))
        return rs_error(RESHARD_ERROR_INVALID_ARGUMENT,
                        "buffer '%s': parts %d and %d hold overlapping windows of tensor '%s' on a common rank",
                        name, j, k, t->name);
    }
  }
  if (num_groups > 1) {
    /* Every part shards the same grid of groups: same mesh, same
     * placements along the grouped dim. */
    for (int k = 1; k < num_parts; k++)
      if (parts[k].mesh_id != parts[0].mesh_id)
        return rs_error(RESHARD_ERROR_INVALID_ARGUMENT, "buffer '%s': grouped parts must share one mesh (part %d uses mesh %d, part 0 mesh %d)", name, k, parts[k].mesh_id, parts[0].mesh_id);
  }
  /* All checks passed: allocate everything, then commit. */
  int64_t **pools = rs_calloc((size_t)num_parts, sizeof *pools);
  if (!pools) return rs_error(RESHARD_ERROR_OUT_OF_MEMORY, "buffer '%s': out of memory", name);
  reshard_result_t r = RESHARD_SUCCESS;
  for (int k = 0; k < num_parts; k++) {
    const rs_mesh *m = &L->meshes[parts[k].mesh_id];
    size_t n = 0;
    for (int a = 0; a < m->ndim; a++)
      if (parts[k].placements[a].kind == RESHARD_PLACEMENT_SHARD && parts[k].placements[a].split_sizes)
        n += (size_t)m->shape[a];
    if (n && !(pools[k] = rs_malloc(n * sizeof(int64_t)))) {
      r = rs_error(RESHARD_ERROR_OUT_OF_MEMORY, "buffer '%s': out of memory", name);
      goto fail;
    }
  }
  RS_CHECK_GOTO(RS_GROW(L->parts, L->nparts + num_parts - 1, L->cap_parts), r, fail);
  for (int k = 0; k < num_parts; k++) {
    rs_tensor *t = &L->tensors[parts[k].tensor_id];
    int32_t more = 0; /* a tensor may appear in several windows */
    for (int j = 0; j < k; j++) more += parts[j].tensor_id == parts[k].tensor_id;
    RS_CHECK_GOTO(rs_grow_i32(&t->parts, t->nparts + more, &t->cap_parts), r, fail);
  }
  rs_buffer *b;
  RS_CHECK_GOTO(new_buffer(L, name, &b), r, fail);
  b->kind = RS_BUFFER_FUSED;
  b->concat_dim = t0->ndim > 0 ? concat_dim : 0;
  b->num_groups = num_groups;
  b->first_part = L->nparts;
  b->nparts = num_parts;
  for (int k = 0; k < num_parts; k++) {
    rs_part *p = &L->parts[L->nparts];
    const rs_mesh *m = &L->meshes[parts[k].mesh_id];
    rs_tensor *t = &L->tensors[parts[k].tensor_id];
    memset(p, 0, sizeof *p);
    p->tensor = parts[k].tensor_id;
    p->mesh = parts[k].mesh_id;
    p->buffer = L->nbuffers;
    p->index = k;
    p->split_pool = pools[k];
    size_t used = 0;
    for (int a = 0; a < m->ndim; a++) {
      p->pl[a] = parts[k].placements[a];
      if (p->pl[a].kind == RESHARD_PLACEMENT_REPLICATE) {
        p->pl[a].dim = 0;
        p->pl[a].split_sizes = NULL;
      } else if (p->pl[a].split_sizes) {
        memcpy(p->split_pool + used, p->pl[a].split_sizes, (size_t)m->shape[a] * sizeof(int64_t));
        p->pl[a].split_sizes = p->split_pool + used;
        used += (size_t)m->shape[a];
      }
    }
    const int64_t *origin = origins ? origins[k] : NULL;
    for (int d = 0; d < t->ndim; d++) {
      p->vstart[d] = origin ? origin[d] : 0;
      p->vshape[d] = parts[k].padded_shape ? parts[k].padded_shape[d] : t->shape[d] - p->vstart[d];
    }
    t->parts[t->nparts++] = L->nparts;
    L->nparts++;
  }
  free(pools);
  if (buffer_id) *buffer_id = L->nbuffers;
  L->nbuffers++;
  return RESHARD_SUCCESS;
fail:
  for (int k = 0; k < num_parts; k++) free(pools[k]);
  free(pools);
  return r;
}

reshard_result_t reshard_layout_add_fused(reshard_layout_t *L, const char *name, int concat_dim, int num_groups,
                                          int num_parts, const reshard_part_t *parts, int *buffer_id) {
  return add_fused(L, name, concat_dim, num_groups, num_parts, parts, NULL, buffer_id);
}

reshard_result_t reshard_layout_add_windows(reshard_layout_t *L, const char *name, int concat_dim,
                                            int num_parts, const reshard_part_t *parts,
                                            const int64_t *const *origins, int *buffer_id) {
  return add_fused(L, name, concat_dim, 1, num_parts, parts, origins, buffer_id);
}

reshard_result_t reshard_layout_place_named(reshard_layout_t *L, const char *name, int tensor_id, int mesh_id,
                                            const reshard_placement_t *placements, int *buffer_id) {
  if (L && tensor_id >= 0 && tensor_id < L->ntensors) {
    reshard_part_t part = {tensor_id, mesh_id, placements, NULL};
    return reshard_layout_add_fused(L, name ? name : L->tensors[tensor_id].name, 0, 1, 1, &part, buffer_id);
  }
  rs_error_clear();
  return rs_error(RESHARD_ERROR_INVALID_ARGUMENT, "place: %s", L ? "tensor_id is not a tensor of this layout" : "layout is NULL");
}

reshard_result_t reshard_layout_place(reshard_layout_t *L, int tensor_id,
                                      int mesh_id,
                                      const reshard_placement_t *placements,
                                      int *buffer_id) {
  return reshard_layout_place_named(L, NULL, tensor_id, mesh_id, placements, buffer_id);
}

reshard_result_t reshard_layout_add_buffer(reshard_layout_t *L,
                                           const char *name, int rank,
                                           size_t bytes, int *buffer_id) {
  rs_error_clear();
  if (!L) return rs_error(RESHARD_ERROR_INVALID_ARGUMENT, "add_buffer: layout is NULL");
  if (!name) name = "(unnamed)";
  if (rank < 0) return rs_error(RESHARD_ERROR_INVALID_ARGUMENT, "buffer '%s': rank %d is negative", name, rank);
  if (bytes > (size_t)INT64_MAX) return rs_error(RESHARD_ERROR_INVALID_ARGUMENT, "buffer '%s': size too large", name);
  rs_buffer *b;
  RS_CHECK(new_buffer(L, name, &b));
  b->kind = RS_BUFFER_RAW;
  b->raw_rank = rank;
  b->raw_bytes = bytes;
  if (buffer_id) *buffer_id = L->nbuffers;
  L->nbuffers++;
  return RESHARD_SUCCESS;
}

reshard_result_t reshard_layout_add_fragment(reshard_layout_t *L,
                                             const reshard_fragment_t *f) {
  rs_error_clear();
  if (!L || !f) return rs_error(RESHARD_ERROR_INVALID_ARGUMENT, "add_fragment: NULL argument");
  if (f->tensor_id < 0 || f->tensor_id >= L->ntensors)
    return rs_error(RESHARD_ERROR_INVALID_ARGUMENT, "add_fragment: tensor_id %d is not a tensor of this layout", f->tensor_id);
  rs_tensor *t = &L->tensors[f->tensor_id];
  if (f->buffer_id < 0 || f->buffer_id >= L->nbuffers || L->buffers[f->buffer_id].kind != RS_BUFFER_RAW)
    return rs_error(RESHARD_ERROR_INVALID_ARGUMENT, "tensor '%s': fragment buffer_id %d is not a raw buffer of this layout", t->name, f->buffer_id);
  rs_buffer *b = &L->buffers[f->buffer_id];
  if (t->ndim > 0 && (!f->start || !f->extent))
    return rs_error(RESHARD_ERROR_INVALID_ARGUMENT, "tensor '%s' rank %d: fragment start or extent is NULL", t->name, b->raw_rank);
  if (f->byte_offset > (size_t)INT64_MAX)
    return rs_error(RESHARD_ERROR_INVALID_ARGUMENT, "tensor '%s' rank %d: fragment byte_offset too large", t->name, b->raw_rank);
  rs_raw raw;
  memset(&raw, 0, sizeof raw);
  raw.tensor = f->tensor_id;
  raw.buffer = f->buffer_id;
  raw.byte_offset = f->byte_offset;
  int64_t dense = 1;
  for (int d = t->ndim - 1; d >= 0; d--) {
    int64_t s = f->start[d], e = f->extent[d], end;
    if (s < 0 || e < 0 || rs_add_overflow_i64(s, e, &end) || end > t->shape[d])
      return rs_error(RESHARD_ERROR_INVALID_ARGUMENT, "tensor '%s' rank %d: fragment box [%lld, +%lld) on dim %d lies outside the shape %lld", t->name, b->raw_rank, (long long)s, (long long)e, d, (long long)t->shape[d]);
    raw.start[d] = s;
    raw.extent[d] = e;
    raw.strides[d] = f->strides ? f->strides[d] : dense;
    if (rs_mul_overflow_i64(dense, e > 0 ? e : 1, &dense))
      return rs_error(RESHARD_ERROR_INVALID_ARGUMENT, "tensor '%s' rank %d: fragment size overflows", t->name, b->raw_rank);
  }
  RS_CHECK(RS_GROW(L->raws, L->nraws, L->cap_raws));
  RS_CHECK(rs_grow_i32(&t->raws, t->nraws, &t->cap_raws));
  RS_CHECK(rs_grow_i32(&b->raws, b->nraws, &b->cap_raws));
  L->raws[L->nraws] = raw;
  t->raws[t->nraws++] = L->nraws;
  b->raws[b->nraws++] = L->nraws;
  L->nraws++;
  return RESHARD_SUCCESS;
}

reshard_result_t reshard_layout_allow_partial(reshard_layout_t *L, int tensor_id) {
  rs_error_clear();
  if (!L) return rs_error(RESHARD_ERROR_INVALID_ARGUMENT, "allow_partial: layout is NULL");
  if (tensor_id < 0 || tensor_id >= L->ntensors)
    return rs_error(RESHARD_ERROR_INVALID_ARGUMENT, "allow_partial: tensor_id %d is not a tensor of this layout", tensor_id);
  L->tensors[tensor_id].partial = 1;
  return RESHARD_SUCCESS;
}

int reshard_layout_num_buffers(const reshard_layout_t *L) {
  return L ? L->nbuffers : 0;
}

int rs_layout_max_rank(const reshard_layout_t *L) {
  int mx = -1;
  for (int i = 0; i < L->nmeshes; i++) {
    const rs_mesh *m = &L->meshes[i];
    if (m->size && m->sorted[2 * (m->size - 1)] > mx) mx = m->sorted[2 * (m->size - 1)];
  }
  for (int i = 0; i < L->nbuffers; i++)
    if (L->buffers[i].kind == RS_BUFFER_RAW && L->buffers[i].raw_rank > mx) mx = L->buffers[i].raw_rank;
  return mx;
}

uint64_t rs_layout_tensor_digest(const reshard_layout_t *L, int t) {
  const rs_tensor *T = &L->tensors[t];
  int64_t hdr[4] = {(int64_t)T->name_hash, T->dtype, T->ndim, T->partial};
  uint64_t h = rs_hash_bytes(hdr, sizeof hdr, 0x7e4);
  if (T->block[0]) {
    int32_t blk[3] = {T->block[0], T->block[1], T->scale_id};
    h = rs_hash_bytes(blk, sizeof blk, h);
  }
  return rs_hash_bytes(T->shape, (size_t)T->ndim * sizeof(int64_t), h);
}

uint64_t rs_layout_buffer_digest(const reshard_layout_t *L, int b) {
  const rs_buffer *B = &L->buffers[b];
  int64_t hdr[6] = {B->kind, B->concat_dim, B->num_groups, B->nparts, B->raw_rank, (int64_t)B->raw_bytes};
  uint64_t h = rs_hash_bytes(hdr, sizeof hdr, B->name_hash);
  for (int k = 0; B->kind == RS_BUFFER_FUSED && k < B->nparts; k++) {
    const rs_part *p = &L->parts[B->first_part + k];
    const rs_mesh *m = &L->meshes[p->mesh];
    int n = L->tensors[p->tensor].ndim;
    h = rs_hash_bytes(&p->tensor, sizeof p->tensor, h);
    h = rs_hash_bytes(m->shape, (size_t)m->ndim * sizeof(int), h);
    h = rs_hash_bytes(m->ranks, (size_t)m->size * sizeof(int), h);
    for (int a = 0; a < m->ndim; a++) {
      int pl[2] = {(int)p->pl[a].kind, p->pl[a].dim};
      h = rs_hash_bytes(pl, sizeof pl, h);
      if (p->pl[a].split_sizes) h = rs_hash_bytes(p->pl[a].split_sizes, (size_t)m->shape[a] * sizeof(int64_t), h);
    }
    h = rs_hash_bytes(p->vstart, (size_t)n * sizeof(int64_t), h);
    h = rs_hash_bytes(p->vshape, (size_t)n * sizeof(int64_t), h);
  }
  for (int i = 0; B->kind == RS_BUFFER_RAW && i < B->nraws; i++) {
    const rs_raw *r = &L->raws[B->raws[i]];
    int n = L->tensors[r->tensor].ndim;
    h = rs_hash_bytes(&r->tensor, sizeof r->tensor, h);
    h = rs_hash_bytes(r->start, (size_t)n * sizeof(int64_t), h);
    h = rs_hash_bytes(r->extent, (size_t)n * sizeof(int64_t), h);
    h = rs_hash_bytes(r->strides, (size_t)n * sizeof(int64_t), h);
    h = rs_hash_bytes(&r->byte_offset, sizeof r->byte_offset, h);
  }
  /* only where set: every other digest stays as it was */
  if (B->spread_origin) h = rs_hash_bytes(&B->spread_origin, sizeof B->spread_origin, h ^ 0x5350524541440000ull);
  return h;
}

void rs_layout_counts(const reshard_layout_t *L, uint64_t out[5]) {
  out[0] = (uint64_t)L->ntensors;
  out[1] = (uint64_t)L->nmeshes;
  out[2] = (uint64_t)L->nparts;
  out[3] = (uint64_t)L->nbuffers;
  out[4] = (uint64_t)L->nraws;
}

uint64_t rs_layout_digest(const reshard_layout_t *L, uint64_t seed) {
  uint64_t h = seed;
#define MIX(ptr, len) (h = rs_hash_bytes((ptr), (len), h))
  int counts[5] = {L->ntensors, L->nmeshes, L->nparts, L->nbuffers, L->nraws};
  MIX(counts, sizeof counts);
  for (int i = 0; i < L->ntensors; i++) {
    const rs_tensor *t = &L->tensors[i];
    /* the name through its hash, computed once when it was declared:
     * hashing 100k names byte by byte again costs every rank ~10 ms */
    int64_t hdr[4] = {(int64_t)t->name_hash, t->dtype, t->ndim, t->partial};
    MIX(hdr, sizeof hdr);
    MIX(t->shape, (size_t)t->ndim * sizeof(int64_t));
    if (t->block[0]) { /* only blocked tensors: other digests stay as they were */
      int32_t blk[3] = {t->block[0], t->block[1], t->scale_id};
      MIX(blk, sizeof blk);
    }
  }
  for (int i = 0; i < L->nmeshes; i++) {
    const rs_mesh *m = &L->meshes[i];
    MIX(&m->ndim, sizeof m->ndim);
    MIX(m->shape, (size_t)m->ndim * sizeof(int));
    MIX(m->ranks, (size_t)m->size * sizeof(int));
  }
  for (int i = 0; i < L->nparts; i++) {
    const rs_part *p = &L->parts[i];
    const rs_mesh *m = &L->meshes[p->mesh];
    int hdr[4] = {p->tensor, p->mesh, p->buffer, p->index};
    MIX(hdr, sizeof hdr);
    for (int a = 0; a < m->ndim; a++) {
      int pl[2] = {(int)p->pl[a].kind, p->pl[a].dim};
      MIX(pl, sizeof pl);
      if (p->pl[a].split_sizes) MIX(p->pl[a].split_sizes, (size_t)m->shape[a] * sizeof(int64_t));
    }
    MIX(p->vstart, (size_t)L->tensors[p->tensor].ndim * sizeof(int64_t));
    MIX(p->vshape, (size_t)L->tensors[p->tensor].ndim * sizeof(int64_t));
  }
  for (int i = 0; i < L->nbuffers; i++) {
    const rs_buffer *b = &L->buffers[i];
    int64_t hdr[6] = {b->kind, b->concat_dim, b->num_groups, b->first_part, b->raw_rank, (int64_t)b->raw_bytes};
    MIX(hdr, sizeof hdr);
  }
  for (int i = 0; i < L->nraws; i++) {
    const rs_raw *r = &L->raws[i];
    int n = L->tensors[r->tensor].ndim;
    int hdr[2] = {r->tensor, r->buffer};
    MIX(hdr, sizeof hdr);
    MIX(r->start, (size_t)n * sizeof(int64_t));
    MIX(r->extent, (size_t)n * sizeof(int64_t));
    MIX(r->strides, (size_t)n * sizeof(int64_t));
    MIX(&r->byte_offset, sizeof r->byte_offset);
  }
#undef MIX
  return h;
}

/* ---------------- clone ---------------- */

static void *dup_n(const void *p, size_t n, size_t elem, int *failed) {
  if (!n || !p) return NULL;
  void *q = rs_malloc(n * elem);
  if (!q) {
    *failed = 1;
    return NULL;
  }
  memcpy(q, p, n * elem);
  return q;
}

reshard_result_t rs_layout_clone(const reshard_layout_t *L, reshard_layout_t **out) {
  *out = NULL;
  reshard_layout_t *C = rs_calloc(1, sizeof *C);
  if (!C) return rs_error(RESHARD_ERROR_OUT_OF_MEMORY, "layout clone: out of memory");
  int failed = 0;
  /* the arrays first, each entry's owned pointers then replaced by copies
   * (an entry whose copy failed keeps NULL, which destroy frees) */
  C->tensors = dup_n(L->tensors, (size_t)L->ntensors, sizeof *L->tensors, &failed);
  C->meshes = dup_n(L->meshes, (size_t)L->nmeshes, sizeof *L->meshes, &failed);
  C->parts = dup_n(L->parts, (size_t)L->nparts, sizeof *L->parts, &failed);
  C->buffers = dup_n(L->buffers, (size_t)L->nbuffers, sizeof *L->buffers, &failed);
  C->raws = dup_n(L->raws, (size_t)L->nraws, sizeof *L->raws, &failed);
  if (failed) {
    free(C->tensors), free(C->meshes), free(C->parts), free(C->buffers), free(C->raws);
    free(C);
    return rs_error(RESHARD_ERROR_OUT_OF_MEMORY, "layout clone: out of memory");
  }
  C->ntensors = C->cap_tensors = L->ntensors;
  C->nmeshes = C->cap_meshes = L->nmeshes;
  C->nparts = C->cap_parts = L->nparts;
  C->nbuffers = C->cap_buffers = L->nbuffers;
  C->nraws = C->cap_raws = L->nraws;
  for (int i = 0; i < C->ntensors; i++) {
    rs_tensor *t = &C->tensors[i];
    const rs_tensor *o = &L->tensors[i];
    t->name = rs_strdup(o->name);
    failed |= !t->name;
    t->parts = dup_n(o->parts, (size_t)o->nparts, sizeof *o->parts, &failed);
    t->raws = dup_n(o->raws, (size_t)o->nraws, sizeof *o->raws, &failed);
    t->cap_parts = t->parts ? o->nparts : 0;
    t->cap_raws = t->raws ? o->nraws : 0;
    if (!t->parts) t->nparts = 0;
    if (!t->raws) t->nraws = 0;
  }
  for (int i = 0; i < C->nmeshes; i++) {
    rs_mesh *m = &C->meshes[i];
    m->ranks = dup_n(L->meshes[i].ranks, (size_t)m->size, sizeof(int), &failed);
    m->sorted = dup_n(L->meshes[i].sorted, (size_t)m->size * 2, sizeof(int), &failed);
  }
  for (int i = 0; i < C->nparts; i++) {
    rs_part *p = &C->parts[i];
    const rs_part *o = &L->parts[i];
    /* the split sizes live in the part's pool: count them, copy the pool
     * and point into the copy */
    size_t pool = 0;
    const rs_mesh *m = &L->meshes[o->mesh];
    for (int a = 0; a < m->ndim; a++)
      if (o->pl[a].split_sizes) pool += (size_t)m->shape[a];
    p->split_pool = dup_n(o->split_pool, pool, sizeof(int64_t), &failed);
    for (int a = 0; a < m->ndim; a++)
      if (o->pl[a].split_sizes)
        p->pl[a].split_sizes = p->split_pool ? p->split_pool + (o->pl[a].split_sizes - o->split_pool) : NULL;
  }
  for (int i = 0; i < C->nbuffers; i++) {
    rs_buffer *b = &C->buffers[i];
    const rs_buffer *o = &L->buffers[i];
    b->name = rs_strdup(o->name);
    failed |= !b->name;
    b->raws = dup_n(o->raws, (size_t)o->nraws, sizeof *o->raws, &failed);
    b->cap_raws = b->raws ? o->nraws : 0;
    if (!b->raws) b->nraws = 0;
  }
  if (!failed && rs_name_map_reserve(&C->names, L->names.n)) failed = 1;
  if (!failed && rs_name_map_reserve(&C->bnames, L->bnames.n)) failed = 1;
  if (failed) {
    reshard_layout_destroy(C);
    return rs_error(RESHARD_ERROR_OUT_OF_MEMORY, "layout clone: out of memory");
  }
  for (int i = 0; i < C->ntensors; i++) rs_name_map_put(&C->names, i, C->tensors[i].name_hash);
  for (int i = 0; i < C->nbuffers; i++)
    if (rs_layout_first_buffer_named(C, C->buffers[i].name) < 0) rs_name_map_put(&C->bnames, i, C->buffers[i].name_hash);
  *out = C;
  return RESHARD_SUCCESS;
}

reshard_result_t rs_layout_rename_tensors(reshard_layout_t *L, size_t n, const int *ids, char **names) {
  reshard_result_t r = RESHARD_SUCCESS;
  for (size_t i = 0; i < n && !r; i++)
    if (rs_name_map_find(&L->names, names[i], rs_name_hash(names[i]), tensor_name, L) >= 0)
      r = rs_error(RESHARD_ERROR_INVALID_ARGUMENT, "tensor '%s': name already declared in this layout", names[i]);
  rs_name_map fresh = {0};
  if (!r) r = rs_name_map_reserve(&fresh, (size_t)L->ntensors);
  if (r) {
    for (size_t i = 0; i < n; i++) free(names[i]);
    rs_name_map_free(&fresh);
    return r;
  }
  for (size_t i = 0; i < n; i++) {
    rs_tensor *t = &L->tensors[ids[i]];
    free(t->name);
    t->name = names[i];
    t->name_hash = rs_name_hash(names[i]);
  }
  for (int i = 0; i < L->ntensors; i++) rs_name_map_put(&fresh, i, L->tensors[i].name_hash);
  rs_name_map_free(&L->names);
  L->names = fresh;
  return RESHARD_SUCCESS;
}

reshard_result_t rs_layout_tensors_only(const reshard_layout_t *L, reshard_layout_t **out) {
  *out = NULL;
  reshard_layout_t *T;
  RS_CHECK(reshard_layout_create(&T));
  for (int i = 0; i < L->ntensors; i++) {
    const rs_tensor *S = &L->tensors[i];
    int id;
    reshard_result_t r = reshard_layout_add_tensor(T, S->name, S->dtype, S->ndim, S->shape, &id);
    if (!r) r = reshard_layout_allow_partial(T, id);
    if (r) {
      reshard_layout_destroy(T);
      return r;
    }
  }
  *out = T;
  return RESHARD_SUCCESS;
}

reshard_result_t rs_layout_rank_bytes(const reshard_layout_t *L, int rank, uint64_t *bytes, size_t *nfrags) {
  *bytes = 0;
  *nfrags = 0;
  rs_frag_vec fv = {0};
  reshard_result_t r = rs_layout_rank_fragments(L, rank, &fv);
  for (size_t i = 0; !r && i < fv.n; i++) {
    uint64_t n = reshard_dtype_size(L->tensors[fv.v[i].tensor].dtype);
    for (int d = 0; d < fv.v[i].ndim; d++) n *= (uint64_t)fv.v[i].extent[d];
    *bytes += n;
  }
  if (!r) *nfrags = fv.n;
  rs_frag_vec_free(&fv);
  return r;
}
