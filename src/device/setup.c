/* The device executor's per-plan state made and unmade: dev_setup (the
 * descriptors, tiles, streams, events, buffer tables, agreement and verify
 * state of a plan, built in named steps while the plan is created, through
 * device_prepare_local) and dev_free / device_free. Apart from the execute
 * path so that what a plan owns on the device is read in one place. */
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

static void dev_free(const reshard_plan_t *p, rs_dev *d) {
  if (!d) return;
  const rs_stream_ops *so = p->comm->ops->stream_ops;
  if (d->gate_listed) rs_dev_comm_gate_remove(p->comm, d->d_agree);
  /* Work of earlier executes may still read the descriptors and staging:
   * wait for it until the last execute's deadline. Past it the peers are
   * not coming: poison the communicator (NCCL ends its work) and give the
   * GPU one more timeout to let go. If even then it does not, the device
   * memory is left allocated rather than freed under running work. */
  int idle = streams_idle(d, work_deadline(d) ? work_deadline(d) : rs_now_ns());
  if (!idle) {
    RS_LOG(RS_LOG_WARN, RS_SUBSYS_EXEC, "rank %d: plan destroyed while its last execute is not done past its "
           "deadline: poisoning the communicator", p->rank);
    so->poison(p->comm);
    idle = streams_idle(d, rs_deadline_after_ms(p->opts.timeout_ms > 0 ? p->opts.timeout_ms : 60000));
  }
  if (!idle) {
    RS_LOG(RS_LOG_WARN, RS_SUBSYS_EXEC, "rank %d: the GPU still runs the plan's work after the communicator's "
           "abort: its device memory and the staging pool are not freed", p->rank);
    if (d->pool_held) rs_dev_comm_staging_release(p->comm, 1);
    for (int i = 0; i < 2; i++) /* memory others own that the work uses stays too */
      if (p->stuck_out[i]) *p->stuck_out[i] = 1;
    return;
  }
  /* Stream-ordered allocations go back the same way (they exist only if
   * the pack stream does); the streams are idle, and a stream destroyed
   * with work pending releases it when the work is done. */
  if (d->s[S_PACK]) {
    if (d->d_copies) cudaFreeAsync(d->d_copies, d->s[S_PACK]);
    if (d->d_tiles) cudaFreeAsync(d->d_tiles, d->s[S_PACK]);
    for (int i = 0; i < RS_TAB_SLOTS; i++)
      if (d->d_tab[i]) cudaFreeAsync(d->d_tab[i], d->s[S_PACK]);
    if (d->d_hdr_out) cudaFreeAsync(d->d_hdr_out, d->s[S_PACK]);
    if (d->d_hdr_in) cudaFreeAsync(d->d_hdr_in, d->s[S_PACK]);
    if (d->d_agree) cudaFreeAsync(d->d_agree, d->s[S_PACK]);
    if (d->d_word) cudaFreeAsync(d->d_word, d->s[S_PACK]);
    if (d->d_cur) cudaFreeAsync(d->d_cur, d->s[S_PACK]);
    if (d->d_dcopies) cudaFreeAsync(d->d_dcopies, d->s[S_PACK]);
    if (d->d_dtiles) cudaFreeAsync(d->d_dtiles, d->s[S_PACK]);
    if (d->d_dtab) cudaFreeAsync(d->d_dtab, d->s[S_PACK]);
    if (d->d_vbox) cudaFreeAsync(d->d_vbox, d->s[S_PACK]);
    if (d->d_vtensors) cudaFreeAsync(d->d_vtensors, d->s[S_PACK]);
    if (d->d_rmine) cudaFreeAsync(d->d_rmine, d->s[S_PACK]);
    if (d->d_lsrc) cudaFreeAsync(d->d_lsrc, d->s[S_PACK]);
    if (d->d_ldst) cudaFreeAsync(d->d_ldst, d->s[S_PACK]);
    if (d->d_commit) cudaFreeAsync(d->d_commit, d->s[S_PACK]);
  }
  for (int i = 0; i < S_COUNT; i++)
    if (d->s[i]) cudaStreamDestroy(d->s[i]);
  cudaEvent_t *evs[] = DEV_EVENTS(d);
  for (size_t i = 0; i < sizeof evs / sizeof evs[0]; i++)
    if (*evs[i]) cudaEventDestroy(*evs[i]);
  if (d->pool_held) rs_dev_comm_staging_release(p->comm, 0);
  for (int i = 0; i < RS_TAB_SLOTS; i++)
    if (d->h_tab[i]) cudaFreeHost(d->h_tab[i]);
  if (d->h_agree) cudaFreeHost(d->h_agree);
  if (d->h_commit) cudaFreeHost(d->h_commit);
  free(d->hdr_p2p);
  if (d->mapset) so->unshare(p->comm, d->mapset);
  free(d->reg);
  free(d->dstart);
  free(d->pack_start);
  free(d->fpack_start);
  free(d->unpack_start);
  free(d->xfers);
  free(d->p2p);
  pthread_mutex_destroy(&d->mu);
  free(d);
}

