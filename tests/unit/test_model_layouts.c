/* Golden layouts of the model front-end: what each rank of a Megatron-core
 * or vLLM job holds, buffer by buffer, against expectations worked out by
 * hand from the upstream source. Each expectation names the file and the
 * function it follows (Megatron-LM d98e8a64, Megatron-Bridge 067f987d, vLLM
 * 0.33.0 4ba787ec9, SGLang 0.5.23: python/sglang/srt of its wheel), and is
 * written in reshard_plan --show-layout's line
 * format:
 *   rank=R name=<parameter name on R> tensor=<HF tensor> dtype=D
 *   box=lo0:hi0,... offset=<byte offset in the parameter>
 * The byte-exact reshards of test_models and test_e2e_models cannot see a
 * wrong arrangement (both sides would agree with their own descriptions);
 * these tests can. The shipped configs give real geometries, the tiny ones
 * in tests/data hand-checkable ones:
 *   tiny-llama      H 64, 8 heads of 8, 2 KV heads, I 96, 4 layers, V 1000
 *   tiny-qwen3-moe  the same attention (+ q/k norms), 8 experts of I 32
 *   tiny-mixtral    H 64, 8 heads of 8, 2 KV heads, 4 experts of I 48,
 *                   2 layers
 *   tiny-deepseek-v3 H 64, 4 heads, q_lora 24, kv_lora 16, nope 8, rope 4,
 *                   v 8, layer 0 dense (I 96), 8 experts of I 16, 2 shared
 *   tiny-qwen3-bias qwen3 with attention_bias, 4 heads of 16, 2 KV heads */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"
#include "reshard.h"
#include "reshard_models.h"

#define DATA(file) RESHARD_TEST_DATA "/" file
#define SHIPPED(file) RESHARD_CONFIG_DIR "/" file

static rm_model *load(const char *path, int layers) {
  rm_model *m = NULL;
  reshard_result_t r = rm_model_load(path, layers, RESHARD_BF16, &m);
  if (r) print_error("rm_model_load(%s): %s\n", path, reshard_last_error());
  assert_int_equal(r, RESHARD_SUCCESS);
  return m;
}

/* With fp8 block scales (fp8), or one tensor per expert (per_expert). */
static rm_model *load_ex(const char *path, int fp8, int per_expert) {
  rm_model_options o = RM_MODEL_OPTIONS_INIT;
  o.block_scales = fp8;
  o.per_expert = per_expert;
  rm_model *m = NULL;
  reshard_result_t r = rm_model_load_ex(path, &o, &m);
  if (r) print_error("rm_model_load_ex(%s): %s\n", path, reshard_last_error());
  assert_int_equal(r, RESHARD_SUCCESS);
  return m;
}
#define load_fp8(path) load_ex(path, 1, 0)

enum { MEGATRON = 0, VLLM = 1, SGLANG = 2 };

static const char *side_name(int side) { return side == VLLM ? "vllm" : side == SGLANG ? "sglang" : "megatron"; }

static reshard_result_t build(const rm_model *m, int side, const rm_parallel *p, reshard_layout_t **L) {
  return side == VLLM ? rm_vllm_layout(m, p, 0, L) : side == SGLANG ? rm_sglang_layout(m, p, 0, L)
                                                                     : rm_megatron_layout(m, p, 0, L);
}

/* The table row being checked (run_checks), said first by a failure. */
static char where[160];

static reshard_layout_t *layout(const rm_model *m, int side, const char *spec) {
  rm_parallel p;
  reshard_result_t r = rm_parse_parallel(spec, &p);
  if (r) print_error("rm_parse_parallel(%s): %s\n", spec, reshard_last_error());
  assert_int_equal(r, RESHARD_SUCCESS);
  reshard_layout_t *L = NULL;
  r = build(m, side, &p, &L);
  if (r) print_error("%s %s: %s\n", side_name(side), spec, reshard_last_error());
  assert_int_equal(r, RESHARD_SUCCESS);
  return L;
}

/* The builder refuses spec with INVALID_ARGUMENT, a message saying `says`,
 * and no layout. */
static void refused(const rm_model *m, int side, const char *spec, const char *says) {
  rm_parallel p;
  assert_int_equal(rm_parse_parallel(spec, &p), RESHARD_SUCCESS);
  reshard_layout_t *L = (reshard_layout_t *)(uintptr_t)1;
  reshard_result_t r = build(m, side, &p, &L);
  if (r != RESHARD_ERROR_INVALID_ARGUMENT || !strstr(reshard_last_error(), says))
    print_error("%s%s %s: result %d, '%s' (expected to say '%s')\n", where, side_name(side), spec, r,
                reshard_last_error(), says);
  assert_int_equal(r, RESHARD_ERROR_INVALID_ARGUMENT);
  assert_null(L);
  assert_non_null(strstr(reshard_last_error(), says));
}

/* Every --show-layout line of rank whose name starts with `prefix`, in
 * order, must be exactly want[0 .. NULL). */
static void expect_lines(const reshard_layout_t *L, int rank, const char *prefix, const char *const *want) {
  size_t n = 0;
  assert_int_equal(reshard_layout_fragments(L, rank, NULL, 0, &n), RESHARD_SUCCESS);
  reshard_fragment_info_t *f = calloc(n + 1, sizeof *f);
  assert_int_equal(reshard_layout_fragments(L, rank, f, n, &n), RESHARD_SUCCESS);
  char want_prefix[512], line[1024];
  snprintf(want_prefix, sizeof want_prefix, "rank=%d name=%s", rank, prefix);
  size_t k = 0;
  int bad = 0;
  for (size_t i = 0; i < n; i++) {
    assert_int_equal(cli_format_fragment(L, rank, &f[i], line, sizeof line), 0);
    if (strncmp(line, want_prefix, strlen(want_prefix))) continue;
    if (!want[k] || strcmp(line, want[k])) {
      print_error("%srank %d, line %zu under '%s':\n  got  %s\n  want %s\n", where, rank, k, prefix, line,
                  want[k] ? want[k] : "(no more lines)");
      bad = 1;
      break;
    }
    k++;
  }
  if (!bad && want[k]) {
    print_error("%srank %d under '%s': missing line %s\n", where, rank, prefix, want[k]);
    bad = 1;
  }
  free(f);
  if (bad) fail();
}
#define LINES(...) ((const char *const[]){__VA_ARGS__, NULL})

/* The parameter `name` on rank: its byte size (0: the rank has no such
 * parameter). */
static size_t param_bytes(const reshard_layout_t *L, const char *name, int rank) {
  int b;
  if (reshard_layout_find_buffer(L, name, rank, &b)) return 0;
  const char *back = NULL;
  assert_int_equal(rm_parameter_name(L, b, rank, &back), RESHARD_SUCCESS);
  assert_string_equal(back, name);
  size_t bytes = 0;
  assert_int_equal(reshard_layout_buffer_bytes(L, b, rank, &bytes), RESHARD_SUCCESS);
  assert_true(bytes > 0);
  return bytes;
}

/* A golden test's table: one check a row of a model's layout for a
 * framework (side) and parallel spec (consecutive rows of one layout
 * share it), each one of
 *   .lines  rank's --show-layout lines under `name` are exactly these;
 *   .bytes  parameter `name` on rank is that many bytes (0: none there);
 *   .says   the builder refuses spec, saying that;
 *   .ends   the stage ends of a vLLM rank (expect_ends): lines[0..2];
 * or a .model row: the rows after it check the model at that path (its
 * first .layers layers, 0: all; load_ex's where .fp8 or .per_expert). */
typedef struct check {
  int side;
  const char *spec;
  int rank;
  const char *name;
  const char *const *lines;
  long long bytes;
  const char *says;
  int ends;
  const char *model;
  int layers, fp8, per_expert;
} check;
#define MODEL(path) {.model = path}
#define ENDS(spec, rank, embed, norm, head) \
  {VLLM, spec, rank, NULL, (const char *const[]){embed, norm, head}, .ends = 1}

static void expect_ends(const reshard_layout_t *L, int rank, const char *embed, const char *norm, const char *head);

/* The n rows of c, on m until a .model row loads another. */
static void run_checks(const rm_model *m, const check *c, size_t n) {
  rm_model *own = NULL;
  reshard_layout_t *L = NULL;
  const check *built = NULL;
  for (size_t i = 0; i < n; i++) {
    if (c[i].model) {
      reshard_layout_destroy(L);
      L = NULL, built = NULL;
      rm_model_free(own);
      m = own = c[i].fp8 || c[i].per_expert ? load_ex(c[i].model, c[i].fp8, c[i].per_expert)
                                            : load(c[i].model, c[i].layers);
      continue;
    }
    snprintf(where, sizeof where, "row %zu (%s %s): ", i, side_name(c[i].side), c[i].spec);
    if (c[i].says) {
      refused(m, c[i].side, c[i].spec, c[i].says);
      continue;
    }
    if (!built || built->side != c[i].side || strcmp(built->spec, c[i].spec)) {
      reshard_layout_destroy(L);
      L = layout(m, c[i].side, c[i].spec);
      built = &c[i];
    }
    if (c[i].ends) {
      expect_ends(L, c[i].rank, c[i].lines[0], c[i].lines[1], c[i].lines[2]);
    } else if (c[i].lines) {
      expect_lines(L, c[i].rank, c[i].name, c[i].lines);
    } else {
      size_t got = param_bytes(L, c[i].name, c[i].rank);
      if (got != (size_t)c[i].bytes)
        print_error("%s%s on rank %d: %zu bytes, expected %lld\n", where, c[i].name, c[i].rank, got, c[i].bytes);
      assert_int_equal(got, c[i].bytes);
    }
  }
  reshard_layout_destroy(L);
  rm_model_free(own);
  where[0] = '\0';
}
#define CHECKS(m, table) run_checks(m, table, sizeof table / sizeof *table)

/* The checks of table on the model at path (all its layers). */
static void check_model(const char *path, const check *c, size_t n) {
  rm_model *m = load(path, 0);
  run_checks(m, c, n);
  rm_model_free(m);
}
#define CHECK_MODEL(path, table) check_model(path, table, sizeof table / sizeof *table)

/* A test that is a table (its state: a checks, from TABLE_TEST in main). */
typedef struct checks {
  const check *c;
  size_t n;
} checks;

static void table_test(void **state) {
  const checks *t = *state;
  run_checks(NULL, t->c, t->n);
}

/* ------------------------------------------------------------------ */
/* 1. vLLM's rank order: DP outermost, then PP, then TP                 */
/* ------------------------------------------------------------------ */

/* vllm/distributed/parallel_state.py initialize_model_parallel:
 * all_ranks = arange(world).reshape(-1, dp, pp, pcp, tp), so rank =
 * tp_i + tp * (pp_i + pp * dp_i). tp2 pp2 dp2: rank 2 is (tp 0, pp 1,
 * dp 0) and holds layers 2-3; rank 4 is (tp 0, pp 0, dp 1). */
static const check vllm_rank_order[] = {
    MODEL(DATA("tiny-llama.json")),
    /* QKVParallelLinear (vllm/model_executor/layers/linear.py): [q; k; v]
     * shards of TP rank 0: q rows 0:32, KV head 0 (rows 0:8) */
    {VLLM, "tp=2,pp=2,dp=2", 2, "model.layers.2.self_attn.qkv_proj.weight",
     .lines = LINES("rank=2 name=model.layers.2.self_attn.qkv_proj.weight tensor=model.layers.2.self_attn.q_proj.weight dtype=bf16 box=0:32,0:64 offset=0",
                    "rank=2 name=model.layers.2.self_attn.qkv_proj.weight tensor=model.layers.2.self_attn.k_proj.weight dtype=bf16 box=0:8,0:64 offset=4096",
                    "rank=2 name=model.layers.2.self_attn.qkv_proj.weight tensor=model.layers.2.self_attn.v_proj.weight dtype=bf16 box=0:8,0:64 offset=5120")},
    {VLLM, "tp=2,pp=2,dp=2", 2, "model.layers.0.input_layernorm.weight", .bytes = 0},
    {VLLM, "tp=2,pp=2,dp=2", 4, "model.layers.0.input_layernorm.weight", .bytes = 64 * 2},
    /* vocab_parallel_embedding.py: 1000 rows padded to 1024, 512 a TP rank */
    {VLLM, "tp=2,pp=2,dp=2", 5, "model.embed_tokens.weight",
     .lines = LINES("rank=5 name=model.embed_tokens.weight tensor=model.embed_tokens.weight dtype=bf16 box=512:1000,0:64 offset=0")},
    {VLLM, "tp=2,pp=2,dp=2", 7, "lm_head.weight",
     .lines = LINES("rank=7 name=lm_head.weight tensor=lm_head.weight dtype=bf16 box=512:1000,0:64 offset=0")},
    {VLLM, "tp=2,pp=2,dp=2", 5, "lm_head.weight", .bytes = 0},
    /* The EP group of a stage orders its ranks dp-major (all_ranks
     * .transpose(1, 2).reshape(-1, dp * pcp * tp)): EP rank 2 of stage 0 is
     * global rank 4, and holds experts 4 and 5 (determine_expert_map,
     * linear). */
    MODEL(DATA("tiny-qwen3-moe.json")),
    {VLLM, "tp=2,pp=2,dp=2,ep=4", 4, "model.layers.0.mlp.experts.",
     .lines = LINES("rank=4 name=model.layers.0.mlp.experts.routed_experts.w13_weight tensor=model.layers.0.mlp.experts.gate_proj.weight dtype=bf16 box=4:6,0:32,0:64 offset=0",
                    "rank=4 name=model.layers.0.mlp.experts.routed_experts.w13_weight tensor=model.layers.0.mlp.experts.up_proj.weight dtype=bf16 box=4:6,0:32,0:64 offset=4096",
                    "rank=4 name=model.layers.0.mlp.experts.routed_experts.w2_weight tensor=model.layers.0.mlp.experts.down_proj.weight dtype=bf16 box=4:6,0:64,0:32 offset=0")},
    /* rank 2 is stage 1: layer 2's experts 0 and 1 */
    {VLLM, "tp=2,pp=2,dp=2,ep=4", 2, "model.layers.2.mlp.experts.routed_experts.w2_weight",
     .lines = LINES("rank=2 name=model.layers.2.mlp.experts.routed_experts.w2_weight tensor=model.layers.2.mlp.experts.down_proj.weight dtype=bf16 box=0:2,0:64,0:32 offset=0")},
};

/* ------------------------------------------------------------------ */
/* 2. Megatron's vocabulary rows: a spec key, default vocab_size        */
/* ------------------------------------------------------------------ */

