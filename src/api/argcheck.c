/* The front door's argument checks: everything an execute or a
 * registration checks of the caller's arguments before anything moves,
 * in one place (NCCL's argcheck.cc is the model), for both executors and
 * every stage of a composite plan. Each failure is a specific result
 * whose message names the rank, the side, the buffer and its tensor;
 * nothing has been read or written when it returns. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "api/front.h"
#include "common/alloc.h"
#include "common/error.h"
#include "plan/executor.h"
#include "plan/plan.h"
#include "plan/quant.h"
#include "transport/transport.h"

/* The buffers of one side: as many as the layout has (or none, on a rank
 * that uses none), and every one the plan reads or writes non-NULL. */
static reshard_result_t check_buffers(const reshard_plan_t *p,
                                      const char *side, void *const *bufs,
                                      size_t n, int expected,
                                      const rs_used_buffer *used,
                                      int nused) {
  if (nused == 0) {
    if (bufs && n != (size_t)expected && n != 0)
      return rs_error(RESHARD_ERROR_INVALID_USAGE, "execute rank %d: %zu %s buffers given, the layout has %d",
                      p->rank, n, side, expected);
    return RESHARD_SUCCESS;
  }
  if (!bufs || n != (size_t)expected)
    return rs_error(RESHARD_ERROR_INVALID_USAGE, "execute rank %d: %s buffers: %zu given (%s), the layout has %d",
                    p->rank, side, n, bufs ? "array" : "NULL", expected);
  for (int i = 0; i < nused; i++)
    if (!bufs[used[i].id] && used[i].bytes)
      return rs_error(RESHARD_ERROR_INVALID_ARGUMENT, "execute rank %d: %s buffer %d '%s' (%llu bytes) is NULL",
                      p->rank, side, used[i].id, used[i].name, (unsigned long long)used[i].bytes);
  return RESHARD_SUCCESS;
}

/* The sizes of every buffer the plan uses, against the layout's. */
static reshard_result_t check_sizes(const reshard_plan_t *p, const char *side, const size_t *bytes, void *const *bufs,
                                    size_t n, size_t base, const rs_used_buffer *used, int nused) {
  for (int i = 0; bytes && i < nused; i++) {
    size_t k = base + (size_t)used[i].id;
    if (k >= n || !bufs[k]) continue; /* the count and NULL checks say why */
    if (bytes[k] < used[i].bytes)
      return rs_error(RESHARD_ERROR_INVALID_ARGUMENT,
                      "execute rank %d: %s buffer %d '%s' is %zu bytes, the layout needs %llu on this rank", p->rank,
                      side, used[i].id, used[i].name, bytes[k], (unsigned long long)used[i].bytes);
  }
  return RESHARD_SUCCESS;
}

/* Destination memory written twice: two buffers (or a buffer's two
 * copies) whose byte ranges, as large as the layout says on this rank,
 * overlap would each overwrite the other with a clean status. Sorted by
 * address, an overlapping pair always has an overlapping neighbour. */
typedef struct dst_span {
  uintptr_t lo, hi;
  int id, copy;
  const char *name;
} dst_span;

static int cmp_span(const void *a, const void *b) {
  const dst_span *x = a, *y = b; /* ties: copy 0 first, then by id (a stable message) */
  if (x->lo != y->lo) return x->lo < y->lo ? -1 : 1;
  if (x->copy != y->copy) return x->copy - y->copy;
  return x->id - y->id;
}

static reshard_result_t check_dst_overlap(const reshard_plan_t *p, void *const *bufs, size_t nd, int copies) {
  if (!bufs || p->ndst_used < 1 || (p->ndst_used < 2 && copies < 2)) return RESHARD_SUCCESS;
  dst_span *s = rs_malloc((size_t)p->ndst_used * (size_t)copies * sizeof *s);
  if (!s) return rs_error(RESHARD_ERROR_OUT_OF_MEMORY, "execute rank %d: out of memory checking buffers", p->rank);
  size_t n = 0;
  for (int c = 0; c < copies; c++)
    for (int i = 0; i < p->ndst_used; i++) {
      const rs_used_buffer *u = &p->dst_used[i];
      void *b = bufs[(size_t)c * nd + (size_t)u->id];
      if (b && u->bytes) s[n++] = (dst_span){(uintptr_t)b, (uintptr_t)b + u->bytes, u->id, c, u->name};
    }
  if (n > 1) qsort(s, n, sizeof *s, cmp_span);
  reshard_result_t r = RESHARD_SUCCESS;
  for (size_t i = 0; i + 1 < n && !r; i++)
    if (s[i + 1].lo < s[i].hi) {
      char a[32] = "", b[32] = "";
      if (copies > 1) snprintf(a, sizeof a, " copy %d", s[i].copy), snprintf(b, sizeof b, " copy %d", s[i + 1].copy);
      r = rs_error(RESHARD_ERROR_INVALID_ARGUMENT,
                   "execute rank %d: destination buffers %d '%s'%s and %d '%s'%s share memory (bytes %llu .. %llu of "
                   "the first, as large as the layout makes them): each would overwrite the other",
                   p->rank, s[i].id, s[i].name, a, s[i + 1].id, s[i + 1].name, b,
                   (unsigned long long)(s[i + 1].lo - s[i].lo),
                   (unsigned long long)((s[i + 1].hi < s[i].hi ? s[i + 1].hi : s[i].hi) - s[i].lo));
    }
  free(s);
  return r;
}

