/* The multi-rank tests' runner: see mock_world.h. */
#include "gpu/mock_world.h"

#include <pthread.h>
#include <stdlib.h>

static void *rank_main(void *p) {
  mw_rank *r = p;
  mock_reset(r->rank, r->n);
  M.log_off = 1;
  r->fn(r);
  if (M.mem || M.streams || M.events)
    RFAIL(r, "leaked %ld allocations, %ld streams, %ld events", M.mem, M.streams, M.events);
  return NULL;
}

mw_outcome mw_run(int n, int64_t hang_ms, mw_fn fn, void *ctx, mw_rank *r) {
  mw_outcome o = {0, -1, 0, 0, 0, 0, 0};
  if (n < 1 || n > MAXR) abort();
  mock_world_begin(n, 0);
  world.hang_ms = hang_ms;
  reshard_inproc_world_t *hw = NULL;
  if (reshard_inproc_world_create(n, &hw)) abort();
  pthread_t th[MAXR];
  for (int i = 0; i < n; i++) {
    r[i] = (mw_rank){.rank = i, .n = n, .host_world = hw, .ctx = ctx, .fn = fn};
    pthread_create(&th[i], NULL, rank_main, &r[i]);
  }
  for (int i = 0; i < n; i++) {
    pthread_join(th[i], NULL);
    o.wrong += r[i].wrong;
    if (r[i].failed && o.failed < 0) o.failed = i;
  }
  o.hangs = world.hangs;
  o.ipc_mapped = world.ipc_mapped;
  o.ipc_closed_reads = world.ipc_closed_reads;
  o.capture_violations = world.capture_violations;
  o.bad_size = world.bad_size;
  mock_world_end();
  world.hang_ms = 3000;
  reshard_inproc_world_destroy(hw);
  return o;
}

void mw_layouts_all(int n, int64_t rows, int64_t cols, reshard_layout_t **src, reshard_layout_t **dst) {
  int64_t shape[2] = {rows, cols};
  int t, m, b, sn[1] = {n}, ranks[MAXR], rev[MAXR];
  for (int i = 0; i < n; i++) ranks[i] = i, rev[i] = n - 1 - i;
  reshard_placement_t p0[1] = {reshard_shard(0)}, p1[1] = {reshard_shard(1)};
  if (reshard_layout_create(src) || reshard_layout_create(dst) ||
      reshard_layout_add_tensor(*src, "w", RESHARD_FP32, 2, shape, &t) ||
      reshard_layout_add_tensor(*dst, "w", RESHARD_FP32, 2, shape, &t) ||
      reshard_layout_add_mesh(*src, 1, sn, ranks, &m) || reshard_layout_place(*src, t, m, p0, &b) ||
      reshard_layout_add_mesh(*dst, 1, sn, rev, &m) || reshard_layout_place(*dst, t, m, p1, &b)) {
    fprintf(stderr, "mw_layouts_all: %s\n", reshard_last_error());
    abort();
  }
}
