/* A rank that dies mid-transfer, for the fault tests of the host
 * transports (tests/mpi/test_mpi_faults.c, tests/ucx/test_ucx_reshard.c):
 * dying_send_install wraps a communicator's transport (a copy of its ops
 * table whose isend and isend_boxes count their calls) so that this
 * process _exit(0)s on its nth send, without a word to its peers. One
 * communicator per process; each test program includes this once. */
#ifndef RS_TESTS_DYING_SEND_H
#define RS_TESTS_DYING_SEND_H

#include <stdio.h>
#include <unistd.h>

#include "transport/transport.h"

static const rs_transport_ops *dying_real_ops;
static int dying_nth = -1, dying_sends;

static void dying_count(void) {
  if (dying_nth >= 0 && ++dying_sends == dying_nth) {
    printf("EXIT: _exit(0) on send %d, mid-transfer\n", dying_sends);
    fflush(stdout);
    _exit(0);
  }
}

static reshard_result_t dying_isend(reshard_comm_t *c, int peer, uint64_t tag, const void *buf, size_t bytes,
                                    rs_request **req) {
  dying_count();
  return dying_real_ops->isend(c, peer, tag, buf, bytes, req);
}

static reshard_result_t dying_isend_boxes(reshard_comm_t *c, int peer, uint64_t tag, const struct rs_copy *copies,
                                          uint32_t n, void *const *bases, size_t bytes, rs_request **req) {
  dying_count();
  return dying_real_ops->isend_boxes(c, peer, tag, copies, n, bases, bytes, req);
}

/* nth < 0: the sends are only counted (the survivors' side). */
static void dying_send_install(reshard_comm_t *comm, int nth) {
  static rs_transport_ops dying;
  dying_real_ops = comm->ops;
  dying = *dying_real_ops;
  dying.isend = dying_isend;
  if (dying_real_ops->isend_boxes) dying.isend_boxes = dying_isend_boxes;
  comm->ops = &dying;
  dying_nth = nth;
}

#endif
