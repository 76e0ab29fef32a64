/*
 * reshard over CUDA IPC: ranks on one node, several per GPU if need be.
 *
 * Copyright (c) 2026, the reshard authors. BSD-3-Clause (see LICENSE).
 *
 * Available when the library was built with RESHARD_WITH_CUDA. The
 * transport for a trainer and an inference engine in different processes
 * on the same GPUs (colocated RL), and for the GPUs of one node: NCCL
 * refuses two ranks on one GPU, CUDA IPC does not mind.
 *
 * How it works. Every rank has one CUDA device (the current one at
 * creation); ranks may share it. Each rank exports a small window of
 * device memory (mailboxes) and its staging pool with cudaIpcGetMemHandle,
 * and maps every other rank's (cudaIpcOpenMemHandle; peers on other
 * devices through peer access, NVLink or PCIe). An execute runs on the
 * device executor, as on NCCL: pack, transfer, unpack, relays and the
 * per-execute agreement; a transfer is a kernel on the receiver that
 * copies the message straight from the sender's staging (a message of at
 * most 96 bytes travels in the mailbox itself).
 *
 * Registered buffers (reshard_plan_register_buffers, reshard.h): every
 * rank's buffers are mapped by its partners once, and each execute then
 * copies every box straight from the sender's buffer into the
 * receiver's, one pass over each byte, no staging (the receiver's kernel
 * runs the composition of the sender's pack and its own unpack). Two
 * tokens per message order it: the sender's "ready" (its data is there),
 * the receiver's "done" (the sender's stream, and so its caller, goes on
 * only once every reader is done). Ordering between
 * processes is on the GPU: a sender's kernel writes a sequence number into
 * the receiver's mailbox, the receiver's kernel waits for it, copies and
 * acknowledges. Nothing waits on the host: an execute is enqueued on your
 * stream and returns.
 *
 * Everything else is as on NCCL (reshard_nccl.h): the same plans and
 * options, device buffers and a cudaStream_t at execute, the same order
 * rule (every rank creates and executes the plans of one communicator in
 * the same order), the same agreement and RESHARD_FLAG_SYNC, the same
 * deadlines and reshard_plan_get_status, and CUDA graphs (a captured
 * execute, registered or staged, launched again and again: every
 * message's sequence number comes from counters on the device, which
 * each launch advances in stream order).
 *
 * No hang. Every wait on the GPU gives up after the plan's timeout_ms
 * (measured on the GPU's clock from when the wait starts), and a failed
 * or refused execute poisons the communicator on this rank and on every
 * peer it can reach (a word in each window every wait checks), so the
 * partners' GPU work ends at once instead of at their deadline. A wait
 * that gave up writes no destination byte of its call or a later one; the
 * next execute or reshard_plan_get_status returns RESHARD_ERROR_TIMEOUT
 * (or RESHARD_ERROR_REMOTE when a peer poisoned the communicator) naming
 * the peer. After that the communicator only fails (INVALID_USAGE):
 * destroy its plans and it, and create a new one.
 *
 * What breaks IPC. cudaIpcGetMemHandle needs memory from cudaMalloc:
 * reshard allocates its window and staging that way itself, so your
 * buffers may come from any allocator (PyTorch's expandable_segments and
 * other virtual-memory allocators included): reshard reads and writes
 * them only on this rank. Containers must share the IPC namespace and the
 * GPUs (docker --ipc=host); a failed mapping is RESHARD_ERROR_BACKEND with
 * the CUDA error and the peer's rank in reshard_last_error().
 *
 * Memory. Per rank: a window of 256 + 1 KiB x ranks bytes, and the
 * staging pool (2 x (send half + recv half) of the largest live plan, at
 * most options.staging_bytes), both cudaMalloc'd; every peer's are mapped.
 * cudaMalloc and cudaFree of the pool synchronize the device (only at
 * plan creation and destruction).
 *
 * Not yet measured on a GPU (tested on the emulated device of the CPU
 * tests); registered buffers with RESHARD_FLAG_DOUBLE_BUFFER are refused.
 */
#ifndef RESHARD_CUDA_IPC_H
#define RESHARD_CUDA_IPC_H

#include "reshard.h"

#ifdef __cplusplus
extern "C" {
#endif

/* A reshard communicator of CUDA IPC over the host communicator `host`
 * (reshard_comm_create_mpi, typically; every rank a process or thread on
 * this node), on the current CUDA device. Collective over host: ranks
 * exchange their windows' handles; either every rank gets a communicator
 * or none does. Plan agreement (reshard_plan_create) runs over `host`,
 * which must outlive the result and is not destroyed with it. Destroy the
 * IPC communicator on every rank after its plans' last executes. */
reshard_result_t reshard_comm_create_cuda_ipc(reshard_comm_t *host,
                                              reshard_comm_t **out);

#ifdef __cplusplus
}
#endif

#endif /* RESHARD_CUDA_IPC_H */
