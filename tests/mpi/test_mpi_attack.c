/* The MPI attack suite (issue 42): ranks that misbehave on purpose against
 * a double-buffered plan (RESHARD_FLAG_DOUBLE_BUFFER), and what every
 * other rank must see. Run at 4 ranks:
 *
 *   mpirun -np 4 ./test_mpi_attack kill            (with --enable-recovery)
 *   mpirun -np 4 ./test_mpi_attack kill-at-commit  (with --enable-recovery)
 *   mpirun -np 4 ./test_mpi_attack skip
 *   mpirun -np 4 ./test_mpi_attack twice
 *   mpirun -np 4 ./test_mpi_attack other-version
 *   mpirun -np 4 ./test_mpi_attack corrupt-in-flight
 *
 * The transfer is test_mpi_faults.c's: one fp32 tensor [64n, 64n], rows to
 * columns, so every rank is a partner of every other, in ~25 rounds of a
 * 4 KiB staging budget; timeout T = 1000 ms. In every mode version 1
 * commits everywhere first (a control: the same plan and transport work),
 * then the attack hits version 2. A failed double-buffered execute may
 * take the transfer's deadline and then the commit's, so "in time" is
 * 2T + GRACE; a disagreement the agreement headers catch must come back
 * before T ("quickly": nobody waited for a deadline).
 *
 * kill: rank 1 raise(SIGKILL)s itself right after posting its 5th payload
 *   message of version 2 (the transport is wrapped). The survivors return
 *   TIMEOUT, REMOTE or BACKEND in time with version 1 committed in a whole
 *   copy 0, print, and _exit(0): MPI_Finalize would wait for the dead rank
 *   (see test_mpi_faults.c, exit), so mpirun's status is not judged.
 * kill-at-commit: rank 1 kills itself as it enters the commit vote of
 *   version 2, its data all sent. The survivors voted to commit: IN_DOUBT
 *   in time, nothing committed; a resolve still says IN_DOUBT (the dead
 *   rank never votes), copy 0 holds version 1, copy 1 version 2.
 * skip: rank 2 skips the version 2 execute and goes on to its next call,
 *   version 3, once the others have given up on version 2 (they call
 *   version 3 too and are refused at once: their plan failed). Round
 *   "grid" (every rank a partner): the others fail at the headers
 *   (TIMEOUT/REMOTE) in time; the skipper's version 3 meets only stale
 *   headers and the others' abandoned commit and must fail. Round
 *   "commit-only" (source = destination layout: no partners, only the
 *   commit joins the ranks): the others voted to commit version 2 and
 *   return IN_DOUBT in time; the skipper's version 3 completes their
 *   pending commit collective with votes at another version: MISMATCH on
 *   the skipper, and a resolve on the others settles version 2 as not
 *   committed. Both rounds end with version 1 committed everywhere.
 * twice: rank 1 replays version 2 (the same version: what a restarted
 *   loop or an attacker replaying a step sends) after every rank committed
 *   it, while the others go on to version 3. MISMATCH or REMOTE everywhere,
 *   quickly; version 2 stays committed, and the inactive copy still holds
 *   version 1 (nothing was written).
 * other-version: the last rank passes another version than the others
 *   (7 against 2; on a new plan 1, the committed one, against 2): MISMATCH
 *   or REMOTE everywhere, quickly; version 1 stays committed and the
 *   inactive copy was never written. Then 7 against 2 without partners
 *   (source = destination layout), where only the commit's vote sees the
 *   versions: MISMATCH everywhere, quickly, version 1 committed.
 * corrupt-in-flight: with RESHARD_FLAG_VERIFY and RESHARD_MPI_DATATYPES=0
 *   (payloads are packed into staging and go through isend), rank 1 sends
 *   a copy of one version-2 payload message to rank 2 with one bit
 *   flipped: its first (round "first"), then on a new plan its last
 *   (round "last", when the other pairs may be done and learn of it only
 *   from the commit's vote). Rank 2 returns MISMATCH saying the data was
 *   corrupted, naming rank 1; the others TIMEOUT or REMOTE (IN_DOUBT,
 *   then settled); nobody commits version 2.
 *
 * Each rank prints "PASS rank R: ..." or "FAIL rank R: ..." lines with the
 * measured return times, and at the end of each round one STATE line
 * (state_line.h). tests/mpi/run_fault_test.sh judges them: the PASS count,
 * no FAIL, the STATE lines agreeing across ranks (one committed version,
 * or a version in doubt consistent with it; every active copy whole), the
 * time limit, and exit 0 where MPI_Finalize must be clean (all but kill).
 * Every wait after a fault has a deadline. */
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
#include "reshard_selftest.h"
#include "fault_world.h"
#include "state_line.h"
#include "transport/transport.h"

