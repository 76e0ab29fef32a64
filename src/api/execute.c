/* The front door of execute and registration: the public entry points
 * (reshard_plan_execute and its variants, reshard_plan_register_buffers).
 * Each one turns its arguments into one rs_call_args (api/front.h), takes
 * the plan's busy flag (calls of a plan never overlap), settles a version
 * left in doubt, and runs the plan's stages (stages.c), each a call of
 * one plan through its executor (call.c). Argument checks live in
 * argcheck.c; the executors (exec/host.h, device/device.h) never see the
 * public entry points. */
#include <stdio.h>
#include <stdlib.h>

#include "api/front.h"
#include "common/alloc.h"
#include "common/clock.h"
#include "common/error.h"
#include "exec/exec_state.h"
#include "plan/executor.h"

/* A version this rank left in doubt is settled before the next call
 * runs (within the call's deadline): rolled forward, the call goes on;
 * rolled back, the plan failed like everywhere else and the call is
 * refused; still unknown, the call is refused with
 * RESHARD_ERROR_IN_DOUBT and the plan is failed (reshard_plan_resolve
 * can still settle it). */
static reshard_result_t settle_first(const reshard_plan_t *plan, reshard_result_t rejected) {
  char own[640] = "";
  if (rejected) snprintf(own, sizeof own, "%s", reshard_last_error());
  reshard_result_t r = rs_plan_settle(plan, rs_deadline_after_ms(plan->opts.timeout_ms));
  if (r == RESHARD_ERROR_IN_DOUBT) {
    char why[700];
    snprintf(why, sizeof why, "%s", reshard_last_error());
    rs_plan_mark_failed(plan, plan->doubt_call, __atomic_load_n(&plan->doubt_version, __ATOMIC_ACQUIRE), r, why);
    return rs_error(r, "execute rank %d: refused: %s", plan->rank, why);
  }
  if (r != RESHARD_SUCCESS) return r;
  if (rejected) rs_error(rejected, "%s", own); /* the caller's own rejection comes next */
  else rs_error_clear();
  return RESHARD_SUCCESS;
}

static reshard_result_t execute(const reshard_plan_t *plan, const rs_call_args *a) {
  if (!a->rejected) rs_error_clear();
  if (!plan) return rs_error(RESHARD_ERROR_INVALID_ARGUMENT, "execute: plan is NULL");
  /* counted, so that a destroy on another thread waits for this call to
   * return instead of freeing the plan under it */
  reshard_plan_t *mut = (reshard_plan_t *)plan;
  __atomic_fetch_add(&mut->in_use, 1, __ATOMIC_ACQ_REL);
  reshard_result_t r;
  /* One call of a plan at a time: a second one, from another thread of
   * this rank, would pair with the partners' calls in whatever order the
   * threads happened to run (the data of one step landing in the
   * buffers of another). Refused, changing nothing: the running call is
   * not disturbed and the plan stays as it was. */
  if (__atomic_exchange_n(&mut->busy, 1, __ATOMIC_ACQUIRE)) {
    __atomic_fetch_sub(&mut->in_use, 1, __ATOMIC_ACQ_REL);
    return rs_error(RESHARD_ERROR_INVALID_USAGE,
                    "execute rank %d: another call of this plan is running on this rank (another thread?); calls "
                    "of one plan must not overlap: nothing done, the running call goes on",
                    plan->rank);
  }
  if (__atomic_load_n(&plan->doubt_version, __ATOMIC_ACQUIRE) &&
      (r = settle_first(plan, a->rejected)) != RESHARD_SUCCESS)
    ; /* still in doubt, or settled by rolling back: nothing runs */
  else
    r = rs_api_run_stages(plan, a);
  __atomic_store_n(&mut->busy, 0, __ATOMIC_RELEASE);
  __atomic_fetch_sub(&mut->in_use, 1, __ATOMIC_ACQ_REL);
  return r;
}

reshard_result_t reshard_plan_execute(const reshard_plan_t *plan, void *const *src_buffers, size_t num_src,
                                      void *const *dst_buffers, size_t num_dst, void *stream) {
  const rs_call_args a = {.src = src_buffers, .nsrc = num_src, .dst = dst_buffers, .ndst = num_dst, .stream = stream};
  return execute(plan, &a);
}

