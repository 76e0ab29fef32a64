/* Helpers shared by the Megatron and vLLM builders. Only the public layout
 * API is used. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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
    const rm_tensor *t = &m->tensors[i];
    int id;
    if (t->scale >= 0) {
      /* an fp8 weight with its weight_scale_inv, declared as such: a side
       * whose weights are wider then quantizes into it (issue 19), and the
       * scale tensor (the next id, "<name>_scale_inv") is declared with it */
      const int64_t block[2] = {m->c.block[0], m->c.block[1]};
      RS_CHECK(reshard_layout_add_tensor_blocked(L, t->name, t->dtype, t->ndim, t->shape, block, &id));
      const char *sname = "";
      RS_CHECK(reshard_layout_tensor_info(L, id + 1, &sname, NULL, NULL, NULL));
      if (t->scale != i + 1 || strcmp(m->tensors[i + 1].name, sname))
        return rs_error(RESHARD_ERROR_INTERNAL, "model '%s': tensor '%s' has scale tensor %d '%s', the layout '%s'",
                        m->path, t->name, t->scale, m->tensors[t->scale].name, sname);
    } else {
      RS_CHECK(reshard_layout_add_tensor(L, t->name, t->dtype, t->ndim, t->shape, &id));
    }
    if (id != i)
      return rs_error(RESHARD_ERROR_INTERNAL, "model '%s': tensor '%s' got layout id %d, expected %d", m->path,
                      t->name, id, i);
    if (t->scale >= 0) i++;
  }
  return RESHARD_SUCCESS;
}

reshard_result_t rm_buf_vocab(reshard_layout_t *L, const char *name, int tensor, int mesh, int64_t vpad,
                              int64_t hidden) {
  const reshard_placement_t pl[2] = {reshard_replicate(), reshard_shard(0)};
  int64_t padded[2] = {vpad, hidden};
  reshard_part_t part = {tensor, mesh, pl, padded};
  return reshard_layout_add_fused(L, name, 0, 1, 1, &part, NULL);
}

/* Can part k's scales be split and fused exactly like its weight? Each dim
 * d is cut into k_d pieces (shards of every mesh axis on d, times the
 * groups on a grouped dim); with blocks of b_d along d, whole blocks need
 * b_d * k_d to divide the dim. In a concatenation, every part but the last
 * must also end on a whole block, or the next part's scales would start
 * inside a block. A window (origin given) must cover its tensor whole on
 * the blocked dims: only the leading (expert) dims are windowed. */
static reshard_result_t check_scale_split(const rm_builder *b, int cd, int G, int nparts, int k,
                                          const reshard_part_t *p, const int64_t *origin) {
  const rm_model *m = b->m;
  const rm_tensor *w = &m->tensors[p->tensor_id];
  int mnd, mshape[RESHARD_MAX_MESH_DIMS];
  RS_CHECK(reshard_layout_mesh_shape(b->L, p->mesh_id, &mnd, mshape));
  if (p->padded_shape && !origin)
    return rs_error(RESHARD_ERROR_INTERNAL, "model '%s': tensor '%s' is padded and block-scaled", m->path, w->name);
  for (int d = 0; d < w->ndim; d++) {
    int64_t blk = d >= w->ndim - 2 ? m->c.block[d - (w->ndim - 2)] : 1;
    if (origin && blk > 1 && (origin[d] != 0 || (p->padded_shape && p->padded_shape[d] != w->shape[d])))
      return rs_error(RESHARD_ERROR_INTERNAL, "model '%s': tensor '%s': a window cuts blocked dim %d", m->path,
                      w->name, d);
    int64_t pieces = G > 1 && d == cd ? G : 1;
    for (int a = 0; a < mnd; a++)
      if (p->placements[a].kind == RESHARD_PLACEMENT_SHARD && p->placements[a].dim == d) {
        if (p->placements[a].split_sizes && blk > 1)
          return rs_error(RESHARD_ERROR_INTERNAL, "model '%s': tensor '%s': uneven splits of blocked dim %d", m->path,
                          w->name, d);
        pieces *= mshape[a];
      }
    int must_end_on_block = G == 1 && d == cd && k < nparts - 1;
    if (blk > 1 && (pieces > 1 || must_end_on_block) && w->shape[d] % (pieces * blk))
      return rs_error(RESHARD_ERROR_INVALID_ARGUMENT,
                      "model '%s': tensor '%s': dim %d (%lld) is cut into %lld piece%s%s that are not whole blocks of "
                      "%lld, so its weight_scale_inv cannot be split like it (choose other tp/ep/etp)",
                      m->path, w->name, d, (long long)w->shape[d], (long long)pieces, pieces == 1 ? "" : "s",
                      must_end_on_block ? " followed by another fused part" : "", (long long)blk);
  }
  return RESHARD_SUCCESS;
}

