/* Source-side spreading on device transports (plan/spread.h): the
 * scratch the pre-plan copies sole-held slices into and the main plan
 * sends from, in device memory, allocated once at plan creation. Both
 * plans run on the caller's stream, so the main plan reads it after the
 * pre-plan's copies in stream order; nothing else writes it. Registered
 * with both plans (api/stages.c), peers read and write it directly. */
#include <cuda_runtime.h>

#include "common/error.h"
#include "device/device.h"
#include "plan/spread.h"
#include "transport/dev_comm.h"
#include "transport/transport.h"

static void sdev_free(rs_spread *s) {
  /* After the plans' own waits (reshard_plan_destroy: the main plan's
   * streams, then the pre-plan's, destroyed by destroy_stages just before
   * rs_spread_free calls this) nothing runs on this memory, unless the
   * GPU did not let go of either plan's work: then it stays. Registered
   * (api/stages.c), peers may have it mapped until they destroy their
   * plans too: the communicator frees it when none can. */
  if (!s->dev_stuck && s->scratch) rs_dev_comm_free_exported(s->dev_comm, s->scratch);
  s->scratch = NULL;
}

reshard_result_t rs_device_spread_prepare(reshard_comm_t *c, rs_spread *s) {
  s->dev_free = sdev_free;
  s->dev_comm = c;
  if (!s->bytes) return RESHARD_SUCCESS;
  cudaError_t ce = cudaMalloc((void **)&s->scratch, s->bytes);
  if (!ce) return RESHARD_SUCCESS;
  s->scratch = NULL;
  reshard_result_t r = rs_cuda_error(ce, "cudaMalloc(spreading scratch)", c->rank);
  rs_error_prefix("plan_create rank %d (%llu bytes of spreading scratch on the device): ", c->rank,
                  (unsigned long long)s->bytes);
  return r;
}
