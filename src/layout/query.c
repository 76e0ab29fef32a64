/* Public layout queries: buffer sizes, mesh shapes and lowered fragments
 * per rank. */
#include <string.h>

#include "common/error.h"
#include "layout/layout.h"

reshard_result_t reshard_layout_buffer_bytes(const reshard_layout_t *L,
                                             int buffer_id, int rank,
                                             size_t *bytes) {
  rs_error_clear();
  if (!L || !bytes) return rs_error(RESHARD_ERROR_INVALID_ARGUMENT, "buffer_bytes: NULL argument");
  if (buffer_id < 0 || buffer_id >= L->nbuffers)
    return rs_error(RESHARD_ERROR_INVALID_ARGUMENT, "buffer_bytes: buffer_id %d is not a buffer of this layout", buffer_id);
  if (rank < 0) return rs_error(RESHARD_ERROR_INVALID_ARGUMENT, "buffer_bytes: rank %d is negative", rank);
  uint64_t b;
  RS_CHECK(rs_layout_buffer_bytes(L, buffer_id, rank, &b));
  *bytes = (size_t)b;
  return RESHARD_SUCCESS;
}

reshard_result_t reshard_layout_mesh_shape(const reshard_layout_t *L, int mesh_id, int *ndim, int *shape) {
  rs_error_clear();
  if (!L || !ndim || !shape) return rs_error(RESHARD_ERROR_INVALID_ARGUMENT, "mesh_shape: NULL argument");
  if (mesh_id < 0 || mesh_id >= L->nmeshes)
    return rs_error(RESHARD_ERROR_INVALID_ARGUMENT, "mesh_shape: mesh_id %d is not a mesh of this layout (%d meshes)",
                    mesh_id, L->nmeshes);
  const rs_mesh *m = &L->meshes[mesh_id];
  *ndim = m->ndim;
  memcpy(shape, m->shape, (size_t)m->ndim * sizeof *shape);
  return RESHARD_SUCCESS;
}

reshard_result_t reshard_layout_fragments(const reshard_layout_t *L, int rank,
                                          reshard_fragment_info_t *out,
                                          size_t capacity, size_t *count) {
  rs_error_clear();
  if (!L || !count || (capacity && !out))
    return rs_error(RESHARD_ERROR_INVALID_ARGUMENT, "layout_fragments: NULL argument");
  if (rank < 0) return rs_error(RESHARD_ERROR_INVALID_ARGUMENT, "layout_fragments: rank %d is negative", rank);
  rs_frag_vec v = {0};
  reshard_result_t r = rs_layout_rank_fragments(L, rank, &v);
  if (r == RESHARD_SUCCESS) {
    for (size_t i = 0; i < v.n && i < capacity; i++) {
      reshard_fragment_info_t *o = &out[i];
      const rs_frag *f = &v.v[i];
      memset(o, 0, sizeof *o);
      o->tensor_id = f->tensor;
      o->buffer_id = f->buffer;
      o->ndim = f->ndim;
      memcpy(o->start, f->start, sizeof o->start);
      memcpy(o->extent, f->extent, sizeof o->extent);
      memcpy(o->strides, f->strides, sizeof o->strides);
      o->byte_offset = (size_t)f->byte_offset;
    }
    *count = v.n;
  }
  rs_frag_vec_free(&v);
  return r;
}

int reshard_layout_num_tensors(const reshard_layout_t *L) {
  return L ? L->ntensors : 0;
}

reshard_result_t reshard_layout_tensor_info(const reshard_layout_t *L,
                                            int tensor_id, const char **name,
                                            reshard_dtype_t *dtype, int *ndim,
                                            int64_t *shape) {
  rs_error_clear();
  if (!L) return rs_error(RESHARD_ERROR_INVALID_ARGUMENT, "tensor_info: layout is NULL");
  if (tensor_id < 0 || tensor_id >= L->ntensors)
    return rs_error(RESHARD_ERROR_INVALID_ARGUMENT, "tensor_info: tensor_id %d is not a tensor of this layout", tensor_id);
  const rs_tensor *t = &L->tensors[tensor_id];
  if (name) *name = t->name;
  if (dtype) *dtype = t->dtype;
  if (ndim) *ndim = t->ndim;
  if (shape) memcpy(shape, t->shape, (size_t)t->ndim * sizeof(int64_t));
  return RESHARD_SUCCESS;
}

reshard_result_t reshard_layout_buffer_name(const reshard_layout_t *L, int buffer_id, const char **name) {
  rs_error_clear();
  if (!L || !name) return rs_error(RESHARD_ERROR_INVALID_ARGUMENT, "buffer_name: NULL argument");
  if (buffer_id < 0 || buffer_id >= L->nbuffers)
    return rs_error(RESHARD_ERROR_INVALID_ARGUMENT, "buffer_name: buffer_id %d is not a buffer of this layout", buffer_id);
  *name = L->buffers[buffer_id].name;
  return RESHARD_SUCCESS;
}

/* Does rank hold any part of buffer b? */
static int holds(const reshard_layout_t *L, int b, int rank) {
  const rs_buffer *buf = &L->buffers[b];
  if (buf->kind == RS_BUFFER_RAW) return buf->raw_rank == rank;
  for (int k = 0; k < buf->nparts; k++)
    if (rs_mesh_position(&L->meshes[L->parts[buf->first_part + k].mesh], rank) >= 0) return 1;
  return 0;
}

reshard_result_t reshard_layout_find_buffer(const reshard_layout_t *L, const char *name, int rank, int *buffer_id) {
  rs_error_clear();
  if (!L || !name || !buffer_id) return rs_error(RESHARD_ERROR_INVALID_ARGUMENT, "find_buffer: NULL argument");
  int32_t b = rs_layout_first_buffer_named(L, name);
  if (b < 0) return rs_error(RESHARD_ERROR_INVALID_ARGUMENT, "find_buffer: no buffer named '%s' in this layout", name);
  if (rank < 0) {
    if (L->buffers[b].next_same_name >= 0)
      return rs_error(RESHARD_ERROR_INVALID_ARGUMENT,
                      "find_buffer: several buffers are named '%s' (buffers %d and %d, e.g. one per pipeline stage): "
                      "give the rank",
                      name, b, L->buffers[b].next_same_name);
    *buffer_id = b;
    return RESHARD_SUCCESS;
  }
  int found = -1;
  for (; b >= 0; b = L->buffers[b].next_same_name) {
    if (!holds(L, b, rank)) continue;
    if (found >= 0)
      return rs_error(RESHARD_ERROR_INVALID_ARGUMENT, "find_buffer: rank %d holds two buffers named '%s' (%d and %d)",
                      rank, name, found, b);
    found = b;
  }
  if (found < 0)
    return rs_error(RESHARD_ERROR_INVALID_ARGUMENT, "find_buffer: rank %d holds no buffer named '%s'", rank, name);
  *buffer_id = found;
  return RESHARD_SUCCESS;
}
