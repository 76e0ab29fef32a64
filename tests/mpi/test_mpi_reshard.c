/* MPI integration test: real processes, the MPI transport, byte-exact.
 *
 * Every rank builds the same layouts, plans, executes a few steps and
 * checks every destination element it holds and every byte around them;
 * wrong counts are summed over ranks. Cases: random layout pairs (the
 * property-test generator, a quarter of them converting dtypes), Megatron -> vLLM dense GQA and MoE models with
 * expert parallelism on both sides, colocated variants, and relay plans
 * (options.relay = 1: destination data-parallel replicas forward to each
 * other, flat and on the h100-8x400g topology), sized to the world; a
 * version mismatch and a call one rank rejects (its partners are told). Run under mpirun with 2, 4 or 8 ranks (ctest does all three).
 *
 *   mpirun -np 4 ./test_mpi_reshard [random_seeds]
 *
 * Prints one line per failing case and ends with "N passed, N failed". */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "reshard_models.h"
#include "plan/relay.h"
#include "reshard.h"
#include "reshard_mpi.h"
#include "support/random_layout.h"
#include "reshard_selftest.h"

static int world_rank, world_size;
static int passed, failed;
/* Options of the cases run now (relay_cases sets them). */
static int case_relay = -1;
static const char *case_topology;

/* Runs one case on every rank; returns the summed bad count, or -1 when
 * any rank's call failed. */
static long run_case(reshard_comm_t *comm, const reshard_layout_t *src,
                     const reshard_layout_t *dst, size_t staging, int steps,
                     const char *name) {
  reshard_options_t opts = RESHARD_OPTIONS_INITIALIZER;
  if (staging) opts.staging_bytes = staging;
  opts.timeout_ms = 120000;
  opts.relay = case_relay;
  opts.topology = case_topology;
  reshard_plan_t *plan = NULL;
  long bad = 0, err = 0;
  reshard_result_t r = reshard_plan_create(comm, src, dst, &opts, &plan);
  if (r) {
    fprintf(stderr, "[%s] rank %d: plan_create: %s: %s\n", name, world_rank, reshard_result_string(r), reshard_last_error());
    err = 1;
  }
  reshard_selftest_t s, d;
  if (reshard_selftest_alloc(&s, src, world_rank, -1) || reshard_selftest_alloc(&d, dst, world_rank, -1)) err = 1;
  for (int step = 0; step < steps && plan; step++) {
    reshard_selftest_fill(&s, src, (uint64_t)step);
    r = reshard_plan_execute(plan, (void *const *)s.ptr, (size_t)s.nbuf, (void *const *)d.ptr, (size_t)d.nbuf, NULL);
    if (r) {
      fprintf(stderr, "[%s] rank %d step %d: execute: %s: %s\n", name, world_rank, step, reshard_result_string(r),
              reshard_last_error());
      err = 1;
      break;
    }
    bad += reshard_selftest_check_from(&d, dst, src, world_rank, (uint64_t)step, name); /* converted tensors too */
  }
  reshard_selftest_free(&s);
  reshard_selftest_free(&d);
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
    /* every fourth pair converts dtypes: the casts through MPI's staging */
    rl_mode mode = seed % 4 == 3 ? RL_CASTS : RL_ANY;
    if (rl_pair_make(seed * 7919 + 17, mode, &p)) {
      if (world_rank == 0) printf("FAILED generator for seed %llu\n", (unsigned long long)seed);
      failed++;
      continue;
    }
    if (p.nranks > world_size) {
      rl_pair_free(&p);
      continue;
    }
    char name[64];
    snprintf(name, sizeof name, "random seed %llu%s", (unsigned long long)(seed * 7919 + 17), mode == RL_CASTS ? " (casts)" : "");
    long r = run_case(comm, p.src, p.dst, seed % 3 == 0 ? 4096 : 0, 2, name);
    if (r && world_rank == 0) rl_pair_print(&p, stdout);
    rl_pair_free(&p);
    done++;
  }
}

