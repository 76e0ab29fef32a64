/* The front door of execute and registration: the public entry points
 * (reshard_plan_execute_args, the older forms as thin wrappers over it,
 * reshard_plan_execute_refused, reshard_plan_register_buffers,
 * reshard_plan_resolve). Every
 * execute reads its reshard_execute_args_t (read_args), turns it into one
 * rs_call_args (api/front.h, built in execute_args only), takes
 * the plan's busy flag (calls of a plan never overlap), settles a version
 * left in doubt, and runs the plan's stages (stages.c), each a call of
 * one plan through its executor (call.c). Argument checks live in
 * argcheck.c; the executors (exec/host.h, device/device.h) never see the
 * public entry points. */
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api/front.h"
#include "common/alloc.h"
#include "common/clock.h"
#include "common/error.h"
#include "exec/exec_state.h"
#include "plan/executor.h"
#include "plan/planner.h"

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

/* Takes the plan for one call of op (execute, register_buffers): counted
 * in in_use, so that a destroy on another thread waits for the call to
 * return instead of freeing the plan under it, and the busy flag: one
 * call of a plan at a time. A second one, from another thread of this
 * rank, would pair with the partners' calls in whatever order the
 * threads happened to run (the data of one step landing in the buffers
 * of another), or rewrite the buffer tables a running execute reads.
 * Refused, changing nothing: the running call is not disturbed and the
 * plan stays as it was. */
reshard_result_t rs_api_enter(const reshard_plan_t *plan, const char *op) {
  RS_CHECK(rs_plan_current(plan, op));
  reshard_plan_t *mut = (reshard_plan_t *)plan;
  __atomic_fetch_add(&mut->in_use, 1, __ATOMIC_ACQ_REL);
  if (!__atomic_exchange_n(&mut->busy, 1, __ATOMIC_ACQUIRE)) return RESHARD_SUCCESS;
  __atomic_fetch_sub(&mut->in_use, 1, __ATOMIC_ACQ_REL);
  return rs_error(RESHARD_ERROR_INVALID_USAGE,
                  "%s rank %d: another call of this plan is running on this rank (another thread?); calls "
                  "of one plan must not overlap: nothing done, the running call goes on",
                  op, plan->rank);
}

void rs_api_leave(const reshard_plan_t *plan) {
  reshard_plan_t *mut = (reshard_plan_t *)plan;
  __atomic_store_n(&mut->busy, 0, __ATOMIC_RELEASE);
  __atomic_fetch_sub(&mut->in_use, 1, __ATOMIC_ACQ_REL);
}

static reshard_result_t execute(const reshard_plan_t *plan, const rs_call_args *a) {
  if (!a->rejected) rs_error_clear();
  if (!plan) return rs_error(RESHARD_ERROR_INVALID_ARGUMENT, "execute: plan is NULL");
  RS_CHECK(rs_api_enter(plan, "execute"));
  reshard_result_t r;
  if (__atomic_load_n(&plan->doubt_version, __ATOMIC_ACQUIRE) &&
      (r = settle_first(plan, a->rejected)) != RESHARD_SUCCESS)
    ; /* still in doubt, or settled by rolling back: nothing runs */
  else
    r = rs_api_run_stages(plan, a);
  rs_api_leave(plan);
  return r;
}

/* The sizes of every published version of reshard_execute_args_t. */
static size_t args_size_of_version(uint32_t version) {
  switch (version) {
    case 1: return sizeof(reshard_execute_args_t);
    default: return 0;
  }
}

#define KNOWN_FLAGS (RESHARD_EXECUTE_FLAG_EXPLICIT_VERSION | RESHARD_EXECUTE_FLAG_UNSIZED)

/* The caller's args into *out, read by version like the options
 * (plan/options.c). A refusal here is not a call: it names the field and
 * touches nothing (no busy flag, no settling, no call number). */
