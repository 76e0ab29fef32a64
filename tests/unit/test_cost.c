/* The cost model (src/plan/cost.h) and T_lower (src/plan/lower_bound.h):
 * hand-computed predictions of tiny plans, the collective estimate equal to
 * the global one, the lower bound's terms on replicas, colocated ranks and
 * several domains, and the first-replica baseline knob. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "plan/lower_bound.h"
#include "plan/topology.h"
#include "plan_cost.h"
#include "reshard.h"
#include "support/harness.h"

static void assert_close(double got, double want) {
  if (fabs(got - want) > 1e-11 + 1e-9 * fabs(want)) /* rounding to picoseconds */ fail_msg("got %.12e, want %.12e", got, want);
}

/* One tensor of n f32 elements on a 1-D mesh of the given ranks. */
static reshard_layout_t *side(int64_t n, int nr, const int *ranks, reshard_placement_t pl) {
  reshard_layout_t *L;
  assert_int_equal(reshard_layout_create(&L), 0);
  int t, m, b;
  assert_int_equal(reshard_layout_add_tensor(L, "w", RESHARD_FP32, 1, &n, &t), 0);
  assert_int_equal(reshard_layout_add_mesh(L, 1, &nr, ranks, &m), 0);
  assert_int_equal(reshard_layout_place(L, t, m, &pl, &b), 0);
  return L;
}

static rs_topology preset(const char *name) {
  rs_topology t;
  assert_int_equal(rs_topology_preset(name, &t), 0);
  return t;
}

static void global(const reshard_layout_t *s, const reshard_layout_t *d, int world, const char *topo,
                   reshard_estimate_t *e) {
  reshard_options_t o = RESHARD_OPTIONS_INITIALIZER;
  o.topology = topo;
  reshard_estimate_t x = RESHARD_ESTIMATE_INITIALIZER;
  assert_int_equal(pc_estimate_global(s, d, world, &o, &x, NULL), 0);
  *e = x;
}

/* Rank 0 sends 2 x 2048 bytes to ranks 1 and 2 (another node): its NIC
 * egress bounds the one round. */
static void one_to_two_h100(void **state) {
  (void)state;
  int r0[1] = {0}, r12[2] = {1, 2};
  reshard_layout_t *s = side(1024, 1, r0, reshard_replicate()), *d = side(1024, 2, r12, reshard_shard(0));
  reshard_estimate_t e;
  global(s, d, 3, "h100-8x400g", &e);
  /* the latency once (both messages in flight together), each message's
   * own cost twice */
  double want = 4096.0 / 50e9 + 5e-6 + 2 * 1e-6;
  assert_close(e.seconds, want);
  assert_int_equal(e.bound, RESHARD_BOUND_NIC_EGRESS);
  assert_int_equal(e.bound_where, 0);
  assert_close(e.bound_seconds[RESHARD_BOUND_NIC_EGRESS], want);
  assert_close(e.latency_seconds, 7e-6);
  assert_int_equal(e.num_rounds, 1);
  assert_int_equal(e.bytes, 4096);

  /* T_lower: the one source NIC (and the sole holder) carry 4096 bytes */
  reshard_estimate_t lb = RESHARD_ESTIMATE_INITIALIZER;
  assert_int_equal(reshard_lower_bound(s, d, 3, "h100-8x400g", &lb), 0);
  assert_close(lb.seconds, 4096.0 / 50e9);
  assert_int_equal(lb.bound, RESHARD_BOUND_SOURCE_EGRESS);
  assert_close(lb.bound_seconds[RESHARD_BOUND_DOMAIN_INGRESS], 4096.0 / (2 * 50e9));
  assert_close(lb.bound_seconds[RESHARD_BOUND_RANK_INGRESS], 2048.0 / 450e9);
  assert_close(lb.bound_seconds[RESHARD_BOUND_SOLE_HOLDER], 4096.0 / 50e9);
  assert_int_equal(lb.bytes, 4096);

  /* small chunks: 4 rounds of 512-byte messages, each round the same */
  reshard_options_t o = RESHARD_OPTIONS_INITIALIZER;
  o.topology = "h100-8x400g";
  o.chunk_bytes = 512;
  reshard_estimate_t c = RESHARD_ESTIMATE_INITIALIZER;
  assert_int_equal(pc_estimate_global(s, d, 3, &o, &c, NULL), 0);
  assert_int_equal(c.num_rounds, 4);
  assert_close(c.seconds, 4 * (1024.0 / 50e9 + 5e-6 + 2 * 1e-6));
  reshard_layout_destroy(s);
  reshard_layout_destroy(d);
}

