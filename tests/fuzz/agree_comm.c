/* The recording and replaying communicator of agree_comm.h. */
#include "agree_comm.h"

#include <stdlib.h>
#include <string.h>

#include "common/error.h"
#include "transport/transport.h"

_Static_assert(FZ_AGREE_MAX_VALS >= RS_AGREE_MAX_WORDS, "the fuzz communicator must take every agreement");

static reshard_result_t no_isend(reshard_comm_t *c, int peer, uint64_t tag, const void *buf, size_t bytes,
                                 rs_request **req) {
  (void)c, (void)peer, (void)tag, (void)buf, (void)bytes, (void)req;
  return rs_error(RESHARD_ERROR_UNSUPPORTED, "agreement replay communicator: planning only, cannot send");
}

static reshard_result_t no_irecv(reshard_comm_t *c, int peer, uint64_t tag, void *buf, size_t bytes,
                                 rs_request **req) {
  (void)c, (void)peer, (void)tag, (void)buf, (void)bytes, (void)req;
  return rs_error(RESHARD_ERROR_UNSUPPORTED, "agreement replay communicator: planning only, cannot receive");
}

static reshard_result_t no_test(reshard_comm_t *c, rs_request *req, int *done) {
  (void)c, (void)req;
  if (done) *done = 1;
  return rs_error(RESHARD_ERROR_UNSUPPORTED, "agreement replay communicator: no requests");
}

static reshard_result_t no_wait(reshard_comm_t *c, rs_request *req, int64_t deadline_ns) {
  (void)c, (void)req, (void)deadline_ns;
  return rs_error(RESHARD_ERROR_UNSUPPORTED, "agreement replay communicator: no requests");
}

static void no_cancel(reshard_comm_t *c, rs_request *req) { (void)c, (void)req; }

static reshard_result_t agree_max(reshard_comm_t *c, uint64_t *vals, int n, int64_t deadline_ns) {
  (void)deadline_ns;
  fz_agree_world *w = c->impl;
  int k = w->calls[c->rank]++;
  if (k >= FZ_AGREE_MAX_CALLS || n > FZ_AGREE_MAX_VALS || n < 0)
    return rs_error(RESHARD_ERROR_INTERNAL, "agreement replay communicator: call %d of %d values is beyond its table", k, n);
  if (n > w->rec_nvals[k]) w->rec_nvals[k] = n;
  for (int i = 0; i < n; i++)
    if (vals[i] > w->rec[k][i]) w->rec[k][i] = vals[i];
  if (w->replay)
    for (int i = 0; i < n; i++)
      if (w->max[k][i] > vals[i]) vals[i] = w->max[k][i];
  return RESHARD_SUCCESS;
}

static void agree_destroy(reshard_comm_t *c) { (void)c; }

static const rs_transport_ops agree_ops = {
    .name = "agreement-replay",
    .isend = no_isend,
    .irecv = no_irecv,
    .test = no_test,
    .wait = no_wait,
    .cancel = no_cancel,
    .allreduce_max_u64 = agree_max,
    .destroy = agree_destroy,
};

void fz_agree_init(fz_agree_world *w, int size) {
  memset(w, 0, sizeof *w);
  w->size = size;
}

void fz_agree_replay(fz_agree_world *w) {
  w->replay = 1;
  memset(w->calls, 0, sizeof w->calls);
  memcpy(w->max, w->rec, sizeof w->max);
  memcpy(w->nvals, w->rec_nvals, sizeof w->nvals);
  memset(w->rec, 0, sizeof w->rec);
  memset(w->rec_nvals, 0, sizeof w->rec_nvals);
}

int fz_agree_settled(const fz_agree_world *w) {
  return w->replay && !memcmp(w->max, w->rec, sizeof w->max) && !memcmp(w->nvals, w->rec_nvals, sizeof w->nvals);
}

reshard_result_t fz_agree_comm_create(fz_agree_world *w, int rank, reshard_comm_t **comm) {
  rs_error_clear();
  if (!w || !comm || w->size < 1 || w->size > FZ_AGREE_MAX_RANKS || rank < 0 || rank >= w->size)
    return rs_error(RESHARD_ERROR_INVALID_ARGUMENT, "agreement replay communicator: rank %d of %d", rank, w ? w->size : 0);
  reshard_comm_t *c = calloc(1, sizeof *c);
  if (!c) return rs_error(RESHARD_ERROR_OUT_OF_MEMORY, "agreement replay communicator: out of memory");
  c->ops = &agree_ops;
  c->rank = rank;
  c->size = w->size;
  c->impl = w;
  *comm = c;
  return RESHARD_SUCCESS;
}
