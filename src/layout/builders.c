/* Builders for the fused layouts of Megatron-core and vLLM
 * (include/reshard.h): the model's numbers in, reshard_layout_add_fused
 * out. The group arithmetic lives here once; the model front-end
 * (src/models) calls these too.
 *
 * Upstream, and where:
 *   Megatron-core linear_qkv: megatron/core/transformer/attention.py,
 *     SelfAttention.get_query_key_value_tensors views the local rows as
 *     [groups/tp, (heads/groups + 2) * head_dim] = per group [q; k; v];
 *     ColumnParallelLinear gives each TP rank a contiguous row chunk.
 *   Megatron-core gated linear_fc1: megatron/core/transformer/mlp.py,
 *     MLP.forward chunks the local output in two: [gate shard; up shard].
 *   vLLM qkv_proj: vllm/model_executor/layers/linear.py,
 *     QKVParallelLinear.__init__ (num_heads = total / tp; tp >= total_kv:
 *     one KV head, num_kv_head_replicas = tp / total_kv; else total_kv /
 *     tp heads) and weight_loader (KV shard_id = tp_rank //
 *     num_kv_head_replicas).
 *   vLLM gate_up_proj: the same file, MergedColumnParallelLinear: each
 *     output (gate, up) split over TP, the shards concatenated. */
#include <stdio.h>
#include <string.h>

#include "common/checked.h"
#include "common/error.h"
#include "layout/layout.h"

static const char *bn(const char *name) { return name ? name : "(unnamed)"; }

/* mesh_id and tp_axis valid; *tp the TP axis' size (1 for -1). */
static reshard_result_t tp_axis_size(const reshard_layout_t *L, const char *name, int mesh_id, int tp_axis, int *tp) {
  if (mesh_id < 0 || mesh_id >= L->nmeshes)
    return rs_error(RESHARD_ERROR_INVALID_ARGUMENT, "buffer '%s': mesh_id %d is not a mesh of this layout (%d meshes)",
                    bn(name), mesh_id, L->nmeshes);
  const rs_mesh *m = &L->meshes[mesh_id];
  if (tp_axis < -1 || tp_axis >= m->ndim)
    return rs_error(RESHARD_ERROR_INVALID_ARGUMENT,
                    "buffer '%s': tp_axis %d is not an axis of mesh %d (%d axes; -1: no tensor parallelism)", bn(name),
                    tp_axis, mesh_id, m->ndim);
  *tp = tp_axis < 0 ? 1 : m->shape[tp_axis];
  return RESHARD_SUCCESS;
}

/* Shard(0) on the TP axis, Replicate on the others. */
static void column_parallel(int ndim, int tp_axis, reshard_placement_t *pl) {
  for (int a = 0; a < ndim; a++) pl[a] = a == tp_axis ? reshard_shard(0) : reshard_replicate();
}

static reshard_result_t check_id(const reshard_layout_t *L, const char *name, const char *field, int id) {
  if (id < 0 || id >= L->ntensors)
    return rs_error(RESHARD_ERROR_INVALID_ARGUMENT, "buffer '%s': %s = %d is not a tensor of this layout (%d tensors)",
                    bn(name), field, id, L->ntensors);
  return RESHARD_SUCCESS;
}

/* The projection's rows are heads x head_dim. */
static reshard_result_t check_rows(const reshard_layout_t *L, const char *name, const char *field, int id, int heads,
                                   const char *heads_field, int other_heads, int64_t head_dim) {
  const rs_tensor *t = &L->tensors[id];
  int64_t rows, other;
  if (rs_mul_overflow_i64(heads, head_dim, &rows) || rs_mul_overflow_i64(other_heads, head_dim, &other))
    return rs_error(RESHARD_ERROR_INVALID_ARGUMENT, "buffer '%s': head_dim %lld times the head counts overflows",
                    bn(name), (long long)head_dim);
  if (t->ndim < 1 || t->shape[0] != rows)
    return rs_error(RESHARD_ERROR_INVALID_ARGUMENT,
                    "buffer '%s': tensor '%s' (%s) has %lld rows, but %s %d x head_dim %lld = %lld%s", bn(name),
                    t->name, field, (long long)(t->ndim ? t->shape[0] : 0), heads_field, heads, (long long)head_dim,
                    (long long)rows, t->ndim && t->shape[0] == other ? " (num_heads and num_kv_heads swapped?)" : "");
  return RESHARD_SUCCESS;
}