/* Megatron-Bridge gpt_provider.py GPTModelProvider: should_pad_vocab False,
 * rows = vocab_size; Megatron-LM vocab_utils.py
 * calculate_padded_vocab_size: round up to make_vocab_size_divisible_by
 * (128) x tp. megatron/core/tensor_parallel/utils.py
 * vocab_range_from_global_vocab_size: even contiguous rows per TP rank,
 * divide() asserting divisibility. Qwen3-8B: 151936 rows, tp 2. */
static const check megatron_vocab_rows[] = {
    {.model = SHIPPED("Qwen3-8B.json"), .layers = 1},
    {MEGATRON, "tp=2", 1, "embedding.word_embeddings.weight",
     .lines = LINES("rank=1 name=embedding.word_embeddings.weight tensor=model.embed_tokens.weight dtype=bf16 box=75968:151936,0:4096 offset=0")},
    {MEGATRON, "tp=2", 1, "output_layer.weight", .bytes = 75968LL * 4096 * 2},
    /* Megatron-LM's padding, 151936 -> 152064 (a multiple of 256) */
    {MEGATRON, "tp=2,vocab=152064", 1, "output_layer.weight",
     .lines = LINES("rank=1 name=output_layer.weight tensor=lm_head.weight dtype=bf16 box=76032:151936,0:4096 offset=0")},
    {MEGATRON, "tp=2,vocab=152064", 0, "embedding.word_embeddings.weight", .bytes = 76032LL * 4096 * 2},
    {MEGATRON, "tp=2,vocab=151935", .says = "at least vocab_size 151936"},
    {MEGATRON, "tp=2,vocab=151937", .says = "divisible by tp 2"},
    {VLLM, "tp=2,vocab=152064", .says = "key 'vocab' is Megatron's"},
};

/* ------------------------------------------------------------------ */
/* 3. The router's correction bias is fp32                              */
/* ------------------------------------------------------------------ */

/* vLLM deepseek_v2.py DeepseekV2MoE: e_score_correction_bias =
 * nn.Parameter(torch.empty(n_routed_experts, dtype=torch.float32)) when
 * topk_method == "noaux_tc"; Megatron moe/router.py TopKRouter:
 * register_buffer('expert_bias', torch.zeros(E, dtype=torch.float32)).
 * Both in a bf16 model. */
static const check router_bias_fp32[] = {
    MODEL(DATA("tiny-deepseek-v3.json")),
    {MEGATRON, "tp=2", 1, "decoder.layers.1.mlp.router.expert_bias",
     .lines = LINES("rank=1 name=decoder.layers.1.mlp.router.expert_bias tensor=model.layers.1.mlp.gate.e_score_correction_bias dtype=f32 box=0:8 offset=0")},
    {VLLM, "tp=2", 0, "model.layers.3.mlp.gate.e_score_correction_bias",
     .lines = LINES("rank=0 name=model.layers.3.mlp.gate.e_score_correction_bias tensor=model.layers.3.mlp.gate.e_score_correction_bias dtype=f32 box=0:8 offset=0")},
    {VLLM, "tp=2", 1, "model.layers.3.mlp.gate.e_score_correction_bias", .bytes = 8 * 4},
    /* the router weight keeps the model's dtype (params_dtype / GateLinear) */
    {VLLM, "tp=2", 0, "model.layers.3.mlp.gate.weight",
     .lines = LINES("rank=0 name=model.layers.3.mlp.gate.weight tensor=model.layers.3.mlp.gate.weight dtype=bf16 box=0:8,0:64 offset=0")},
};

/* ------------------------------------------------------------------ */
/* 4. Megatron's expert TP defaults to TP                               */
/* ------------------------------------------------------------------ */

/* megatron/core/model_parallel_config.py ModelParallelConfig.__post_init__:
 * expert_tensor_parallel_size = tensor_model_parallel_size when unset.
 * tp2 dp2 ep2: expert grid [expert-DP 1, ep 2, etp 2], etp fastest
 * (parallel_state.py, expert order "tp-ep-dp-pp"): rank 3 is EP 1, ETP 1:
 * experts 4..7, intermediate rows 16:32 of gate and of up. One parameter
 * per local expert (moe_module_specs.py TEGroupedMLP: linear_fc1.weight<i>),
 * [gate shard; up shard] (mlp.py). */
static const check megatron_etp_default[] = {
    MODEL(DATA("tiny-qwen3-moe.json")),
    {MEGATRON, "tp=2,dp=2,ep=2", 3, "decoder.layers.0.mlp.experts.linear_fc1.weight0",
     .lines = LINES("rank=3 name=decoder.layers.0.mlp.experts.linear_fc1.weight0 tensor=model.layers.0.mlp.experts.gate_proj.weight dtype=bf16 box=4:5,16:32,0:64 offset=0",
                    "rank=3 name=decoder.layers.0.mlp.experts.linear_fc1.weight0 tensor=model.layers.0.mlp.experts.up_proj.weight dtype=bf16 box=4:5,16:32,0:64 offset=2048")},
    {MEGATRON, "tp=2,dp=2,ep=2", 3, "decoder.layers.0.mlp.experts.linear_fc2.weight3",
     .lines = LINES("rank=3 name=decoder.layers.0.mlp.experts.linear_fc2.weight3 tensor=model.layers.0.mlp.experts.down_proj.weight dtype=bf16 box=7:8,0:64,16:32 offset=0")},
    /* ep 2 x etp 2 needs 4 ranks a stage */
    {MEGATRON, "tp=2,ep=2", .says = "ep 2 x etp 2 does not divide tp x dp = 2"},
    /* etp=1 (Megatron-Bridge's default with ep > 1): rank 1 holds expert 4 whole */
    {MEGATRON, "tp=2,ep=2,etp=1", 1, "decoder.layers.0.mlp.experts.linear_fc1.weight0",
     .lines = LINES("rank=1 name=decoder.layers.0.mlp.experts.linear_fc1.weight0 tensor=model.layers.0.mlp.experts.gate_proj.weight dtype=bf16 box=4:5,0:32,0:64 offset=0",
                    "rank=1 name=decoder.layers.0.mlp.experts.linear_fc1.weight0 tensor=model.layers.0.mlp.experts.up_proj.weight dtype=bf16 box=4:5,0:32,0:64 offset=4096")},
};

/* Megatron's context parallelism. megatron/core/parallel_state.py
 * initialize_model_parallel: the decoder's RankGenerator(tp, ep=1, dp, pp,
 * cp, order "tp-cp-ep-dp-pp") gives rank = tp_i + tp * (cp_i + cp * (dp_i
 * + dp * pp_i)); context-parallel ranks split the sequence and build the
 * same modules, so they hold what their TP rank holds. The experts' own
 * RankGenerator has cp=1 and dp = expert_data_parallel_size = world /
 * (etp * ep * pp): EP runs across the CP ranks too.
 * tiny-llama tp2 cp2 dp2 pp2 (16 ranks): rank 11 = (tp 1, cp 1, dp 0,
 * pp 1) holds what "tp=2,pp=2" gives rank 3 (stage 1, TP rank 1; see
 * golden_dense_gqa); rank 6 = (tp 0, cp 1, dp 1, pp 0): stage 0, TP rank 0.
 * tiny-qwen3-moe tp2 cp2 ep4 etp1 (4 ranks): the expert grid is [edp 1,
 * ep 4, etp 1], so rank r is EP rank r with experts 2r, 2r+1 whole; with
 * no CP, ep 4 would not fit the 2 ranks. */
static const check megatron_context_parallel[] = {
    MODEL(DATA("tiny-llama.json")),
    {MEGATRON, "tp=2,cp=2,dp=2,pp=2", 11, "decoder.layers.1.self_attention.linear_qkv.weight",
     .lines = LINES("rank=11 name=decoder.layers.1.self_attention.linear_qkv.weight tensor=model.layers.3.self_attn.q_proj.weight dtype=bf16 box=32:64,0:64 offset=0",
                    "rank=11 name=decoder.layers.1.self_attention.linear_qkv.weight tensor=model.layers.3.self_attn.k_proj.weight dtype=bf16 box=8:16,0:64 offset=4096",
                    "rank=11 name=decoder.layers.1.self_attention.linear_qkv.weight tensor=model.layers.3.self_attn.v_proj.weight dtype=bf16 box=8:16,0:64 offset=5120")},
    {MEGATRON, "tp=2,cp=2,dp=2,pp=2", 11, "decoder.final_layernorm.weight",
     .lines = LINES("rank=11 name=decoder.final_layernorm.weight tensor=model.norm.weight dtype=bf16 box=0:64 offset=0")},
    {MEGATRON, "tp=2,cp=2,dp=2,pp=2", 6, "embedding.word_embeddings.weight",
     .lines = LINES("rank=6 name=embedding.word_embeddings.weight tensor=model.embed_tokens.weight dtype=bf16 box=0:500,0:64 offset=0")},
    {MEGATRON, "tp=2,cp=2,dp=2,pp=2", 6, "decoder.final_layernorm.weight", .bytes = 0},
    {MEGATRON, "tp=2,cp=2,dp=2,pp=2", 15, "output_layer.weight", .bytes = 500 * 64 * 2},
    /* CP is Megatron's: vLLM's decode context parallelism shares the TP
     * ranks (vllm/config/parallel.py decode_context_parallel_size) */
    {VLLM, "tp=2,cp=2", .says = "key 'cp' is Megatron's"},
    MODEL(DATA("tiny-qwen3-moe.json")),
    {MEGATRON, "tp=2,cp=2,ep=4,etp=1", 3, "decoder.layers.0.mlp.experts.linear_fc1.weight1",
     .lines = LINES("rank=3 name=decoder.layers.0.mlp.experts.linear_fc1.weight1 tensor=model.layers.0.mlp.experts.gate_proj.weight dtype=bf16 box=7:8,0:32,0:64 offset=0",
                    "rank=3 name=decoder.layers.0.mlp.experts.linear_fc1.weight1 tensor=model.layers.0.mlp.experts.up_proj.weight dtype=bf16 box=7:8,0:32,0:64 offset=4096")},
    {MEGATRON, "tp=2,cp=2,ep=4,etp=1", 2, "decoder.layers.0.self_attention.linear_qkv.weight",
     .lines = LINES("rank=2 name=decoder.layers.0.self_attention.linear_qkv.weight tensor=model.layers.0.self_attn.q_proj.weight dtype=bf16 box=0:32,0:64 offset=0",
                    "rank=2 name=decoder.layers.0.self_attention.linear_qkv.weight tensor=model.layers.0.self_attn.k_proj.weight dtype=bf16 box=0:8,0:64 offset=4096",
                    "rank=2 name=decoder.layers.0.self_attention.linear_qkv.weight tensor=model.layers.0.self_attn.v_proj.weight dtype=bf16 box=0:8,0:64 offset=5120")},
    {MEGATRON, "tp=2,ep=4,etp=1", .says = "ep 4 x etp 1 does not divide tp x dp = 2"},
    {MEGATRON, "tp=2,cp=2,ep=8,etp=1", .says = "ep 8 x etp 1 does not divide tp x dp x cp = 4"},
};

/* ------------------------------------------------------------------ */
/* 5. vLLM's shared experts under sequence-parallel MoE                 */
/* ------------------------------------------------------------------ */

/* Rank 1 of vllm_shared_experts_sp_moe's two layouts with shared experts
 * split over TP. */
static const char *const sp_moe_sharded[] = {
    "rank=1 name=model.layers.1.mlp.shared_experts.gate_up_proj.weight tensor=model.layers.1.mlp.shared_experts.gate_proj.weight dtype=bf16 box=16:32,0:64 offset=0",
    "rank=1 name=model.layers.1.mlp.shared_experts.gate_up_proj.weight tensor=model.layers.1.mlp.shared_experts.up_proj.weight dtype=bf16 box=16:32,0:64 offset=2048",
    "rank=1 name=model.layers.1.mlp.shared_experts.down_proj.weight tensor=model.layers.1.mlp.shared_experts.down_proj.weight dtype=bf16 box=0:64,16:32 offset=0",
    NULL};

/* vllm/config/parallel.py ParallelConfig.use_sequence_parallel_moe: the
 * all2all backend (default "allgather_reducescatter") among its list,
 * enable_expert_parallel, tp > 1 and dp > 1; deepseek_v2.py DeepseekV2MoE
 * then builds DeepseekV2MLP(is_sequence_parallel=True), whose
 * gate_up_proj and down_proj have disable_tp: whole on every rank. Shared
 * intermediate 2 x 16 = 32. */
static const check vllm_shared_experts_sp_moe[] = {
    MODEL(DATA("tiny-deepseek-v3.json")),
    {VLLM, "tp=2,dp=2,ep=4", 3, "model.layers.1.mlp.shared_experts.",
     .lines = LINES("rank=3 name=model.layers.1.mlp.shared_experts.gate_up_proj.weight tensor=model.layers.1.mlp.shared_experts.gate_proj.weight dtype=bf16 box=0:32,0:64 offset=0",
                    "rank=3 name=model.layers.1.mlp.shared_experts.gate_up_proj.weight tensor=model.layers.1.mlp.shared_experts.up_proj.weight dtype=bf16 box=0:32,0:64 offset=4096",
                    "rank=3 name=model.layers.1.mlp.shared_experts.down_proj.weight tensor=model.layers.1.mlp.shared_experts.down_proj.weight dtype=bf16 box=0:64,0:32 offset=0")},
    /* another all2all backend (sp_moe=0), or dp 1: MergedColumnParallelLinear
     * / RowParallelLinear over TP */
    {VLLM, "tp=2,dp=2,ep=4,sp_moe=0", 1, "model.layers.1.mlp.shared_experts.", .lines = sp_moe_sharded},
    {VLLM, "tp=2,ep=2", 1, "model.layers.1.mlp.shared_experts.", .lines = sp_moe_sharded},
    {VLLM, "tp=2,sp_moe=1", .says = "requires enable_expert_parallel"},
    {MEGATRON, "tp=2,sp_moe=0", .says = "key 'sp_moe' is vLLM's"},
};

/* ------------------------------------------------------------------ */
/* 6. What the frameworks refuse                                        */
/* ------------------------------------------------------------------ */

