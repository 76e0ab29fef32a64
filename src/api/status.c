/* The front door's reshard_plan_get_status: the plan's one failure
 * record and per-call state (exec/state.c keeps them), after the
 * executor's poll (the device executor reads its verdicts and deadlines
 * there). */
#include <stddef.h>
#include <string.h>

#include "common/error.h"
#include "exec/exec_state.h"
#include "plan/executor.h"

reshard_result_t reshard_plan_get_status(const reshard_plan_t *plan, reshard_plan_status_t *out) {
  rs_error_clear();
  if (!plan) return rs_error(RESHARD_ERROR_INVALID_ARGUMENT, "plan_get_status: plan is NULL");
  if (!out) return rs_error(RESHARD_ERROR_INVALID_ARGUMENT, "plan_get_status rank %d: status is NULL", plan->rank);
  size_t want = out->struct_size;
  if (want < offsetof(reshard_plan_status_t, failed) + sizeof(int))
    return rs_error(RESHARD_ERROR_INVALID_ARGUMENT,
                    "plan_get_status rank %d: status->struct_size %zu is too small; set it to sizeof(reshard_plan_status_t) = %zu",
                    plan->rank, want, sizeof(reshard_plan_status_t));
  if (plan->executor->poll) plan->executor->poll(plan); /* the device executor: the deadline of enqueued work */
  reshard_plan_status_t s;
  memset(&s, 0, sizeof s);
  s.struct_size = (uint32_t)(want < sizeof s ? want : sizeof s);
  s.failure = rs_plan_failed(plan);
  s.failed = s.failure != RESHARD_SUCCESS;
  s.failed_call = s.failed ? plan->fail_call : 0;
  s.failed_version = s.failed ? plan->fail_version : 0;
  s.failure_message = s.failed ? plan->fail_msg : "";
  s.executes_completed = __atomic_load_n(&plan->completed, __ATOMIC_ACQUIRE);
  s.committed_version = __atomic_load_n(&plan->committed_version, __ATOMIC_ACQUIRE);
  s.active_copy = __atomic_load_n(&plan->active_copy, __ATOMIC_ACQUIRE);
  s.in_doubt_version = __atomic_load_n(&plan->doubt_version, __ATOMIC_ACQUIRE);
  s.in_doubt_copy = s.in_doubt_version ? plan->doubt_copy : -1;
  memcpy(out, &s, s.struct_size);
  return RESHARD_SUCCESS;
}
