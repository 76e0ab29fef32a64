/* The per-call state of a plan: call numbering and versions, its one
 * failure record (both executors write it), completed executes. The
 * front door reads it for reshard_plan_get_status (api/status.c). */
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

void rs_plan_rejoin_state(const reshard_plan_t *p, const uint64_t agreed[3]) {
  reshard_plan_t *m = mut(p);
  const uint64_t doubt = __atomic_load_n(&p->doubt_version, __ATOMIC_ACQUIRE);
  if (doubt && agreed[2] == doubt) { /* another rank committed it */
    __atomic_store_n(&m->active_copy, p->doubt_copy, __ATOMIC_RELEASE);
    rs_plan_record_success(p, doubt);
  }
  __atomic_store_n(&m->doubt_version, 0, __ATOMIC_RELEASE);
  m->doubt_copy = -1;
  m->doubt_ticket = 0;
  /* the failure record: cleared as creation leaves it (claim last, so
   * that a failure recorded from now on is whole) */
  __atomic_store_n(&m->fail_result, RESHARD_SUCCESS, __ATOMIC_RELEASE);
  m->fail_call = m->fail_version = 0;
  m->fail_msg[0] = 0;
  __atomic_store_n(&m->fail_claim, 0, __ATOMIC_RELEASE);
  __atomic_store_n(&m->exec_calls, agreed[0], __ATOMIC_RELEASE);
  __atomic_store_n(&m->last_version, agreed[1], __ATOMIC_RELEASE);
}