/* Inside one NVLink domain (h100: 8 GPUs), and a local copy. */
static void nvlink_and_local(void **state) {
  (void)state;
  int r01[2] = {0, 1}, r10[2] = {1, 0};
  /* colocated on ranks 0 and 1, halves swapped: 2048 bytes each way */
  reshard_layout_t *s = side(1024, 2, r01, reshard_shard(0)), *d = side(1024, 2, r10, reshard_shard(0));
  reshard_estimate_t e;
  global(s, d, 2, "h100-8x400g", &e);
  assert_close(e.seconds, 2048.0 / 450e9 + 2e-6 + 0.5e-6); /* latency + one message */
  assert_int_equal(e.bound, RESHARD_BOUND_NVLINK_EGRESS);
  reshard_estimate_t lb = RESHARD_ESTIMATE_INITIALIZER;
  assert_int_equal(reshard_lower_bound(s, d, 2, "h100-8x400g", &lb), 0);
  /* nothing crosses a NIC; each rank receives 2048 bytes over NVLink */
  assert_close(lb.bound_seconds[RESHARD_BOUND_SOURCE_EGRESS], 0);
  assert_close(lb.seconds, 2048.0 / 450e9);
  assert_int_equal(lb.bound, RESHARD_BOUND_RANK_INGRESS);
  assert_int_equal(lb.bound_where, 0);
  reshard_layout_destroy(d);
  /* the same halves: local copies only, no bytes to move */
  d = side(1024, 2, r01, reshard_shard(0));
  global(s, d, 2, "h100-8x400g", &e);
  assert_close(e.seconds, 2048.0 / 450e9);
  assert_int_equal(e.bound, RESHARD_BOUND_LOCAL_COPY);
  assert_int_equal(e.bytes, 4096);
  assert_int_equal(reshard_lower_bound(s, d, 2, "h100-8x400g", &lb), 0);
  assert_close(lb.seconds, 0);
  assert_int_equal(lb.bytes, 0);
  reshard_layout_destroy(s);
  reshard_layout_destroy(d);
}

/* The cpu preset: every byte received is one copy through the host's
 * memory, shared by all ranks. */
static void cpu_node_memory(void **state) {
  (void)state;
  rs_topology t = preset("cpu");
  int r0[1] = {0}, r1234[4] = {1, 2, 3, 4};
  reshard_layout_t *s = side(4096, 1, r0, reshard_replicate()), *d = side(4096, 4, r1234, reshard_replicate());
  reshard_estimate_t e;
  global(s, d, 5, "cpu", &e);
  /* rank 0 sends 4 x 16 KiB; the node copies 64 KiB */
  double egress = 4 * 16384.0 / t.nvlink_bw + t.nvlink_latency_s + 4 * t.nvlink_msg_s, node = 4 * 16384.0 / t.node_copy_bw;
  assert_close(e.seconds, egress > node ? egress : node);
  assert_int_equal(e.bound, egress > node ? RESHARD_BOUND_NVLINK_EGRESS : RESHARD_BOUND_NODE_MEMORY);
  reshard_estimate_t lb = RESHARD_ESTIMATE_INITIALIZER;
  assert_int_equal(reshard_lower_bound(s, d, 5, "cpu", &lb), 0);
  double in = 16384.0 / t.nvlink_bw, sole = 16384.0 / t.nvlink_bw;
  assert_close(lb.bound_seconds[RESHARD_BOUND_NODE_MEMORY], node);
  assert_close(lb.bound_seconds[RESHARD_BOUND_RANK_INGRESS], in);
  assert_close(lb.bound_seconds[RESHARD_BOUND_SOLE_HOLDER], sole);
  assert_close(lb.bound_seconds[RESHARD_BOUND_SOURCE_EGRESS], 0); /* no NIC on one host */
  assert_close(lb.seconds, node > in ? node : in);
  reshard_layout_destroy(s);
  reshard_layout_destroy(d);
}

