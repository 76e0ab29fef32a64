/* The device executor's register_buffers (rs_device_register): maps the
 * partners' registered buffers and builds the direct copies an execute
 * with exactly those buffers runs instead of staging (direct.c). Apart
 * because it is an optional, transport-dependent path. */
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

/* reshard_plan_register_buffers on a transport that maps its peers'
 * memory: exchange with every partner this rank's buffers and its send
 * copies, compose the direct copies of every receive, upload them, and
 * agree over the communicator that every rank succeeded (all or
 * nothing: on any failure every rank keeps its previous registration). */
reshard_result_t rs_device_register(reshard_plan_t *p, void *const *src, size_t nsrc, void *const *dst, size_t ndst) {
  if (!p->comm->ops->stream_ops->share) return rs_register_unsupported(p);
  const rs_stream_ops *so = p->comm->ops->stream_ops;
  rs_dev *d = p->device;
  reshard_result_t r = RESHARD_SUCCESS;
  if (!d) return rs_error(RESHARD_ERROR_INTERNAL, "register_buffers rank %d: the plan has no device state", p->rank);
  pthread_mutex_lock(&d->mu);
  size_t np = p->npeers, nb = nsrc + ndst, nt = 0;
  rs_share *sh = calloc(np + 1, sizeof *sh);
  uint32_t *base = calloc(np + 1, sizeof *base);
  void **bufs = calloc(nb + 1, sizeof *bufs), **reg = calloc(nb + 1, sizeof *reg);
  rs_copy *hc = malloc((p->nrecv_copies + 1) * sizeof *hc);
  uint64_t *dstart = calloc((size_t)p->nrounds + 2, sizeof *dstart);
  rs_tile *ht = NULL;
  void **htab = NULL, *mapset = NULL;
  rs_copy *d_dcopies = NULL;
  rs_tile *d_dtiles = NULL;
  void **d_dtab = NULL;
  uint32_t ntab = 0;
  int unregister = 0;
  if (!sh || !base || !bufs || !reg || !hc || !dstart)
    r = rs_error(RESHARD_ERROR_OUT_OF_MEMORY, "register_buffers rank %d: out of memory", p->rank);
  else if ((r = rs_plan_refuse_if_failed(p, "register_buffers")) != RESHARD_SUCCESS)
    ;
  else if (d->dbuf)
    r = rs_error(RESHARD_ERROR_UNSUPPORTED, "register_buffers rank %d: not with RESHARD_FLAG_DOUBLE_BUFFER (yet)",
                 p->rank);
  else if (d->tab_pinned)
    r = rs_error(RESHARD_ERROR_INVALID_USAGE, "register_buffers rank %d: a CUDA graph holds an execute of this plan "
                 "and reads its registration and buffer tables as captured; create a new plan to register other "
                 "buffers", p->rank);
  else if (!src && !dst && !nsrc && !ndst)
    unregister = 1;
  else if (nsrc != (size_t)p->num_src_buffers || ndst != (size_t)p->num_dst_buffers)
    r = rs_error(RESHARD_ERROR_INVALID_ARGUMENT, "register_buffers rank %d: %zu source and %zu destination buffers "
                 "given, the layouts have %d and %d", p->rank, nsrc, ndst, p->num_src_buffers, p->num_dst_buffers);
  /* earlier executes may still read the old registration's tables */
  if (!r && !streams_idle(d, work_deadline(d) ? work_deadline(d) : rs_now_ns()))
    r = rs_error(RESHARD_ERROR_TIMEOUT, "register_buffers rank %d: the plan's last execute is not done past its "
                 "deadline", p->rank);
  for (size_t i = 0; i < nb && bufs && reg; i++) bufs[i] = reg[i] = i < nsrc ? (src ? src[i] : NULL) : (dst ? dst[i - nsrc] : NULL);
  /* the exchange runs whatever failed here, so that no partner waits for
   * this rank; a rank that failed shares no buffers */
  for (size_t i = 0; sh && i < np; i++) {
    sh[i].peer = p->peers[i].peer;
    if (!r) r = rs_direct_blob(p, sh[i].peer, (void **)&sh[i].out, &sh[i].out_bytes);
  }
  /* (unregistering is collective too, but exchanges nothing: every rank
   * passes no buffers) */
  if (!unregister) {
    reshard_result_t rs = sh ? so->share(p->comm, r ? NULL : bufs, r ? 0 : nb, sh, np, &mapset)
                             : RESHARD_ERROR_OUT_OF_MEMORY;
    if (!r) r = rs;
  }
  for (size_t i = 0; !r && !unregister && i < np; i++) base[i] = ntab, ntab += (uint32_t)sh[i].nbufs;
  if (!r && !unregister) r = rs_direct_compose(p, sh, np, base, hc);
  if (!r && !unregister) {
    nt = count_dir(p->recvs, p->nrecvs, p->recv_round, p->nrounds, hc, dstart, NULL, 0);
    ht = malloc((nt + 1) * sizeof *ht);
    htab = calloc((size_t)ntab + ndst + 1, sizeof *htab);
    if (!ht || !htab) r = rs_error(RESHARD_ERROR_OUT_OF_MEMORY, "register_buffers rank %d: out of memory", p->rank);
  }
  if (!r && !unregister) {
    build_dir(p->recvs, p->nrecvs, p->recv_round, hc, 0, dstart, ht);
    for (size_t i = 0; i < np; i++)
      for (size_t b = 0; b < sh[i].nbufs; b++) htab[base[i] + b] = sh[i].bufs[b];
    for (size_t b = 0; b < ndst; b++) htab[ntab + b] = dst ? dst[b] : NULL;
    cudaStream_t s = d->s[S_PACK];
    CU(cudaMallocAsync((void **)&d_dcopies, (p->nrecv_copies + 1) * sizeof *hc, s), "cudaMallocAsync(direct copies)");
    CU(cudaMallocAsync((void **)&d_dtiles, (nt + 1) * sizeof *ht, s), "cudaMallocAsync(direct tiles)");
    CU(cudaMallocAsync((void **)&d_dtab, ((size_t)ntab + ndst + 1) * sizeof *htab, s), "cudaMallocAsync(direct table)");
    CU(cudaMemcpyAsync(d_dcopies, hc, p->nrecv_copies * sizeof *hc, cudaMemcpyHostToDevice, s), "cudaMemcpyAsync");
    CU(cudaMemcpyAsync(d_dtiles, ht, nt * sizeof *ht, cudaMemcpyHostToDevice, s), "cudaMemcpyAsync");
    CU(cudaMemcpyAsync(d_dtab, htab, ((size_t)ntab + ndst) * sizeof *htab, cudaMemcpyHostToDevice, s),
       "cudaMemcpyAsync");
    cudaError_t q = poll_done(s, NULL, rs_deadline_after_ms(p->opts.timeout_ms));
    if (q == cudaErrorNotReady)
      r = rs_error(RESHARD_ERROR_TIMEOUT, "register_buffers rank %d: the upload did not finish before the deadline",
                   p->rank);
    else
      CU(q, "cudaStreamQuery(direct upload)");
  }
fail:;
  /* every rank succeeded, or none keeps the new registration */
  uint64_t bad = r != RESHARD_SUCCESS;
  reshard_result_t ra = p->comm->ops->allreduce_max_u64(p->comm, &bad, 1, rs_deadline_after_ms(p->opts.timeout_ms));
  if (!r && ra) r = ra;
  else if (!r && bad)
    r = rs_error(RESHARD_ERROR_REMOTE, "register_buffers rank %d: another rank failed to register its buffers; "
                 "the previous registration stays", p->rank);
  if (!r) {
    /* the new registration in, the old one out (its work is done) */
    if (d->d_dcopies) cudaFreeAsync(d->d_dcopies, d->s[S_PACK]);
    if (d->d_dtiles) cudaFreeAsync(d->d_dtiles, d->s[S_PACK]);
    if (d->d_dtab) cudaFreeAsync(d->d_dtab, d->s[S_PACK]);
    if (d->mapset) so->unshare(p->comm, d->mapset);
    free(d->reg);
    free(d->dstart);
    d->d_dcopies = d_dcopies, d->d_dtiles = d_dtiles, d->d_dtab = d_dtab, d->mapset = mapset;
    d->reg = unregister ? NULL : reg, d->nreg = unregister ? 0 : nb, d->dstart = dstart, d->dtab_dst = ntab;
    if (!unregister) reg = NULL;
    dstart = NULL, mapset = NULL;
  } else {
    if (d_dcopies) cudaFreeAsync(d_dcopies, d->s[S_PACK]);
    if (d_dtiles) cudaFreeAsync(d_dtiles, d->s[S_PACK]);
    if (d_dtab) cudaFreeAsync(d_dtab, d->s[S_PACK]);
    if (mapset) so->unshare(p->comm, mapset);
  }
  for (size_t i = 0; sh && i < np; i++) {
    free((void *)sh[i].out);
    free(sh[i].in);
    free(sh[i].bufs);
  }
  free(sh);
  free(base);
  free(bufs);
  free(reg);
  free(hc);
  free(dstart);
  free(ht);
  free(htab);
  pthread_mutex_unlock(&d->mu);
  return r;
}
