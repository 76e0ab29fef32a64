/* An emulated CUDA device and NCCL, linked into the CPU-side GPU tests
 * with -Wl,--wrap (tests.cmake): no GPU or driver needed.
 *
 * "Device" memory is host memory. Work enqueued on a stream runs later, in
 * stream order, as real work does: a kernel or copy runs once everything
 * before it on its stream is done and the events it waits for completed;
 * host queries and synchronizations see only finished work. The copy
 * kernel is emulated on the CPU (kernels/rs_tile.h), so plans move real
 * data.
 *
 * NCCL is modelled where reshard's hazards live:
 * - point-to-point messages go through bounded channels per (communicator,
 *   sender, receiver), matched in posting order, sizes checked (a
 *   mismatch is what real NCCL leaves undefined);
 * - all NCCL work of one communicator runs in issue order, whatever the
 *   stream (a group or an allreduce starts only after the previous one
 *   of that communicator finished);
 * - peers connect lazily, each direction on its own: the first send to a
 *   peer (receive from it) completes its enqueue (ncclGroupEnd;
 *   ncclInProgress on nonblocking communicators) only once that peer has
 *   posted the matching receive (send) too;
 * - nested ncclGroupStart launches nothing until the outermost
 *   ncclGroupEnd; ncclGroupSimulateEnd validates its argument only there;
 * - ncclCommSplit makes a new communicator once every rank of the world
 *   has split (blocking as the parent is; the child nonblocking when its
 *   config says so);
 *   ncclCommAbort drops the communicator's pending work; any later use of
 *   an aborted or destroyed communicator is counted as a use after free.
 *
 * CUDA graphs (stream capture) are modelled as reshard meets them:
 * work enqueued on a capturing stream becomes a node of the capture; a
 * stream joins it by waiting on an event recorded in it; EndCapture
 * wants every joined stream waited for by the origin; each
 * cudaGraphLaunch enqueues the nodes again, in capture order, on the
 * executable's own streams after the launch stream's work, with NCCL's
 * tickets taken then; a host node (cudaLaunchHostFunc) runs when its
 * stream gets there. What CUDA rejects during a capture is rejected and
 * counted in world.capture_violations: querying or synchronizing a
 * capturing stream or a captured event; any query, synchronization,
 * allocation or synchronous copy while a capture forbids it (the calling
 * thread's mode, cudaThreadExchangeStreamCaptureMode, against the open
 * captures of its rank, a rank being a process); waiting from a capture
 * on an event recorded outside it without cudaEventWaitExternal (or on a
 * captured one from outside); the External flags outside a capture; and
 * (stricter than CUDA, which reads the source at each launch) copies
 * from pageable host memory.
 *
 * A host wait that could never end (a synchronization on work that waits
 * for a message nobody sends) is cut after world.hang_ms and counted in
 * world.hangs: the test then fails instead of hanging.
 *
 * One rank per thread: the thread's rank and its injections are in M
 * (thread-local); the world (channels, streams, communicators) is shared,
 * behind one lock. Without mock_world_begin a rank is alone: its groups
 * complete without peers (a receive gets what the group sent that peer,
 * as from a partner in lockstep) and allreduce is the identity. */
#ifndef RS_TESTS_GPU_MOCK_DEVICE_H
#define RS_TESTS_GPU_MOCK_DEVICE_H

#include <cuda_runtime.h>
#include <nccl.h>
#include <stddef.h>
#include <stdint.h>

#include <unistd.h>

#include "kernels/rs_agree.h"
#include "kernels/rs_ipc.h"
#include "kernels/rs_verify.h"
#include "plan/plan.h"

/* The call log of the thread (for call-sequence checks). */
enum { OP_LAUNCH, OP_GROUP, OP_WAIT, OP_REC, OP_MEMCPY, OP_SYNC, OP_CALLER };

typedef struct mop {
  int kind;
  void *stream;
  void *ev;   /* OP_REC / OP_WAIT */
  int kind2;  /* OP_LAUNCH: 0 pack, 1 unpack, 2 local */
  int round;  /* OP_LAUNCH / OP_GROUP */
  int first_send, nsend; /* OP_GROUP: its entries in p2p[] */
} mop;

typedef struct mp2p {
  int peer, is_recv;
  size_t bytes;
  void *stream;
  void *buf;
  ncclComm_t comm;
} mp2p;

#define MAXOPS 4096
#define MAXR 64

