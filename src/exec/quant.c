/* Execute of a plan with block quantization (see plan/quant.h): gather
 * the blocks split across source ranks (the pre-plan), quantize this
 * rank's boxes into its scratch, then run the main plan, which sends the
 * codes and scales like any other source data. On device transports both
 * plans are enqueued on the caller's stream and the device executor
 * quantizes (src/device/quant_device.c). */
#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"
#include "common/error.h"
#include "exec/exec_state.h"
#include "pack/quantize.h"
#include "plan/quant.h"
#include "plan/spread.h"
#include "transport/transport.h"

/* The caller's source buffers the boxes read: present and large enough
 * (checked before anything is read, so a bad call quantizes nothing). */
static reshard_result_t check_inputs(const reshard_plan_t *plan, const rs_quant *q, void *const *src, size_t num_src,
                                     const size_t *bytes) {
  /* the count as the plain executor checks it: a rank that reads no
   * source buffer may pass none */
  int reads = q->nin > 0;
  for (int i = 0; i < plan->nsrc_used && !reads; i++) reads = plan->src_used[i].id < q->user_nsrc;
  if (src && num_src != (size_t)q->user_nsrc && (num_src || reads))
    return rs_error(RESHARD_ERROR_INVALID_USAGE, "execute rank %d: %zu source buffers given, the source layout has %d",
                    plan->rank, num_src, q->user_nsrc);
  for (size_t i = 0; i < q->nin; i++) {
    const int b = q->in_bufs[i];
    if (!src || !src[b])
      return rs_error(RESHARD_ERROR_INVALID_ARGUMENT,
                      "execute rank %d: source buffer %d is %s, and this rank quantizes weights it holds", plan->rank,
                      b, src ? "NULL" : "missing (src_buffers is NULL)");
    if (bytes && bytes[b] < q->in_need[i])
      return rs_error(RESHARD_ERROR_INVALID_ARGUMENT,
                      "execute rank %d: source buffer %d is %zu bytes, the layout needs %llu on this rank", plan->rank, b,
                      bytes[b], (unsigned long long)q->in_need[i]);
  }
  return RESHARD_SUCCESS;
}

reshard_result_t rs_quant_execute(const reshard_plan_t *plan, int explicit_version, uint64_t version_in,
                                  void *const *src_buffers, size_t num_src, const size_t *src_bytes,
                                  void *const *dst_buffers, size_t num_dst, const size_t *dst_bytes, void *stream,
                                  reshard_result_t rejected) {
  if (!rejected) rs_error_clear();
  rs_quant *q = plan->quant;
  RS_CHECK(rs_plan_refuse_if_failed(plan));
  /* (one scratch per plan: calls of a plan do not overlap, plan.h busy) */
  reshard_result_t r = rejected ? rejected : check_inputs(plan, q, src_buffers, num_src, src_bytes);
  /* the main plan's source arrays: the caller's buffers, then the scratch */
  /* the main plan's own source layout (its spreading, if any, appends
   * scratch after it) */
  const size_t n = plan->spread ? (size_t)plan->spread->user_nsrc : (size_t)plan->num_src_buffers;
  const int scratch_here = q->codes_buf >= 0;
  void **ptrs = rs_calloc(n + 1, sizeof *ptrs);
  size_t *bytes = rs_calloc(n + 1, sizeof *bytes);
  if ((!ptrs || !bytes) && !r)
    r = rs_error(RESHARD_ERROR_OUT_OF_MEMORY, "execute rank %d: out of memory for %zu buffer entries", plan->rank, n);
  if (ptrs && bytes) {
    for (size_t i = 0; src_buffers && i < num_src && i < n; i++) ptrs[i] = src_buffers[i];
    for (size_t i = 0; src_bytes && i < num_src && i < n; i++) bytes[i] = src_bytes[i];
    if (scratch_here) {
      ptrs[q->codes_buf] = q->codes, bytes[q->codes_buf] = q->codes_bytes;
      ptrs[q->scales_buf] = q->scales, bytes[q->scales_buf] = q->scales_bytes;
    }
  }
  reshard_result_t pre_failed = RESHARD_SUCCESS;
  if (q->pre) {
    /* every rank runs it, so that calls stay numbered alike on both plans;
     * a rejected call still takes its place there */
    void **gd = rs_calloc((size_t)q->pre_ndst + 1, sizeof *gd);
    size_t *gb = rs_calloc((size_t)q->pre_ndst + 1, sizeof *gb);
    if ((!gd || !gb) && !r)
      r = rs_error(RESHARD_ERROR_OUT_OF_MEMORY, "execute rank %d: out of memory for the gather's buffer entries",
                   plan->rank);
    if (gd && gb && q->gather_buf >= 0) gd[q->gather_buf] = q->gather, gb[q->gather_buf] = q->gather_bytes;
    reshard_result_t rp = rs_execute_call(q->pre, explicit_version, version_in, src_buffers, num_src, src_bytes,
                                          gd, gd ? (size_t)q->pre_ndst : 0, gd ? gb : NULL, stream, r);
    if (!r && rp) {
      r = rp;
      rs_error_prefix("execute rank %d (gathering blocks split across source ranks): ", plan->rank);
      pre_failed = rs_result_fails_plan(rp) ? rp : RESHARD_SUCCESS;
    }
    free(gd);
    free(gb);
  }
  /* (device transports: the device executor quantizes at the start of
   * the main plan's execute, in stream order after the pre-plan) */
  for (size_t i = 0; !r && !q->dev && i < q->nboxes; i++) {
    const rs_qbox *b = &q->boxes[i];
    rs_quantize_box(b, b->in_buf < 0 ? q->gather : src_buffers[b->in_buf], q->codes, q->scales);
  }
  /* a rank with no source buffers and no scratch passes none, as its
   * caller did */
  const int pass = ptrs && bytes && (src_buffers || scratch_here);
  /* the main plan may spread the codes and scales (plan/spread.h) */
  if (plan->spread)
    r = rs_spread_execute(plan, explicit_version, version_in, pass ? ptrs : NULL, pass ? n : 0,
                          pass && src_bytes ? bytes : NULL, dst_buffers, num_dst, dst_bytes, stream, r);
  else
    r = rs_execute_call(plan, explicit_version, version_in, pass ? ptrs : NULL, pass ? n : 0,
                        pass && src_bytes ? bytes : NULL, dst_buffers, num_dst, dst_bytes, stream, r);
  /* the plan fails with its pre-plan, also where the main plan had no
   * partner to hear of it */
  if (pre_failed) rs_plan_mark_failed(plan, 0, 0, pre_failed, reshard_last_error());
  free(ptrs);
  free(bytes);
  return r;
}

