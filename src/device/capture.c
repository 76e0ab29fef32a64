/* CUDA graph capture of an execute: whether the plan's streams are in an
 * open capture, the host nodes a captured execute adds at its start and
 * end (graph_launched, graph_landed: each graph launch's deadline and count), and
 * events recorded so that they mean the same in a graph. Apart because
 * these run on CUDA's thread or change meaning under capture. */
#include <cuda_runtime.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/clock.h"
#include "common/debug.h"
#include "common/error.h"
#include "transport/dev_comm.h"
#include "device/device.h"
#include "device/device_internal.h"
#include "exec/direct.h"
#include "kernels/rs_kernels.h"
#include "exec/exec_state.h"
#include "exec/schedule.h"
#include "plan/quant.h"
#include "transport/stream.h"

/* Whether the plan's streams are in a stream capture the caller has
 * open (an execute captured into a CUDA graph joins them to it until it
 * ends): they have no status to ask for then (asking would invalidate
 * the capture). */
int in_capture(const rs_dev *d) {
  for (int i = 0; i < S_COUNT; i++)
    if (d->s[i] && rs_stream_capturing(d->s[i])) return 1;
  return 0;
}

/* A host node at the start of a captured execute: each launch of the
 * graph gives its execute a deadline from now (the plan's timeout), for
 * device_poll and the communicator's next drain. On CUDA's thread: no
 * CUDA call, atomics only. */
void CUDART_CB graph_launched(void *arg) {
  rs_dev *d = arg;
  int64_t dl = rs_deadline_after_ms(d->plan->opts.timeout_ms);
  if (dl == RS_NO_DEADLINE) dl = INT64_MAX;
  __atomic_store_n(&d->launch_deadline, dl, __ATOMIC_RELEASE);
  __atomic_fetch_add(&d->launches_started, 1, __ATOMIC_RELEASE);
  rs_dev_comm_launched(d->plan->comm, dl);
}

/* ... and one at its end, on the caller's stream after everything. */
void CUDART_CB graph_landed(void *arg) {
  rs_dev *d = arg;
  __atomic_fetch_add(&d->launches_landed, 1, __ATOMIC_RELEASE);
}

/* An event recorded by a step that executes after it may wait for (or the
 * host may query): in a capture, recorded by each launch of the graph
 * (an external record node), so that it means the same as outside one. */
cudaError_t record_lasting(cudaEvent_t e, cudaStream_t s, int captured) {
  return captured ? cudaEventRecordWithFlags(e, s, cudaEventRecordExternal) : cudaEventRecord(e, s);
}
