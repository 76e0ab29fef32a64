/* Monotonic time and deadlines (every wait in reshard has one). */
#ifndef RS_COMMON_CLOCK_H
#define RS_COMMON_CLOCK_H

#include <sched.h>
#include <stdint.h>
#include <time.h>

#define RS_NO_DEADLINE INT64_MAX

static inline int64_t rs_now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

/* The deadline timeout_ms from now; RS_NO_DEADLINE when timeout_ms <= 0. */
static inline int64_t rs_deadline_after_ms(int64_t timeout_ms) {
  if (timeout_ms <= 0) return RS_NO_DEADLINE;
  int64_t now = rs_now_ns();
  /* a deadline past the clock's range is no deadline */
  if (timeout_ms > (INT64_MAX - now) / 1000000LL) return RS_NO_DEADLINE;
  return now + timeout_ms * 1000000LL;
}

/* The back-off of a polling loop at its spin-th turn: busy at first, then
 * yielding, then 20 us naps (a poll answers within tens of microseconds
 * and costs no core while a wait is long). In SimGrid builds nanosleep is
 * simulated time and spinning is not: every turn naps 1 us, so that a
 * wait ends within 1 us of simulated time of its completion (20 us naps
 * added up to 20 us a round to the simulated times) and a waiting rank
 * costs the simulator one poll per simulated microsecond, not hundreds. */
static inline void rs_nap(unsigned spin) {
#ifdef RESHARD_SIMGRID_BUILD
  (void)spin;
  struct timespec ts = {0, 1000};
#else
  if (spin < 64) return;
  if (spin < 256) {
    sched_yield();
    return;
  }
  struct timespec ts = {0, 20000};
#endif
  nanosleep(&ts, NULL);
}

#endif
