/* The executor interface: what runs a plan. A plan holds one, chosen at
 * creation from the communicator's kind (src/api/create.c): the host
 * executor (src/exec/execute.c: messages the caller's thread sends and
 * waits for, over a host transport) or the device executor
 * (src/device/, executor.c: packs, transfers and unpacks enqueued on
 * CUDA streams, over a stream transport). Executors sit above the
 * transports and reach them through transport/transport.h and
 * transport/stream.h; no transport knows an executor.
 *
 * The plan is declared here only by name: this header is what the
 * planner (plan/create.c) and the front door (src/api/) call and what executors implement. Every slot
 * but name may be NULL where the executor has nothing to do there. */
#ifndef RS_PLAN_EXECUTOR_H
#define RS_PLAN_EXECUTOR_H

#include <stddef.h>
#include <stdint.h>

#include "reshard.h"

struct rs_quant;
struct rs_spread;

/* One execute call, as the front door (reshard_plan_execute_args and its
 * variants, src/api/execute.c, through call.c) hands it over once the
 * arguments passed its checks. */
typedef struct rs_exec_call {
  int explicit_version; /* the caller named the version (RESHARD_EXECUTE_FLAG_EXPLICIT_VERSION) */
  uint64_t version_in;  /* that version; otherwise the plan counts */
  void *const *src;
  size_t nsrc;
  /* The destination buffers, copy 0 and copy 1 (RESHARD_FLAG_DOUBLE_
   * BUFFER on the host executor; otherwise both are dst) */
  void *const *dst;
  size_t ndst;
  void *const *copies[2];
  void *stream;
  /* Out: the call's number and version, for the failure record. */
  uint64_t call, version;
} rs_exec_call;

typedef struct rs_executor {
  const char *name; /* "host", "device": in messages */
  /* Executes are enqueued on the caller's CUDA stream and complete later
   * (execute's stream argument is taken; the host agreement and
   * host-side double buffering are not used). */
  int stream_ordered;
  /* Plan creation, in two steps around an agreement (plan/create.c):
   * prepare_local sets up everything an execute needs that only this rank
   * can fail at (device copies of the descriptors, staging, streams), so
   * that a failure fails creation on every rank instead of stranding the
   * peers at the first execute; prepare_peers then connects the plan's
   * peers (collective), so that a late peer at the first execute costs a
   * wait on the GPU, never a host wait or an abort. */
  reshard_result_t (*prepare_local)(reshard_plan_t *plan);
  reshard_result_t (*prepare_peers)(reshard_plan_t *plan);
  /* Frees what prepare_local and later executes set up
   * (reshard_plan_destroy). */
  void (*free)(reshard_plan_t *plan);
  /* Runs one call whose arguments were checked; records its success on
   * the plan (a failure is recorded by the caller). */
  reshard_result_t (*execute)(const reshard_plan_t *plan, rs_exec_call *call);
  /* A call refused before anything moved (its arguments, or the
   * caller's own refusal, with reason r set): tells the partners, or
   * makes sure nothing of the call can pair with theirs; returns the
   * result the caller gets. */
  reshard_result_t (*refuse)(const reshard_plan_t *plan, int explicit_version, uint64_t version_in,
                             reshard_result_t r);
  /* reshard_plan_get_status: never blocks. */
  void (*poll)(const reshard_plan_t *plan);
  /* reshard_plan_register_buffers (NULL: UNSUPPORTED): maps the given
   * buffers for the peers (nsrc = ndst = 0 with NULL arrays: unregister);
   * UNSUPPORTED, changing nothing, where the plan's transport maps no
   * peer memory (rs_register_unsupported, exec/exec_state.h). */
  reshard_result_t (*register_buffers)(reshard_plan_t *plan, void *const *src, size_t nsrc, void *const *dst,
                                       size_t ndst);
  /* Plan creation with block quantization (plan/quant.h) on executors
   * that quantize on the device: allocates the scratch in device memory
   * and uploads this rank's boxes, setting q->dev and q->dev_free; waits
   * end timeout_ms from now. Not stream_ordered: the host quantizes, into
   * host scratch, and this is NULL; stream_ordered and NULL: quantizing
   * plans are UNSUPPORTED. */
  reshard_result_t (*quant_prepare)(reshard_comm_t *comm, struct rs_quant *q, int64_t timeout_ms);
  /* Plan creation with source-side spreading (plan/spread.h) on
   * stream-ordered executors: allocates s->bytes of scratch in device
   * memory, setting s->scratch and s->dev_free. Not stream_ordered: the
   * scratch is host memory and this is NULL; stream_ordered and NULL:
   * plans do not spread (create.c spread_wanted). */
  reshard_result_t (*spread_prepare)(reshard_comm_t *comm, struct rs_spread *s);
} rs_executor;

#endif
