/* A watchdog for MPI programs that must not hang when a rank stops.
 *
 * reshard's own calls end at their deadline (options.timeout_ms, or
 * RESHARD_TIMEOUT_MS) with RESHARD_ERROR_TIMEOUT. A program's own MPI
 * calls (a barrier before timing, a reduction of the results) have none:
 * with one rank stopped, the others would wait in them forever and mpirun
 * would never return. So every blocking MPI call of the program is
 * bracketed with wd_enter / wd_leave (WD_CALL does both); a thread ends
 * the process with a message and exit status 3 when one outlives the
 * deadline, and mpirun then ends the whole job with a non-zero status.
 * Only waits are bracketed, never computation, so the deadline says how
 * far behind the others a rank may fall, as reshard's own agreements do.
 *
 * Header-only (POSIX threads and C11 atomics), used by the example
 * rl_weight_sync.c and the tool reshard_perf; copy it along with the
 * example. Call wd_start once after MPI_Init. */
#ifndef RESHARD_EXAMPLES_WATCHDOG_H
#define RESHARD_EXAMPLES_WATCHDOG_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

/* Slack over reshard's deadline: a rank waits in the program's own call at
 * most this much longer than reshard would wait for it. */
#define WD_SLACK_MS 5000

static struct {
  _Atomic int64_t deadline_ns; /* 0: no wait in progress */
  _Atomic(const char *) what;
  int64_t timeout_ns;
  int rank;
} wd_state;

static inline int64_t wd_now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static inline void *wd_main(void *arg) {
  (void)arg;
  for (;;) {
    struct timespec nap = {0, 50 * 1000000L};
    nanosleep(&nap, NULL);
    int64_t d = atomic_load(&wd_state.deadline_ns);
    if (d && wd_now_ns() > d) {
      char msg[512];
      int n = snprintf(msg, sizeof msg,
                       "rank %d: %s did not return within %lld ms (reshard's deadline + %d ms): a rank has "
                       "stopped or failed; ending this rank so that mpirun ends the job\n",
                       wd_state.rank, atomic_load(&wd_state.what), (long long)(wd_state.timeout_ns / 1000000),
                       WD_SLACK_MS);
      if (n > 0 && write(2, msg, (size_t)n) < 0) n = 0;
      _exit(3);
    }
  }
  return NULL;
}

/* Starts the watchdog of this rank. Its deadline is reshard's
 * (RESHARD_TIMEOUT_MS when set and >= 1, else the default 60 s) plus
 * WD_SLACK_MS. */
static inline void wd_start(int rank) {
  wd_state.rank = rank;
#ifdef SMPI_HELPERS_H
  /* Under SimGrid's SMPI (smpicc) ranks are simulated and cannot stop,
   * and a real thread cannot sleep in simulated time: no watchdog. */
#else
  /* read as reshard reads it: an integer in any base, else the default */
  int64_t ms = 60000;
  const char *env = getenv("RESHARD_TIMEOUT_MS");
  if (env && *env) {
    char *end;
    long long v = strtoll(env, &end, 0);
    if (!*end) ms = v;
  }
  /* reshard refuses a timeout below 1 ms at plan creation; the watchdog
   * keeps the default for it, so even that failure path has a deadline.
   * None only for a deadline beyond the clock's range. */
  if (ms <= 0) ms = 60000;
  if (ms > INT64_MAX / 2000000 - WD_SLACK_MS) return;
  wd_state.timeout_ns = (ms + WD_SLACK_MS) * 1000000LL;
  pthread_t t;
  if (pthread_create(&t, NULL, wd_main, NULL) == 0) pthread_detach(t);
#endif
}

/* A blocking call begins (what: for the message) / ended. */
static inline void wd_enter(const char *what) {
  atomic_store(&wd_state.what, what);
  if (wd_state.timeout_ns) atomic_store(&wd_state.deadline_ns, wd_now_ns() + wd_state.timeout_ns);
}
static inline void wd_leave(void) { atomic_store(&wd_state.deadline_ns, 0); }

/* A blocking call under the watchdog, named by its own text. */
#define WD_CALL(call)  \
  do {                 \
    wd_enter(#call);   \
    call;              \
    wd_leave();        \
  } while (0)

#endif
