/* The transcript of a plan's creation: every collective reshard_plan_create
 * ran, in order, with this rank's words and the reduced ones, recorded
 * while a plan is created on a communicator that replaces ranks (UCX).
 * A staying rank keeps the plan across a rank's replacement by replaying
 * it while the newcomer creates the same plan (plan/rejoin.c): whatever
 * composite creation made the plan (relay -1's two candidates, a spread
 * or a quantizing plan's pre-plan), the newcomer runs the same
 * collectives in the same order, so one generic replay serves them all.
 *
 * Creation is one call on one thread, so the recorder is thread-local:
 * rs_plan_create starts it for the communicator it plans on, and every
 * creation collective goes through rs_create_reduce. */
#include <stdlib.h>
#include <string.h>

#include "common/error.h"
#include "common/vec.h"
#include "plan/planner.h"
#include "transport/transport.h"

static _Thread_local rs_transcript *recording;
static _Thread_local const reshard_comm_t *recording_comm;

void rs_transcript_begin(const reshard_comm_t *comm, rs_transcript *t) {
  recording = t;
  recording_comm = comm;
}

void rs_transcript_end(void) {
  recording = NULL;
  recording_comm = NULL;
}

/* A slot for an entry of n words (n contributed, then n reduced), or NULL
 * (the transcript marked broken: creation then fails on every rank). */
static rs_reduce_entry *grow(rs_transcript *t, int n) {
  if (t->broken) return NULL;
  if (RS_VEC_GROW(t->e, t->n, t->cap) ||
      rs_vec_reserve((void **)&t->words, &t->capwords, t->nwords + 2 * (size_t)n, sizeof *t->words)) {
    t->broken = 1;
    return NULL;
  }
  rs_reduce_entry *e = &t->e[t->n];
  memset(e, 0, sizeof *e);
  e->at = t->nwords;
  e->n = n;
  return e;
}

reshard_result_t rs_create_reduce(reshard_comm_t *comm, uint64_t *v, int n, int64_t deadline, int code_at,
                                  int blame_at) {
  rs_transcript *t = recording_comm == comm ? recording : NULL;
  rs_reduce_entry *e = t ? grow(t, n) : NULL;
  if (e) {
    memcpy(t->words + e->at, v, (size_t)n * sizeof *v);
    e->code_at = code_at;
    e->blame_at = blame_at;
  }
  reshard_result_t r = comm->ops->allreduce_max_u64(comm, v, n, deadline);
  if (e && !r) {
    memcpy(t->words + e->at + n, v, (size_t)n * sizeof *v);
    t->nwords += 2 * (size_t)n;
    t->n++;
  }
  return r;
}

uint32_t rs_transcript_mark_agree(const reshard_comm_t *comm, const reshard_layout_t *src,
                                  const reshard_layout_t *dst, const uint64_t *hdr) {
  rs_transcript *t = recording_comm == comm ? recording : NULL;
  if (!t || t->broken || !t->n) return 0;
  rs_reduce_entry *e = &t->e[t->n - 1];
  e->agree = 1;
  if (!(e->desc = rs_desc_keep(src, dst, hdr))) t->broken = 1;
  return (uint32_t)t->n; /* the entry's index plus one */
}

void rs_transcript_count_plan(const reshard_comm_t *comm) {
  if (recording_comm == comm && recording) recording->plans++;
}

void rs_transcript_free(rs_transcript *t) {
  if (!t) return;
  for (size_t i = 0; i < t->n; i++) rs_desc_free(t->e[i].desc);
  free(t->e);
  free(t->words);
  free(t);
}