static const check invalid_settings[] = {
    /* vllm/model_executor/layers/fused_moe/config.py
     * FusedMoEParallelConfig.make: ep 1 or tp x dp */
    MODEL(DATA("tiny-qwen3-moe.json")),
    {VLLM, "tp=2,dp=2,ep=2", .says = "FusedMoEParallelConfig.make"},
    {VLLM, "tp=2,dp=2,ep=8", .says = "ep=4"},
    {VLLM, "tp=4,etp=2", .says = "say etp=4"},
    /* megatron moe_layer.py: num_moe_experts % ep == 0 (vLLM allows it) */
    {MEGATRON, "dp=3,ep=3", .says = "ep 3 does not divide the 8 experts"},
    /* megatron/core/transformer/transformer_block.py get_num_layers_to_build:
     * pp divides the layers unless first / last stage counts are given; the
     * stages left share the rest evenly */
    MODEL(DATA("tiny-llama.json")),
    {MEGATRON, "pp=3", .says = "pp 3 does not divide the 4 layers"},
    {MEGATRON, "pp=3,first=1", .says = "do not split evenly"},
    {MEGATRON, "pp=2,first=1,last=2", .says = "do not split evenly"},
    {MEGATRON, "first=1", .says = "need pp > 1"},
    {VLLM, "pp=2,first=1", .says = "key 'first' is Megatron's"},
    /* first=2: stages [2, 1, 1]; layer 2 is the first of stage 1 (rank 1),
     * named from 0 there (TransformerBlock's ModuleList is per stage) */
    {MEGATRON, "pp=3,first=2", 1, "decoder.layers.0.self_attention.linear_qkv.layer_norm_weight",
     .lines = LINES("rank=1 name=decoder.layers.0.self_attention.linear_qkv.layer_norm_weight tensor=model.layers.2.input_layernorm.weight dtype=bf16 box=0:64 offset=0")},
    {MEGATRON, "pp=3,first=2", 2, "decoder.layers.0.self_attention.linear_qkv.layer_norm_weight",
     .lines = LINES("rank=2 name=decoder.layers.0.self_attention.linear_qkv.layer_norm_weight tensor=model.layers.3.input_layernorm.weight dtype=bf16 box=0:64 offset=0")},
    {MEGATRON, "pp=3,first=2", 0, "decoder.layers.1.self_attention.linear_qkv.layer_norm_weight", .bytes = 64 * 2},
    {MEGATRON, "pp=3,first=2", 1, "decoder.layers.1.self_attention.linear_qkv.layer_norm_weight", .bytes = 0},
    /* last=2: [1, 1, 2] */
    {MEGATRON, "pp=3,last=2", 2, "decoder.layers.1.self_attention.linear_qkv.layer_norm_weight",
     .lines = LINES("rank=2 name=decoder.layers.1.self_attention.linear_qkv.layer_norm_weight tensor=model.layers.3.input_layernorm.weight dtype=bf16 box=0:64 offset=0")},
    /* vLLM's get_pp_indices has no such rule: 4 layers over 3 stages give
     * [1, 2, 1] (the extra layer on stage pp - 2) */
    {VLLM, "pp=3", 1, "model.layers.2.input_layernorm.weight", .bytes = 64 * 2},
    {VLLM, "pp=3", 2, "model.layers.3.input_layernorm.weight", .bytes = 64 * 2},
};

/* ------------------------------------------------------------------ */
/* 7. Names: each framework's own, per rank; golden layers per family   */
/* ------------------------------------------------------------------ */

/* Dense GQA. Megatron-core TE spec (gpt_layer_specs.py
 * get_gpt_layer_with_transformer_engine_submodules): input_layernorm fused
 * into linear_qkv (layer_norm_weight), pre_mlp_layernorm into linear_fc1;
 * linear_qkv per query group [q (4 heads x 8); k (8); v (8)]
 * (attention.py get_query_key_value_tensors), tp 2 holds group 1 on rank
 * 1; linear_proj row-parallel; linear_fc1 = [gate shard; up shard]. */
static void golden_dense_gqa(void **state) {
  (void)state;
  rm_model *m = load(DATA("tiny-llama.json"), 0);
  reshard_layout_t *L = layout(m, MEGATRON, "tp=2,pp=2");
  /* rank 3: stage 1 (layers 2, 3), TP rank 1; layer 3 is its layer 1 */
  expect_lines(L, 3, "decoder.layers.1.",
               LINES("rank=3 name=decoder.layers.1.self_attention.linear_qkv.layer_norm_weight tensor=model.layers.3.input_layernorm.weight dtype=bf16 box=0:64 offset=0",
                     "rank=3 name=decoder.layers.1.self_attention.linear_qkv.weight tensor=model.layers.3.self_attn.q_proj.weight dtype=bf16 box=32:64,0:64 offset=0",
                     "rank=3 name=decoder.layers.1.self_attention.linear_qkv.weight tensor=model.layers.3.self_attn.k_proj.weight dtype=bf16 box=8:16,0:64 offset=4096",
                     "rank=3 name=decoder.layers.1.self_attention.linear_qkv.weight tensor=model.layers.3.self_attn.v_proj.weight dtype=bf16 box=8:16,0:64 offset=5120",
                     "rank=3 name=decoder.layers.1.self_attention.linear_proj.weight tensor=model.layers.3.self_attn.o_proj.weight dtype=bf16 box=0:64,32:64 offset=0",
                     "rank=3 name=decoder.layers.1.mlp.linear_fc1.layer_norm_weight tensor=model.layers.3.post_attention_layernorm.weight dtype=bf16 box=0:64 offset=0",
                     "rank=3 name=decoder.layers.1.mlp.linear_fc1.weight tensor=model.layers.3.mlp.gate_proj.weight dtype=bf16 box=48:96,0:64 offset=0",
                     "rank=3 name=decoder.layers.1.mlp.linear_fc1.weight tensor=model.layers.3.mlp.up_proj.weight dtype=bf16 box=48:96,0:64 offset=6144",
                     "rank=3 name=decoder.layers.1.mlp.linear_fc2.weight tensor=model.layers.3.mlp.down_proj.weight dtype=bf16 box=0:64,48:96 offset=0"));
  expect_lines(L, 3, "decoder.final_layernorm.weight",
               LINES("rank=3 name=decoder.final_layernorm.weight tensor=model.norm.weight dtype=bf16 box=0:64 offset=0"));
  /* (rank, name) -> buffer differs per stage; buffer -> name needs a rank
   * that holds it */
  int b0, b2;
  assert_int_equal(reshard_layout_find_buffer(L, "decoder.layers.0.self_attention.linear_qkv.weight", 0, &b0), 0);
  assert_int_equal(reshard_layout_find_buffer(L, "decoder.layers.0.self_attention.linear_qkv.weight", 2, &b2), 0);
  assert_int_not_equal(b0, b2);
  int any;
  assert_int_equal(reshard_layout_find_buffer(L, "decoder.layers.0.self_attention.linear_qkv.weight", -1, &any),
                   RESHARD_ERROR_INVALID_ARGUMENT);
  assert_non_null(strstr(reshard_last_error(), "give the rank"));
  assert_int_equal(reshard_layout_find_buffer(L, "decoder.layers.2.self_attention.linear_qkv.weight", 0, &any),
                   RESHARD_ERROR_INVALID_ARGUMENT);
  const char *name = "";
  assert_int_equal(rm_parameter_name(L, b2, 1, &name), RESHARD_ERROR_INVALID_ARGUMENT);
  assert_null(name);
  assert_non_null(strstr(reshard_last_error(), "rank 1 holds no part of buffer"));
  reshard_layout_destroy(L);

  const check vllm[] = {
      /* vLLM tp 4 > 2 KV heads: QKVParallelLinear gives each KV head to 2
       * consecutive ranks (num_kv_head_replicas); rank 3: q rows 48:64, KV head
       * 1; MergedColumnParallelLinear gate_up_proj = [gate; up] rows 72:96 */
      {VLLM, "tp=4", 3, "model.layers.0.",
       .lines = LINES("rank=3 name=model.layers.0.input_layernorm.weight tensor=model.layers.0.input_layernorm.weight dtype=bf16 box=0:64 offset=0",
                      "rank=3 name=model.layers.0.self_attn.qkv_proj.weight tensor=model.layers.0.self_attn.q_proj.weight dtype=bf16 box=48:64,0:64 offset=0",
                      "rank=3 name=model.layers.0.self_attn.qkv_proj.weight tensor=model.layers.0.self_attn.k_proj.weight dtype=bf16 box=8:16,0:64 offset=2048",
                      "rank=3 name=model.layers.0.self_attn.qkv_proj.weight tensor=model.layers.0.self_attn.v_proj.weight dtype=bf16 box=8:16,0:64 offset=3072",
                      "rank=3 name=model.layers.0.self_attn.o_proj.weight tensor=model.layers.0.self_attn.o_proj.weight dtype=bf16 box=0:64,48:64 offset=0",
                      "rank=3 name=model.layers.0.post_attention_layernorm.weight tensor=model.layers.0.post_attention_layernorm.weight dtype=bf16 box=0:64 offset=0",
                      "rank=3 name=model.layers.0.mlp.gate_up_proj.weight tensor=model.layers.0.mlp.gate_proj.weight dtype=bf16 box=72:96,0:64 offset=0",
                      "rank=3 name=model.layers.0.mlp.gate_up_proj.weight tensor=model.layers.0.mlp.up_proj.weight dtype=bf16 box=72:96,0:64 offset=3072",
                      "rank=3 name=model.layers.0.mlp.down_proj.weight tensor=model.layers.0.mlp.down_proj.weight dtype=bf16 box=0:64,72:96 offset=0")},
  };
  CHECKS(m, vllm);
  rm_model_free(m);

  /* Qwen3 with attention_bias: vLLM qwen3.py Qwen3Attention builds o_proj
   * with bias=False (qkv_proj with bias=attention_bias): no o_proj.bias on
   * either side. Tied embeddings, pp 2: vLLM builds embed_tokens on the
   * last stage too (qwen2.py Qwen2Model), lm_head being that parameter. */
  m = load(DATA("tiny-qwen3-bias.json"), 0);
  const check bias[] = {
      {VLLM, "tp=2,pp=2", 1, "model.layers.0.self_attn.",
       .lines = LINES("rank=1 name=model.layers.0.self_attn.qkv_proj.weight tensor=model.layers.0.self_attn.q_proj.weight dtype=bf16 box=32:64,0:64 offset=0",
                      "rank=1 name=model.layers.0.self_attn.qkv_proj.weight tensor=model.layers.0.self_attn.k_proj.weight dtype=bf16 box=16:32,0:64 offset=4096",
                      "rank=1 name=model.layers.0.self_attn.qkv_proj.weight tensor=model.layers.0.self_attn.v_proj.weight dtype=bf16 box=16:32,0:64 offset=6144",
                      "rank=1 name=model.layers.0.self_attn.qkv_proj.bias tensor=model.layers.0.self_attn.q_proj.bias dtype=bf16 box=32:64 offset=0",
                      "rank=1 name=model.layers.0.self_attn.qkv_proj.bias tensor=model.layers.0.self_attn.k_proj.bias dtype=bf16 box=16:32 offset=64",
                      "rank=1 name=model.layers.0.self_attn.qkv_proj.bias tensor=model.layers.0.self_attn.v_proj.bias dtype=bf16 box=16:32 offset=96",
                      "rank=1 name=model.layers.0.self_attn.q_norm.weight tensor=model.layers.0.self_attn.q_norm.weight dtype=bf16 box=0:16 offset=0",
                      "rank=1 name=model.layers.0.self_attn.k_norm.weight tensor=model.layers.0.self_attn.k_norm.weight dtype=bf16 box=0:16 offset=0",
                      "rank=1 name=model.layers.0.self_attn.o_proj.weight tensor=model.layers.0.self_attn.o_proj.weight dtype=bf16 box=0:64,32:64 offset=0")},
      {VLLM, "tp=2,pp=2", 3, "model.embed_tokens.weight",
       .lines = LINES("rank=3 name=model.embed_tokens.weight tensor=model.embed_tokens.weight dtype=bf16 box=512:1000,0:64 offset=0")},
      /* Megatron: linear_qkv.bias interleaved per group like the weight, no
       * linear_proj.bias; q/k norms are q_layernorm / k_layernorm */
      {MEGATRON, "tp=2", 1, "decoder.layers.0.self_attention.",
       .lines = LINES("rank=1 name=decoder.layers.0.self_attention.linear_qkv.layer_norm_weight tensor=model.layers.0.input_layernorm.weight dtype=bf16 box=0:64 offset=0",
                      "rank=1 name=decoder.layers.0.self_attention.linear_qkv.weight tensor=model.layers.0.self_attn.q_proj.weight dtype=bf16 box=32:64,0:64 offset=0",
                      "rank=1 name=decoder.layers.0.self_attention.linear_qkv.weight tensor=model.layers.0.self_attn.k_proj.weight dtype=bf16 box=16:32,0:64 offset=4096",
                      "rank=1 name=decoder.layers.0.self_attention.linear_qkv.weight tensor=model.layers.0.self_attn.v_proj.weight dtype=bf16 box=16:32,0:64 offset=6144",
                      "rank=1 name=decoder.layers.0.self_attention.linear_qkv.bias tensor=model.layers.0.self_attn.q_proj.bias dtype=bf16 box=32:64 offset=0",
                      "rank=1 name=decoder.layers.0.self_attention.linear_qkv.bias tensor=model.layers.0.self_attn.k_proj.bias dtype=bf16 box=16:32 offset=64",
                      "rank=1 name=decoder.layers.0.self_attention.linear_qkv.bias tensor=model.layers.0.self_attn.v_proj.bias dtype=bf16 box=16:32 offset=96",
                      "rank=1 name=decoder.layers.0.self_attention.q_layernorm.weight tensor=model.layers.0.self_attn.q_norm.weight dtype=bf16 box=0:16 offset=0",
                      "rank=1 name=decoder.layers.0.self_attention.k_layernorm.weight tensor=model.layers.0.self_attn.k_norm.weight dtype=bf16 box=0:16 offset=0",
                      "rank=1 name=decoder.layers.0.self_attention.linear_proj.weight tensor=model.layers.0.self_attn.o_proj.weight dtype=bf16 box=0:64,32:64 offset=0")},
  };
  CHECKS(m, bias);
  int t;
  reshard_layout_t *D = layout(m, VLLM, "");
  assert_int_equal(reshard_layout_find_tensor(D, "model.layers.0.self_attn.o_proj.bias", &t),
                   RESHARD_ERROR_INVALID_ARGUMENT);
  reshard_layout_destroy(D);
  rm_model_free(m);
}

/* Qwen3-MoE. Megatron tp2 dp2 ep2 (etp 2): rank 3 is TP 1 / DP 1 for the
 * dense part and EP 1 / ETP 1 for the experts (experts 4..7, rows 16:32);
 * MoE layers keep pre_mlp_layernorm (TENorm) and name the router
 * mlp.router.weight. vLLM tp2 dp2 ep4: EP rank 2 = rank 2, experts 4, 5
 * whole (FusedMoEParallelConfig.make, use_ep: moe tp 1). */
