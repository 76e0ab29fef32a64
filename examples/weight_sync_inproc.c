/* weight_sync_inproc: an RL weight sync, ranks as threads of one process.
 *
 * A Qwen2.5-0.5B-shaped model (real shapes, fewer layers by default) lives
 * in Megatron layout on the trainer ranks (TP2 x PP2: fused QKV interleaved
 * per KV group, fused gate_up, vocabulary padded to 128 x TP) and must reach
 * the inference ranks in vLLM layout (TP2 x DP2: qkv_proj, gate_up_proj,
 * vocabulary padded to 64). One plan is created; then for each step the
 * trainers "train" (rewrite every weight with that step's values), the plan
 * runs, and every inference rank checks every element it holds, and that
 * padding was left alone.
 *
 *   weight_sync_inproc [--layers N] [--steps K] [--staging MiB]
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "model_layouts.h"
#include "reshard.h"
#include "verify.h"

typedef struct job {
  ml_model model;
  ml_megatron train;
  ml_vllm infer;
  int steps;
  size_t staging;
  reshard_layout_t *src, *dst;
  reshard_inproc_world_t *world;
  pthread_barrier_t barrier;
  int nsrc, nranks;
  /* per step, filled by the ranks */
  double *exec_s;    /* [step * nranks + rank] */
  int64_t *wrong;    /* [step], summed */
  size_t delivered;  /* bytes of destination fragments, all ranks */
  double plan_s;
  reshard_plan_stats_t *stats;
  pthread_mutex_t lock;
  int failed;
} job;

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int report(job *j, int rank, const char *what, reshard_result_t r) {
  fprintf(stderr, "rank %d: %s failed: %s\n  %s\n", rank, what, reshard_result_string(r), reshard_last_error());
  pthread_mutex_lock(&j->lock);
  j->failed = 1;
  pthread_mutex_unlock(&j->lock);
  return 1;
}

typedef struct rank_arg {
  job *j;
  int rank;
} rank_arg;

static void *rank_main(void *p) {
  rank_arg *a = p;
  job *j = a->j;
  int rank = a->rank;
  reshard_comm_t *comm = NULL;
  reshard_plan_t *plan = NULL;
  vf_side src, dst;
  reshard_result_t r = reshard_comm_create_inproc(j->world, rank, &comm);
  if (r) {
    report(j, rank, "comm_create", r);
    return NULL;
  }
  reshard_options_t opts = RESHARD_OPTIONS_INITIALIZER;
  opts.staging_bytes = j->staging;
  pthread_barrier_wait(&j->barrier);
  double t0 = now_s();
  r = reshard_plan_create(comm, j->src, j->dst, &opts, &plan);
  double t1 = now_s();
  if (r) report(j, rank, "plan_create", r);
  if (vf_side_alloc(&src, j->src, rank, -1) || vf_side_alloc(&dst, j->dst, rank, -1)) report(j, rank, "allocation", RESHARD_ERROR_OUT_OF_MEMORY);
  if (plan) {
    reshard_plan_get_stats(plan, &j->stats[rank]);
    size_t mine = 0;
    for (size_t i = 0; i < dst.nfrags; i++) {
      size_t n = reshard_dtype_size(j->model.dtype);
      for (int d = 0; d < dst.frags[i].ndim; d++) n *= (size_t)dst.frags[i].extent[d];
      mine += n;
    }
    pthread_mutex_lock(&j->lock);
    j->delivered += mine;
    if (t1 - t0 > j->plan_s) j->plan_s = t1 - t0;
    pthread_mutex_unlock(&j->lock);
  }
  for (int step = 0; step < j->steps; step++) {
    vf_side_fill(&src, j->src, (uint64_t)step); /* "training" */
    pthread_barrier_wait(&j->barrier);
    double s0 = now_s();
    if (plan) {
      r = reshard_plan_execute(plan, (void *const *)src.ptr, (size_t)src.nbuf, (void *const *)dst.ptr, (size_t)dst.nbuf, NULL);
      if (r) report(j, rank, "execute", r);
    }
    j->exec_s[step * j->nranks + rank] = now_s() - s0;
    int64_t bad = vf_side_check(&dst, j->dst, rank, (uint64_t)step, "weight_sync");
    pthread_mutex_lock(&j->lock);
    j->wrong[step] += bad;
    pthread_mutex_unlock(&j->lock);
  }
  vf_side_free(&src);
  vf_side_free(&dst);
  reshard_plan_destroy(plan);
  reshard_comm_destroy(comm);
  return NULL;
}

static void usage(const char *argv0) {
  fprintf(stderr, "usage: %s [--layers N] [--steps K] [--staging MiB]\n", argv0);
  exit(2);
}