/* T_lower with replicas on both sides and several domains. */
static void lower_bound_terms(void **state) {
  (void)state;
  int src2[2] = {0, 1}, dst4[4] = {2, 3, 4, 5};
  /* 2 source replicas -> 4 destination replicas (another domain) */
  reshard_layout_t *s = side(1024, 2, src2, reshard_replicate()), *d = side(1024, 4, dst4, reshard_replicate());
  reshard_estimate_t lb = RESHARD_ESTIMATE_INITIALIZER;
  assert_int_equal(reshard_lower_bound(s, d, 6, "h100-8x400g", &lb), 0);
  assert_int_equal(lb.bytes, 4096); /* unique, however many replicas */
  assert_close(lb.seconds, 4096.0 / (2 * 50e9));
  assert_int_equal(lb.bound, RESHARD_BOUND_SOURCE_EGRESS);
  assert_int_equal(lb.bound_where, -1);
  assert_close(lb.bound_seconds[RESHARD_BOUND_DOMAIN_INGRESS], 4096.0 / (4 * 50e9));
  assert_close(lb.bound_seconds[RESHARD_BOUND_RANK_INGRESS], 4096.0 / 450e9);
  assert_close(lb.bound_seconds[RESHARD_BOUND_SOLE_HOLDER], 0);
  reshard_layout_destroy(s);
  reshard_layout_destroy(d);

  /* 16 source replicas (2 domains) -> 8 shards on a third domain: the
   * destination domain's NICs bound it */
  int src16[16], dst8[8];
  for (int i = 0; i < 16; i++) src16[i] = i;
  for (int i = 0; i < 8; i++) dst8[i] = 16 + i;
  s = side(1024, 16, src16, reshard_replicate());
  d = side(1024, 8, dst8, reshard_shard(0));
  assert_int_equal(reshard_lower_bound(s, d, 24, "h100-8x400g", &lb), 0);
  assert_close(lb.seconds, 4096.0 / (8 * 50e9));
  assert_int_equal(lb.bound, RESHARD_BOUND_DOMAIN_INGRESS);
  assert_int_equal(lb.bound_where, 2);
  assert_close(lb.bound_seconds[RESHARD_BOUND_SOURCE_EGRESS], 4096.0 / (16 * 50e9));
  assert_close(lb.bound_seconds[RESHARD_BOUND_RANK_INGRESS], 512.0 / 450e9);
  reshard_layout_destroy(d);

  /* 16 destination replicas on 2 domains: each domain needs every byte */
  int dst16[16];
  for (int i = 0; i < 16; i++) dst16[i] = 16 + i;
  d = side(1024, 16, dst16, reshard_replicate());
  assert_int_equal(reshard_lower_bound(s, d, 32, "h100-8x400g", &lb), 0);
  assert_close(lb.bound_seconds[RESHARD_BOUND_DOMAIN_INGRESS], 4096.0 / (8 * 50e9));
  assert_close(lb.seconds, 4096.0 / (8 * 50e9));
  reshard_layout_destroy(s);
  reshard_layout_destroy(d);

  /* 2-D: source S0 over 2 ranks, destination S1 over 2 ranks: 4 cells of
   * 64 x 64 f32, each destination needs the 2 cells of its columns, one
   * of them from each source, over the network */
  reshard_layout_t *S, *D;
  assert_int_equal(reshard_layout_create(&S), 0);
  assert_int_equal(reshard_layout_create(&D), 0);
  int64_t shape[2] = {128, 128};
  int t, m, b, n2 = 2, sr[2] = {0, 1}, dr[2] = {2, 3};
  reshard_placement_t p0 = reshard_shard(0), p1 = reshard_shard(1);
  assert_int_equal(reshard_layout_add_tensor(S, "x", RESHARD_FP32, 2, shape, &t), 0);
  assert_int_equal(reshard_layout_add_mesh(S, 1, &n2, sr, &m), 0);
  assert_int_equal(reshard_layout_place(S, t, m, &p0, &b), 0);
  assert_int_equal(reshard_layout_add_tensor(D, "x", RESHARD_FP32, 2, shape, &t), 0);
  assert_int_equal(reshard_layout_add_mesh(D, 1, &n2, dr, &m), 0);
  assert_int_equal(reshard_layout_place(D, t, m, &p1, &b), 0);
  assert_int_equal(reshard_lower_bound(S, D, 4, "h100-8x400g", &lb), 0);
  assert_int_equal(lb.bytes, 128 * 128 * 4);
  assert_close(lb.bound_seconds[RESHARD_BOUND_SOURCE_EGRESS], 65536.0 / (2 * 50e9));
  assert_close(lb.bound_seconds[RESHARD_BOUND_SOLE_HOLDER], 32768.0 / 450e9);
  assert_close(lb.bound_seconds[RESHARD_BOUND_RANK_INGRESS], 32768.0 / 450e9);
  reshard_layout_destroy(S);
  reshard_layout_destroy(D);
}

