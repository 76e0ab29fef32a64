/* plan_bench: plan-creation time and memory of one rank, at scale, without
 * MPI.
 *
 * Planning is collective only through one agreement allreduce, so one
 * process can play any single rank: a fake communicator (fake_comm.h)
 * reports the wanted rank and size and lets the allreduce return this
 * rank's own values. The plan computed is the one that rank computes in a
 * real run, except that the chunk size derives from this rank's peer count
 * instead of the maximum over all ranks (message counts may differ, bytes
 * do not).
 *
 * Memory: each measurement runs in a forked child that returns freed heap
 * to the system (malloc_trim), resets the peak RSS (writing 5 to
 * /proc/self/clear_refs), creates the plan and reads VmHWM: peak = VmHWM -
 * VmRSS before planning. "plan_MiB" is the heap the finished plan retains
 * (mallinfo2 delta).
 *
 * --rejoin (issue 46): per rank, the planning cost of a replica's join
 * with kept plans: the newcomer's reshard_plan_create on a communicator
 * that replaces ranks (as UCX: the creation's collectives are recorded
 * for a rejoin) and a staying rank's reshard_plan_rejoin of that plan
 * (the kept side's local work, the transcript replayed; the fake
 * allreduce costs nothing, so the agreements' network latency is not in
 * it). --topology NAME plans these with a topology preset (relay -1: a
 * direct and a relay candidate, and spreading where the cost model
 * wants it), as a deployment does. Medians of N.
 *
 *   plan_bench [--scenario a|b|c|d|e|all] [--rank R[,R...]|all] [--reps N] [--config-dir DIR] [--rejoin
 *              [--topology NAME]]
 */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "fake_comm.h"
#include "plan_measure.h"
#include "proc_stats.h"
#include "reshard_models.h"
#include "reshard.h"

typedef struct scenario {
  const char *key, *name;
  const char *config; /* in the config directory */
  const char *train, *infer;
  int colocate;
  double target_ms, target_mib;
  int per_expert, block_scales; /* the model front-end's options */
} scenario;

/* The planning benchmark: real geometries from the shipped public
 * configs (Llama-3.1-70B: 80 layers, hidden 8192, 64/8 heads, MLP 28672,
 * vocab 128256; Kimi-K2: deepseek_v3 with MLA, 61 layers, hidden 7168,
 * 384 experts of 2048, vocab 163840). */
static const scenario scenarios[] = {
    {"a", "Llama-3-70B  megatron tp8 pp4 dp2 -> vllm tp8 dp8", "Llama-3.1-70B.json", "tp=8,pp=4,dp=2", "tp=8,dp=8",
     0, 50.0, 64.0, 0, 0},
    {"b", "1T MoE (Kimi-K2)  megatron tp2 pp8 dp16 ep32 -> vllm tp8 dp16 ep128", "Kimi-K2-Instruct.json",
     "tp=2,pp=8,dp=16,ep=32,etp=1,first=5", "tp=8,dp=16,ep=128", 0, 1000.0, 256.0, 0, 0},
    /* The checkpoint's own tensors: one per expert and projection, fp8
     * with a weight_scale_inv each (139583 tensors), on 2048 ranks; and
     * the same colocated on 1024. */
    {"c", "1T MoE (Kimi-K2) per-expert fp8 + block scales  megatron tp8 pp16 dp8 ep64 -> vllm tp8 dp128 ep1024",
     "Kimi-K2-Instruct.json", "tp=8,pp=16,dp=8,ep=64,etp=1,first=1", "tp=8,dp=128,ep=1024", 0, 1000.0, 256.0, 1, 1},
    {"d", "1T MoE (Kimi-K2) per-expert fp8 + block scales, colocated  megatron tp8 pp16 dp8 ep64 -> vllm tp8 dp128 ep1024",
     "Kimi-K2-Instruct.json", "tp=8,pp=16,dp=8,ep=64,etp=1,first=1", "tp=8,dp=128,ep=1024", 1, 1000.0, 256.0, 1, 1},
    /* The panel's first row (scripts/panel.sh) without its topology (a
     * UCX job gives none unless asked: --rejoin --topology gb200-nvl72
     * plans the join with the panel's); 256 ranks. Target: issue 46's
     * join in under 1 s of planning. */
    {"e", "DeepSeek-V3 671B  megatron tp1 pp4 dp32 ep16 -> vllm tp8 dp16 (no topology)", "DeepSeek-V3.json",
     "tp=1,pp=4,dp=32,ep=16,first=16", "tp=8,dp=16", 0, 1000.0, 256.0, 0, 0},
};
#define NSCEN (int)(sizeof scenarios / sizeof scenarios[0])

