#include "support/fault_comm.h"

#include "exec/exec_state.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "common/error.h"
#include "transport/transport.h"

static const rs_transport_ops *g_inner;
static rs_transport_ops g_wrapped;
static tf_fault *g_fault;
static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;

static reshard_result_t tf_isend(reshard_comm_t *comm, int peer, uint64_t tag, const void *buf, size_t bytes,
                                 rs_request **req) {
  pthread_mutex_lock(&g_lock);
  tf_fault *f = g_fault;
  pthread_mutex_unlock(&g_lock);
  /* data messages only: the agreement's control messages (headers,
   * statuses) are not what these faults are about */
  if (!f || comm->rank != f->rank || f->kind == TF_NONE || (tag & RS_TAG_CONTROL) || bytes < f->min_bytes ||
      f->fired || f->seen++ != f->nth)
    return g_inner->isend(comm, peer, tag, buf, bytes, req);
  f->fired = 1;
  if (f->kind == TF_FAIL_SEND)
    return rs_error(RESHARD_ERROR_BACKEND, "fault_comm: rank %d: injected failure of a %zu-byte send to rank %d",
                    comm->rank, bytes, peer);
  /* the caller's buffer stays intact: corrupt a copy (sends are eager) */
  unsigned char *copy = malloc(bytes);
  if (!copy) return rs_error(RESHARD_ERROR_OUT_OF_MEMORY, "fault_comm: out of memory");
  memcpy(copy, buf, bytes);
  if (f->kind == TF_FLIP_BYTE) {
    copy[bytes / 2] ^= 0x10;
  } else {
    unsigned char t[4];
    memcpy(t, copy, 4);
    memcpy(copy, copy + 4, 4);
    memcpy(copy + 4, t, 4);
  }
  reshard_result_t r = g_inner->isend(comm, peer, tag, copy, bytes, req);
  free(copy);
  return r;
}

static void tf_tables(reshard_comm_t *comm) {
  pthread_mutex_lock(&g_lock);
  if (!g_inner) {
    g_inner = comm->ops;
    g_wrapped = *comm->ops;
    g_wrapped.isend = tf_isend;
  }
  pthread_mutex_unlock(&g_lock);
}

void tf_install(reshard_comm_t *comm, tf_fault *f) {
  tf_tables(comm);
  pthread_mutex_lock(&g_lock);
  g_fault = f;
  pthread_mutex_unlock(&g_lock);
  comm->ops = &g_wrapped;
}