/* A model from tests/data (tiny geometries of real architectures) in
 * Megatron layout on the first ranks and vLLM layout after them (or on the
 * same ranks when colocated). Skipped when the world is too small. */
static void model_case(reshard_comm_t *comm, const char *config, const char *train, const char *infer, int colocate,
                       size_t staging) {
  char path[4096], name[256];
  snprintf(path, sizeof path, "%s/%s", RESHARD_TEST_DATA, config);
  snprintf(name, sizeof name, "%s megatron %s -> vllm %s%s%s%s", config, train, infer, colocate ? " colocated" : "",
           case_relay == 1 ? " relay " : "", case_topology ? case_topology : "");
  rm_model *m = NULL;
  rm_parallel tp, ip;
  reshard_layout_t *src = NULL, *dst = NULL;
  if (rm_model_load(path, 0, RESHARD_BF16, &m) || rm_parse_parallel(train, &tp) || rm_parse_parallel(infer, &ip)) {
    if (world_rank == 0) printf("FAILED %s: %s\n", name, reshard_last_error());
    failed++;
    rm_model_free(m);
    return;
  }
  int S = rm_parallel_ranks(&tp), D = rm_parallel_ranks(&ip);
  int need = colocate ? (S > D ? S : D) : S + D;
  if (need <= world_size) {
    if (rm_megatron_layout(m, &tp, 0, &src) || rm_vllm_layout(m, &ip, colocate ? 0 : S, &dst)) {
      if (world_rank == 0) printf("FAILED %s: layouts: %s\n", name, reshard_last_error());
      failed++;
    } else {
      run_case(comm, src, dst, staging, 3, name);
    }
  }
  reshard_layout_destroy(src);
  reshard_layout_destroy(dst);
  rm_model_free(m);
}

/* The per-execute agreement over MPI: one step everywhere, then the last
 * rank passes another version. Every rank partners with it (rows ->
 * columns), so every rank gets RESHARD_ERROR_MISMATCH, before any data
 * moves: destinations keep the first step. A new plan then works (stale
 * control messages of the failed call do not match it). */
/* Rows sharded on the source, columns on the destination: every rank
 * sends to every other one. */
static void all_to_all_layouts(reshard_layout_t *L[2]) {
  int64_t shape[2] = {4 * (int64_t)world_size, 4 * (int64_t)world_size};
  for (int side = 0; side < 2; side++) {
    int t, m, b;
    reshard_placement_t p[1] = {reshard_shard(side)};
    if (reshard_layout_create(&L[side]) || reshard_layout_add_tensor(L[side], "w", RESHARD_FP32, 2, shape, &t) ||
        reshard_layout_add_mesh_strided(L[side], 1, (int[]){world_size}, 0, 1, &m) ||
        reshard_layout_place(L[side], t, m, p, &b)) {
      fprintf(stderr, "rank %d: layouts: %s\n", world_rank, reshard_last_error());
      MPI_Abort(MPI_COMM_WORLD, 1);
    }
  }
}

static void report(const char *name, long bad, long err) {
  long v[2] = {bad, err}, sum[2];
  MPI_Allreduce(v, sum, 2, MPI_LONG, MPI_SUM, MPI_COMM_WORLD);
  if (world_rank == 0) {
    if (sum[0] || sum[1]) {
      failed++;
      printf("FAILED %s: %ld ranks with wrong results, %ld wrong elements or bytes\n", name, sum[1], sum[0]);
    } else {
      passed++;
    }
    fflush(stdout);
  }
}

