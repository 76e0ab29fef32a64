/* Composite plans as stages. A plan with source-side spreading
 * (plan/spread.h) or block quantization (plan/quant.h) runs a pre-plan
 * stage before its main plan: spreading copies slices of sole-held source
 * data into scratch on less busy ranks of their NVLink domain; quantizing
 * gathers the blocks split across source ranks, then quantizes this
 * rank's boxes into its scratch (on the host here; the device executor
 * quantizes in stream order at the start of the first stage that reads
 * the codes, the main plan or its spreading pre-plan, src/device/
 * quant_device.c). On the device every stage is enqueued on the caller's
 * stream, each after the one before. The main plan then reads the
 * caller's source buffers with the scratch appended. A quantizing plan's
 * main plan may itself spread the codes and scales.
 *
 * Every rank runs every stage of every call, so that calls stay numbered
 * alike on all the plans; a rejected call still takes its place in each.
 * A stage that fails the plan fails the composite plan too, also where
 * the main plan has no partner to hear of it. Calls of a plan do not
 * overlap (plan.h: busy), so each plan has one scratch. */
#include <stdio.h>
#include <stdlib.h>

#include "api/front.h"
#include "common/alloc.h"
#include "common/error.h"
#include "exec/exec_state.h"
#include "pack/quantize.h"
#include "plan/executor.h"
#include "plan/quant.h"
#include "plan/spread.h"

size_t rs_api_user_nsrc(const reshard_plan_t *plan) {
  return plan->quant    ? (size_t)plan->quant->user_nsrc
         : plan->spread ? (size_t)plan->spread->user_nsrc
                        : (size_t)plan->num_src_buffers;
}

/* A stage's buffer arrays: n entries, the first `user` of them the
 * caller's source buffers (as many as it passed), the rest filled by the
 * stage. Running out of memory is a rejection the call tells the
 * partners of (r, unless r already holds one). */
typedef struct stage_bufs {
  void **ptrs;
  size_t *bytes;
} stage_bufs;

static reshard_result_t stage_arrays(const reshard_plan_t *plan, size_t n, size_t user, const rs_call_args *a,
                                     stage_bufs *b, reshard_result_t r, const char *what) {
  b->ptrs = rs_calloc(n + 1, sizeof *b->ptrs);
  b->bytes = rs_calloc(n + 1, sizeof *b->bytes);
  if ((!b->ptrs || !b->bytes) && !r)
    r = rs_error(RESHARD_ERROR_OUT_OF_MEMORY, "execute rank %d: out of memory for %s", plan->rank, what);
  for (size_t i = 0; b->ptrs && b->bytes && i < a->nsrc && i < user; i++) {
    if (a->src) b->ptrs[i] = a->src[i];
    if (a->src_bytes) b->bytes[i] = a->src_bytes[i];
  }
  return r;
}

/* The main plan's arrays (stage_arrays), named in an out-of-memory
 * message by the main plan's own source count n. */
static reshard_result_t main_arrays(const reshard_plan_t *plan, size_t entries, size_t user, size_t n,
                                    const rs_call_args *a, stage_bufs *b, reshard_result_t r) {
  char what[64];
  snprintf(what, sizeof what, "%zu buffer entries", n);
  return stage_arrays(plan, entries, user, a, b, r, what);
}

static void stage_free(stage_bufs *b) {
  free(b->ptrs);
  free(b->bytes);
}

/* The pre-plan stage. Its failure becomes the call's result; a result
 * that fails the plan is returned, and its message says what the stage
 * was doing (the caller's argument errors it finds read as the plain
 * plan's would). */
static reshard_result_t run_pre(const reshard_plan_t *plan, const reshard_plan_t *pre, const rs_call_args *pa,
                                const char *what, reshard_result_t *r) {
  reshard_result_t rp = rs_api_call(pre, pa);
  if (*r || !rp) return RESHARD_SUCCESS;
  *r = rp;
  if (!rs_result_fails_plan(rp)) return RESHARD_SUCCESS;
  rs_error_prefix("execute rank %d (%s): ", plan->rank, what);
  return rp;
}

/* The main stage's arguments: the caller's, with the source arrays
 * replaced by the stage's (n entries). A rank with no source buffers and
 * no scratch passes none, as its caller did. */
static rs_call_args main_args(const rs_call_args *a, const stage_bufs *b, size_t n, int scratch_here,
                              reshard_result_t r) {
  const int pass = b->ptrs && b->bytes && (a->src || scratch_here);
  rs_call_args m = *a;
  m.src = pass ? b->ptrs : NULL;
  m.nsrc = pass ? n : 0;
  m.src_bytes = pass && a->src_bytes ? b->bytes : NULL;
  m.rejected = r;
  return m;
}

/* The end of a composite call: the plan fails with its pre-plan. */
static reshard_result_t stage_end(const reshard_plan_t *plan, reshard_result_t pre_failed, reshard_result_t r,
                                  stage_bufs *b) {
  if (pre_failed) rs_plan_mark_failed(plan, 0, 0, pre_failed, reshard_last_error());
  stage_free(b);
  return r;
}