/* The scale buffer's parts: each weight part with its scale tensor, and a
 * window of the scales where the weight has one (the same leading dims,
 * every block of the last two). */
static void scale_parts(const rm_builder *b, int num_parts, const reshard_part_t *parts, const int64_t *const *origins,
                        reshard_part_t *sp, int64_t (*wshape)[RESHARD_MAX_DIMS]) {
  const rm_model *m = b->m;
  for (int k = 0; k < num_parts; k++) {
    sp[k] = parts[k];
    sp[k].tensor_id = m->tensors[parts[k].tensor_id].scale;
    if (!origins || !origins[k]) continue;
    const rm_tensor *s = &m->tensors[sp[k].tensor_id];
    for (int d = 0; d < s->ndim; d++)
      wshape[k][d] = d < s->ndim - 2 && parts[k].padded_shape ? parts[k].padded_shape[d] : s->shape[d] - origins[k][d];
    sp[k].padded_shape = wshape[k];
  }
}

reshard_result_t rm_add_weights(rm_builder *b, const char *name, int concat_dim, int num_groups, int num_parts,
                                const reshard_part_t *parts, const int64_t *const *origins) {
  const rm_model *m = b->m;
  int scaled = 0;
  for (int k = 0; k < num_parts; k++) scaled += m->tensors[parts[k].tensor_id].scale >= 0;
  if (scaled && scaled != num_parts)
    return rs_error(RESHARD_ERROR_INTERNAL, "model '%s': buffer '%s' fuses scaled and unscaled tensors", m->path, name);
  for (int k = 0; k < num_parts && scaled; k++)
    RS_CHECK(check_scale_split(b, concat_dim, num_groups, num_parts, k, &parts[k], origins ? origins[k] : NULL));
  if (origins) {
    if (num_groups != 1)
      return rs_error(RESHARD_ERROR_INTERNAL, "model '%s': buffer '%s': windows and groups", m->path, name);
    RS_CHECK(reshard_layout_add_windows(b->L, name, concat_dim, num_parts, parts, origins, NULL));
  } else {
    RS_CHECK(reshard_layout_add_fused(b->L, name, concat_dim, num_groups, num_parts, parts, NULL));
  }
  if (!scaled) return RESHARD_SUCCESS;
  reshard_part_t *sp = malloc((size_t)num_parts * sizeof *sp);
  int64_t(*wshape)[RESHARD_MAX_DIMS] = origins ? malloc((size_t)num_parts * sizeof *wshape) : NULL;
  if (!sp || (origins && !wshape)) {
    free(sp);
    free(wshape);
    return rs_error(RESHARD_ERROR_OUT_OF_MEMORY, "model '%s': out of memory", m->path);
  }
  scale_parts(b, num_parts, parts, origins, sp, wshape);
  char sname[320];
  snprintf(sname, sizeof sname, "%s_scale_inv", name);
  reshard_result_t r = origins ? reshard_layout_add_windows(b->L, sname, concat_dim, num_parts, sp, origins, NULL)
                               : reshard_layout_add_fused(b->L, sname, concat_dim, num_groups, num_parts, sp, NULL);
  free(sp);
  free(wshape);
  return r;
}

reshard_result_t rm_weight1(rm_builder *b, const char *name, int tensor, int mesh, const reshard_placement_t *pl) {
  reshard_part_t part = {tensor, mesh, pl, NULL};
  return rm_add_weights(b, name, 0, 1, 1, &part, NULL);
}

/* The scale tensors of parts' tensors: 1 and ids in s[] when all have
 * them, 0 when none, an error when some. */
static reshard_result_t scales_of(const rm_builder *b, const char *name, int n, const int *ids, int *s, int *scaled) {
  int k = 0;
  for (int i = 0; i < n; i++) k += (s[i] = b->m->tensors[ids[i]].scale) >= 0;
  if (k && k != n)
    return rs_error(RESHARD_ERROR_INTERNAL, "model '%s': buffer '%s' fuses scaled and unscaled tensors", b->m->path,
                    name);
  *scaled = k != 0;
  return RESHARD_SUCCESS;
}