static double now_ms(void) { return ps_clock_ms(CLOCK_MONOTONIC); }
/* Planning is single-threaded: its CPU time is its wall time on an idle
 * machine, and unlike wall time it survives a loaded one. */
static double cpu_ms(void) { return ps_clock_ms(CLOCK_THREAD_CPUTIME_ID); }

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

static const char *config_dir = RESHARD_CONFIG_DIR;

static const char *role(int S, int D, int colocate, int rank) {
  int first_dst = colocate ? 0 : S;
  int in_src = rank < S, in_dst = rank >= first_dst && rank < first_dst + D;
  return in_src && in_dst ? "both" : in_src ? "src" : in_dst ? "dst" : "none";
}

/* A scenario's model and the two sides' parallel specs; 1 (said) when
 * they cannot be read. */
static int load_scenario(const scenario *s, rm_model **model, rm_parallel *tp, rm_parallel *ip) {
  char path[4096];
  snprintf(path, sizeof path, "%s/%s", config_dir, s->config);
  rm_model_options mo = RM_MODEL_OPTIONS_INIT;
  mo.per_expert = s->per_expert;
  mo.block_scales = s->block_scales;
  if (rm_model_load_ex(path, &mo, model) || rm_parse_parallel(s->train, tp) || rm_parse_parallel(s->infer, ip)) {
    fprintf(stderr, "scenario %s: %s\n", s->key, reshard_last_error());
    return 1;
  }
  return 0;
}

/* Both sides' layouts, built reps times: layout construction is timed
 * apart from planning, as the median of reps builds (the first one also
 * pays for faulting in the heap). 1 when they cannot be built. */
static int build_layouts(const scenario *s, const rm_model *model, const rm_parallel *tp, const rm_parallel *ip, int S,
                         int reps, reshard_layout_t **src, reshard_layout_t **dst, double *layout_ms) {
  double *lt = malloc((size_t)reps * sizeof *lt);
  if (!lt) return 1;
  for (int k = 0; k < reps; k++) {
    reshard_layout_destroy(*src);
    reshard_layout_destroy(*dst);
    *src = *dst = NULL;
    double t0 = now_ms();
    if (rm_megatron_layout(model, tp, 0, src) || rm_vllm_layout(model, ip, s->colocate ? 0 : S, dst)) {
      fprintf(stderr, "scenario %s: building layouts failed: %s\n", s->key, reshard_last_error());
      free(lt);
      return 1;
    }
    lt[k] = now_ms() - t0;
  }
  qsort(lt, (size_t)reps, sizeof *lt, cmp_double);
  *layout_ms = lt[reps / 2];
  free(lt);
  return 0;
}

/* Every tensor of the model in its own dtype, scales included. */
static double model_bytes(const rm_model *model) {
  double bytes = 0;
  for (int i = 0; i < rm_model_num_tensors(model); i++) {
    const rm_tensor *t = rm_model_tensor(model, i);
    double n = (double)reshard_dtype_size(t->dtype);
    for (int d = 0; d < t->ndim; d++) n *= (double)t->shape[d];
    bytes += n;
  }
  return bytes;
}

