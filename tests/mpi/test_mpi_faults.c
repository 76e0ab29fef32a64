/* MPI fault tests: reshard never hangs when a peer stops or dies, and
 * ranks that disagree fail together before any data moves.
 *
 *   mpirun -np 4 ./test_mpi_faults stop      a rank is SIGSTOPped
 *   mpirun -np 4 ./test_mpi_faults exit      a rank _exit()s mid-transfer
 *   mpirun -np 4 ./test_mpi_faults mismatch  a rank passes another layout
 *   mpirun -np 4 ./test_mpi_faults late      a rank is late to plan creation
 *   mpirun -np 4 ./test_mpi_faults split     a rank is late to a commit
 *
 * Every rank that is expected to report prints exactly one line
 * "PASS rank R: ..." (with the measured return time) or "FAIL rank R: ...".
 * tests/mpi/run_fault_test.sh runs mpirun under `timeout` and counts the
 * PASS lines, so a hang, a crash or a missing report all fail the test.
 * stop, late and split also print each rank's final state (a STATE line,
 * state_line.h), which it compares across ranks.
 *
 * The transfer: one fp32 tensor of [64n, 64n] sharded by rows on the
 * source and by columns on the destination, so every rank exchanges 16 KiB
 * with every other; the 4 KiB staging budget cuts that into ~25 rounds.
 *
 * stop: the pids are exchanged, the plan is created (timeout_ms = 2000),
 * the last rank raise(SIGSTOP)s; the others execute and must return
 * TIMEOUT or REMOTE within the deadline + 1 s. Rank 0 then SIGCONTs it; the
 * resumed rank executes (its peers are gone from that call: TIMEOUT or
 * REMOTE, again within the deadline + 1 s). All ranks then meet in a
 * barrier and execute a second time: the failed call's leftovers (its
 * cancelled and unmatched messages) must not disturb the next call, which
 * must move every byte correctly. mpirun exits 0.
 *
 * exit: rank 1's transport is wrapped (a copy of the MPI ops table whose
 * isend and isend_boxes count their calls) so that it _exit(0)s on its 5th
 * send: after its whole first round (3 peers) and the first message of its
 * second round were posted. The survivors must return TIMEOUT, REMOTE or
 * BACKEND within the deadline + 1 s. A process that leaves without
 * MPI_Finalize makes Open MPI 4.1's mpirun kill the whole job at once
 * ("exiting improperly"), before the survivors' deadline, whatever its
 * exit status (--mca orte_abort_on_non_zero_status 0 does not help: status
 * 0 without MPI_Finalize is still improper). So the test runs mpirun with
 * --enable-recovery (the MCA parameter orte_enable_recovery=1), which keeps
 * the job alive after a process dies so that the survivors can report. The
 * survivors cannot finalize (MPI_Finalize's fence waits for the dead rank),
 * so they print their line and _exit(0); mpirun's exit status says nothing
 * then, and only the PASS lines count.
 *
 * mismatch: the last rank's destination splits the columns differently
 * (and, in a second case, its staging budget differs): plan creation must
 * return MISMATCH on every rank, with a message, and no plan.
 *
 * split: see run_split. */
#include <errno.h>
#include <mpi.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "reshard.h"
#include "reshard_mpi.h"
#include "transport/transport.h"
#include "reshard_selftest.h"
#include "fault_world.h"
#include "state_line.h"
#include "support/dying_send.h"

#define TIMEOUT_MS 2000
#define GRACE_MS 1000 /* allowed beyond the deadline */


static reshard_plan_t *make_plan(reshard_comm_t *comm, const reshard_layout_t *src, const reshard_layout_t *dst) {
  reshard_options_t opts = RESHARD_OPTIONS_INITIALIZER;
  opts.staging_bytes = 4096;
  opts.timeout_ms = TIMEOUT_MS;
  reshard_plan_t *plan = NULL;
  if (reshard_plan_create(comm, src, dst, &opts, &plan)) {
    fprintf(stderr, "rank %d: plan_create: %s\n", world_rank, reshard_last_error());
    MPI_Abort(MPI_COMM_WORLD, 2);
  }
  return plan;
}

