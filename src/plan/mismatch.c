/* Naming a disagreement between ranks' descriptions, once the creation's
 * agreement (create.c) found their digests differ: the lowest rank that
 * differs from rank 0 and the first option, count, tensor or buffer that
 * does. Apart from creation proper because it is a protocol of its own
 * (a few more collectives, every rank taking part). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/error.h"
#include "layout/layout.h"
#include "plan/planner.h"
#include "transport/transport.h"

/* ---- naming a disagreement ----
 * Run by every rank when the digests differ and no rank failed on its own
 * (both facts come from the agreement, so all ranks enter): a few more
 * allreduces find the lowest rank f whose description differs from rank
 * 0's, then the first thing that differs between the two: an option, a
 * count, a tensor or a buffer (bisecting their indices, one word pair a
 * step). Writes the answer into msg. */

/* out[0..n) = rank a's words, out[n..2n) = rank b's (max with zeros). */
static reshard_result_t pair_words(reshard_comm_t *comm, int a, int b, const uint64_t *mine, int n, uint64_t *out,
                                   int64_t deadline) {
  memset(out, 0, 2 * (size_t)n * sizeof *out);
  if (comm->rank == a) memcpy(out, mine, (size_t)n * sizeof *out);
  if (comm->rank == b) memcpy(out + n, mine, (size_t)n * sizeof *out);
  return comm->ops->allreduce_max_u64(comm, out, 2 * n, deadline);
}

/* Item i of kind k (0: tensors, 1: buffers) of side s: stored, or
 * hashed from the layout. */
static uint64_t item_digest(const rs_desc *d, int s, int k, int i) {
  if (d->dig[s][k]) return d->dig[s][k][i];
  return k ? rs_layout_buffer_digest(d->L[s], i) : rs_layout_tensor_digest(d->L[s], i);
}

/* The first index in [0, n) whose item differs between ranks 0 and f, or
 * -1 when none does. */
static reshard_result_t first_difference(reshard_comm_t *comm, int f, const rs_desc *d, int s, int k, int64_t deadline,
                                         int *at) {
  int lo = 0, hi = d->n[s][k];
  *at = -1;
  for (int whole = 1; hi - lo >= 1; whole = 0) {
    int mid = whole ? hi : lo + (hi - lo + 1) / 2; /* first the whole range, then halves */
    uint64_t h = 0x51ed, v[2];
    for (int i = lo; i < mid; i++) h = rs_hash_bytes(&(uint64_t){item_digest(d, s, k, i)}, sizeof(uint64_t), h);
    RS_CHECK(pair_words(comm, 0, f, &h, 1, v, deadline));
    if (v[0] != v[1]) {
      if (mid - lo == 1) {
        *at = lo;
        return RESHARD_SUCCESS;
      }
      hi = mid;
    } else {
      if (whole) return RESHARD_SUCCESS;
      lo = mid;
    }
  }
  return RESHARD_SUCCESS;
}

void rs_desc_of(const reshard_layout_t *src, const reshard_layout_t *dst, const uint64_t *hdr, rs_desc *d) {
  memset(d, 0, sizeof *d);
  memcpy(d->hdr, hdr, sizeof d->hdr);
  rs_layout_counts(src, d->counts);
  rs_layout_counts(dst, d->counts + 5);
  d->L[0] = src;
  d->L[1] = dst;
  for (int s = 0; s < 2; s++) {
    d->n[s][0] = d->L[s]->ntensors;
    d->n[s][1] = d->L[s]->nbuffers;
  }
}

rs_desc *rs_desc_keep(const reshard_layout_t *src, const reshard_layout_t *dst, const uint64_t *hdr) {
  rs_desc *d = malloc(sizeof *d);
  if (!d) return NULL;
  rs_desc_of(src, dst, hdr, d);
  for (int s = 0; s < 2; s++)
    for (int k = 0; k < 2; k++) {
      uint64_t *a = malloc(((size_t)d->n[s][k] + 1) * sizeof *a);
      if (!a) {
        rs_desc_free(d);
        return NULL;
      }
      for (int i = 0; i < d->n[s][k]; i++) a[i] = item_digest(d, s, k, i);
      d->dig[s][k] = a;
    }
  d->L[0] = d->L[1] = NULL; /* the caller's layouts may not outlive the plan */
  return d;
}

