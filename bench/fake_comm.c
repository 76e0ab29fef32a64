/* The fake single-rank transport of fake_comm.h. */
#include "fake_comm.h"

#include <stdlib.h>

#include "reshard_internal.h"

static reshard_result_t fake_isend(reshard_comm_t *comm, int peer, uint64_t tag, const void *buf, size_t bytes,
                                   rs_request **req) {
  (void)comm, (void)peer, (void)tag, (void)buf, (void)bytes, (void)req;
  return rs_error(RESHARD_ERROR_UNSUPPORTED, "fake communicator: planning only, cannot send");
}

static reshard_result_t fake_irecv(reshard_comm_t *comm, int peer, uint64_t tag, void *buf, size_t bytes,
                                   rs_request **req) {
  (void)comm, (void)peer, (void)tag, (void)buf, (void)bytes, (void)req;
  return rs_error(RESHARD_ERROR_UNSUPPORTED, "fake communicator: planning only, cannot receive");
}

/* No request ever exists, so these are never reached with a real one. */
static reshard_result_t fake_test(reshard_comm_t *comm, rs_request *req, int *done) {
  (void)comm, (void)req;
  if (done) *done = 1;
  return rs_error(RESHARD_ERROR_UNSUPPORTED, "fake communicator: no requests");
}

static reshard_result_t fake_wait(reshard_comm_t *comm, rs_request *req, int64_t deadline_ns) {
  (void)comm, (void)req, (void)deadline_ns;
  return rs_error(RESHARD_ERROR_UNSUPPORTED, "fake communicator: no requests");
}

static void fake_cancel(reshard_comm_t *comm, rs_request *req) { (void)comm, (void)req; }

/* The other ranks agree: the maximum is this rank's own value. */
static reshard_result_t fake_allreduce_max_u64(reshard_comm_t *comm, uint64_t *vals, int n, int64_t deadline_ns) {
  (void)comm, (void)vals, (void)n, (void)deadline_ns;
  return RESHARD_SUCCESS;
}

static void fake_destroy(reshard_comm_t *comm) { (void)comm; }

static const rs_transport_ops fake_ops = {
    .name = "fake",
    .isend = fake_isend,
    .irecv = fake_irecv,
    .test = fake_test,
    .wait = fake_wait,
    .cancel = fake_cancel,
    .allreduce_max_u64 = fake_allreduce_max_u64,
    .destroy = fake_destroy,
};

static rs_transport_ops fake_replacing_ops;

reshard_result_t bench_fake_comm_create_replacing(int rank, int size, reshard_comm_t **comm) {
  RS_CHECK(bench_fake_comm_create(rank, size, comm));
  fake_replacing_ops = fake_ops;
  fake_replacing_ops.name = "fake (replacing ranks)";
  fake_replacing_ops.replaces_ranks = 1;
  (*comm)->ops = &fake_replacing_ops;
  return RESHARD_SUCCESS;
}

void bench_fake_comm_rejoined(reshard_comm_t *comm) { comm->rejoins++; }

reshard_result_t bench_fake_comm_create(int rank, int size, reshard_comm_t **comm) {
  rs_error_clear();
  if (!comm || size < 1 || rank < 0 || rank >= size)
    return rs_error(RESHARD_ERROR_INVALID_ARGUMENT, "fake communicator: rank %d of %d (or comm NULL)", rank, size);
  reshard_comm_t *c = calloc(1, sizeof *c);
  if (!c) return rs_error(RESHARD_ERROR_OUT_OF_MEMORY, "fake communicator: out of memory");
  c->ops = &fake_ops;
  c->rank = rank;
  c->size = size;
  c->impl = NULL;
  *comm = c;
  return RESHARD_SUCCESS;
}
