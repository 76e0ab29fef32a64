/* The fused-layout builders (reshard_layout_add_megatron_qkv, _vllm_qkv,
 * _gate_up) against the upstream layouts, row by row.
 *
 * Each golden case computes, independently of the library, which row of
 * which tensor every row of a rank's buffer holds, from the upstream code:
 *   Megatron-core linear_qkv: megatron/core/transformer/attention.py,
 *     SelfAttention.get_query_key_value_tensors: the local rows are
 *     [groups/tp, (heads/groups + 2) * head_dim], per group [q; k; v];
 *     ColumnParallelLinear gives TP rank r the groups [r*G/tp, (r+1)*G/tp).
 *   vLLM qkv_proj: vllm/model_executor/layers/linear.py,
 *     QKVParallelLinear.__init__ (num_heads/tp query heads; tp >= kv: one
 *     KV head, num_kv_head_replicas = tp/kv; else kv/tp heads) and
 *     weight_loader (KV shard_id = tp_rank // num_kv_head_replicas).
 *   gate/up: megatron/core/transformer/mlp.py MLP.forward (torch.chunk of
 *     the local fc1 output into gate and up halves) and vLLM's
 *     MergedColumnParallelLinear (each output split over TP, then
 *     concatenated).
 * and compares it with the fragments the layout lowers to. Then bad
 * numbers are refused with messages naming the culprit and nothing
 * changed, and a Megatron -> vLLM sync of builder-made buffers is checked
 * byte for byte. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "reshard.h"
#include "support/harness.h"

enum { HID = 3 };

typedef struct row {
  int tensor;
  int64_t row;
} row;

/* A layout with q [heads*hd, HID], k and v [kv*hd, HID] (or 1-D biases)
 * and a [dp, tp] mesh of ranks 0 .. dp*tp-1. */
typedef struct qkv_case {
  reshard_layout_t *L;
  int q, k, v, mesh;
} qkv_case;

static void make_case(qkv_case *c, int heads, int kv, int hd, int dp, int tp, int ndim) {
  assert_int_equal(reshard_layout_create(&c->L), 0);
  int64_t qs[2] = {(int64_t)heads * hd, HID}, ks[2] = {(int64_t)kv * hd, HID};
  assert_int_equal(reshard_layout_add_tensor(c->L, "q", RESHARD_BF16, ndim, qs, &c->q), 0);
  assert_int_equal(reshard_layout_add_tensor(c->L, "k", RESHARD_BF16, ndim, ks, &c->k), 0);
  assert_int_equal(reshard_layout_add_tensor(c->L, "v", RESHARD_BF16, ndim, ks, &c->v), 0);
  assert_int_equal(reshard_layout_add_mesh_strided(c->L, 2, (const int[]){dp, tp}, 0, 1, &c->mesh), 0);
}

/* Which (tensor, row) each row of buffer b holds on rank, from the lowered
 * fragments; every row must be whole and appear once. Returns the count. */
static int buffer_rows(const reshard_layout_t *L, int b, int rank, row *out, int cap) {
  reshard_fragment_info_t f[64];
  size_t n;
  assert_int_equal(reshard_layout_fragments(L, rank, f, 64, &n), 0);
  assert_true(n <= 64);
  int count = 0;
  int64_t cols = 1;
  for (int i = 0; i < cap; i++) out[i].tensor = -1;
  for (size_t i = 0; i < n; i++) {
    if (f[i].buffer_id != b) continue;
    cols = f[i].ndim == 2 ? f[i].extent[1] : 1;
    if (f[i].ndim == 2) {
      assert_int_equal(f[i].start[1], 0); /* whole rows */
      assert_int_equal(cols, HID);
      assert_int_equal(f[i].strides[0], HID);
    }
    const int64_t first = (int64_t)f[i].byte_offset / (cols * 2); /* bf16 */
    for (int64_t r = 0; r < f[i].extent[0]; r++) {
      assert_true(first + r < cap);
      assert_int_equal(out[first + r].tensor, -1); /* once */
      out[first + r] = (row){f[i].tensor_id, f[i].start[0] + r};
      count++;
    }
  }
  size_t bytes;
  assert_int_equal(reshard_layout_buffer_bytes(L, b, rank, &bytes), 0);
  assert_int_equal(bytes, (size_t)count * (size_t)cols * 2); /* no holes */
  return count;
}