reshard_result_t reshard_plan_execute_version(const reshard_plan_t *plan, uint64_t version,
                                              void *const *src_buffers, size_t num_src, void *const *dst_buffers,
                                              size_t num_dst, void *stream) {
  const rs_call_args a = {.explicit_version = 1,
                          .version_in = version,
                          .src = src_buffers,
                          .nsrc = num_src,
                          .dst = dst_buffers,
                          .ndst = num_dst,
                          .stream = stream};
  return execute(plan, &a);
}

reshard_result_t reshard_plan_execute_sized(const reshard_plan_t *plan, uint64_t version, const reshard_buffer_t *src,
                                            size_t num_src, const reshard_buffer_t *dst, size_t num_dst,
                                            void *stream) {
  rs_error_clear();
  if (!plan) return rs_error(RESHARD_ERROR_INVALID_ARGUMENT, "execute: plan is NULL");
  rs_call_args a = {.explicit_version = version != 0, .version_in = version, .stream = stream};
  /* The counts before the arrays: an entry is read only where the count
   * is one the layout can have, so a count larger than the array is
   * refused, not read past, and no size below wraps. The refusal takes
   * its turn in the agreement like execute's own. */
  a.rejected = rs_argcheck_counts(plan, rs_api_user_nsrc(plan), src, num_src, dst, num_dst);
  if (a.rejected) return execute(plan, &a);
  /* NULL arrays go on as NULL pointer arrays, for execute's own checks
   * (accepted where this rank has no buffers on that side); running out of
   * memory for the copies is a rejection execute tells the partners of */
  const size_t n = num_src + num_dst;
  void **ptrs = rs_malloc((n + 1) * sizeof *ptrs);
  size_t *bytes = rs_malloc((n + 1) * sizeof *bytes);
  if (!ptrs || !bytes) {
    a.rejected = rs_error(RESHARD_ERROR_OUT_OF_MEMORY, "execute rank %d: out of memory for %zu buffer entries",
                          plan->rank, n);
  } else {
    for (size_t i = 0; src && i < num_src; i++) ptrs[i] = src[i].ptr, bytes[i] = src[i].bytes;
    for (size_t i = 0; dst && i < num_dst; i++) ptrs[num_src + i] = dst[i].ptr, bytes[num_src + i] = dst[i].bytes;
  }
  a.src = src && ptrs ? ptrs : NULL;
  a.nsrc = num_src;
  a.src_bytes = bytes;
  a.dst = dst && ptrs ? ptrs + num_src : NULL;
  a.ndst = num_dst;
  a.dst_bytes = bytes ? bytes + num_src : NULL;
  reshard_result_t r = execute(plan, &a);
  free(ptrs);
  free(bytes);
  return r;
}

reshard_result_t reshard_plan_execute_refused(const reshard_plan_t *plan, uint64_t version, reshard_result_t why,
                                              const char *reason) {
  rs_error_clear();
  if (!plan) return rs_error(RESHARD_ERROR_INVALID_ARGUMENT, "execute_refused: plan is NULL");
  if (why == RESHARD_SUCCESS) why = RESHARD_ERROR_INVALID_ARGUMENT;
  const rs_call_args a = {
      .explicit_version = version != 0,
      .version_in = version,
      .rejected = rs_error(why, "%s", reason && *reason ? reason : "execute refused by the caller (no reason given)")};
  return execute(plan, &a);
}

reshard_result_t reshard_plan_register_buffers(reshard_plan_t *plan, void *const *src, size_t nsrc,
                                               void *const *dst, size_t ndst) {
  rs_error_clear();
  if (!plan) return rs_error(RESHARD_ERROR_INVALID_ARGUMENT, "register_buffers: plan is NULL");
  if (!plan->executor->register_buffers) return rs_register_unsupported(plan);
  if (plan->quant) return rs_api_register_stages(plan, src, nsrc, dst, ndst);
  return plan->executor->register_buffers(plan, src, nsrc, dst, ndst);
}
