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
  /* Messages whose sender packs them (rs_host_packs): per send message
   * whether this rank packs it into its send staging (registered after
   * the buffers: the last entry of its table) before saying "ready"; per
   * receive message whether its sender does, and then the sender's table
   * entry of its staging and the message's offset there, read whole. */
  unsigned char *spacked, *rpacked;
  uint32_t *rentry;
  uint64_t *roff;
  /* per partner (plan->peers order): its first entry in the table */
  uint32_t *base;
  /* a registration held over a rejoin (plan->host_reg_kept): the ranks
   * that rejoin replaced (sorted), whose entries are stale */
  int32_t *replaced;
  int32_t nreplaced;
  size_t traded; /* partners it traded keys with (all but those it kept) */
} rs_host_reg;

/* Whether the sender of message m packs it (the same answer on both
 * ends: the sender's copies decide, and the receiver has them from the
 * registration): one of its boxes has short runs (under
 * RS_DIRECT_SHORT_RUN bytes) that do not make one dense span in the
 * sender's memory, so that reading them one by one would cost a read per
 * run (a transpose's rows: a system call each over shared memory, a
 * network message each over RDMA). */
#define RS_DIRECT_SHORT_RUN 16384
int rs_host_packs(const rs_copy *send_copies, uint32_t n);

/* The host executor's register_buffers (plan/executor.h). Collective over
 * the communicator: all or nothing. */
reshard_result_t rs_host_register(reshard_plan_t *p, void *const *src, size_t nsrc, void *const *dst, size_t ndst);

/* Drops the plan's registration, and one held over a rejoin (the host
 * executor's free). */
void rs_host_reg_free(reshard_plan_t *p);

/* reshard_plan_rejoin's part: the plan's registration is held (executes
 * go through staging) until every rank registers again; a staying rank
 * that passes the same buffers then keeps their registrations and trades
 * keys only with the newcomer (register.c). A registration already held
 * from an earlier rejoin is dropped. */
void rs_host_reg_hold(reshard_plan_t *p);

#endif