#define T_MS 1000
#define GRACE_MS 1000                 /* allowed beyond a deadline (2 shared cores) */
#define LATE_MS (2 * T_MS + GRACE_MS) /* a failed double-buffered execute */
#define BIT(r) (1u << (r))

static char msg[1024]; /* the last execute's reshard_last_error() */

static void barrier_or_die(void) {
  if (guarded_barrier(20000, 0) == 0) return;
  printf("FAIL rank %d: a barrier after the attack did not complete\n", world_rank);
  fflush(stdout);
  _exit(1);
}

/* ------------------------------------------------- the wrapped transport */

/* A copy of the MPI ops table whose sends count the payload messages of
 * the armed call and may kill this rank or corrupt one message. */
static const rs_transport_ops *real_ops;
static rs_transport_ops wrapped;
static int armed, payloads, kill_on = -1, kill_at_commit;
static int corrupt_to = -1, corrupt_nth, to_victim, corrupted; /* flip message corrupt_nth (from 1) to corrupt_to */
static unsigned char flipped[1 << 16]; /* the corrupted message; MPI may read it after the call */

/* The tag bits of the per-execute control messages (headers, status) and
 * of verify's checksum messages (src/exec/exec_state.h: RS_TAG_CONTROL,
 * RS_TAG_VERIFY). Should they move, no payload is found: kill never
 * fires and corrupt-in-flight reports that nothing was corrupted. */
#define TAG_CONTROL ((uint64_t)1 << 63)
#define TAG_VERIFY ((uint64_t)1 << 31)

static int is_payload(uint64_t tag) { return !(tag & TAG_CONTROL) && !(tag & TAG_VERIFY); }

static void count_payload(void) {
  if (++payloads != kill_on) return;
  printf("KILL rank %d: SIGKILL after posting payload message %d of version 2\n", world_rank, payloads);
  fflush(stdout);
  raise(SIGKILL);
}

static reshard_result_t att_isend(reshard_comm_t *c, int peer, uint64_t tag, const void *buf, size_t bytes,
                                  rs_request **req) {
  if (armed && is_payload(tag) && peer == corrupt_to && ++to_victim == corrupt_nth && bytes > 0 &&
      bytes <= sizeof flipped) {
    memcpy(flipped, buf, bytes);
    flipped[bytes / 2] ^= 0x01;
    buf = flipped;
    corrupted = 1;
  }
  reshard_result_t r = real_ops->isend(c, peer, tag, buf, bytes, req);
  if (armed && is_payload(tag)) count_payload();
  return r;
}

static reshard_result_t att_isend_boxes(reshard_comm_t *c, int peer, uint64_t tag, const struct rs_copy *copies,
                                        uint32_t n, void *const *bases, size_t bytes, rs_request **req) {
  reshard_result_t r = real_ops->isend_boxes(c, peer, tag, copies, n, bases, bytes, req);
  if (armed && r != RESHARD_ERROR_UNSUPPORTED) count_payload(); /* (unsupported: isend follows) */
  return r;
}

/* The armed call's only collective is its commit vote. */
static reshard_result_t att_allreduce(reshard_comm_t *c, uint64_t *vals, int n, int64_t deadline) {
  if (armed && kill_at_commit) {
    printf("KILL rank %d: SIGKILL at its commit vote of version 2, its data all sent\n", world_rank);
    fflush(stdout);
    raise(SIGKILL);
  }
  return real_ops->allreduce_max_u64(c, vals, n, deadline);
}

static void wrap(reshard_comm_t *comm) {
  real_ops = comm->ops;
  wrapped = *real_ops;
  wrapped.isend = att_isend;
  wrapped.allreduce_max_u64 = att_allreduce;
  if (real_ops->isend_boxes) wrapped.isend_boxes = att_isend_boxes;
  comm->ops = &wrapped;
}

/* ---------------------------------------------------------- the plan */

