/*
 * reshard over NCCL: device buffers, stream-ordered execution.
 *
 * Copyright (c) 2026, the reshard authors. BSD-3-Clause (see LICENSE).
 *
 * Available when the library was built with RESHARD_WITH_CUDA (NCCL 2.19
 * or later; tested with 2.28). With an NCCL communicator:
 *
 * - reshard_plan_execute takes device buffers and a cudaStream_t (NULL:
 *   the legacy default stream) as `stream`. It enqueues the whole exchange
 *   after the work already on that stream and returns without waiting for
 *   the GPU; completion is visible on the stream (later work on it sees
 *   the destination buffers written). Source buffers must not change until
 *   then. The first execute of a plan uploads its descriptors and
 *   allocates its staging (ncclMemAlloc); later ones only enqueue.
 * - Executes of one plan run one after the other in stream order, whatever
 *   streams they are given.
 * - CUDA and NCCL failures are RESHARD_ERROR_BACKEND (REMOTE when NCCL
 *   reports a remote peer's failure, OUT_OF_MEMORY for allocations), with
 *   the CUDA/NCCL error in reshard_last_error(). A failure after work was
 *   enqueued marks the plan failed: later executes return
 *   RESHARD_ERROR_INVALID_USAGE; destroy it (and, after an NCCL error, the
 *   communicator). With a nonblocking NCCL communicator, every wait of
 *   reshard (enqueue completion, plan agreement) ends at options.timeout_ms
 *   with ncclCommAbort and RESHARD_ERROR_TIMEOUT, not a hang: the NCCL
 *   communicator is then unusable.
 * - The current CUDA device must be the communicator's device in every
 *   reshard call. Like NCCL itself, calls over one communicator must not
 *   be made from several threads at once.
 */
#ifndef RESHARD_NCCL_H
#define RESHARD_NCCL_H

#include <nccl.h>

#include "reshard.h"

#ifdef __cplusplus
extern "C" {
#endif

/* A reshard communicator over the caller's NCCL communicator, which holds
 * both sides (they may overlap: colocated ranks copy device to device,
 * never through NCCL); reshard ranks are NCCL ranks. The caller keeps
 * ownership: reshard_comm_destroy does not destroy `comm`, which must
 * outlive the reshard communicator. Not collective. */
reshard_result_t reshard_comm_create_nccl(ncclComm_t comm,
                                          reshard_comm_t **out);

#if defined(MPI_VERSION) || defined(RESHARD_NCCL_WITH_MPI)
/* A reshard communicator over a new NCCL communicator bootstrapped from
 * `comm` (rank 0's ncclUniqueId is broadcast over MPI), on the current CUDA
 * device; reshard_comm_destroy destroys it. Collective over comm. Needs a
 * library built with MPI as well (RESHARD_WITH_MPI: absent otherwise);
 * declared when mpi.h is included before this header. */
reshard_result_t reshard_comm_create_nccl_mpi(MPI_Comm comm,
                                              reshard_comm_t **out);

/* A reshard communicator over the caller's NCCL communicator `nccl`
 * (holding both sides, as in reshard_comm_create_nccl) together with the
 * MPI communicator `mpi` it was bootstrapped from: the same ranks in the
 * same order (MPI rank r is NCCL rank r; checked). Execution goes through
 * NCCL; plan agreement (reshard_plan_create) runs on the host over MPI, on
 * a duplicate of `mpi`, polled until options.timeout_ms, instead of an
 * NCCL allreduce: no agreement work on the GPU, no scratch device memory,
 * and a missing rank costs RESHARD_ERROR_TIMEOUT without aborting the
 * NCCL communicator (that reshard communicator can then no longer create
 * plans). The caller keeps ownership of both: reshard_comm_destroy
 * destroys neither, and both must outlive the reshard communicator
 * (destroy it before MPI_Finalize: it frees its duplicate). Collective over
 * `mpi` (MPI_Comm_dup); either every rank gets a communicator or none
 * does. Needs RESHARD_WITH_MPI, like reshard_comm_create_nccl_mpi. */
reshard_result_t reshard_comm_create_nccl_with_mpi(ncclComm_t nccl,
                                                   MPI_Comm mpi,
                                                   reshard_comm_t **out);
#endif

#ifdef __cplusplus
}
#endif

#endif /* RESHARD_NCCL_H */
