/*
 * reshard over NCCL: device buffers, stream-ordered execution.
 *
 * Copyright (c) 2026, the reshard authors. BSD-3-Clause (see LICENSE).
 *
 * Available when the library was built with RESHARD_WITH_CUDA (NCCL 2.19
 * or later; tested with 2.28). The rules, in plain words:
 *
 * Ownership. reshard never aborts, destroys or sends on your NCCL
 * communicator. reshard_comm_create_nccl splits a private communicator off
 * it (ncclCommSplit, nonblocking, sharing nothing with yours); all of
 * reshard's NCCL work runs there, and that is the only communicator
 * reshard ever aborts. Yours stays usable whatever happens to reshard's,
 * must outlive the reshard communicator, and is yours to destroy. Do not
 * create it with splitShare = 1 (or NCCL_COMM_SPLIT_SHARE_RESOURCES=1,
 * refused): a child would then share your abort flag. NCCL_COMM_BLOCKING=1
 * is refused too (it would make reshard's communicator blocking, and its
 * waits could not end at a deadline).
 *
 * Execution. reshard_plan_execute takes device buffers and a cudaStream_t
 * (NULL: the legacy default stream) as `stream`. It enqueues the whole
 * exchange after the work already on that stream and returns without
 * waiting for the GPU; completion is visible on the stream. Source
 * buffers must not change until then. Everything a plan's executes need
 * (descriptors on the device, staging, connections to its peers) is set
 * up by reshard_plan_create, so a rank that cannot set up fails creation
 * on every rank, and a peer that comes late to an execute only delays the
 * GPU.
 *
 * Order. NCCL runs a communicator's work in the order it was issued,
 * whatever the stream, and pairs point-to-point messages by that order
 * (no tags). So: every rank must call reshard_plan_create and
 * reshard_plan_execute, of all plans on one reshard communicator, in the
 * same order; executes of a communicator's plans run one after another on
 * the GPU (they share the communicator's staging pool). Ranks that issue
 * plans in different orders wait on each other on the GPU: reshard cannot
 * see that, but no reshard call hangs on it (see Deadlines). Plan
 * creation waits for the communicator's earlier executes first, so its
 * own deadline measures the agreement, not the GPU backlog.
 *
 * Agreement. Every execute swaps a header (plan digest, call number,
 * weight version) with each partner ahead of its data, checked on the
 * GPU: ranks out of step (a skipped execute, another version) write no
 * destination byte of that call or any later one, and the next execute
 * or reshard_plan_get_status returns RESHARD_ERROR_MISMATCH naming the
 * partner and both calls and versions. In relay plans the verdict is
 * global (one 8-byte allreduce per execute): a rank whose data comes
 * through forwards from an out-of-step source fails too. With
 * RESHARD_FLAG_SYNC execute itself waits for its work (polled, until its
 * deadline) and returns that call's result. Pass the training step with
 * reshard_plan_execute_version: plain executes number calls, which a
 * skipped step does not change.
 *
 * Deadlines. Every execute must finish within options.timeout_ms of being
 * enqueued (waiting for earlier ones included). reshard_plan_get_status
 * never blocks and fails a plan whose last execute is not done past that
 * deadline (RESHARD_ERROR_TIMEOUT); reshard_plan_destroy waits for the
 * plan's work until then at most. To wait for an execute without risking
 * a hang on a peer that never comes, poll cudaStreamQuery(stream) and
 * reshard_plan_get_status together; cudaStreamSynchronize would wait for
 * as long as NCCL does (forever, on NVLink).
 *
 * CUDA graphs. An execute may be captured into a CUDA graph
 * (cudaStreamBeginCapture on `stream`, in any capture mode: reshard's
 * host queries, in executes and reshard_plan_get_status, are made in
 * relaxed mode, so they invalidate no capture, this thread's or another's;
 * plan and communicator creation and destruction allocate and copy
 * synchronously, which a global-mode capture open on another thread
 * forbids) and the graph launched any number
 * of times: each launch runs that call again on the GPU, with the values
 * its source buffers hold then, ordered after the execute (or launch)
 * before it and before the one after it, captured or not (external event
 * nodes). Every rank captures and launches alike, as NCCL requires of
 * captured work. On CUDA IPC too (reshard_cuda_ipc.h: its messages are
 * numbered by counters on the device). Refused before anything is
 * enqueued, the capture left valid and the plan usable: a plan's first
 * execute (capture after one execute with the same buffers: a graph reads
 * the buffer table as it stands; INVALID_USAGE, as for other buffers),
 * and RESHARD_FLAG_SYNC (INVALID_USAGE). Quantizing plans are captured
 * whole (the plan gathering split blocks, the quantize kernel and the
 * sync; a refusal of the sync's capture may come after the gathering's
 * was captured: discard that capture). An uncaptured execute of a plan while an execute of it is
 * being captured on another stream is refused (INVALID_USAGE) and fails
 * the plan. An execute that fails inside a capture leaves part of the
 * call in it: discard that capture. What a launch repeats is the
 * captured call: the same call number and weight version in its
 * agreement headers and, with RESHARD_FLAG_DOUBLE_BUFFER, in its commit
 * (the copies flip at every launch; reshard_plan_get_status's
 * committed_version stays the captured call's; execute again, uncaptured,
 * to advance it), so ranks that launch different graphs of one plan, or
 * skip a launch, are told apart only where those calls differ. A
 * launch's deadline counts from when it starts on the GPU, once the work
 * before it is done (a host node of the graph stamps it; a launch queued
 * behind your stream's work has none yet, and plan creation, which waits
 * for the communicator's executes, gives it RESHARD_TIMEOUT_MS, default
 * 60 s, to start and finish), and reshard_plan_get_status
 * fails the plan with RESHARD_ERROR_TIMEOUT past it, as for an execute.
 * The graph reads the plan's device state and the communicator's staging
 * pool as captured (a pool replaced by a later, larger plan is kept, until
 * the communicator goes): destroy the graph executables before the plan,
 * and stop launching
 * them once the plan failed (a launch after reshard aborted its
 * communicator would run NCCL work on it). Each set of buffers a captured
 * execute uses keeps one of the plan's four buffer tables; an execute
 * with buffers that need a fifth is refused (INVALID_USAGE) and fails the
 * plan. A registered plan (CUDA IPC) cannot be registered again once an
 * execute of it was captured.
 *
 * Failures. CUDA and NCCL failures are RESHARD_ERROR_BACKEND (REMOTE when
 * NCCL reports a remote peer's failure, OUT_OF_MEMORY for allocations),
 * with the CUDA/NCCL error in reshard_last_error(). An execute that fails
 * or is refused (bad arguments, the wrong device, inside your group) in a
 * plan with partners aborts reshard's private communicator: its partners
 * may have queued their half of the call, and NCCL would pair that with
 * this rank's next one. Every later call on that reshard communicator
 * returns RESHARD_ERROR_INVALID_USAGE. What to do: destroy its plans and
 * the reshard communicator, and create a new one from your NCCL
 * communicator (untouched). The partners learn of it at their deadline:
 * at reshard_plan_get_status, reshard_plan_destroy, the next plan
 * creation, or an execute that has to wait for earlier ones; each then
 * aborts its own private communicator, which ends the stuck GPU work, so
 * their streams complete (without the data). An asynchronous NCCL error
 * (ncclCommGetAsyncError) poisons the communicator the same way.
 *
 * Devices and threads. The current CUDA device must be the communicator's
 * in every reshard call (else INVALID_USAGE naming both; plan agreement
 * itself switches to it, so every rank fails creation together). Calls
 * over one communicator must not be made from several threads at once,
 * and one thread cannot be two ranks: creation is collective. Do not call
 * reshard between your own ncclGroupStart and ncclGroupEnd (refused with
 * INVALID_USAGE; detected with NCCL 2.22 or later).
 *
 * Memory. reshard's private communicator has its own NCCL buffers: for
 * every peer a plan exchanges with, per channel and direction, NCCL's
 * point-to-point chunk times its 8 steps (NCCL src/init.cc: 512 KiB over
 * NVLink, 128 KiB over PCIe or the network by default, so 4 MiB and
 * 1 MiB), outside options.staging_bytes. The staging itself is one pool
 * per reshard communicator, as large as its largest live plan needs
 * (2 x (send half + recv half), at most staging_bytes), not one per plan.
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
 * never through NCCL); reshard ranks are NCCL ranks. Collective over
 * `comm`, like the ncclCommSplit it makes reshard's private communicator
 * with (and blocking as that does on your communicator; with a
 * nonblocking one it is polled until RESHARD_TIMEOUT_MS, default 60 s).
 * reshard_comm_destroy finalizes the private one (polled until that
 * deadline, then aborted) and never touches `comm`, which must outlive
 * the reshard communicator. */
