/* The device executor's execute path: one call enqueued on the plan's
 * streams (device_execute -> enqueue_call -> enqueue), the schedule's steps
 * as launches and transfer groups (dev_run, dev_wait, the rounds), and the
 * direct rounds of registered buffers. The overview of the three streams
 * and their events is in device_internal.h. */
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
  c.ssums = (uint64_t *)rs_staging_split(p, pool, c.send_half, c.recv_half); /* the sums follow the halves */
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
  case RS_STEP_FPACK:
    return d->ev_fpacked[s.round & 1];
  case RS_STEP_FXFER:
    return d->ev_fxfer[s.round & 1];
  case RS_STEP_CHECK:
    break;
  }
  return NULL;
}

/* A round's group's ticket slot (rs_dev.xfer_ticket): its forwards'
 * group (FXFER) beside its other messages' (XFER). */
static int ticket_slot(int round, int forwards) { return (2 * round + forwards) & 7; }

/* The schedule's waits on the device: a lane is a stream, so a step
 * waits for one on another lane through the event behind it (a
 * transfer's sending and receiving are one group: one event). */
static reshard_result_t dev_wait(void *ctx, rs_step step, rs_dep dep) {
  dev_call *c = ctx;
  const reshard_plan_t *p = c->p;
  const rs_stream_ops *so = p->comm->ops->stream_ops;
  /* a host-driven transport's transfer: its messages first (stream.h
   * group_async) */
  if ((dep.on.kind == RS_STEP_XFER || dep.on.kind == RS_STEP_FXFER) && so->settle && !c->d->reg)
    RS_CHECK(so->settle(p->comm, c->d->xfer_ticket[ticket_slot(dep.on.round, dep.on.kind == RS_STEP_FXFER)],
                        c->deadline));
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
  /* a composite plan inherits its earlier stages' failures (this call's
   * or an earlier one's): a quantizing plan's codes would come from
   * blocks half gathered, a spreading plan would send scratch half
   * copied. Each stage's verdict, where it has one (a stage without
   * partners has none: the ones before it are asked directly). */
  int e = 0;
  for (const reshard_plan_t *q = p->after; q && !e; q = q->after) {
    const rs_dev *pd = q->device;
    if (pd && pd->d_agree) e = rs_cuda_agree_absorb(pd->d_agree, mine, d->d_agree, s);
  }
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

/* Round k's pack (staging: its sends but its forwards, or with fwd its
 * forwards) or unpack (registered buffers: nothing, the receivers copy
 * straight from the senders), and verify's sums of it. */
static reshard_result_t dev_pack(dev_call *c, int k, int unpack, int fwd) {
  const reshard_plan_t *p = c->p;
  rs_dev *d = c->d;
  const uint64_t *start = unpack ? d->unpack_start : d->pack_start;
  const uint64_t lo = fwd ? d->fpack_start[k] : start[k], hi = unpack || fwd ? start[k + 1] : d->fpack_start[k];
  int h = k & 1;
  unsigned char *half = unpack ? c->recv_half[h] : c->send_half[h];
  if (!d->reg)
    RS_CHECK(launch(p, d, lo, hi, half, unpack ? S_UNPACK : S_PACK, unpack ? GATE_DST : GATE_STAGING,
                    unpack ? "unpack launch" : "pack launch"));
  /* (with registered buffers the receivers sum this rank's sources
   * themselves: direct_round) */
  if (!d->verify || (d->reg && !unpack)) return RESHARD_SUCCESS;
  /* (sums of what landed: d_rmine) */
  return unpack ? verify_sums(p, d, lo, hi, 1, d->d_rmine, (uint32_t)p->nsend_copies, S_UNPACK)
                : verify_sums(p, d, lo, hi, 0, c->ssums, 0, S_PACK);
}

/* Round k's transfers of `part` (XFER: all but its forwards, FXFER: its
 * forwards): one group in the schedule's posting order (or, with
 * registered buffers, the whole round as the direct round, at XFER). */
static reshard_result_t dev_xfer(dev_call *c, int k, rs_xfer_part part) {
  const reshard_plan_t *p = c->p;
  rs_dev *d = c->d;
  const rs_stream_ops *so = p->comm->ops->stream_ops;
  int h = k & 1;
  if (d->reg && part == RS_XFER_FWD) return RESHARD_SUCCESS;
  size_t n = rs_sched_xfers(p, k, d->verify, d->reg ? RS_XFER_ALL : part, d->xfers);
  for (size_t i = 0; i < n; i++) {
    const rs_xfer *x = &d->xfers[i];
    const rs_msg *m = x->m;
    void *buf = x->sums ? (void *)((x->recv ? c->rsums : c->ssums) + m->first_copy)
                        : (void *)((x->recv ? c->recv_half[h] : c->send_half[h]) + m->staging_off);
    d->p2p[i] = (rs_p2p){m->peer, x->recv, buf, x->sums ? 8 * (uint64_t)m->ncopies : m->bytes};
  }
  if (d->reg) return direct_round(p, d, k, n, c->deadline, c->rsums);
  if (so->group_async)
    return so->group_async(p->comm, d->p2p, n, d->s[S_XFER], c->deadline, d->d_agree,
                           &d->xfer_ticket[ticket_slot(k, part == RS_XFER_FWD)]);
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
    r = dev_pack(c, step.round, 0, 0);
    break;
  case RS_STEP_FPACK:
    r = dev_pack(c, step.round, 0, 1);
    break;
  case RS_STEP_LOCAL:
    r = dev_local(c);
    break;
  case RS_STEP_XFER:
    r = dev_xfer(c, step.round, RS_XFER_PLAIN);
    break;
  case RS_STEP_FXFER:
    r = dev_xfer(c, step.round, RS_XFER_FWD);
    break;
  case RS_STEP_UNPACK:
    r = dev_pack(c, step.round, 1, 0);
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
  if (captured) CU(cudaLaunchHostFunc(d->s[S_PACK], graph_launched, d), "cudaLaunchHostFunc(launch start)");

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
   * table (the caller's sources first, as in every stage); the pre-plan
   * that gathered split blocks ran before (begin). In the first stage
   * that reads the codes: the main plan, or its spreading pre-plan. */
  if (p->quantize_first)
    RS_CHECK_GOTO(rs_device_quantize(p->quantize_first, call_tab(d), d->s[S_PACK], p->rank), r, fail);

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
    CU(cudaLaunchHostFunc(caller, graph_landed, d), "cudaLaunchHostFunc(launch end)");
    d->tab_pinned |= 1u << d->tab_cur;
  }
  RS_CHECK_GOTO(rs_dev_comm_end(p->comm, caller, deadline), r, fail);
  return RESHARD_SUCCESS;
fail:
  return r;
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
  if ((r = rs_plan_refuse_if_failed(p, "execute")) != RESHARD_SUCCESS) { /* (failed by a poll meanwhile) */
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
  if (r == RESHARD_SUCCESS && d->reg) r = rs_direct_check_bufs(p, d->reg, d->nreg, src, nsrc, dst, ndst);
  if (r != RESHARD_SUCCESS)
    ;
  else if (captured < 0)
    r = rs_error(RESHARD_ERROR_INVALID_USAGE, "execute rank %d: the caller's stream is in a CUDA graph capture that "
                 "was invalidated (by an earlier call); end it and capture again", p->rank);
  else if (captured && !so->graphs)
    r = rs_error(RESHARD_ERROR_UNSUPPORTED, "execute rank %d: the %s transport cannot be captured into a CUDA graph "
                 "(its transfers are driven by the host, which a launch does not run); "
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
  if (r != RESHARD_SUCCESS) dev_failed(p, d, r, call, version);
  pthread_mutex_unlock(&d->mu);
  return r;
}

/* execute: stream-ordered, so no host agreement; the call is numbered
 * and its version recorded when the work is enqueued. */
reshard_result_t device_execute(const reshard_plan_t *plan, rs_exec_call *c) {
  reshard_plan_t *mut = (reshard_plan_t *)plan;
  rs_plan_take_call(plan, c->explicit_version, c->version_in, &c->call, &c->version);
  RS_CHECK(enqueue_call(plan, c->src, c->nsrc, c->dst, c->ndst, c->stream, c->call, c->version));
  if (plan->opts.flags & RESHARD_FLAG_DOUBLE_BUFFER)
    __atomic_fetch_add(&mut->completed, 1, __ATOMIC_ACQ_REL); /* the commit is the GPU's: device_poll reads it */
  else
    rs_plan_record_success(plan, c->version);
  return RESHARD_SUCCESS;
}