static reshard_result_t run_spread(const reshard_plan_t *plan, const rs_call_args *a) {
  if (!a->rejected) rs_error_clear();
  const rs_spread *s = plan->spread;
  /* A failed plan still runs its pre-plan as a rejected call, so that
   * the ranks copying to or from this one hear of it now instead of at
   * their deadline. The caller's arrays are checked by the pre-plan, whose
   * source layout is the caller's. */
  reshard_result_t r = a->rejected ? a->rejected : rs_plan_refuse_if_failed(plan, "execute");
  /* the main plan's source arrays: the caller's buffers, then the scratch
   * (every rank's, NULL but this rank's); the pre-plan's destination: the
   * scratch, after them */
  const size_t n = (size_t)plan->num_src_buffers, np = (size_t)s->pre_ndst;
  stage_bufs b;
  r = main_arrays(plan, n + np, (size_t)s->user_nsrc, n, a, &b, r);
  for (int k = 0; b.ptrs && b.bytes && k < s->nbufs; k++) {
    b.ptrs[s->main_id[k]] = b.ptrs[n + (size_t)s->pre_id[k]] = s->scratch + s->off[k];
    b.bytes[s->main_id[k]] = b.bytes[n + (size_t)s->pre_id[k]] = s->len[k];
  }
  const int ok = b.ptrs && b.bytes;
  rs_call_args pa = *a;
  pa.dst = ok ? b.ptrs + n : NULL;
  pa.ndst = ok ? np : 0;
  pa.dst_bytes = ok ? b.bytes + n : NULL;
  /* on a device both plans go on the caller's stream: the main plan's
   * sends read the scratch after the pre-plan's copies wrote it */
  if (!plan->executor->stream_ordered) pa.stream = NULL;
  pa.rejected = r;
  reshard_result_t pre_failed =
      run_pre(plan, s->pre, &pa, "copying sole-held data to less busy ranks of its domain", &r);
  rs_call_args ma = main_args(a, &b, n, s->nbufs > 0, r);
  return stage_end(plan, pre_failed, rs_api_call(plan, &ma), &b);
}

/* The main plan of a quantizing plan: spread or plain. */
static reshard_result_t run_main(const reshard_plan_t *plan, const rs_call_args *a) {
  return plan->spread ? run_spread(plan, a) : rs_api_call(plan, a);
}

static reshard_result_t run_quant(const reshard_plan_t *plan, const rs_call_args *a) {
  if (!a->rejected) rs_error_clear();
  const rs_quant *q = plan->quant;
  RS_CHECK(rs_plan_refuse_if_failed(plan, "execute"));
  reshard_result_t r = a->rejected ? a->rejected : rs_argcheck_quant_inputs(plan, a);
  /* the main plan's source arrays: the caller's buffers, then the codes
   * and scales scratch, in the main plan's own source layout (its
   * spreading, if any, appends scratch after it) */
  const size_t n = plan->spread ? (size_t)plan->spread->user_nsrc : (size_t)plan->num_src_buffers;
  const int scratch_here = q->codes_buf >= 0;
  stage_bufs b;
  r = main_arrays(plan, n, n, n, a, &b, r);
  if (b.ptrs && b.bytes && scratch_here) {
    b.ptrs[q->codes_buf] = q->codes, b.bytes[q->codes_buf] = q->codes_bytes;
    b.ptrs[q->scales_buf] = q->scales, b.bytes[q->scales_buf] = q->scales_bytes;
  }
  reshard_result_t pre_failed = RESHARD_SUCCESS;
  if (q->pre) {
    stage_bufs g;
    const size_t ng = (size_t)q->pre_ndst;
    r = stage_arrays(plan, ng, 0, a, &g, r, "the gather's buffer entries");
    if (g.ptrs && g.bytes && q->gather_buf >= 0)
      g.ptrs[q->gather_buf] = q->gather, g.bytes[q->gather_buf] = q->gather_bytes;
    rs_call_args pa = *a;
    pa.dst = g.ptrs;
    pa.ndst = g.ptrs ? ng : 0;
    pa.dst_bytes = g.ptrs ? g.bytes : NULL;
    pa.rejected = r;
    pre_failed = run_pre(plan, q->pre, &pa, "gathering blocks split across source ranks", &r);
    stage_free(&g);
  }
  /* this rank's quantization, on the host executor (the device executor
   * quantizes at the start of the first stage that reads the codes, in
   * stream order after the gather) */
  for (size_t i = 0; !r && !q->dev && i < q->nboxes; i++) {
    const rs_qbox *x = &q->boxes[i];
    rs_quantize_box(x, x->in_buf < 0 ? q->gather : a->src[x->in_buf], q->codes, q->scales);
  }
  rs_call_args ma = main_args(a, &b, n, scratch_here, r);
  return stage_end(plan, pre_failed, run_main(plan, &ma), &b);
}

