/* rl_weight_sync: the weight sync of an RL post-training loop, on MPI ranks.
 *
 * Trainer ranks hold a model in Megatron layout (fused QKV interleaved per
 * KV group, fused gate_up, the vocabulary as the trainer built it (spec key
 * vocab=, default unpadded), pipeline stages, Megatron-core parameter names);
 * inference ranks want it in vLLM layout (qkv_proj with KV-head
 * replication, gate_up_proj, vocabulary padded to 64, DP replicas). The
 * geometry comes from a HuggingFace config.json (real shapes, fewer layers
 * with --layers). One plan is created; each step the trainers "train"
 * (every weight changes deterministically with the step), the plan runs,
 * and every inference rank checks every element it holds and that the
 * padding around them was left alone.
 *
 *   mpirun -np 8 rl_weight_sync --model-config configs/Qwen2.5-0.5B.json \
 *       --layers 4 --train tp=2,pp=2 --infer tp=2,dp=2 --steps 5
 *
 * Trainer ranks come first in MPI_COMM_WORLD, then inference ranks. It uses
 * only installed headers (reshard.h, reshard_mpi.h, reshard_models.h,
 * reshard_selftest.h) and watchdog.h beside it: copy both from
 * share/reshard/examples and build against an installed reshard (docs/API.md,
 * "Use reshard from your own project").
 *
 * It never hangs: reshard's calls end at their deadline, any failure ends
 * the job (MPI_Abort), and the example's own MPI calls are under the
 * watchdog (watchdog.h), so a rank that stops ends mpirun non-zero within
 * RESHARD_TIMEOUT_MS + 5 s. */
#define _POSIX_C_SOURCE 200809L /* watchdog.h: clock_gettime, nanosleep (with -std=c11) */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "reshard_models.h"
#include "reshard.h"
#include "reshard_mpi.h"
#include "reshard_selftest.h"
#include "watchdog.h"

typedef struct args {
  const char *config;
  int layers, steps;
  const char *train, *infer;
  size_t staging;
} args;

static int rank, nranks;

static void die(const char *what, reshard_result_t r) {
  fprintf(stderr, "rank %d: %s failed: %s\n  %s\n", rank, what, reshard_result_string(r), reshard_last_error());
  MPI_Abort(MPI_COMM_WORLD, 1);
}

static void parse(int argc, char **argv, args *a) {
  a->config = "configs/Qwen2.5-0.5B.json";
  a->layers = 4;
  a->steps = 5;
  a->train = "tp=2,pp=2";
  a->infer = "tp=2,dp=2";
  a->staging = (size_t)64 << 20;
  for (int i = 1; i < argc; i++) {
    const char *o = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
    if (!v) goto usage;
    if (!strcmp(o, "--model-config")) a->config = v;
    else if (!strcmp(o, "--layers")) a->layers = atoi(v);
    else if (!strcmp(o, "--steps")) a->steps = atoi(v);
    else if (!strcmp(o, "--train")) a->train = v;
    else if (!strcmp(o, "--infer")) a->infer = v;
    else if (!strcmp(o, "--staging-mib")) a->staging = (size_t)atol(v) << 20;
    else goto usage;
    i++;
  }
  if (a->steps >= 1) return;
usage:
  if (rank == 0)
    fprintf(stderr, "usage: rl_weight_sync [--model-config FILE] [--layers N] [--train SPEC] [--infer SPEC] "
                    "[--steps K] [--staging-mib M]\n");
  MPI_Abort(MPI_COMM_WORLD, 2);
}

