/*
 * reshard in one process: nranks ranks as threads of one process (tests,
 * examples, single-process tools).
 *
 * Copyright (c) 2026, the reshard authors. BSD-3-Clause (see LICENSE).
 *
 * Always available (no dependency).
 */
#ifndef RESHARD_INPROC_H
#define RESHARD_INPROC_H

#include "reshard.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Create the world once, then each thread takes its rank's communicator. */
typedef struct reshard_inproc_world reshard_inproc_world_t;

reshard_result_t reshard_inproc_world_create(int nranks,
                                             reshard_inproc_world_t **world);
/* Destroy after every communicator of the world is destroyed. */
void reshard_inproc_world_destroy(reshard_inproc_world_t *world);
reshard_result_t reshard_comm_create_inproc(reshard_inproc_world_t *world,
                                            int rank, reshard_comm_t **comm);

#ifdef __cplusplus
}
#endif

#endif /* RESHARD_INPROC_H */