void device_free(reshard_plan_t *p) {
  dev_free(p, p->device);
  p->device = NULL;
}

/* Tiles of one direction, round by round; start[k] is round k's first,
 * and fstart[k] (where not NULL) the first of its relay forwards, which
 * are a round's last messages (plan/chunk.c; start[k + 1] without any).
 * A direction's round array covers only its own rounds (its last
 * message's round + 1), which may be fewer than the plan's. */
int dir_rounds(const rs_msg *m, size_t n) { return n ? m[n - 1].round + 1 : 0; }

uint64_t count_dir(const rs_msg *m, size_t n, const size_t *round, int nr, const rs_copy *copies,
                   uint64_t *start, uint64_t *fstart, uint64_t base) {
  uint64_t t = base;
  int dr = dir_rounds(m, n);
  for (int k = 0; k < nr; k++) {
    start[k] = t;
    if (fstart) fstart[k] = UINT64_MAX;
    if (k < dr)
      for (size_t i = round[k]; i < round[k + 1]; i++) {
        if (fstart && m[i].fwd && fstart[k] == UINT64_MAX) fstart[k] = t;
        t += rs_tiles_count(copies + m[i].first_copy, m[i].ncopies, RS_TILE_BYTES);
      }
    if (fstart && fstart[k] == UINT64_MAX) fstart[k] = t;
  }
  start[nr] = t;
  return t;
}

void build_dir(const rs_msg *m, size_t n, const size_t *round, const rs_copy *copies, uint32_t desc_base,
               const uint64_t *start, rs_tile *tiles) {
  int dr = dir_rounds(m, n);
  for (int k = 0; k < dr; k++) {
    rs_tile *out = tiles + start[k];
    for (size_t i = round[k]; i < round[k + 1]; i++) {
      const rs_copy *c = copies + m[i].first_copy;
      rs_tiles_build(c, m[i].ncopies, desc_base + m[i].first_copy, RS_TILE_BYTES, out);
      out += rs_tiles_count(c, m[i].ncopies, RS_TILE_BYTES);
    }
  }
}

/* dev_setup, step 1: the rounds' start arrays and one round's transfers
 * allocated, and *hc the plan's descriptors (send | recv | local), a
 * relay forward's reading the destination buffers. */
