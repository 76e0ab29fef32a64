/* The front door of plan creation: picks the plan's executor from the
 * communicator's kind (a stream transport gets the device executor, any
 * other the host executor; plan/executor.h) and hands the rest to the
 * planner (plan/create.c). The only file that names both executors: it
 * sits above them in the layering (docs/ARCHITECTURE.md). */
#include "exec/host.h"
#include "plan/plan.h"
#include "transport/transport.h"
#ifdef RESHARD_HAVE_CUDA
#include "device/device.h"
#endif

static const rs_executor *executor_for(const reshard_comm_t *comm) {
  if (!comm || !comm->ops || !comm->ops->stream_ops) return &rs_host_executor;
#ifdef RESHARD_HAVE_CUDA
  return &rs_device_executor;
#else
  return NULL; /* unreachable: stream transports exist only in CUDA builds */
#endif
}

reshard_result_t reshard_plan_create(reshard_comm_t *comm, const reshard_layout_t *src, const reshard_layout_t *dst,
                                     const reshard_options_t *options, reshard_plan_t **out) {
  return rs_plan_create(comm, executor_for(comm), src, dst, options, out);
}