typedef struct att {
  reshard_layout_t *src, *dst;
  reshard_plan_t *plan;
  reshard_selftest_t s, d[2]; /* the source; the destination's two copies */
} att;

/* partners 0: source and destination alike (only the commit joins ranks). */
static void att_open(att *a, reshard_comm_t *comm, int partners, uint32_t flags) {
  memset(a, 0, sizeof *a);
  a->src = grid_layout(0, 0);
  a->dst = grid_layout(partners ? 1 : 0, 0);
  reshard_options_t opts = RESHARD_OPTIONS_INITIALIZER;
  opts.staging_bytes = 4096;
  opts.timeout_ms = T_MS;
  opts.flags = RESHARD_FLAG_DOUBLE_BUFFER | flags;
  if (reshard_plan_create(comm, a->src, a->dst, &opts, &a->plan) ||
      reshard_selftest_alloc(&a->s, a->src, world_rank, 1) ||
      reshard_selftest_alloc(&a->d[0], a->dst, world_rank, -1) ||
      reshard_selftest_alloc(&a->d[1], a->dst, world_rank, -1)) {
    fprintf(stderr, "rank %d: setup: %s\n", world_rank, reshard_last_error());
    MPI_Abort(MPI_COMM_WORLD, 2);
  }
}

static void att_close(att *a) {
  reshard_plan_destroy(a->plan);
  reshard_selftest_free(&a->s);
  reshard_selftest_free(&a->d[0]);
  reshard_selftest_free(&a->d[1]);
  reshard_layout_destroy(a->src);
  reshard_layout_destroy(a->dst);
}

/* The training step's update, then version v of the weights, timed. */
static reshard_result_t att_exec(att *a, uint64_t v, double *ms) {
  reshard_selftest_fill(&a->s, a->src, v);
  void *dp[128];
  int nb = a->d[0].nbuf;
  for (int b = 0; b < nb; b++) dp[b] = a->d[0].ptr[b], dp[nb + b] = a->d[1].ptr[b];
  double t0 = now_ms();
  reshard_result_t r = reshard_plan_execute_version(a->plan, v, (void *const *)a->s.ptr, (size_t)a->s.nbuf, dp,
                                                    (size_t)(2 * nb), NULL);
  *ms = now_ms() - t0;
  snprintf(msg, sizeof msg, "%s", reshard_last_error());
  return r;
}

/* Version v commits here, into a copy that holds it whole. */
static int expect_commit(att *a, uint64_t v) {
  double ms;
  reshard_result_t r = att_exec(a, v, &ms);
  reshard_plan_status_t st = status_of(a->plan);
  int64_t wrong = r ? -1 : reshard_selftest_check(&a->d[st.active_copy > 0], a->dst, world_rank, v, "commit");
  int ok = r == RESHARD_SUCCESS && st.committed_version == v && wrong == 0;
  printf("%s rank %d: version %llu: %s in %.0f ms, copy %d, %lld wrong bytes%s%s\n", ok ? "PASS" : "FAIL", world_rank,
         (unsigned long long)v, reshard_result_string(r), ms, st.active_copy, (long long)wrong, r ? ": " : "",
         r ? msg : "");
  fflush(stdout);
  return !ok;
}

/* A call that must fail: a result in `allowed`, within bound_ms, saying
 * why, with what `must_say` (NULL: anything) in its message. */
static int expect_failure(const char *what, uint64_t v, reshard_result_t r, double ms, unsigned allowed,
                          double bound_ms, const char *must_say) {
  int ok = r != RESHARD_SUCCESS && (allowed & BIT(r)) && ms <= bound_ms && msg[0] &&
           (!must_say || strstr(msg, must_say));
  printf("%s rank %d: %s: version %llu returned %s after %.0f ms (bound %.0f ms): %s\n", ok ? "PASS" : "FAIL",
         world_rank, what, (unsigned long long)v, reshard_result_string(r), ms, bound_ms, msg);
  fflush(stdout);
  return !ok;
}

/* This rank's end of a round: a version left in doubt settled first where
 * every rank is alive (resolve), then version `want` committed in copy
 * (want - 1) % 2 (versions commit in order from copy 0), whole; the other
 * copy holds version `other` (> 0), is untouched (-1) or is not checked
 * (0). Prints a PASS/FAIL line and the STATE line. */
