/* Registered buffers (reshard_plan_register_buffers: CUDA IPC on the
 * device executor, UCX on the host executor): the descriptors of direct
 * copies, from this rank's receive copies and the senders' matching send
 * copies. Host code, no CUDA header; both executors use it. */
#ifndef RS_EXEC_DIRECT_H
#define RS_EXEC_DIRECT_H

#include <stddef.h>
#include <stdint.h>

#include "pack/copy.h"
#include "plan/plan.h"
#include "transport/stream.h"

/* What this rank tells partner `peer`: its send messages to it, in
 * order (uint64 count, then per message uint64 ncopies and the copies;
 * a forward's copies read the destination buffers, so their source index
 * is moved past the source buffers; staging offsets are relative to the
 * message). malloc'd. */
reshard_result_t rs_direct_blob(const reshard_plan_t *p, int peer, void **out, size_t *bytes);

/* Composes every receive copy with the sender's copy of the same box
 * (rs_copy_compose) into out[0, nrecv_copies): the source index is
 * base[i] + the sender's index, where sh[i] is the sender's exchange and
 * base[i] its first entry in the launch's source table. Fails (MISMATCH)
 * when a sender's messages do not match this rank's receives. */
reshard_result_t rs_direct_compose(const reshard_plan_t *p, const rs_share *sh, size_t nsh, const uint32_t *base,
                                   rs_copy *out);

/* Buffer i of a call (the sources, then the destinations; NULL past
 * what was given). */
void *rs_direct_call_buf(const reshard_plan_t *p, void *const *src, size_t nsrc, void *const *dst, size_t ndst,
                         size_t i);

/* An execute of a plan with registered buffers reg[0..nreg) (sources,
 * then destinations) must pass exactly those: its partners read them (a
 * rank falling back to staging alone would not pair with them).
 * INVALID_ARGUMENT naming the first that differs. */
reshard_result_t rs_direct_check_bufs(const reshard_plan_t *p, void *const *reg, size_t nreg, void *const *src,
                                      size_t nsrc, void *const *dst, size_t ndst);

/* The bytes of source base the copy reads: its last byte + 1 from the
 * base (run_bytes past the furthest run). */
uint64_t rs_direct_src_end(const rs_copy *c);

#endif