static void print_header(const scenario *s, const rm_model *model, int nranks, int S, int D, double layout_ms) {
  printf("\n# scenario %s: %s\n", s->key, s->name);
  printf("# ranks %d (source %d, destination %d%s), tensors %d, params %.3fB (%.1f GiB), layouts built in %.2f ms\n",
         nranks, S, D, s->colocate ? ", colocated" : "", rm_model_num_tensors(model),
         (double)rm_model_num_params(model) / 1e9, model_bytes(model) / (1 << 30), layout_ms);
  printf("# target: plan <= %.0f ms and <= %.0f MiB per rank\n", s->target_ms, s->target_mib);
  printf("%6s %5s %9s %9s %9s %9s %9s %10s %10s %8s %8s %8s %7s\n", "rank", "role", "cpu_ms", "plan_ms", "plan_min", "peak_MiB",
         "plan_MiB", "send_MiB", "recv_MiB", "send_msg", "recv_msg", "segments", "target");
}

/* The worst rank of a scenario by CPU time and by peak memory. */
typedef struct worst {
  double ms, mib;
  int ms_rank, mib_rank;
} worst;

/* Plans rank reps times more: the median wall time (*med), the fastest
 * (*mn) and the median CPU time (*cmed) of those that succeeded; left as
 * they are when none did. */
static void time_reps(const reshard_layout_t *src, const reshard_layout_t *dst, int rank, int nranks,
                      const reshard_options_t *opts, int reps, double *med, double *mn, double *cmed) {
  double *t = malloc(2 * (size_t)reps * sizeof *t), *c = t + reps;
  int done = 0;
  for (int k = 0; t && k < reps; k++) {
    reshard_plan_t *plan = NULL;
    reshard_comm_t *comm = NULL;
    double t0 = now_ms(), c0 = cpu_ms();
    if (pm_plan_rank(src, dst, rank, nranks, opts, &comm, &plan) == RESHARD_SUCCESS) {
      t[done] = now_ms() - t0;
      c[done] = cpu_ms() - c0;
      done++;
    }
    pm_plan_free(comm, plan);
  }
  if (done) {
    qsort(t, (size_t)done, sizeof *t, cmp_double);
    qsort(c, (size_t)done, sizeof *c, cmp_double);
    *med = t[done / 2];
    *mn = t[0];
    *cmed = c[done / 2];
  }
  free(t);
}

/* --rejoin: rank's plan created on a plain fake communicator, then on
 * one that replaces ranks (the newcomer's cost on UCX: the creation is
 * recorded, plan/transcript.c), then rejoined as a kept plan (a staying
 * rank's cost: the transcript replayed), with --topology's preset if any,
 * reps times, in thread CPU time; prints the medians. Returns 1 on a
 * failure. */
static const char *rejoin_topology; /* --topology */

static int rejoin_rank(const reshard_layout_t *src, const reshard_layout_t *dst, int rank, int nranks, int reps) {
  double ms[3][64];
  if (reps > 64) reps = 64;
  for (int i = 0; i < reps; i++) {
    reshard_comm_t *comm = NULL, *plain = NULL;
    reshard_plan_t *plan = NULL, *p0 = NULL;
    reshard_options_t opts = RESHARD_OPTIONS_INITIALIZER;
    opts.topology = rejoin_topology; /* relay -1: both candidates, and spreading where wanted */
    reshard_result_t r = bench_fake_comm_create(rank, nranks, &plain);
    if (!r) r = bench_fake_comm_create_replacing(rank, nranks, &comm);
    double t0 = cpu_ms();
    if (!r) r = reshard_plan_create(plain, src, dst, &opts, &p0);
    double t1 = cpu_ms();
    if (!r) r = reshard_plan_create(comm, src, dst, &opts, &plan);
    double t2 = cpu_ms();
    if (!r) bench_fake_comm_rejoined(comm);
    if (!r) r = reshard_plan_rejoin(plan);
    double t3 = cpu_ms();
    if (r) printf("%6d  rejoin: %s: %s\n", rank, reshard_result_string(r), reshard_last_error());
    reshard_plan_destroy(p0);
    reshard_plan_destroy(plan);
    reshard_comm_destroy(plain);
    reshard_comm_destroy(comm);
    if (r) return 1;
    ms[0][i] = t1 - t0, ms[1][i] = t2 - t1, ms[2][i] = t3 - t2;
  }
  for (int k = 0; k < 3; k++) qsort(ms[k], (size_t)reps, sizeof ms[k][0], cmp_double);
  printf("%6d  join (CPU ms, medians of %d): plan_create %.2f, as on UCX (recorded) %.2f, a kept plan's "
         "plan_rejoin %.3f\n", rank, reps, ms[0][reps / 2], ms[1][reps / 2], ms[2][reps / 2]);
  return 0;
}