int main(int argc, char **argv) {
  job j;
  memset(&j, 0, sizeof j);
  /* Qwen2.5-0.5B: hidden 896, 14 heads of 64, 2 KV heads, MLP 4864,
   * vocabulary 151936, tied embeddings; 24 layers in the real model. */
  j.model = (ml_model){.layers = 4, .hidden = 896, .heads = 14, .kv_heads = 2, .head_dim = 64,
                       .intermediate = 4864, .vocab = 151936, .tied_embeddings = 1, .dtype = RESHARD_BF16};
  j.train = (ml_megatron){.tp = 2, .pp = 2, .dp = 1, .ep = 1};
  j.infer = (ml_vllm){.tp = 2, .dp = 2, .ep = 1};
  j.steps = 5;
  j.staging = (size_t)64 << 20;
  for (int i = 1; i < argc; i++) {
    if (i + 1 < argc && !strcmp(argv[i], "--layers")) j.model.layers = atoi(argv[++i]);
    else if (i + 1 < argc && !strcmp(argv[i], "--steps")) j.steps = atoi(argv[++i]);
    else if (i + 1 < argc && !strcmp(argv[i], "--staging")) j.staging = (size_t)atol(argv[++i]) << 20;
    else usage(argv[0]);
  }
  if (j.model.layers < 1 || j.steps < 1) usage(argv[0]);
  reshard_result_t r = ml_build_pair(&j.model, &j.train, &j.infer, 0, &j.src, &j.dst, &j.nranks);
  if (r) {
    fprintf(stderr, "building layouts failed: %s\n  %s\n", reshard_result_string(r), reshard_last_error());
    return 1;
  }
  j.nsrc = ml_megatron_ranks(&j.train);
  printf("# reshard weight sync: Qwen2.5-0.5B shapes, %d layers, %.1f M parameters (bf16), %d tensors\n", j.model.layers,
         (double)ml_num_params(&j.model) / 1e6, ml_num_tensors(&j.model));
  printf("# trainer: megatron tp=%d pp=%d (ranks 0-%d)  ->  inference: vllm tp=%d dp=%d (ranks %d-%d), in-process threads\n",
         j.train.tp, j.train.pp, j.nsrc - 1, j.infer.tp, j.infer.dp, j.nsrc, j.nranks - 1);
  j.exec_s = calloc((size_t)(j.steps * j.nranks), sizeof *j.exec_s);
  j.wrong = calloc((size_t)j.steps, sizeof *j.wrong);
  j.stats = calloc((size_t)j.nranks, sizeof *j.stats);
  pthread_mutex_init(&j.lock, NULL);
  pthread_barrier_init(&j.barrier, NULL, (unsigned)j.nranks);
  if (reshard_inproc_world_create(j.nranks, &j.world)) return 1;
  pthread_t *th = calloc((size_t)j.nranks, sizeof *th);
  rank_arg *args = calloc((size_t)j.nranks, sizeof *args);
  for (int i = 0; i < j.nranks; i++) {
    args[i] = (rank_arg){&j, i};
    pthread_create(&th[i], NULL, rank_main, &args[i]);
  }
  for (int i = 0; i < j.nranks; i++) pthread_join(th[i], NULL);
  reshard_inproc_world_destroy(j.world);

  printf("# plan: created in %.2f ms (slowest rank)\n", 1e3 * j.plan_s);
  printf("#  rank  side    send_MiB  recv_MiB  local_MiB  msgs_out  msgs_in  rounds\n");
  for (int i = 0; i < j.nranks; i++) {
    const reshard_plan_stats_t *s = &j.stats[i];
    printf("   %4d  %-6s %9.2f %9.2f %10.2f %9zu %8zu %7d\n", i, i < j.nsrc ? "train" : "infer", s->send_bytes / 1048576.0,
           s->recv_bytes / 1048576.0, s->local_copy_bytes / 1048576.0, s->send_messages, s->recv_messages, s->num_chunks);
  }
  printf("#  step   delivered_MiB   time_ms   algbw_GB/s   wrong\n");
  int64_t total_wrong = 0;
  for (int s = 0; s < j.steps; s++) {
    double t = 0;
    for (int i = 0; i < j.nranks; i++)
      if (j.exec_s[s * j.nranks + i] > t) t = j.exec_s[s * j.nranks + i];
    printf("   %4d   %13.2f   %7.2f   %10.2f   %5lld\n", s, j.delivered / 1048576.0, 1e3 * t, j.delivered / t / 1e9,
           (long long)j.wrong[s]);
    total_wrong += j.wrong[s];
  }
  int ok = !j.failed && total_wrong == 0;
  printf("# weight_sync: %s (%d steps, every destination element and padding byte checked)\n",
         ok ? "OK" : "FAILED", j.steps);
  reshard_layout_destroy(j.src);
  reshard_layout_destroy(j.dst);
  free(th);
  free(args);
  free(j.exec_s);
  free(j.wrong);
  free(j.stats);
  return ok ? 0 : 1;
}
