/* Helpers shared by the Megatron and vLLM builders. Only the public layout
 * API is used. */
#include <stdarg.h>
#include <stdio.h>

#include "common/error.h"
#include "models_internal.h"

int64_t rm_round_up(int64_t v, int64_t m) { return (v + m - 1) / m * m; }

const char *rm_fmt(char *buf, size_t n, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf, n, fmt, ap);
  va_end(ap);
  return buf;
}

/* Both sides declare the model's tensors in the model's order, so layout
 * tensor ids are the model's tensor indices. */
reshard_result_t rm_declare_tensors(reshard_layout_t *L, const rm_model *m) {
  for (int i = 0; i < m->ntensors; i++) {
    int id;
    RS_CHECK(reshard_layout_add_tensor(L, m->tensors[i].name, m->dtype, m->tensors[i].ndim, m->tensors[i].shape, &id));
    if (id != i)
      return rs_error(RESHARD_ERROR_INTERNAL, "model '%s': tensor '%s' got layout id %d, expected %d", m->path,
                      m->tensors[i].name, id, i);
  }
  return RESHARD_SUCCESS;
}

reshard_result_t rm_buf1(reshard_layout_t *L, const char *name, int tensor, int mesh,
                         const reshard_placement_t *pl) {
  reshard_part_t part = {tensor, mesh, pl, NULL};
  return reshard_layout_add_fused(L, name, 0, 1, 1, &part, NULL);
}

reshard_result_t rm_buf_vocab(reshard_layout_t *L, const char *name, int tensor, int mesh, int64_t vpad,
                              int64_t hidden) {
  const reshard_placement_t pl[2] = {reshard_replicate(), reshard_shard(0)};
  int64_t padded[2] = {vpad, hidden};
  reshard_part_t part = {tensor, mesh, pl, padded};
  return reshard_layout_add_fused(L, name, 0, 1, 1, &part, NULL);
}