reshard_result_t rm_add_qkv(rm_builder *b, const char *name, int vllm, int q, int k, int v, int mesh, int tp_axis) {
  const rm_config *c = &b->m->c;
  reshard_result_t (*add)(reshard_layout_t *, const char *, const reshard_attention_t *, int, int, int *) =
      vllm ? reshard_layout_add_vllm_qkv : reshard_layout_add_megatron_qkv;
  reshard_attention_t a = {q, k, v, (int)c->heads, (int)c->kv_heads, c->head_dim};
  RS_CHECK(add(b->L, name, &a, mesh, tp_axis, NULL));
  int ids[3] = {q, k, v}, s[3], scaled = 0;
  RS_CHECK(scales_of(b, name, 3, ids, s, &scaled));
  if (!scaled) return RESHARD_SUCCESS;
  /* The scales split like their weights in blocks of rows. With whole
   * blocks per head every cut (between heads, KV groups or TP pieces) is a
   * block boundary: the same numbers, head_dim in blocks. Otherwise only
   * vLLM without KV replication can be split, as plain rows: q and k/v cut
   * evenly into tp pieces of whole blocks, which vLLM requires too
   * (vllm/model_executor/layers/quantization/utils/fp8_utils.py,
   * validate_fp8_block_shape: every output partition, q's and k/v's per
   * rank, a multiple of block_n), i.e. heads and KV heads of one row of
   * blocks each. */
  const int64_t blk = c->block[0];
  int nd, shape[RESHARD_MAX_MESH_DIMS];
  RS_CHECK(reshard_layout_mesh_shape(b->L, mesh, &nd, shape));
  const int64_t tp = tp_axis < 0 ? 1 : shape[tp_axis];
  reshard_attention_t sa = {s[0], s[1], s[2], (int)c->heads, (int)c->kv_heads, c->head_dim / blk};
  if (c->head_dim % blk) {
    const int64_t qrows = c->heads * c->head_dim, kvrows = c->kv_heads * c->head_dim;
    if (!vllm || tp > c->kv_heads || qrows % (tp * blk) || kvrows % (tp * blk))
      return rs_error(RESHARD_ERROR_INVALID_ARGUMENT,
                      "model '%s': buffer '%s': head_dim %lld is not whole blocks of %lld rows%s, so the "
                      "weight_scale_inv of q, k and v cannot be split like them (choose another tp)",
                      b->m->path, name, (long long)c->head_dim, (long long)blk,
                      !vllm ? " (Megatron interleaves q, k and v per KV group)"
                      : tp > c->kv_heads ? " (each TP rank holds one replicated KV head)"
                                         : ", nor are q's and k/v's rows cut in tp pieces");
    sa = (reshard_attention_t){s[0], s[1], s[2], (int)(qrows / blk), (int)(kvrows / blk), 1};
  }
  char sname[320];
  snprintf(sname, sizeof sname, "%s_scale_inv", name);
  return add(b->L, sname, &sa, mesh, tp_axis, NULL);
}

reshard_result_t rm_add_gate_up(rm_builder *b, const char *name, int gate, int up, int mesh, int tp_axis) {
  RS_CHECK(reshard_layout_add_gate_up(b->L, name, gate, up, mesh, tp_axis, NULL));
  int ids[2] = {gate, up}, s[2], scaled = 0;
  RS_CHECK(scales_of(b, name, 2, ids, s, &scaled));
  if (!scaled) return RESHARD_SUCCESS;
  /* the whole-block checks of rm_add_weights, on the parts the builder
   * made: Shard(0) on tp_axis, Replicate elsewhere */
  int nd, shape[RESHARD_MAX_MESH_DIMS];
  RS_CHECK(reshard_layout_mesh_shape(b->L, mesh, &nd, shape));
  reshard_placement_t pl[RESHARD_MAX_MESH_DIMS];
  for (int a = 0; a < nd; a++) pl[a] = a == tp_axis ? reshard_shard(0) : reshard_replicate();
  const reshard_part_t parts[2] = {{gate, mesh, pl, NULL}, {up, mesh, pl, NULL}};
  for (int i = 0; i < 2; i++) RS_CHECK(check_scale_split(b, 0, 1, 2, i, &parts[i], NULL));
  char sname[320];
  snprintf(sname, sizeof sname, "%s_scale_inv", name);
  return reshard_layout_add_gate_up(b->L, sname, s[0], s[1], mesh, tp_axis, NULL);
}
