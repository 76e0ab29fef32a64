/* Public layout queries: buffer sizes and lowered fragments per rank. */
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
