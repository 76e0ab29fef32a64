/* Tensor matching at plan creation: every tensor of the destination layout
 * paired with the source tensor of its name (c->dst2src, c->src2dst), their
 * shapes and dtypes checked, and for RESHARD_FLAG_VERIFY the destination
 * tensors' names and strides copied into the plan. Apart from create.c
 * because it reads only the two layouts, never the ranks' pieces, and is
 * where a caller's "tensor '...'" errors come from. */
#include <stdio.h>
#include <string.h>

#include "common/alloc.h"
#include "common/error.h"
#include "pack/convert.h"
#include "plan/planner.h"

static void format_shape(char *buf, size_t n, int ndim, const int64_t *shape) {
  size_t used = (size_t)snprintf(buf, n, "[");
  for (int d = 0; d < ndim && used < n; d++)
    used += (size_t)snprintf(buf + used, n - used, "%s%lld", d ? ", " : "", (long long)shape[d]);
  if (used < n) snprintf(buf + used, n - used, "]");
}

/* Tensors must match by name and shape on both sides, and by dtype but
 * for float tensors, which convert. */
reshard_result_t rs_match_tensors(build_ctx *c) {
  const reshard_layout_t *S = c->src, *D = c->dst;
  c->dst2src = rs_malloc(((size_t)D->ntensors + 1) * sizeof(int));
  c->src2dst = rs_malloc(((size_t)S->ntensors + 1) * sizeof(int));
  if (!c->dst2src || !c->src2dst) return rs_error(RESHARD_ERROR_OUT_OF_MEMORY, "plan_create: out of memory");
  for (int i = 0; i < S->ntensors; i++) c->src2dst[i] = -1;
  for (int i = 0; i < D->ntensors; i++) {
    const rs_tensor *dt = &D->tensors[i];
    int s = i;
    /* Both sides usually declare the tensors in the same order (one model
     * front-end): try the same id before the name index, which misses the
     * cache on every lookup of a 100k-tensor model. */
    int in_order = i < S->ntensors && S->tensors[i].name_hash == dt->name_hash && !strcmp(S->tensors[i].name, dt->name);
    if (!in_order && reshard_layout_find_tensor(S, dt->name, &s) != RESHARD_SUCCESS)
      return rs_error(RESHARD_ERROR_INVALID_ARGUMENT, "tensor '%s': in the destination layout but not in the source layout", dt->name);
    const rs_tensor *st = &S->tensors[s];
    /* a float tensor may change dtype on the way (src/pack/convert.h);
     * anything else arrives as it left */
    if (st->dtype != dt->dtype && !(rs_cvt_float_dtype(st->dtype) && rs_cvt_float_dtype(dt->dtype)))
      return rs_error(RESHARD_ERROR_INVALID_ARGUMENT,
                      "tensor '%s': dtype %s on the source side, %s on the destination side (only f32, bf16, f16, "
                      "fp8e4m3 and fp8e5m2 convert into each other)",
                      dt->name, reshard_dtype_name(st->dtype), reshard_dtype_name(dt->dtype));
    if (st->dtype != dt->dtype) c->plan->casts = 1;
    if (st->dtype != dt->dtype && verifying(c->plan))
      return rs_error(RESHARD_ERROR_UNSUPPORTED,
                      "tensor '%s': dtype %s on the source side, %s on the destination side: RESHARD_FLAG_VERIFY does "
                      "not cover converted tensors yet",
                      dt->name, reshard_dtype_name(st->dtype), reshard_dtype_name(dt->dtype));
    int same = st->ndim == dt->ndim;
    for (int d = 0; same && d < dt->ndim; d++) same = st->shape[d] == dt->shape[d];
    if (!same) {
      char a[160], b[160];
      format_shape(a, sizeof a, st->ndim, st->shape);
      format_shape(b, sizeof b, dt->ndim, dt->shape);
      return rs_error(RESHARD_ERROR_INVALID_ARGUMENT, "tensor '%s': shape %s on the source side, %s on the destination side",
                      dt->name, a, b);
    }
    c->dst2src[i] = s;
    c->src2dst[s] = i;
  }
  for (int i = 0; i < S->ntensors; i++)
    if (c->src2dst[i] < 0)
      return rs_error(RESHARD_ERROR_INVALID_ARGUMENT, "tensor '%s': in the source layout but not in the destination layout", S->tensors[i].name);
  return RESHARD_SUCCESS;
}

/* Verify mode: the destination tensors' names and index strides. */
reshard_result_t rs_build_vtensors(reshard_plan_t *p, const reshard_layout_t *dst) {
  p->vtensors = rs_calloc((size_t)dst->ntensors + 1, sizeof *p->vtensors);
  if (!p->vtensors) return rs_error(RESHARD_ERROR_OUT_OF_MEMORY, "plan_create: out of memory (verify tensors)");
  p->nvtensors = dst->ntensors;
  for (int i = 0; i < dst->ntensors; i++) {
    const rs_tensor *t = &dst->tensors[i];
    rs_vtensor *v = &p->vtensors[i];
    v->name = rs_strdup(t->name);
    if (!v->name) return rs_error(RESHARD_ERROR_OUT_OF_MEMORY, "plan_create: out of memory (verify tensors)");
    v->ndim = t->ndim;
    v->esize = (uint32_t)reshard_dtype_size(t->dtype);
    int64_t g = 1;
    for (int d = t->ndim - 1; d >= 0; d--) {
      v->gstride[d] = g;
      g *= t->shape[d];
    }
  }
  return RESHARD_SUCCESS;
}
