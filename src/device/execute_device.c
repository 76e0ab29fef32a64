/* The device executor: replays a plan on CUDA streams for a stream-ordered
 * transport (NCCL), without a host synchronization.
 *
 * Three internal streams overlap the rounds: the pack stream packs round k
 * into send half k mod 2, the transfer stream runs round k's group of
 * sends and receives once that pack is done, and the unpack stream unpacks
 * round k from receive half k mod 2 once the transfer is done. Events keep
 * the halves safe: pack k waits for transfer k-2 (its send half), transfer
 * k waits for unpack k-2 (its receive half). Local copies are packed on
 * the pack stream after round 0's pack, so they overlap its transfer.
 *
 * Everything per plan (descriptors, tiles, streams, events) is set up
 * while the plan is created (device_prepare_local, before creation's
 * last agreement, so that a rank that cannot set up fails creation on
 * every rank), and its peers are connected then (connect_peers);
 * an execute costs a few launches and one group per round, and no
 * per-segment work. The staging is the communicator's pool, shared by its
 * plans, whose executes therefore run one after another.
 *
 * No host wait is without a deadline: setup polls its upload, a full
 * buffer-table ring is polled, and destroy waits for the plan's last
 * execute until that execute's deadline, then poisons the communicator
 * (NCCL then ends the work) and frees what the GPU no longer uses. Any
 * failure or refusal of an execute with partners poisons the
 * communicator: its peers may have queued their half, and NCCL would pair
 * the next call's work with it. */
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
#include "device/direct.h"
#include "kernels/rs_kernels.h"
#include "exec/exec_state.h"
#include "exec/schedule.h"
#include "plan/quant.h"
#include "transport/stream.h"

enum { S_PACK, S_XFER, S_UNPACK, S_COUNT };
#define RS_TAB_SLOTS 4

typedef struct rs_dev {
  const reshard_plan_t *plan;
  pthread_mutex_t mu;
  /* A plan whose enqueued work may be half done (or whose communicator
   * failed) cannot run again: execute then returns INVALID_USAGE. */
  reshard_result_t failed;
  char failed_msg[640];
  int pool_held;          /* a user of the communicator's staging pool */
  int64_t last_deadline;  /* of the last execute enqueued (0: none) */
  /* CUDA graphs: launches of graphs holding an execute of this plan that
   * started and that finished, and the deadline of the latest to start
   * (atomic, written by host nodes of the graph on CUDA's thread). A
   * launch starts when the GPU gets there (after the work before it),
   * unknown to reshard: its deadline counts from then. At most one runs
   * at a time (each waits for the end of the work before it). */
  uint64_t launches_started, launches_landed;
  int64_t launch_deadline;

  rs_copy *d_copies; /* send | recv | local descriptors */
  rs_tile *d_tiles;  /* pack tiles by round | unpack tiles | local tiles */
  uint64_t *pack_start, *unpack_start; /* nrounds + 1 tile indices */
  uint64_t local_start, local_end;

  /* Buffer base addresses, source then destination: the only per-call
   * input, uploaded when it changes. A ring of tables, so that executes
   * enqueued back to back with different buffers (one plan per layer
   * group, alternating buffers) rarely find the next pinned slot still
   * feeding an upload. */
  void **h_tab[RS_TAB_SLOTS], **d_tab[RS_TAB_SLOTS]; /* pinned, device */
  cudaEvent_t tab_ev[RS_TAB_SLOTS];
  size_t ntab;
  int tab_cur;
  unsigned tab_pinned; /* slots a captured execute reads: never reused */
  unsigned tab_valid;  /* slots uploaded (their h_tab is their d_tab) */

  size_t staging_bytes; /* send halves, then receive halves, in the pool */
  rs_p2p *p2p;          /* one round's group */
  rs_xfer *xfers;       /* and its transfers (rs_sched_xfers) */

  /* The agreement with the plan's partners (kernels/rs_agree.h): this
   * rank's header, the partners', the sticky verdict on the device and its
   * copy in pinned memory, read by the host once ev_agreed completed. */
  rs_dev_hdr *d_hdr_out, *d_hdr_in;
  rs_dev_agree *d_agree, *h_agree;
  rs_dev_agree verdict; /* the latest consistent copy of *h_agree read */
  int gate_listed; /* d_agree is on the communicator's list (dev_comm.h) */
  uint64_t *d_word; /* relay plans: the verdict, reduced over every rank;
                       double buffering: the commit's vote (RS_COMMIT_WORDS) */
  int global;       /* relay plan: every rank takes part (see rs_agree.h) */
  rs_p2p *hdr_p2p; /* 2 x npeers: receive then send per partner */
  cudaEvent_t ev_checked, ev_agreed;
  int agreed_once;

  /* RESHARD_FLAG_DOUBLE_BUFFER (kernels/rs_agree.h): the buffer table has
   * both destination copies; d_cur is the call's view (sources, then the
   * inactive copy), written on the device from the commit record, whose
   * pinned copy the host reads once ev_committed completed. */
  int dbuf;
  size_t nview; /* source buffers + destination buffers (one copy) */
  void **d_cur;
  rs_dev_commit *d_commit, *h_commit;
  cudaEvent_t ev_committed;
  int committed_once;

  /* Registered buffers (reshard_plan_register_buffers, src/device/
   * direct.c): an execute with exactly these buffers copies each receive
   * straight from the sender's mapped buffers (d_dcopies, tiles by round
   * from dstart), reading through d_dtab (the partners' buffers, then
   * this rank's destination buffers from dtab_dst on). */
  void **reg;
  size_t nreg;
  void *mapset;
  rs_copy *d_dcopies;
  rs_tile *d_dtiles;
  uint64_t *dstart;
  void **d_dtab;
  uint32_t dtab_dst;

  /* RESHARD_FLAG_VERIFY (kernels/rs_verify.h): every descriptor's box
   * (d_vbox, parallel to d_copies) and the tensors; the sums sent (in
   * the staging pool, after the halves: a device transport sends from
   * there) and received (idem), this rank's sums of what it received and
   * of its local copies' two sides. */
  int verify;
  rs_vbox *d_vbox;
  rs_vtensor *d_vtensors;
  uint64_t *d_rmine, *d_lsrc, *d_ldst;

  cudaStream_t s[S_COUNT];
  /* ev_end: each stream's end of the last execute (recorded by a graph's
   * launches too); ev_fork, ev_join: a captured execute's fork from and
   * join into the caller's stream (events of the capture) */
  cudaEvent_t ev_begin, ev_end[S_COUNT], ev_fork, ev_join[S_COUNT];
  cudaEvent_t ev_packed[2], ev_xfer[2], ev_unpacked[2], ev_local;
} rs_dev;

/* Every event of a plan's device state, for creation and destruction. */
#define DEV_EVENTS(d)                                                                                          \
  {&(d)->tab_ev[0],  &(d)->tab_ev[1],  &(d)->tab_ev[2],      &(d)->tab_ev[3],      &(d)->ev_begin,             \
   &(d)->ev_end[0],  &(d)->ev_end[1],  &(d)->ev_end[2],      &(d)->ev_packed[0],   &(d)->ev_packed[1],         \
   &(d)->ev_xfer[0], &(d)->ev_xfer[1], &(d)->ev_unpacked[0], &(d)->ev_unpacked[1], &(d)->ev_checked,           \
   &(d)->ev_agreed,  &(d)->ev_committed, &(d)->ev_local,       &(d)->ev_fork,        &(d)->ev_join[0],           \
   &(d)->ev_join[1], &(d)->ev_join[2]}

#define CU(call, what)                                                     \
  do {                                                                     \
    cudaError_t cu_e_ = (call);                                            \
    if (cu_e_ != cudaSuccess) {                                            \
      r = rs_cuda_error(cu_e_, what, p->rank);                             \
      goto fail;                                                           \
    }                                                                      \
  } while (0)

/* Every host wait of the device executor: polls a stream (or, with
 * s NULL, an event) until its work is done or the deadline passes. Returns
 * the query's result: cudaSuccess, an error, or cudaErrorNotReady when the
 * deadline passed first. */
static cudaError_t poll_done(cudaStream_t s, cudaEvent_t e, int64_t deadline) {
  for (unsigned spin = 0;; spin++) {
    cudaError_t q = (cudaError_t)rs_cuda_query(s, e);
    if (q != cudaErrorNotReady || rs_now_ns() > deadline) return q;
    rs_nap(spin);
  }
}

