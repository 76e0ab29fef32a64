/* Planning one rank of a large job in this process: the rank's plan is
 * created against a fake communicator (fake_comm.h), so the cost measured
 * is exactly that rank's planning work in a real run. */
#ifndef RESHARD_BENCH_PLAN_MEASURE_H
#define RESHARD_BENCH_PLAN_MEASURE_H

#include "reshard_internal.h"
#include "reshard.h"

/* Creates rank's plan; on success *comm and *plan belong to the caller
 * (pm_plan_free). */
reshard_result_t pm_plan_rank(const reshard_layout_t *src,
                              const reshard_layout_t *dst, int rank,
                              int nranks, const reshard_options_t *opts,
                              reshard_comm_t **comm, reshard_plan_t **plan);
void pm_plan_free(reshard_comm_t *comm, reshard_plan_t *plan);

typedef struct pm_result {
  int ok;
  int peak_exact;  /* the peak RSS could be reset before planning */
  double plan_ms;  /* wall time */
  double cpu_ms;   /* thread CPU time */
  double peak_mib; /* peak RSS growth while planning */
  double plan_mib; /* heap the finished plan keeps (glibc's view) */
  reshard_plan_stats_t stats;
  char err[512];
} pm_result;

/* Plans rank in a forked child, so that nothing this process did before
 * (or does after) counts towards the peak memory. */
void pm_measure(const reshard_layout_t *src, const reshard_layout_t *dst,
                int rank, int nranks, const reshard_options_t *opts,
                pm_result *out);

#endif