typedef struct mock_thread {
  int log_off; /* no op log (multi-rank worlds) */
  mop ops[MAXOPS];
  int nops;
  mp2p p2p[MAXOPS];
  int np2p;
  int group_depth, group_first;
  int rank, size;
  int device;      /* cudaGetDevice */
  int comm_device; /* ncclCommCuDevice of every communicator */
  /* live resources */
  long mem, streams, events;
  long syncs; /* host synchronizations */
  int aborts; /* ncclCommAbort calls of this thread */
  /* injection */
  int fail_malloc_async_at; /* n-th cudaMallocAsync fails (1-based) */
  int fail_nccl_mem;
  int fail_malloc; /* cudaMalloc fails */
  int fail_launch_at; /* n-th copy launch fails (1-based) */
  int launches;
  ncclResult_t allreduce_result;
  int allreduce_calls;
  int malloc_async_calls;
  ncclResult_t group_end_result;
  int group_end_fail_at; /* which outermost group (1-based) */
  int groups;            /* outermost groups ended */
  ncclResult_t async_error;
  int inprogress_polls; /* ncclInProgress for this many polls, -1: forever */
  int p2p_inprogress;   /* ncclSend/ncclRecv return ncclInProgress */
  int split_never;      /* a nonblocking split never completes */
  int parent_nonblocking; /* the caller's communicator is nonblocking */
  ncclResult_t split_result; /* a nonblocking parent's split fails so */
  int splits;           /* ncclCommSplit calls */
  int64_t kernel_ns;    /* device time of every copy kernel */
  uint64_t tamper_version; /* added to the version in this rank's agreement */
  uint64_t tamper_digest;  /* nonzero: only in the headers of the plan with this digest */
  int fail_ipc_open;       /* cudaIpcOpenMemHandle fails */
  const reshard_plan_t *plan; /* to classify launches in the log */
  int capture_mode;           /* cudaThreadExchangeStreamCaptureMode's (0: global) */
} mock_thread;

extern _Thread_local mock_thread M;

typedef struct mock_world {
  int n;           /* ranks talking (0: each rank alone) */
  int chan_cap;    /* messages a channel holds before a send waits */
  int64_t hang_ms; /* a host wait longer than this is a hang */
  long hangs;
  long bad_size;        /* a receive matched a message of another size */
  long use_after_free;  /* NCCL call on an aborted or destroyed communicator */
  long parent_aborts;   /* ncclCommAbort of the caller's communicator (0x1) */
  long parent_destroys; /* ncclCommDestroy of it */
  long delivered;       /* messages received, over all worlds */
  long leftover;        /* messages nobody received (mock_world_end) */
  size_t staging_live, staging_peak; /* ncclMemAlloc bytes */
  long ipc_mapped;   /* cudaIpcOpenMemHandle mappings not closed */
  long ipc_timeouts; /* CUDA IPC waits that gave up at their timeout */
  long ipc_pool_pulls; /* CUDA IPC messages pulled from a peer's staging pool */
  long ipc_closed_reads; /* ... through a mapping of it already closed */
  long ipc_freed_mapped; /* cudaFree of memory another rank has mapped */
  int corrupt_next;    /* flip a bit of the next message over 64 bytes received */
  long capture_violations; /* calls a CUDA stream capture forbids (above) */
  int corrupt_copy_next; /* flip a bit of what the next copy kernel writes into
                            destination buffers (a registered, direct copy
                            moves no message to corrupt) */
} mock_world;

extern mock_world world;

/* Resets this thread's rank state (rank `rank` of `size`). */
void mock_reset(int rank, int size);
/* Starts a world of n ranks (one thread each, every thread then calls
 * mock_reset with its rank); chan_cap messages per channel. */
void mock_world_begin(int n, int chan_cap);
/* Ends it: counts undelivered messages into world.leftover and drops
 * every stream, event and communicator of the world. */
void mock_world_end(void);
/* Appends an entry to this thread's log (a sink when logging is off). */
mop *mock_log(int kind, void *stream);
/* Blocks (emulated time passing) until stream's enqueued work is done, or
 * hang_ms: 0 when done. */
int mock_stream_drain(void *stream);
/* world.corrupt_next = 1, under the world's lock. */
void mock_corrupt_next(void);
/* world.corrupt_copy_next = 1, under the world's lock. */
void mock_corrupt_next_copy(void);

/* The caller's communicator every test passes to reshard. */
#define MOCK_PARENT ((ncclComm_t)0x1)

#endif
