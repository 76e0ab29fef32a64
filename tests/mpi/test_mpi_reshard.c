/* MPI integration test: real processes, the MPI transport, byte-exact.
 *
 * Every rank builds the same layouts, plans, executes a few steps and
 * checks every destination element it holds and every byte around them;
 * wrong counts are summed over ranks. Cases: random layout pairs (the
 * property-test generator), Megatron -> vLLM dense GQA and MoE models with
 * expert parallelism on both sides, and colocated variants, sized to the
 * world. Run under mpirun with 2, 4 or 8 ranks (ctest does all three).
 *
 *   mpirun -np 4 ./test_mpi_reshard [random_seeds]
 *
 * Prints one line per failing case and ends with "N passed, N failed". */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model_layouts.h"
#include "reshard.h"
#include "reshard_mpi.h"
#include "support/random_layout.h"
#include "verify.h"

static int world_rank, world_size;
static int passed, failed;

/* Runs one case on every rank; returns the summed bad count, or -1 when
 * any rank's call failed. */
static long run_case(reshard_comm_t *comm, const reshard_layout_t *src,
                     const reshard_layout_t *dst, size_t staging, int steps,
                     const char *name) {
  reshard_options_t opts = RESHARD_OPTIONS_INITIALIZER;
  if (staging) opts.staging_bytes = staging;
  opts.timeout_ms = 120000;
  reshard_plan_t *plan = NULL;
  long bad = 0, err = 0;
  reshard_result_t r = reshard_plan_create(comm, src, dst, &opts, &plan);
  if (r) {
    fprintf(stderr, "[%s] rank %d: plan_create: %s: %s\n", name, world_rank, reshard_result_string(r), reshard_last_error());
    err = 1;
  }
  vf_side s, d;
  if (vf_side_alloc(&s, src, world_rank, -1) || vf_side_alloc(&d, dst, world_rank, -1)) err = 1;
  for (int step = 0; step < steps && plan; step++) {
    vf_side_fill(&s, src, (uint64_t)step);
    r = reshard_plan_execute(plan, (void *const *)s.ptr, (size_t)s.nbuf, (void *const *)d.ptr, (size_t)d.nbuf, NULL);
    if (r) {
      fprintf(stderr, "[%s] rank %d step %d: execute: %s: %s\n", name, world_rank, step, reshard_result_string(r),
              reshard_last_error());
      err = 1;
      break;
    }
    bad += vf_side_check(&d, dst, world_rank, (uint64_t)step, name);
  }
  vf_side_free(&s);
  vf_side_free(&d);
  reshard_plan_destroy(plan);
  long v[2] = {bad, err}, sum[2];
  MPI_Allreduce(v, sum, 2, MPI_LONG, MPI_SUM, MPI_COMM_WORLD);
  long result = sum[1] ? -1 : sum[0];
  if (world_rank == 0) {
    if (result) {
      failed++;
      printf("FAILED %s: %s\n", name, result < 0 ? "a call failed" : "wrong bytes");
      fprintf(stdout, "  (%ld wrong elements or bytes over all ranks)\n", result < 0 ? 0 : result);
    } else {
      passed++;
    }
    fflush(stdout);
  }
  return result;
}

static void random_cases(reshard_comm_t *comm, int count) {
  int done = 0;
  for (uint64_t seed = 0; done < count && seed < (uint64_t)count * 20; seed++) {
    rl_pair p;
    if (rl_pair_make(seed * 7919 + 17, RL_ANY, &p)) {
      if (world_rank == 0) printf("FAILED generator for seed %llu\n", (unsigned long long)seed);
      failed++;
      continue;
    }
    if (p.nranks > world_size) {
      rl_pair_free(&p);
      continue;
    }
    char name[64];
    snprintf(name, sizeof name, "random seed %llu", (unsigned long long)(seed * 7919 + 17));
    long r = run_case(comm, p.src, p.dst, seed % 3 == 0 ? 4096 : 0, 2, name);
    if (r && world_rank == 0) rl_pair_print(&p, stdout);
    rl_pair_free(&p);
    done++;
  }
}