static int end_state(att *a, const char *label, uint64_t want, int64_t other, int may_resolve) {
  reshard_plan_status_t st = status_of(a->plan);
  char settled[160] = "";
  if (st.in_doubt_version && may_resolve) {
    reshard_result_t r = reshard_plan_resolve(a->plan, 5000);
    snprintf(settled, sizeof settled, "; version %llu was in doubt, resolve: %s",
             (unsigned long long)st.in_doubt_version, reshard_result_string(r));
    st = status_of(a->plan);
  }
  int act = (int)((want - 1) & 1);
  int64_t wrong = reshard_selftest_check(&a->d[act], a->dst, world_rank, want, label), owrong = 0;
  if (other > 0) owrong = reshard_selftest_check(&a->d[1 - act], a->dst, world_rank, (uint64_t)other, label);
  if (other < 0) owrong = !state_untouched(&a->d[1 - act]);
  int ok = st.committed_version == want && st.active_copy == act && !st.in_doubt_version && !wrong && !owrong;
  printf("%s rank %d: %s: committed %llu in copy %d (expected %llu in copy %d), in doubt %llu, %lld wrong bytes, other "
         "copy %s%s\n",
         ok ? "PASS" : "FAIL", world_rank, label, (unsigned long long)st.committed_version, st.active_copy,
         (unsigned long long)want, act, (unsigned long long)st.in_doubt_version, (long long)wrong,
         other ? (owrong ? "changed" : "as it was") : "not checked", settled);
  fflush(stdout);
  state_print(label, world_rank, a->plan, a->d, a->dst);
  return !ok;
}

/* ---------------------------------------------------------------- modes */

static int run_kill(reshard_comm_t *comm, int at_commit) {
  const int victim = 1;
  att a;
  att_open(&a, comm, 1, 0);
  int bad = expect_commit(&a, 1);
  if (world_rank == victim) {
    kill_at_commit = at_commit;
    kill_on = at_commit ? -1 : world_size + 1; /* its first round (one per peer), and into the second */
  }
  armed = 1;
  double ms;
  reshard_result_t r = att_exec(&a, 2, &ms); /* the victim never returns */
  armed = 0;
  if (!at_commit) {
    bad += expect_failure("peer killed mid-transfer", 2, r, ms,
                          BIT(RESHARD_ERROR_TIMEOUT) | BIT(RESHARD_ERROR_REMOTE) | BIT(RESHARD_ERROR_BACKEND), LATE_MS,
                          NULL);
    /* no resolve: with every rank a partner of the victim, none voted to
     * commit, so none can be in doubt */
    return bad + end_state(&a, "kill", 1, 0, 0);
  }
  /* Every survivor got all its data and voted to commit; the dead rank
   * never votes, so nobody may commit and the doubt can never settle: a
   * resolve says so again, both copies kept (docs/RELIABILITY.md, "A
   * version that never settles"). */
  bad += expect_failure("peer killed at its commit vote", 2, r, ms, BIT(RESHARD_ERROR_IN_DOUBT), LATE_MS, "in doubt");
  r = reshard_plan_resolve(a.plan, 300);
  reshard_plan_status_t st = status_of(a.plan);
  int64_t w0 = reshard_selftest_check(&a.d[0], a.dst, world_rank, 1, "copy 0"),
          w1 = reshard_selftest_check(&a.d[1], a.dst, world_rank, 2, "copy 1");
  int ok = r == RESHARD_ERROR_IN_DOUBT && st.committed_version == 1 && st.active_copy == 0 &&
           st.in_doubt_version == 2 && st.in_doubt_copy == 1 && !w0 && !w1;
  printf("%s rank %d: resolve: %s; committed %llu in copy %d (%lld wrong bytes), in doubt %llu in copy %d (%lld wrong "
         "bytes)\n",
         ok ? "PASS" : "FAIL", world_rank, reshard_result_string(r), (unsigned long long)st.committed_version,
         st.active_copy, (long long)w0, (unsigned long long)st.in_doubt_version, st.in_doubt_copy, (long long)w1);
  fflush(stdout);
  state_print("kill-at-commit", world_rank, a.plan, a.d, a.dst);
  return bad + !ok;
}