void rs_desc_free(rs_desc *d) {
  if (!d) return;
  for (int s = 0; s < 2; s++)
    for (int k = 0; k < 2; k++) free(d->dig[s][k]);
  free(d);
}

reshard_result_t rs_explain_mismatch(reshard_comm_t *comm, const rs_desc *d, uint64_t digest, int64_t deadline,
                                     char *msg, size_t len) {
  uint64_t v[2 * 17];
  /* rank 0's digest, then the lowest rank that differs from it */
  RS_CHECK(pair_words(comm, 0, -1, &digest, 1, v, deadline));
  uint64_t mine = digest != v[0] ? UINT64_MAX - (uint64_t)comm->rank : 0;
  RS_CHECK(comm->ops->allreduce_max_u64(comm, &mine, 1, deadline));
  const int f = (int)(UINT64_MAX - mine);
  /* options and counts */
  uint64_t words[17];
  memcpy(words, d->hdr, 7 * sizeof *words);
  memcpy(words + 7, d->counts, 10 * sizeof *words);
  RS_CHECK(pair_words(comm, 0, f, words, 17, v, deadline));
  static const char *const what[17] = {
      "the communicator size", "options.staging_bytes", "options.chunk_bytes", "options.relay", "options.flags",
      "options.topology", "the relay part size (rs_relay_min_part_bytes)",
      "the source layout's tensor count", "the source layout's mesh count", "the source layout's part count",
      "the source layout's buffer count", "the source layout's raw fragment count",
      "the destination layout's tensor count", "the destination layout's mesh count",
      "the destination layout's part count", "the destination layout's buffer count",
      "the destination layout's raw fragment count"};
  for (int i = 0; i < 17; i++)
    if (v[i] != v[17 + i]) {
      if (i == 5) snprintf(msg, len, "ranks 0 and %d differ in %s", f, what[i]);
      else snprintf(msg, len, "ranks 0 and %d differ in %s (%llu and %llu)", f, what[i], (unsigned long long)v[i],
                    (unsigned long long)v[17 + i]);
      return RESHARD_SUCCESS;
    }
  const char *names[2] = {"source", "destination"};
  for (int s = 0; s < 2; s++) {
    const reshard_layout_t *L = d->L[s]; /* NULL on a kept plan (reshard_plan_rejoin): no names */
    int at;
    RS_CHECK(first_difference(comm, f, d, s, 0, deadline, &at));
    if (at >= 0 && L) {
      const rs_tensor *t = &L->tensors[at];
      snprintf(msg, len, "ranks 0 and %d describe %s tensor %d differently (on this rank '%s', %s, %d dims; name, "
               "dtype, shape or allow_partial differ)", f, names[s], at, t->name, reshard_dtype_name(t->dtype), t->ndim);
    } else if (at >= 0) {
      snprintf(msg, len, "ranks 0 and %d describe %s tensor %d differently (name, dtype, shape or allow_partial "
               "differ)", f, names[s], at);
    }
    if (at >= 0) return RESHARD_SUCCESS;
    RS_CHECK(first_difference(comm, f, d, s, 1, deadline, &at));
    if (at >= 0) {
      snprintf(msg, len, "ranks 0 and %d describe %s buffer %d differently (%s%s%sits name, parts, meshes, "
               "placements, windows or raw fragments differ)", f, names[s], at, L ? "on this rank '" : "",
               L ? L->buffers[at].name : "", L ? "'; " : "");
      return RESHARD_SUCCESS;
    }
  }
  snprintf(msg, len, "ranks 0 and %d differ in a way not named here (mesh ids or order)", f);
  return RESHARD_SUCCESS;
}