static void version_mismatch_case(reshard_comm_t *comm) {
  const char *name = "version mismatch";
  reshard_layout_t *L[2];
  all_to_all_layouts(L);
  reshard_options_t o = RESHARD_OPTIONS_INITIALIZER;
  o.timeout_ms = 10000;
  long err = 0, bad = 0;
  reshard_selftest_t s, d;
  if (reshard_selftest_alloc(&s, L[0], world_rank, 1) || reshard_selftest_alloc(&d, L[1], world_rank, -1)) err = 1;
  for (int round = 0; round < 2 && !err; round++) {
    reshard_plan_t *plan = NULL;
    if (reshard_plan_create(comm, L[0], L[1], &o, &plan)) {
      fprintf(stderr, "[%s] rank %d: plan_create: %s\n", name, world_rank, reshard_last_error());
      err = 1;
      break;
    }
    reshard_result_t r = reshard_plan_execute_version(plan, 1, (void *const *)s.ptr, (size_t)s.nbuf,
                                                      (void *const *)d.ptr, (size_t)d.nbuf, NULL);
    if (r) err = 1;
    bad += reshard_selftest_check(&d, L[1], world_rank, 1, name);
    if (round == 0) {
      uint64_t v = world_rank == world_size - 1 ? 3 : 2;
      r = reshard_plan_execute_version(plan, v, (void *const *)s.ptr, (size_t)s.nbuf, (void *const *)d.ptr,
                                       (size_t)d.nbuf, NULL);
      const char *m = reshard_last_error();
      if (world_size > 1 && (r != RESHARD_ERROR_MISMATCH || !strstr(m, "version 3") || !strstr(m, "version 2"))) {
        fprintf(stderr, "[%s] rank %d: expected a mismatch, got %s: %s\n", name, world_rank,
                reshard_result_string(r), m);
        err = 1;
      }
      bad += reshard_selftest_check(&d, L[1], world_rank, 1, name); /* untouched */
    }
    reshard_plan_destroy(plan);
  }
  reshard_selftest_free(&s);
  reshard_selftest_free(&d);
  reshard_layout_destroy(L[0]);
  reshard_layout_destroy(L[1]);
  report(name, bad, err);
}

/* One rank passes a wrong buffer count: it gets its own error, and its
 * partners RESHARD_ERROR_REMOTE naming it at once (not their 10-second
 * deadline); no destination byte changes anywhere, and the plan is failed
 * on every rank. */
