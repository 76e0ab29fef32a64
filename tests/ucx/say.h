/* What the UCX process tests (tests/ucx/test_ucx_*.c) print and count:
 * "PASS <id>: ..." or "FAIL <id>: ..." lines, flushed at once (run_ucx.sh
 * prints every process's output afterwards), and the failures in `bad`.
 * Define SAY_FMT (the id's printf format) and SAY_ID (its value) first. */
#ifndef RS_TESTS_UCX_SAY_H
#define RS_TESTS_UCX_SAY_H

#include <stdarg.h>
#include <stdio.h>
#include <time.h>

#if !defined(SAY_FMT) || !defined(SAY_ID)
#error "define SAY_FMT and SAY_ID before including say.h"
#endif

static int bad; /* FAIL lines so far */

static double now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

static void say(int ok, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void say(int ok, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  printf("%s " SAY_FMT ": ", ok ? "PASS" : "FAIL", SAY_ID);
  vprintf(fmt, ap);
  printf("\n");
  fflush(stdout);
  va_end(ap);
  bad += !ok;
}

#endif