static int run_skip(reshard_comm_t *comm) {
  const int skipper = 2, me = world_rank == skipper;
  int bad = 0;
  for (int round = 0; round < 2; round++) {
    const char *label = round ? "skip-commit-only" : "skip-grid";
    att a;
    att_open(&a, comm, round == 0, 0);
    bad += expect_commit(&a, 1);
    double ms = 0;
    reshard_result_t r;
    if (!me) {
      r = att_exec(&a, 2, &ms);
      reshard_plan_status_t st = status_of(a.plan);
      if (round == 0) {
        bad += expect_failure("a partner skipped it", 2, r, ms, BIT(RESHARD_ERROR_TIMEOUT) | BIT(RESHARD_ERROR_REMOTE),
                              LATE_MS, NULL);
      } else {
        /* voted to commit; the skipper never votes */
        bad += expect_failure("a rank skipped it", 2, r, ms, BIT(RESHARD_ERROR_IN_DOUBT), LATE_MS, "in doubt");
        if (st.in_doubt_version != 2 || st.committed_version != 1) {
          printf("FAIL rank %d: %s: in doubt %llu, committed %llu after IN_DOUBT\n", world_rank, label,
                 (unsigned long long)st.in_doubt_version, (unsigned long long)st.committed_version);
          bad++;
        }
      }
    }
    barrier_or_die(); /* the skipper "goes on" once the others gave up */
    if (me) {
      r = att_exec(&a, 3, &ms);
      reshard_plan_status_t st = status_of(a.plan);
      unsigned allowed = round ? BIT(RESHARD_ERROR_MISMATCH)
                               : BIT(RESHARD_ERROR_MISMATCH) | BIT(RESHARD_ERROR_REMOTE) | BIT(RESHARD_ERROR_TIMEOUT);
      bad += expect_failure("after skipping version 2, the next call", 3, r, ms, allowed, LATE_MS, NULL);
      if (st.committed_version != 1) {
        printf("FAIL rank %d: the skipper committed %llu\n", world_rank, (unsigned long long)st.committed_version);
        bad++;
      }
    } else if (round == 0) {
      /* the training loop goes on: the failed plan refuses at once */
      r = att_exec(&a, 3, &ms);
      bad += expect_failure("next step on the failed plan", 3, r, ms, BIT(RESHARD_ERROR_INVALID_USAGE), T_MS, "failed");
    }
    barrier_or_die(); /* (the others poll MPI here: their pending commit completes) */
    if (!me && round == 1) {
      double t0 = now_ms();
      r = reshard_plan_resolve(a.plan, 5000);
      reshard_plan_status_t st = status_of(a.plan);
      int ok = r == RESHARD_SUCCESS && st.failed && !st.in_doubt_version && st.committed_version == 1;
      printf("%s rank %d: %s: resolve: %s after %.0f ms, plan failed %d (%s), committed %llu\n", ok ? "PASS" : "FAIL",
             world_rank, label, reshard_result_string(r), now_ms() - t0, st.failed, reshard_result_string(st.failure),
             (unsigned long long)st.committed_version);
      bad += !ok;
    }
    bad += end_state(&a, label, 1, 0, 1);
    att_close(&a);
    barrier_or_die();
  }
  return bad;
}

static int run_twice(reshard_comm_t *comm) {
  const int replayer = 1;
  att a;
  att_open(&a, comm, 1, 0);
  int bad = expect_commit(&a, 1) + expect_commit(&a, 2);
  double ms;
  uint64_t v = world_rank == replayer ? 2 : 3;
  reshard_result_t r = att_exec(&a, v, &ms);
  bad += expect_failure(world_rank == replayer ? "replayed" : "a partner replayed version 2", v, r, ms,
                        BIT(RESHARD_ERROR_MISMATCH) | BIT(RESHARD_ERROR_REMOTE), T_MS, NULL);
  bad += end_state(&a, "twice", 2, 1, 1); /* copy 0 still version 1: nothing written */
  att_close(&a);
  return bad;
}

