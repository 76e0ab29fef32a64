/* reshard_plan --replay-out FILE: every rank's executable schedule, for
 * tools/reshard_replay (a SimGrid replay of the plan's own messages,
 * rounds and dependencies on a simulated network).
 *
 * What is written is exactly what the schedule (src/exec/schedule.c:
 * rs_sched_run, rs_sched_deps, rs_sched_xfers) and a replaying executor
 * read of a plan: nrounds, the sends and receives (peer, round, bytes,
 * fwd, ncopies for verify mode's sums, direct: whether the host executor
 * lands the receive in place), max_round_msgs, the agreement's
 * partners (peers[].peer), nlocal_copies and the option flags. The round
 * start arrays (send_round, recv_round) are not written: they are the
 * messages' rounds, which are sorted (plan.h), and rp_add checks that
 * they say so. A call runs its pre-plans before its main plan
 * (src/api/stages.c): fp8 quantization's gathering pre-plan, then
 * source-side spreading's, then the main plan; each is written as a
 * stage, in that order. The format (text, one record a line) is in
 * tools/README.md. */
#ifndef RESHARD_TOOLS_PLAN_REPLAY_H
#define RESHARD_TOOLS_PLAN_REPLAY_H

#include "reshard.h"

typedef struct rp_writer rp_writer;

/* A writer for a world of `world` ranks (records kept in a temporary
 * file until rp_write); NULL when out of memory or without $TMPDIR. */
rp_writer *rp_create(int world);
/* One rank's plan. Ranks come in rank order; only a rank's first plan
 * counts (the tool may walk the same plans twice). */
reshard_result_t rp_add(rp_writer *w, int rank, const reshard_plan_t *plan);
/* The most stages a call runs: the gathering and spreading pre-plans
 * and the main plan (tools/reshard_replay.c reads as many). */
enum { RP_MAX_STAGES = 3 };
/* Writes the whole world to path: the n stages a call runs, in that order
 * (stages[n - 1]: the main plan's writer); 0, or -1 with a message on
 * stderr (a rank missing, an I/O error). */
int rp_write(rp_writer *const *stages, int n, const char *path);
void rp_free(rp_writer *w);

#endif