static reshard_result_t read_args(const reshard_plan_t *plan, const reshard_execute_args_t *in,
                                  reshard_execute_args_t *out) {
  const int rank = plan->rank;
  if (!in) return rs_error(RESHARD_ERROR_INVALID_ARGUMENT, "execute rank %d: args is NULL: nothing done", rank);
  if (in->struct_size < offsetof(reshard_execute_args_t, flags))
    return rs_error(RESHARD_ERROR_INVALID_ARGUMENT,
                    "execute rank %d: args->struct_size %u is not one this library knows (expected %zu); start from "
                    "RESHARD_EXECUTE_ARGS_INITIALIZER: nothing done",
                    rank, in->struct_size, sizeof(reshard_execute_args_t));
  if (in->version < 1 || in->version > RESHARD_EXECUTE_ARGS_VERSION)
    return rs_error(RESHARD_ERROR_INVALID_ARGUMENT,
                    "execute rank %d: args->version %u unknown (library has %d): nothing done", rank, in->version,
                    RESHARD_EXECUTE_ARGS_VERSION);
  if (in->struct_size != args_size_of_version(in->version))
    return rs_error(RESHARD_ERROR_INVALID_ARGUMENT,
                    "execute rank %d: args->struct_size %u does not match args->version %u (expected %zu); start "
                    "from RESHARD_EXECUTE_ARGS_INITIALIZER: nothing done",
                    rank, in->struct_size, in->version, args_size_of_version(in->version));
  memcpy(out, in, in->struct_size);
  if (out->flags & ~KNOWN_FLAGS)
    return rs_error(RESHARD_ERROR_INVALID_ARGUMENT,
                    "execute rank %d: args->flags 0x%x has bits this library does not know (0x%x; "
                    "RESHARD_EXECUTE_FLAG_* only): nothing done",
                    rank, out->flags, out->flags & ~KNOWN_FLAGS);
  const int unsized = (out->flags & RESHARD_EXECUTE_FLAG_UNSIZED) != 0;
  const char *set = unsized ? (out->src ? "src" : out->dst ? "dst" : NULL)
                            : (out->src_ptrs ? "src_ptrs" : out->dst_ptrs ? "dst_ptrs" : NULL);
  if (set)
    return rs_error(RESHARD_ERROR_INVALID_ARGUMENT,
                    "execute rank %d: args->%s is set %s RESHARD_EXECUTE_FLAG_UNSIZED (%s): nothing done", rank, set,
                    unsized ? "with" : "without",
                    unsized ? "the flag reads src_ptrs and dst_ptrs" : "sized buffers go in src and dst");
  return RESHARD_SUCCESS;
}

/* The one rs_call_args construction: args already read, refused an error
 * already set that the call reports to its partners (execute_refused) or
 * RESHARD_SUCCESS. */
