/* The buffer-table ring of the device executor: which slot holds a call's
 * buffer addresses, and the upload of a new table when they change. Apart
 * from the execute path because the ring's reuse rules (pinned slots of
 * captured executes, valid slots) are a concept of their own. */
#include <cuda_runtime.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/clock.h"
#include "common/debug.h"
#include "common/error.h"
#include "transport/dev_comm.h"
#include "device/device.h"
#include "device/device_internal.h"
#include "exec/direct.h"
#include "kernels/rs_kernels.h"
#include "exec/exec_state.h"
#include "exec/schedule.h"
#include "plan/quant.h"
#include "transport/stream.h"

/* Whether table slot `slot` holds the call's buffers. */
static int table_holds(const reshard_plan_t *p, const rs_dev *d, int slot, void *const *src, size_t nsrc,
                       void *const *dst, size_t ndst) {
  if (!(d->tab_valid >> slot & 1)) return 0;
  for (size_t i = 0; i < d->ntab; i++)
    if (d->h_tab[slot][i] != rs_direct_call_buf(p, src, nsrc, dst, ndst, i)) return 0;
  return 1;
}

/* Whether the call's buffers differ from those of the table in use. */
int table_changed(const reshard_plan_t *p, const rs_dev *d, void *const *src, size_t nsrc, void *const *dst,
                  size_t ndst) {
  return !table_holds(p, d, d->tab_cur, src, nsrc, dst, ndst);
}

/* The call's buffers become the table in use (d->tab_cur): a slot that
 * holds them already serves as it is (buffers that alternate, or those
 * of a graph); else they go into the next slot no captured execute reads
 * (tab_pinned). That slot's pinned table may still feed an upload
 * RS_TAB_SLOTS executes back: the only host wait an execute can make,
 * and only when buffer addresses keep changing faster than the GPU runs.
 * The device table of the slot is overwritten in stream order, after
 * every earlier execute of the plan (enqueue's waits). */
/* The slot for the call's buffers (switch_table), *held when it holds
 * them already; -1 when every slot is a graph's. */
static int table_slot(const reshard_plan_t *p, const rs_dev *d, void *const *src, size_t nsrc, void *const *dst,
                      size_t ndst, int *held) {
  *held = 1;
  for (int k = 0; k < RS_TAB_SLOTS; k++)
    if (table_holds(p, d, k, src, nsrc, dst, ndst)) return k;
  *held = 0;
  if (!d->tab_valid) return 0;
  for (int k = 1; k <= RS_TAB_SLOTS; k++) {
    int cand = (d->tab_cur + k) % RS_TAB_SLOTS;
    if (!(d->tab_pinned >> cand & 1)) return cand;
  }
  return -1;
}

reshard_result_t switch_table(const reshard_plan_t *p, rs_dev *d, void *const *src, size_t nsrc,
                              void *const *dst, size_t ndst, int64_t deadline) {
  int held, slot = table_slot(p, d, src, nsrc, dst, ndst, &held);
  if (slot < 0) /* (its partners may have queued their half: the plan fails) */
    return rs_error(RESHARD_ERROR_INVALID_USAGE, "execute rank %d: every one of the plan's %d buffer tables is read "
                    "by a CUDA graph holding an execute of it: executes with other buffers than those need a new "
                    "plan", p->rank, RS_TAB_SLOTS);
  if (held) {
    d->tab_cur = slot;
    return RESHARD_SUCCESS;
  }
  cudaError_t q = poll_done(NULL, d->tab_ev[slot], deadline);
  if (q == cudaErrorNotReady)
    return rs_error(RESHARD_ERROR_TIMEOUT, "execute rank %d: the buffer table of the execute %d calls back "
                    "(addresses changed on each) is still in use past the deadline: earlier executes are not "
                    "finishing", p->rank, RS_TAB_SLOTS);
  if (q) return rs_cuda_error(q, "cudaEventQuery(buffer table)", p->rank);
  void **h = d->h_tab[slot];
  for (size_t i = 0; i < d->ntab; i++) h[i] = rs_direct_call_buf(p, src, nsrc, dst, ndst, i);
  cudaError_t ce = cudaMemcpyAsync(d->d_tab[slot], h, d->ntab * sizeof(void *), cudaMemcpyHostToDevice, d->s[S_PACK]);
  if (!ce) ce = cudaEventRecord(d->tab_ev[slot], d->s[S_PACK]);
  if (ce) return rs_cuda_error(ce, "buffer table upload", p->rank);
  d->tab_cur = slot;
  d->tab_valid |= 1u << slot;
  return RESHARD_SUCCESS;
}