/* The source-domain cut beside T_lower: "big" (16 KiB) sharded over
 * domain 0's 8 source ranks, "small" (4 KiB) over domain 1's; both
 * sharded over 16 destination ranks on domains 2 and 3. T_lower's terms
 * give 20 KiB over 16 NICs (source egress) and 10 KiB over 8 (each
 * destination domain); but big's 16 KiB must leave through domain 0's 8
 * NICs, 1.6 times longer. */
static void source_domain_cut(void **state) {
  (void)state;
  reshard_layout_t *L[2];
  static const char *names[2] = {"big", "small"};
  const int64_t n[2] = {4096, 1024};
  for (int k = 0; k < 2; k++) {
    assert_int_equal(reshard_layout_create(&L[k]), 0);
    for (int i = 0; i < 2; i++) {
      int t, m, b, nr = k ? 16 : 8, ranks[16];
      for (int r = 0; r < nr; r++) ranks[r] = k ? 16 + r : 8 * i + r;
      reshard_placement_t sh = reshard_shard(0);
      assert_int_equal(reshard_layout_add_tensor(L[k], names[i], RESHARD_FP32, 1, &n[i], &t), 0);
      assert_int_equal(reshard_layout_add_mesh(L[k], 1, &nr, ranks, &m), 0);
      assert_int_equal(reshard_layout_place(L[k], t, m, &sh, &b), 0);
    }
  }
  reshard_estimate_t lb = RESHARD_ESTIMATE_INITIALIZER;
  assert_int_equal(reshard_lower_bound(L[0], L[1], 32, "h100-8x400g", &lb), 0);
  assert_close(lb.bound_seconds[RESHARD_BOUND_SOURCE_EGRESS], 20480.0 / (16 * 50e9));
  assert_close(lb.bound_seconds[RESHARD_BOUND_DOMAIN_INGRESS], 10240.0 / (8 * 50e9));
  assert_close(lb.seconds, 20480.0 / (16 * 50e9));
  rs_topology t = preset("h100-8x400g");
  rs_volume v;
  assert_int_equal(rs_volume_compute(L[0], L[1], 32, &t, &v), 0);
  assert_int_equal(v.domain_out[0], 16384);
  assert_int_equal(v.domain_out[1], 4096);
  int where = -2;
  assert_close(rs_volume_domain_cut(&v, &where), 16384.0 / (8 * 50e9));
  assert_int_equal(where, 0);
  rs_volume_free(&v);
  /* the same bytes replicated on both source domains leave either: no
   * domain holds them alone */
  reshard_layout_destroy(L[0]);
  assert_int_equal(reshard_layout_create(&L[0]), 0);
  for (int i = 0; i < 2; i++) {
    int t, m, b, nr = 16, ranks[16];
    for (int r = 0; r < nr; r++) ranks[r] = r;
    reshard_placement_t rep = reshard_replicate();
    assert_int_equal(reshard_layout_add_tensor(L[0], names[i], RESHARD_FP32, 1, &n[i], &t), 0);
    assert_int_equal(reshard_layout_add_mesh(L[0], 1, &nr, ranks, &m), 0);
    assert_int_equal(reshard_layout_place(L[0], t, m, &rep, &b), 0);
  }
  assert_int_equal(rs_volume_compute(L[0], L[1], 32, &t, &v), 0);
  assert_close(rs_volume_domain_cut(&v, &where), 0);
  assert_int_equal(where, -1);
  rs_volume_free(&v);
  reshard_layout_destroy(L[0]);
  reshard_layout_destroy(L[1]);
}