/* Whether the plan's streams are in a stream capture the caller has
 * open (an execute captured into a CUDA graph joins them to it until it
 * ends): they have no status to ask for then (asking would invalidate
 * the capture). */
static int in_capture(const rs_dev *d) {
  for (int i = 0; i < S_COUNT; i++)
    if (d->s[i] && rs_stream_capturing(d->s[i])) return 1;
  return 0;
}

/* Whether the plan's work went idle before the deadline: its streams, and
 * the ends of its last execute (ev_end, which a graph's launches record
 * too: their work runs on the graph's streams, not these). A stream or
 * event whose query fails counts as idle: nothing more will run there.
 * Streams in an open capture count as busy. */
static int streams_idle(rs_dev *d, int64_t deadline) {
  if (in_capture(d)) return 0;
  for (int i = 0; i < S_COUNT; i++) {
    if (d->s[i] && poll_done(d->s[i], NULL, deadline) == cudaErrorNotReady) return 0;
    if (d->ev_end[i] && poll_done(NULL, d->ev_end[i], deadline) == cudaErrorNotReady) return 0;
  }
  return 1;
}

/* The deadline of the plan's latest work: its last execute's, or a
 * graph's latest launch's. */
static int64_t work_deadline(rs_dev *d) {
  int64_t dl = __atomic_load_n(&d->launch_deadline, __ATOMIC_ACQUIRE);
  return d->last_deadline > dl ? d->last_deadline : dl;
}

/* A host node at the start of a captured execute: each launch of the
 * graph gives its execute a deadline from now (the plan's timeout), for
 * device_poll and the communicator's next drain. On CUDA's thread: no
 * CUDA call, atomics only. */
static void CUDART_CB launched(void *arg) {
  rs_dev *d = arg;
  int64_t dl = rs_deadline_after_ms(d->plan->opts.timeout_ms);
  if (dl == RS_NO_DEADLINE) dl = INT64_MAX;
  __atomic_store_n(&d->launch_deadline, dl, __ATOMIC_RELEASE);
  __atomic_fetch_add(&d->launches_started, 1, __ATOMIC_RELEASE);
  rs_dev_comm_launched(d->plan->comm, dl);
}

/* ... and one at its end, on the caller's stream after everything. */
static void CUDART_CB landed(void *arg) {
  rs_dev *d = arg;
  __atomic_fetch_add(&d->launches_landed, 1, __ATOMIC_RELEASE);
}

/* Whether the plan's streams hold work not done (outside a capture). */
static int streams_busy(rs_dev *d) {
  for (int i = 0; i < S_COUNT; i++)
    if (d->s[i] && rs_cuda_query(d->s[i], NULL) == cudaErrorNotReady) return 1;
  return 0;
}

/* An event recorded by a step that executes after it may wait for (or the
 * host may query): in a capture, recorded by each launch of the graph
 * (an external record node), so that it means the same as outside one. */
static cudaError_t record_lasting(cudaEvent_t e, cudaStream_t s, int captured) {
  return captured ? cudaEventRecordWithFlags(e, s, cudaEventRecordExternal) : cudaEventRecord(e, s);
}

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
    if (p->stuck_out) *p->stuck_out = 1; /* memory others own that the work uses stays too */
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
  free(d->unpack_start);
  free(d->xfers);
  free(d->p2p);
  pthread_mutex_destroy(&d->mu);
  free(d);
}

static void device_free(reshard_plan_t *p) {
  dev_free(p, p->device);
  p->device = NULL;
}

/* Tiles of one direction, round by round; start[k] is round k's first.
 * A direction's round array covers only its own rounds (its last
 * message's round + 1), which may be fewer than the plan's. */
static int dir_rounds(const rs_msg *m, size_t n) { return n ? m[n - 1].round + 1 : 0; }

static uint64_t count_dir(const rs_msg *m, size_t n, const size_t *round, int nr, const rs_copy *copies,
                          uint64_t *start, uint64_t base) {
  uint64_t t = base;
  int dr = dir_rounds(m, n);
  for (int k = 0; k < nr; k++) {
    start[k] = t;
    if (k < dr)
      for (size_t i = round[k]; i < round[k + 1]; i++)
        t += rs_tiles_count(copies + m[i].first_copy, m[i].ncopies, RS_TILE_BYTES);
  }
  start[nr] = t;
  return t;
}

