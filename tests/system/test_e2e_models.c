/* End to end on small real architectures (tests/data, through the model
 * front-end): Megatron training layouts to vLLM (or, with an infer spec
 * "sglang:...", SGLang) inference layouts over the in-process transport,
 * byte-exact, including every byte around fragments. */
#include <string.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>

#include "reshard_models.h"
#include "reshard.h"
#include "support/harness.h"

/* block_scales: the fp8 checkpoint format (fp8 weights and fp32
 * weight_scale_inv tensors fused like them). */
static void run_pair_ex(const char *config, int block_scales, const char *train, const char *infer, int colocate,
                        size_t staging, int expect_nranks) {
  char path[4096];
  snprintf(path, sizeof path, "%s/%s", RESHARD_TEST_DATA, config);
  rm_model *m = NULL;
  rm_parallel tp, ip;
  reshard_layout_t *src = NULL, *dst = NULL;
  rm_model_options o = RM_MODEL_OPTIONS_INIT;
  o.block_scales = block_scales;
  reshard_result_t r = rm_model_load_ex(path, &o, &m);
  if (!r) r = rm_parse_parallel(train, &tp);
  const int sglang = !strncmp(infer, "sglang:", 7);
  if (!r) r = rm_parse_parallel(sglang ? infer + 7 : infer, &ip);
  int S = r ? 0 : rm_parallel_ranks(&tp), D = r ? 0 : rm_parallel_ranks(&ip);
  if (!r) r = rm_megatron_layout(m, &tp, 0, &src);
  if (!r) r = (sglang ? rm_sglang_layout : rm_vllm_layout)(m, &ip, colocate ? 0 : S, &dst);
  if (r) print_error("%s %s -> %s: %s\n", config, train, infer, reshard_last_error());
  assert_int_equal(r, RESHARD_SUCCESS);
  int nranks = colocate ? (S > D ? S : D) : S + D;
  assert_int_equal(nranks, expect_nranks);
  th_sync_args a = {.src = src, .dst = dst, .opts = RESHARD_OPTIONS_INITIALIZER, .steps = 3};
  if (staging) a.opts.staging_bytes = staging;
  assert_int_equal(th_sync(nranks, &a), 0);
  /* Guard against a vacuous pass: every destination replica of the model
   * was received or copied (at least one full copy of every parameter). */
  size_t moved = 0;
  for (int i = 0; i < nranks; i++) moved += a.recv_bytes[i] + a.local_bytes[i];
  assert_true(moved >= (size_t)rm_model_num_params(m) * (block_scales ? 1 : 2));
  reshard_layout_destroy(src);
  reshard_layout_destroy(dst);
  rm_model_free(m);
}

static void run_pair(const char *config, const char *train, const char *infer, int colocate, size_t staging,
                     int expect_nranks) {
  run_pair_ex(config, 0, train, infer, colocate, staging, expect_nranks);
}

static void llama_tp2pp2_to_tp2dp2(void **state) {
  (void)state;
  run_pair("tiny-llama.json", "tp=2,pp=2", "tp=2,dp=2", 0, 0, 8);
}

/* tp 4 > 2 KV heads: vLLM replicates each KV head on two TP ranks. */
static void tp2pp2dp2_to_tp4_kv_replication(void **state) {
  (void)state;
  run_pair("tiny-llama.json", "tp=2,pp=2,dp=2", "tp=4", 0, 0, 12);
}

/* fp8 with block scales: q/k/v and their scales through the builders,
 * Megatron's KV groups to vLLM's replicated KV heads (tp 4 > 2), and
 * gate/up with theirs. */
static void fp8_block_scales_tp2_to_tp4(void **state) {
  (void)state;
  run_pair_ex("tiny-llama-fp8.json", 1, "tp=2", "tp=4", 0, 0, 6);
  run_pair_ex("tiny-llama-fp8.json", 1, "tp=2,dp=2", "tp=2,dp=2", 1, 4096, 4);
}

/* Megatron EP4 (over tp2 x dp2 of each stage, one TEGroupedMLP buffer per
 * local expert) -> vLLM EP4 over tp2 x dp2 with pp2 (vLLM's DP-outermost
 * rank order), with a staging budget small enough for many rounds. */
static void moe_ep4_to_ep4_pp2_small_staging(void **state) {
  (void)state;
  run_pair("tiny-qwen3-moe.json", "tp=2,pp=2,dp=2,ep=4,etp=1", "tp=2,pp=2,dp=2,ep=4", 0, 8192, 16);
}