reshard_result_t rs_argcheck_execute(const reshard_plan_t *plan, const rs_call_args *a) {
  void *const *src_buffers = a->src, *const *dst_buffers = a->dst;
  const size_t num_src = a->nsrc, num_dst = a->ndst, *src_bytes = a->src_bytes, *dst_bytes = a->dst_bytes;
  const int dbuf = (plan->opts.flags & RESHARD_FLAG_DOUBLE_BUFFER) != 0;
  if (a->stream && !plan->executor->stream_ordered)
    return rs_error(RESHARD_ERROR_INVALID_ARGUMENT, "execute rank %d: stream must be NULL on the %s transport",
                    plan->rank, plan->comm->ops->name);
  RS_CHECK(check_buffers(plan, "source", src_buffers, num_src, plan->num_src_buffers, plan->src_used, plan->nsrc_used));
  RS_CHECK(check_sizes(plan, "source", src_bytes, src_buffers, num_src, 0, plan->src_used, plan->nsrc_used));
  const size_t nd = (size_t)plan->num_dst_buffers;
  if (dbuf) {
    if (plan->ndst_used && (!dst_buffers || num_dst != 2 * nd))
      return rs_error(RESHARD_ERROR_INVALID_USAGE,
                      "execute rank %d: destination buffers: %zu given (%s); RESHARD_FLAG_DOUBLE_BUFFER needs 2 x %zu "
                      "(copy 0 of every buffer, then copy 1)",
                      plan->rank, dst_buffers ? num_dst : 0, dst_buffers ? "array" : "NULL", nd);
    if (plan->ndst_used) {
      RS_CHECK(check_buffers(plan, "destination (copy 0)", dst_buffers, nd, plan->num_dst_buffers, plan->dst_used,
                             plan->ndst_used));
      RS_CHECK(check_buffers(plan, "destination (copy 1)", dst_buffers + nd, nd, plan->num_dst_buffers,
                             plan->dst_used, plan->ndst_used));
      RS_CHECK(check_sizes(plan, "destination (copy 0)", dst_bytes, dst_buffers, num_dst, 0, plan->dst_used,
                           plan->ndst_used));
      RS_CHECK(check_sizes(plan, "destination (copy 1)", dst_bytes, dst_buffers, num_dst, nd, plan->dst_used,
                           plan->ndst_used));
    } else if (dst_buffers && num_dst != 0 && num_dst != 2 * nd) {
      return rs_error(RESHARD_ERROR_INVALID_USAGE,
                      "execute rank %d: %zu destination buffers given, RESHARD_FLAG_DOUBLE_BUFFER needs 2 x %zu or none",
                      plan->rank, num_dst, nd);
    }
  } else {
    RS_CHECK(check_buffers(plan, "destination", dst_buffers, num_dst, plan->num_dst_buffers, plan->dst_used,
                           plan->ndst_used));
    RS_CHECK(check_sizes(plan, "destination", dst_bytes, dst_buffers, num_dst, 0, plan->dst_used, plan->ndst_used));
  }
  if (plan->ndst_used) RS_CHECK(check_dst_overlap(plan, dst_buffers, nd, dbuf ? 2 : 1));
  return RESHARD_SUCCESS;
}


reshard_result_t rs_argcheck_counts(const reshard_plan_t *plan, size_t us, const void *src, size_t num_src,
                                    const void *dst, size_t num_dst) {
  const size_t ud = (size_t)plan->num_dst_buffers;
  if ((src && num_src && num_src != us) || (dst && num_dst && num_dst != ud && num_dst != 2 * ud))
    return rs_error(RESHARD_ERROR_INVALID_USAGE,
                    "execute rank %d: %zu source and %zu destination buffers given, the layout has %zu "
                    "and %zu (2 x %zu with RESHARD_FLAG_DOUBLE_BUFFER); no entry was read",
                    plan->rank, num_src, num_dst, us, ud, ud);
  return RESHARD_SUCCESS;
}

reshard_result_t rs_argcheck_quant_inputs(const reshard_plan_t *plan, const rs_call_args *a) {
  const rs_quant *q = plan->quant;
  /* the count as the plain executor checks it: a rank that reads no
   * source buffer may pass none */
  int reads = q->nin > 0;
  for (int i = 0; i < plan->nsrc_used && !reads; i++) reads = plan->src_used[i].id < q->user_nsrc;
  if (a->src && a->nsrc != (size_t)q->user_nsrc && (a->nsrc || reads))
    return rs_error(RESHARD_ERROR_INVALID_USAGE, "execute rank %d: %zu source buffers given, the source layout has %d",
                    plan->rank, a->nsrc, q->user_nsrc);
  for (size_t i = 0; i < q->nin; i++) {
    const int b = q->in_bufs[i];
    if (!a->src || !a->src[b])
      return rs_error(RESHARD_ERROR_INVALID_ARGUMENT,
                      "execute rank %d: source buffer %d is %s, and this rank quantizes weights it holds", plan->rank,
                      b, a->src ? "NULL" : "missing (src_buffers is NULL)");
    if (a->src_bytes && a->src_bytes[b] < q->in_need[i])
      return rs_error(RESHARD_ERROR_INVALID_ARGUMENT,
                      "execute rank %d: source buffer %d is %zu bytes, the layout needs %llu on this rank", plan->rank, b,
                      a->src_bytes[b], (unsigned long long)q->in_need[i]);
  }
  return RESHARD_SUCCESS;
}

reshard_result_t rs_argcheck_stages_register(const reshard_plan_t *plan, void *const *src, size_t nsrc,
                                             void *const *dst, size_t ndst) {
  const int unregister = !src && !dst && !nsrc && !ndst;
  const size_t user = rs_api_user_nsrc(plan);
  if (!unregister && nsrc != user)
    return rs_error(RESHARD_ERROR_INVALID_ARGUMENT, "register_buffers rank %d: %zu source buffers given, the source "
                    "layout has %zu", plan->rank, nsrc, user);
  return RESHARD_SUCCESS;
}