/* reshard_plan_register_buffers of a quantizing plan on a transport that
 * maps its peers' memory: the pre-plan registers the caller's sources and
 * the gather scratch, the main plan the caller's sources with the codes
 * and scales scratch after them, and the caller's destinations; executes
 * then pass exactly those (rs_quant_execute does). Both registrations are
 * collective and all or nothing; when the main plan's fails, the
 * pre-plan's is undone, so both plans go back to staging. NULL arrays:
 * both unregister. A rank out of memory for the arrays returns before any
 * collective call, as rs_device_register does. */
reshard_result_t rs_quant_register(reshard_plan_t *plan, void *const *src, size_t nsrc, void *const *dst,
                                   size_t ndst) {
  const rs_executor *ex = plan->executor;
  rs_quant *q = plan->quant;
  const int unregister = !src && !dst && !nsrc && !ndst;
  if (!unregister && nsrc != (size_t)q->user_nsrc)
    return rs_error(RESHARD_ERROR_INVALID_ARGUMENT, "register_buffers rank %d: %zu source buffers given, the source "
                    "layout has %d", plan->rank, nsrc, q->user_nsrc);
  const size_t n = (size_t)plan->num_src_buffers, ng = (size_t)q->pre_ndst;
  void **ms = rs_calloc(n + 1, sizeof *ms), **gd = rs_calloc(ng + 1, sizeof *gd);
  if (!ms || !gd) { /* (before any collective call: the partners' exchanges end at their deadline) */
    free(ms);
    free(gd);
    return rs_error(RESHARD_ERROR_OUT_OF_MEMORY, "register_buffers rank %d: out of memory", plan->rank);
  }
  for (size_t i = 0; src && i < nsrc; i++) ms[i] = src[i];
  if (q->codes_buf >= 0) ms[q->codes_buf] = q->codes, ms[q->scales_buf] = q->scales;
  if (q->gather_buf >= 0) gd[q->gather_buf] = q->gather;
  reshard_result_t rp = RESHARD_SUCCESS;
  char msg[640] = "";
  if (q->pre) {
    rp = unregister ? ex->register_buffers(q->pre, NULL, 0, NULL, 0) : ex->register_buffers(q->pre, src, nsrc, gd, ng);
    if (rp) {
      rs_error_prefix("register_buffers rank %d (the plan gathering blocks split across source ranks): ", plan->rank);
      snprintf(msg, sizeof msg, "%s", reshard_last_error());
    }
  }
  /* the main plan: registered only where the pre-plan's registration held */
  reshard_result_t rm = unregister || rp ? ex->register_buffers(plan, NULL, 0, NULL, 0)
                                                                                : ex->register_buffers(plan, (void *const *)ms, n, dst, ndst);
  if (rm && !rp) {
    snprintf(msg, sizeof msg, "%s", reshard_last_error());
    if (!unregister && q->pre) ex->register_buffers(q->pre, NULL, 0, NULL, 0); /* undo the pre-plan's */
  }
  free(ms);
  free(gd);
  reshard_result_t e = rp ? rp : rm;
  if (e) return rs_error(e, "%s", msg);
  return RESHARD_SUCCESS;
}