static void expect_rows(const char *what, int rank, const row *got, int ngot, const row *want, int nwant) {
  if (ngot != nwant) fail_msg("%s rank %d: %d rows, expected %d", what, rank, ngot, nwant);
  for (int i = 0; i < nwant; i++)
    if (got[i].tensor != want[i].tensor || got[i].row != want[i].row)
      fail_msg("%s rank %d: buffer row %d holds tensor %d row %lld, expected tensor %d row %lld", what, rank, i,
               got[i].tensor, (long long)got[i].row, want[i].tensor, (long long)want[i].row);
}

/* Megatron: the groups of TP rank r, each [q of g; k of g; v of g]. */
static int megatron_rows(const qkv_case *c, int heads, int kv, int hd, int tp, int r, row *w) {
  int n = 0;
  const int qpg = heads / kv * hd; /* q rows per group */
  for (int g = r * kv / tp; g < (r + 1) * kv / tp; g++) {
    for (int j = 0; j < qpg; j++) w[n++] = (row){c->q, (int64_t)g * qpg + j};
    for (int j = 0; j < hd; j++) w[n++] = (row){c->k, (int64_t)g * hd + j};
    for (int j = 0; j < hd; j++) w[n++] = (row){c->v, (int64_t)g * hd + j};
  }
  return n;
}

/* vLLM: [q shard; k shard; v shard], KV heads replicated when tp > kv. */
static int vllm_rows(const qkv_case *c, int heads, int kv, int hd, int tp, int r, row *w) {
  int n = 0;
  const int qh = heads / tp;
  for (int j = 0; j < qh * hd; j++) w[n++] = (row){c->q, (int64_t)r * qh * hd + j};
  const int nkv = tp >= kv ? 1 : kv / tp;
  const int first = tp >= kv ? r / (tp / kv) : r * nkv; /* tp_rank // num_kv_head_replicas */
  for (int j = 0; j < nkv * hd; j++) w[n++] = (row){c->k, (int64_t)first * hd + j};
  for (int j = 0; j < nkv * hd; j++) w[n++] = (row){c->v, (int64_t)first * hd + j};
  return n;
}

static void qkv_golden(int vllm, int heads, int kv, int hd, int dp, int tp, int ndim) {
  qkv_case c;
  make_case(&c, heads, kv, hd, dp, tp, ndim);
  reshard_attention_t a = {c.q, c.k, c.v, heads, kv, hd};
  int b;
  if (vllm) assert_int_equal(reshard_layout_add_vllm_qkv(c.L, "qkv", &a, c.mesh, 1, &b), 0);
  else assert_int_equal(reshard_layout_add_megatron_qkv(c.L, "qkv", &a, c.mesh, 1, &b), 0);
  char what[128];
  snprintf(what, sizeof what, "%s heads %d kv %d hd %d dp %d tp %d ndim %d", vllm ? "vllm" : "megatron", heads, kv, hd,
           dp, tp, ndim);
  row got[256], want[256];
  for (int rank = 0; rank < dp * tp; rank++) {
    int ng = buffer_rows(c.L, b, rank, got, 256);
    int nw = vllm ? vllm_rows(&c, heads, kv, hd, tp, rank % tp, want)
                  : megatron_rows(&c, heads, kv, hd, tp, rank % tp, want);
    expect_rows(what, rank, got, ng, want, nw);
  }
  reshard_layout_destroy(c.L);
}

static void megatron_qkv_golden(void **state) {
  (void)state;
  qkv_golden(0, 8, 2, 2, 1, 1, 2); /* two groups interleaved on one rank */
  qkv_golden(0, 8, 2, 2, 2, 2, 2); /* a group per rank, two replicas */
  qkv_golden(0, 8, 4, 2, 1, 2, 2); /* two groups per rank */
  qkv_golden(0, 8, 8, 2, 1, 4, 2); /* MHA */
  qkv_golden(0, 8, 1, 2, 1, 1, 2); /* MQA */
  qkv_golden(0, 8, 4, 2, 2, 2, 1); /* biases */
}