static void model_case(reshard_comm_t *comm, const char *name, const ml_model *m,
                       ml_megatron tr, ml_vllm in, int colocate, size_t staging) {
  reshard_layout_t *src = NULL, *dst = NULL;
  int n = 0;
  reshard_result_t r = ml_build_pair(m, &tr, &in, colocate, &src, &dst, &n);
  if (r || n > world_size) {
    if (world_rank == 0 && r) {
      printf("FAILED %s: layouts: %s\n", name, reshard_last_error());
      failed++;
    }
    reshard_layout_destroy(src);
    reshard_layout_destroy(dst);
    return;
  }
  run_case(comm, src, dst, staging, 3, name);
  reshard_layout_destroy(src);
  reshard_layout_destroy(dst);
}

int main(int argc, char **argv) {
  MPI_Init(&argc, &argv);
  MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world_size);
  int seeds = argc > 1 ? atoi(argv[1]) : 40;
  reshard_comm_t *comm = NULL;
  reshard_result_t r = reshard_comm_create_mpi(MPI_COMM_WORLD, &comm);
  if (r) {
    fprintf(stderr, "rank %d: comm_create_mpi: %s\n", world_rank, reshard_last_error());
    MPI_Abort(MPI_COMM_WORLD, 1);
  }

  random_cases(comm, seeds);

  /* A small GQA model (4 query heads per KV head) and a MoE model. */
  ml_model dense = {.layers = 4, .hidden = 64, .heads = 8, .kv_heads = 2, .head_dim = 8, .intermediate = 96,
                    .vocab = 1000, .dtype = RESHARD_BF16};
  ml_model moe = dense;
  moe.experts = 8;
  moe.moe_intermediate = 32;
  int n = world_size;
  if (n >= 8) {
    model_case(comm, "dense megatron tp2 pp2 -> vllm tp2 dp2", &dense, (ml_megatron){2, 2, 1, 1}, (ml_vllm){2, 2, 1}, 0, 0);
    model_case(comm, "dense megatron tp2 pp2 dp2 -> vllm tp4 (kv replication), colocated", &dense,
               (ml_megatron){2, 2, 2, 1}, (ml_vllm){4, 2, 1}, 1, 0);
    model_case(comm, "moe megatron tp2 pp2 ep2 -> vllm tp2 dp2 ep4", &moe, (ml_megatron){2, 2, 1, 2}, (ml_vllm){2, 2, 4}, 0,
               16384);
  }
  if (n >= 4) {
    model_case(comm, "dense megatron tp2 pp2 -> vllm tp4, colocated", &dense, (ml_megatron){2, 2, 1, 1}, (ml_vllm){4, 1, 1}, 1,
               0);
    model_case(comm, "moe megatron ep4 -> vllm tp2 dp2 ep2, colocated", &moe, (ml_megatron){1, 1, 4, 4},
               (ml_vllm){2, 2, 2}, 1, 8192);
    model_case(comm, "moe megatron tp1 pp2 dp1 -> vllm tp2", &moe, (ml_megatron){1, 2, 1, 1}, (ml_vllm){2, 1, 1}, 0, 0);
  }
  if (n >= 2) {
    model_case(comm, "dense megatron tp1 -> vllm tp1 (2 ranks)", &dense, (ml_megatron){1, 1, 1, 1}, (ml_vllm){1, 1, 1}, 0, 0);
    model_case(comm, "dense megatron tp2 -> vllm tp2 colocated", &dense, (ml_megatron){2, 1, 1, 1}, (ml_vllm){2, 1, 1}, 1, 4096);
  }

  reshard_comm_destroy(comm);
  if (world_rank == 0) printf("test_mpi_reshard (%d ranks): %d passed, %d failed\n", world_size, passed, failed);
  int rc = failed != 0;
  MPI_Bcast(&rc, 1, MPI_INT, 0, MPI_COMM_WORLD);
  MPI_Finalize();
  return rc;
}