static const check golden_qwen3_moe[] = {
    MODEL(DATA("tiny-qwen3-moe.json")),
    {MEGATRON, "tp=2,dp=2,ep=2", 3, "decoder.layers.0.",
     .lines = LINES("rank=3 name=decoder.layers.0.self_attention.linear_qkv.layer_norm_weight tensor=model.layers.0.input_layernorm.weight dtype=bf16 box=0:64 offset=0",
                    "rank=3 name=decoder.layers.0.self_attention.linear_qkv.weight tensor=model.layers.0.self_attn.q_proj.weight dtype=bf16 box=32:64,0:64 offset=0",
                    "rank=3 name=decoder.layers.0.self_attention.linear_qkv.weight tensor=model.layers.0.self_attn.k_proj.weight dtype=bf16 box=8:16,0:64 offset=4096",
                    "rank=3 name=decoder.layers.0.self_attention.linear_qkv.weight tensor=model.layers.0.self_attn.v_proj.weight dtype=bf16 box=8:16,0:64 offset=5120",
                    "rank=3 name=decoder.layers.0.self_attention.q_layernorm.weight tensor=model.layers.0.self_attn.q_norm.weight dtype=bf16 box=0:8 offset=0",
                    "rank=3 name=decoder.layers.0.self_attention.k_layernorm.weight tensor=model.layers.0.self_attn.k_norm.weight dtype=bf16 box=0:8 offset=0",
                    "rank=3 name=decoder.layers.0.self_attention.linear_proj.weight tensor=model.layers.0.self_attn.o_proj.weight dtype=bf16 box=0:64,32:64 offset=0",
                    "rank=3 name=decoder.layers.0.pre_mlp_layernorm.weight tensor=model.layers.0.post_attention_layernorm.weight dtype=bf16 box=0:64 offset=0",
                    "rank=3 name=decoder.layers.0.mlp.router.weight tensor=model.layers.0.mlp.gate.weight dtype=bf16 box=0:8,0:64 offset=0",
                    "rank=3 name=decoder.layers.0.mlp.experts.linear_fc1.weight0 tensor=model.layers.0.mlp.experts.gate_proj.weight dtype=bf16 box=4:5,16:32,0:64 offset=0",
                    "rank=3 name=decoder.layers.0.mlp.experts.linear_fc1.weight0 tensor=model.layers.0.mlp.experts.up_proj.weight dtype=bf16 box=4:5,16:32,0:64 offset=2048",
                    "rank=3 name=decoder.layers.0.mlp.experts.linear_fc2.weight0 tensor=model.layers.0.mlp.experts.down_proj.weight dtype=bf16 box=4:5,0:64,16:32 offset=0",
                    "rank=3 name=decoder.layers.0.mlp.experts.linear_fc1.weight1 tensor=model.layers.0.mlp.experts.gate_proj.weight dtype=bf16 box=5:6,16:32,0:64 offset=0",
                    "rank=3 name=decoder.layers.0.mlp.experts.linear_fc1.weight1 tensor=model.layers.0.mlp.experts.up_proj.weight dtype=bf16 box=5:6,16:32,0:64 offset=2048",
                    "rank=3 name=decoder.layers.0.mlp.experts.linear_fc2.weight1 tensor=model.layers.0.mlp.experts.down_proj.weight dtype=bf16 box=5:6,0:64,16:32 offset=0",
                    "rank=3 name=decoder.layers.0.mlp.experts.linear_fc1.weight2 tensor=model.layers.0.mlp.experts.gate_proj.weight dtype=bf16 box=6:7,16:32,0:64 offset=0",
                    "rank=3 name=decoder.layers.0.mlp.experts.linear_fc1.weight2 tensor=model.layers.0.mlp.experts.up_proj.weight dtype=bf16 box=6:7,16:32,0:64 offset=2048",
                    "rank=3 name=decoder.layers.0.mlp.experts.linear_fc2.weight2 tensor=model.layers.0.mlp.experts.down_proj.weight dtype=bf16 box=6:7,0:64,16:32 offset=0",
                    "rank=3 name=decoder.layers.0.mlp.experts.linear_fc1.weight3 tensor=model.layers.0.mlp.experts.gate_proj.weight dtype=bf16 box=7:8,16:32,0:64 offset=0",
                    "rank=3 name=decoder.layers.0.mlp.experts.linear_fc1.weight3 tensor=model.layers.0.mlp.experts.up_proj.weight dtype=bf16 box=7:8,16:32,0:64 offset=2048",
                    "rank=3 name=decoder.layers.0.mlp.experts.linear_fc2.weight3 tensor=model.layers.0.mlp.experts.down_proj.weight dtype=bf16 box=7:8,0:64,16:32 offset=0")},
    /* SequentialMLP (moe_grouped_gemm off): local_experts.<i> */
    {MEGATRON, "tp=2,dp=2,ep=2,grouped_gemm=0", 3, "decoder.layers.0.mlp.experts.local_experts.3.",
     .lines = LINES("rank=3 name=decoder.layers.0.mlp.experts.local_experts.3.linear_fc1.weight tensor=model.layers.0.mlp.experts.gate_proj.weight dtype=bf16 box=7:8,16:32,0:64 offset=0",
                    "rank=3 name=decoder.layers.0.mlp.experts.local_experts.3.linear_fc1.weight tensor=model.layers.0.mlp.experts.up_proj.weight dtype=bf16 box=7:8,16:32,0:64 offset=2048",
                    "rank=3 name=decoder.layers.0.mlp.experts.local_experts.3.linear_fc2.weight tensor=model.layers.0.mlp.experts.down_proj.weight dtype=bf16 box=7:8,0:64,16:32 offset=0")},
    {VLLM, "tp=2,dp=2,ep=4", 2, "model.layers.0.",
     .lines = LINES("rank=2 name=model.layers.0.input_layernorm.weight tensor=model.layers.0.input_layernorm.weight dtype=bf16 box=0:64 offset=0",
                    "rank=2 name=model.layers.0.self_attn.qkv_proj.weight tensor=model.layers.0.self_attn.q_proj.weight dtype=bf16 box=0:32,0:64 offset=0",
                    "rank=2 name=model.layers.0.self_attn.qkv_proj.weight tensor=model.layers.0.self_attn.k_proj.weight dtype=bf16 box=0:8,0:64 offset=4096",
                    "rank=2 name=model.layers.0.self_attn.qkv_proj.weight tensor=model.layers.0.self_attn.v_proj.weight dtype=bf16 box=0:8,0:64 offset=5120",
                    "rank=2 name=model.layers.0.self_attn.q_norm.weight tensor=model.layers.0.self_attn.q_norm.weight dtype=bf16 box=0:8 offset=0",
                    "rank=2 name=model.layers.0.self_attn.k_norm.weight tensor=model.layers.0.self_attn.k_norm.weight dtype=bf16 box=0:8 offset=0",
                    "rank=2 name=model.layers.0.self_attn.o_proj.weight tensor=model.layers.0.self_attn.o_proj.weight dtype=bf16 box=0:64,0:32 offset=0",
                    "rank=2 name=model.layers.0.post_attention_layernorm.weight tensor=model.layers.0.post_attention_layernorm.weight dtype=bf16 box=0:64 offset=0",
                    "rank=2 name=model.layers.0.mlp.gate.weight tensor=model.layers.0.mlp.gate.weight dtype=bf16 box=0:8,0:64 offset=0",
                    "rank=2 name=model.layers.0.mlp.experts.routed_experts.w13_weight tensor=model.layers.0.mlp.experts.gate_proj.weight dtype=bf16 box=4:6,0:32,0:64 offset=0",
                    "rank=2 name=model.layers.0.mlp.experts.routed_experts.w13_weight tensor=model.layers.0.mlp.experts.up_proj.weight dtype=bf16 box=4:6,0:32,0:64 offset=4096",
                    "rank=2 name=model.layers.0.mlp.experts.routed_experts.w2_weight tensor=model.layers.0.mlp.experts.down_proj.weight dtype=bf16 box=4:6,0:64,0:32 offset=0")},
    /* EP off, dp 2 (flatten_tp_across_dp_and_pcp): each expert's rows split
     * over the 4 ranks, flattened TP rank dp_i * tp + tp_i: rank 3 holds
     * rows 24:32 of every expert */
    {VLLM, "tp=2,dp=2", 3, "model.layers.0.mlp.experts.routed_experts.w13_weight",
     .lines = LINES("rank=3 name=model.layers.0.mlp.experts.routed_experts.w13_weight tensor=model.layers.0.mlp.experts.gate_proj.weight dtype=bf16 box=0:8,24:32,0:64 offset=0",
                    "rank=3 name=model.layers.0.mlp.experts.routed_experts.w13_weight tensor=model.layers.0.mlp.experts.up_proj.weight dtype=bf16 box=0:8,24:32,0:64 offset=1024")},
    /* 8 experts over 6 EP ranks (determine_expert_map): ranks 0 and 1 hold
     * two, the others one; rank 5 holds expert 7 */
    {VLLM, "tp=2,dp=3,ep=6", 1, "model.layers.0.mlp.experts.routed_experts.w2_weight",
     .lines = LINES("rank=1 name=model.layers.0.mlp.experts.routed_experts.w2_weight tensor=model.layers.0.mlp.experts.down_proj.weight dtype=bf16 box=2:4,0:64,0:32 offset=0")},
    {VLLM, "tp=2,dp=3,ep=6", 5, "model.layers.0.mlp.experts.routed_experts.w2_weight",
     .lines = LINES("rank=5 name=model.layers.0.mlp.experts.routed_experts.w2_weight tensor=model.layers.0.mlp.experts.down_proj.weight dtype=bf16 box=7:8,0:64,0:32 offset=0")},
};

/* Mixtral. vLLM mixtral.py keeps block_sparse_moe (gate, experts with
 * ckpt_names w1/w2/w3: w13 = [w1; w3]); tp 2, ep off: each expert's
 * rows split in two. Megatron: the same modules as Qwen3-MoE. */
static const check golden_mixtral[] = {
    MODEL(DATA("tiny-mixtral.json")),
    {VLLM, "tp=2", 1, "model.layers.1.block_sparse_moe.",
     .lines = LINES("rank=1 name=model.layers.1.block_sparse_moe.gate.weight tensor=model.layers.1.block_sparse_moe.gate.weight dtype=bf16 box=0:4,0:64 offset=0",
                    "rank=1 name=model.layers.1.block_sparse_moe.experts.routed_experts.w13_weight tensor=model.layers.1.block_sparse_moe.experts.w1.weight dtype=bf16 box=0:4,24:48,0:64 offset=0",
                    "rank=1 name=model.layers.1.block_sparse_moe.experts.routed_experts.w13_weight tensor=model.layers.1.block_sparse_moe.experts.w3.weight dtype=bf16 box=0:4,24:48,0:64 offset=3072",
                    "rank=1 name=model.layers.1.block_sparse_moe.experts.routed_experts.w2_weight tensor=model.layers.1.block_sparse_moe.experts.w2.weight dtype=bf16 box=0:4,0:64,24:48 offset=0")},
    /* Megatron tp2 ep2 etp1: expert grid [1, 2, 1], rank 1 is EP 1: experts
     * 2 and 3 whole */
    {MEGATRON, "tp=2,ep=2,etp=1", 1, "decoder.layers.1.mlp.",
     .lines = LINES("rank=1 name=decoder.layers.1.mlp.router.weight tensor=model.layers.1.block_sparse_moe.gate.weight dtype=bf16 box=0:4,0:64 offset=0",
                    "rank=1 name=decoder.layers.1.mlp.experts.linear_fc1.weight0 tensor=model.layers.1.block_sparse_moe.experts.w1.weight dtype=bf16 box=2:3,0:48,0:64 offset=0",
                    "rank=1 name=decoder.layers.1.mlp.experts.linear_fc1.weight0 tensor=model.layers.1.block_sparse_moe.experts.w3.weight dtype=bf16 box=2:3,0:48,0:64 offset=6144",
                    "rank=1 name=decoder.layers.1.mlp.experts.linear_fc2.weight0 tensor=model.layers.1.block_sparse_moe.experts.w2.weight dtype=bf16 box=2:3,0:64,0:48 offset=0",
                    "rank=1 name=decoder.layers.1.mlp.experts.linear_fc1.weight1 tensor=model.layers.1.block_sparse_moe.experts.w1.weight dtype=bf16 box=3:4,0:48,0:64 offset=0",
                    "rank=1 name=decoder.layers.1.mlp.experts.linear_fc1.weight1 tensor=model.layers.1.block_sparse_moe.experts.w3.weight dtype=bf16 box=3:4,0:48,0:64 offset=6144",
                    "rank=1 name=decoder.layers.1.mlp.experts.linear_fc2.weight1 tensor=model.layers.1.block_sparse_moe.experts.w2.weight dtype=bf16 box=3:4,0:64,0:48 offset=0")},
};

/* DeepSeek-V3 MLA. Megatron TE spec with multi_latent_attention: separate
 * input_layernorm; linear_q_down_proj / linear_kv_down_proj duplicated
 * (multi_latent_attention.py parallel_mode "duplicated"), the q_a / kv_a
 * layernorms fused into linear_q_up_proj / linear_kv_up_proj
 * (layer_norm_weight), up projections split by heads; dense layers (layer 0)
 * fuse pre_mlp_layernorm into linear_fc1. vLLM deepseek_v2.py
 * DeepseekV2MLAAttention: fused_qkv_a_proj = [q_a_proj; kv_a_proj_with_mqa]
 * replicated. Megatron tp2 pp2 ep2 etp1: rank 1 = stage 0 TP 1; rank 3 =
 * stage 1 TP 1 / EP 1 (experts 4..7), layer 3 being its layer 1. */