static void vllm_qkv_golden(void **state) {
  (void)state;
  qkv_golden(1, 8, 2, 2, 1, 1, 2); /* [q; k; v] whole */
  qkv_golden(1, 8, 2, 2, 2, 2, 2); /* one KV head per rank */
  qkv_golden(1, 8, 2, 2, 1, 4, 2); /* each KV head on 2 ranks */
  qkv_golden(1, 8, 1, 2, 2, 8, 2); /* MQA: the KV head on all 8 */
  qkv_golden(1, 8, 4, 2, 1, 2, 2); /* two KV heads per rank */
  qkv_golden(1, 8, 2, 2, 2, 4, 1); /* biases, replicated KV */
}

static void gate_up_golden(void **state) {
  (void)state;
  for (int tp = 1; tp <= 4; tp *= 2) {
    reshard_layout_t *L;
    assert_int_equal(reshard_layout_create(&L), 0);
    int64_t s[2] = {8, HID};
    int g, u, m, b;
    assert_int_equal(reshard_layout_add_tensor(L, "gate", RESHARD_BF16, 2, s, &g), 0);
    assert_int_equal(reshard_layout_add_tensor(L, "up", RESHARD_BF16, 2, s, &u), 0);
    assert_int_equal(reshard_layout_add_mesh_strided(L, 2, (const int[]){2, tp}, 0, 1, &m), 0);
    assert_int_equal(reshard_layout_add_gate_up(L, "gate_up", g, u, m, 1, &b), 0);
    row got[64], want[64];
    for (int rank = 0; rank < 2 * tp; rank++) {
      int n = 0, r = rank % tp;
      for (int j = 0; j < 8 / tp; j++) want[n++] = (row){g, (int64_t)r * (8 / tp) + j};
      for (int j = 0; j < 8 / tp; j++) want[n++] = (row){u, (int64_t)r * (8 / tp) + j};
      expect_rows("gate_up", rank, got, buffer_rows(L, b, rank, got, 64), want, n);
    }
    /* tp_axis -1 (vLLM's disable_tp shared experts): whole on every rank */
    assert_int_equal(reshard_layout_add_gate_up(L, "gate_up_replicated", g, u, m, -1, &b), 0);
    for (int rank = 0; rank < 2 * tp; rank++) {
      int n = 0;
      for (int j = 0; j < 8; j++) want[n++] = (row){g, j};
      for (int j = 0; j < 8; j++) want[n++] = (row){u, j};
      expect_rows("gate_up replicated", rank, got, buffer_rows(L, b, rank, got, 64), want, n);
    }
    reshard_layout_destroy(L);
  }
}

/* The replication mesh is made once and reused. */
static void vllm_qkv_reuses_mesh(void **state) {
  (void)state;
  qkv_case c;
  make_case(&c, 8, 2, 2, 2, 4, 2);
  reshard_attention_t a = {c.q, c.k, c.v, 8, 2, 2};
  int b, nd, shape[RESHARD_MAX_MESH_DIMS];
  assert_int_equal(reshard_layout_add_vllm_qkv(c.L, "qkv0", &a, c.mesh, 1, &b), 0);
  assert_int_equal(reshard_layout_add_vllm_qkv(c.L, "qkv1", &a, c.mesh, 1, &b), 0);
  assert_int_equal(reshard_layout_mesh_shape(c.L, 1, &nd, shape), 0);
  assert_int_equal(nd, 3);
  assert_int_equal(shape[0], 2);
  assert_int_equal(shape[1], 2); /* kv */
  assert_int_equal(shape[2], 2); /* tp / kv */
  assert_int_equal(reshard_layout_mesh_shape(c.L, 2, &nd, shape), RESHARD_ERROR_INVALID_ARGUMENT);
  assert_int_equal(reshard_layout_num_buffers(c.L), 2);
  reshard_layout_destroy(c.L);
}

#define EXPECT_REFUSED(call, ...)                                                            \
  do {                                                                                       \
    int nb_ = reshard_layout_num_buffers(c.L), nd_, sh_[RESHARD_MAX_MESH_DIMS];              \
    assert_int_equal((call), RESHARD_ERROR_INVALID_ARGUMENT);                                \
    const char *want_[] = {__VA_ARGS__};                                                     \
    for (size_t i_ = 0; i_ < sizeof want_ / sizeof *want_; i_++)                             \
      if (!strstr(reshard_last_error(), want_[i_]))                                          \
        fail_msg("'%s' lacks '%s'", reshard_last_error(), want_[i_]);                        \
    assert_int_equal(reshard_layout_num_buffers(c.L), nb_);                                  \
    assert_int_equal(reshard_layout_mesh_shape(c.L, 1, &nd_, sh_), RESHARD_ERROR_INVALID_ARGUMENT); \
  } while (0)