static reshard_result_t check_attention(const reshard_layout_t *L, const char *name, const reshard_attention_t *a) {
  if (!a) return rs_error(RESHARD_ERROR_INVALID_ARGUMENT, "buffer '%s': attn is NULL", bn(name));
  RS_CHECK(check_id(L, name, "attn.q", a->q));
  RS_CHECK(check_id(L, name, "attn.k", a->k));
  RS_CHECK(check_id(L, name, "attn.v", a->v));
  if (a->num_heads < 1 || a->num_kv_heads < 1 || a->head_dim < 1)
    return rs_error(RESHARD_ERROR_INVALID_ARGUMENT,
                    "buffer '%s': num_heads %d, num_kv_heads %d and head_dim %lld must all be >= 1", bn(name),
                    a->num_heads, a->num_kv_heads, (long long)a->head_dim);
  /* the rows first: a swap of the two head counts shows there */
  RS_CHECK(check_rows(L, name, "attn.q", a->q, a->num_heads, "num_heads", a->num_kv_heads, a->head_dim));
  RS_CHECK(check_rows(L, name, "attn.k", a->k, a->num_kv_heads, "num_kv_heads", a->num_heads, a->head_dim));
  RS_CHECK(check_rows(L, name, "attn.v", a->v, a->num_kv_heads, "num_kv_heads", a->num_heads, a->head_dim));
  if (a->num_heads % a->num_kv_heads)
    return rs_error(RESHARD_ERROR_INVALID_ARGUMENT,
                    "buffer '%s': num_heads %d is not a multiple of num_kv_heads %d (each KV head serves a whole "
                    "group of query heads)",
                    bn(name), a->num_heads, a->num_kv_heads);
  return RESHARD_SUCCESS;
}

reshard_result_t reshard_layout_add_megatron_qkv(reshard_layout_t *L, const char *name,
                                                 const reshard_attention_t *attn, int mesh_id, int tp_axis,
                                                 int *buffer_id) {
  rs_error_clear();
  if (!L) return rs_error(RESHARD_ERROR_INVALID_ARGUMENT, "add_megatron_qkv: layout is NULL");
  int tp;
  RS_CHECK(tp_axis_size(L, name, mesh_id, tp_axis, &tp));
  RS_CHECK(check_attention(L, name, attn));
  if (attn->num_kv_heads % tp)
    return rs_error(RESHARD_ERROR_INVALID_ARGUMENT,
                    "buffer '%s': tp %d (mesh %d axis %d) does not divide num_kv_heads %d: Megatron-core then splits "
                    "linear_qkv evenly and gathers the groups back in the forward (not modelled)",
                    bn(name), tp, mesh_id, tp_axis, attn->num_kv_heads);
  reshard_placement_t pl[RESHARD_MAX_MESH_DIMS];
  column_parallel(L->meshes[mesh_id].ndim, tp_axis, pl);
  /* num_groups = num_kv_heads: each of q, k, v is cut into one block per
   * KV group, and a rank's buffer interleaves its groups' blocks */
  const reshard_part_t parts[3] = {
      {attn->q, mesh_id, pl, NULL}, {attn->k, mesh_id, pl, NULL}, {attn->v, mesh_id, pl, NULL}};
  return reshard_layout_add_fused(L, name, 0, attn->num_kv_heads, 3, parts, buffer_id);
}

/* mesh_id with its TP axis split into [kv, tp / kv] (the same ranks in the
 * same order): found among the layout's meshes, or added. */
static reshard_result_t replica_mesh(reshard_layout_t *L, const char *name, int mesh_id, int tp_axis, int kv,
                                     int *out) {
  const rs_mesh *m = &L->meshes[mesh_id];
  if (m->ndim + 1 > RESHARD_MAX_MESH_DIMS)
    return rs_error(RESHARD_ERROR_INVALID_ARGUMENT,
                    "buffer '%s': mesh %d has %d axes; replicating KV heads splits its TP axis in two, past the %d "
                    "axes a mesh may have",
                    bn(name), mesh_id, m->ndim, RESHARD_MAX_MESH_DIMS);
  int shape[RESHARD_MAX_MESH_DIMS], nd = 0;
  for (int a = 0; a < m->ndim; a++) {
    if (a == tp_axis) {
      shape[nd++] = kv;
      shape[nd++] = m->shape[a] / kv;
    } else {
      shape[nd++] = m->shape[a];
    }
  }
  for (int i = L->nmeshes - 1; i >= 0; i--) {
    const rs_mesh *c = &L->meshes[i];
    if (c->ndim == nd && c->size == m->size && !memcmp(c->shape, shape, (size_t)nd * sizeof *shape) &&
        !memcmp(c->ranks, m->ranks, (size_t)m->size * sizeof *m->ranks)) {
      *out = i;
      return RESHARD_SUCCESS;
    }
  }
  /* m->ranks is its own allocation: add_mesh copies it before growing the
   * mesh table that holds m */
  return reshard_layout_add_mesh(L, nd, shape, m->ranks, out);
}