static const check golden_deepseek_v3[] = {
    MODEL(DATA("tiny-deepseek-v3.json")),
    {MEGATRON, "tp=2,pp=2,ep=2,etp=1", 1, "decoder.layers.0.",
     .lines = LINES("rank=1 name=decoder.layers.0.input_layernorm.weight tensor=model.layers.0.input_layernorm.weight dtype=bf16 box=0:64 offset=0",
                    "rank=1 name=decoder.layers.0.self_attention.linear_q_down_proj.weight tensor=model.layers.0.self_attn.q_a_proj.weight dtype=bf16 box=0:24,0:64 offset=0",
                    "rank=1 name=decoder.layers.0.self_attention.linear_q_up_proj.layer_norm_weight tensor=model.layers.0.self_attn.q_a_layernorm.weight dtype=bf16 box=0:24 offset=0",
                    "rank=1 name=decoder.layers.0.self_attention.linear_q_up_proj.weight tensor=model.layers.0.self_attn.q_b_proj.weight dtype=bf16 box=24:48,0:24 offset=0",
                    "rank=1 name=decoder.layers.0.self_attention.linear_kv_down_proj.weight tensor=model.layers.0.self_attn.kv_a_proj_with_mqa.weight dtype=bf16 box=0:20,0:64 offset=0",
                    "rank=1 name=decoder.layers.0.self_attention.linear_kv_up_proj.layer_norm_weight tensor=model.layers.0.self_attn.kv_a_layernorm.weight dtype=bf16 box=0:16 offset=0",
                    "rank=1 name=decoder.layers.0.self_attention.linear_kv_up_proj.weight tensor=model.layers.0.self_attn.kv_b_proj.weight dtype=bf16 box=32:64,0:16 offset=0",
                    "rank=1 name=decoder.layers.0.self_attention.linear_proj.weight tensor=model.layers.0.self_attn.o_proj.weight dtype=bf16 box=0:64,16:32 offset=0",
                    "rank=1 name=decoder.layers.0.mlp.linear_fc1.layer_norm_weight tensor=model.layers.0.post_attention_layernorm.weight dtype=bf16 box=0:64 offset=0",
                    "rank=1 name=decoder.layers.0.mlp.linear_fc1.weight tensor=model.layers.0.mlp.gate_proj.weight dtype=bf16 box=48:96,0:64 offset=0",
                    "rank=1 name=decoder.layers.0.mlp.linear_fc1.weight tensor=model.layers.0.mlp.up_proj.weight dtype=bf16 box=48:96,0:64 offset=6144",
                    "rank=1 name=decoder.layers.0.mlp.linear_fc2.weight tensor=model.layers.0.mlp.down_proj.weight dtype=bf16 box=0:64,48:96 offset=0")},
    /* shared experts over TP, not ETP (moe_module_specs.py SharedExpertMLP,
     * tp_group pg_collection.tp) */
    {MEGATRON, "tp=2,pp=2,ep=2,etp=1", 3, "decoder.layers.1.mlp.",
     .lines = LINES("rank=3 name=decoder.layers.1.mlp.router.weight tensor=model.layers.3.mlp.gate.weight dtype=bf16 box=0:8,0:64 offset=0",
                    "rank=3 name=decoder.layers.1.mlp.router.expert_bias tensor=model.layers.3.mlp.gate.e_score_correction_bias dtype=f32 box=0:8 offset=0",
                    "rank=3 name=decoder.layers.1.mlp.experts.linear_fc1.weight0 tensor=model.layers.3.mlp.experts.gate_proj.weight dtype=bf16 box=4:5,0:16,0:64 offset=0",
                    "rank=3 name=decoder.layers.1.mlp.experts.linear_fc1.weight0 tensor=model.layers.3.mlp.experts.up_proj.weight dtype=bf16 box=4:5,0:16,0:64 offset=2048",
                    "rank=3 name=decoder.layers.1.mlp.experts.linear_fc2.weight0 tensor=model.layers.3.mlp.experts.down_proj.weight dtype=bf16 box=4:5,0:64,0:16 offset=0",
                    "rank=3 name=decoder.layers.1.mlp.experts.linear_fc1.weight1 tensor=model.layers.3.mlp.experts.gate_proj.weight dtype=bf16 box=5:6,0:16,0:64 offset=0",
                    "rank=3 name=decoder.layers.1.mlp.experts.linear_fc1.weight1 tensor=model.layers.3.mlp.experts.up_proj.weight dtype=bf16 box=5:6,0:16,0:64 offset=2048",
                    "rank=3 name=decoder.layers.1.mlp.experts.linear_fc2.weight1 tensor=model.layers.3.mlp.experts.down_proj.weight dtype=bf16 box=5:6,0:64,0:16 offset=0",
                    "rank=3 name=decoder.layers.1.mlp.experts.linear_fc1.weight2 tensor=model.layers.3.mlp.experts.gate_proj.weight dtype=bf16 box=6:7,0:16,0:64 offset=0",
                    "rank=3 name=decoder.layers.1.mlp.experts.linear_fc1.weight2 tensor=model.layers.3.mlp.experts.up_proj.weight dtype=bf16 box=6:7,0:16,0:64 offset=2048",
                    "rank=3 name=decoder.layers.1.mlp.experts.linear_fc2.weight2 tensor=model.layers.3.mlp.experts.down_proj.weight dtype=bf16 box=6:7,0:64,0:16 offset=0",
                    "rank=3 name=decoder.layers.1.mlp.experts.linear_fc1.weight3 tensor=model.layers.3.mlp.experts.gate_proj.weight dtype=bf16 box=7:8,0:16,0:64 offset=0",
                    "rank=3 name=decoder.layers.1.mlp.experts.linear_fc1.weight3 tensor=model.layers.3.mlp.experts.up_proj.weight dtype=bf16 box=7:8,0:16,0:64 offset=2048",
                    "rank=3 name=decoder.layers.1.mlp.experts.linear_fc2.weight3 tensor=model.layers.3.mlp.experts.down_proj.weight dtype=bf16 box=7:8,0:64,0:16 offset=0",
                    "rank=3 name=decoder.layers.1.mlp.shared_experts.linear_fc1.weight tensor=model.layers.3.mlp.shared_experts.gate_proj.weight dtype=bf16 box=16:32,0:64 offset=0",
                    "rank=3 name=decoder.layers.1.mlp.shared_experts.linear_fc1.weight tensor=model.layers.3.mlp.shared_experts.up_proj.weight dtype=bf16 box=16:32,0:64 offset=2048",
                    "rank=3 name=decoder.layers.1.mlp.shared_experts.linear_fc2.weight tensor=model.layers.3.mlp.shared_experts.down_proj.weight dtype=bf16 box=0:64,16:32 offset=0")},
    /* vLLM tp2 dp2 ep4: rank 3 is TP 1 and EP 3 (experts 6, 7) */
    {VLLM, "tp=2,dp=2,ep=4", 3, "model.layers.1.self_attn.",
     .lines = LINES("rank=3 name=model.layers.1.self_attn.fused_qkv_a_proj.weight tensor=model.layers.1.self_attn.q_a_proj.weight dtype=bf16 box=0:24,0:64 offset=0",
                    "rank=3 name=model.layers.1.self_attn.fused_qkv_a_proj.weight tensor=model.layers.1.self_attn.kv_a_proj_with_mqa.weight dtype=bf16 box=0:20,0:64 offset=3072",
                    "rank=3 name=model.layers.1.self_attn.q_a_layernorm.weight tensor=model.layers.1.self_attn.q_a_layernorm.weight dtype=bf16 box=0:24 offset=0",
                    "rank=3 name=model.layers.1.self_attn.q_b_proj.weight tensor=model.layers.1.self_attn.q_b_proj.weight dtype=bf16 box=24:48,0:24 offset=0",
                    "rank=3 name=model.layers.1.self_attn.kv_a_layernorm.weight tensor=model.layers.1.self_attn.kv_a_layernorm.weight dtype=bf16 box=0:16 offset=0",
                    "rank=3 name=model.layers.1.self_attn.kv_b_proj.weight tensor=model.layers.1.self_attn.kv_b_proj.weight dtype=bf16 box=32:64,0:16 offset=0",
                    "rank=3 name=model.layers.1.self_attn.o_proj.weight tensor=model.layers.1.self_attn.o_proj.weight dtype=bf16 box=0:64,16:32 offset=0")},
    {VLLM, "tp=2,dp=2,ep=4", 3, "model.layers.1.mlp.experts.",
     .lines = LINES("rank=3 name=model.layers.1.mlp.experts.routed_experts.w13_weight tensor=model.layers.1.mlp.experts.gate_proj.weight dtype=bf16 box=6:8,0:16,0:64 offset=0",
                    "rank=3 name=model.layers.1.mlp.experts.routed_experts.w13_weight tensor=model.layers.1.mlp.experts.up_proj.weight dtype=bf16 box=6:8,0:16,0:64 offset=2048",
                    "rank=3 name=model.layers.1.mlp.experts.routed_experts.w2_weight tensor=model.layers.1.mlp.experts.down_proj.weight dtype=bf16 box=6:8,0:64,0:16 offset=0")},
};

/* Real geometries: sizes of a few parameters of shipped configs. */
static const check golden_shipped_sizes[] = {
    /* Llama-3.1-70B Megatron tp8 pp4 dp2, vocabulary 128256 unpadded:
     * 16032 rows a TP rank; one KV group a rank: 8 q heads + k + v = 1280 rows */
    MODEL(SHIPPED("Llama-3.1-70B.json")),
    {MEGATRON, "tp=8,pp=4,dp=2", 0, "embedding.word_embeddings.weight", .bytes = 16032LL * 8192 * 2},
    {MEGATRON, "tp=8,pp=4,dp=2", 16, "embedding.word_embeddings.weight", .bytes = 0},
    {MEGATRON, "tp=8,pp=4,dp=2", 9, "decoder.layers.0.self_attention.linear_qkv.weight", .bytes = 1280LL * 8192 * 2},
    {MEGATRON, "tp=8,pp=4,dp=2", 63, "decoder.layers.19.mlp.linear_fc1.weight", .bytes = 2LL * 3584 * 8192 * 2},
    {MEGATRON, "tp=8,pp=4,dp=2", 63, "decoder.layers.20.mlp.linear_fc1.weight", .bytes = 0},
    {MEGATRON, "tp=8,pp=4,dp=2", 63, "output_layer.weight", .bytes = 16032LL * 8192 * 2},
    /* DeepSeek-V3, 61 layers: Megatron pp 8 needs first/last (first=5: 5 +
     * 7 x 8); tp8 dp4 ep8 etp2: expert-DP 2, 32 local experts, each half of
     * its gate and up */
    MODEL(SHIPPED("DeepSeek-V3.json")),
    {MEGATRON, "tp=8,pp=8,dp=4,ep=8,etp=2", .says = "pp 8 does not divide the 61 layers"},
    {MEGATRON, "tp=8,pp=8,dp=4,ep=8,etp=2,first=5", 5, "decoder.layers.4.mlp.experts.linear_fc1.weight31", .bytes = 2048LL * 7168 * 2},
    {MEGATRON, "tp=8,pp=8,dp=4,ep=8,etp=2,first=5", 5, "decoder.layers.5.mlp.experts.linear_fc1.weight0", .bytes = 0},
    {MEGATRON, "tp=8,pp=8,dp=4,ep=8,etp=2,first=5", 32, "decoder.layers.7.mlp.experts.linear_fc2.weight0", .bytes = 7168LL * 1024 * 2},
    /* vLLM tp8 dp4 ep32: 8 experts per rank; shared experts whole (SP MoE) */
    {VLLM, "tp=8,dp=4,ep=32", 31, "model.layers.3.mlp.experts.routed_experts.w13_weight", .bytes = 8LL * 4096 * 7168 * 2},
    {VLLM, "tp=8,dp=4,ep=32", 17, "model.layers.3.mlp.shared_experts.gate_up_proj.weight", .bytes = 4096LL * 7168 * 2},
    {VLLM, "tp=8,dp=4,ep=32", 17, "model.layers.3.mlp.gate.e_score_correction_bias", .bytes = 256 * 4},
};

/* ------------------------------------------------------------------ */
/* 8. What vLLM rewrites after loading                                  */
/* ------------------------------------------------------------------ */

static const char *after_load(const rm_model *m, rm_framework fw, const reshard_layout_t *L, const char *name) {
  int b;
  assert_int_equal(reshard_layout_find_buffer(L, name, 0, &b), RESHARD_SUCCESS);
  return rm_after_load(m, fw, L, b);
}

/* vLLM mla_attention.py MLAAttention.process_weights_after_loading
 * (W_UK_T / W_UV from kv_b_proj), fused_moe/oracle convert_to_*_moe_kernel_
 * format (swap_w13_to_w31 and friends), deep_gemm.py
 * deepgemm_post_process_fp8_weight_block (UE8M0). */
static void after_load_flags(void **state) {
  (void)state;
  rm_model *m = load(DATA("tiny-deepseek-v3.json"), 0);
  reshard_layout_t *D = layout(m, VLLM, "tp=2"), *S = layout(m, MEGATRON, "tp=2");
  assert_non_null(strstr(after_load(m, RM_FRAMEWORK_VLLM, D, "model.layers.1.self_attn.kv_b_proj.weight"), "W_UK_T"));
  assert_non_null(strstr(after_load(m, RM_FRAMEWORK_VLLM, D, "model.layers.1.mlp.experts.routed_experts.w13_weight"),
                         "swap_w13_to_w31"));
  assert_non_null(after_load(m, RM_FRAMEWORK_VLLM, D, "model.layers.1.mlp.experts.routed_experts.w2_weight"));
  assert_null(after_load(m, RM_FRAMEWORK_VLLM, D, "model.layers.1.self_attn.q_b_proj.weight"));
  assert_null(after_load(m, RM_FRAMEWORK_VLLM, D, "model.layers.1.mlp.gate.e_score_correction_bias"));
  assert_null(after_load(m, RM_FRAMEWORK_MEGATRON, S, "decoder.layers.1.self_attention.linear_kv_up_proj.weight"));
  assert_null(rm_after_load(m, RM_FRAMEWORK_VLLM, D, -1));
  reshard_layout_destroy(D);
  reshard_layout_destroy(S);
  rm_model_free(m);
  m = load_fp8(DATA("tiny-deepseek-v3-fp8.json"));
  D = layout(m, VLLM, "tp=2");
  assert_non_null(strstr(after_load(m, RM_FRAMEWORK_VLLM, D, "model.layers.1.self_attn.q_b_proj.weight"), "DeepGEMM"));
  assert_non_null(strstr(after_load(m, RM_FRAMEWORK_VLLM, D, "model.layers.1.self_attn.q_b_proj.weight_scale_inv"),
                         "UE8M0"));
  assert_non_null(strstr(after_load(m, RM_FRAMEWORK_VLLM, D, "model.layers.1.mlp.experts.routed_experts.w13_weight_scale_inv"),
                         "DeepGEMM"));
  assert_null(after_load(m, RM_FRAMEWORK_VLLM, D, "model.layers.1.input_layernorm.weight"));
  reshard_layout_destroy(D);
  rm_model_free(m);
}

/* ------------------------------------------------------------------ */
/* 9. fp8 block scales of a fused q/k/v                                 */
/* ------------------------------------------------------------------ */

/* The scales follow their weights in blocks of rows. With whole blocks per
 * head (tiny-llama-fp8: head_dim 8, blocks 8 x 8) every cut is between
 * blocks: Megatron's groups (attention.py get_query_key_value_tensors)
 * and vLLM's replicated KV heads (linear.py QKVParallelLinear) alike.
 * Without (tiny-llama-fp8-coarse: head_dim 8, blocks 16 x 8) only vLLM
 * without replication splits, and only where q's and k/v's per-rank rows
 * are whole blocks: vllm/model_executor/layers/quantization/utils/
 * fp8_utils.py validate_fp8_block_shape refuses the rest too. */