static reshard_result_t setup_descriptors(const reshard_plan_t *p, rs_dev *d, rs_copy **hcp, size_t *ncopp) {
  reshard_result_t r = RESHARD_SUCCESS;
  int nr = p->nrounds;
  d->pack_start = calloc((size_t)nr + 1, sizeof *d->pack_start);
  d->fpack_start = calloc((size_t)nr + 1, sizeof *d->fpack_start);
  d->unpack_start = calloc((size_t)nr + 1, sizeof *d->unpack_start);
  d->verify = (p->opts.flags & RESHARD_FLAG_VERIFY) != 0;
  /* verify: each message is followed by its sums */
  d->p2p = calloc(rs_sched_max_xfers(p, d->verify), sizeof *d->p2p);
  d->xfers = calloc(rs_sched_max_xfers(p, d->verify), sizeof *d->xfers);
  size_t ncop = p->nsend_copies + p->nrecv_copies + p->nlocal_copies;
  rs_copy *hc = *hcp = malloc((ncop ? ncop : 1) * sizeof *hc);
  *ncopp = ncop;
  if (!d->pack_start || !d->fpack_start || !d->unpack_start || !d->xfers || !d->p2p || !hc) {
    r = rs_error(RESHARD_ERROR_OUT_OF_MEMORY, "execute rank %d: out of memory", p->rank);
    goto fail;
  }
  if (ncop > UINT32_MAX) {
    r = rs_error(RESHARD_ERROR_UNSUPPORTED, "execute rank %d: %zu descriptors exceed the kernels' 32-bit index", p->rank, ncop);
    goto fail;
  }
  /* (empty arrays may be NULL: no memcpy from them) */
  if (p->nsend_copies) memcpy(hc, p->send_copies, p->nsend_copies * sizeof *hc);
  if (p->nrecv_copies) memcpy(hc + p->nsend_copies, p->recv_copies, p->nrecv_copies * sizeof *hc);
  if (p->nlocal_copies)
    memcpy(hc + p->nsend_copies + p->nrecv_copies, p->local_copies, p->nlocal_copies * sizeof *hc);
  /* A relay forward's copies read this rank's destination buffers: on the
   * device their source index points past the source buffers into the
   * one table (source buffers, then destination buffers) that every
   * launch gets as its source table. Its round's forwards' pack (FPACK)
   * waits for the unpack that wrote the data (exec/schedule.h). */
  for (size_t i = 0; i < p->nsends; i++) {
    if (!p->sends[i].fwd) continue;
    for (uint32_t k = 0; k < p->sends[i].ncopies; k++) {
      rs_copy *c = &hc[p->sends[i].first_copy + k];
      if (c->src_buf != RS_BUF_STAGING) c->src_buf += p->num_src_buffers;
    }
  }
  return RESHARD_SUCCESS;
fail:
  return r;
}

/* dev_setup, step 2: the tiles of every round and of the local copies
 * (*htp, *ntp tiles), their start indices in d. */
static reshard_result_t setup_tiles(const reshard_plan_t *p, rs_dev *d, rs_tile **htp, uint64_t *ntp) {
  reshard_result_t r = RESHARD_SUCCESS;
  int nr = p->nrounds;
  /* Rounds are numbered per direction from 0; a direction with fewer
   * rounds simply has empty later ones. */
  uint64_t nt = count_dir(p->sends, p->nsends, p->send_round, nr, p->send_copies, d->pack_start, d->fpack_start, 0);
  nt = count_dir(p->recvs, p->nrecvs, p->recv_round, nr, p->recv_copies, d->unpack_start, NULL, nt);
  d->local_start = nt;
  nt += rs_tiles_count(p->local_copies, p->nlocal_copies, RS_TILE_BYTES);
  d->local_end = nt;
  rs_tile *ht = *htp = malloc((nt ? nt : 1) * sizeof *ht);
  *ntp = nt;
  if (!ht) {
    r = rs_error(RESHARD_ERROR_OUT_OF_MEMORY, "execute rank %d: out of memory for %llu tiles", p->rank, (unsigned long long)nt);
    goto fail;
  }
  build_dir(p->sends, p->nsends, p->send_round, p->send_copies, 0, d->pack_start, ht);
  build_dir(p->recvs, p->nrecvs, p->recv_round, p->recv_copies, (uint32_t)p->nsend_copies, d->unpack_start, ht);
  rs_tiles_build(p->local_copies, p->nlocal_copies, (uint32_t)(p->nsend_copies + p->nrecv_copies),
                 RS_TILE_BYTES, ht + d->local_start);
  return RESHARD_SUCCESS;
fail:
  return r;
}

/* dev_setup, step 3: the streams, the events, the device descriptors and
 * tiles, and the ring of buffer tables. */
