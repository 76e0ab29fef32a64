/* RESHARD_TEST_SCALE: scales the case counts of the heavy property tests,
 * for slow runs (valgrind, emulators) that must still cover every kind of
 * case rather than skip a test. Unset: 1. A factor in (0, 1] (e.g. 0.1)
 * runs that fraction of the seeds, at least one; larger factors run more. */
#ifndef RS_TEST_SUPPORT_TEST_SCALE_H
#define RS_TEST_SUPPORT_TEST_SCALE_H

#include <stdlib.h>

static inline double rs_test_scale(void) {
  const char *e = getenv("RESHARD_TEST_SCALE");
  if (!e || !*e) return 1.0;
  char *end = NULL;
  double f = strtod(e, &end);
  return end && *end == '\0' && f > 0 && f <= 1000 ? f : 1.0;
}

/* n cases scaled by RESHARD_TEST_SCALE, at least 1. */
static inline long rs_test_scaled(long n) {
  double v = (double)n * rs_test_scale();
  return v < 1 ? 1 : (long)v;
}

#endif