static const check golden_fp8_qkv_scales[] = {
    {.model = DATA("tiny-llama-fp8.json"), .fp8 = 1},
    /* rank 1: KV group 1 = q heads 4-7 (rows 32:64, scale rows 4:8), k/v
     * head 1 (rows 8:16, scale row 1) */
    {MEGATRON, "tp=2", 1, "decoder.layers.0.self_attention.linear_qkv.weight",
     .lines = LINES("rank=1 name=decoder.layers.0.self_attention.linear_qkv.weight tensor=model.layers.0.self_attn.q_proj.weight dtype=fp8e4m3 box=32:64,0:64 offset=0",
                    "rank=1 name=decoder.layers.0.self_attention.linear_qkv.weight tensor=model.layers.0.self_attn.k_proj.weight dtype=fp8e4m3 box=8:16,0:64 offset=2048",
                    "rank=1 name=decoder.layers.0.self_attention.linear_qkv.weight tensor=model.layers.0.self_attn.v_proj.weight dtype=fp8e4m3 box=8:16,0:64 offset=2560",
                    "rank=1 name=decoder.layers.0.self_attention.linear_qkv.weight_scale_inv tensor=model.layers.0.self_attn.q_proj.weight_scale_inv dtype=f32 box=4:8,0:8 offset=0",
                    "rank=1 name=decoder.layers.0.self_attention.linear_qkv.weight_scale_inv tensor=model.layers.0.self_attn.k_proj.weight_scale_inv dtype=f32 box=1:2,0:8 offset=128",
                    "rank=1 name=decoder.layers.0.self_attention.linear_qkv.weight_scale_inv tensor=model.layers.0.self_attn.v_proj.weight_scale_inv dtype=f32 box=1:2,0:8 offset=160")},
    /* vLLM tp 4 > 2 KV heads: rank 1 has q heads 2, 3 and KV head 0 */
    {VLLM, "tp=4", 1, "model.layers.0.self_attn.qkv_proj.weight",
     .lines = LINES("rank=1 name=model.layers.0.self_attn.qkv_proj.weight tensor=model.layers.0.self_attn.q_proj.weight dtype=fp8e4m3 box=16:32,0:64 offset=0",
                    "rank=1 name=model.layers.0.self_attn.qkv_proj.weight tensor=model.layers.0.self_attn.k_proj.weight dtype=fp8e4m3 box=0:8,0:64 offset=1024",
                    "rank=1 name=model.layers.0.self_attn.qkv_proj.weight tensor=model.layers.0.self_attn.v_proj.weight dtype=fp8e4m3 box=0:8,0:64 offset=1536",
                    "rank=1 name=model.layers.0.self_attn.qkv_proj.weight_scale_inv tensor=model.layers.0.self_attn.q_proj.weight_scale_inv dtype=f32 box=2:4,0:8 offset=0",
                    "rank=1 name=model.layers.0.self_attn.qkv_proj.weight_scale_inv tensor=model.layers.0.self_attn.k_proj.weight_scale_inv dtype=f32 box=0:1,0:8 offset=64",
                    "rank=1 name=model.layers.0.self_attn.qkv_proj.weight_scale_inv tensor=model.layers.0.self_attn.v_proj.weight_scale_inv dtype=f32 box=0:1,0:8 offset=96")},
    {.model = DATA("tiny-llama-fp8-coarse.json"), .fp8 = 1},
    /* vLLM tp 2 <= 4 KV heads: q rows 32:64 (scale rows 2:4 of 4), k/v
     * heads 2, 3 (rows 16:32, scale row 1 of 2) */
    {VLLM, "tp=2", 1, "model.layers.0.self_attn.qkv_proj.weight_scale_inv",
     .lines = LINES("rank=1 name=model.layers.0.self_attn.qkv_proj.weight_scale_inv tensor=model.layers.0.self_attn.q_proj.weight_scale_inv dtype=f32 box=2:4,0:8 offset=0",
                    "rank=1 name=model.layers.0.self_attn.qkv_proj.weight_scale_inv tensor=model.layers.0.self_attn.k_proj.weight_scale_inv dtype=f32 box=1:2,0:8 offset=64",
                    "rank=1 name=model.layers.0.self_attn.qkv_proj.weight_scale_inv tensor=model.layers.0.self_attn.v_proj.weight_scale_inv dtype=f32 box=1:2,0:8 offset=96")},
    {MEGATRON, "tp=1", .says = "Megatron interleaves q, k and v per KV group"},
    {VLLM, "tp=4", .says = "nor are q's and k/v's rows cut in tp pieces"},
    {VLLM, "tp=8", .says = "each TP rank holds one replicated KV head"},
};

/* ------------------------------------------------------------------ */
/* 10. What each pipeline stage builds besides its layers              */
/* ------------------------------------------------------------------ */

/* A config written from json (single quotes for double quotes) to a
 * temporary file, loaded, and the file removed. */
static rm_model *load_json(const char *json) {
  char path[] = "/tmp/reshard_layouts_XXXXXX";
  int fd = mkstemp(path);
  assert_true(fd >= 0);
  FILE *f = fdopen(fd, "w");
  assert_non_null(f);
  for (const char *c = json; *c; c++) fputc(*c == '\'' ? '"' : *c, f);
  assert_int_equal(fclose(f), 0);
  rm_model *m = load(path, 0);
  unlink(path);
  return m;
}

/* The three names a stage may build besides its layers, on rank: exactly
 * those of want (embed_tokens, norm, lm_head; NULL where the rank must
 * have none), in the order named_parameters gives them. */
static void expect_ends(const reshard_layout_t *L, int rank, const char *embed, const char *norm, const char *head) {
  const char *names[3] = {"model.embed_tokens.weight", "model.norm.weight", "lm_head.weight"};
  const char *want[3] = {embed, norm, head};
  for (int i = 0; i < 3; i++) {
    if (want[i]) {
      expect_lines(L, rank, names[i], LINES(want[i]));
    } else {
      int b;
      if (reshard_layout_find_buffer(L, names[i], rank, &b) == RESHARD_SUCCESS)
        print_error("rank %d holds '%s' (buffer %d); vLLM builds PPMissingLayer there\n", rank, names[i], b);
      assert_int_equal(param_bytes(L, names[i], rank), 0);
    }
  }
}

/* vLLM 0.33.0, per architecture (the "stage ends" of src/models/vllm.c):
 *  - qwen3_moe.py Qwen3MoeModel.__init__ / Qwen3MoeForCausalLM.__init__
 *    and mixtral.py MixtralModel.__init__ / MixtralForCausalLM.__init__
 *    build embed_tokens, norm and lm_head with no get_pp_group() test, so
 *    every stage has all three (AutoWeightsLoader loads them there); tied
 *    (ParallelLMHead.tie_weights), lm_head.weight IS embed_tokens.weight
 *    and named_parameters lists it once, as model.embed_tokens.weight;
 *  - llama.py LlamaModel.__init__ / LlamaForCausalLM.__init__ (Mistral's
 *    too), qwen2.py Qwen2Model.__init__ / Qwen2ForCausalLM.__init__,
 *    qwen3.py Qwen3ForCausalLM.__init__: embed_tokens where is_first_rank
 *    or (tie_word_embeddings and is_last_rank), norm and lm_head where
 *    is_last_rank, PPMissingLayer elsewhere;
 *  - deepseek_v2.py DeepseekV2Model.__init__ / DeepseekV2ForCausalLM
 *    .__init__ (DeepseekV3ForCausalLM): embed_tokens where is_first_rank,
 *    norm and lm_head where is_last_rank, never tied: a tied config's last
 *    stage still has its own lm_head.weight (filled from the embedding).
 * make_layers (models/utils.py) builds only the stage's layers
 * (get_pp_indices); tp 2, pp 2: stage 0 is ranks 0, 1, stage 1 ranks 2, 3;
 * 1000 rows padded to 1024, 512 a TP rank. */
static void vllm_stage_ends(void **state) {
  (void)state;
  /* The golden lines of tp 2 (1000 rows padded to 1024, 512 a TP rank)
   * the tables below place: which stage builds which end. */
  const char *embed1 = "rank=1 name=model.embed_tokens.weight tensor=model.embed_tokens.weight dtype=bf16 box=512:1000,0:64 offset=0",
             *norm1 = "rank=1 name=model.norm.weight tensor=model.norm.weight dtype=bf16 box=0:64 offset=0",
             *embed2 = "rank=2 name=model.embed_tokens.weight tensor=model.embed_tokens.weight dtype=bf16 box=0:512,0:64 offset=0",
             *norm2 = "rank=2 name=model.norm.weight tensor=model.norm.weight dtype=bf16 box=0:64 offset=0",
             *head2 = "rank=2 name=lm_head.weight tensor=lm_head.weight dtype=bf16 box=0:512,0:64 offset=0";
  /* Qwen3-MoE, Mixtral: every stage all three */
  const check moe[] = {
      ENDS("tp=2,pp=2", 1, embed1, norm1,
           "rank=1 name=lm_head.weight tensor=lm_head.weight dtype=bf16 box=512:1000,0:64 offset=0"),
      ENDS("tp=2,pp=2", 2, embed2, norm2, head2),
      /* the layers stay the stage's own */
      {VLLM, "tp=2,pp=2", 2, "model.layers.0.input_layernorm.weight", .bytes = 0},
  };
  CHECK_MODEL(DATA("tiny-qwen3-moe.json"), moe);
  CHECK_MODEL(DATA("tiny-mixtral.json"), moe);
  /* pp 3 over tiny-qwen3-moe's 4 layers ([1, 2, 1]): the middle stage too */
  const check moe_pp3[] = {
      ENDS("pp=3", 1, "rank=1 name=model.embed_tokens.weight tensor=model.embed_tokens.weight dtype=bf16 box=0:1000,0:64 offset=0",
           norm1, "rank=1 name=lm_head.weight tensor=lm_head.weight dtype=bf16 box=0:1000,0:64 offset=0"),
  };
  CHECK_MODEL(DATA("tiny-qwen3-moe.json"), moe_pp3);

  /* tied: embed_tokens on every stage, no lm_head.weight anywhere */
  const char *tied[] = {
      "{'architectures': ['Qwen3MoeForCausalLM'], 'model_type': 'qwen3_moe', 'vocab_size': 1000, 'hidden_size': 64,"
      " 'num_hidden_layers': 4, 'num_attention_heads': 8, 'num_key_value_heads': 2, 'head_dim': 8,"
      " 'num_experts': 8, 'moe_intermediate_size': 32, 'decoder_sparse_step': 1, 'mlp_only_layers': [],"
      " 'tie_word_embeddings': true}",
      "{'architectures': ['MixtralForCausalLM'], 'model_type': 'mixtral', 'vocab_size': 1000, 'hidden_size': 64,"
      " 'intermediate_size': 48, 'num_hidden_layers': 2, 'num_attention_heads': 8, 'num_key_value_heads': 2,"
      " 'num_local_experts': 4, 'tie_word_embeddings': true}"};
  const check moe_tied[] = {ENDS("tp=2,pp=2", 1, embed1, norm1, NULL), ENDS("tp=2,pp=2", 2, embed2, norm2, NULL)};
  for (int i = 0; i < 2; i++) {
    rm_model *m = load_json(tied[i]);
    CHECKS(m, moe_tied);
    rm_model_free(m);
  }

  /* Llama (and Mistral, Qwen2, Qwen3): the first stage embeds, the last
   * normalizes and projects; DeepSeek-V3 too (below) */
  const check untied[] = {ENDS("tp=2,pp=2", 1, embed1, NULL, NULL), ENDS("tp=2,pp=2", 2, NULL, norm2, head2)};
  CHECK_MODEL(DATA("tiny-llama.json"), untied);
  /* pp 3: the middle stage builds none of them */
  const check llama_pp3[] = {ENDS("pp=3", 1, NULL, NULL, NULL)};
  CHECK_MODEL(DATA("tiny-llama.json"), llama_pp3);
  /* tied Qwen3: the last stage's own embed_tokens is its lm_head */
  const check qwen3_tied[] = {ENDS("tp=2,pp=2", 1, embed1, NULL, NULL), ENDS("tp=2,pp=2", 2, embed2, norm2, NULL)};
  CHECK_MODEL(DATA("tiny-qwen3-bias.json"), qwen3_tied);

  /* DeepSeek-V3: first / last only, like Llama untied */
  CHECK_MODEL(DATA("tiny-deepseek-v3.json"), untied);
  /* tied DeepSeek: vLLM's lm_head stays a parameter of its own, on the
   * last stage only, holding the embedding; pp 1: both on the one stage */
  rm_model *m = load_json("{'architectures': ['DeepseekV3ForCausalLM'], 'model_type': 'deepseek_v3', 'vocab_size': 1000,"
                          " 'hidden_size': 64, 'intermediate_size': 96, 'moe_intermediate_size': 16, 'num_hidden_layers': 2,"
                          " 'num_attention_heads': 4, 'q_lora_rank': 24, 'kv_lora_rank': 16, 'qk_nope_head_dim': 8,"
                          " 'qk_rope_head_dim': 4, 'v_head_dim': 8, 'n_routed_experts': 8, 'n_shared_experts': 2,"
                          " 'first_k_dense_replace': 1, 'topk_method': 'noaux_tc', 'tie_word_embeddings': true}");
  const check deepseek_tied[] = {
      ENDS("tp=2,pp=2", 1, embed1, NULL, NULL),
      ENDS("tp=2,pp=2", 2, NULL, norm2,
           "rank=2 name=lm_head.weight tensor=model.embed_tokens.weight dtype=bf16 box=0:512,0:64 offset=0"),
      ENDS("tp=2", 1, embed1, norm1,
           "rank=1 name=lm_head.weight tensor=model.embed_tokens.weight dtype=bf16 box=512:1000,0:64 offset=0"),
  };
  CHECKS(m, deepseek_tied);
  rm_model_free(m);
}

/* ------------------------------------------------------------------ */
/* 11. ep / etp on a dense model: what was given, etp 0 being unset     */
/* ------------------------------------------------------------------ */

/* The message names the settings the user gave (rm_parallel.etp 0 is
 * unset, RM_PARALLEL_INIT), not the unset etp as "etp 0"; ep=1 / etp=1
 * say nothing a dense model lacks and are accepted. */
static void dense_ep_etp(void **state) {
  (void)state;
  rm_model *m = load(DATA("tiny-llama.json"), 0);
  for (int side = MEGATRON; side <= VLLM; side++) {
    const char *who = side == VLLM ? "vllm layout: " : "megatron layout: ";
    char want[256];
    snprintf(want, sizeof want, "%sep 2 given for the dense model '%s'", who, DATA("tiny-llama.json"));
    refused(m, side, "dp=2,ep=2", want);
    assert_null(strstr(reshard_last_error(), "etp"));
    snprintf(want, sizeof want, "%setp 2 given for the dense model", who);
    refused(m, side, "tp=2,etp=2", want);
    assert_null(strstr(reshard_last_error(), "ep 1"));
    snprintf(want, sizeof want, "%sep 2 and etp 2 given for the dense model", who);
    refused(m, side, "dp=2,ep=2,etp=2", want);
    reshard_layout_destroy(layout(m, side, "tp=2,ep=1,etp=1"));
  }
  /* a programmatic rm_parallel: etp 0 is unset, a negative one is given */
  rm_parallel p = RM_PARALLEL_INIT;
  reshard_layout_t *L = NULL;
  assert_int_equal(p.etp, 0);
  assert_int_equal(rm_vllm_layout(m, &p, 0, &L), RESHARD_SUCCESS);
  reshard_layout_destroy(L);
  L = NULL;
  p.etp = -1;
  assert_int_equal(rm_vllm_layout(m, &p, 0, &L), RESHARD_ERROR_INVALID_ARGUMENT);
  assert_non_null(strstr(reshard_last_error(), "etp -1 given for the dense model"));
  assert_null(L);
  rm_model_free(m);
}