static void bad_numbers(void **state) {
  (void)state;
  qkv_case c;
  make_case(&c, 8, 2, 2, 1, 4, 2);
  int b;
  /* the mistake: the query-head count given as the KV-head count */
  reshard_attention_t swapped = {c.q, c.k, c.v, 2, 8, 2};
  EXPECT_REFUSED(reshard_layout_add_megatron_qkv(c.L, "qkv", &swapped, c.mesh, 1, &b), "buffer 'qkv'", "tensor 'q'",
                 "num_heads 2", "swapped?");
  reshard_attention_t kv8 = {c.q, c.k, c.v, 8, 8, 2};
  EXPECT_REFUSED(reshard_layout_add_vllm_qkv(c.L, "qkv", &kv8, c.mesh, 1, &b), "tensor 'k'", "4 rows",
                 "num_kv_heads 8");
  reshard_attention_t hd = {c.q, c.k, c.v, 8, 2, 4};
  EXPECT_REFUSED(reshard_layout_add_vllm_qkv(c.L, "qkv", &hd, c.mesh, 1, &b), "tensor 'q'", "head_dim 4");
  reshard_attention_t ok = {c.q, c.k, c.v, 8, 2, 2};
  /* Megatron with tp 4 > 2 groups: not modelled */
  EXPECT_REFUSED(reshard_layout_add_megatron_qkv(c.L, "qkv", &ok, c.mesh, 1, &b), "tp 4", "num_kv_heads 2",
                 "not modelled");
  reshard_attention_t odd = {c.q, c.k, c.v, 8, 3, 2};
  EXPECT_REFUSED(reshard_layout_add_vllm_qkv(c.L, "qkv", &odd, c.mesh, 1, &b), "tensor 'k'", "num_kv_heads 3");
  int64_t s12[2] = {12, HID}, s8[2] = {8, HID};
  int q6, k4, v4;
  assert_int_equal(reshard_layout_add_tensor(c.L, "q6", RESHARD_BF16, 2, s12, &q6), 0);
  assert_int_equal(reshard_layout_add_tensor(c.L, "k4", RESHARD_BF16, 2, s8, &k4), 0);
  assert_int_equal(reshard_layout_add_tensor(c.L, "v4", RESHARD_BF16, 2, s8, &v4), 0);
  reshard_attention_t groups = {q6, k4, v4, 6, 4, 2};
  EXPECT_REFUSED(reshard_layout_add_megatron_qkv(c.L, "qkv", &groups, c.mesh, 1, &b), "num_heads 6",
                 "not a multiple of num_kv_heads 4");
  reshard_attention_t badid = {c.q, 7, c.v, 8, 2, 2};
  EXPECT_REFUSED(reshard_layout_add_vllm_qkv(c.L, "qkv", &badid, c.mesh, 1, &b), "attn.k = 7");
  EXPECT_REFUSED(reshard_layout_add_vllm_qkv(c.L, "qkv", &ok, c.mesh, 2, &b), "tp_axis 2");
  EXPECT_REFUSED(reshard_layout_add_vllm_qkv(c.L, "qkv", &ok, 5, 1, &b), "mesh_id 5");
  EXPECT_REFUSED(reshard_layout_add_vllm_qkv(c.L, "qkv", NULL, c.mesh, 1, &b), "attn is NULL");
  EXPECT_REFUSED(reshard_layout_add_gate_up(c.L, "gu", c.q, c.k, c.mesh, 1, &b), "gate 'q'", "up 'k'", "shape");
  /* a pair whose rows tp does not divide */
  int64_t s3[2] = {6, HID};
  int g3, u3;
  assert_int_equal(reshard_layout_add_tensor(c.L, "g3", RESHARD_BF16, 2, s3, &g3), 0);
  assert_int_equal(reshard_layout_add_tensor(c.L, "u3", RESHARD_BF16, 2, s3, &u3), 0);
  EXPECT_REFUSED(reshard_layout_add_gate_up(c.L, "gu", g3, u3, c.mesh, 1, &b), "tp 4", "6 rows", "'g3'");
  /* refused by reshard_layout_add_fused after the replication mesh was
   * made: the mesh goes too */
  int64_t ks[2] = {4, HID};
  int v32;
  assert_int_equal(reshard_layout_add_tensor(c.L, "v32", RESHARD_FP32, 2, ks, &v32), 0);
  reshard_attention_t mixed = {c.q, c.k, v32, 8, 2, 2};
  EXPECT_REFUSED(reshard_layout_add_vllm_qkv(c.L, "qkv", &mixed, c.mesh, 1, &b), "qkv");
  assert_int_equal(reshard_layout_add_vllm_qkv(c.L, "qkv", &ok, c.mesh, 1, &b), 0);
  reshard_layout_destroy(c.L);
}

