/* The per-call state of a plan: its first failure, versions, completed
 * executes, and reshard_plan_get_status. */
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include "common/error.h"
#include "exec/exec_state.h"
#include "transport/transport.h"

static reshard_plan_t *mut(const reshard_plan_t *p) { return (reshard_plan_t *)p; }

reshard_result_t rs_register_unsupported(const reshard_plan_t *p) {
  return rs_error(RESHARD_ERROR_UNSUPPORTED, "register_buffers rank %d: the %s transport does not map its peers' "
                  "buffers (CUDA IPC does); execute needs no registration here", p->rank, p->comm->ops->name);
}

int rs_result_fails_plan(reshard_result_t r) {
  return r == RESHARD_ERROR_TIMEOUT || r == RESHARD_ERROR_REMOTE || r == RESHARD_ERROR_MISMATCH ||
         r == RESHARD_ERROR_BACKEND;
}

void rs_plan_mark_failed(const reshard_plan_t *p, uint64_t call, uint64_t version, reshard_result_t r,
                         const char *why) {
  reshard_plan_t *m = mut(p);
  int expected = 0;
  if (!__atomic_compare_exchange_n(&m->fail_claim, &expected, 1, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)) return;
  m->fail_call = call;
  m->fail_version = version;
  snprintf(m->fail_msg, sizeof m->fail_msg, "%s", why ? why : "");
  __atomic_store_n(&m->fail_result, r, __ATOMIC_RELEASE);
}

reshard_result_t rs_plan_failed(const reshard_plan_t *p) { return __atomic_load_n(&p->fail_result, __ATOMIC_ACQUIRE); }

reshard_result_t rs_plan_refuse_if_failed(const reshard_plan_t *p, const char *op) {
  reshard_result_t r = rs_plan_failed(p);
  if (r == RESHARD_SUCCESS) return RESHARD_SUCCESS;
  return rs_error(RESHARD_ERROR_INVALID_USAGE,
                  "%s rank %d: this plan failed earlier, at execute call %llu (version %llu) with %s: %s; "
                  "destroy the plan and create a new one",
                  op, p->rank, (unsigned long long)p->fail_call, (unsigned long long)p->fail_version,
                  reshard_result_string(r), p->fail_msg);
}

void rs_plan_record_success(const reshard_plan_t *p, uint64_t version) {
  __atomic_store_n(&mut(p)->committed_version, version, __ATOMIC_RELEASE);
  __atomic_fetch_add(&mut(p)->completed, 1, __ATOMIC_ACQ_REL);
}

void rs_plan_take_call(const reshard_plan_t *p, int explicit_version, uint64_t version_in, uint64_t *call,
                       uint64_t *version) {
  *call = __atomic_fetch_add(&mut(p)->exec_calls, 1, __ATOMIC_RELAXED);
  if (explicit_version) {
    __atomic_store_n(&mut(p)->last_version, version_in, __ATOMIC_RELAXED);
    *version = version_in;
  } else {
    *version = __atomic_add_fetch(&mut(p)->last_version, 1, __ATOMIC_RELAXED);
  }
}

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