/* One rank's row: measured in a child, then timed reps times; returns 1
 * when its plan failed or it missed a target. */
static int bench_rank(const scenario *s, const reshard_layout_t *src, const reshard_layout_t *dst, int rank, int nranks,
                      int S, int D, int reps, worst *w) {
  pm_result m;
  reshard_options_t opts = RESHARD_OPTIONS_INITIALIZER;
  pm_measure(src, dst, rank, nranks, &opts, &m);
  if (!m.ok) {
    printf("%6d %5s  plan failed: %s\n", rank, role(S, D, s->colocate, rank), m.err);
    return 1;
  }
  double med = m.plan_ms, mn = m.plan_ms, cmed = m.cpu_ms;
  time_reps(src, dst, rank, nranks, &opts, reps, &med, &mn, &cmed);
  if (cmed > w->ms) w->ms = cmed, w->ms_rank = rank;
  if (m.peak_mib > w->mib) w->mib = m.peak_mib, w->mib_rank = rank;
  int met = cmed <= s->target_ms && m.peak_mib <= s->target_mib;
  printf("%6d %5s %9.2f %9.2f %9.2f %8.1f%s %9.2f %10.1f %10.1f %8zu %8zu %8zu %7s\n", rank, role(S, D, s->colocate, rank), cmed, med, mn,
         m.peak_mib, m.peak_exact ? " " : "?", m.plan_mib, (double)m.stats.send_bytes / 1048576.0,
         (double)m.stats.recv_bytes / 1048576.0, m.stats.send_messages, m.stats.recv_messages, m.stats.segments,
         met ? "met" : "MISSED");
  return !met;
}

static int rejoin_too; /* --rejoin */

static int run_scenario(const scenario *s, const int *ranks_req, int nranks_req, int all_ranks, int reps) {
  reshard_layout_t *src = NULL, *dst = NULL;
  rm_model *model = NULL;
  rm_parallel tp, ip;
  double layout_ms = 0;
  if (load_scenario(s, &model, &tp, &ip)) {
    rm_model_free(model);
    return 1;
  }
  int S = rm_parallel_ranks(&tp), D = rm_parallel_ranks(&ip);
  int nranks = s->colocate ? (S > D ? S : D) : S + D;
  int *ranks = (int *)ranks_req;
  if (build_layouts(s, model, &tp, &ip, S, reps, &src, &dst, &layout_ms) ||
      (all_ranks && !(ranks = malloc((size_t)nranks * sizeof *ranks)))) {
    reshard_layout_destroy(src);
    reshard_layout_destroy(dst);
    rm_model_free(model);
    return 1;
  }
  if (all_ranks) {
    nranks_req = nranks;
    for (int i = 0; i < nranks; i++) ranks[i] = i;
  }
  worst w = {0, 0, -1, -1};
  print_header(s, model, nranks, S, D, layout_ms);
  int failures = 0;
  for (int i = 0; i < nranks_req; i++) {
    int rank = ranks[i];
    if (rank < 0 || rank >= nranks) {
      printf("%6d  (outside the %d ranks: skipped)\n", rank, nranks);
      continue;
    }
    failures += bench_rank(s, src, dst, rank, nranks, S, D, reps, &w);
    if (rejoin_too) failures += rejoin_rank(src, dst, rank, nranks, reps);
  }
  if (nranks_req > 1)
    printf("# worst: plan %.2f ms CPU (rank %d), peak %.1f MiB (rank %d)\n", w.ms, w.ms_rank, w.mib, w.mib_rank);
  if (ranks != ranks_req) free(ranks);
  reshard_layout_destroy(src);
  reshard_layout_destroy(dst);
  rm_model_free(model);
  return failures;
}