static void build_dir(const rs_msg *m, size_t n, const size_t *round, const rs_copy *copies, uint32_t desc_base,
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

static reshard_result_t dev_setup(const reshard_plan_t *p, rs_dev **out) {
  reshard_result_t r = RESHARD_SUCCESS;
  rs_copy *hc = NULL;
  rs_tile *ht = NULL;
  rs_dev *d = calloc(1, sizeof *d);
  if (!d) return rs_error(RESHARD_ERROR_OUT_OF_MEMORY, "execute rank %d: out of memory", p->rank);
  pthread_mutex_init(&d->mu, NULL);
  d->plan = p;
  int nr = p->nrounds;
  d->pack_start = calloc((size_t)nr + 1, sizeof *d->pack_start);
  d->unpack_start = calloc((size_t)nr + 1, sizeof *d->unpack_start);
  d->verify = (p->opts.flags & RESHARD_FLAG_VERIFY) != 0;
  /* verify: each message is followed by its sums */
  d->p2p = calloc(rs_sched_max_xfers(p, d->verify), sizeof *d->p2p);
  d->xfers = calloc(rs_sched_max_xfers(p, d->verify), sizeof *d->xfers);
  size_t ncop = p->nsend_copies + p->nrecv_copies + p->nlocal_copies;
  hc = malloc((ncop ? ncop : 1) * sizeof *hc);
  if (!d->pack_start || !d->unpack_start || !d->xfers || !d->p2p || !hc) {
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
   * launch gets as its source table. Its round's pack waits for the
   * unpacks that wrote the data (exec/schedule.h). */
  for (size_t i = 0; i < p->nsends; i++) {
    if (!p->sends[i].fwd) continue;
    for (uint32_t k = 0; k < p->sends[i].ncopies; k++) {
      rs_copy *c = &hc[p->sends[i].first_copy + k];
      if (c->src_buf != RS_BUF_STAGING) c->src_buf += p->num_src_buffers;
    }
  }

  /* Rounds are numbered per direction from 0; a direction with fewer
   * rounds simply has empty later ones. */
  uint64_t nt = count_dir(p->sends, p->nsends, p->send_round, nr, p->send_copies, d->pack_start, 0);
  nt = count_dir(p->recvs, p->nrecvs, p->recv_round, nr, p->recv_copies, d->unpack_start, nt);
  d->local_start = nt;
  nt += rs_tiles_count(p->local_copies, p->nlocal_copies, RS_TILE_BYTES);
  d->local_end = nt;
  ht = malloc((nt ? nt : 1) * sizeof *ht);
  if (!ht) {
    r = rs_error(RESHARD_ERROR_OUT_OF_MEMORY, "execute rank %d: out of memory for %llu tiles", p->rank, (unsigned long long)nt);
    goto fail;
  }
  build_dir(p->sends, p->nsends, p->send_round, p->send_copies, 0, d->pack_start, ht);
  build_dir(p->recvs, p->nrecvs, p->recv_round, p->recv_copies, (uint32_t)p->nsend_copies, d->unpack_start, ht);
  rs_tiles_build(p->local_copies, p->nlocal_copies, (uint32_t)(p->nsend_copies + p->nrecv_copies),
                 RS_TILE_BYTES, ht + d->local_start);

  for (int i = 0; i < S_COUNT; i++)
    CU(cudaStreamCreateWithFlags(&d->s[i], cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
  cudaEvent_t *evs[] = DEV_EVENTS(d);
  for (size_t i = 0; i < sizeof evs / sizeof evs[0]; i++)
    CU(cudaEventCreateWithFlags(evs[i], cudaEventDisableTiming), "cudaEventCreateWithFlags");

  CU(cudaMallocAsync((void **)&d->d_copies, (ncop ? ncop : 1) * sizeof *hc, d->s[S_PACK]), "cudaMallocAsync(descriptors)");
  CU(cudaMallocAsync((void **)&d->d_tiles, (nt ? nt : 1) * sizeof *ht, d->s[S_PACK]), "cudaMallocAsync(tiles)");
  d->dbuf = (p->opts.flags & RESHARD_FLAG_DOUBLE_BUFFER) != 0;
  d->nview = (size_t)p->num_src_buffers + (size_t)p->num_dst_buffers;
  d->ntab = d->nview + (d->dbuf ? (size_t)p->num_dst_buffers : 0);
  for (int i = 0; i < RS_TAB_SLOTS; i++) {
    CU(cudaMallocAsync((void **)&d->d_tab[i], (d->ntab ? d->ntab : 1) * sizeof(void *), d->s[S_PACK]),
       "cudaMallocAsync(buffer table)");
    CU(cudaMallocHost((void **)&d->h_tab[i], (d->ntab ? d->ntab : 1) * sizeof(void *)), "cudaMallocHost(buffer table)");
  }
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

  d->staging_bytes = (size_t)(2 * (p->send_half + p->recv_half));
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

/* The buffer table every launch of the current call reads: source
 * buffers, then destination buffers (with double buffering, the call's
 * view: the inactive copy). */
static void *const *call_tab(const rs_dev *d) { return d->dbuf ? d->d_cur : d->d_tab[d->tab_cur]; }

/* What gates a launch: GATE_DST, it writes destination buffers
 * (unpacks, local copies), so it writes nothing once the verdict failed;
 * GATE_STAGING, it packs into staging, which must not change once a
 * transport's wait gave up (a late partner may still read it), but is
 * packed as usual after a difference of headers with some partner (the
 * others take this rank's data). */
enum { GATE_DST = 1, GATE_STAGING = 2 };

/* Enqueues one launch over tiles [a, b). */
static reshard_result_t launch(const reshard_plan_t *p, rs_dev *d, uint64_t a, uint64_t b,
                               void *staging, int stream, int gated, const char *what) {
  if (a == b) return RESHARD_SUCCESS;
  void *const *src = call_tab(d);
  void *const *dst = src + p->num_src_buffers;
  const uint32_t *gate = !d->d_agree ? NULL
                         : gated == GATE_DST ? &d->d_agree->ok
                         : gated == GATE_STAGING ? &d->d_agree->staging_ok
                                                 : NULL;
  int e = rs_cuda_launch_copies_gated(d->d_tiles + a, b - a, d->d_copies, src, dst, staging, gate, d->s[stream]);
  if (e) return rs_cuda_error(e, what, p->rank);
  return RESHARD_SUCCESS;
}

/* The verdict of the agreement of the plan's latest finished execute:
 * MISMATCH naming the partner, the calls and the versions, once a
 * partner's header differed (sticky: the first difference). Never
 * blocks. */
static reshard_result_t agreement_verdict(const reshard_plan_t *p, rs_dev *d) {
  /* a snapshot, kept only if no later copy began meanwhile: a launch of a
   * graph, enqueued by another thread, re-records the event first, and
   * one that ran whole meanwhile counted its start */
  const uint64_t launches = __atomic_load_n(&d->launches_started, __ATOMIC_ACQUIRE);
  if (!d->h_agree || !d->agreed_once || rs_cuda_query(NULL, d->ev_agreed) != cudaSuccess) return RESHARD_SUCCESS;
  rs_dev_agree snap;
  memcpy(&snap, (const void *)d->h_agree, sizeof snap);
  if (rs_cuda_query(NULL, d->ev_agreed) != cudaSuccess ||
      __atomic_load_n(&d->launches_started, __ATOMIC_ACQUIRE) != launches)
    return RESHARD_SUCCESS;
  d->verdict = snap;
  const rs_dev_agree *a = &d->verdict;
  if (a->ok) return RESHARD_SUCCESS;
  if (a->bad_index == RS_DEV_AGREE_ELSEWHERE)
    return rs_error(RESHARD_ERROR_MISMATCH, "execute rank %d: call %llu (weight version %llu): a rank elsewhere in "
                    "this plan failed its agreement (in a relay plan its data reaches this rank through forwards; in "
                    "a quantizing plan its gathering of fp8 blocks may have failed; its partners name it); no "
                    "destination byte of that call or a later one was written", p->rank,
                    (unsigned long long)a->want.call, (unsigned long long)a->want.version);
  if (a->bad_index == RS_DEV_AGREE_POISONED)
    return rs_error(RESHARD_ERROR_REMOTE, "execute rank %d: at or after call %llu (weight version %llu): reshard's "
                    "communicator was aborted (a failed or timed-out call on it, this plan's or another's) while "
                    "this plan's work was pending; its later unpacks wrote nothing (destination buffers may be "
                    "partly updated)", p->rank, (unsigned long long)a->want.call, (unsigned long long)a->want.version);
  if (a->bad_index == RS_DEV_AGREE_PRIOR)
    return rs_error(RESHARD_ERROR_REMOTE, "execute rank %d: call %llu (weight version %llu): the plan gathering fp8 "
                    "blocks split across source ranks failed at its call %llu (its status says why); nothing "
                    "quantized from it was written", p->rank, (unsigned long long)a->want.call,
                    (unsigned long long)a->want.version, (unsigned long long)a->got.call);
  if (a->bad_index == RS_DEV_AGREE_TRANSPORT) {
    int peer = (int)(int64_t)a->got.digest;
    uint64_t why = a->got.magic;
    reshard_result_t code = why == RS_IPC_ABORTED ? RESHARD_ERROR_REMOTE
                            : why == RS_IPC_BAD_SIZE ? RESHARD_ERROR_MISMATCH
                            : why == RS_IPC_STALE   ? RESHARD_ERROR_BACKEND
                                                     : RESHARD_ERROR_TIMEOUT;
    const char *what = why == RS_IPC_ABORTED ? "was given up: the communicator was poisoned (a failed or refused "
                                               "call here or on a peer)"
                       : why == RS_IPC_BAD_SIZE ? "failed: the message's size differs from the receive's (the "
                                                  "ranks' plans differ)"
                       : why == RS_IPC_STALE ? "failed: the peer's staging pool changed and was not exchanged again "
                                               "(a plan creation that failed after growing it); recreate the "
                                               "communicator"
                                                : "did not complete within the plan's timeout (the peer did not run "
                                                  "its part)";
    return rs_error(code, "execute rank %d: at or after call %llu (weight version %llu): a transfer with rank %d %s; "
                    "the later unpacks of that call and every later call wrote nothing (destination buffers may be "
                    "partly updated)", p->rank, (unsigned long long)a->want.call,
                    (unsigned long long)a->want.version, peer, what);
  }
  if (a->bad_index == RS_DEV_AGREE_APART)
    return rs_error(RESHARD_ERROR_MISMATCH, "execute rank %d (double-buffer commit): ranks are at different "
                    "executes: this rank call %llu version %llu, others from call %llu version %llu up to call %llu "
                    "version %llu; nothing committed, and no destination byte of a later call written", p->rank,
                    (unsigned long long)a->want.call, (unsigned long long)a->want.version,
                    (unsigned long long)a->got.digest, (unsigned long long)a->got.magic,
                    (unsigned long long)a->got.call, (unsigned long long)a->got.version);
  if (a->bad_index == RS_DEV_AGREE_NOCOMMIT)
    return rs_error(RESHARD_ERROR_REMOTE, "execute rank %d: call %llu (weight version %llu): another rank failed it "
                    "(its status says why); nothing committed (double buffering), and no destination byte of a "
                    "later call written", p->rank, (unsigned long long)a->want.call,
                    (unsigned long long)a->want.version);
  if (a->bad_index == RS_DEV_AGREE_VERIFY) {
    /* the descriptor: a receive (its message names the peer) or a local copy */
    uint64_t desc = a->got.digest;
    const rs_vbox *v = NULL;
    int peer = p->rank;
    if (a->got.magic == 0 && desc >= p->nsend_copies && desc - p->nsend_copies < p->nrecv_copies) {
      uint64_t rc = desc - p->nsend_copies;
      v = &p->recv_vbox[rc];
      for (size_t i = 0; i < p->nrecvs; i++)
        if (rc >= p->recvs[i].first_copy && rc < p->recvs[i].first_copy + p->recvs[i].ncopies) peer = p->recvs[i].peer;
    } else if (a->got.magic == 1 && desc >= p->nsend_copies + p->nrecv_copies &&
               desc - p->nsend_copies - p->nrecv_copies < p->nlocal_copies) {
      v = &p->local_vbox[desc - p->nsend_copies - p->nrecv_copies];
    }
    char box[256] = "?";
    if (v) rs_vbox_format(v, box, sizeof box);
    return rs_error(RESHARD_ERROR_MISMATCH, "execute rank %d: at or after call %llu (weight version %llu): verify: "
                    "tensor '%s' box %s %s rank %d: checksum %016llx of the elements here, %016llx %s; the "
                    "writes of every later call were skipped (and the call's commit, with double buffering)", p->rank,
                    (unsigned long long)a->want.call, (unsigned long long)a->want.version,
                    v && v->tensor >= 0 && v->tensor < p->nvtensors ? p->vtensors[v->tensor].name : "?", box,
                    a->got.magic == 0 ? "received from" : "copied locally on", peer,
                    (unsigned long long)a->got.call, (unsigned long long)a->got.version,
                    a->got.magic == 0 ? "sent" : "at the source");
  }
  int peer = a->bad_index < p->npeers ? p->peers[a->bad_index].peer : -1;
  char digests[96] = "";
  if (a->got.digest != a->want.digest || a->got.magic != a->want.magic)
    snprintf(digests, sizeof digests, "; plan digests %016llx here, %016llx there (another plan)",
             (unsigned long long)a->want.digest, (unsigned long long)a->got.digest);
  return rs_error(RESHARD_ERROR_MISMATCH, "execute rank %d: agreement with partner rank %d failed: it is at call %llu "
                  "(weight version %llu), this rank at call %llu (version %llu)%s; the ranks are out of step (a "
                  "skipped or extra execute, or another step); no destination byte of that call or a later one "
                  "was written", p->rank, peer, (unsigned long long)a->got.call,
                  (unsigned long long)a->got.version, (unsigned long long)a->want.call,
                  (unsigned long long)a->want.version, digests);
}

/* Verify: adds the sums of tiles [ta, tb) on one side into sums[desc -
 * desc_base] (zeroed at the call's start), on stream `st`. */
static reshard_result_t verify_sums(const reshard_plan_t *p, rs_dev *d, uint64_t ta, uint64_t tb, int dst_side,
                                    uint64_t *sums, uint32_t desc_base, int st) {
  if (ta == tb) return RESHARD_SUCCESS;
  void *const *tab = call_tab(d);
  int e = rs_cuda_verify_sums(d->d_tiles + ta, tb - ta, d->d_copies, d->d_vbox, d->d_vtensors, tab,
                              tab + p->num_src_buffers, dst_side, sums, desc_base, d->s[st]);
  if (e) return rs_cuda_error(e, "verify sums launch", p->rank);
  return RESHARD_SUCCESS;
}

/* Verify: both sides of the local copies, summed after the copy and
 * compared (pack stream). */
static reshard_result_t verify_locals(const reshard_plan_t *p, rs_dev *d) {
  uint32_t base = (uint32_t)(p->nsend_copies + p->nrecv_copies), n = (uint32_t)p->nlocal_copies;
  if (!n) return RESHARD_SUCCESS;
  cudaStream_t s = d->s[S_PACK];
  cudaError_t ce = cudaMemsetAsync(d->d_lsrc, 0, 8 * (size_t)n, s);
  if (!ce) ce = cudaMemsetAsync(d->d_ldst, 0, 8 * (size_t)n, s);
  if (ce) return rs_cuda_error(ce, "cudaMemsetAsync(verify sums)", p->rank);
  void *const *tab = call_tab(d);
  for (int side = 0; side < 2; side++) {
    int e = rs_cuda_verify_sums(d->d_tiles + d->local_start, d->local_end - d->local_start, d->d_copies, d->d_vbox,
                                d->d_vtensors, tab, tab + p->num_src_buffers, side, side ? d->d_ldst : d->d_lsrc,
                                base, s);
    if (e) return rs_cuda_error(e, "verify sums launch", p->rank);
  }
  int e = rs_cuda_verify_compare(d->d_ldst, d->d_lsrc, n, base, 1, d->d_agree, s);
  if (e) return rs_cuda_error(e, "verify compare launch", p->rank);
  return RESHARD_SUCCESS;
}

/* Round k of a direct execute (registered buffers), on the transfer
 * stream: a token from each sender says its data is ready (sources at the
 * call's start; forwards once the copies that wrote them ran, earlier on
 * this stream), the receivers copy straight from the senders' buffers
 * (gated like unpacks), and a token back says they are done reading, so
 * that the sender's stream, and so its caller, goes on only then.
 * d->p2p holds the round's n transfers (receives first). */
static reshard_result_t direct_round(const reshard_plan_t *p, rs_dev *d, int k, size_t n, int64_t deadline,
                                     uint64_t *rsums) {
  const rs_stream_ops *so = p->comm->ops->stream_ops;
  for (size_t i = 0; i < n; i++) d->p2p[i].bytes = 0, d->p2p[i].buf = d->d_word ? (void *)d->d_word : (void *)d;
  RS_CHECK(so->group(p->comm, d->p2p, n, d->s[S_XFER], deadline, d->d_agree));
  if (k < dir_rounds(p->recvs, p->nrecvs) && d->dstart[k + 1] > d->dstart[k]) {
    const uint32_t *gate = d->d_agree ? &d->d_agree->ok : NULL;
    const rs_tile *t = d->d_dtiles + d->dstart[k];
    const uint64_t nt = d->dstart[k + 1] - d->dstart[k];
    int e = rs_cuda_launch_copies_gated(t, nt, d->d_dcopies, d->d_dtab, d->d_dtab + d->dtab_dst, NULL, gate,
                                        d->s[S_XFER]);
    if (e) return rs_cuda_error(e, "direct copy launch", p->rank);
    /* verify: the senders' side of each box, summed here from their
     * buffers as mapped (before the "done" tokens let them go on); the
     * direct copies are the receives' (same boxes, same order), so the
     * receives' boxes and their sums' slots serve; this rank's side is
     * summed by the unpack step as on the staged path */
    if (d->verify) {
      e = rs_cuda_verify_sums(t, nt, d->d_dcopies, d->d_vbox + p->nsend_copies, d->d_vtensors, d->d_dtab,
                              d->d_dtab + d->dtab_dst, 0, rsums, 0, d->s[S_XFER]);
      if (e) return rs_cuda_error(e, "verify sums launch", p->rank);
    }
  }
  for (size_t i = 0; i < n; i++) d->p2p[i].is_recv = !d->p2p[i].is_recv;
  return so->group(p->comm, d->p2p, n, d->s[S_XFER], deadline, d->d_agree);
}

/* One execute as the schedule (exec/schedule.h) enqueues it. */
typedef struct dev_call {
  const reshard_plan_t *p;
  rs_dev *d;
  int64_t deadline;
  uint64_t call, version;
  int captured; /* into a CUDA graph (enqueue_call) */
  /* the communicator's pool as this plan lays it out: send halves,
   * receive halves, then (verify) the sums sent and the sums received */
  unsigned char *send_half[2], *recv_half[2];
  uint64_t *ssums, *rsums;
} dev_call;

static dev_call call_of(const reshard_plan_t *p, rs_dev *d, int64_t deadline, uint64_t call, uint64_t version,
                        unsigned char *pool) {
  dev_call c = {p, d, deadline, call, version, 0, {NULL, NULL}, {NULL, NULL}, NULL, NULL};
  if (!pool) return c; /* (a plan without staging) */
  c.send_half[0] = pool, c.send_half[1] = pool + p->send_half;
  c.recv_half[0] = pool + 2 * p->send_half, c.recv_half[1] = c.recv_half[0] + p->recv_half;
  c.ssums = (uint64_t *)(pool + 2 * (p->send_half + p->recv_half));
  c.rsums = c.ssums + p->nsend_copies;
  return c;
}

/* A lane's stream: the schedule's lanes are the executor's streams. */
static cudaStream_t lane_stream(const rs_dev *d, rs_lane lane) {
  return d->s[lane == RS_LANE_PACK ? S_PACK : lane == RS_LANE_XFER ? S_XFER : S_UNPACK];
}

/* The event recorded behind a step: two halves of round events suffice,
 * since nothing waits for a step more than two rounds back, and a wait
 * is enqueued before the step two rounds on records the same event. */
static cudaEvent_t step_event(rs_dev *d, rs_step s) {
  switch (s.kind) {
  case RS_STEP_AGREE:
    return d->ev_checked;
  case RS_STEP_PACK:
    return d->ev_packed[s.round & 1];
  case RS_STEP_LOCAL:
    return d->ev_local;
  case RS_STEP_XFER:
    return d->ev_xfer[s.round & 1];
  case RS_STEP_UNPACK:
    return d->ev_unpacked[s.round & 1];
  case RS_STEP_CHECK:
    break;
  }
  return NULL;
}

/* The schedule's waits on the device: a lane is a stream, so a step
 * waits for one on another lane through the event behind it (a
 * transfer's sending and receiving are one group: one event). */
static reshard_result_t dev_wait(void *ctx, rs_step step, rs_dep dep) {
  dev_call *c = ctx;
  const reshard_plan_t *p = c->p;
  if (dep.on.lane == step.lane) return RESHARD_SUCCESS;
  cudaError_t e = cudaStreamWaitEvent(lane_stream(c->d, step.lane), step_event(c->d, dep.on), 0);
  if (e) return rs_cuda_error(e, "cudaStreamWaitEvent(schedule)", p->rank);
  return RESHARD_SUCCESS;
}

/* The agreement, ahead of round 0 on the transfer stream: this rank's
 * header to every partner, theirs back, checked on the device. Unpacks
 * (after it in stream order) and local copies (which wait for it) read
 * the verdict as their gate: on a difference nothing is written. */
static reshard_result_t dev_agree(dev_call *c) {
  const reshard_plan_t *p = c->p;
  rs_dev *d = c->d;
  const rs_stream_ops *so = p->comm->ops->stream_ops;
  if (!d->d_agree) return RESHARD_SUCCESS;
  rs_dev_hdr mine = {RS_DEV_HDR_MAGIC, p->digest, c->call, c->version};
  cudaStream_t s = d->s[S_XFER];
  /* a quantizing plan inherits its pre-plan's failure (this call's or an
   * earlier one's): its codes would come from blocks half gathered */
  const rs_dev *pd = p->quant && p->quant->pre ? p->quant->pre->device : NULL;
  int e = pd && pd->d_agree ? rs_cuda_agree_absorb(pd->d_agree, mine, d->d_agree, s) : 0;
  if (e) return rs_cuda_error(e, "agreement absorb launch", p->rank);
  e = rs_cuda_agree_stamp(d->d_hdr_out, mine, s);
  if (e) return rs_cuda_error(e, "agreement header launch", p->rank);
  RS_CHECK(so->group(p->comm, d->hdr_p2p, 2 * p->npeers, s, c->deadline, d->d_agree));
  e = rs_cuda_agree_check(d->d_hdr_in, (uint32_t)p->npeers, mine, d->d_agree, s);
  if (e) return rs_cuda_error(e, "agreement check launch", p->rank);
  if (!d->global) return RESHARD_SUCCESS;
  e = rs_cuda_agree_export(d->d_agree, d->d_word, s);
  if (e) return rs_cuda_error(e, "agreement export launch", p->rank);
  RS_CHECK(so->reduce_words(p->comm, d->d_word, 1, s, c->deadline, d->d_agree));
  e = rs_cuda_agree_import(d->d_word, mine, d->d_agree, s);
  if (e) return rs_cuda_error(e, "agreement import launch", p->rank);
  return RESHARD_SUCCESS;
}

/* Round k's pack (staging) or unpack (registered buffers: nothing, the
 * receivers copy straight from the senders), and verify's sums of it. */
static reshard_result_t dev_pack(dev_call *c, int k, int unpack) {
  const reshard_plan_t *p = c->p;
  rs_dev *d = c->d;
  const uint64_t *start = unpack ? d->unpack_start : d->pack_start;
  int h = k & 1;
  unsigned char *half = unpack ? c->recv_half[h] : c->send_half[h];
  if (!d->reg)
    RS_CHECK(launch(p, d, start[k], start[k + 1], half, unpack ? S_UNPACK : S_PACK, unpack ? GATE_DST : GATE_STAGING,
                    unpack ? "unpack launch" : "pack launch"));
  /* (with registered buffers the receivers sum this rank's sources
   * themselves: direct_round) */
  if (!d->verify || (d->reg && !unpack)) return RESHARD_SUCCESS;
  /* (sums of what landed: d_rmine) */
  return unpack ? verify_sums(p, d, start[k], start[k + 1], 1, d->d_rmine, (uint32_t)p->nsend_copies, S_UNPACK)
                : verify_sums(p, d, start[k], start[k + 1], 0, c->ssums, 0, S_PACK);
}

/* Round k's transfers: one group in the schedule's posting order (or, with
 * registered buffers, the direct round). */
static reshard_result_t dev_xfer(dev_call *c, int k) {
  const reshard_plan_t *p = c->p;
  rs_dev *d = c->d;
  const rs_stream_ops *so = p->comm->ops->stream_ops;
  int h = k & 1;
  size_t n = rs_sched_xfers(p, k, d->verify, d->xfers);
  for (size_t i = 0; i < n; i++) {
    const rs_xfer *x = &d->xfers[i];
    const rs_msg *m = x->m;
    void *buf = x->sums ? (void *)((x->recv ? c->rsums : c->ssums) + m->first_copy)
                        : (void *)((x->recv ? c->recv_half[h] : c->send_half[h]) + m->staging_off);
    d->p2p[i] = (rs_p2p){m->peer, x->recv, buf, x->sums ? 8 * (uint64_t)m->ncopies : m->bytes};
  }
  if (d->reg) return direct_round(p, d, k, n, c->deadline, c->rsums);
  return so->group(p->comm, d->p2p, n, d->s[S_XFER], c->deadline, d->d_agree);
}

/* The local copies (device to device through the same kernel), gated. */
static reshard_result_t dev_local(dev_call *c) {
  const reshard_plan_t *p = c->p;
  rs_dev *d = c->d;
  RS_CHECK(launch(p, d, d->local_start, d->local_end, NULL, S_PACK, GATE_DST, "local copy launch"));
  return d->verify ? verify_locals(p, d) : RESHARD_SUCCESS;
}

/* After every write of the call: verify's comparison of every received
 * box with its sender's sums, the commit (double buffering: this rank's
 * verdict, reduced over every rank, flips the copies on the device only
 * if no rank failed), and the verdict's copy for the host, after the last
 * transfer, so that it covers every round (a transport's wait that gave up
 * closes the gate, see transport/stream.h). */
static reshard_result_t dev_check(dev_call *c) {
  const reshard_plan_t *p = c->p;
  rs_dev *d = c->d;
  const rs_stream_ops *so = p->comm->ops->stream_ops;
  cudaStream_t s = d->s[S_XFER];
  int e = 0;
  if (d->verify && p->nrecv_copies) {
    e = rs_cuda_verify_compare(d->d_rmine, c->rsums, (uint32_t)p->nrecv_copies, (uint32_t)p->nsend_copies, 0,
                               d->d_agree, s);
    if (e) return rs_cuda_error(e, "verify compare launch", p->rank);
  }
  if (d->dbuf) {
    e = rs_cuda_commit_vote(d->d_agree, c->version, c->call, d->d_word, s);
    if (e) return rs_cuda_error(e, "commit vote launch", p->rank);
    RS_CHECK(so->reduce_words(p->comm, d->d_word, RS_COMMIT_WORDS, s, c->deadline, d->d_agree));
    e = rs_cuda_commit_flip(d->d_word, d->d_agree, c->version, c->call, d->d_commit, s);
    if (e) return rs_cuda_error(e, "commit launch", p->rank);
    cudaError_t ce = cudaMemcpyAsync(d->h_commit, d->d_commit, sizeof *d->h_commit, cudaMemcpyDeviceToHost, s);
    if (!ce) ce = record_lasting(d->ev_committed, s, c->captured);
    if (ce) return rs_cuda_error(ce, "commit record copy", p->rank);
    d->committed_once = 1;
  }
  if (d->d_agree) {
    cudaError_t ce = cudaMemcpyAsync(d->h_agree, d->d_agree, sizeof *d->h_agree, cudaMemcpyDeviceToHost, s);
    if (!ce) ce = record_lasting(d->ev_agreed, s, c->captured);
    if (ce) return rs_cuda_error(ce, "agreement verdict copy", p->rank);
    d->agreed_once = 1;
  }
  return RESHARD_SUCCESS;
}

/* The schedule's steps on the device: enqueued on their lane's stream,
 * each followed by its event. */
static reshard_result_t dev_run(void *ctx, rs_step step) {
  dev_call *c = ctx;
  reshard_result_t r = RESHARD_SUCCESS;
  switch (step.kind) {
  case RS_STEP_AGREE:
    r = dev_agree(c);
    break;
  case RS_STEP_PACK:
    r = dev_pack(c, step.round, 0);
    break;
  case RS_STEP_LOCAL:
    r = dev_local(c);
    break;
  case RS_STEP_XFER:
    r = dev_xfer(c, step.round);
    break;
  case RS_STEP_UNPACK:
    r = dev_pack(c, step.round, 1);
    break;
  case RS_STEP_CHECK:
    return dev_check(c);
  }
  if (r) return r;
  cudaError_t e = cudaEventRecord(step_event(c->d, step), lane_stream(c->d, step.lane));
  if (e) return rs_cuda_error(e, "cudaEventRecord(schedule)", c->p->rank);
  return RESHARD_SUCCESS;
}

static const rs_sched_ops dev_sched = {dev_wait, dev_run};

/* Entry i of the call's buffer table (source buffers, then destination
 * buffers; NULL where the caller passed none). */
static void *call_buf(const reshard_plan_t *p, void *const *src, size_t nsrc, void *const *dst, size_t ndst,
                      size_t i) {
  const size_t ns = (size_t)p->num_src_buffers;
  return i < ns ? (src && i < nsrc ? src[i] : NULL) : (dst && i - ns < ndst ? dst[i - ns] : NULL);
}

/* Whether table slot `slot` holds the call's buffers. */
static int table_holds(const reshard_plan_t *p, const rs_dev *d, int slot, void *const *src, size_t nsrc,
                       void *const *dst, size_t ndst) {
  if (!(d->tab_valid >> slot & 1)) return 0;
  for (size_t i = 0; i < d->ntab; i++)
    if (d->h_tab[slot][i] != call_buf(p, src, nsrc, dst, ndst, i)) return 0;
  return 1;
}

/* Whether the call's buffers differ from those of the table in use. */
static int table_changed(const reshard_plan_t *p, const rs_dev *d, void *const *src, size_t nsrc, void *const *dst,
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

static reshard_result_t switch_table(const reshard_plan_t *p, rs_dev *d, void *const *src, size_t nsrc,
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
  for (size_t i = 0; i < d->ntab; i++) h[i] = call_buf(p, src, nsrc, dst, ndst, i);
  cudaError_t ce = cudaMemcpyAsync(d->d_tab[slot], h, d->ntab * sizeof(void *), cudaMemcpyHostToDevice, d->s[S_PACK]);
  if (!ce) ce = cudaEventRecord(d->tab_ev[slot], d->s[S_PACK]);
  if (ce) return rs_cuda_error(ce, "buffer table upload", p->rank);
  d->tab_cur = slot;
  d->tab_valid |= 1u << slot;
  return RESHARD_SUCCESS;
}

/* Enqueues one execute after the caller's work on `caller`; captured: the
 * caller's stream is capturing a CUDA graph (enqueue_call checked
 * what that allows), so that every launch of the graph runs this call
 * again: it waits for the execute before it and records its ends through
 * external event nodes, and sets its own deadline when it starts. */
static reshard_result_t enqueue(const reshard_plan_t *p, rs_dev *d, void *const *src, size_t nsrc,
                                void *const *dst, size_t ndst, cudaStream_t caller, uint64_t call,
                                uint64_t version, int captured) {
  reshard_result_t r = RESHARD_SUCCESS;
  int64_t deadline = rs_deadline_after_ms(p->opts.timeout_ms);
  /* From the first thing enqueued, destroy may wait for this call's work
   * until its deadline, even if the call fails halfway (a graph's
   * launches set theirs: launched). */
  if (!captured) d->last_deadline = deadline == RS_NO_DEADLINE ? INT64_MAX : deadline;

  /* Start after the caller's work, after this plan's previous execute
   * (the buffer table) and after the communicator's previous execute of
   * any plan (the staging pool). */
  unsigned char *staging = NULL;
  const unsigned ext = captured ? cudaEventWaitExternal : 0;
  CU(cudaEventRecord(d->ev_fork, caller), "cudaEventRecord(start)");
  CU(cudaStreamWaitEvent(d->s[S_PACK], d->ev_fork, 0), "cudaStreamWaitEvent(start)");
  for (int i = 0; i < S_COUNT; i++)
    CU(cudaStreamWaitEvent(d->s[S_PACK], d->ev_end[i], ext), "cudaStreamWaitEvent(previous)");
  RS_CHECK_GOTO(rs_dev_comm_begin(p->comm, d->s[S_PACK], (void **)&staging), r, fail);
  /* a launch starts once everything before it is done */
  if (captured) CU(cudaLaunchHostFunc(d->s[S_PACK], launched, d), "cudaLaunchHostFunc(launch start)");

  /* (a captured execute has the table in use: enqueue_call) */
  if (!captured && d->ntab && table_changed(p, d, src, nsrc, dst, ndst))
    RS_CHECK_GOTO(switch_table(p, d, src, nsrc, dst, ndst, deadline), r, fail);
  /* Double buffering: this call's view of the table, from the commit
   * record as the previous call left it (stream order). */
  if (d->dbuf && d->nview) {
    int e = rs_cuda_commit_select(d->d_tab[d->tab_cur], (uint32_t)p->num_src_buffers, (uint32_t)p->num_dst_buffers,
                                  d->d_commit, d->d_cur, d->s[S_PACK]);
    if (e) {
      r = rs_cuda_error(e, "double-buffer table launch", p->rank);
      goto fail;
    }
  }
  /* verify: the call's sums start at zero (the copies of a round are not
   * contiguous, so once per call, before any stream adds) */
  dev_call c = call_of(p, d, deadline, call, version, staging);
  c.captured = captured;
  if (d->verify) {
    /* (registered: the senders' sums are added up here too, after them) */
    const size_t nsums = p->nsend_copies + (d->reg ? p->nrecv_copies : 0);
    if (nsums) CU(cudaMemsetAsync(c.ssums, 0, 8 * nsums, d->s[S_PACK]), "cudaMemsetAsync(verify sums)");
    if (p->nrecv_copies)
      CU(cudaMemsetAsync(d->d_rmine, 0, 8 * p->nrecv_copies, d->s[S_PACK]), "cudaMemsetAsync(verify sums)");
  }
  CU(cudaEventRecord(d->ev_begin, d->s[S_PACK]), "cudaEventRecord(begin)");
  CU(cudaStreamWaitEvent(d->s[S_XFER], d->ev_begin, 0), "cudaStreamWaitEvent(begin)");
  CU(cudaStreamWaitEvent(d->s[S_UNPACK], d->ev_begin, 0), "cudaStreamWaitEvent(begin)");
  /* Block quantization (plan/quant.h): this rank's boxes into the scratch
   * that round 0's pack and the local copies read, through the call's
   * table; the pre-plan that gathered split blocks ran before (begin). */
  if (p->quant) RS_CHECK_GOTO(rs_device_quantize(p->quant, call_tab(d), d->s[S_PACK], p->rank), r, fail);

  RS_CHECK_GOTO(rs_sched_run(p, &dev_sched, &c), r, fail);

  /* Completion becomes visible on the caller's stream (in a capture, the
   * join of the plan's streams into the caller's, which the capture's
   * end requires). */
  for (int i = 0; i < S_COUNT; i++) {
    CU(record_lasting(d->ev_end[i], d->s[i], captured), "cudaEventRecord(end)");
    cudaEvent_t join = d->ev_end[i];
    if (captured) {
      join = d->ev_join[i];
      CU(cudaEventRecord(join, d->s[i]), "cudaEventRecord(join)");
    }
    CU(cudaStreamWaitEvent(caller, join, 0), "cudaStreamWaitEvent(caller)");
  }
  if (captured) {
    CU(cudaLaunchHostFunc(caller, landed, d), "cudaLaunchHostFunc(launch end)");
    d->tab_pinned |= 1u << d->tab_cur;
  }
  RS_CHECK_GOTO(rs_dev_comm_end(p->comm, caller, deadline), r, fail);
  return RESHARD_SUCCESS;
fail:
  return r;
}

/* Double buffering: the committed version and active copy, once the GPU
 * has done the latest enqueued commit (d->mu held; never blocks). */
static void commit_poll(const reshard_plan_t *p, rs_dev *d) {
  const uint64_t launches = __atomic_load_n(&d->launches_started, __ATOMIC_ACQUIRE);
  if (!d->dbuf || !d->committed_once || rs_cuda_query(NULL, d->ev_committed) != cudaSuccess) return;
  rs_dev_commit snap; /* (kept only if no later copy began: agreement_verdict) */
  memcpy(&snap, (const void *)d->h_commit, sizeof snap);
  if (rs_cuda_query(NULL, d->ev_committed) != cudaSuccess ||
      __atomic_load_n(&d->launches_started, __ATOMIC_ACQUIRE) != launches)
    return;
  const rs_dev_commit *c = &snap;
  if (!c->commits) return;
  reshard_plan_t *m = (reshard_plan_t *)p;
  __atomic_store_n(&m->committed_version, c->version, __ATOMIC_RELEASE);
  __atomic_store_n(&m->active_copy, c->active, __ATOMIC_RELEASE);
}

/* The plan fails (d->mu held; r's detail is the current error). When it
 * does NCCL work, the communicator is poisoned: some of a failed call may
 * be enqueued and the peers may have queued their half, a plan out of
 * step or past its deadline has partners waiting, so nothing this rank
 * sends later could be trusted to pair with the right call. */
static void dev_failed(const reshard_plan_t *p, rs_dev *d, reshard_result_t r) {
  if (d->d_agree) p->comm->ops->stream_ops->poison(p->comm);
  d->failed = r;
  snprintf(d->failed_msg, sizeof d->failed_msg, "%s: %s", reshard_result_string(r), reshard_last_error());
}

static reshard_result_t enqueue_call(const reshard_plan_t *plan, void *const *src, size_t nsrc,
                                   void *const *dst, size_t ndst, void *stream, uint64_t call,
                                   uint64_t version) {
  const reshard_plan_t *p = plan;
  const rs_stream_ops *so = p->comm->ops->stream_ops;
  rs_dev *d = p->device;
  if (!d) return rs_error(RESHARD_ERROR_INTERNAL, "execute rank %d: the plan was not prepared for the device", p->rank);
  pthread_mutex_lock(&d->mu);
  reshard_result_t r;
  if (d->failed) {
    r = rs_error(RESHARD_ERROR_INVALID_USAGE, "execute rank %d: this plan failed earlier (%s); destroy it",
                 p->rank, d->failed_msg);
    pthread_mutex_unlock(&d->mu);
    return r;
  }
  /* Captured into a CUDA graph: every launch runs this call again (same
   * buffers, same call number and version in the headers and the
   * commit), ordered after the execute before it through external event
   * nodes. Refused before anything is enqueued where a launch could not
   * mean the same. (The verdicts of earlier calls are read by the next
   * uncaptured execute or reshard_plan_get_status.) */
  const int captured = rs_stream_capturing(stream);
  r = RESHARD_SUCCESS;
  if (!captured) {
    commit_poll(p, d);
    r = agreement_verdict(p, d);
  }
  if (r == RESHARD_SUCCESS) r = so->check(p->comm);
  /* A registered plan runs direct on every rank: its partners read this
   * rank's registered buffers, so other pointers are refused (a rank
   * falling back to staging alone would not pair with its partners). */
  for (size_t i = 0; r == RESHARD_SUCCESS && d->reg && i < d->nreg; i++) {
    void *given = call_buf(p, src, nsrc, dst, ndst, i);
    if (given != d->reg[i])
      r = rs_error(RESHARD_ERROR_INVALID_ARGUMENT, "execute rank %d: %s buffer %zu is %p, not the registered %p: a "
                   "plan with registered buffers executes with exactly those (call reshard_plan_register_buffers "
                   "again after reallocating, or with no buffers to go back to staging)", p->rank,
                   i < (size_t)p->num_src_buffers ? "source" : "destination",
                   i < (size_t)p->num_src_buffers ? i : i - p->num_src_buffers, given, d->reg[i]);
  }
  if (r != RESHARD_SUCCESS)
    ;
  else if (captured < 0)
    r = rs_error(RESHARD_ERROR_INVALID_USAGE, "execute rank %d: the caller's stream is in a CUDA graph capture that "
                 "was invalidated (by an earlier call); end it and capture again", p->rank);
  else if (captured && !so->graphs)
    r = rs_error(RESHARD_ERROR_UNSUPPORTED, "execute rank %d: the %s transport cannot be captured into a CUDA graph "
                 "(its messages' sequence numbers are counted on the host: a launch would replay stale ones); "
                 "execute without capturing", p->rank, p->comm->ops->name);
  else if (captured && (p->opts.flags & RESHARD_FLAG_SYNC))
    r = rs_error(RESHARD_ERROR_INVALID_USAGE, "execute rank %d: RESHARD_FLAG_SYNC waits on the host for the call's "
                 "result, which a CUDA graph capture does not run; capture plans without it and read "
                 "reshard_plan_get_status after a launch", p->rank);
  else if (captured && table_changed(p, d, src, nsrc, dst, ndst))
    r = rs_error(RESHARD_ERROR_INVALID_USAGE, "execute rank %d: a captured execute must use the buffers of the "
                 "plan's previous execute (a CUDA graph reads the buffer table as it stands; capture after one "
                 "execute with these very buffers)", p->rank);
  else if (!captured && in_capture(d))
    r = rs_error(RESHARD_ERROR_INVALID_USAGE, "execute rank %d: an execute of this plan is being captured into a "
                 "CUDA graph on another stream, whose capture is still open: end it before executing the plan",
                 p->rank);
  const int refused = r != RESHARD_SUCCESS;
  if (!refused) r = enqueue(p, d, src, nsrc, dst, ndst, (cudaStream_t)stream, call, version, captured);
  if (r != RESHARD_SUCCESS && captured) {
    if (!refused)
      rs_error_prefix("execute rank %d (captured into a CUDA graph, which now holds part of the call: discard it): ",
                      p->rank);
    /* refused before anything was enqueued, or failed inside the capture:
     * nothing ran, on this rank or (by this call) a peer, so the plan
     * stays usable (a peer that captured its half fails at its launch's
     * deadline, or its next call disagrees with this rank's); a capture
     * that holds part of the call must be discarded (the error says so) */
    pthread_mutex_unlock(&d->mu);
    return r;
  }
  if (r == RESHARD_SUCCESS && (p->opts.flags & RESHARD_FLAG_SYNC)) {
    /* the call's own result: its work done (polled until its deadline),
     * then its agreement's verdict */
    if (!streams_idle(d, d->last_deadline))
      r = rs_error(RESHARD_ERROR_TIMEOUT, "execute rank %d: call %llu did not finish before its deadline (a peer "
                   "did not run its part)", p->rank, (unsigned long long)call);
    else
      r = agreement_verdict(p, d);
    commit_poll(p, d);
  }
  if (r != RESHARD_SUCCESS) dev_failed(p, d, r);
  pthread_mutex_unlock(&d->mu);
  return r;
}

static void device_poll(const reshard_plan_t *p) {
  rs_dev *d = p->device;
  if (!d) return;
  /* a quantizing plan fails with its pre-plan, whose gate closes this
   * plan's only where this plan has one (partners, a commit) */
  const reshard_plan_t *pre = p->quant ? p->quant->pre : NULL;
  reshard_result_t pre_failed = RESHARD_SUCCESS;
  char pre_msg[640];
  if (pre && pre->device) {
    device_poll(pre);
    rs_dev *pd = pre->device;
    pthread_mutex_lock(&pd->mu);
    pre_failed = pd->failed;
    if (pre_failed) snprintf(pre_msg, sizeof pre_msg, "%s", pd->failed_msg);
    pthread_mutex_unlock(&pd->mu);
  }
  pthread_mutex_lock(&d->mu);
  if (pre_failed && !d->failed) {
    rs_error(pre_failed, "execute rank %d: the plan gathering fp8 blocks split across source ranks failed: %s",
             p->rank, pre_msg);
    dev_failed(p, d, pre_failed);
    uint64_t calls = __atomic_load_n(&p->exec_calls, __ATOMIC_ACQUIRE);
    rs_plan_mark_failed(p, calls ? calls - 1 : 0, p->committed_version, pre_failed, d->failed_msg);
  }
  commit_poll(p, d);
  reshard_result_t v = d->failed ? RESHARD_SUCCESS : agreement_verdict(p, d);
  if (v) {
    dev_failed(p, d, v);
    /* the call whose check failed, not the latest enqueued */
    rs_plan_mark_failed(p, d->verdict.want.call, d->verdict.want.version, v, d->failed_msg);
  }
  /* Past its deadline: a launch of a graph that started and has not
   * finished, or else uncaptured work on the plan's streams (a launch
   * queued behind the caller's work has not started: no deadline yet; a
   * capture still open has no status to ask for). */
  uint64_t landed_n = __atomic_load_n(&d->launches_landed, __ATOMIC_ACQUIRE);
  uint64_t started_n = __atomic_load_n(&d->launches_started, __ATOMIC_ACQUIRE);
  int64_t now = rs_now_ns();
  int late = started_n > landed_n ? now > __atomic_load_n(&d->launch_deadline, __ATOMIC_ACQUIRE)
                                  : d->last_deadline && now > d->last_deadline && !in_capture(d) && streams_busy(d);
  if (!d->failed && late) {
    v = rs_error(RESHARD_ERROR_TIMEOUT, "execute rank %d: the plan's last execute did not finish before its deadline "
                 "(a peer did not run its part, or issued its calls in another order); reshard's NCCL communicator "
                 "was aborted, which ends the work", p->rank);
    dev_failed(p, d, v);
    uint64_t calls = __atomic_load_n(&p->exec_calls, __ATOMIC_ACQUIRE);
    rs_plan_mark_failed(p, calls ? calls - 1 : 0, p->committed_version, v, d->failed_msg);
  }
  pthread_mutex_unlock(&d->mu);
}

static reshard_result_t device_prepare_local(reshard_plan_t *p) {
  const rs_stream_ops *so = p->comm->ops->stream_ops;
  RS_CHECK(so->check(p->comm));
  rs_dev *d = NULL;
  RS_CHECK(dev_setup(p, &d));
  p->device = d;
  return RESHARD_SUCCESS;
}

/* NCCL connects a peer lazily, inside the first ncclGroupEnd that names
 * it, and then sets up every point-to-point channel of that peer and
 * direction whatever the message size (NCCL src/enqueue.cc, the p2p task
 * append: "Mark channels that need pre-connect"). A one-byte exchange
 * with each of the plan's peers, in the plan's directions, while every
 * rank is in plan creation, makes the first execute connect nothing: a
 * peer that comes late to it only delays the GPU. */
static reshard_result_t connect_peers(reshard_plan_t *p) {
  const rs_stream_ops *so = p->comm->ops->stream_ops;
  rs_dev *d = p->device;
  if (!d || (!(p->nsends + p->nrecvs) && !d->global && !d->dbuf)) return RESHARD_SUCCESS;
  reshard_result_t r = rs_dev_comm_drain(p->comm); /* the pool is about to be used */
  if (r) return r;
  size_t n = 2 * p->npeers;
  rs_p2p *ops = calloc(n + 1, sizeof *ops);
  unsigned char *seen = calloc((size_t)p->comm->size, 2);
  if (!ops || !seen) {
    free(ops);
    free(seen);
    return rs_error(RESHARD_ERROR_OUT_OF_MEMORY, "plan_create rank %d: out of memory", p->rank);
  }
  unsigned char *pool = NULL;
  r = rs_dev_comm_begin(p->comm, d->s[S_XFER], (void **)&pool);
  /* Both directions with every partner, not only the plan's: the
   * agreement headers go both ways (NCCL connects each direction on its
   * own). */
  size_t k = 0, nrecv = 0;
  for (size_t i = 0; !r && i < n; i++) {
    int peer = p->peers[i / 2].peer, recv = (int)(i % 2);
    unsigned char *mark = &seen[2 * (size_t)peer + (size_t)recv];
    if (*mark) continue;
    *mark = 1;
    /* receives into distinct bytes after the one every send reads */
    unsigned char *buf = recv ? pool + 1 + nrecv++ % (d->staging_bytes - 1) : pool;
    ops[k++] = (rs_p2p){peer, recv, buf, 1};
  }
  int64_t deadline = rs_deadline_after_ms(p->opts.timeout_ms);
  d->last_deadline = deadline == RS_NO_DEADLINE ? INT64_MAX : deadline;
  if (!r) r = so->group(p->comm, ops, k, d->s[S_XFER], deadline, d->d_agree);
  /* relay plans: the verdict's reduction over every rank, once, so that
   * its connections are made here too */
  if (!r && (d->global || d->dbuf))
    r = so->reduce_words(p->comm, d->d_word, d->dbuf ? RS_COMMIT_WORDS : 1, d->s[S_XFER], deadline, d->d_agree);
  if (!r) r = rs_dev_comm_end(p->comm, d->s[S_XFER], deadline);
  if (!r) r = rs_dev_comm_drain(p->comm);
  /* a transport whose waits give up on the device (CUDA IPC) closed the
   * gate instead of failing the drain: that is a peer that did not come */
  if (!r && d->d_agree) {
    rs_dev_agree a;
    cudaError_t ce = cudaMemcpy(&a, d->d_agree, sizeof a, cudaMemcpyDeviceToHost);
    if (ce) r = rs_cuda_error(ce, "cudaMemcpy(connection verdict)", p->rank);
    else if (!a.ok)
      r = rs_error(RESHARD_ERROR_TIMEOUT, "rank %d: connecting to rank %d did not complete within the plan's timeout",
                   p->rank, (int)(int64_t)a.got.digest);
  }
  free(ops);
  free(seen);
  if (r) {
    so->poison(p->comm);
    rs_error_prefix("plan_create rank %d (connecting the plan's peers): ", p->rank);
  }
  return r;
}

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
  else if (d->failed)
    r = rs_error(RESHARD_ERROR_INVALID_USAGE, "register_buffers rank %d: this plan failed earlier (%s)", p->rank,
                 d->failed_msg);
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
    nt = count_dir(p->recvs, p->nrecvs, p->recv_round, p->nrounds, hc, dstart, 0);
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

/* prepare_peers: the transport's own connections first (collective on
 * every rank, partners or not), then the plan's. */
static reshard_result_t device_prepare_peers(reshard_plan_t *p) {
  const rs_stream_ops *so = p->comm->ops->stream_ops;
  if (so->connect) RS_CHECK(so->connect(p->comm));
  return connect_peers(p);
}

/* execute: stream-ordered, so no host agreement; the call is numbered
 * and its version recorded when the work is enqueued. */
static reshard_result_t device_execute(const reshard_plan_t *plan, rs_exec_call *c) {
  reshard_plan_t *mut = (reshard_plan_t *)plan;
  c->call = __atomic_fetch_add(&mut->exec_calls, 1, __ATOMIC_RELAXED);
  c->version = rs_plan_take_version(plan, c->explicit_version, c->version_in);
  RS_CHECK(enqueue_call(plan, c->src, c->nsrc, c->dst, c->ndst, c->stream, c->call, c->version));
  if (plan->opts.flags & RESHARD_FLAG_DOUBLE_BUFFER)
    __atomic_fetch_add(&mut->completed, 1, __ATOMIC_ACQ_REL); /* the commit is the GPU's: device_poll reads it */
  else
    rs_plan_record_success(plan, c->version);
  return RESHARD_SUCCESS;
}

/* refuse: the partners cannot be told (no headers yet), and their half of
 * this call may be queued already, which NCCL would pair with this rank's
 * next call: the communicator is poisoned instead. */
static reshard_result_t device_refuse(const reshard_plan_t *plan, int explicit_version, uint64_t version_in,
                                      reshard_result_t r) {
  (void)explicit_version, (void)version_in;
  if (plan->nsends + plan->nrecvs) {
    plan->comm->ops->stream_ops->poison(plan->comm);
    rs_error_prefix("(reshard's NCCL communicator is now aborted: its peers may have queued this call) ");
  }
  return r;
}

const rs_executor rs_device_executor = {
    .name = "device",
    .stream_ordered = 1,
    .prepare_local = device_prepare_local,
    .prepare_peers = device_prepare_peers,
    .free = device_free,
    .execute = device_execute,
    .refuse = device_refuse,
    .poll = device_poll,
    .register_buffers = rs_device_register,
    .quant_prepare = rs_device_quant_prepare,
};
