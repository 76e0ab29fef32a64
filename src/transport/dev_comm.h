/* What every stream transport's communicator has (NCCL, CUDA IPC): the
 * order of its executes, its staging pool and the polled wait on its GPU
 * work, written once. A transport's state (comm->impl) starts with an
 * rs_dev_comm; the transport sets it up and tears it down, and the device
 * executor (src/device/) drives it directly, since it is the same for
 * every stream transport. No CUDA header here: events and streams are
 * void *. */
#ifndef RS_TRANSPORT_DEV_COMM_H
#define RS_TRANSPORT_DEV_COMM_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "transport/transport.h"

typedef struct rs_dev_comm_hooks {
  const char *name; /* "NCCL", "CUDA IPC": in messages */
  /* Never blocks: the communicator is usable (not poisoned, no
   * asynchronous error). */
  reshard_result_t (*health)(reshard_comm_t *c);
  void (*poison)(reshard_comm_t *c);
  /* The staging pool's memory (the transport's allocator: ncclMemAlloc,
   * or cudaMalloc for memory that IPC can export). */
  reshard_result_t (*pool_alloc)(reshard_comm_t *c, size_t bytes, void **out);
  void (*pool_free)(reshard_comm_t *c, void *p);
  /* Frees cudaMalloc'd memory the peers may have mapped (a registered
   * plan's buffers of reshard's own: the quantization scratch) once no
   * peer can have it mapped (NULL: at once, with cudaFree). */
  void (*free_exported)(reshard_comm_t *c, void *p);
  /* Optional: called between the polls of a wait on GPU work, never
   * blocking: a host-driven transport (UCX) moves its messages in flight
   * meanwhile (NULL elsewhere). */
  void (*idle)(reshard_comm_t *c);
} rs_dev_comm_hooks;

typedef struct rs_dev_comm {
  const rs_dev_comm_hooks *hooks;
  /* Executes of every plan on the communicator run one after another
   * (they share the staging pool): the last one's end, recorded on its
   * caller's stream (a cudaEvent_t), and its deadline (atomic: a launch
   * of a CUDA graph holding an execute moves it, from CUDA's thread). */
  void *last_end;
  int have_last;
  int64_t last_deadline;
  /* The staging pool, as large as the largest live plan needs; gen counts
   * the pools so far. abandoned: a plan was destroyed while the GPU still
   * ran its work (src/device/setup.c dev_free): the pool is never freed. */
  void *pool;
  size_t pool_bytes;
  uint64_t pool_gen;
  int pool_users, pool_abandoned;
  /* An execute was captured into a CUDA graph (rs_dev_comm_begin; sticky):
   * its launches use the pool of the capture, so a pool replaced later is
   * kept (retired) until the communicator goes, not freed. */
  int pool_captured;
  void **retired;
  size_t nretired;
  /* The verdicts (rs_dev_agree, kernels/rs_agree.h; device memory) of the
   * live plans that have one, closed before an abort (rs_dev_comm_close_
   * gates): an aborted transfer ends early, and the unpacks after it
   * must not write the half-received staging. */
  pthread_mutex_t gates_mu;
  void **gates;
  size_t ngates, gates_cap;
} rs_dev_comm;

/* cudaMalloc'd memory of reshard's that peers may have mapped goes
 * (hooks->free_exported, or cudaFree). */
void rs_dev_comm_free_exported(reshard_comm_t *c, void *p);

/* Never blocks: the current CUDA device is `device`, the communicator's
 * (INVALID_USAGE naming both otherwise): a stream transport's check. */
reshard_result_t rs_dev_comm_on_device(reshard_comm_t *c, int device);

/* c->impl must start with the rs_dev_comm being set up. */
reshard_result_t rs_dev_comm_init(reshard_comm_t *c, const rs_dev_comm_hooks *h);
/* Frees the pool (unless abandoned) and the event. */
void rs_dev_comm_fini(reshard_comm_t *c);

/* A plan's verdict (an rs_dev_agree in device memory) joins / leaves the
 * communicator's list; add fails only for memory. */
reshard_result_t rs_dev_comm_gate_add(reshard_comm_t *c, void *agree);
void rs_dev_comm_gate_remove(reshard_comm_t *c, void *agree);

/* Before the transport aborts its work (poison): closes every listed
 * verdict (ok 0, bad_index RS_DEV_AGREE_POISONED) with copies, which run
 * while the communicator's kernels hold the GPU, and waits for them (up
 * to a second), so that the launches behind the aborted work, which
 * then run, write no destination byte. No-op before rs_dev_comm_init. */
void rs_dev_comm_close_gates(rs_dev_comm *d);

/* Waits for GPU work, a stream or (stream NULL) an event: polled, with the
 * communicator's health between polls, until the deadline; past it the
 * communicator is poisoned and TIMEOUT says `late`. */
reshard_result_t rs_dev_comm_wait(reshard_comm_t *c, void *stream, void *event, int64_t deadline, const char *what,
                                  const char *late);

/* Until when the communicator's executes may run: the last one's
 * deadline, or a graph launch's (stamped when it starts), and with a
 * capture on it at least RESHARD_TIMEOUT_MS from now (a launch queued
 * behind its caller's work has no stamp yet). */
int64_t rs_dev_comm_busy_until(reshard_comm_t *c);

/* A launch of a CUDA graph holding an execute started (a host node of the
 * graph, on CUDA's thread): the communicator's executes are busy until
 * `deadline` at least. */
void rs_dev_comm_launched(reshard_comm_t *c, int64_t deadline);

/* An execute's begin and end, the wait for the last one (drain), and the
 * staging pool's users (acquire, release), called by the device executor.
 * Under a capture of the stream, begin and end order the graph's
 * launches with the executes before and after them through external
 * event nodes (cudaEventWaitExternal, cudaEventRecordExternal), so that
 * a launch runs after the execute before it as an execute would. */
reshard_result_t rs_dev_comm_begin(reshard_comm_t *c, void *stream, void **staging);
reshard_result_t rs_dev_comm_end(reshard_comm_t *c, void *stream, int64_t deadline);
reshard_result_t rs_dev_comm_drain(reshard_comm_t *c);
reshard_result_t rs_dev_comm_staging_acquire(reshard_comm_t *c, size_t bytes);
void rs_dev_comm_staging_release(reshard_comm_t *c, int in_use);

#endif