static void usage(const char *argv0) {
  fprintf(stderr,
          "usage: %s [--scenario a|b|c|d|e|all] [--rank R[,R...]|all] [--reps N] [--config-dir DIR] [--rejoin\n"
          "       [--topology NAME]]\n"
          "  a: Llama-3-70B, megatron tp8 pp4 dp2 (64) -> vllm tp8 dp8 (64)\n"
          "  b: 1T MoE (Kimi-K2), megatron tp2 pp8 dp16 ep32 (256) -> vllm tp8 dp16 ep128 (128)\n"
          "  c: Kimi-K2 per-expert, fp8 + block scales (139583 tensors), megatron tp8 pp16 dp8\n"
          "     ep64 etp1 first=1 (1024) -> vllm tp8 dp128 ep1024 (1024)\n"
          "  d: c colocated (both sides on the same 1024 ranks)\n"
          "  e: DeepSeek-V3, megatron tp1 pp4 dp32 ep16 (128) -> vllm tp8 dp16 (128), no topology\n"
          "  --rejoin: per rank also the newcomer's plan creation as on UCX and a kept plan's\n"
          "     reshard_plan_rejoin (issue 46: a replica's join); --topology NAME: those with a\n"
          "     topology preset (e.g. gb200-nvl72: relay -1 builds two candidates)\n"
          "  geometries from the shipped configs (default directory: the source tree's configs/)\n"
          "  cpu_ms is the median CPU time of N plan creations (default 5), plan_ms their\n"
          "  median wall time, plan_min the fastest; targets are judged on cpu_ms (wall\n"
          "  time on an idle machine, robust on a loaded one) and peak_MiB,\n"
          "  the peak RSS growth while planning ('?': the peak could not be reset).\n"
          "  Exit status 1 when a target is missed or a plan fails.\n",
          argv0);
}

int main(int argc, char **argv) {
  const char *which = "all";
  int ranks[64] = {0}, nr = 1, reps = 5, all_ranks = 0;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--scenario") && i + 1 < argc) {
      which = argv[++i];
    } else if (!strcmp(argv[i], "--rank") && i + 1 < argc && !strcmp(argv[i + 1], "all")) {
      all_ranks = 1;
      i++;
    } else if (!strcmp(argv[i], "--rank") && i + 1 < argc) {
      nr = 0;
      for (char *p = argv[++i]; *p && nr < 64;) {
        char *end;
        long v = strtol(p, &end, 10);
        if (end == p) {
          usage(argv[0]);
          return 2;
        }
        ranks[nr++] = (int)v;
        p = *end == ',' ? end + 1 : end;
      }
    } else if (!strcmp(argv[i], "--rejoin")) {
      rejoin_too = 1;
    } else if (!strcmp(argv[i], "--topology") && i + 1 < argc) {
      rejoin_topology = argv[++i];
    } else if (!strcmp(argv[i], "--config-dir") && i + 1 < argc) {
      config_dir = argv[++i];
    } else if (!strcmp(argv[i], "--reps") && i + 1 < argc) {
      reps = atoi(argv[++i]);
      if (reps < 1) reps = 1;
    } else {
      usage(argv[0]);
      return 2;
    }
  }
  int failures = 0, ran = 0;
  for (int i = 0; i < NSCEN; i++)
    if (!strcmp(which, "all") || !strcmp(which, scenarios[i].key)) {
      failures += run_scenario(&scenarios[i], ranks, nr, all_ranks, reps);
      ran++;
    }
  if (!ran) {
    usage(argv[0]);
    return 2;
  }
  return failures ? 1 : 0;
}