static reshard_result_t execute_args(const reshard_plan_t *plan, const reshard_execute_args_t *in,
                                     reshard_result_t refused) {
  const int explicit_version = (in->flags & RESHARD_EXECUTE_FLAG_EXPLICIT_VERSION) != 0;
  rs_call_args a = {.explicit_version = explicit_version,
                    .version_in = explicit_version ? in->weight_version : 0,
                    .stream = in->stream,
                    .rejected = refused};
  if (a.rejected) return execute(plan, &a);
  if (in->flags & RESHARD_EXECUTE_FLAG_UNSIZED) {
    a.src = in->src_ptrs, a.nsrc = in->num_src, a.dst = in->dst_ptrs, a.ndst = in->num_dst;
    return execute(plan, &a);
  }
  const reshard_buffer_t *src = in->src, *dst = in->dst;
  const size_t num_src = in->num_src, num_dst = in->num_dst;
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

reshard_result_t reshard_plan_execute_args(const reshard_plan_t *plan, const reshard_execute_args_t *args) {
  rs_error_clear();
  if (!plan) return rs_error(RESHARD_ERROR_INVALID_ARGUMENT, "execute: plan is NULL");
  reshard_execute_args_t in;
  reshard_result_t r = read_args(plan, args, &in);
  return r != RESHARD_SUCCESS ? r : execute_args(plan, &in, RESHARD_SUCCESS);
}

/* The older entry points (reshard.h): each only builds its args. */

reshard_result_t reshard_plan_execute(const reshard_plan_t *plan, void *const *src_buffers, size_t num_src,
                                      void *const *dst_buffers, size_t num_dst, void *stream) {
  reshard_execute_args_t a = RESHARD_EXECUTE_ARGS_INITIALIZER;
  a.flags = RESHARD_EXECUTE_FLAG_UNSIZED;
  a.src_ptrs = src_buffers, a.num_src = num_src, a.dst_ptrs = dst_buffers, a.num_dst = num_dst, a.stream = stream;
  return reshard_plan_execute_args(plan, &a);
}

reshard_result_t reshard_plan_execute_version(const reshard_plan_t *plan, uint64_t version,
                                              void *const *src_buffers, size_t num_src, void *const *dst_buffers,
                                              size_t num_dst, void *stream) {
  reshard_execute_args_t a = RESHARD_EXECUTE_ARGS_INITIALIZER;
  a.flags = RESHARD_EXECUTE_FLAG_UNSIZED | RESHARD_EXECUTE_FLAG_EXPLICIT_VERSION;
  a.weight_version = version;
  a.src_ptrs = src_buffers, a.num_src = num_src, a.dst_ptrs = dst_buffers, a.num_dst = num_dst, a.stream = stream;
  return reshard_plan_execute_args(plan, &a);
}

reshard_result_t reshard_plan_execute_sized(const reshard_plan_t *plan, uint64_t version, const reshard_buffer_t *src,
                                            size_t num_src, const reshard_buffer_t *dst, size_t num_dst,
                                            void *stream) {
  reshard_execute_args_t a = RESHARD_EXECUTE_ARGS_INITIALIZER;
  a.flags = version ? RESHARD_EXECUTE_FLAG_EXPLICIT_VERSION : 0;
  a.weight_version = version;
  a.src = src, a.num_src = num_src, a.dst = dst, a.num_dst = num_dst, a.stream = stream;
  return reshard_plan_execute_args(plan, &a);
}

/* A refusal the caller found: a call with no buffers, already rejected. */
reshard_result_t reshard_plan_execute_refused(const reshard_plan_t *plan, uint64_t version, reshard_result_t why,
                                              const char *reason) {
  rs_error_clear();
  if (!plan) return rs_error(RESHARD_ERROR_INVALID_ARGUMENT, "execute_refused: plan is NULL");
  if (why == RESHARD_SUCCESS) why = RESHARD_ERROR_INVALID_ARGUMENT;
  reshard_execute_args_t a = RESHARD_EXECUTE_ARGS_INITIALIZER;
  a.flags = version ? RESHARD_EXECUTE_FLAG_EXPLICIT_VERSION : 0;
  a.weight_version = version;
  return execute_args(plan, &a,
                      rs_error(why, "%s", reason && *reason ? reason : "execute refused by the caller (no reason given)"));
}

reshard_result_t reshard_plan_register_buffers(reshard_plan_t *plan, void *const *src, size_t nsrc,
                                               void *const *dst, size_t ndst) {
  rs_error_clear();
  if (!plan) return rs_error(RESHARD_ERROR_INVALID_ARGUMENT, "register_buffers: plan is NULL");
  if (!plan->executor->register_buffers) return rs_register_unsupported(plan);
  RS_CHECK(rs_api_enter(plan, "register_buffers"));
  reshard_result_t r = plan->quant || plan->spread ? rs_api_register_stages(plan, src, nsrc, dst, ndst)
                                                   : plan->executor->register_buffers(plan, src, nsrc, dst, ndst);
  rs_api_leave(plan);
  return r;
}

/* The caller's own settling of a version in doubt (the next execute
 * settles by itself): a call of the plan like the others, so not while
 * one runs. */
reshard_result_t reshard_plan_resolve(const reshard_plan_t *plan, int timeout_ms) {
  rs_error_clear();
  if (!plan) return rs_error(RESHARD_ERROR_INVALID_ARGUMENT, "resolve: plan is NULL");
  if (!__atomic_load_n(&plan->doubt_version, __ATOMIC_ACQUIRE)) return RESHARD_SUCCESS;
  RS_CHECK(rs_api_enter(plan, "resolve"));
  reshard_result_t r = rs_plan_settle(plan, rs_deadline_after_ms(timeout_ms >= 1 ? timeout_ms : plan->opts.timeout_ms));
  rs_api_leave(plan);
  return r;
}