/* w31=1: routed experts' w13 as [up (w3); gate (w1)] per expert, the
 * live format of vLLM's FlashInfer CUTLASS fused-MoE backend
 * (vllm/model_executor/layers/fused_moe/oracle/unquantized.py
 * convert_to_unquantized_kernel_format -> quantization/utils/
 * flashinfer_utils.py swap_w13_to_w31: the two halves of each expert's
 * rows flipped); everything else as without it. Refused for Megatron and
 * for dense models. */
static const check vllm_w31[] = {
    MODEL(DATA("tiny-qwen3-moe.json")),
    {VLLM, "tp=2,dp=2,w31=1", 3, "model.layers.0.mlp.experts.routed_experts.w13_weight",
     .lines = LINES("rank=3 name=model.layers.0.mlp.experts.routed_experts.w13_weight tensor=model.layers.0.mlp.experts.up_proj.weight dtype=bf16 box=0:8,24:32,0:64 offset=0",
                    "rank=3 name=model.layers.0.mlp.experts.routed_experts.w13_weight tensor=model.layers.0.mlp.experts.gate_proj.weight dtype=bf16 box=0:8,24:32,0:64 offset=1024")},
    {VLLM, "tp=2,dp=2,w31=1", 3, "model.layers.0.mlp.experts.routed_experts.w2_weight",
     .lines = LINES("rank=3 name=model.layers.0.mlp.experts.routed_experts.w2_weight tensor=model.layers.0.mlp.experts.down_proj.weight dtype=bf16 box=0:8,0:64,24:32 offset=0")},
    {VLLM, "tp=2,dp=2,ep=4,w31=1", 2, "model.layers.0.mlp.experts.routed_experts.w13_weight",
     .lines = LINES("rank=2 name=model.layers.0.mlp.experts.routed_experts.w13_weight tensor=model.layers.0.mlp.experts.up_proj.weight dtype=bf16 box=4:6,0:32,0:64 offset=0",
                    "rank=2 name=model.layers.0.mlp.experts.routed_experts.w13_weight tensor=model.layers.0.mlp.experts.gate_proj.weight dtype=bf16 box=4:6,0:32,0:64 offset=4096")},
    {MEGATRON, "tp=2,w31=1", .says = "megatron layout: key 'w31' is vLLM's"},
    /* per-expert tensors (checkpoint names): each expert's up then gate */
    {.model = DATA("tiny-qwen3-moe.json"), .per_expert = 1},
    {VLLM, "tp=2,dp=2,ep=4,w31=1", 2, "model.layers.0.mlp.experts.routed_experts.w13_weight",
     .lines = LINES("rank=2 name=model.layers.0.mlp.experts.routed_experts.w13_weight tensor=model.layers.0.mlp.experts.4.up_proj.weight dtype=bf16 box=0:32,0:64 offset=0",
                    "rank=2 name=model.layers.0.mlp.experts.routed_experts.w13_weight tensor=model.layers.0.mlp.experts.4.gate_proj.weight dtype=bf16 box=0:32,0:64 offset=4096",
                    "rank=2 name=model.layers.0.mlp.experts.routed_experts.w13_weight tensor=model.layers.0.mlp.experts.5.up_proj.weight dtype=bf16 box=0:32,0:64 offset=8192",
                    "rank=2 name=model.layers.0.mlp.experts.routed_experts.w13_weight tensor=model.layers.0.mlp.experts.5.gate_proj.weight dtype=bf16 box=0:32,0:64 offset=12288")},
    MODEL(DATA("tiny-llama.json")),
    {VLLM, "tp=2,w31=1", .says = "vllm layout: w31=1 given for the dense model"},
};

/* ------------------------------------------------------------------ */
/* SGLang 0.5.23 (python/sglang/srt of the wheel)                      */
/* ------------------------------------------------------------------ */

/* Rank order: runtime_context.py spawn_world_rank (tp_size * pp_rank +
 * tp_rank), --dp-size replicas outermost: tp2 pp3 dp2, rank 4 is (tp 0,
 * pp 2, dp 0), rank 2 (tp 0, pp 1, dp 0), rank 6 (tp 0, pp 0, dp 1).
 * Stages: distributed/utils.py get_pp_indices puts the remainder on the
 * LAST stages (4 layers over 3: 1, 1, 2; vLLM gives 1, 2, 1). Llama:
 * models/llama.py LlamaModel.__init__ builds embed_tokens where
 * is_first_rank and norm where is_last_rank, LlamaForCausalLM.__init__ an
 * untied ParallelLMHead on every stage. Vocabulary: 1000 rows padded to
 * 1024 (vocab_parallel_embedding.py pad_vocab_size, 64), 512 per TP rank. */
static const check sglang_rank_order[] = {
    MODEL(DATA("tiny-llama.json")),
    /* layers/linear.py QKVParallelLinear: q heads 0-3 (rows 0:32), KV head 0 */
    {SGLANG, "tp=2,pp=3,dp=2", 4, "model.layers.3.self_attn.qkv_proj.weight",
     .lines = LINES("rank=4 name=model.layers.3.self_attn.qkv_proj.weight tensor=model.layers.3.self_attn.q_proj.weight dtype=bf16 box=0:32,0:64 offset=0",
                    "rank=4 name=model.layers.3.self_attn.qkv_proj.weight tensor=model.layers.3.self_attn.k_proj.weight dtype=bf16 box=0:8,0:64 offset=4096",
                    "rank=4 name=model.layers.3.self_attn.qkv_proj.weight tensor=model.layers.3.self_attn.v_proj.weight dtype=bf16 box=0:8,0:64 offset=5120")},
    {SGLANG, "tp=2,pp=3,dp=2", 4, "model.layers.2.input_layernorm.weight", .bytes = 64 * 2},
    {SGLANG, "tp=2,pp=3,dp=2", 2, "model.layers.1.input_layernorm.weight", .bytes = 64 * 2},
    {SGLANG, "tp=2,pp=3,dp=2", 2, "model.layers.2.input_layernorm.weight", .bytes = 0},
    {SGLANG, "tp=2,pp=3,dp=2", 6, "model.layers.0.input_layernorm.weight", .bytes = 64 * 2},
    {SGLANG, "tp=2,pp=3,dp=2", 6, "model.embed_tokens.weight", .bytes = 512 * 64 * 2},
    {SGLANG, "tp=2,pp=3,dp=2", 2, "model.embed_tokens.weight", .bytes = 0},
    {SGLANG, "tp=2,pp=3,dp=2", 2, "model.norm.weight", .bytes = 0},
    {SGLANG, "tp=2,pp=3,dp=2", 4, "model.norm.weight", .bytes = 64 * 2},
    {SGLANG, "tp=2,pp=3,dp=2", 2, "lm_head.weight", .bytes = 512 * 64 * 2},
    {SGLANG, "tp=2,pp=3,dp=2", 5, "lm_head.weight",
     .lines = LINES("rank=5 name=lm_head.weight tensor=lm_head.weight dtype=bf16 box=512:1000,0:64 offset=0")},
    /* MergedColumnParallelLinear: [gate shard; up shard], I 96 over tp 2 */
    {SGLANG, "tp=2", 1, "model.layers.0.mlp.gate_up_proj.weight",
     .lines = LINES("rank=1 name=model.layers.0.mlp.gate_up_proj.weight tensor=model.layers.0.mlp.gate_proj.weight dtype=bf16 box=48:96,0:64 offset=0",
                    "rank=1 name=model.layers.0.mlp.gate_up_proj.weight tensor=model.layers.0.mlp.up_proj.weight dtype=bf16 box=48:96,0:64 offset=6144")},
    /* attention DP: LlamaAttention has no parallel_group="attn_tp" */
    {SGLANG, "tp=2,attn_dp=2", .says = "attn_dp=2 for llama"},
    /* models/qwen2.py Qwen2ForCausalLM builds lm_head without use_attn_tp_group */
    MODEL(SHIPPED("Qwen2.5-0.5B.json")), /* tied; 14 heads, 2 KV heads */
    {SGLANG, "tp=2,attn_dp=2,dp_lm_head=1", .says = "attn_dp=2 for qwen2"},
    /* arg_groups/overrides.py _dp_lm_head_validation: "--enable-dp-lm-head
     * requires attention DP" */
    {SGLANG, "tp=2,dp=2,dp_lm_head=1", .says = "dp_lm_head=1 without attn_dp > 1"},
    /* qwen2.py Qwen2ForCausalLM.__init__: a tied lm_head is embed_tokens when
     * pp is 1; with pp > 1 the last stage builds its own ParallelLMHead
     * (151936 rows, hidden 896), loaded from the embedding (load_weights) */
    {SGLANG, "tp=1", 0, "lm_head.weight", .bytes = 0},
    {SGLANG, "tp=1,pp=2", 1, "lm_head.weight", .bytes = 151936LL * 896 * 2},
    {SGLANG, "tp=1,pp=2", 1, "model.embed_tokens.weight", .bytes = 0},
    /* llama.py LlamaForCausalLM.__init__: tied lm_head = model.embed_tokens,
     * a PPMissingLayer past the first stage */
    MODEL(SHIPPED("Llama-3.2-1B.json")),
    {SGLANG, "tp=1,pp=2", .says = "tie_word_embeddings with pp > 1"},
};

/* Qwen3-MoE, tiny (8 heads of 8, 2 KV heads, 8 experts of I 32, V 1000):
 * attention DP and EP inside the TP group. tp 4, attn_dp 2, ep 2: rank 3
 * is attn_dp 1, attn_tp 1 (runtime_context.py derive_attention_ranks:
 * tp_rank = attn_dp_rank * attn_tp + attn_tp_rank) and ep 1, moe_tp 1
 * (derive_spawn_ranks: moe_tp fastest). */
static const check sglang_qwen3_moe[] = {
    MODEL(DATA("tiny-qwen3-moe.json")),
    /* qwen3_moe.py Qwen3MoeAttention: qkv_proj / o_proj on "attn_tp" (2
     * ranks): q heads 4-7 (rows 32:64), KV head 1 (rows 8:16) */
    {SGLANG, "tp=4,ep=2,attn_dp=2", 3, "model.layers.0.self_attn.qkv_proj.weight",
     .lines = LINES("rank=3 name=model.layers.0.self_attn.qkv_proj.weight tensor=model.layers.0.self_attn.q_proj.weight dtype=bf16 box=32:64,0:64 offset=0",
                    "rank=3 name=model.layers.0.self_attn.qkv_proj.weight tensor=model.layers.0.self_attn.k_proj.weight dtype=bf16 box=8:16,0:64 offset=4096",
                    "rank=3 name=model.layers.0.self_attn.qkv_proj.weight tensor=model.layers.0.self_attn.v_proj.weight dtype=bf16 box=8:16,0:64 offset=5120")},
    /* layers/moe/fused_moe_triton/layer.py FusedMoE.__init__: E / ep = 4
     * experts per EP rank (4-7), I / moe_tp = 16 rows each; _load_w13: gate
     * (w1) the first half of w13, up (w3) the second; unquant.py
     * create_weights: w13 [4, 32, 64], w2 [4, 64, 16]; no routed_experts
     * level in the names */
    {SGLANG, "tp=4,ep=2,attn_dp=2", 3, "model.layers.0.mlp.experts.",
     .lines = LINES("rank=3 name=model.layers.0.mlp.experts.w13_weight tensor=model.layers.0.mlp.experts.gate_proj.weight dtype=bf16 box=4:8,16:32,0:64 offset=0",
                    "rank=3 name=model.layers.0.mlp.experts.w13_weight tensor=model.layers.0.mlp.experts.up_proj.weight dtype=bf16 box=4:8,16:32,0:64 offset=2048",
                    "rank=3 name=model.layers.0.mlp.experts.w2_weight tensor=model.layers.0.mlp.experts.down_proj.weight dtype=bf16 box=4:8,0:64,16:32 offset=0")},
    /* qwen2_moe.py Qwen2MoeModel.__init__: embed_tokens with
     * use_attn_tp_group=is_dp_attention_enabled(): 1024 rows over attn_tp 2 */
    {SGLANG, "tp=4,ep=2,attn_dp=2", 3, "model.embed_tokens.weight",
     .lines = LINES("rank=3 name=model.embed_tokens.weight tensor=model.embed_tokens.weight dtype=bf16 box=512:1000,0:64 offset=0")},
    /* qwen3_moe.py Qwen3MoeForCausalLM.__init__: lm_head over the whole TP
     * group (256 rows each), over attn_tp with enable_dp_lm_head */
    {SGLANG, "tp=4,ep=2,attn_dp=2", 3, "lm_head.weight",
     .lines = LINES("rank=3 name=lm_head.weight tensor=lm_head.weight dtype=bf16 box=768:1000,0:64 offset=0")},
    {SGLANG, "tp=4,ep=2,attn_dp=2,dp_lm_head=1", 3, "lm_head.weight",
     .lines = LINES("rank=3 name=lm_head.weight tensor=lm_head.weight dtype=bf16 box=512:1000,0:64 offset=0")},
    /* Qwen3MoeForCausalLM builds lm_head on every stage (no is_last_rank
     * test); Qwen2MoeModel embed_tokens on the first, norm on the last */
    {SGLANG, "tp=1,pp=2", 0, "lm_head.weight", .bytes = 1024 * 64 * 2},
    {SGLANG, "tp=1,pp=2", 0, "model.norm.weight", .bytes = 0},
    {SGLANG, "tp=1,pp=2", 1, "model.embed_tokens.weight", .bytes = 0},
    {SGLANG, "tp=1,pp=2", 1, "model.norm.weight", .bytes = 64 * 2},
    /* the EP group lies inside the TP group (derive_spawn_ranks), FusedMoE
     * asserts ep divides the experts; --dp-size with --attn-dp-size is
     * refused (arg_groups/parallel_hook.py) */
    {SGLANG, "tp=2,dp=2,ep=4", .says = "ep 4 must divide tp 2"},
    {SGLANG, "tp=2,dp=2,attn_dp=2", .says = "dp > 1 with attn_dp > 1"},
    {SGLANG, "tp=4,attn_dp=3", .says = "attn_dp 3 does not divide tp 4"},
    {SGLANG, "tp=4,ep=2,etp=4", .says = "say etp=2"},
    {SGLANG, "tp=2,moe_dense_tp=1", .says = "moe_dense_tp is read by DeepSeek"},
    {SGLANG, "tp=2,sp_moe=1", .says = "key 'sp_moe' is vLLM's"},
    {SGLANG, "tp=2,vocab=1024", .says = "key 'vocab' is Megatron's"},
    {VLLM, "tp=2,attn_dp=2", .says = "key 'attn_dp' is SGLang's"},
    {MEGATRON, "tp=2,dp_lm_head=1", .says = "key 'dp_lm_head' is SGLang's"},
    /* vocab_parallel_embedding.py VocabParallelEmbedding.__init__: when tp
     * does not divide pad_vocab_size(V, 64), padding_size *= tp. Qwen3-235B
     * (V 151936, H 4096, 64 heads, 4 KV heads, 128 experts of I 1536): tp
     * 12, attn_dp 3 (attn_tp 4), ep 4 (moe_tp 3). lm_head over tp 12: 151936
     * % 12 != 0, so padded to 768: 152064 rows, 12672 each; rank 11 holds
     * 139392:152064, i.e. rows 139392:151936 of the tensor. embed_tokens
     * over attn_tp 4 divides 151936: 37984 each. */
    {.model = SHIPPED("Qwen3-235B-A22B.json"), .layers = 1},
    {SGLANG, "tp=12,attn_dp=3,ep=4", 11, "lm_head.weight",
     .lines = LINES("rank=11 name=lm_head.weight tensor=lm_head.weight dtype=bf16 box=139392:151936,0:4096 offset=0")},
    {SGLANG, "tp=12,attn_dp=3,ep=4", 11, "model.embed_tokens.weight",
     .lines = LINES("rank=11 name=model.embed_tokens.weight tensor=model.embed_tokens.weight dtype=bf16 box=113952:151936,0:4096 offset=0")},
    /* experts: 32 per EP rank, 1536 / 3 = 512 rows each; rank 11 is ep 3,
     * moe_tp 2 */
    {SGLANG, "tp=12,attn_dp=3,ep=4", 11, "model.layers.0.mlp.experts.w2_weight",
     .lines = LINES("rank=11 name=model.layers.0.mlp.experts.w2_weight tensor=model.layers.0.mlp.experts.down_proj.weight dtype=bf16 box=96:128,0:4096,1024:1536 offset=0")},
};