/* MLA, shared experts (replicated in vLLM under sequence-parallel MoE:
 * ep > 1, tp > 1, dp > 1) and dense first layers; Megatron's uneven
 * stages (first=) and padded vocabulary (vocab=). */
static void deepseek_v3_ep(void **state) {
  (void)state;
  run_pair("tiny-deepseek-v3.json", "tp=2,pp=2,ep=2,etp=1", "tp=2,dp=2,ep=4", 0, 0, 8);
  run_pair("tiny-deepseek-v3.json", "tp=2,pp=3,ep=2,etp=1,first=2,vocab=1024", "tp=2,pp=2,dp=2,ep=4,sp_moe=0", 0,
           0, 14);
}

/* Megatron context parallelism (cp=2): CP ranks hold their TP rank's
 * weights and EP spans them (test_model_layouts: megatron_context_parallel
 * cites parallel_state.py); the Qwen3-235B shape NCCL M2N publishes,
 * TP2/CP2/PP4/EP16 -> TP8/DP8, at tiny size: tp2 cp2 pp2 ep4 -> tp2 dp4
 * ep8 (16 + 8 ranks), byte for byte, with replicas to balance over. */
static void context_parallel_cp2(void **state) {
  (void)state;
  run_pair("tiny-qwen3-moe.json", "tp=2,cp=2,pp=2,dp=2,ep=4,etp=1", "tp=2,dp=4,ep=8", 0, 8192, 24);
  run_pair("tiny-llama.json", "tp=2,cp=2,pp=2", "tp=4", 0, 0, 12);
}

/* 8 experts over vLLM's 6 EP ranks: the first two hold two. */
static void uneven_experts(void **state) {
  (void)state;
  run_pair("tiny-qwen3-moe.json", "tp=2,ep=2,etp=1", "tp=2,dp=3,ep=6", 0, 0, 8);
}

/* Both sides on the same four ranks: local copies and messages mixed. */
static void colocated(void **state) {
  (void)state;
  run_pair("tiny-llama.json", "tp=2,pp=2", "tp=2,dp=2", 1, 0, 4);
  run_pair("tiny-qwen3-moe.json", "tp=2,dp=2,ep=2", "tp=4,ep=4", 1, 16384, 4);
}

/* Megatron -> SGLang 0.5.23 (rm_sglang_layout): a dense model over
 * get_pp_indices' stages (remainder on the last) with data-parallel
 * replicas; Qwen3-MoE and Mixtral with EP inside the TP group, attention
 * DP and dp_lm_head; DeepSeek-V3 (MLA's fused_qkv_a_proj_with_mqa, dense
 * layer replicated with moe_dense_tp=1, shared experts over tp). */
static void sglang_dense(void **state) {
  (void)state;
  run_pair("tiny-llama.json", "tp=2,pp=2", "sglang:tp=2,pp=3,dp=2", 0, 0, 16);
  run_pair("tiny-llama.json", "tp=2,dp=2", "sglang:tp=4", 1, 4096, 4);
}

static void sglang_moe(void **state) {
  (void)state;
  run_pair("tiny-qwen3-moe.json", "tp=2,pp=2,ep=2,etp=1", "sglang:tp=4,ep=2,attn_dp=2,dp_lm_head=1", 0, 8192, 8);
  run_pair("tiny-qwen3-moe.json", "tp=2,ep=2,etp=1", "sglang:tp=2,pp=2,dp=2,ep=2", 0, 0, 10);
  run_pair("tiny-mixtral.json", "tp=2,ep=2,etp=1", "sglang:tp=4,ep=4", 0, 0, 6);
}

static void sglang_deepseek_v3(void **state) {
  (void)state;
  run_pair("tiny-deepseek-v3.json", "tp=2,pp=2,ep=2,etp=1", "sglang:tp=4,ep=2,attn_dp=2,moe_dense_tp=1", 0, 0, 8);
  run_pair("tiny-deepseek-v3.json", "tp=2,ep=2,etp=1", "sglang:tp=2,pp=2,dp=2,ep=2", 0, 4096, 10);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(llama_tp2pp2_to_tp2dp2),   cmocka_unit_test(tp2pp2dp2_to_tp4_kv_replication),
      cmocka_unit_test(moe_ep4_to_ep4_pp2_small_staging), cmocka_unit_test(deepseek_v3_ep),
      cmocka_unit_test(uneven_experts),           cmocka_unit_test(fp8_block_scales_tp2_to_tp4),
      cmocka_unit_test(colocated),                cmocka_unit_test(context_parallel_cp2),
      cmocka_unit_test(sglang_dense),             cmocka_unit_test(sglang_moe),
      cmocka_unit_test(sglang_deepseek_v3),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
