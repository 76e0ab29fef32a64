/* quickstart: the reshard API in one file.
 *
 * Eight ranks run as threads of this process (the in-process transport).
 * Ranks 0-3 hold a 4096 x 1024 fp32 weight row-sharded four ways (a
 * trainer, TP=4); ranks 4-7 want it as two replicas, each column-sharded
 * two ways (an inference engine, DP=2 x TP=2). Each rank describes both
 * sides, plans once, then executes the plan for three "steps" and checks
 * every element it received.
 *
 *   ./quickstart
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

#include "reshard.h"
#include "reshard_inproc.h"

#define ROWS 4096
#define COLS 1024

static reshard_inproc_world_t *world;

/* What element (i, j) holds after step s: any function of the global
 * coordinates will do. */
static float value(int64_t i, int64_t j, int step) {
  return (float)(i * COLS + j) + 0.5f * (float)step;
}

#define CHECK(call)                                                   \
  do {                                                                \
    reshard_result_t r_ = (call);                                     \
    if (r_ != RESHARD_SUCCESS) {                                      \
      fprintf(stderr, "%s failed: %s\n  %s\n", #call,                 \
              reshard_result_string(r_), reshard_last_error());       \
      exit(1);                                                        \
    }                                                                 \
  } while (0)

static void describe(reshard_layout_t **src, reshard_layout_t **dst) {
  int64_t shape[2] = {ROWS, COLS};
  int w, mesh, buf;

  /* Source: mesh of 4 ranks (0..3), Shard(0). */
  CHECK(reshard_layout_create(src));
  CHECK(reshard_layout_add_tensor(*src, "w", RESHARD_FP32, 2, shape, &w));
  int tp4[1] = {4};
  CHECK(reshard_layout_add_mesh_strided(*src, 1, tp4, 0, 1, &mesh));
  reshard_placement_t rows[1] = {reshard_shard(0)};
  CHECK(reshard_layout_place(*src, w, mesh, rows, &buf));

  /* Destination: 2 x 2 mesh of ranks 4..7, (Replicate, Shard(1)). */
  CHECK(reshard_layout_create(dst));
  CHECK(reshard_layout_add_tensor(*dst, "w", RESHARD_FP32, 2, shape, &w));
  int dp2tp2[2] = {2, 2};
  CHECK(reshard_layout_add_mesh_strided(*dst, 2, dp2tp2, 4, 1, &mesh));
  reshard_placement_t cols[2] = {reshard_replicate(), reshard_shard(1)};
  CHECK(reshard_layout_place(*dst, w, mesh, cols, &buf));
}

static void *rank_main(void *arg) {
  int rank = (int)(intptr_t)arg;
  reshard_comm_t *comm;
  CHECK(reshard_comm_create_inproc(world, rank, &comm));
  reshard_layout_t *src, *dst;
  describe(&src, &dst);

  reshard_options_t opts = RESHARD_OPTIONS_INITIALIZER;
  reshard_plan_t *plan;
  CHECK(reshard_plan_create(comm, src, dst, &opts, &plan)); /* collective */

  /* Each side has one buffer (id 0); allocate what this rank holds. */
  size_t src_bytes, dst_bytes;
  CHECK(reshard_layout_buffer_bytes(src, 0, rank, &src_bytes));
  CHECK(reshard_layout_buffer_bytes(dst, 0, rank, &dst_bytes));
  float *sbuf = src_bytes ? malloc(src_bytes) : NULL;
  float *dbuf = dst_bytes ? malloc(dst_bytes) : NULL;
  reshard_buffer_t src_bufs[1] = {{sbuf, src_bytes}}, dst_bufs[1] = {{dbuf, dst_bytes}};
  /* The execute's arguments: sizes are checked before anything moves. */
  reshard_execute_args_t args = RESHARD_EXECUTE_ARGS_INITIALIZER;
  args.src = src_bufs, args.num_src = 1, args.dst = dst_bufs, args.num_dst = 1;
  args.flags = RESHARD_EXECUTE_FLAG_EXPLICIT_VERSION;

  long wrong = 0;
  for (int step = 0; step < 3; step++) {
    if (sbuf) /* "training": rank r holds rows [r*1024, (r+1)*1024) */
      for (int64_t i = 0; i < ROWS / 4; i++)
        for (int64_t j = 0; j < COLS; j++)
          sbuf[i * COLS + j] = value(rank * (ROWS / 4) + i, j, step);
    args.weight_version = (uint64_t)step + 1; /* the step is the weight version (from 1) */
    CHECK(reshard_plan_execute_args(plan, &args));
    if (dbuf) /* rank 4+2d+t holds columns [t*512, (t+1)*512) */
      for (int64_t i = 0; i < ROWS; i++)
        for (int64_t j = 0; j < COLS / 2; j++)
          wrong += dbuf[i * (COLS / 2) + j] != value(i, ((rank - 4) % 2) * (COLS / 2) + j, step);
  }
  if (rank == 4 || rank == 0) {
    reshard_plan_stats_t st;
    CHECK(reshard_plan_get_stats(plan, &st));
    printf("rank %d: sends %zu bytes in %zu messages, receives %zu bytes in %zu messages, wrong elements %ld\n",
           rank, st.send_bytes, st.send_messages, st.recv_bytes, st.recv_messages, wrong);
  }
  reshard_plan_destroy(plan);
  reshard_layout_destroy(src);
  reshard_layout_destroy(dst);
  free(sbuf);
  free(dbuf);
  reshard_comm_destroy(comm);
  return (void *)(intptr_t)(wrong != 0);
}

int main(void) {
  CHECK(reshard_inproc_world_create(8, &world));
  pthread_t th[8];
  for (int r = 0; r < 8; r++) pthread_create(&th[r], NULL, rank_main, (void *)(intptr_t)r);
  int failed = 0;
  for (int r = 0; r < 8; r++) {
    void *ret;
    pthread_join(th[r], &ret);
    failed |= ret != NULL;
  }
  reshard_inproc_world_destroy(world);
  printf("quickstart: %s\n", failed ? "FAILED" : "every element checked, all correct");
  return failed;
}