/* Executes once, timed. */
static reshard_result_t timed_execute(const reshard_plan_t *plan, reshard_selftest_t *s, reshard_selftest_t *d, double *ms) {
  double t0 = now_ms();
  reshard_result_t r =
      reshard_plan_execute(plan, (void *const *)s->ptr, (size_t)s->nbuf, (void *const *)d->ptr, (size_t)d->nbuf, NULL);
  *ms = now_ms() - t0;
  return r;
}

/* A failed execute must fail as a fault (not as bad input), say why, and
 * return within the deadline + grace. Prints this rank's line. */
static int report_failed_execute(const char *what, reshard_result_t r, double ms, int allow_backend) {
  int code_ok = r == RESHARD_ERROR_TIMEOUT || r == RESHARD_ERROR_REMOTE || (allow_backend && r == RESHARD_ERROR_BACKEND);
  int ok = code_ok && ms <= TIMEOUT_MS + GRACE_MS && reshard_last_error()[0] != '\0';
  printf("%s rank %d: %s: execute returned %s after %.0f ms (deadline %d ms + %d ms): %s\n", ok ? "PASS" : "FAIL",
         world_rank, what, reshard_result_string(r), ms, TIMEOUT_MS, GRACE_MS, reshard_last_error());
  fflush(stdout);
  return ok ? 0 : 1;
}

/* ---------------------------------------------------------------- stop */

static int run_stop(reshard_comm_t *comm) {
  int victim = world_size - 1;
  int pid = (int)getpid();
  int *pids = malloc((size_t)world_size * sizeof *pids);
  MPI_Allgather(&pid, 1, MPI_INT, pids, 1, MPI_INT, MPI_COMM_WORLD);
  reshard_layout_t *src = grid_layout(0, 0), *dst = grid_layout(1, 0);
  reshard_plan_t *plan = make_plan(comm, src, dst);
  reshard_selftest_t s, d;
  if (reshard_selftest_alloc(&s, src, world_rank, 0) || reshard_selftest_alloc(&d, dst, world_rank, -1)) MPI_Abort(MPI_COMM_WORLD, 2);
  int bad = 0;
  double ms = 0;
  if (world_rank == victim) {
    raise(SIGSTOP); /* until rank 0 sends SIGCONT */
    reshard_result_t r = timed_execute(plan, &s, &d, &ms);
    /* Its peers left this call long ago: whatever of their messages got
     * through, the rest never comes. */
    bad += report_failed_execute("resumed after SIGSTOP", r, ms, 0);
  } else {
    reshard_result_t r = timed_execute(plan, &s, &d, &ms);
    bad += report_failed_execute("peer stopped", r, ms, 0);
    if (world_rank == 0 && kill((pid_t)pids[victim], SIGCONT) != 0) {
      printf("FAIL rank 0: kill(SIGCONT): %s\n", strerror(errno));
      bad++;
    }
  }
  /* Everyone made one (failed) call: the plan says so on a later call,
   * and a new plan on the same communicator works. */
  if (guarded_barrier(20000, world_rank == 0 ? pids[victim] : 0) != 0) {
    printf("FAIL rank %d: barrier after the fault did not complete\n", world_rank);
    fflush(stdout);
    _exit(1);
  }
  reshard_selftest_fill(&s, src, 1);
  reshard_result_t r = timed_execute(plan, &s, &d, &ms);
  if (r != RESHARD_ERROR_INVALID_USAGE || !strstr(reshard_last_error(), "failed")) {
    printf("FAIL rank %d: the failed plan executed again: %s: %s\n", world_rank, reshard_result_string(r),
           reshard_last_error());
    bad++;
  }
  reshard_plan_destroy(plan);
  plan = make_plan(comm, src, dst);
  r = timed_execute(plan, &s, &d, &ms);
  int64_t wrong = r == RESHARD_SUCCESS ? reshard_selftest_check(&d, dst, world_rank, 1, "after stop") : -1;
  int ok = r == RESHARD_SUCCESS && wrong == 0;
  printf("%s rank %d: next execute after the fault: %s in %.0f ms, %lld wrong bytes\n", ok ? "PASS" : "FAIL", world_rank,
         reshard_result_string(r), ms, (long long)wrong);
  fflush(stdout);
  bad += !ok;
  state_print("stop", world_rank, plan, &d, dst);
  reshard_selftest_free(&s);
  reshard_selftest_free(&d);
  reshard_plan_destroy(plan);
  reshard_layout_destroy(src);
  reshard_layout_destroy(dst);
  free(pids);
  return bad;
}

