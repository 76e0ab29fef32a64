/* Every rank of a job planned in one process, each piece of work once.
 *
 * The single-process tools (reshard_plan, the cost model's global
 * estimates) play every rank against a fake communicator whose allreduce
 * returns the rank's own values (fake_comm.h). What a real run agrees on
 * is then found in passes over the ranks, as the agreements compute it:
 *
 *   1. each rank's first stage (plan.h rs_plan_stage: the replica choice,
 *      the relay trees; nearly all of the planning work), kept in a stage
 *      store (stage_store.h); the largest spread, and the phases, wide
 *      threshold and pace from the largest estimates. What is the same
 *      for every rank is done once: the layouts' coverage check (before
 *      the pass) and the creation digest (the first rank's);
 *   2. each rank's chunk with those, from its stored stage: the smallest
 *      is the agreed chunk;
 *   3. each rank's plan with all of them, from its stored stage: exactly
 *      the plan that rank executes in a real run.
 *
 * The ranks of a pass run on several threads (each with its own fake
 * communicator; planning keeps no shared state), so a pass takes about
 * 1 / threads of its time on that many cores. */
#ifndef RESHARD_BENCH_PLAN_WORLD_H
#define RESHARD_BENCH_PLAN_WORLD_H

#include <stddef.h>
#include <stdint.h>

#include "reshard_internal.h"
#include "reshard.h"

/* Threads of every later run: n >= 1 (at most 64), or 0 for the CPUs
 * online (the default, at most 64). */
void pw_set_threads(int n);
int pw_threads(void);

/* What the ranks agree on (plan.h). */
typedef struct pw_agreed {
  int32_t spread, phases;
  uint64_t wide;
  rs_pace pace;
  size_t chunk;
  uint64_t est[RS_PHASE_CANDIDATES]; /* the largest phase estimates */
} pw_agreed;

typedef struct pw_run pw_run;

/* Passes 1 and 2 for one set of options. The options must not ask for the
 * automatic relay choice with a topology (options.relay -1): resolve it
 * first (plan_cost.h pc_choose_relay). An error names the rank. */
reshard_result_t pw_run_create(const reshard_layout_t *src, const reshard_layout_t *dst, int nranks,
                               const reshard_options_t *opts, pw_run **out);
const pw_agreed *pw_run_agreed(const pw_run *run);

/* on: a direct run (relay 0, no RESHARD_FLAG_FIRST_REPLICA) also makes,
 * in the same stage pass, the run of its options with
 * RESHARD_FLAG_FIRST_REPLICA (the cost model's replica0 baseline): each
 * box's holders are prepared once for both plans (plan.h
 * rs_plan_agreed.twin). The next pw_run_create for exactly those options
 * and layouts takes it instead of planning (one is kept: the last). off:
 * no more, and one not taken is freed. */
void pw_share_first_replica(int on);
/* Segments of rank's first stage: a measure of its planning work. */
size_t pw_run_segments(const pw_run *run, int rank);

/* Pass 3: each rank's plan, built on the threads, given to
 * in_order(rank, plan, arg) one rank at a time in rank order; it returns
 * non-zero to stop the pass (with reshard's error set). The plan is
 * destroyed after. Can be run again. */
typedef reshard_result_t (*pw_plan_fn)(int rank, reshard_plan_t *plan, void *arg);
reshard_result_t pw_run_plans(pw_run *run, pw_plan_fn in_order, void *arg);

void pw_run_free(pw_run *run);

/* Where the time goes (reshard_plan --profile): the CPU seconds of every
 * rank of every pass since the process started, summed by pass (stage,
 * chunk, plans) and by the class class_of(rank) gives (0 ..
 * PW_CLASSES - 1; NULL: all 0), with the wall seconds of the passes. */
enum { PW_PASS_STAGE, PW_PASS_CHUNK, PW_PASS_PLANS, PW_PASSES, PW_CLASSES = 4 };
typedef struct pw_profile {
  double cpu_s[PW_PASSES][PW_CLASSES];
  double max_rank_s[PW_PASSES][PW_CLASSES]; /* the most one rank took */
  long ranks[PW_PASSES][PW_CLASSES];
  double wall_s[PW_PASSES];
  int passes[PW_PASSES];
} pw_profile;
void pw_set_rank_class(int (*class_of)(int rank, void *arg), void *arg);
void pw_get_profile(pw_profile *out);

#endif
