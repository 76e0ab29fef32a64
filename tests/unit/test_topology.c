/* Topology presets, their resolution from options and RESHARD_TOPOLOGY,
 * and where ranks are placed: each side on fresh nodes and domains. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "plan/topology.h"
#include "reshard.h"
#include "support/harness.h"

static void presets(void **state) {
  (void)state;
  rs_topology t;
  assert_int_equal(rs_topology_preset("h100-8x400g", &t), RESHARD_SUCCESS);
  assert_int_equal(t.ranks_per_node, 8);
  assert_int_equal(t.domain_size, 8);
  assert_true(t.nvlink_bw == 450e9);
  assert_true(rs_topology_rank_nic_bw(&t) == 50e9); /* 400 Gb/s per GPU */
  assert_int_equal(rs_topology_preset("gb200-nvl72", &t), RESHARD_SUCCESS);
  assert_int_equal(t.domain_size, 72);
  assert_int_equal(t.domain_used, 64);
  assert_true(t.nvlink_bw == 900e9);
  assert_true(rs_topology_rank_nic_bw(&t) == 50e9);
  assert_int_equal(rs_topology_preset("cpu", &t), RESHARD_SUCCESS);
  assert_int_equal(rs_topology_preset("h100", &t), RESHARD_ERROR_INVALID_ARGUMENT);
  assert_non_null(strstr(reshard_last_error(), "'h100'"));
  assert_non_null(strstr(reshard_last_error(), "gb200-nvl72"));

  reshard_options_t o = RESHARD_OPTIONS_INITIALIZER;
  int has = 1;
  assert_int_equal(rs_topology_resolve(&o, &t, &has), RESHARD_SUCCESS);
  assert_int_equal(has, 0);
  o.topology = "none";
  assert_int_equal(rs_topology_resolve(&o, &t, &has), RESHARD_SUCCESS);
  assert_int_equal(has, 0);
  o.topology = "gb200-nvl72";
  assert_int_equal(rs_topology_resolve(&o, &t, &has), RESHARD_SUCCESS);
  assert_int_equal(has, 1);
  assert_string_equal(t.name, "gb200-nvl72");
}

/* A side of `n` ranks from `first`, one tensor sharded over them. */
static reshard_layout_t *side(int first, int n) {
  reshard_layout_t *L;
  assert_int_equal(reshard_layout_create(&L), 0);
  int64_t shape[1] = {4096};
  int t, m, b;
  assert_int_equal(reshard_layout_add_tensor(L, "w", RESHARD_BF16, 1, shape, &t), 0);
  assert_int_equal(reshard_layout_add_mesh_strided(L, 1, &n, first, 1, &m), 0);
  reshard_placement_t p[1] = {reshard_shard(0)};
  assert_int_equal(reshard_layout_place(L, t, m, p, &b), 0);
  return L;
}

static void placement(void **state) {
  (void)state;
  rs_topology t;
  rs_rank_map m;
  /* h100: 32 source ranks on nodes 0-3, 64 destination ranks on 4-11 */
  reshard_layout_t *s = side(0, 32), *d = side(32, 64);
  assert_int_equal(rs_topology_preset("h100-8x400g", &t), 0);
  assert_int_equal(rs_rank_map_build(&t, s, d, 96, &m), 0);
  assert_int_equal(m.nnodes, 12);
  assert_int_equal(m.ndomains, 12);
  for (int r = 0; r < 96; r++) {
    assert_int_equal(m.node[r], r / 8);
    assert_int_equal(m.domain[r], r / 8);
  }
  rs_rank_map_free(&m);
  reshard_layout_destroy(s);
  reshard_layout_destroy(d);

  /* gb200: 128 + 128 ranks, 64 of each 72-GPU domain, 4 GPUs per node;
   * destination ranks listed first in the communicator still go after */
  s = side(128, 128);
  d = side(0, 128);
  assert_int_equal(rs_topology_preset("gb200-nvl72", &t), 0);
  assert_int_equal(rs_rank_map_build(&t, s, d, 256, &m), 0);
  assert_int_equal(m.ndomains, 4);
  assert_int_equal(m.nnodes, 64);
  for (int r = 128; r < 256; r++) {
    assert_int_equal(m.domain[r], (r - 128) / 64);
    assert_int_equal(m.node[r], (r - 128) / 4);
  }
  for (int r = 0; r < 128; r++) {
    assert_int_equal(m.domain[r], 2 + r / 64);
    assert_int_equal(m.node[r], 32 + r / 4);
  }
  rs_rank_map_free(&m);
  reshard_layout_destroy(s);
  reshard_layout_destroy(d);

  /* colocated: destination on the source's ranks, plus 8 more */
  s = side(0, 16);
  d = side(0, 24);
  assert_int_equal(rs_topology_preset("h100-8x400g", &t), 0);
  assert_int_equal(rs_rank_map_build(&t, s, d, 24, &m), 0);
  for (int r = 0; r < 24; r++) assert_int_equal(m.node[r], r / 8);
  rs_rank_map_free(&m);

  /* cpu: one host */
  assert_int_equal(rs_topology_preset("cpu", &t), 0);
  assert_int_equal(rs_rank_map_build(&t, s, d, 24, &m), 0);
  assert_int_equal(m.nnodes, 1);
  for (int r = 0; r < 24; r++) assert_int_equal(m.node[r] + m.domain[r], 0);
  rs_rank_map_free(&m);
  reshard_layout_destroy(s);
  reshard_layout_destroy(d);
}

/* Plan options: a preset plans and moves data; a wrong name fails on
 * every rank; ranks naming different topologies disagree. */
static void options(void **state) {
  (void)state;
  reshard_layout_t *s = side(0, 2), *d = side(2, 2);
  th_sync_args a = {.src = s, .dst = d, .opts = RESHARD_OPTIONS_INITIALIZER, .steps = 1};
  a.opts.topology = "h100-8x400g";
  assert_int_equal(th_sync(4, &a), 0);
  a.expect_fail = 1;
  a.expected_code = RESHARD_ERROR_INVALID_ARGUMENT;
  a.opts.topology = "h200";
  assert_int_equal(th_sync(4, &a), 0);
  a.opts.topology = NULL;
  a.opts.relay = 3;
  assert_int_equal(th_sync(4, &a), 0);
  a.opts.relay = -1;
  a.opts.flags = 1u << 31;
  assert_int_equal(th_sync(4, &a), 0);
  reshard_layout_destroy(s);
  reshard_layout_destroy(d);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(presets),
      cmocka_unit_test(placement),
      cmocka_unit_test(options),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