static void bad_input(void **state) {
  (void)state;
  int r0[1] = {0}, r1[1] = {1};
  reshard_layout_t *s = side(64, 1, r0, reshard_replicate()), *d = side(64, 1, r1, reshard_replicate());
  reshard_estimate_t e = RESHARD_ESTIMATE_INITIALIZER;
  assert_int_equal(reshard_lower_bound(s, d, 2, NULL, &e), RESHARD_ERROR_INVALID_ARGUMENT);
  assert_int_equal(reshard_lower_bound(s, d, 2, "tpu", &e), RESHARD_ERROR_INVALID_ARGUMENT);
  assert_non_null(strstr(reshard_last_error(), "'tpu'"));
  assert_int_equal(reshard_lower_bound(s, d, 1, "cpu", &e), RESHARD_ERROR_INVALID_ARGUMENT);
  assert_non_null(strstr(reshard_last_error(), "rank 1"));
  e.version = 7;
  assert_int_equal(reshard_lower_bound(s, d, 2, "cpu", &e), RESHARD_ERROR_INVALID_ARGUMENT);
  assert_non_null(strstr(reshard_last_error(), "RESHARD_ESTIMATE_INITIALIZER"));
  assert_true(e.seconds == 0); /* unchanged */
  assert_int_equal(reshard_lower_bound(s, d, 2, "cpu", NULL), RESHARD_ERROR_INVALID_ARGUMENT);
  reshard_layout_destroy(s);
  reshard_layout_destroy(d);
  assert_string_equal(reshard_bound_name(RESHARD_BOUND_DOMAIN_INGRESS), "domain-ingress");
  assert_string_equal(reshard_bound_name((reshard_bound_t)99), "invalid");
}

/* ---- the collective estimate on in-process ranks ---- */

typedef struct coll_arg {
  const reshard_layout_t *s, *d;
  reshard_options_t o;
  reshard_estimate_t e[16];
  reshard_result_t rc[16];
} coll_arg;

static int coll_rank(int rank, reshard_comm_t *comm, void *arg) {
  coll_arg *a = arg;
  reshard_plan_t *p = NULL;
  reshard_result_t r = reshard_plan_create(comm, a->s, a->d, &a->o, &p);
  if (r) return 1;
  a->e[rank] = (reshard_estimate_t)RESHARD_ESTIMATE_INITIALIZER;
  a->rc[rank] = reshard_plan_estimate(p, &a->e[rank]);
  if (a->rc[rank] && a->rc[rank] != RESHARD_ERROR_INVALID_USAGE)
    print_message("rank %d: %s\n", rank, reshard_last_error());
  reshard_plan_destroy(p);
  return 0;
}