static void rejected_call_case(reshard_comm_t *comm) {
  const char *name = "rejected call";
  if (world_size < 2) return;
  reshard_layout_t *L[2];
  all_to_all_layouts(L);
  reshard_options_t o = RESHARD_OPTIONS_INITIALIZER;
  o.timeout_ms = 10000;
  long err = 0, bad = 0;
  const int culprit = world_size - 1;
  reshard_selftest_t s, d;
  reshard_plan_t *plan = NULL;
  if (reshard_selftest_alloc(&s, L[0], world_rank, 1) || reshard_selftest_alloc(&d, L[1], world_rank, -1) ||
      reshard_plan_create(comm, L[0], L[1], &o, &plan)) {
    fprintf(stderr, "[%s] rank %d: setup: %s\n", name, world_rank, reshard_last_error());
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  if (reshard_plan_execute_version(plan, 1, (void *const *)s.ptr, (size_t)s.nbuf, (void *const *)d.ptr,
                                   (size_t)d.nbuf, NULL))
    err = 1;
  bad += reshard_selftest_check(&d, L[1], world_rank, 1, name);
  const size_t nsrc = (size_t)s.nbuf + (world_rank == culprit); /* one too many */
  const double t0 = MPI_Wtime();
  reshard_result_t r =
      reshard_plan_execute_version(plan, 2, (void *const *)s.ptr, nsrc, (void *const *)d.ptr, (size_t)d.nbuf, NULL);
  const double took = MPI_Wtime() - t0;
  const char *m = reshard_last_error();
  char want[32];
  snprintf(want, sizeof want, "rank %d", culprit);
  if (world_rank == culprit ? (r == RESHARD_SUCCESS || r == RESHARD_ERROR_REMOTE || !strstr(m, "source buffers"))
                            : (r != RESHARD_ERROR_REMOTE || !strstr(m, want) || !strstr(m, "source buffers"))) {
    fprintf(stderr, "[%s] rank %d: got %s: %s\n", name, world_rank, reshard_result_string(r), m);
    err = 1;
  }
  if (took > 5.0) { /* the deadline is 10 s; being told takes milliseconds */
    fprintf(stderr, "[%s] rank %d: the rejection took %.1f s to arrive\n", name, world_rank, took);
    err = 1;
  }
  bad += reshard_selftest_check(&d, L[1], world_rank, 1, name); /* untouched: still step 1 */
  r = reshard_plan_execute_version(plan, 3, (void *const *)s.ptr, (size_t)s.nbuf, (void *const *)d.ptr,
                                   (size_t)d.nbuf, NULL);
  if (r == RESHARD_SUCCESS) {
    fprintf(stderr, "[%s] rank %d: the plan still runs after a rejected call\n", name, world_rank);
    err = 1;
  }
  bad += reshard_selftest_check(&d, L[1], world_rank, 1, name);
  reshard_plan_destroy(plan);
  reshard_selftest_free(&s);
  reshard_selftest_free(&d);
  reshard_layout_destroy(L[0]);
  reshard_layout_destroy(L[1]);
  report(name, bad, err);
}

/* Relay plans: every fragment relayed (no size threshold), destination
 * dp replicas forwarding over MPI with messages of several streams per
 * pair and round. */
static void relay_cases(reshard_comm_t *comm) {
  case_relay = 1;
  rs_relay_min_part_bytes = 0;
  model_case(comm, "tiny-llama.json", "tp=1", "tp=1,dp=3", 0, 0);
  model_case(comm, "tiny-llama.json", "tp=2", "tp=1,dp=2", 0, 4096);
  model_case(comm, "tiny-llama.json", "tp=2", "tp=2,dp=3", 0, 8192);
  model_case(comm, "tiny-llama.json", "tp=2", "tp=2,dp=4", 1, 0);
  model_case(comm, "tiny-qwen3-moe.json", "tp=2", "tp=1,dp=4,ep=4", 0, 0);
  case_topology = "h100-8x400g";
  model_case(comm, "tiny-llama.json", "tp=2", "tp=2,dp=3", 0, 0);
  case_topology = NULL;
  rs_relay_min_part_bytes = RS_RELAY_MIN_PART_DEFAULT;
  case_relay = -1;
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
  version_mismatch_case(comm);
  rejected_call_case(comm);

  /* A dense GQA model (4 query heads per KV head), a MoE model with
   * expert parallelism on both sides, and a deepseek_v3 model (MLA, shared
   * experts, first_k_dense_replace), in layouts sized to the world. */
  model_case(comm, "tiny-llama.json", "tp=1", "tp=1", 0, 0);
  model_case(comm, "tiny-llama.json", "tp=2", "tp=2", 1, 4096);
  model_case(comm, "tiny-qwen3-moe.json", "tp=1,pp=2", "tp=2", 0, 0);
  model_case(comm, "tiny-qwen3-moe.json", "dp=4,ep=4", "tp=2,dp=2,ep=4", 1, 8192);
  model_case(comm, "tiny-deepseek-v3.json", "tp=2", "tp=2", 0, 0);
  model_case(comm, "tiny-llama.json", "tp=2,pp=2", "tp=4", 1, 0);
  model_case(comm, "tiny-llama.json", "tp=2,pp=2", "tp=2,dp=2", 0, 0);
  model_case(comm, "tiny-llama.json", "tp=2,pp=2,dp=2", "tp=4,dp=2", 1, 0);
  model_case(comm, "tiny-qwen3-moe.json", "tp=2,pp=2,ep=2,etp=1", "tp=2,dp=2,ep=4", 0, 16384);
  model_case(comm, "tiny-deepseek-v3.json", "tp=2,pp=2,ep=2,etp=1", "tp=4,ep=4", 0, 0);
  model_case(comm, "tiny-deepseek-v3.json", "pp=2,dp=4,ep=4", "tp=2,dp=4,ep=8", 1, 4096);
  relay_cases(comm);

  reshard_comm_destroy(comm);
  if (world_rank == 0) printf("test_mpi_reshard (%d ranks): %d passed, %d failed\n", world_size, passed, failed);
  int rc = failed != 0;
  MPI_Bcast(&rc, 1, MPI_INT, 0, MPI_COMM_WORLD);
  MPI_Finalize();
  return rc;
}
