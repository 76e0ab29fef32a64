/* Execute of a plan with source-side spreading (see plan/spread.h): the
 * pre-plan copies slices of sole-held source data into scratch on less
 * busy ranks of their NVLink domain, then the main plan sends from the
 * caller's source buffers and that scratch. */
#include <stdlib.h>

#include "common/alloc.h"
#include "common/error.h"
#include "exec/exec_state.h"
#include "plan/spread.h"

reshard_result_t rs_spread_execute(const reshard_plan_t *plan, int explicit_version, uint64_t version_in,
                                   void *const *src_buffers, size_t num_src, const size_t *src_bytes,
                                   void *const *dst_buffers, size_t num_dst, const size_t *dst_bytes, void *stream,
                                   reshard_result_t rejected) {
  if (!rejected) rs_error_clear();
  rs_spread *s = plan->spread;
  /* A failed plan still runs its pre-plan as a rejected call, so that
   * the ranks copying to or from this one hear of it now instead of at
   * their deadline. */
  reshard_result_t refused = rejected ? RESHARD_SUCCESS : rs_plan_refuse_if_failed(plan);
  if (refused) rejected = refused;
  /* (one scratch per plan: calls of a plan do not overlap, plan.h busy) */
  /* The caller's arrays are checked by the pre-plan, whose source layout
   * is the caller's: its refusal reaches the main plan as a rejection. */
  reshard_result_t r = rejected;
  /* the main plan's source arrays: the caller's buffers, then the scratch
   * (every rank's, NULL but this rank's); the pre-plan's destination: the
   * scratch */
  const size_t n = (size_t)plan->num_src_buffers, np = (size_t)s->pre_ndst;
  void **ptrs = rs_calloc(n + np + 1, sizeof *ptrs);
  size_t *bytes = rs_calloc(n + np + 1, sizeof *bytes);
  if ((!ptrs || !bytes) && !r)
    r = rs_error(RESHARD_ERROR_OUT_OF_MEMORY, "execute rank %d: out of memory for %zu buffer entries", plan->rank, n);
  if (ptrs && bytes) {
    for (size_t i = 0; src_buffers && i < num_src && i < (size_t)s->user_nsrc; i++) ptrs[i] = src_buffers[i];
    for (size_t i = 0; src_bytes && i < num_src && i < (size_t)s->user_nsrc; i++) bytes[i] = src_bytes[i];
    for (int k = 0; k < s->nbufs; k++) {
      ptrs[s->main_id[k]] = ptrs[n + (size_t)s->pre_id[k]] = s->scratch + s->off[k];
      bytes[s->main_id[k]] = bytes[n + (size_t)s->pre_id[k]] = s->len[k];
    }
  }
  /* every rank runs both, so that calls stay numbered alike on both
   * plans; a rejected call still takes its place in each */
  reshard_result_t pre_failed = RESHARD_SUCCESS;
  reshard_result_t rp = rs_execute_call(s->pre, explicit_version, version_in, src_buffers, num_src, src_bytes,
                                        ptrs ? ptrs + n : NULL, ptrs ? np : 0, bytes ? bytes + n : NULL, NULL, r);
  if (!r && rp) {
    /* the caller's arguments are the pre-plan's to check first: their
     * errors read as the plain plan's would */
    r = rp;
    pre_failed = rs_result_fails_plan(rp) ? rp : RESHARD_SUCCESS;
    if (pre_failed)
      rs_error_prefix("execute rank %d (copying sole-held data to less busy ranks of its domain): ", plan->rank);
  }
  /* a rank with no source buffers and no scratch passes none, as its
   * caller did */
  const int pass = ptrs && bytes && (src_buffers || s->nbufs);
  r = rs_execute_call(plan, explicit_version, version_in, pass ? ptrs : NULL, pass ? n : 0,
                      pass && src_bytes ? bytes : NULL, dst_buffers, num_dst, dst_bytes, stream, r);
  /* the plan fails with its pre-plan, also where the main plan had no
   * partner to hear of it */
  if (pre_failed) rs_plan_mark_failed(plan, 0, 0, pre_failed, reshard_last_error());
  free(ptrs);
  free(bytes);
  return r;
}
