/*
 * reshard over UCX: host buffers, processes launched any way (Ray actors,
 * plain subprocesses), no MPI.
 *
 * Copyright (c) 2026, the reshard authors. BSD-3-Clause (see LICENSE).
 *
 * Available when the library was built with RESHARD_WITH_UCX (the default
 * where UCX's pkg-config file `ucx` is found; Debian: libucx-dev).
 */
#ifndef RESHARD_UCX_H
#define RESHARD_UCX_H

#include "reshard.h"

#ifdef __cplusplus
extern "C" {
#endif

/* A communicator of `size` processes over UCX (UCP tagged messages), with
 * no MPI. Every process calls it with the same rendezvous address
 * "host:port" (an IPv4 address or a host name) and its own rank in
 * [0, size): rank 0 listens there, the others connect to it and send
 * their UCX worker addresses; rank 0 hands the table to everyone, every
 * rank connects to every other, and a first agreement checks that all
 * arrived. Collective; every wait ends timeout_ms after the call (< 1:
 * RESHARD_TIMEOUT_MS, else 60000) with RESHARD_ERROR_TIMEOUT, and a
 * failure on one rank makes the others time out (nothing of the
 * communicator is left behind). UCX's own environment (UCX_TLS, UCX_NET_
 * DEVICES, ...) picks the wires: shared memory between processes of a
 * node, TCP or RDMA across nodes; the rendezvous itself is a TCP
 * connection, so UCX_TLS must keep tcp (sm,self alone times out). Rank 0
 * keeps listening there while its communicator lives (newcomers of a
 * rejoin or resize connect to it, even before the staying ranks call);
 * the port is free again once it is destroyed (reshard sets
 * UCX_CM_REUSEADDR unless you did). Destroy with reshard_comm_destroy. */
reshard_result_t reshard_comm_create_ucx(const char *rendezvous, int rank, int size, int timeout_ms,
                                         reshard_comm_t **out);

/* Replacing a rank without rebuilding the others' communicator: the
 * process of rank `rank` (1 .. size-1) died or left, and a new process
 * takes its slot. The staying ranks (every rank but `rank`) call
 * reshard_comm_ucx_rejoin(comm, rank, timeout_ms) on their communicator;
 * the newcomer calls reshard_comm_create_ucx_joining with the
 * communicator's rendezvous, `rank` and size. The staying ranks keep
 * their UCX context, worker, endpoints to one another, and everything
 * registered on them; each closes its endpoint to the old process,
 * drops the messages it left behind, and connects to the newcomer.
 *
 * How: every staying rank sends rank 0 its counters (agreements made,
 * plans created, rejoins done) and the rank it replaces; rank 0 (which
 * listens on the rendezvous while its communicator lives) takes the
 * newcomer's worker address, and sends every
 * staying rank the address and the newcomer the address table, both with
 * the agreed counters: the numbering of agreements starts past every
 * rank's, and the rejoin count salts the message tags, so nothing the
 * old process sent, and no agreement a rank abandoned, can pair with the
 * newcomer's messages. A last agreement over all ranks (the newcomer's
 * first) ends it. Every wait ends timeout_ms after the call (< 1:
 * RESHARD_TIMEOUT_MS, else 60000) with RESHARD_ERROR_TIMEOUT, e.g. when
 * no newcomer arrives or a staying rank does not call.
 *
 * Refused with RESHARD_ERROR_INVALID_ARGUMENT, the communicator unchanged:
 * rank 0 (it holds the rendezvous: make a new communicator), a rank out
 * of range, the calling rank itself, a communicator of another transport.
 * When no newcomer arrived before rank 0's deadline, every staying rank
 * returns RESHARD_ERROR_TIMEOUT with nothing changed (its message says
 * so): call it again, on every staying rank, to wait longer (a staying
 * rank waits for rank 0's word up to twice timeout_ms, since rank 0's
 * deadline may have begun later). Any other failure (TIMEOUT when a
 * staying rank did not call or rank 0 did not answer, MISMATCH when the
 * staying ranks name different ranks, BACKEND) leaves the communicator
 * failed: every later use returns RESHARD_ERROR_INVALID_USAGE; destroy
 * it.
 *
 * Plans: a plan whose execute failed because the old process died is
 * failed or in doubt (reshard_plan_get_status; with double buffering its
 * active copy still holds the last committed version). Either the
 * staying ranks keep their plans: each calls reshard_plan_rejoin (in
 * reshard.h) on every plan it keeps, in the order in which the newcomer
 * calls reshard_plan_create for the same layouts and options; the kept
 * plan plans nothing again, replays the collectives its own creation ran
 * (recorded then: any plan, relay -1 with a topology, spreading and fp8
 * block quantization included) with the words it contributed, and its
 * failure is cleared, so the next version works on every rank. Or they
 * destroy their plans and every rank (newcomer included) creates them
 * again, as at first. Not thread-safe
 * with other calls on the same communicator: no plan of it may run
 * during the rejoin. The replaced process must be gone (or never touch
 * its communicator again). */
reshard_result_t reshard_comm_ucx_rejoin(reshard_comm_t *comm, int rank, int timeout_ms);

/* reshard_comm_ucx_rejoin for several ranks at once: the n processes of
 * ranks[0..n) (each 1 .. size-1, distinct, in any order: a replica of
 * tensor-parallel ranks) died or left together, and n new processes take
 * their slots, each calling reshard_comm_create_ucx_joining with its
 * rank. The staying ranks (every rank not named) call it with the same
 * ranks (MISMATCH otherwise); rank 0 waits for every newcomer, sends the
 * staying ranks all their addresses and every newcomer the table (the
 * newcomers connect to one another from it). Its results as for one
 * rank; when a newcomer did not arrive before rank 0's deadline, every
 * staying rank returns TIMEOUT with nothing changed, and rank 0 tells the
 * newcomers that did arrive (their reshard_comm_create_ucx_joining
 * returns TIMEOUT at once, saying rank 0 gave up: start them again for
 * the next call). reshard_comm_ucx_rejoin(c, r, t) is
 * reshard_comm_ucx_rejoin_ranks(c, &r, 1, t). Refused with
 * INVALID_ARGUMENT, nothing changed: ranks NULL, n < 1 or n >= size,
 * and each refusal of the one-rank call, or a rank named twice. Kept
 * plans (reshard_plan_rejoin) meet every newcomer's creation at once. */
reshard_result_t reshard_comm_ucx_rejoin_ranks(reshard_comm_t *comm, const int *ranks, int n, int timeout_ms);

/* Changing the communicator's size without rebuilding it for the ranks
 * that stay: the processes of leaving[0..nleave) (each 1 .. size-1,
 * distinct; a replica's ranks, say) left or died, and njoin new
 * processes join; either count may be 0, not both. The staying ranks
 * (every rank not named) call it with the same arguments. They keep
 * their UCX context, worker and endpoints to one another, and are
 * renumbered: they close up in their order (rank 0 stays 0; a staying
 * rank p becomes p less the leaving ranks below it), and the newcomers
 * take the ranks after them, size - nleave .. size - nleave + njoin - 1,
 * each calling reshard_comm_create_ucx_joining with the communicator's
 * rendezvous, its new rank and the new size. reshard_comm_rank and
 * reshard_comm_size say the new numbering once it returns.
 *
 * Every plan made before a resize names ranks of the old numbering:
 * each call of it that reaches a peer (execute, register,
 * reshard_plan_rejoin, reshard_plan_estimate, resolve of a version in
 * doubt) is refused with RESHARD_ERROR_INVALID_USAGE, nothing changed;
 * reading its status or stats still works; destroy it,
 * and every rank (the newcomers included) creates the plans of the new
 * layouts. How: the rejoin's protocol (rank 0 takes the staying ranks'
 * counters and the newcomers' addresses, answers each), in the new
 * numbering; with no newcomer, none is awaited. A leaving process that is
 * still alive must not touch its communicator again (destroy it).
 *
 * Results as reshard_comm_ucx_rejoin_ranks': refused with
 * INVALID_ARGUMENT, nothing changed: leaving NULL with nleave > 0,
 * nleave or njoin negative, both 0, a leaving rank 0, out of range,
 * named twice or the calling rank itself, over 2^24 - 1 ranks. When a
 * newcomer did not arrive before rank 0's deadline, every staying rank
 * returns TIMEOUT with its numbering as before (the leaving ranks'
 * connections closed): call it again to wait longer. Any other failure
 * leaves the communicator failed (INVALID_USAGE on every later use). */
reshard_result_t reshard_comm_ucx_resize(reshard_comm_t *comm, const int *leaving, int nleave, int njoin,
                                         int timeout_ms);

/* The newcomer's side of reshard_comm_ucx_rejoin (and _resize): a
 * communicator of `size` in which this process is `rank` (1 .. size-1,
 * the replaced rank's slot, or a resize's new rank and new size), made
 * with the staying ranks' rendezvous. It connects to rank 0 (retrying
 * every 20 ms while nothing listens) and sends its address, which waits
 * at rank 0 for the staying ranks' call (it may come first); it receives
 * the table of addresses and the agreed counters, and connects to every
 * rank. Its deadline, result codes and cleanup are reshard_comm_create_
 * ucx's; rank 0 is refused (INVALID_ARGUMENT). */
reshard_result_t reshard_comm_create_ucx_joining(const char *rendezvous, int rank, int size, int timeout_ms,
                                                 reshard_comm_t **out);

/* GPU memory over UCX: a communicator for plans whose buffers are CUDA
 * device memory (the device executor: pack and unpack kernels on the
 * caller's stream, as over NCCL or CUDA IPC), whose transfers are UCP
 * tagged messages of the staging pool's device memory over the UCX
 * communicator `ucx`, on the current CUDA device. Where the UCX this
 * process loaded moves CUDA memory (a CUDA-enabled build, such as the
 * libucx-cu13 wheel's libraries put first on LD_LIBRARY_PATH:
 * scripts/ucx_cuda_prefix.sh), UCX moves the device memory itself and
 * picks the wire: CUDA IPC between GPUs of a node, RDMA with GPUDirect
 * across nodes. Otherwise (Debian's libucx is built without CUDA) every
 * message goes through pinned host memory: copied from the device after
 * the round's packs, to it before the unpacks (a mirror of the staging
 * pool; each rank as its own UCX allows). RESHARD_ERROR_UNSUPPORTED in a
 * build of reshard without CUDA.
 *
 * Collective over `ucx`, which carries plan agreement, must outlive the
 * result, is not destroyed with it, and must keep its membership: after
 * reshard_comm_ucx_rejoin or _resize on it every call on this
 * communicator and its plans returns INVALID_USAGE (destroy them and
 * create them again, newcomers included). Either every rank gets a
 * communicator or none does.
 *
 * How it runs: UCX transfers are posted and completed by the host, so
 * reshard_plan_execute holds the calling thread: before posting a round's
 * messages it waits (polled, until the plan's deadline) for the work its
 * stream waits for (the round's packs, the unpack that last read the
 * staging half it reuses, and at the first one the caller's earlier work
 * on `stream`), and it waits for a round's messages before enqueueing the
 * unpack that reads them, one round later, so a round's messages travel
 * while the GPU packs the next round and unpacks the previous one. It
 * returns once its last transfer has landed (its last unpacks still
 * queued on the stream; with RESHARD_FLAG_DOUBLE_BUFFER once they ran,
 * before the commit's vote). An execute inside a CUDA
 * graph capture is refused (UNSUPPORTED, nothing enqueued), and
 * reshard_plan_register_buffers returns UNSUPPORTED (transfers go
 * through the staging pool). Messages carry the communicator's own tags:
 * several UCX (CUDA) communicators over one UCX communicator never pair
 * with one another, nor with one destroyed after a failure. Executes of
 * one communicator's plans must come one at a time (not from several
 * threads at once) and in the same order on every rank, as on NCCL. A failure poisons the
 * communicator (later calls INVALID_USAGE); a UCX transfer of a failed
 * call that still runs a second later keeps the staging pool allocated
 * for good. Not yet run on a GPU (tested on the emulated device of the
 * CPU tests; scripts/gpu_check.sh runs it). */
reshard_result_t reshard_comm_create_ucx_cuda(reshard_comm_t *ucx, reshard_comm_t **out);

#ifdef __cplusplus
}
#endif

#endif /* RESHARD_UCX_H */