static int run_other_version(reshard_comm_t *comm) {
  const int odd = world_rank == world_size - 1;
  /* the odd rank's version; the last case has no partners: only the
   * commit's vote can tell the versions apart */
  const uint64_t theirs[3] = {7, 1, 7};
  int bad = 0;
  for (int k = 0; k < 3; k++) {
    char label[64];
    snprintf(label, sizeof label, "other-version-%llu%s", (unsigned long long)theirs[k], k == 2 ? "-commit-only" : "");
    att a;
    att_open(&a, comm, k < 2, 0);
    bad += expect_commit(&a, 1);
    double ms;
    uint64_t v = odd ? theirs[k] : 2;
    reshard_result_t r = att_exec(&a, v, &ms);
    bad += expect_failure(odd ? "another version than the others" : "a partner at another version", v, r, ms,
                          BIT(RESHARD_ERROR_MISMATCH) | BIT(RESHARD_ERROR_REMOTE), T_MS, NULL);
    /* with partners the headers stop the call before any data: copy 1
     * never written; without, the local copies wrote it (not committed) */
    bad += end_state(&a, label, 1, k < 2 ? -1 : 0, 1);
    att_close(&a);
  }
  return bad;
}

/* Round "first" flips a bit of the first payload message to the receiver,
 * round "last" of its last one, once the others may be done. */
static int run_corrupt(reshard_comm_t *comm) {
  const int sender = 1, receiver = 2;
  int bad = 0, messages = 0;
  for (int round = 0; round < 2; round++) {
    const char *label = round ? "corrupt-last" : "corrupt-first";
    att a;
    att_open(&a, comm, 1, RESHARD_FLAG_VERIFY);
    if (world_rank == sender) corrupt_to = receiver;
    armed = 1; /* version 1 counts the messages to the receiver, corrupting none */
    corrupt_nth = to_victim = corrupted = 0;
    bad += expect_commit(&a, 1); /* (and clean bytes through the wrapper pass verify) */
    if (to_victim) messages = to_victim;
    corrupt_nth = round ? messages : 1;
    to_victim = 0;
    double ms;
    reshard_result_t r = att_exec(&a, 2, &ms);
    armed = 0;
    if (world_rank == receiver) {
      /* a checksum difference naming the sender, not a size or layout story */
      char from[32];
      snprintf(from, sizeof from, "from rank %d", sender);
      bad += expect_failure(label, 2, r, ms, BIT(RESHARD_ERROR_MISMATCH), LATE_MS, "corrupted");
      if (!strstr(msg, "verify") || !strstr(msg, from)) {
        printf("FAIL rank %d: the mismatch does not name verify and %s: %s\n", world_rank, from, msg);
        bad++;
      }
    } else {
      bad += expect_failure(label, 2, r, ms,
                            BIT(RESHARD_ERROR_TIMEOUT) | BIT(RESHARD_ERROR_REMOTE) | BIT(RESHARD_ERROR_IN_DOUBT),
                            LATE_MS, NULL);
    }
    if (world_rank == sender && !corrupted) {
      printf("FAIL rank %d: %s: no payload message %d to rank %d went through isend: nothing was corrupted\n",
             world_rank, label, corrupt_nth, receiver);
      bad++;
    }
    bad += end_state(&a, label, 1, 0, 1);
    att_close(&a);
  }
  return bad;
}

int main(int argc, char **argv) {
  const char *mode = fault_init(&argc, &argv, "test_mpi_attack");
  /* Payloads packed into staging go through isend, where the wrapper can
   * flip a bit of a copy (strided boxes would go from the source buffer
   * itself). Read at the first reshard call. */
  if (!strcmp(mode, "corrupt-in-flight")) setenv("RESHARD_MPI_DATATYPES", "0", 1);
  reshard_comm_t *comm = fault_comm();
  wrap(comm);
  int bad;
  if (!strcmp(mode, "kill") || !strcmp(mode, "kill-at-commit")) {
    bad = run_kill(comm, strcmp(mode, "kill") != 0);
    _exit(bad ? 1 : 0); /* survivors: MPI_Finalize would wait for the dead rank */
  } else if (!strcmp(mode, "skip")) {
    bad = run_skip(comm);
  } else if (!strcmp(mode, "twice")) {
    bad = run_twice(comm);
  } else if (!strcmp(mode, "other-version")) {
    bad = run_other_version(comm);
  } else if (!strcmp(mode, "corrupt-in-flight")) {
    bad = run_corrupt(comm);
  } else {
    if (world_rank == 0)
      fprintf(stderr, "usage: test_mpi_attack kill|kill-at-commit|skip|twice|other-version|corrupt-in-flight\n");
    MPI_Abort(MPI_COMM_WORLD, 2);
    return 2;
  }
  return fault_finish(comm, bad);
}