reshard_result_t reshard_layout_add_vllm_qkv(reshard_layout_t *L, const char *name, const reshard_attention_t *attn,
                                             int mesh_id, int tp_axis, int *buffer_id) {
  rs_error_clear();
  if (!L) return rs_error(RESHARD_ERROR_INVALID_ARGUMENT, "add_vllm_qkv: layout is NULL");
  int tp;
  RS_CHECK(tp_axis_size(L, name, mesh_id, tp_axis, &tp));
  RS_CHECK(check_attention(L, name, attn));
  const int kv = attn->num_kv_heads;
  if (attn->num_heads % tp || (tp > kv ? tp % kv : kv % tp))
    return rs_error(RESHARD_ERROR_INVALID_ARGUMENT,
                    "buffer '%s': tp %d (mesh %d axis %d) must divide num_heads %d, and tp and num_kv_heads %d must "
                    "divide one another (QKVParallelLinear)",
                    bn(name), tp, mesh_id, tp_axis, attn->num_heads, kv);
  const int ndim = L->meshes[mesh_id].ndim;
  reshard_placement_t qpl[RESHARD_MAX_MESH_DIMS], kvpl[RESHARD_MAX_MESH_DIMS];
  column_parallel(ndim, tp_axis, qpl);
  int kvmesh = mesh_id;
  const int nmeshes = L->nmeshes;
  if (tp > kv) {
    /* KV head h on the TP ranks [h * tp/kv, (h + 1) * tp/kv): Shard(0) on
     * the kv axis, Replicate on the replica axis */
    RS_CHECK(replica_mesh(L, name, mesh_id, tp_axis, kv, &kvmesh));
    column_parallel(ndim + 1, tp_axis, kvpl);
  } else {
    column_parallel(ndim, tp_axis, kvpl);
  }
  const reshard_part_t parts[3] = {
      {attn->q, mesh_id, qpl, NULL}, {attn->k, kvmesh, kvpl, NULL}, {attn->v, kvmesh, kvpl, NULL}};
  reshard_result_t r = reshard_layout_add_fused(L, name, 0, 1, 3, parts, buffer_id);
  if (r != RESHARD_SUCCESS && L->nmeshes > nmeshes) rs_layout_drop_last_mesh(L); /* refused: changes nothing */
  return r;
}

reshard_result_t reshard_layout_add_gate_up(reshard_layout_t *L, const char *name, int gate, int up, int mesh_id,
                                            int tp_axis, int *buffer_id) {
  rs_error_clear();
  if (!L) return rs_error(RESHARD_ERROR_INVALID_ARGUMENT, "add_gate_up: layout is NULL");
  int tp;
  RS_CHECK(tp_axis_size(L, name, mesh_id, tp_axis, &tp));
  RS_CHECK(check_id(L, name, "gate", gate));
  RS_CHECK(check_id(L, name, "up", up));
  const rs_tensor *g = &L->tensors[gate], *u = &L->tensors[up];
  if (g->ndim != u->ndim || memcmp(g->shape, u->shape, (size_t)g->ndim * sizeof *g->shape))
    return rs_error(RESHARD_ERROR_INVALID_ARGUMENT,
                    "buffer '%s': gate '%s' and up '%s' differ in shape (%d dims, %lld rows vs %d dims, %lld rows): "
                    "a gated MLP's two projections have one shape",
                    bn(name), g->name, u->name, g->ndim, (long long)g->shape[0], u->ndim, (long long)u->shape[0]);
  if (g->ndim < 1)
    return rs_error(RESHARD_ERROR_INVALID_ARGUMENT, "buffer '%s': gate '%s' is a scalar; gate and up have rows",
                    bn(name), g->name);
  if (g->shape[0] % tp)
    return rs_error(RESHARD_ERROR_INVALID_ARGUMENT,
                    "buffer '%s': tp %d (mesh %d axis %d) does not divide the %lld rows (intermediate size) of '%s'",
                    bn(name), tp, mesh_id, tp_axis, (long long)g->shape[0], g->name);
  reshard_placement_t pl[RESHARD_MAX_MESH_DIMS];
  column_parallel(L->meshes[mesh_id].ndim, tp_axis, pl);
  const reshard_part_t parts[2] = {{gate, mesh_id, pl, NULL}, {up, mesh_id, pl, NULL}};
  return reshard_layout_add_fused(L, name, 0, 1, 2, parts, buffer_id);
}