static reshard_result_t setup_streams(const reshard_plan_t *p, rs_dev *d, size_t ncop, uint64_t nt) {
  reshard_result_t r = RESHARD_SUCCESS;
  for (int i = 0; i < S_COUNT; i++)
    CU(cudaStreamCreateWithFlags(&d->s[i], cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
  cudaEvent_t *evs[] = DEV_EVENTS(d);
  for (size_t i = 0; i < sizeof evs / sizeof evs[0]; i++)
    CU(cudaEventCreateWithFlags(evs[i], cudaEventDisableTiming), "cudaEventCreateWithFlags");

  CU(cudaMallocAsync((void **)&d->d_copies, (ncop ? ncop : 1) * sizeof(rs_copy), d->s[S_PACK]), "cudaMallocAsync(descriptors)");
  CU(cudaMallocAsync((void **)&d->d_tiles, (nt ? nt : 1) * sizeof(rs_tile), d->s[S_PACK]), "cudaMallocAsync(tiles)");
  d->dbuf = (p->opts.flags & RESHARD_FLAG_DOUBLE_BUFFER) != 0;
  d->nview = (size_t)p->num_src_buffers + (size_t)p->num_dst_buffers;
  d->ntab = d->nview + (d->dbuf ? (size_t)p->num_dst_buffers : 0);
  for (int i = 0; i < RS_TAB_SLOTS; i++) {
    CU(cudaMallocAsync((void **)&d->d_tab[i], (d->ntab ? d->ntab : 1) * sizeof(void *), d->s[S_PACK]),
       "cudaMallocAsync(buffer table)");
    CU(cudaMallocHost((void **)&d->h_tab[i], (d->ntab ? d->ntab : 1) * sizeof(void *)), "cudaMallocHost(buffer table)");
  }
  return RESHARD_SUCCESS;
fail:
  return r;
}

/* dev_setup, step 4: the agreement's headers and verdict, and (double
 * buffering) the commit record. */
static reshard_result_t setup_agreement(const reshard_plan_t *p, rs_dev *d) {
  reshard_result_t r = RESHARD_SUCCESS;
  /* The agreement: with the partners; in relay plans also with every rank
   * (forwarded data comes from ranks this one swaps no header with), so
   * there every rank takes part, partners or not. */
  d->global = p->opts.relay == 1 || p->relay_chosen || (p->opts.flags & RS_FLAG_GLOBAL_VERDICT);
  /* A double-buffered plan's commit reduces every rank's verdict: every
   * rank has one, partners or not. */
  if (p->npeers || d->global || d->dbuf || d->verify) {
    size_t np = p->npeers;
    d->hdr_p2p = calloc(2 * np + 1, sizeof *d->hdr_p2p);
    if (!d->hdr_p2p) {
      r = rs_error(RESHARD_ERROR_OUT_OF_MEMORY, "execute rank %d: out of memory", p->rank);
      goto fail;
    }
    CU(cudaMallocAsync((void **)&d->d_hdr_out, sizeof(rs_dev_hdr), d->s[S_PACK]), "cudaMallocAsync(agreement)");
    CU(cudaMallocAsync((void **)&d->d_hdr_in, (np ? np : 1) * sizeof(rs_dev_hdr), d->s[S_PACK]),
       "cudaMallocAsync(agreement)");
    if (d->global || d->dbuf)
      CU(cudaMallocAsync((void **)&d->d_word, RS_COMMIT_WORDS * sizeof(uint64_t), d->s[S_PACK]),
         "cudaMallocAsync(agreement)");
    CU(cudaMallocAsync((void **)&d->d_agree, sizeof(rs_dev_agree), d->s[S_PACK]), "cudaMallocAsync(agreement)");
    /* closed by the communicator before it aborts (dev_comm.h) */
    RS_CHECK_GOTO(rs_dev_comm_gate_add(p->comm, d->d_agree), r, fail);
    d->gate_listed = 1;
    CU(cudaMallocHost((void **)&d->h_agree, sizeof(rs_dev_agree)), "cudaMallocHost(agreement)");
    memset(d->h_agree, 0, sizeof *d->h_agree);
    d->h_agree->ok = 1;
    d->h_agree->staging_ok = 1;
    /* pinned: copied when the stream gets there, before the wait below */
    CU(cudaMemcpyAsync(d->d_agree, d->h_agree, sizeof *d->h_agree, cudaMemcpyHostToDevice, d->s[S_PACK]),
       "cudaMemcpyAsync(agreement)");
    for (size_t i = 0; i < np; i++) {
      d->hdr_p2p[2 * i] = (rs_p2p){p->peers[i].peer, 1, d->d_hdr_in + i, sizeof(rs_dev_hdr)};
      d->hdr_p2p[2 * i + 1] = (rs_p2p){p->peers[i].peer, 0, d->d_hdr_out, sizeof(rs_dev_hdr)};
    }
  }
  if (d->dbuf) {
    CU(cudaMallocAsync((void **)&d->d_cur, (d->nview ? d->nview : 1) * sizeof(void *), d->s[S_PACK]),
       "cudaMallocAsync(double-buffer table)");
    CU(cudaMallocAsync((void **)&d->d_commit, sizeof(rs_dev_commit), d->s[S_PACK]), "cudaMallocAsync(commit)");
    CU(cudaMallocHost((void **)&d->h_commit, sizeof(rs_dev_commit)), "cudaMallocHost(commit)");
    memset(d->h_commit, 0, sizeof *d->h_commit);
    d->h_commit->active = -1;
    CU(cudaMemcpyAsync(d->d_commit, d->h_commit, sizeof *d->h_commit, cudaMemcpyHostToDevice, d->s[S_PACK]),
       "cudaMemcpyAsync(commit)");
  }
  return RESHARD_SUCCESS;
fail:
  return r;
}

/* dev_setup, step 5: the descriptors and tiles uploaded, polled until
 * done (their pageable sources are freed after). */
static reshard_result_t setup_upload(const reshard_plan_t *p, rs_dev *d, const rs_copy *hc, size_t ncop,
                                     const rs_tile *ht, uint64_t nt) {
  reshard_result_t r = RESHARD_SUCCESS;
  CU(cudaMemcpyAsync(d->d_copies, hc, ncop * sizeof *hc, cudaMemcpyHostToDevice, d->s[S_PACK]), "cudaMemcpyAsync(descriptors)");
  CU(cudaMemcpyAsync(d->d_tiles, ht, nt * sizeof *ht, cudaMemcpyHostToDevice, d->s[S_PACK]), "cudaMemcpyAsync(tiles)");
  /* The pageable upload must finish before its source is freed: polled
   * (reshard's own stream only, never the caller's) until the deadline. */
  {
    cudaError_t q = poll_done(d->s[S_PACK], NULL, rs_deadline_after_ms(p->opts.timeout_ms));
    if (q == cudaErrorNotReady) {
      r = rs_error(RESHARD_ERROR_TIMEOUT, "rank %d: the upload of the plan's descriptors did not finish before the "
                   "deadline", p->rank);
      goto fail;
    }
    CU(q, "cudaStreamQuery(upload)");
  }
  return RESHARD_SUCCESS;
fail:
  return r;
}

/* dev_setup, step 6: the staging the plan needs of the pool, and (verify)
 * the boxes and tensors of the sums, uploaded. */
static reshard_result_t setup_verify(const reshard_plan_t *p, rs_dev *d, size_t ncop) {
  reshard_result_t r = RESHARD_SUCCESS;
  d->staging_bytes = rs_staging_bytes(p);
  if (d->verify) {
    /* the sums sent and received live in the pool, after the halves */
    d->staging_bytes += 8 * (p->nsend_copies + p->nrecv_copies);
    size_t nv = (size_t)p->nvtensors;
    rs_vbox *hv = malloc((ncop ? ncop : 1) * sizeof *hv);
    if (!hv) {
      r = rs_error(RESHARD_ERROR_OUT_OF_MEMORY, "execute rank %d: out of memory", p->rank);
      goto fail;
    }
    if (p->nsend_copies) memcpy(hv, p->send_vbox, p->nsend_copies * sizeof *hv);
    if (p->nrecv_copies) memcpy(hv + p->nsend_copies, p->recv_vbox, p->nrecv_copies * sizeof *hv);
    if (p->nlocal_copies) memcpy(hv + p->nsend_copies + p->nrecv_copies, p->local_vbox, p->nlocal_copies * sizeof *hv);
    cudaError_t ce = cudaMallocAsync((void **)&d->d_vbox, (ncop ? ncop : 1) * sizeof *hv, d->s[S_PACK]);
    if (!ce) ce = cudaMallocAsync((void **)&d->d_vtensors, (nv ? nv : 1) * sizeof(rs_vtensor), d->s[S_PACK]);
    if (!ce) ce = cudaMallocAsync((void **)&d->d_rmine, (p->nrecv_copies + 1) * 8, d->s[S_PACK]);
    if (!ce) ce = cudaMallocAsync((void **)&d->d_lsrc, (p->nlocal_copies + 1) * 8, d->s[S_PACK]);
    if (!ce) ce = cudaMallocAsync((void **)&d->d_ldst, (p->nlocal_copies + 1) * 8, d->s[S_PACK]);
    if (!ce) ce = cudaMemcpyAsync(d->d_vbox, hv, ncop * sizeof *hv, cudaMemcpyHostToDevice, d->s[S_PACK]);
    if (!ce) ce = cudaMemcpyAsync(d->d_vtensors, p->vtensors, nv * sizeof(rs_vtensor), cudaMemcpyHostToDevice,
                                  d->s[S_PACK]);
    /* pageable sources: the upload must be done before hv goes */
    if (!ce) {
      ce = poll_done(d->s[S_PACK], NULL, rs_deadline_after_ms(p->opts.timeout_ms));
      if (ce == cudaErrorNotReady) ce = cudaErrorTimeout;
    }
    free(hv);
    CU(ce, "verify setup");
  }
  return RESHARD_SUCCESS;
fail:
  return r;
}

/* A plan's device state, in the steps above; on failure everything made
 * so far is freed (dev_free). */
static reshard_result_t dev_setup(const reshard_plan_t *p, rs_dev **out) {
  reshard_result_t r = RESHARD_SUCCESS;
  rs_copy *hc = NULL;
  rs_tile *ht = NULL;
  rs_dev *d = calloc(1, sizeof *d);
  if (!d) return rs_error(RESHARD_ERROR_OUT_OF_MEMORY, "execute rank %d: out of memory", p->rank);
  pthread_mutex_init(&d->mu, NULL);
  d->plan = p;
  size_t ncop = 0;
  uint64_t nt = 0;
  RS_CHECK_GOTO(setup_descriptors(p, d, &hc, &ncop), r, fail);
  RS_CHECK_GOTO(setup_tiles(p, d, &ht, &nt), r, fail);
  RS_CHECK_GOTO(setup_streams(p, d, ncop, nt), r, fail);
  RS_CHECK_GOTO(setup_agreement(p, d), r, fail);
  RS_CHECK_GOTO(setup_upload(p, d, hc, ncop, ht, nt), r, fail);
  RS_CHECK_GOTO(setup_verify(p, d, ncop), r, fail);
  if (d->staging_bytes) {
    RS_CHECK_GOTO(rs_dev_comm_staging_acquire(p->comm, d->staging_bytes), r, fail);
    d->pool_held = 1;
  }
  free(hc);
  free(ht);
  *out = d;
  return RESHARD_SUCCESS;
fail:
  free(hc);
  free(ht);
  dev_free(p, d);
  rs_error_prefix("plan_create rank %d (device setup): ", p->rank);
  return r;
}

reshard_result_t device_prepare_local(reshard_plan_t *p) {
  const rs_stream_ops *so = p->comm->ops->stream_ops;
  RS_CHECK(so->check(p->comm));
  rs_dev *d = NULL;
  RS_CHECK(dev_setup(p, &d));
  p->device = d;
  return RESHARD_SUCCESS;
}
