/*
 * reshard over MPI: host buffers, any MPI library (tested with Open MPI).
 *
 * Copyright (c) 2026, the reshard authors. BSD-3-Clause (see LICENSE).
 *
 * Available when the library was built with RESHARD_WITH_MPI (the default
 * where an MPI is found); link MPI as well.
 */
#ifndef RESHARD_MPI_H
#define RESHARD_MPI_H

#include <mpi.h>

#include "reshard.h"

#ifdef __cplusplus
extern "C" {
#endif

/* A reshard communicator over `comm`, which holds both sides (they may
 * overlap: colocated ranks); reshard ranks are comm's ranks. Collective
 * over comm: reshard duplicates it (MPI_Comm_dup), so its messages never
 * match the application's, and sets MPI_ERRORS_RETURN on the duplicate so
 * that MPI failures become RESHARD_ERROR_BACKEND instead of aborting.
 * Destroy with reshard_comm_destroy (which frees the duplicate) before
 * MPI_Finalize. */
reshard_result_t reshard_comm_create_mpi(MPI_Comm comm, reshard_comm_t **out);

#ifdef __cplusplus
}
#endif

#endif /* RESHARD_MPI_H */
