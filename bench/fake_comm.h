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

/* The same, playing a transport that replaces ranks (as UCX does): plans
 * record their creation for a rejoin, as on UCX, and bench_fake_comm_
 * rejoined makes the communicator count one rank replaced, so that
 * reshard_plan_rejoin runs on a plan made before (every agreement is this
 * rank's own words: the kept plan's local work, no network). */
reshard_result_t bench_fake_comm_create_replacing(int rank, int size,
                                                  reshard_comm_t **comm);
void bench_fake_comm_rejoined(reshard_comm_t *comm);

#endif