reshard_result_t rs_api_run_stages(const reshard_plan_t *plan, const rs_call_args *a) {
  return plan->quant ? run_quant(plan, a) : run_main(plan, a);
}

/* One stage's registration: its plan and buffer arrays. */
typedef struct reg_stage {
  const reshard_plan_t *p;
  void *const *src, *const *dst;
  size_t nsrc, ndst;
  const char *what; /* in messages; NULL: the main plan */
} reg_stage;

/* The stages of a composite plan in execution order with the arrays
 * each registers: ms holds the main plan's sources (the caller's, then
 * the quantization scratch, then the spreading scratch: a prefix is each
 * earlier stage's), gd the gather's destinations, sd the spreading
 * copies'. Returns how many. */
static int reg_stages(const reshard_plan_t *plan, void *const *src, size_t nsrc, void *const *dst, size_t ndst,
                      void **ms, void **gd, void **sd, reg_stage *st) {
  const rs_quant *q = plan->quant;
  const rs_spread *s = plan->spread;
  for (size_t i = 0; src && i < nsrc; i++) ms[i] = src[i];
  if (q && q->codes_buf >= 0) ms[q->codes_buf] = q->codes, ms[q->scales_buf] = q->scales;
  if (q && q->gather_buf >= 0) gd[q->gather_buf] = q->gather;
  for (int k = 0; s && k < s->nbufs; k++) ms[s->main_id[k]] = sd[s->pre_id[k]] = s->scratch + s->off[k];
  int n = 0;
  if (q && q->pre)
    st[n++] = (reg_stage){q->pre, src, gd, nsrc, (size_t)q->pre_ndst, "the plan gathering blocks split across "
                          "source ranks"};
  if (s)
    st[n++] = (reg_stage){s->pre, ms, sd, (size_t)s->user_nsrc, (size_t)s->pre_ndst, "the plan copying sole-held "
                          "data to less busy ranks of its domain"};
  st[n++] = (reg_stage){plan, ms, dst, (size_t)plan->num_src_buffers, ndst, NULL};
  return n;
}

/* reshard_plan_register_buffers of a composite plan on a transport that
 * maps its peers' memory: each stage registers what its executes pass
 * (run_quant and run_spread pass exactly those): a quantizing plan's
 * gather the caller's sources and the gather scratch, a spreading plan's
 * copies the caller's sources (and codes and scales) and the spreading
 * scratch, the main plan all its sources with the scratch after the
 * caller's, and the caller's destinations. Every registration is
 * collective and all or nothing, and every rank makes the same calls:
 * once one stage's fails, the later stages unregister, and the earlier
 * ones are undone, so every plan goes back to staging. NULL arrays: all
 * unregister. A rank out of memory for the arrays returns before any
 * collective call, as the device executor's registration does. */
reshard_result_t rs_api_register_stages(reshard_plan_t *plan, void *const *src, size_t nsrc, void *const *dst,
                                        size_t ndst) {
  const rs_executor *ex = plan->executor;
  const int unregister = !src && !dst && !nsrc && !ndst;
  RS_CHECK(rs_argcheck_stages_register(plan, src, nsrc, dst, ndst));
  const size_t n = (size_t)plan->num_src_buffers;
  const size_t ng = plan->quant ? (size_t)plan->quant->pre_ndst : 0;
  const size_t ns = plan->spread ? (size_t)plan->spread->pre_ndst : 0;
  void **ms = rs_calloc(n + 1, sizeof *ms), **gd = rs_calloc(ng + 1, sizeof *gd), **sd = rs_calloc(ns + 1, sizeof *sd);
  if (!ms || !gd || !sd) { /* (before any collective call: the partners' exchanges end at their deadline) */
    free(ms);
    free(gd);
    free(sd);
    return rs_error(RESHARD_ERROR_OUT_OF_MEMORY, "register_buffers rank %d: out of memory", plan->rank);
  }
  reg_stage st[3];
  const int nst = reg_stages(plan, src, nsrc, dst, ndst, ms, gd, sd, st);
  reshard_result_t e = RESHARD_SUCCESS;
  int held = 0; /* stages registered */
  char msg[640] = "";
  for (int i = 0; i < nst; i++) {
    reshard_plan_t *p = (reshard_plan_t *)st[i].p;
    reshard_result_t r = unregister || e ? ex->register_buffers(p, NULL, 0, NULL, 0)
                                         : ex->register_buffers(p, st[i].src, st[i].nsrc, st[i].dst, st[i].ndst);
    if (r && !e) {
      e = r;
      if (st[i].what) rs_error_prefix("register_buffers rank %d (%s): ", plan->rank, st[i].what);
      snprintf(msg, sizeof msg, "%s", reshard_last_error());
    }
    if (!r && !e && !unregister) held = i + 1;
  }
  for (int i = 0; e && i < held; i++) /* undo the earlier stages' */
    ex->register_buffers((reshard_plan_t *)st[i].p, NULL, 0, NULL, 0);
  free(ms);
  free(gd);
  free(sd);
  if (e) return rs_error(e, "%s", msg);
  return RESHARD_SUCCESS;
}
