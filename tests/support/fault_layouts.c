#include "support/fault_layouts.h"

#include <stddef.h>
#include <stdio.h>

#define SHAPE(...) ((const int64_t[]){__VA_ARGS__})
#define DIMS(...) ((const int[]){__VA_ARGS__})

/* Runs one builder call through the guard: a failure the guard accepts is
 * retried once; any failure left returns from the builder. */
#define FL(call)                                                          \
  do {                                                                    \
    reshard_result_t fl_r_ = (call);                                      \
    if (fl_r_ != RESHARD_SUCCESS && g && g->on_fail &&                    \
        g->on_fail(g->ctx, fl_r_, #call))                                 \
      fl_r_ = (call);                                                     \
    if (fl_r_ != RESHARD_SUCCESS) return fl_r_;                           \
  } while (0)

/* Nine small tensors fused into one buffer: more parts than lowering keeps
 * on the stack. */
#define FL_NBIAS 9
static reshard_result_t add_biases(reshard_layout_t *L, const fl_guard *g, int *ids) {
  for (int i = 0; i < FL_NBIAS; i++) {
    char name[16];
    snprintf(name, sizeof name, "bias%d", i);
    FL(reshard_layout_add_tensor(L, name, RESHARD_FP32, 1, SHAPE(3), &ids[i]));
  }
  return RESHARD_SUCCESS;
}

static reshard_result_t fuse_biases(reshard_layout_t *L, const fl_guard *g, const int *ids, int mesh,
                                    const reshard_placement_t *pl) {
  reshard_part_t parts[FL_NBIAS];
  for (int i = 0; i < FL_NBIAS; i++) parts[i] = (reshard_part_t){ids[i], mesh, pl, NULL};
  int id;
  FL(reshard_layout_add_fused(L, "biases", 0, 1, FL_NBIAS, parts, &id));
  return RESHARD_SUCCESS;
}

static reshard_result_t build_src(reshard_layout_t **out, const fl_guard *g) {
  FL(reshard_layout_create(out));
  reshard_layout_t *L = *out;
  int q, k, v, w, emb, norm, raw, step, s22, s4, id;
  FL(reshard_layout_add_tensor(L, "q", RESHARD_FP32, 2, SHAPE(8, 12), &q));
  FL(reshard_layout_add_tensor(L, "k", RESHARD_FP32, 2, SHAPE(4, 12), &k));
  FL(reshard_layout_add_tensor(L, "v", RESHARD_FP32, 2, SHAPE(4, 12), &v));
  FL(reshard_layout_add_tensor(L, "w", RESHARD_BF16, 2, SHAPE(12, 20), &w));
  FL(reshard_layout_add_tensor(L, "emb", RESHARD_FP16, 2, SHAPE(10, 4), &emb));
  FL(reshard_layout_add_tensor(L, "norm", RESHARD_FP32, 1, SHAPE(6), &norm));
  FL(reshard_layout_add_tensor(L, "raw", RESHARD_INT32, 2, SHAPE(4, 4), &raw));
  FL(reshard_layout_add_tensor(L, "step", RESHARD_INT64, 0, NULL, &step));
  /* (data parallel, tensor parallel) and a flat grid */
  FL(reshard_layout_add_mesh_strided(L, 2, DIMS(2, 2), 0, 1, &s22));
  FL(reshard_layout_add_mesh(L, 1, DIMS(4), DIMS(3, 2, 1, 0), &s4));
  /* Megatron fused QKV with two KV groups split over TP */
  const reshard_placement_t rs0[2] = {reshard_replicate(), reshard_shard(0)};
  const reshard_part_t qkv[3] = {{q, s22, rs0, NULL}, {k, s22, rs0, NULL}, {v, s22, rs0, NULL}};
  FL(reshard_layout_add_fused(L, "qkv", 0, 2, 3, qkv, &id));
  const reshard_placement_t rs1[2] = {reshard_replicate(), reshard_shard(1)};
  FL(reshard_layout_place(L, w, s22, rs1, &id));
  /* a vocabulary padded to a multiple of the shard count */
  const reshard_placement_t s0[1] = {reshard_shard(0)};
  const reshard_part_t padded = {emb, s4, s0, SHAPE(12, 4)};
  FL(reshard_layout_add_fused(L, "emb", 0, 1, 1, &padded, &id));
  const reshard_placement_t rr[2] = {reshard_replicate(), reshard_replicate()};
  FL(reshard_layout_place(L, norm, s22, rr, &id));
  const reshard_placement_t s1[1] = {reshard_shard(1)};
  FL(reshard_layout_place(L, raw, s4, s1, &id));
  FL(reshard_layout_place(L, step, s22, rr, &id));
  int bias[FL_NBIAS];
  reshard_result_t res = add_biases(L, g, bias);
  if (res == RESHARD_SUCCESS) res = fuse_biases(L, g, bias, s22, rr);
  return res;
}

static reshard_result_t build_dst(reshard_layout_t **out, const fl_guard *g) {
  FL(reshard_layout_create(out));
  reshard_layout_t *L = *out;
  int q, k, v, w, emb, norm, raw, step, d4, d22, d2, id, r1, r3;
  /* declared in another order than the source: matched by name */
  FL(reshard_layout_add_tensor(L, "step", RESHARD_INT64, 0, NULL, &step));
  FL(reshard_layout_add_tensor(L, "w", RESHARD_BF16, 2, SHAPE(12, 20), &w));
  FL(reshard_layout_add_tensor(L, "q", RESHARD_FP32, 2, SHAPE(8, 12), &q));
  FL(reshard_layout_add_tensor(L, "k", RESHARD_FP32, 2, SHAPE(4, 12), &k));
  FL(reshard_layout_add_tensor(L, "v", RESHARD_FP32, 2, SHAPE(4, 12), &v));
  FL(reshard_layout_add_tensor(L, "emb", RESHARD_FP16, 2, SHAPE(10, 4), &emb));
  FL(reshard_layout_add_tensor(L, "norm", RESHARD_FP32, 1, SHAPE(6), &norm));
  FL(reshard_layout_add_tensor(L, "raw", RESHARD_INT32, 2, SHAPE(4, 4), &raw));
  FL(reshard_layout_add_mesh_strided(L, 1, DIMS(4), 0, 1, &d4));
  FL(reshard_layout_add_mesh_strided(L, 2, DIMS(2, 2), 0, 1, &d22));
  FL(reshard_layout_add_mesh_strided(L, 1, DIMS(2), 2, 1, &d2));
  /* vLLM qkv_proj: Q over all four ranks, K and V over two KV heads each
   * replicated twice */
  const reshard_placement_t s0[1] = {reshard_shard(0)};
  const reshard_placement_t s0r[2] = {reshard_shard(0), reshard_replicate()};
  const reshard_part_t qkv[3] = {{q, d4, s0, NULL}, {k, d22, s0r, NULL}, {v, d22, s0r, NULL}};
  FL(reshard_layout_add_fused(L, "qkv_proj", 0, 1, 3, qkv, &id));
  const reshard_placement_t uneven[1] = {reshard_shard_sizes(0, SHAPE(4, 4, 2, 2))};
  FL(reshard_layout_place(L, w, d4, uneven, &id));
  const reshard_placement_t r[1] = {reshard_replicate()};
  FL(reshard_layout_place(L, emb, d4, r, &id));
  FL(reshard_layout_place(L, norm, d2, r, &id));
  FL(reshard_layout_place(L, step, d4, r, &id));
  /* raw buffers: two row blocks with a gap on rank 1, the transpose on
   * rank 3 */
  FL(reshard_layout_add_buffer(L, "raw_r1", 1, 96, &r1));
  const reshard_fragment_t top = {raw, r1, SHAPE(0, 0), SHAPE(2, 4), 0, NULL};
  const reshard_fragment_t bottom = {raw, r1, SHAPE(2, 0), SHAPE(2, 4), 48, SHAPE(4, 1)};
  FL(reshard_layout_add_fragment(L, &top));
  FL(reshard_layout_add_fragment(L, &bottom));
  FL(reshard_layout_add_buffer(L, "raw_r3", 3, 64, &r3));
  const reshard_fragment_t transposed = {raw, r3, SHAPE(0, 0), SHAPE(4, 4), 0, SHAPE(1, 4)};
  FL(reshard_layout_add_fragment(L, &transposed));
  /* rows of 3 over 4 ranks: the last rank's pieces are empty */
  int bias[FL_NBIAS];
  reshard_result_t res = add_biases(L, g, bias);
  if (res == RESHARD_SUCCESS) res = fuse_biases(L, g, bias, d4, s0);
  return res;
}

reshard_result_t fl_build_mixed(reshard_layout_t **src, reshard_layout_t **dst,
                                const fl_guard *g) {
  *src = *dst = NULL;
  reshard_result_t r = build_src(src, g);
  if (r == RESHARD_SUCCESS) r = build_dst(dst, g);
  return r;
}

reshard_options_t fl_options(void) {
  reshard_options_t o = RESHARD_OPTIONS_INITIALIZER;
  o.staging_bytes = 4096;
  o.chunk_bytes = 64;
  o.timeout_ms = 20000;
  o.topology = "h100-8x400g";
  return o;
}
