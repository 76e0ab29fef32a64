/* Naming a disagreement between ranks' descriptions, once the creation's
 * agreement (create.c) found their digests differ: the lowest rank that
 * differs from rank 0 and the first option, count, tensor or buffer that
 * does. Apart from creation proper because it is a protocol of its own
 * (a few more collectives, every rank taking part). */
#include <stdio.h>
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

typedef uint64_t (*item_digest)(const reshard_layout_t *L, int i);

/* The first index in [0, n) whose item differs between ranks 0 and f, or
 * -1 when none does. */
static reshard_result_t first_difference(reshard_comm_t *comm, int f, const reshard_layout_t *L, int n,
                                         item_digest dig, int64_t deadline, int *at) {
  int lo = 0, hi = n;
  *at = -1;
  for (int whole = 1; hi - lo >= 1; whole = 0) {
    int mid = whole ? hi : lo + (hi - lo + 1) / 2; /* first the whole range, then halves */
    uint64_t h = 0x51ed, v[2];
    for (int i = lo; i < mid; i++) h = rs_hash_bytes(&(uint64_t){dig(L, i)}, sizeof(uint64_t), h);
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

reshard_result_t rs_explain_mismatch(reshard_comm_t *comm, const reshard_layout_t *src, const reshard_layout_t *dst,
                                    const uint64_t *hdr, uint64_t digest, int64_t deadline, char *msg, size_t len) {
  uint64_t v[2 * 17];
  /* rank 0's digest, then the lowest rank that differs from it */
  RS_CHECK(pair_words(comm, 0, -1, &digest, 1, v, deadline));
  uint64_t mine = digest != v[0] ? UINT64_MAX - (uint64_t)comm->rank : 0;
  RS_CHECK(comm->ops->allreduce_max_u64(comm, &mine, 1, deadline));
  const int f = (int)(UINT64_MAX - mine);
  /* options and counts */
  uint64_t words[17];
  memcpy(words, hdr, 7 * sizeof *words);
  rs_layout_counts(src, words + 7);
  rs_layout_counts(dst, words + 12);
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
  const reshard_layout_t *sides[2] = {src, dst};
  const char *names[2] = {"source", "destination"};
  for (int s = 0; s < 2; s++) {
    const reshard_layout_t *L = sides[s];
    int at;
    RS_CHECK(first_difference(comm, f, L, L->ntensors, rs_layout_tensor_digest, deadline, &at));
    if (at >= 0) {
      const rs_tensor *t = &L->tensors[at];
      snprintf(msg, len, "ranks 0 and %d describe %s tensor %d differently (on this rank '%s', %s, %d dims; name, "
               "dtype, shape or allow_partial differ)", f, names[s], at, t->name, reshard_dtype_name(t->dtype), t->ndim);
      return RESHARD_SUCCESS;
    }
    RS_CHECK(first_difference(comm, f, L, L->nbuffers, rs_layout_buffer_digest, deadline, &at));
    if (at >= 0) {
      snprintf(msg, len, "ranks 0 and %d describe %s buffer %d differently (on this rank '%s'; its name, parts, "
               "meshes, placements, windows or raw fragments differ)", f, names[s], at, L->buffers[at].name);
      return RESHARD_SUCCESS;
    }
  }
  snprintf(msg, len, "ranks 0 and %d differ in a way not named here (mesh ids or order)", f);
  return RESHARD_SUCCESS;
}