/* DeepSeek-V3, tiny (H 64, 4 heads, q_lora 24, kv_lora 16, rope 4, nope 8,
 * v 8, layer 0 dense with I 96, 8 experts of I 16, 2 shared, noaux_tc),
 * models/deepseek_v2.py. */
static const check sglang_deepseek_v3[] = {
    MODEL(DATA("tiny-deepseek-v3.json")),
    /* DeepseekV2AttentionMLA.__init__: fused_qkv_a_proj_with_mqa, a
     * ReplicatedLinear of q_lora + kv_lora + rope rows = [q_a_proj (24);
     * kv_a_proj_with_mqa (20)] */
    {SGLANG, "tp=2,ep=2", 1, "model.layers.0.self_attn.fused_qkv_a_proj_with_mqa.weight",
     .lines = LINES("rank=1 name=model.layers.0.self_attn.fused_qkv_a_proj_with_mqa.weight tensor=model.layers.0.self_attn.q_a_proj.weight dtype=bf16 box=0:24,0:64 offset=0",
                    "rank=1 name=model.layers.0.self_attn.fused_qkv_a_proj_with_mqa.weight tensor=model.layers.0.self_attn.kv_a_proj_with_mqa.weight dtype=bf16 box=0:20,0:64 offset=3072")},
    /* kv_b_proj: ColumnParallelLinear on "attn_tp", 4 x (8 + 8) rows */
    {SGLANG, "tp=2,ep=2", 1, "model.layers.0.self_attn.kv_b_proj.weight",
     .lines = LINES("rank=1 name=model.layers.0.self_attn.kv_b_proj.weight tensor=model.layers.0.self_attn.kv_b_proj.weight dtype=bf16 box=32:64,0:16 offset=0")},
    /* DeepseekV2DecoderLayer.__init__: the dense MLP on "tp", or
     * "replicated" when is_dense_ffn_fully_dp (moe_dense_tp_size 1) */
    {SGLANG, "tp=2,ep=2", 1, "model.layers.0.mlp.gate_up_proj.weight",
     .lines = LINES("rank=1 name=model.layers.0.mlp.gate_up_proj.weight tensor=model.layers.0.mlp.gate_proj.weight dtype=bf16 box=48:96,0:64 offset=0",
                    "rank=1 name=model.layers.0.mlp.gate_up_proj.weight tensor=model.layers.0.mlp.up_proj.weight dtype=bf16 box=48:96,0:64 offset=6144")},
    {SGLANG, "tp=2,ep=2,moe_dense_tp=1", 1, "model.layers.0.mlp.gate_up_proj.weight",
     .lines = LINES("rank=1 name=model.layers.0.mlp.gate_up_proj.weight tensor=model.layers.0.mlp.gate_proj.weight dtype=bf16 box=0:96,0:64 offset=0",
                    "rank=1 name=model.layers.0.mlp.gate_up_proj.weight tensor=model.layers.0.mlp.up_proj.weight dtype=bf16 box=0:96,0:64 offset=12288")},
    {SGLANG, "tp=2,ep=2,moe_dense_tp=1", 1, "model.layers.0.mlp.down_proj.weight", .bytes = 64 * 96 * 2},
    {SGLANG, "tp=2,ep=2,moe_dense_tp=3", .says = "moe_dense_tp must be 1 or tp"},
    /* DeepseekV2MoE: experts whole over ep 2 (moe_tp 1), MoEGate's
     * e_score_correction_bias fp32 (noaux_tc), shared experts a
     * DeepseekV2MLP on "tp" (no A2A backend): 32 rows over tp 2 */
    {SGLANG, "tp=2,ep=2", 1, "model.layers.1.mlp.experts.w13_weight",
     .lines = LINES("rank=1 name=model.layers.1.mlp.experts.w13_weight tensor=model.layers.1.mlp.experts.gate_proj.weight dtype=bf16 box=4:8,0:16,0:64 offset=0",
                    "rank=1 name=model.layers.1.mlp.experts.w13_weight tensor=model.layers.1.mlp.experts.up_proj.weight dtype=bf16 box=4:8,0:16,0:64 offset=2048")},
    {SGLANG, "tp=2,ep=2", 1, "model.layers.1.mlp.gate.e_score_correction_bias", .bytes = 8 * 4},
    {SGLANG, "tp=2,ep=2", 1, "model.layers.1.mlp.shared_experts.gate_up_proj.weight",
     .lines = LINES("rank=1 name=model.layers.1.mlp.shared_experts.gate_up_proj.weight tensor=model.layers.1.mlp.shared_experts.gate_proj.weight dtype=bf16 box=16:32,0:64 offset=0",
                    "rank=1 name=model.layers.1.mlp.shared_experts.gate_up_proj.weight tensor=model.layers.1.mlp.shared_experts.up_proj.weight dtype=bf16 box=16:32,0:64 offset=2048")},
    /* attention DP: tp 2, attn_dp 2: attention whole on each rank (attn_tp
     * 1), embed_tokens whole (get_embedding_tp_kwargs), lm_head over tp */
    {SGLANG, "tp=2,ep=2,attn_dp=2", 1, "model.layers.0.self_attn.kv_b_proj.weight", .bytes = 64 * 16 * 2},
    {SGLANG, "tp=2,ep=2,attn_dp=2", 1, "model.embed_tokens.weight", .bytes = 1024 * 64 * 2},
    {SGLANG, "tp=2,ep=2,attn_dp=2", 1, "lm_head.weight", .bytes = 512 * 64 * 2},
    /* DeepseekV2Model.__init__ (pp_stage_needs_embedding: the first stage
     * without speculative decoding), DeepseekV2ForCausalLM.__init__: norm
     * and lm_head on the last */
    {SGLANG, "tp=1,pp=2", 0, "model.embed_tokens.weight", .bytes = 1024 * 64 * 2},
    {SGLANG, "tp=1,pp=2", 0, "lm_head.weight", .bytes = 0},
    {SGLANG, "tp=1,pp=2", 1, "lm_head.weight", .bytes = 1024 * 64 * 2},
    {SGLANG, "tp=1,pp=2", 1, "model.embed_tokens.weight", .bytes = 0},
};

/* What SGLang does that is not modelled: RESHARD_ERROR_UNSUPPORTED naming
 * it. deepseek_v2.py shared_experts_fusion_disable_reason: DeepSeek-V3
 * (256 routed experts, one shared) at ep 1 fuses the shared expert into
 * experts.w13_weight; qwen3.py Qwen3Attention builds o_proj with
 * bias=attention_bias. */
static void sglang_unsupported(void **state) {
  (void)state;
  struct {
    const char *model, *spec, *says;
  } rows[] = {
      {SHIPPED("DeepSeek-V3.json"), "tp=8", "--disable-shared-experts-fusion"},
      {DATA("tiny-qwen3-bias.json"), "tp=2", "attention_bias"},
  };
  for (size_t i = 0; i < sizeof rows / sizeof *rows; i++) {
    rm_model *m = load(rows[i].model, 2);
    rm_parallel p;
    assert_int_equal(rm_parse_parallel(rows[i].spec, &p), RESHARD_SUCCESS);
    reshard_layout_t *L = NULL;
    reshard_result_t r = rm_sglang_layout(m, &p, 0, &L);
    if (r != RESHARD_ERROR_UNSUPPORTED || !strstr(reshard_last_error(), rows[i].says))
      print_error("%s %s: %d '%s'\n", rows[i].model, rows[i].spec, r, reshard_last_error());
    assert_int_equal(r, RESHARD_ERROR_UNSUPPORTED);
    assert_null(L);
    rm_model_free(m);
  }
  /* said otherwise (shared_fusion=0: --disable-shared-experts-fusion), or
   * at ep > 1, the shared experts stay apart */
  rm_model *m = load(SHIPPED("DeepSeek-V3.json"), 4);
  const char *ok[] = {"tp=8,shared_fusion=0", "tp=8,ep=8"};
  for (int i = 0; i < 2; i++) {
    rm_parallel p;
    assert_int_equal(rm_parse_parallel(ok[i], &p), RESHARD_SUCCESS);
    reshard_layout_t *L = NULL;
    assert_int_equal(rm_sglang_layout(m, &p, 0, &L), RESHARD_SUCCESS);
    int b;
    assert_int_equal(reshard_layout_find_buffer(L, "model.layers.3.mlp.shared_experts.down_proj.weight", 0, &b),
                     RESHARD_SUCCESS);
    reshard_layout_destroy(L);
  }
  rm_model_free(m);
}


/* The tools' --infer sglang:SPEC (tools/cli.c build_model) builds
 * rm_sglang_layout's layout: rank 3 of tp 4, attn_dp 2 holds attention
 * rank 1's qkv_proj; vllm:SPEC and a bare SPEC are vLLM's. */
static void sglang_cli_infer(void **state) {
  (void)state;
  const char *infer[] = {"sglang:tp=4,ep=2,attn_dp=2", "vllm:tp=4,ep=4", "tp=4,ep=4"};
  const char *says[] = {"-> sglang tp=4,ep=2,attn_dp=2", "-> vllm tp=4,ep=4", "-> vllm tp=4,ep=4"};
  for (int i = 0; i < 3; i++) {
    char *argv[] = {"reshard_plan", "--model-config", DATA("tiny-qwen3-moe.json"), "--train", "tp=2",
                    "--infer", (char *)infer[i], NULL};
    cli_opts o;
    cli_layouts l;
    char err[1024] = "";
    int rc = cli_parse(CLI_TOOL_PLAN, 7, argv, &o, err, sizeof err);
    if (!rc) rc = cli_build_layouts(&o, &l, err, sizeof err);
    if (rc) print_error("--infer %s: %s\n", infer[i], err);
    assert_int_equal(rc, 0);
    assert_non_null(strstr(l.desc, says[i]));
    int b;
    /* SGLang's FusedMoE name; vLLM >= 0.24 adds routed_experts */
    const char *w13 = i ? "model.layers.0.mlp.experts.routed_experts.w13_weight" : "model.layers.0.mlp.experts.w13_weight";
    assert_int_equal(reshard_layout_find_buffer(l.dst, w13, 2 + 3, &b), RESHARD_SUCCESS);
    if (i == 0) expect_lines(l.dst, 5, "model.layers.0.self_attn.qkv_proj.weight",
                             LINES("rank=5 name=model.layers.0.self_attn.qkv_proj.weight tensor=model.layers.0.self_attn.q_proj.weight dtype=bf16 box=32:64,0:64 offset=0",
                                   "rank=5 name=model.layers.0.self_attn.qkv_proj.weight tensor=model.layers.0.self_attn.k_proj.weight dtype=bf16 box=8:16,0:64 offset=4096",
                                   "rank=5 name=model.layers.0.self_attn.qkv_proj.weight tensor=model.layers.0.self_attn.v_proj.weight dtype=bf16 box=8:16,0:64 offset=5120"));
    cli_layouts_free(&l);
  }
}

/* A test after a failed one starts with no table row named. */
static int no_row(void **state) {
  (void)state;
  where[0] = '\0';
  return 0;
}
#define TEST(f) cmocka_unit_test_setup(f, no_row)
#define TABLE_TEST(t) {#t, table_test, no_row, NULL, &(checks){t, sizeof t / sizeof *t}}

int main(void) {
  const struct CMUnitTest tests[] = {
      TABLE_TEST(vllm_rank_order),       TABLE_TEST(megatron_vocab_rows),
      TABLE_TEST(router_bias_fp32),      TABLE_TEST(megatron_etp_default),
      TABLE_TEST(vllm_shared_experts_sp_moe), TABLE_TEST(invalid_settings),
      TEST(golden_dense_gqa),            TABLE_TEST(golden_qwen3_moe),
      TABLE_TEST(golden_mixtral),        TABLE_TEST(golden_deepseek_v3),
      TABLE_TEST(golden_shipped_sizes),  TEST(after_load_flags),
      TABLE_TEST(golden_fp8_qkv_scales), TEST(vllm_stage_ends),
      TEST(dense_ep_etp),                TABLE_TEST(vllm_w31),
      TABLE_TEST(megatron_context_parallel), TABLE_TEST(sglang_rank_order),
      TABLE_TEST(sglang_qwen3_moe),      TABLE_TEST(sglang_deepseek_v3),
      TEST(sglang_unsupported),          TEST(sglang_cli_infer),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