/* ---------------------------------------------------------------- exit */

static int run_exit(reshard_comm_t *comm) {
  int victim = 1;
  dying_send_install(comm, world_rank == victim ? world_size + 1 : -1);

  reshard_layout_t *src = grid_layout(0, 0), *dst = grid_layout(1, 0);
  reshard_plan_t *plan = make_plan(comm, src, dst);
  reshard_plan_stats_t st;
  reshard_plan_get_stats(plan, &st);
  if (st.num_chunks < 3) {
    printf("FAIL rank %d: %d rounds, the test needs several\n", world_rank, st.num_chunks);
    return 1;
  }
  reshard_selftest_t s, d;
  if (reshard_selftest_alloc(&s, src, world_rank, 0) || reshard_selftest_alloc(&d, dst, world_rank, -1)) MPI_Abort(MPI_COMM_WORLD, 2);
  double ms = 0;
  reshard_result_t r = timed_execute(plan, &s, &d, &ms); /* the victim never returns */
  int bad = report_failed_execute("peer exited mid-transfer", r, ms, 1);
  /* MPI_Finalize would wait for the dead rank: leave without it. */
  _exit(bad ? 1 : 0);
}

/* ------------------------------------------------------------ mismatch */

static int expect_mismatch(reshard_comm_t *comm, const char *what, const reshard_layout_t *src,
                           const reshard_layout_t *dst, size_t staging) {
  reshard_options_t opts = RESHARD_OPTIONS_INITIALIZER;
  opts.staging_bytes = staging;
  opts.timeout_ms = TIMEOUT_MS;
  reshard_plan_t *plan = NULL;
  double t0 = now_ms();
  reshard_result_t r = reshard_plan_create(comm, src, dst, &opts, &plan);
  double ms = now_ms() - t0;
  int ok = r == RESHARD_ERROR_MISMATCH && plan == NULL && reshard_last_error()[0] != '\0' && ms <= TIMEOUT_MS + GRACE_MS;
  printf("%s rank %d: %s: plan_create returned %s after %.0f ms: %s\n", ok ? "PASS" : "FAIL", world_rank, what,
         reshard_result_string(r), ms, reshard_last_error());
  fflush(stdout);
  reshard_plan_destroy(plan);
  return !ok;
}

static int run_mismatch(reshard_comm_t *comm) {
  int odd = world_rank == world_size - 1;
  reshard_layout_t *src = grid_layout(0, 0), *dst = grid_layout(1, odd), *same = grid_layout(1, 0);
  int bad = expect_mismatch(comm, "one rank splits the destination differently", src, dst, 4096);
  bad += expect_mismatch(comm, "one rank has another staging budget", src, same, odd ? 8192 : 4096);
  /* The communicator is still good: the same layouts everywhere plan. */
  reshard_plan_t *plan = make_plan(comm, src, same);
  reshard_plan_destroy(plan);
  reshard_layout_destroy(src);
  reshard_layout_destroy(dst);
  reshard_layout_destroy(same);
  return bad;
}

/* ---------------------------------------------------------------- late */

/* docs/API.md's recovery after a TIMEOUT on MPI, as written (issue 42,
 * item 2): the last rank comes to plan creation 500 ms late while the
 * deadline is 200 ms. Every rank's creation fails (TIMEOUT, or REMOTE /
 * MISMATCH from what a late rank finds), within the deadline + grace; each
 * destroys its communicator, creates a new one, plans and syncs again
 * (every byte checked), and the job finalizes and exits 0. Before the
 * fix, destroy freed a duplicate communicator with a timed-out
 * MPI_Iallreduce still pending, and MPI_Finalize crashed. */
