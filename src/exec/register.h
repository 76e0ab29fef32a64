/* The host executor's registered buffers (reshard_plan_register_buffers
 * on a host transport with one-sided reads, the rma_* operations of
 * transport.h: UCX). A registered execute reads each box straight from
 * its sender's buffer into this rank's (exec/execute.c, direct_round):
 * no staging, no pack or unpack. */
#ifndef RS_EXEC_REGISTER_H
#define RS_EXEC_REGISTER_H

#include <stddef.h>

#include "pack/copy.h"
#include "plan/plan.h"

typedef struct rs_host_reg {
  void **bufs; /* the registered pointers: sources, then destinations */
  size_t nbufs;
  /* per receive copy (parallel to plan->recv_copies): the box read
   * straight from the sender's buffer, its src_buf the transport's table
   * entry (rma_share) */
  rs_copy *copies;
  void *set; /* the transport's (rma_share .. rma_unshare) */
} rs_host_reg;

/* The host executor's register_buffers (plan/executor.h). Collective over
 * the communicator: all or nothing. */
reshard_result_t rs_host_register(reshard_plan_t *p, void *const *src, size_t nsrc, void *const *dst, size_t ndst);

/* Drops the plan's registration (the host executor's free). */
void rs_host_reg_free(reshard_plan_t *p);

#endif
