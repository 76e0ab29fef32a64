/* A single-rank stand-in for a communicator of `size` ranks, for planning
 * benchmarks without MPI: this process plays rank `rank` and assumes every
 * other rank agrees with it (allreduce_max returns its own values), so
 * reshard_plan_create computes exactly the plan rank `rank` would compute
 * in a real run of `size` ranks. It cannot move data: every point-to-point
 * operation is RESHARD_ERROR_UNSUPPORTED. */
#ifndef RESHARD_BENCH_FAKE_COMM_H
#define RESHARD_BENCH_FAKE_COMM_H

#include "reshard.h"

reshard_result_t bench_fake_comm_create(int rank, int size,
                                        reshard_comm_t **comm);

#endif
