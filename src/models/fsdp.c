/* The FSDP2 layout of a HuggingFace transformers model (rm_fsdp_layout,
 * include/reshard_models.h): what torch.distributed.fsdp.fully_shard
 * gives each parameter, from the config alone. The live-model twin is
 * python/reshard/dtensor.py (Layout.from_module). */
#include <stdlib.h>

#include "common/error.h"
#include "models_internal.h"

reshard_result_t rm_fsdp_layout(const rm_model *m, const rm_parallel *p, int first_rank, reshard_layout_t **out) {
  rs_error_clear();
  if (!m || !p || !out) return rs_error(RESHARD_ERROR_INVALID_ARGUMENT, "fsdp layout: NULL argument");
  *out = NULL;
  /* the other frameworks' keys: FSDP2 x TP / PP follows each framework's
   * own plan, which a config does not say */
  if (p->tp != 1 || p->pp != 1 || p->dp != 1 || p->ep != 1 || p->etp)
    return rs_error(RESHARD_ERROR_INVALID_ARGUMENT,
                    "fsdp layout: key '%s' is not FSDP2's (dp_shard, dp_replicate); tensor or pipeline parallelism "
                    "under FSDP2 follows the framework's own plan: read it from the live model "
                    "(reshard.Layout.from_module)",
                    p->tp != 1 ? "tp" : p->pp != 1 ? "pp" : p->dp != 1 ? "dp" : p->ep != 1 ? "ep" : "etp");
  if (p->vocab || p->first || p->last || !p->grouped_gemm || p->cp || p->sp_moe >= 0 || p->w31)
    return rs_error(RESHARD_ERROR_INVALID_ARGUMENT, "fsdp layout: key '%s' is %s, not FSDP2's",
                    p->vocab ? "vocab" : p->first ? "first" : p->last ? "last" : !p->grouped_gemm ? "grouped_gemm"
                                                                           : p->cp ? "cp" : p->sp_moe >= 0 ? "sp_moe" : "w31",
                    p->sp_moe >= 0 || p->w31 ? "vLLM's" : "Megatron's");
  if (rm_sglang_key(p))
    return rs_error(RESHARD_ERROR_INVALID_ARGUMENT, "fsdp layout: key '%s' is SGLang's, not FSDP2's",
                    rm_sglang_key(p));
  if (m->c.experts > 0)
    return rs_error(RESHARD_ERROR_INVALID_ARGUMENT,
                    "fsdp layout: '%s' is a MoE model: transformers 5 holds its experts fused "
                    "(modeling_qwen3_moe.py Qwen3MoeExperts: gate_up_proj [E, 2 I, H]), not as the checkpoint's "
                    "tensors reshard's model lists; not modelled yet",
                    m->path);
  if (m->block_scales)
    return rs_error(RESHARD_ERROR_INVALID_ARGUMENT,
                    "fsdp layout: '%s' has block scales; an FSDP2 trainer holds the model's dtype (load it without "
                    "block_scales)",
                    m->path);
  const int shard = p->dp_shard ? p->dp_shard : 1, rep = p->dp_replicate ? p->dp_replicate : 1;
  if (first_rank < 0) return rs_error(RESHARD_ERROR_INVALID_ARGUMENT, "fsdp layout: first rank %d is negative", first_rank);
  if ((int64_t)shard * rep + first_rank > (1 << 30))
    return rs_error(RESHARD_ERROR_INVALID_ARGUMENT, "fsdp layout: dp_replicate %d x dp_shard %d ranks from rank %d "
                    "are too many", rep, shard, first_rank);
  reshard_layout_t *L = NULL;
  reshard_result_t r;
  RS_CHECK(reshard_layout_create(&L));
  if ((r = rm_declare_tensors(L, m))) goto fail;
  /* init_device_mesh's row-major ranks; a 1-D mesh without replicas, as
   * fully_shard(mesh=init_device_mesh(..., (dp_shard,))) has it */
  int mesh;
  const reshard_placement_t hsdp[2] = {reshard_replicate(), reshard_shard(0)};
  const int shape[2] = {rep, shard};
  if ((r = rep > 1 ? reshard_layout_add_mesh_strided(L, 2, shape, first_rank, 1, &mesh)
                   : reshard_layout_add_mesh_strided(L, 1, shape + 1, first_rank, 1, &mesh)))
    goto fail;
  for (int i = 0; i < m->ntensors; i++) {
    int b;
    const rm_tensor *t = &m->tensors[i];
    if ((r = reshard_layout_place_named(L, t->name, i, mesh, rep > 1 ? hsdp : hsdp + 1, &b))) goto fail;
  }
  *out = L;
  return RESHARD_SUCCESS;
fail:
  reshard_layout_destroy(L);
  return r;
}