/* A Llama-shaped block by the builders, Megatron TP=2 (ranks 0-1) ->
 * vLLM TP=4 (ranks 2-5, KV heads replicated), q/k/v, their biases and
 * gate/up: every element and every byte around them checked. */
static void megatron_to_vllm_sync(void **state) {
  (void)state;
  reshard_layout_t *L[2];
  const int heads = 8, kv = 2, hd = 4, H = 16, I = 24;
  for (int side = 0; side < 2; side++) {
    int q, k, v, qb, kb, vb, g, u, m, b;
    assert_int_equal(reshard_layout_create(&L[side]), 0);
    int64_t qs[2] = {heads * hd, H}, ks[2] = {kv * hd, H}, gs[2] = {I, H};
    assert_int_equal(reshard_layout_add_tensor(L[side], "q", RESHARD_BF16, 2, qs, &q), 0);
    assert_int_equal(reshard_layout_add_tensor(L[side], "k", RESHARD_BF16, 2, ks, &k), 0);
    assert_int_equal(reshard_layout_add_tensor(L[side], "v", RESHARD_BF16, 2, ks, &v), 0);
    assert_int_equal(reshard_layout_add_tensor(L[side], "q_bias", RESHARD_BF16, 1, qs, &qb), 0);
    assert_int_equal(reshard_layout_add_tensor(L[side], "k_bias", RESHARD_BF16, 1, ks, &kb), 0);
    assert_int_equal(reshard_layout_add_tensor(L[side], "v_bias", RESHARD_BF16, 1, ks, &vb), 0);
    assert_int_equal(reshard_layout_add_tensor(L[side], "gate", RESHARD_BF16, 2, gs, &g), 0);
    assert_int_equal(reshard_layout_add_tensor(L[side], "up", RESHARD_BF16, 2, gs, &u), 0);
    const int tp = side ? 4 : 2;
    assert_int_equal(reshard_layout_add_mesh_strided(L[side], 1, &tp, side ? 2 : 0, 1, &m), 0);
    reshard_attention_t w = {q, k, v, heads, kv, hd}, bias = {qb, kb, vb, heads, kv, hd};
    if (side) {
      assert_int_equal(reshard_layout_add_vllm_qkv(L[side], "qkv_proj.weight", &w, m, 0, &b), 0);
      assert_int_equal(reshard_layout_add_vllm_qkv(L[side], "qkv_proj.bias", &bias, m, 0, &b), 0);
      assert_int_equal(reshard_layout_add_gate_up(L[side], "gate_up_proj.weight", g, u, m, 0, &b), 0);
    } else {
      assert_int_equal(reshard_layout_add_megatron_qkv(L[side], "linear_qkv.weight", &w, m, 0, &b), 0);
      assert_int_equal(reshard_layout_add_megatron_qkv(L[side], "linear_qkv.bias", &bias, m, 0, &b), 0);
      assert_int_equal(reshard_layout_add_gate_up(L[side], "linear_fc1.weight", g, u, m, 0, &b), 0);
    }
  }
  th_sync_args a;
  memset(&a, 0, sizeof a);
  a.src = L[0];
  a.dst = L[1];
  a.opts = (reshard_options_t)RESHARD_OPTIONS_INITIALIZER;
  a.steps = 2;
  assert_int_equal(th_sync(6, &a), 0);
  assert_int_equal(a.api_failures, 0);
  reshard_layout_destroy(L[0]);
  reshard_layout_destroy(L[1]);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(megatron_qkv_golden),  cmocka_unit_test(vllm_qkv_golden),
      cmocka_unit_test(gate_up_golden),       cmocka_unit_test(vllm_qkv_reuses_mesh),
      cmocka_unit_test(bad_numbers),          cmocka_unit_test(megatron_to_vllm_sync),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