int main(int argc, char **argv) {
  MPI_Init(&argc, &argv);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &nranks);
  wd_start(rank);
  args a;
  parse(argc, argv, &a);

  /* Every rank reads the same config and builds both layouts: the global
   * description reshard needs (and checks, by digest, that all agree on). */
  rm_model *model;
  rm_parallel tp, ip;
  reshard_result_t r;
  if ((r = rm_model_load(a.config, a.layers, RESHARD_BF16, &model))) die("reading the model config", r);
  if ((r = rm_parse_parallel(a.train, &tp))) die("--train", r);
  if ((r = rm_parse_parallel(a.infer, &ip))) die("--infer", r);
  int ntrain = rm_parallel_ranks(&tp), ninfer = rm_parallel_ranks(&ip);
  if (ntrain + ninfer != nranks) {
    if (rank == 0)
      fprintf(stderr, "rl_weight_sync: --train needs %d ranks and --infer %d: run with mpirun -np %d\n", ntrain, ninfer,
              ntrain + ninfer);
    MPI_Abort(MPI_COMM_WORLD, 2);
  }
  reshard_layout_t *src, *dst;
  if ((r = rm_megatron_layout(model, &tp, 0, &src))) die("megatron layout", r);
  if ((r = rm_vllm_layout(model, &ip, ntrain, &dst))) die("vllm layout", r);

  reshard_comm_t *comm;
  wd_enter("reshard_comm_create_mpi (MPI_Comm_dup)");
  if ((r = reshard_comm_create_mpi(MPI_COMM_WORLD, &comm))) die("comm_create_mpi", r);
  wd_leave();
  reshard_options_t opts = RESHARD_OPTIONS_INITIALIZER;
  opts.staging_bytes = a.staging;
  reshard_plan_t *plan;
  WD_CALL(MPI_Barrier(MPI_COMM_WORLD));
  double t0 = MPI_Wtime();
  if ((r = reshard_plan_create(comm, src, dst, &opts, &plan))) die("plan_create", r);
  double plan_s = MPI_Wtime() - t0, plan_max;
  WD_CALL(MPI_Reduce(&plan_s, &plan_max, 1, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD));

  /* This rank's weights (trainer) or inference buffers. */
  reshard_selftest_t train_bufs, infer_bufs;
  if (reshard_selftest_alloc(&train_bufs, src, rank, -1) || reshard_selftest_alloc(&infer_bufs, dst, rank, -1))
    die("allocating buffers", RESHARD_ERROR_OUT_OF_MEMORY);
  reshard_buffer_t *src_bufs = calloc((size_t)train_bufs.nbuf + 1, sizeof *src_bufs);
  reshard_buffer_t *dst_bufs = calloc((size_t)infer_bufs.nbuf + 1, sizeof *dst_bufs);
  if (!src_bufs || !dst_bufs) die("allocating buffer tables", RESHARD_ERROR_OUT_OF_MEMORY);
  for (int b = 0; b < train_bufs.nbuf; b++) src_bufs[b] = (reshard_buffer_t){train_bufs.ptr[b], train_bufs.bytes[b]};
  for (int b = 0; b < infer_bufs.nbuf; b++) dst_bufs[b] = (reshard_buffer_t){infer_bufs.ptr[b], infer_bufs.bytes[b]};
  double mine = 0, delivered = 0;
  for (size_t i = 0; i < infer_bufs.nfrags; i++) {
    double n = (double)reshard_dtype_size(RESHARD_BF16);
    for (int d = 0; d < infer_bufs.frags[i].ndim; d++) n *= (double)infer_bufs.frags[i].extent[d];
    mine += n;
  }
  WD_CALL(MPI_Allreduce(&mine, &delivered, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD));

  reshard_plan_stats_t st;
  reshard_plan_get_stats(plan, &st);
  reshard_plan_stats_t *all = rank == 0 ? calloc((size_t)nranks, sizeof *all) : NULL;
  WD_CALL(MPI_Gather(&st, (int)sizeof st, MPI_BYTE, all, (int)sizeof st, MPI_BYTE, 0, MPI_COMM_WORLD));
  if (rank == 0) {
    printf("# rl_weight_sync: %s (%s), %d layers, %.1f M parameters, %d tensors, bf16\n", a.config, rm_model_arch(model),
           rm_model_layers(model), (double)rm_model_num_params(model) / 1e6, rm_model_num_tensors(model));
    printf("# trainer megatron %s on ranks 0-%d -> inference vllm %s on ranks %d-%d, MPI\n", a.train, ntrain - 1, a.infer,
           ntrain, nranks - 1);
    printf("# plan created in %.1f ms (slowest rank)\n", 1e3 * plan_max);
    printf("#  rank  side    send_MiB  recv_MiB  local_MiB  peers_out  peers_in  msgs_out  msgs_in  rounds\n");
    for (int i = 0; i < nranks; i++)
      printf("   %4d  %-6s %9.2f %9.2f %10.2f %10d %9d %9zu %8zu %7d\n", i, i < ntrain ? "train" : "infer",
             all[i].send_bytes / 1048576.0, all[i].recv_bytes / 1048576.0, all[i].local_copy_bytes / 1048576.0,
             all[i].num_send_peers, all[i].num_recv_peers, all[i].send_messages, all[i].recv_messages, all[i].num_chunks);
    printf("#  step   delivered_MiB   sync_ms   algbw_GB/s   wrong\n");
  }

  long total_wrong = 0;
  for (int step = 0; step < a.steps; step++) {
    reshard_selftest_fill(&train_bufs, src, (uint64_t)step); /* the optimizer step */
    WD_CALL(MPI_Barrier(MPI_COMM_WORLD));
    double s0 = MPI_Wtime();
    /* each buffer with its size (a short one is refused before anything
     * moves), the step as the weight version (versions start at 1) */
    r = reshard_plan_execute_sized(plan, (uint64_t)step + 1, src_bufs, (size_t)train_bufs.nbuf, dst_bufs,
                                   (size_t)infer_bufs.nbuf, NULL);
    double s = MPI_Wtime() - s0, smax;
    if (r) die("plan_execute", r);
    long bad = (long)reshard_selftest_check(&infer_bufs, dst, rank, (uint64_t)step, "rl_weight_sync"), wrong;
    WD_CALL(MPI_Reduce(&s, &smax, 1, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD));
    WD_CALL(MPI_Allreduce(&bad, &wrong, 1, MPI_LONG, MPI_SUM, MPI_COMM_WORLD));
    total_wrong += wrong;
    if (rank == 0) {
      printf("   %4d   %13.2f   %7.2f   %10.2f   %5ld\n", step, delivered / 1048576.0, 1e3 * smax, delivered / smax / 1e9,
             wrong);
      fflush(stdout); /* a line per step as it happens, also into a pipe */
    }
  }
  if (rank == 0)
    printf("# rl_weight_sync: %s (%d steps; every destination element and padding byte checked)\n",
           total_wrong ? "FAILED" : "OK", a.steps);

  free(all);
  free(src_bufs);
  free(dst_bufs);
  reshard_selftest_free(&train_bufs);
  reshard_selftest_free(&infer_bufs);
  reshard_plan_destroy(plan);
  reshard_comm_destroy(comm);
  reshard_layout_destroy(src);
  reshard_layout_destroy(dst);
  rm_model_free(model);
  WD_CALL(MPI_Finalize());
  return total_wrong != 0;
}