static int run_late(reshard_comm_t **comm) {
  reshard_layout_t *src = grid_layout(0, 0), *dst = grid_layout(1, 0);
  reshard_options_t opts = RESHARD_OPTIONS_INITIALIZER;
  opts.staging_bytes = 4096;
  opts.timeout_ms = 200;
  if (world_rank == world_size - 1) {
    struct timespec ts = {0, 500 * 1000 * 1000};
    nanosleep(&ts, NULL);
  }
  reshard_plan_t *plan = NULL;
  double t0 = now_ms();
  reshard_result_t r = reshard_plan_create(*comm, src, dst, &opts, &plan);
  double ms = now_ms() - t0;
  int ok = r != RESHARD_SUCCESS && plan == NULL && ms <= 200 + GRACE_MS && reshard_last_error()[0] != '\0';
  printf("%s rank %d: late rank: plan_create returned %s after %.0f ms: %s\n", ok ? "PASS" : "FAIL", world_rank,
         reshard_result_string(r), ms, reshard_last_error());
  fflush(stdout);
  int bad = !ok;
  reshard_plan_destroy(plan);
  /* the recovery: a new communicator, a new plan */
  reshard_comm_destroy(*comm);
  *comm = NULL;
  if (reshard_comm_create_mpi(MPI_COMM_WORLD, comm)) {
    printf("FAIL rank %d: comm_create_mpi after the timeout: %s\n", world_rank, reshard_last_error());
    return bad + 1;
  }
  plan = make_plan(*comm, src, dst);
  reshard_selftest_t s, d;
  if (reshard_selftest_alloc(&s, src, world_rank, 1) || reshard_selftest_alloc(&d, dst, world_rank, -1))
    MPI_Abort(MPI_COMM_WORLD, 2);
  r = timed_execute(plan, &s, &d, &ms);
  int64_t wrong = r == RESHARD_SUCCESS ? reshard_selftest_check(&d, dst, world_rank, 1, "after late") : -1;
  ok = r == RESHARD_SUCCESS && wrong == 0;
  printf("%s rank %d: sync on a new communicator: %s in %.0f ms, %lld wrong bytes\n", ok ? "PASS" : "FAIL",
         world_rank, reshard_result_string(r), ms, (long long)wrong);
  fflush(stdout);
  bad += !ok;
  state_print("late", world_rank, plan, &d, dst);
  reshard_selftest_free(&s);
  reshard_selftest_free(&d);
  reshard_plan_destroy(plan);
  reshard_layout_destroy(src);
  reshard_layout_destroy(dst);
  return bad;
}

/* --------------------------------------------------------------- split */

/* Executes version `v` of a double-buffered plan (copies d[0], d[1]). */
static reshard_result_t db_execute(const reshard_plan_t *plan, reshard_selftest_t *s, reshard_selftest_t *d,
                                   uint64_t v, double *ms) {
  void *dp[128];
  int nb = d[0].nbuf;
  for (int b = 0; b < nb; b++) dp[b] = d[0].ptr[b], dp[nb + b] = d[1].ptr[b];
  double t0 = now_ms();
  reshard_result_t r =
      reshard_plan_execute_version(plan, v, (void *const *)s->ptr, (size_t)s->nbuf, dp, (size_t)(2 * nb), NULL);
  *ms = now_ms() - t0;
  return r;
}

/* The state every rank must end in after a round: committed version
 * `want` in copy `copy`, holding that version's values, on every rank
 * (gathered: the split commit left ranks at different versions), and
 * nothing in doubt. */
static int check_settled(const char *what, const reshard_plan_t *plan, reshard_selftest_t *d,
                         const reshard_layout_t *dst, uint64_t want, int copy) {
  reshard_plan_status_t st = status_of(plan);
  uint64_t mine[2] = {st.committed_version, (uint64_t)st.active_copy}, all[128];
  MPI_Allgather(mine, 2, MPI_UINT64_T, all, 2, MPI_UINT64_T, MPI_COMM_WORLD);
  int apart = 0;
  for (int i = 0; i < world_size; i++) apart |= all[2 * i] != want || all[2 * i + 1] != (uint64_t)copy;
  int64_t wrong = reshard_selftest_check(&d[copy], dst, world_rank, (int)want, what);
  int ok = !apart && wrong == 0 && st.in_doubt_version == 0;
  printf("%s rank %d: %s: every rank at committed version %llu in copy %d: %s; this rank's copy %d: %lld wrong "
         "bytes; in doubt: %llu\n",
         ok ? "PASS" : "FAIL", world_rank, what, (unsigned long long)want, copy, apart ? "no" : "yes", copy,
         (long long)wrong, (unsigned long long)st.in_doubt_version);
  fflush(stdout);
  return !ok;
}