reshard_result_t reshard_comm_create_nccl(ncclComm_t comm,
                                          reshard_comm_t **out);

#if defined(MPI_VERSION) || defined(RESHARD_NCCL_WITH_MPI)
/* A reshard communicator over a new NCCL communicator bootstrapped from
 * `comm` (rank 0's ncclUniqueId is broadcast over MPI), on the current CUDA
 * device: reshard's own from the start (nonblocking, polled until
 * RESHARD_TIMEOUT_MS), destroyed with it. Collective over comm. Needs a
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
 * and a missing rank at creation costs RESHARD_ERROR_TIMEOUT without
 * aborting reshard's NCCL communicator (that reshard communicator can then
 * no longer create plans). The caller keeps ownership of both:
 * reshard_comm_destroy destroys neither (it splits its private NCCL
 * communicator off `nccl`, as reshard_comm_create_nccl does, and
 * duplicates `mpi`), and both must outlive the reshard communicator
 * (destroy it before MPI_Finalize: it frees its duplicate). Collective
 * over both; either every rank gets a communicator or none does. Needs
 * RESHARD_WITH_MPI, like reshard_comm_create_nccl_mpi. */
reshard_result_t reshard_comm_create_nccl_with_mpi(ncclComm_t nccl,
                                                   MPI_Comm mpi,
                                                   reshard_comm_t **out);
#endif

#ifdef __cplusplus
}
#endif

#endif /* RESHARD_NCCL_H */