static void collective_equals_global(void **state) {
  (void)state;
  static const char *topos[3] = {"h100-8x400g", "gb200-nvl72", "cpu"};
  int sr[4] = {0, 1, 2, 3}, dr[6] = {4, 5, 6, 7, 8, 9}, cr[6] = {0, 1, 2, 3, 4, 5};
  for (int colo = 0; colo < 2; colo++)
    for (int ti = 0; ti < 3; ti++) {
      /* 2-D shards to a differently split side: many messages, rounds */
      reshard_layout_t *S, *D;
      assert_int_equal(reshard_layout_create(&S), 0);
      assert_int_equal(reshard_layout_create(&D), 0);
      int64_t shape[2] = {96, 400};
      int t, m, b, sm[2] = {2, 2}, dm[2] = {3, 2};
      reshard_placement_t sp[2] = {reshard_replicate(), reshard_shard(0)}, dp[2] = {reshard_shard(1), reshard_shard(0)};
      assert_int_equal(reshard_layout_add_tensor(S, "x", RESHARD_FP32, 2, shape, &t), 0);
      assert_int_equal(reshard_layout_add_mesh(S, 2, sm, sr, &m), 0);
      assert_int_equal(reshard_layout_place(S, t, m, sp, &b), 0);
      assert_int_equal(reshard_layout_add_tensor(D, "x", RESHARD_FP32, 2, shape, &t), 0);
      assert_int_equal(reshard_layout_add_mesh(D, 2, dm, colo ? cr : dr, &m), 0);
      assert_int_equal(reshard_layout_place(D, t, m, dp, &b), 0);
      int world = colo ? 6 : 10;
      coll_arg a = {.s = S, .d = D, .o = RESHARD_OPTIONS_INITIALIZER};
      a.o.topology = topos[ti];
      a.o.staging_bytes = 4096; /* several rounds */
      assert_int_equal(th_run_ranks(world, coll_rank, &a), 0);
      reshard_estimate_t g = RESHARD_ESTIMATE_INITIALIZER;
      assert_int_equal(pc_estimate_global(S, D, world, &a.o, &g, NULL), 0);
      if (g.num_rounds <= 1) fail_msg("colo %d %s: %d rounds, %g s", colo, topos[ti], g.num_rounds, g.seconds);
      assert_true(g.seconds > 0);
      for (int r = 0; r < world; r++) {
        assert_int_equal(a.rc[r], 0);
        assert_true(a.e[r].seconds == g.seconds);
        assert_int_equal(a.e[r].bound, g.bound);
        assert_int_equal(a.e[r].bound_where, g.bound_where);
        assert_true(a.e[r].latency_seconds == g.latency_seconds);
        assert_int_equal(a.e[r].num_rounds, g.num_rounds);
        assert_int_equal(a.e[r].bytes, g.bytes);
        for (int k = 0; k < RESHARD_NUM_BOUNDS; k++) assert_true(a.e[r].bound_seconds[k] == g.bound_seconds[k]);
      }
      /* the plan is never faster than the limit */
      reshard_estimate_t lb = RESHARD_ESTIMATE_INITIALIZER;
      assert_int_equal(reshard_lower_bound(S, D, world, topos[ti], &lb), 0);
      assert_true(lb.seconds <= g.seconds);
      assert_true(lb.seconds > 0);
      reshard_layout_destroy(S);
      reshard_layout_destroy(D);
    }
}

static void no_topology(void **state) {
  (void)state;
  int r0[1] = {0}, r1[1] = {1};
  reshard_layout_t *s = side(64, 1, r0, reshard_replicate()), *d = side(64, 1, r1, reshard_replicate());
  coll_arg a = {.s = s, .d = d, .o = RESHARD_OPTIONS_INITIALIZER};
  assert_int_equal(th_run_ranks(2, coll_rank, &a), 0);
  for (int r = 0; r < 2; r++) assert_int_equal(a.rc[r], RESHARD_ERROR_INVALID_USAGE);
  assert_int_equal(reshard_plan_estimate(NULL, &a.e[0]), RESHARD_ERROR_INVALID_ARGUMENT);
  reshard_layout_destroy(s);
  reshard_layout_destroy(d);
}

/* RESHARD_FLAG_FIRST_REPLICA: data still arrives, every byte from the
 * lowest replica. */
static void first_replica(void **state) {
  (void)state;
  int sr[4] = {0, 1, 2, 3}, dr[2] = {4, 5};
  reshard_layout_t *s = side(4096, 4, sr, reshard_replicate()), *d = side(4096, 2, dr, reshard_shard(0));
  th_sync_args a = {.src = s, .dst = d, .opts = RESHARD_OPTIONS_INITIALIZER, .steps = 1};
  a.opts.flags = RESHARD_FLAG_FIRST_REPLICA;
  assert_int_equal(th_sync(6, &a), 0);
  assert_int_equal(a.send_bytes[0], 4096 * 4);
  for (int r = 1; r < 4; r++) assert_int_equal(a.send_bytes[r], 0);
  a.opts.flags = 0; /* balanced: every replica sends a quarter */
  assert_int_equal(th_sync(6, &a), 0);
  for (int r = 0; r < 4; r++) assert_int_equal(a.send_bytes[r], 4096);
  reshard_layout_destroy(s);
  reshard_layout_destroy(d);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(one_to_two_h100),  cmocka_unit_test(nvlink_and_local),
      cmocka_unit_test(cpu_node_memory),  cmocka_unit_test(lower_bound_terms),
      cmocka_unit_test(bad_input),        cmocka_unit_test(collective_equals_global),
      cmocka_unit_test(no_topology),      cmocka_unit_test(first_replica),
      cmocka_unit_test(source_domain_cut),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