/* The split commit (issue 42, item 1). Source and destination layouts are
 * identical, so no rank has a partner and only the commit's allreduce
 * joins them; double buffering, timeout 300 ms. Version 1 commits
 * everywhere. For version 2 the last rank is 1.5 s late: the others voted
 * to commit and their commit collective passes its deadline (~600 ms).
 * Before the fix they returned TIMEOUT at version 1 while the late rank,
 * completing the same collective with their votes, committed version 2.
 *
 * Round A (roll forward): the others return IN_DOUBT (status: version 2
 * in doubt in copy 1, version 1 still committed in copy 0); a resolve
 * of 50 ms, before the late rank arrives, says IN_DOUBT again; the late
 * rank returns SUCCESS at version 2; a resolve of 5 s on the others then
 * commits version 2 in copy 1, as on the late rank. Version 3 then runs
 * on the same plan and communicator everywhere.
 *
 * Round B (roll back): a new plan; version 1 commits; for version 2 the
 * late rank arrives and refuses its call (its vote: a failure). The
 * others, in doubt, learn the outcome at their next execute, without a
 * resolve: version 2 was not committed, the plan is failed and the call
 * refused, copy 0 still holds version 1 everywhere. mpirun exits 0 after a
 * clean MPI_Finalize. */
static int run_split(reshard_comm_t *comm) {
  const int late = world_size - 1, me_late = world_rank == late;
  reshard_layout_t *L = grid_layout(0, 0);
  reshard_options_t opts = RESHARD_OPTIONS_INITIALIZER;
  opts.timeout_ms = 300;
  opts.flags |= RESHARD_FLAG_DOUBLE_BUFFER;
  reshard_selftest_t s[3], d[2];
  for (int k = 0; k < 3; k++)
    if (reshard_selftest_alloc(&s[k], L, world_rank, k + 1)) MPI_Abort(MPI_COMM_WORLD, 2);
  int bad = 0;
  for (int round = 0; round < 2; round++) {
    const char *name = round ? "round B (roll back)" : "round A (roll forward)";
    if (reshard_selftest_alloc(&d[0], L, world_rank, -1) || reshard_selftest_alloc(&d[1], L, world_rank, -1))
      MPI_Abort(MPI_COMM_WORLD, 2);
    reshard_plan_t *plan = NULL;
    if (reshard_plan_create(comm, L, L, &opts, &plan)) {
      printf("FAIL rank %d: %s: plan_create: %s\n", world_rank, name, reshard_last_error());
      MPI_Abort(MPI_COMM_WORLD, 2);
    }
    double ms;
    reshard_result_t r = db_execute(plan, &s[0], d, 1, &ms);
    if (r) printf("FAIL rank %d: %s: version 1: %s\n", world_rank, name, reshard_last_error());
    bad += r != 0;
    bad += check_settled("version 1", plan, d, L, 1, 0);
    if (me_late) {
      struct timespec ts = {1, 500 * 1000 * 1000};
      nanosleep(&ts, NULL);
    }
    if (round == 0) {
      r = db_execute(plan, &s[1], d, 2, &ms);
      char msg[1024];
      snprintf(msg, sizeof msg, "%s", reshard_last_error());
      reshard_plan_status_t st = status_of(plan);
      int ok = me_late ? r == RESHARD_SUCCESS && st.committed_version == 2 && st.active_copy == 1
                       : r == RESHARD_ERROR_IN_DOUBT && ms <= 2 * 300 + GRACE_MS && st.committed_version == 1 &&
                             st.active_copy == 0 && st.in_doubt_version == 2 && st.in_doubt_copy == 1 &&
                             !st.failed && reshard_selftest_check(&d[0], L, world_rank, 1, "copy 0 in doubt") == 0 &&
                             reshard_selftest_check(&d[1], L, world_rank, 2, "copy 1 in doubt") == 0;
      printf("%s rank %d: %s: version 2 returned %s after %.0f ms (committed %llu in copy %d, in doubt %llu in copy "
             "%d): %s\n",
             ok ? "PASS" : "FAIL", world_rank, name, reshard_result_string(r), ms,
             (unsigned long long)st.committed_version, st.active_copy, (unsigned long long)st.in_doubt_version,
             st.in_doubt_copy, msg);
      bad += !ok;
      if (!me_late) {
        r = reshard_plan_resolve(plan, 50);
        ok = r == RESHARD_ERROR_IN_DOUBT && strstr(reshard_last_error(), "still in doubt");
        printf("%s rank %d: %s: resolve before the late rank voted: %s: %s\n", ok ? "PASS" : "FAIL", world_rank,
               name, reshard_result_string(r), reshard_last_error());
        bad += !ok;
        double t0 = now_ms();
        r = reshard_plan_resolve(plan, 5000);
        printf("%s rank %d: %s: resolve after %.0f ms: %s\n", r ? "FAIL" : "PASS", world_rank, name, now_ms() - t0,
               reshard_result_string(r));
        bad += r != 0;
      }
      fflush(stdout);
      bad += check_settled("version 2 settled", plan, d, L, 2, 1);
      if (guarded_barrier(5000, 0)) MPI_Abort(MPI_COMM_WORLD, 3);
      r = db_execute(plan, &s[2], d, 3, &ms);
      if (r) printf("FAIL rank %d: %s: version 3: %s\n", world_rank, name, reshard_last_error());
      bad += r != 0;
      bad += check_settled("version 3 on the same plan", plan, d, L, 3, 0);
    } else {
      if (me_late) {
        r = reshard_plan_execute_refused(plan, 2, RESHARD_ERROR_INVALID_ARGUMENT, "the late rank refuses version 2");
      } else {
        r = db_execute(plan, &s[1], d, 2, &ms);
      }
      int ok = me_late ? r == RESHARD_ERROR_INVALID_ARGUMENT : r == RESHARD_ERROR_IN_DOUBT;
      printf("%s rank %d: %s: version 2 returned %s: %s\n", ok ? "PASS" : "FAIL", world_rank, name,
             reshard_result_string(r), reshard_last_error());
      bad += !ok;
      fflush(stdout);
      if (guarded_barrier(5000, 0)) MPI_Abort(MPI_COMM_WORLD, 3);
      r = db_execute(plan, &s[2], d, 3, &ms);
      char msg[1024];
      snprintf(msg, sizeof msg, "%s", reshard_last_error());
      reshard_plan_status_t st = status_of(plan);
      ok = r == RESHARD_ERROR_INVALID_USAGE && st.failed && ms <= 300 + GRACE_MS &&
           (me_late || strstr(msg, "in doubt here, was not committed"));
      printf("%s rank %d: %s: version 3 returned %s after %.0f ms: %s\n", ok ? "PASS" : "FAIL", world_rank, name,
             reshard_result_string(r), ms, msg);
      fflush(stdout);
      bad += !ok;
      bad += check_settled("version 2 rolled back", plan, d, L, 1, 0);
    }
    state_print(round ? "split-B" : "split-A", world_rank, plan, d, L);
    reshard_plan_destroy(plan);
    reshard_selftest_free(&d[0]);
    reshard_selftest_free(&d[1]);
  }
  for (int k = 0; k < 3; k++) reshard_selftest_free(&s[k]);
  reshard_layout_destroy(L);
  return bad;
}

int main(int argc, char **argv) {
  const char *mode = fault_init(&argc, &argv, "test_mpi_faults");
  reshard_comm_t *comm = fault_comm();
  int bad;
  if (!strcmp(mode, "stop")) {
    bad = run_stop(comm);
  } else if (!strcmp(mode, "exit")) {
    bad = run_exit(comm);
  } else if (!strcmp(mode, "mismatch")) {
    bad = run_mismatch(comm);
  } else if (!strcmp(mode, "late")) {
    bad = run_late(&comm);
  } else if (!strcmp(mode, "split")) {
    bad = run_split(comm);
  } else {
    if (world_rank == 0) fprintf(stderr, "usage: test_mpi_faults stop|exit|mismatch|late|split\n");
    MPI_Abort(MPI_COMM_WORLD, 2);
    return 2;
  }
  return fault_finish(comm, bad);
}
