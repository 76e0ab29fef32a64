/* Private to src/device/: the device executor's per-plan state (rs_dev)
 * and the functions its files share. Not for other folders (they see
 * device.h). */
#ifndef RS_DEVICE_INTERNAL_H
#define RS_DEVICE_INTERNAL_H

/* The overview, from the file these came from: */
/* The device executor: replays a plan on CUDA streams for a stream-ordered
 * transport (NCCL), without a host synchronization.
 *
 * Three internal streams overlap the rounds: the pack stream packs round k
 * into send half k mod 2, the transfer stream runs round k's group of
 * sends and receives once that pack is done, and the unpack stream unpacks
 * round k from receive half k mod 2 once the transfer is done; a round's
 * relay forwards are packed and sent apart (a second group), once round
 * k-1 is unpacked (exec/schedule.h). Events keep the halves safe: pack k
 * waits for transfer k-2 (its send half), transfer k waits for unpack k-2
 * (its receive half). Local copies are packed on
 * the pack stream after round 0's pack, so they overlap its transfer.
 *
 * Everything per plan (descriptors, tiles, streams, events) is set up
 * while the plan is created (device_prepare_local, before creation's
 * last agreement, so that a rank that cannot set up fails creation on
 * every rank), and its peers are connected then (connect_peers);
 * an execute costs a few launches and one group per round (two where
 * the round forwards), and no
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

#include "device/device.h"
#include "exec/direct.h"
#include "kernels/rs_kernels.h"
#include "exec/schedule.h"
#include "transport/stream.h"

enum { S_PACK, S_XFER, S_UNPACK, S_COUNT };
#define RS_TAB_SLOTS 4

typedef struct rs_dev {
  const reshard_plan_t *plan;
  pthread_mutex_t mu;
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
  /* round k's forwards' first pack tile (they are its last sends): PACK k
   * packs pack_start[k] .. fpack_start[k], FPACK k the rest */
  uint64_t *fpack_start;
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
  /* a host-driven transport's tickets of the last rounds' groups
   * (stream.h group_async), two a round (XFER k's at 2k & 7, FXFER k's
   * at 2k+1 & 7): nothing waits for a transfer more than two rounds back */
  uint64_t xfer_ticket[8];

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
  cudaEvent_t ev_fpacked[2], ev_fxfer[2]; /* FPACK k, FXFER k (exec/schedule.h) */
} rs_dev;

/* Every event of a plan's device state, for creation and destruction. */
#define DEV_EVENTS(d)                                                                                          \
  {&(d)->tab_ev[0],  &(d)->tab_ev[1],  &(d)->tab_ev[2],      &(d)->tab_ev[3],      &(d)->ev_begin,             \
   &(d)->ev_end[0],  &(d)->ev_end[1],  &(d)->ev_end[2],      &(d)->ev_packed[0],   &(d)->ev_packed[1],         \
   &(d)->ev_xfer[0], &(d)->ev_xfer[1], &(d)->ev_unpacked[0], &(d)->ev_unpacked[1], &(d)->ev_checked,           \
   &(d)->ev_agreed,  &(d)->ev_committed, &(d)->ev_local,       &(d)->ev_fork,        &(d)->ev_join[0],           \
   &(d)->ev_join[1], &(d)->ev_join[2], &(d)->ev_fpacked[0], &(d)->ev_fpacked[1], &(d)->ev_fxfer[0],          \
   &(d)->ev_fxfer[1]}

#define CU(call, what)                                                     \
  do {                                                                     \
    cudaError_t cu_e_ = (call);                                            \
    if (cu_e_ != cudaSuccess) {                                            \
      r = rs_cuda_error(cu_e_, what, p->rank);                             \
      goto fail;                                                           \
    }                                                                      \
  } while (0)

/* setup.c */
void device_free(reshard_plan_t *p);
int dir_rounds(const rs_msg *m, size_t n);
uint64_t count_dir(const rs_msg *m, size_t n, const size_t *round, int nr, const rs_copy *copies,
                   uint64_t *start, uint64_t *fstart, uint64_t base);
void build_dir(const rs_msg *m, size_t n, const size_t *round, const rs_copy *copies, uint32_t desc_base,
               const uint64_t *start, rs_tile *tiles);
reshard_result_t device_prepare_local(reshard_plan_t *p);

/* execute.c */
reshard_result_t device_execute(const reshard_plan_t *plan, rs_exec_call *c);

/* table.c */
int table_changed(const reshard_plan_t *p, const rs_dev *d, void *const *src, size_t nsrc, void *const *dst,
                  size_t ndst);
reshard_result_t switch_table(const reshard_plan_t *p, rs_dev *d, void *const *src, size_t nsrc,
                              void *const *dst, size_t ndst, int64_t deadline);

/* verdict.c */
reshard_result_t agreement_verdict(const reshard_plan_t *p, rs_dev *d);
void dev_failed(const reshard_plan_t *p, rs_dev *d, reshard_result_t r, uint64_t call, uint64_t version);
reshard_result_t device_refuse(const reshard_plan_t *plan, int explicit_version, uint64_t version_in,
                               reshard_result_t r);

/* poll.c */
cudaError_t poll_done(cudaStream_t s, cudaEvent_t e, int64_t deadline);
int streams_idle(rs_dev *d, int64_t deadline);
int64_t work_deadline(rs_dev *d);
void commit_poll(const reshard_plan_t *p, rs_dev *d);
void device_poll(const reshard_plan_t *p);

/* capture.c */
int in_capture(const rs_dev *d);
void CUDART_CB graph_launched(void *arg);
void CUDART_CB graph_landed(void *arg);
cudaError_t record_lasting(cudaEvent_t e, cudaStream_t s, int captured);

/* peers.c */
reshard_result_t device_prepare_peers(reshard_plan_t *p);

#endif
