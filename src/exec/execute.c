/* The host executor: replays a plan over any host transport, walking
 * the schedule (exec/schedule.h) that the device executor enqueues:
 * packing round k+1, transferring round k and unpacking round k-1
 * overlap with two staging halves per direction, local copies run while
 * round 0 is in flight, a round's relay forwards (rs_msg.fwd) are posted
 * apart from its other messages, once the round before (which brought
 * their data) is unpacked. Here a step runs when the walk reaches it; the sends
 * and receives a transfer posts complete later, its receives one by one
 * in the unpack that needs them, its sends when a step needs their
 * staging half (host_wait).
 *
 * Around the rounds: the per-execute agreement with every partner first
 * (agree.c), and, with RESHARD_FLAG_DOUBLE_BUFFER, a commit agreement of
 * all ranks last. The agreement's headers are posted first but checked
 * only before anything lands in this rank's destination buffers
 * (host_check), so round 0's sends leave right behind them and its
 * receives land in staging (large messages split into a staged head and
 * a tail received in place after the check: rs_sched_head_bytes): the header's
 * round trip overlaps the data instead of preceding it. RESHARD_FLAG_VERIFY adds a checksum message per
 * message (verify.c). A call that fails after its agreement started
 * leaves the plan failed (state.c). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"
#include "common/clock.h"
#include "common/debug.h"
#include "common/error.h"
#include "exec/direct.h"
#include "exec/exec_state.h"
#include "exec/register.h"
#include "exec/host.h"
#include "exec/schedule.h"
#include "kernels/rs_agree.h"
#include "plan/plan.h"
#include "transport/transport.h"

typedef struct exec_state {
  const reshard_plan_t *plan;
  reshard_comm_t *comm;
  void *const *src;
  void *const *dst;
  unsigned char *send_stage[2], *recv_stage[2];
  rs_request **sreq[2], **rreq[2];
  /* Round 0's split messages (rs_sched_head_bytes): the head's request,
   * beside the message's slot (NULL when the message is not split). */
  rs_request **hsreq[2], **hrreq[2];
  size_t nsreq[2], nrreq[2];
  /* per receive: how it lands (RS_LAND_*) */
  unsigned char *in_place[2];
  /* Round 0's posting before the check (post_round): per receive
   * transfer, whether it waits for the check; per rank, whether one of
   * its receives does (so that its later ones wait too). */
  size_t *xslot; /* per transfer: its request slot */
  unsigned char *xdefer, *blocked;
  int64_t deadline;
  uint64_t tag;
  /* Verify mode: request slots parallel to sreq/rreq, the senders' box
   * sums (per send copy) and what arrived (per receive copy). */
  int verify;
  rs_request **vsreq[2], **vrreq[2];
  uint64_t *send_sums, *recv_sums;
  /* The agreement's status exchange, polled while waiting (NULL without
   * partners). */
  rs_agree *agree;
  uint64_t call, version;
  rs_xfer *xfers;  /* one round's transfers (rs_sched_xfers) */
  int sent_upto;   /* the rounds before it have completed their sends */
  /* Registered buffers (exec/register.h; NULL: staged): each round reads
   * its boxes from the senders' buffers (direct_round). token: what the
   * tokens carry outside verify mode (nothing: 0 bytes). */
  const rs_host_reg *reg;
  uint64_t token;
} exec_state;

/* How often a wait looks at the partners' statuses. */
#define RS_STATUS_POLL_NS 2000000

/* Waits for *slot until the deadline, looking at the partners' statuses
 * every RS_STATUS_POLL_NS, so that a partner that failed its agreement
 * (and will send nothing) ends the wait with RESHARD_ERROR_REMOTE. The
 * slot is cleared when the request completed (and was freed); after a
 * timeout or REMOTE it stays for cancel_all. */
static reshard_result_t wait_slot(exec_state *st, rs_request **slot) {
  /* a request that completed meanwhile (most of a round's, by the time
   * the first one did) costs one poll, not a clock read as well */
  int done = 0;
  reshard_result_t r0 = st->comm->ops->test(st->comm, *slot, &done);
  if (done) {
    *slot = NULL;
    return r0;
  }
  for (;;) {
    int64_t until = st->deadline;
    int last = 1;
    if (st->agree) {
      int64_t now = rs_now_ns();
      if (st->deadline - now > RS_STATUS_POLL_NS) {
        until = now + RS_STATUS_POLL_NS;
        last = 0;
      }
    }
    reshard_result_t r = st->comm->ops->wait(st->comm, *slot, until);
    if (r != RESHARD_ERROR_TIMEOUT) {
      *slot = NULL;
      return r;
    }
    if (last) return r;
    RS_CHECK(rs_agree_poll(st->agree));
  }
}

static void cancel_all(exec_state *st) {
  for (int h = 0; h < 2; h++) {
    for (size_t i = 0; i < st->nsreq[h]; i++) {
      if (st->sreq[h][i]) st->comm->ops->cancel(st->comm, st->sreq[h][i]);
      if (st->hsreq[h][i]) st->comm->ops->cancel(st->comm, st->hsreq[h][i]);
      if (st->verify && st->vsreq[h][i]) st->comm->ops->cancel(st->comm, st->vsreq[h][i]);
    }
    for (size_t i = 0; i < st->nrreq[h]; i++) {
      if (st->rreq[h][i]) st->comm->ops->cancel(st->comm, st->rreq[h][i]);
      if (st->hrreq[h][i]) st->comm->ops->cancel(st->comm, st->hrreq[h][i]);
      if (st->verify && st->vrreq[h][i]) st->comm->ops->cancel(st->comm, st->vrreq[h][i]);
    }
    st->nsreq[h] = st->nrreq[h] = 0;
  }
}

/* Verify mode: the box sums of a message's copies on one side. */
static void sum_copies(const reshard_plan_t *p, const rs_copy *cps, const rs_vbox *vb, uint32_t n, int dst_side,
                       void *const *bases, uint64_t *out) {
  for (uint32_t c = 0; c < n; c++) {
    const rs_copy *cp = &cps[c];
    const void *base = bases[dst_side ? cp->dst_buf : cp->src_buf];
    out[c] = rs_box_sum(cp, dst_side, base, &vb[c], &p->vtensors[vb[c].tensor]);
  }
}

/* The agreement's check (agree.c): the partners' headers compared, the
 * statuses posted; once per call. Everything that writes this rank's
 * destination buffers runs after it (local copies, unpacks, receives that
 * land in place), so that a partner at another plan, call or version
 * changes nothing here: its data can only have reached staging. A failure
 * that fails the plan is recorded at once, so that the plan's next call
 * is refused rather than meeting this call's leftover control messages. */
static reshard_result_t host_check(exec_state *st) {
  if (rs_agree_checked(st->agree)) return RESHARD_SUCCESS; /* (a failed check ended the walk) */
  reshard_result_t r = rs_agree_check(st->agree, st->deadline);
  if (rs_result_fails_plan(r)) rs_plan_mark_failed(st->plan, st->call, st->version, r, reshard_last_error());
  return r;
}

/* Local copies, then (verify mode) their checks. */
static reshard_result_t run_local(exec_state *st) {
  const reshard_plan_t *p = st->plan;
  RS_CHECK(host_check(st));
  for (size_t i = 0; i < p->nlocal_copies; i++) {
    const rs_copy *cp = &p->local_copies[i];
    rs_copy_run(cp, st->src[cp->src_buf], st->dst[cp->dst_buf]);
    if (!st->verify) continue;
    const rs_vbox *v = &p->local_vbox[i];
    const rs_vtensor *t = &p->vtensors[v->tensor];
    uint64_t want = rs_box_sum(cp, 0, st->src[cp->src_buf], v, t);
    uint64_t got = rs_box_sum(cp, 1, st->dst[cp->dst_buf], v, t);
    if (got != want) return rs_verdict_verify(p, "", v, 0, p->rank, got, want, "");
  }
  return RESHARD_SUCCESS;
}

/* Round 0's split (rs_sched_head_bytes). A receive that lands in this
 * rank's destination buffers must wait for the agreement's check
 * (host_check), so in round 0, which is posted before it, such a receive
 * would start only once the partners' headers arrived: one header
 * latency and a poll behind MPI_Alltoallw (issue 44). A split message's
 * head lands in staging at once, and its tail, received in place once
 * the check passed, follows while the heads keep the link busy. What is
 * staged is bounded by the heads (the copy a host pays); what a partner
 * at another call or version can reach before the check is staging
 * only. The split depends on the message's round and size alone, never
 * on either end's transport or settings.
 *
 * How a receive lands: in staging (unpacked by its copies), in place
 * (nothing to do), or split with its tail in place (the head's bytes are
 * copied from staging). */
enum { RS_LAND_STAGED = 0, RS_LAND_IN_PLACE = 1, RS_LAND_HEAD_STAGED = 2 };

/* Posts one receive, or what of it may be posted before the agreement's
 * check (early): into its buffers when the message is one run of them
 * (direct) or the transport takes boxes, else into staging. Early,
 * nothing lands in place: an unsplit message lands in staging (a round-0
 * message under 16 KiB: a small copy), a split one posts its head
 * and, if its tail would land in place, leaves the tail for after the
 * check (*later). */
static reshard_result_t post_recv(exec_state *st, const rs_msg *m, int h, uint64_t tag, size_t slot_i, int early,
                                  int *later) {
  const reshard_plan_t *p = st->plan;
  const rs_transport_ops *ops = st->comm->ops;
  rs_request **slot = &st->rreq[h][slot_i];
  const rs_copy *cps = &p->recv_copies[m->first_copy];
  unsigned char *stage = st->recv_stage[h] + m->staging_off;
  const uint64_t head = rs_sched_head_bytes(m);
  *later = 0;
  if (head) {
    if (!st->hrreq[h][slot_i]) RS_CHECK(ops->irecv(st->comm, m->peer, tag, stage, head, &st->hrreq[h][slot_i]));
    if (!m->direct) { /* (a transport's boxes cannot take a part of a message) */
      st->in_place[h][slot_i] = RS_LAND_STAGED;
      return ops->irecv(st->comm, m->peer, tag, stage + head, m->bytes - head, slot);
    }
    st->in_place[h][slot_i] = RS_LAND_HEAD_STAGED;
    if (early) {
      *later = 1;
      return RESHARD_SUCCESS;
    }
    unsigned char *at = (unsigned char *)st->dst[cps->dst_buf] + cps->dst_off;
    return ops->irecv(st->comm, m->peer, tag, at + head, m->bytes - head, slot);
  }
  st->in_place[h][slot_i] = RS_LAND_STAGED;
  if (early) return ops->irecv(st->comm, m->peer, tag, stage, m->bytes, slot);
  st->in_place[h][slot_i] = RS_LAND_IN_PLACE;
  if (m->direct) {
    unsigned char *at = (unsigned char *)st->dst[cps->dst_buf] + cps->dst_off;
    return ops->irecv(st->comm, m->peer, tag, at, m->bytes, slot);
  }
  if (ops->irecv_boxes) {
    reshard_result_t r = ops->irecv_boxes(st->comm, m->peer, tag, cps, m->ncopies, st->dst, m->bytes, slot);
    if (r != RESHARD_ERROR_UNSUPPORTED) return r;
  }
  st->in_place[h][slot_i] = RS_LAND_STAGED;
  return ops->irecv(st->comm, m->peer, tag, stage, m->bytes, slot);
}

/* The buffers a send's copies read: forwards (relay) read the destination
 * buffers. */
static void *const *send_bases(const exec_state *st, const rs_msg *m) { return m->fwd ? st->dst : st->src; }

/* Posts one send: from its buffer (direct), as boxes, or packed; a split
 * one (rs_sched_head_bytes) as its head, then its tail. */
static reshard_result_t post_send(exec_state *st, const rs_msg *m, int h, uint64_t tag, size_t slot_i) {
  const reshard_plan_t *p = st->plan;
  const rs_transport_ops *ops = st->comm->ops;
  rs_request **slot = &st->sreq[h][slot_i];
  const unsigned char *at = st->send_stage[h] + m->staging_off;
  const uint64_t head = rs_sched_head_bytes(m);
  if (m->direct) {
    const rs_copy *cp = &p->send_copies[m->first_copy];
    at = (const unsigned char *)send_bases(st, m)[cp->src_buf] + cp->src_off;
  } else {
    if (ops->isend_boxes && !head) {
      reshard_result_t r = ops->isend_boxes(st->comm, m->peer, tag, &p->send_copies[m->first_copy], m->ncopies,
                                            send_bases(st, m), m->bytes, slot);
      if (r != RESHARD_ERROR_UNSUPPORTED) return r;
    }
    for (uint32_t c = 0; c < m->ncopies; c++) {
      const rs_copy *cp = &p->send_copies[m->first_copy + c];
      rs_copy_run(cp, send_bases(st, m)[cp->src_buf], st->send_stage[h]);
    }
  }
  if (head) RS_CHECK(ops->isend(st->comm, m->peer, tag, at, head, &st->hsreq[h][slot_i]));
  return ops->isend(st->comm, m->peer, tag, at + head, m->bytes - head, slot);
}

/* Posts one transfer of round k (an rs_xfer) into request slot si: a
 * message, or in verify mode its box sums, which follow it (transports
 * keep per-tag order; MPI's tags ignore the round). Each send is packed
 * as it is posted, so that packing overlaps the sends already out: the
 * host's PACK step is this. early, *later: post_recv's. */
static reshard_result_t post_xfer(exec_state *st, const rs_xfer *x, int h, uint64_t tag, size_t si, int early,
                                  int *later) {
  const reshard_plan_t *p = st->plan;
  const rs_msg *m = x->m;
  *later = 0;
  if (x->recv && !x->sums) return post_recv(st, m, h, tag, si, early, later);
  if (x->recv)
    return st->comm->ops->irecv(st->comm, m->peer, tag | RS_TAG_VERIFY, st->recv_sums + m->first_copy,
                                (size_t)m->ncopies * sizeof(uint64_t), &st->vrreq[h][si]);
  if (!x->sums) return post_send(st, m, h, tag, si);
  uint64_t *sums = st->send_sums + m->first_copy;
  sum_copies(p, &p->send_copies[m->first_copy], &p->send_vbox[m->first_copy], m->ncopies, 0, send_bases(st, m), sums);
  return st->comm->ops->isend(st->comm, m->peer, tag | RS_TAG_VERIFY, sums, (size_t)m->ncopies * sizeof(uint64_t),
                              &st->vsreq[h][si]);
}

/* The request slot of transfer x: a message takes the next of its
 * direction (cleared), its sums the one of the message they follow. */
static size_t take_slot(exec_state *st, const rs_xfer *x, int h) {
  size_t *n = x->recv ? &st->nrreq[h] : &st->nsreq[h];
  if (x->sums) return *n - 1;
  size_t si = (*n)++;
  rs_request **req = x->recv ? st->rreq[h] : st->sreq[h], **head = x->recv ? st->hrreq[h] : st->hsreq[h];
  req[si] = head[si] = NULL;
  if (st->verify) (x->recv ? st->vrreq[h] : st->vsreq[h])[si] = NULL;
  return si;
}

/* Posts round k's transfers of `part` (RS_STEP_XFER: the round's
 * messages but its forwards; RS_STEP_FXFER: the forwards) in the
 * schedule's order, receives first. Round 0 is posted before the agreement's check
 * (host_check): its sends leave at once, and its receives land in
 * staging (post_recv), only unpacked after the check. What would land in
 * place (a split message's tail) waits for the check, and so does every
 * later receive from the same rank, so that a peer's messages keep their
 * order: then the round checks and posts those. */
static reshard_result_t post_round(exec_state *st, int k, rs_xfer_part part) {
  int h = k & 1;
  uint64_t tag = st->tag | (uint64_t)k;
  size_t n = rs_sched_xfers(st->plan, k, st->verify, part, st->xfers);
  const int early = !rs_agree_checked(st->agree);
  int any = 0;
  for (size_t i = 0; i < n; i++) {
    const rs_xfer *x = &st->xfers[i];
    int later = 0;
    st->xslot[i] = take_slot(st, x, h);
    st->xdefer[i] = 0;
    if (x->recv && early && st->blocked[x->m->peer]) later = 1;
    else RS_CHECK(post_xfer(st, x, h, tag, st->xslot[i], early, &later));
    if (later) st->xdefer[i] = st->blocked[x->m->peer] = 1;
    any |= later;
  }
  if (!any) return RESHARD_SUCCESS;
  RS_CHECK(host_check(st));
  for (size_t i = 0; i < n; i++) {
    if (!st->xdefer[i]) continue;
    int later = 0;
    st->blocked[st->xfers[i].m->peer] = 0;
    RS_CHECK(post_xfer(st, &st->xfers[i], h, tag, st->xslot[i], 0, &later));
  }
  return RESHARD_SUCCESS;
}

/* Verify mode: the box sums a sender shipped for message m, against
 * the elements that landed here. */
static reshard_result_t check_sums(exec_state *st, const rs_msg *m, int h, size_t i, int k) {
  const reshard_plan_t *p = st->plan;
  reshard_result_t r = wait_slot(st, &st->vrreq[h][i]);
  if (r != RESHARD_SUCCESS) {
    rs_error_prefix("execute rank %d round %d (verify: receive checksums from rank %d): ", p->rank, k, m->peer);
    return r;
  }
  for (uint32_t c = 0; c < m->ncopies; c++) {
    size_t ci = m->first_copy + c;
    const rs_copy *cp = &p->recv_copies[ci];
    const rs_vbox *v = &p->recv_vbox[ci];
    uint64_t got = rs_box_sum(cp, 1, st->dst[cp->dst_buf], v, &p->vtensors[v->tensor]);
    if (got != st->recv_sums[ci]) return rs_verdict_verify(p, "", v, 1, m->peer, got, st->recv_sums[ci], "");
  }
  return RESHARD_SUCCESS;
}

static reshard_result_t wait_send(exec_state *st, rs_request **slot, int k, const char *what) {
  if (!*slot) return RESHARD_SUCCESS;
  reshard_result_t r = wait_slot(st, slot);
  if (r != RESHARD_SUCCESS) rs_error_prefix("execute rank %d round %d (%s): ", st->plan->rank, k, what);
  return r;
}

/* Unpacks round k (RS_STEP_UNPACK): each message as it arrives. */
static reshard_result_t unpack_round(exec_state *st, int k) {
  const reshard_plan_t *p = st->plan;
  int h = k & 1;
  size_t first = 0;
  RS_CHECK(host_check(st)); /* (LOCAL ran it: nothing is unpacked before) */
  rs_sched_round_msgs(p, k, 1, &first);
  for (size_t i = 0; i < st->nrreq[h]; i++) {
    const rs_msg *m = &p->recvs[first + i];
    reshard_result_t r = st->hrreq[h][i] ? wait_slot(st, &st->hrreq[h][i]) : RESHARD_SUCCESS;
    if (r == RESHARD_SUCCESS) r = wait_slot(st, &st->rreq[h][i]);
    if (r != RESHARD_SUCCESS) {
      rs_error_prefix("execute rank %d round %d (receive from rank %d): ", p->rank, k, m->peer);
      return r;
    }
    st->rreq[h][i] = NULL;
    const rs_copy *cps = &p->recv_copies[m->first_copy];
    if (st->in_place[h][i] == RS_LAND_STAGED)
      for (uint32_t c = 0; c < m->ncopies; c++) rs_copy_run(&cps[c], st->recv_stage[h], st->dst[cps[c].dst_buf]);
    else if (st->in_place[h][i] == RS_LAND_HEAD_STAGED) /* a direct message: one run */
      memcpy((unsigned char *)st->dst[cps->dst_buf] + cps->dst_off, st->recv_stage[h] + m->staging_off,
             rs_sched_head_bytes(m));
    if (st->verify) RS_CHECK(check_sums(st, m, h, i, k));
  }
  st->nrreq[h] = 0;
  return RESHARD_SUCCESS;
}

/* Registered buffers: a box of many short runs whose source is one dense
 * span is read whole into the receive staging where its message would
 * have landed (the sender's pack order is its memory order there), then
 * unpacked by its receive copy: one read instead of one per run (a
 * transpose's rows of a few KiB: a system call each over shared memory). */
static int read_staged(const rs_copy *cp) {
  if (cp->run_bytes >= RS_DIRECT_SHORT_RUN || cp->ndim == 0) return 0;
  return rs_direct_src_end(cp) - cp->src_off == rs_copy_bytes(cp);
}

/* Reads box ci of round k (its composed copy, exec/register.h) from its
 * sender's buffer into this rank's destination, one read per contiguous
 * run, or whole into staging (read_staged). */
static reshard_result_t read_box(exec_state *st, size_t ci, int k) {
  const rs_copy *cp = &st->reg->copies[ci];
  if (read_staged(cp))
    return st->comm->ops->rma_get(st->comm, st->reg->set, (size_t)cp->src_buf, cp->src_off,
                                  st->recv_stage[k & 1] + st->plan->recv_copies[ci].src_off, rs_copy_bytes(cp));
  int64_t idx[RS_COPY_MAX_DIMS] = {0};
  unsigned char *dst = (unsigned char *)st->dst[cp->dst_buf] + cp->dst_off;
  for (;;) {
    uint64_t so = cp->src_off;
    unsigned char *d = dst;
    for (int i = 0; i < cp->ndim; i++) so += (uint64_t)(idx[i] * cp->src_stride[i]), d += idx[i] * cp->dst_stride[i];
    RS_CHECK(st->comm->ops->rma_get(st->comm, st->reg->set, (size_t)cp->src_buf, so, d, cp->run_bytes));
    int i = cp->ndim - 1;
    for (; i >= 0 && ++idx[i] == cp->extent[i]; i--) idx[i] = 0;
    if (i < 0) return RESHARD_SUCCESS;
  }
}

/* Posts a token of round k's message m: "ready" (sender to receiver; in
 * verify mode the message's box sums) or "done" (receiver to sender). */
static reshard_result_t post_token(exec_state *st, const rs_msg *m, int k, int done, int recv, rs_request **slot) {
  const rs_transport_ops *ops = st->comm->ops;
  const uint64_t tag = st->tag | (uint64_t)k | (done ? RS_TAG_DONE : RS_TAG_READY);
  const int sums = st->verify && !done;
  const size_t bytes = sums ? (size_t)m->ncopies * sizeof(uint64_t) : 0;
  if (recv) return ops->irecv(st->comm, m->peer, tag, sums ? (void *)(st->recv_sums + m->first_copy) : &st->token,
                              bytes, slot);
  uint64_t *s = sums ? st->send_sums + m->first_copy : &st->token;
  if (sums)
    sum_copies(st->plan, &st->plan->send_copies[m->first_copy], &st->plan->send_vbox[m->first_copy], m->ncopies, 0,
               send_bases(st, m), s);
  /* a message this rank packs (rs_host_packs) is packed before its data
   * is said to be ready */
  if (!done && st->reg->spacked[m - st->plan->sends])
    for (uint32_t c = 0; c < m->ncopies; c++) {
      const rs_copy *cp = &st->plan->send_copies[m->first_copy + c];
      rs_copy_run(cp, send_bases(st, m)[cp->src_buf], st->send_stage[k & 1]);
    }
  return ops->isend(st->comm, m->peer, tag, s, bytes, slot);
}

/* Waits for round k's requests rq[0..n) (messages msgs[first..]). */
static reshard_result_t wait_tokens(exec_state *st, rs_request **rq, const rs_msg *msgs, size_t n, int k,
                                    const char *what) {
  for (size_t i = 0; i < n; i++) {
    reshard_result_t r = rq[i] ? wait_slot(st, &rq[i]) : RESHARD_SUCCESS;
    if (r != RESHARD_SUCCESS) {
      rs_error_prefix("execute rank %d round %d (registered buffers: %s rank %d): ", st->plan->rank, k, what,
                      msgs[i].peer);
      return r;
    }
  }
  return RESHARD_SUCCESS;
}

/* Round k with registered buffers (RS_STEP_XFER; nothing is packed or
 * unpacked): once the agreement's check passed, a "ready" token from
 * each sender of the round says its data may be read (sources from the
 * call's start; a relay forward's once it landed, in an earlier round
 * of the forwarder's, each of which returns only once its reads
 * landed); this rank
 * reads its boxes, waits until they all landed (the transport's
 * rma_flush), checks them in verify mode (the sums rode on the ready
 * tokens), and sends each sender "done", so that no sender's call
 * returns (and lets its caller change its buffers) while a partner may
 * still read them. As on CUDA IPC (src/device/execute.c, direct_round). */
static reshard_result_t direct_round(exec_state *st, int k) {
  const reshard_plan_t *p = st->plan;
  size_t rf = 0, sf = 0;
  const size_t nr = rs_sched_round_msgs(p, k, 1, &rf), ns = rs_sched_round_msgs(p, k, 0, &sf);
  rs_request **rq = st->rreq[0], **sq = st->sreq[0];
  RS_CHECK(host_check(st));
  /* (cancel_all sees these slots on a failure) */
  for (size_t i = 0; i < nr; i++) rq[i] = st->hrreq[0][i] = NULL, st->verify ? (void)(st->vrreq[0][i] = NULL) : (void)0;
  for (size_t i = 0; i < ns; i++) sq[i] = st->hsreq[0][i] = NULL, st->verify ? (void)(st->vsreq[0][i] = NULL) : (void)0;
  st->nrreq[0] = nr, st->nsreq[0] = ns;
  for (size_t i = 0; i < nr; i++) RS_CHECK(post_token(st, &p->recvs[rf + i], k, 0, 1, &rq[i]));
  for (size_t i = 0; i < ns; i++) RS_CHECK(post_token(st, &p->sends[sf + i], k, 0, 0, &sq[i]));
  const rs_host_reg *g = st->reg;
  for (size_t i = 0; i < nr; i++) {
    const rs_msg *m = &p->recvs[rf + i];
    RS_CHECK(wait_tokens(st, &rq[i], m, 1, k, "ready from"));
    if (g->rpacked[rf + i]) /* packed by its sender: read whole, in place when it is one run here */
      RS_CHECK(st->comm->ops->rma_get(st->comm, g->set, g->rentry[rf + i], g->roff[rf + i],
                                      m->direct ? (unsigned char *)st->dst[p->recv_copies[m->first_copy].dst_buf] +
                                                      p->recv_copies[m->first_copy].dst_off
                                                : st->recv_stage[k & 1] + m->staging_off,
                                      m->bytes));
    else
      for (uint32_t c = 0; c < m->ncopies; c++) RS_CHECK(read_box(st, m->first_copy + c, k));
  }
  reshard_result_t r = st->comm->ops->rma_flush(st->comm, st->reg->set, st->deadline);
  if (r != RESHARD_SUCCESS) {
    rs_error_prefix("execute rank %d round %d (registered buffers: reads): ", p->rank, k);
    return r;
  }
  for (size_t i = 0; i < nr; i++) {
    const rs_msg *m = &p->recvs[rf + i];
    for (size_t ci = m->first_copy; ci < m->first_copy + m->ncopies; ci++)
      if ((g->rpacked[rf + i] && !m->direct) || (!g->rpacked[rf + i] && read_staged(&g->copies[ci])))
        rs_copy_run(&p->recv_copies[ci], st->recv_stage[k & 1], st->dst[p->recv_copies[ci].dst_buf]);
  }
  for (size_t i = 0; st->verify && i < nr; i++) {
    const rs_msg *m = &p->recvs[rf + i];
    for (uint32_t c = 0; c < m->ncopies; c++) {
      const size_t ci = m->first_copy + c;
      const rs_copy *cp = &p->recv_copies[ci];
      const rs_vbox *v = &p->recv_vbox[ci];
      uint64_t got = rs_box_sum(cp, 1, st->dst[cp->dst_buf], v, &p->vtensors[v->tensor]);
      if (got != st->recv_sums[ci]) return rs_verdict_verify(p, "", v, 1, m->peer, got, st->recv_sums[ci], "");
    }
  }
  RS_CHECK(wait_tokens(st, sq, &p->sends[sf], ns, k, "ready to"));
  for (size_t i = 0; i < ns; i++) RS_CHECK(post_token(st, &p->sends[sf + i], k, 1, 1, &sq[i]));
  for (size_t i = 0; i < nr; i++) RS_CHECK(post_token(st, &p->recvs[rf + i], k, 1, 0, &rq[i]));
  RS_CHECK(wait_tokens(st, rq, &p->recvs[rf], nr, k, "done to"));
  RS_CHECK(wait_tokens(st, sq, &p->sends[sf], ns, k, "done from"));
  st->nrreq[0] = st->nsreq[0] = 0;
  return RESHARD_SUCCESS;
}

/* The host's way of waiting for a transfer to have sent: its sends, and
 * those of the rounds before it, complete (their staging half is free). */
static reshard_result_t complete_sends(exec_state *st, int through) {
  for (; st->sent_upto <= through; st->sent_upto++) {
    int k = st->sent_upto, h = k & 1;
    for (size_t i = 0; i < st->nsreq[h]; i++) {
      RS_CHECK(wait_send(st, &st->hsreq[h][i], k, "send"));
      RS_CHECK(wait_send(st, &st->sreq[h][i], k, "send"));
      if (st->verify) RS_CHECK(wait_send(st, &st->vsreq[h][i], k, "verify: send checksums"));
    }
    st->nsreq[h] = 0;
  }
  return RESHARD_SUCCESS;
}

/* The schedule's waits on the host: every step but a transfer is done
 * when its run returned. A transfer's receives are waited for one by one
 * by the unpack that needs them, its sends when a step needs their
 * staging half (or the call ends). */
static reshard_result_t host_wait(void *ctx, rs_step step, rs_dep dep) {
  (void)step;
  exec_state *st = ctx;
  /* (a round's forwards, FXFER, share its requests: completing round k's
   * sends completes them too) */
  if ((dep.on.kind != RS_STEP_XFER && dep.on.kind != RS_STEP_FXFER) || dep.need == RS_NEED_RECEIVED)
    return RESHARD_SUCCESS;
  return complete_sends(st, dep.on.round);
}

/* The agreement (RS_STEP_AGREE): on the host, its headers are posted
 * here and checked later (host_check). A failure that fails the plan is
 * recorded at once, as there. */
static reshard_result_t host_agree(exec_state *st) {
  const reshard_plan_t *p = st->plan;
  reshard_result_t r = rs_agree_post(p, st->call, st->version, RESHARD_SUCCESS, &st->agree);
  if (rs_result_fails_plan(r)) rs_plan_mark_failed(p, st->call, st->version, r, reshard_last_error());
  return r;
}

/* The schedule's steps on the host. PACK is done by XFER and FPACK by
 * FXFER, which pack each send as they post it; CHECK has nothing left to run once its waits
 * completed the sends: the agreement's end and the commit follow the
 * walk in run_call, on every path (a failed call joins them too). */
static reshard_result_t host_run(void *ctx, rs_step step) {
  exec_state *st = ctx;
  switch (step.kind) {
  case RS_STEP_AGREE:
    return host_agree(st);
  case RS_STEP_XFER:
    return st->reg ? direct_round(st, step.round) : post_round(st, step.round, RS_XFER_PLAIN);
  case RS_STEP_FXFER: /* (registered buffers: the round's XFER read them) */
    return st->reg ? RESHARD_SUCCESS : post_round(st, step.round, RS_XFER_FWD);
  case RS_STEP_LOCAL:
    return run_local(st);
  case RS_STEP_UNPACK:
    return st->reg ? RESHARD_SUCCESS : unpack_round(st, step.round);
  case RS_STEP_PACK:
  case RS_STEP_FPACK:
  case RS_STEP_CHECK:
    break;
  }
  return RESHARD_SUCCESS;
}

static const rs_sched_ops host_sched = {host_wait, host_run};

/* Double buffering: every rank of the communicator says how its call
 * went, and the copies flip only if all succeeded with the same call and
 * version. The wait is one timeout past the transfer's deadline, so that
 * a rank that gave up at that deadline still arrives in time. A rank that
 * voted success and whose collective then passed the deadline cannot
 * know the outcome where the collective may still complete (MPI): it
 * reports the version in doubt (doubt.c) instead of a failure. target:
 * the copy this call wrote. */
static reshard_result_t commit(const reshard_plan_t *p, int64_t deadline, reshard_result_t r, uint64_t call,
                               uint64_t version, int target) {
  int64_t late = deadline;
  if (deadline != RS_NO_DEADLINE) {
    int64_t more = rs_deadline_after_ms(p->opts.timeout_ms) - rs_now_ns();
    late = more > 0 && deadline < RS_NO_DEADLINE - more ? deadline + more : RS_NO_DEADLINE;
  }
  char msg[1024];
  snprintf(msg, sizeof msg, "%s", reshard_last_error());
  uint64_t v[RS_HOST_COMMIT_WORDS];
  rs_commit_vote((uint64_t)r, version, call, v);
  rs_blame_put(v + RS_COMMIT_WORDS, p->rank, r ? msg : NULL, rs_blame_first_cause(r));
  const rs_transport_ops *ops = p->comm->ops;
  reshard_result_t rr = ops->allreduce_max_u64(p->comm, v, RS_HOST_COMMIT_WORDS, late);
  if (r != RESHARD_SUCCESS) {
    rs_error(r, "%s", msg); /* this rank's own failure is the story */
    return r;
  }
  if (rr == RESHARD_ERROR_TIMEOUT && ops->allreduce_late) {
    char why[512];
    snprintf(why, sizeof why, "%s", reshard_last_error());
    uint64_t ticket = 0;
    int done = 0;
    if (ops->allreduce_late(p->comm, &ticket, v, RS_HOST_COMMIT_WORDS, rs_now_ns(), &done) == RESHARD_SUCCESS) {
      if (!done) return rs_plan_doubt(p, ticket, call, version, target);
      rr = RESHARD_SUCCESS; /* completed meanwhile: v is the outcome */
    } else {
      rs_error(rr, "%s", why);
    }
  }
  if (rr != RESHARD_SUCCESS) {
    rs_error_prefix("execute rank %d (double-buffer commit): ", p->rank);
    return rr;
  }
  const int outcome = rs_commit_outcome(v, version, call);
  if (outcome != RS_COMMIT_OK) {
    char lead[64];
    snprintf(lead, sizeof lead, outcome == RS_COMMIT_FAILED ? "execute rank %d" : "execute rank %d (double-buffer commit)",
             p->rank);
    return rs_commit_refusal(p, v, call, version, outcome, lead);
  }
  return RESHARD_SUCCESS;
}

/* A call this rank rejects (its arguments, its memory) still takes its
 * number and its place in the agreement, carrying the rejection, so that
 * its partners fail at once with RESHARD_ERROR_REMOTE naming it instead of
 * waiting for data until their deadline; with double buffering it joins
 * the commit too, which then fails everywhere. The plan is marked failed
 * (as run_call does). Returns `why` with the rejection's message
 * (the last error when called). */
static reshard_result_t abort_call(const reshard_plan_t *plan, int explicit_version, uint64_t version_in,
                                   reshard_result_t why) {
  char msg[640], full[700];
  snprintf(msg, sizeof msg, "%s", reshard_last_error());
  snprintf(full, sizeof full, "%s", msg);
  const int dbuf = (plan->opts.flags & RESHARD_FLAG_DOUBLE_BUFFER) != 0;
  const int64_t deadline = rs_deadline_after_ms(plan->opts.timeout_ms);
  uint64_t call, version;
  rs_agree *agree = NULL;
  rs_plan_take_call(plan, explicit_version, version_in, &call, &version);
  rs_error(why, "%s", msg); /* what the header carries */
  reshard_result_t r = rs_agree_begin(plan, call, version, deadline, why, &agree);
  if (rs_agree_sent(agree) || dbuf) snprintf(full, sizeof full, "%s (its partners were told)", msg);
  rs_plan_mark_failed(plan, call, version, why, full);
  r = rs_agree_end(agree, r, deadline);
  if (dbuf) commit(plan, deadline, why, call, version, -1);
  return rs_error(why, "%s", full);
}

unsigned char *rs_host_staging(const reshard_plan_t *plan) {
  const size_t stage = rs_staging_bytes(plan);
  reshard_plan_t *mut = (reshard_plan_t *)plan; /* the staging cache only */
  if (mut->staging_cache_bytes < stage) {
    rs_bulk_free(mut->staging_cache);
    mut->staging_cache = rs_bulk_malloc(stage);
    mut->staging_cache_bytes = mut->staging_cache ? stage : 0;
  }
  return mut->staging_cache;
}

/* The call once its arguments passed: staging, agreement, rounds, commit. */
static reshard_result_t run_call(const reshard_plan_t *plan, int explicit_version, uint64_t version_in,
                                 void *const *src_buffers, void *const *const dst_copies[2], uint64_t *version_out,
                                 uint64_t *call_out, int *target_out) {
  const int dbuf = (plan->opts.flags & RESHARD_FLAG_DOUBLE_BUFFER) != 0;
  const int verify = (plan->opts.flags & RESHARD_FLAG_VERIFY) != 0;
  /* Staging (bulk: rs_bulk_malloc, cached in the plan) and the request
   * slots (a small block per call); verify mode adds a second set of
   * slots and the box sums. */
  size_t stage = rs_staging_bytes(plan);
  size_t nreq = 2 * plan->max_round_msgs; /* two halves, sends + receives */
  size_t nxf = rs_sched_max_xfers(plan, verify);
  /* request slots (messages, then split heads), transfers, their slots,
   * landings, deferrals, blocked ranks */
  size_t need = 2 * nreq * sizeof(rs_request *) + nxf * (sizeof(rs_xfer) + sizeof(size_t)) + nreq + nxf +
                (size_t)plan->comm->size;
  size_t vneed = verify ? nreq * sizeof(rs_request *) + (plan->nsend_copies + plan->nrecv_copies) * sizeof(uint64_t) : 0;
  void *block = rs_malloc(need ? need : 1), *vblock = NULL;
  void *sblock = rs_host_staging(plan);
  if (verify) vblock = rs_malloc(vneed ? vneed : 1);
  if (!block || (stage && !sblock) || (verify && !vblock)) {
    free(block);
    free(vblock);
    rs_error(RESHARD_ERROR_OUT_OF_MEMORY, "execute rank %d: cannot allocate %zu bytes of staging", plan->rank,
             stage + need + vneed);
    *target_out = 0;
    if (plan->npeers == 0 && !dbuf) return RESHARD_ERROR_OUT_OF_MEMORY; /* nobody to tell: retry later */
    return abort_call(plan, explicit_version, version_in, RESHARD_ERROR_OUT_OF_MEMORY);
  }
  exec_state st;
  memset(&st, 0, sizeof st);
  st.plan = plan;
  st.comm = plan->comm;
  st.src = src_buffers;
  rs_staging_split(plan, sblock, st.send_stage, st.recv_stage);
  rs_request **reqs = block;
  st.xfers = (rs_xfer *)(reqs + 2 * nreq);
  st.xslot = (size_t *)(st.xfers + nxf);
  /* max_round_msgs bounds sends + receives of one round, so each half's
   * sends and receives share one slice of it */
  size_t per = plan->max_round_msgs;
  st.sreq[0] = reqs;
  st.rreq[0] = reqs + plan->max_round_sends;
  st.sreq[1] = reqs + per;
  st.rreq[1] = reqs + per + plan->max_round_sends;
  for (int h = 0; h < 2; h++) {
    st.hsreq[h] = st.sreq[h] + nreq;
    st.hrreq[h] = st.rreq[h] + nreq;
  }
  st.in_place[0] = (unsigned char *)(st.xslot + nxf);
  st.in_place[1] = st.in_place[0] + per;
  st.xdefer = st.in_place[0] + nreq;
  st.blocked = st.xdefer + nxf;
  memset(st.blocked, 0, (size_t)plan->comm->size);
  if (verify) {
    rs_request **v = vblock;
    st.verify = 1;
    st.vsreq[0] = v;
    st.vrreq[0] = v + plan->max_round_sends;
    st.vsreq[1] = v + per;
    st.vrreq[1] = v + per + plan->max_round_sends;
    st.send_sums = (uint64_t *)(v + nreq);
    st.recv_sums = st.send_sums + plan->nsend_copies;
  }
  st.deadline = rs_deadline_after_ms(plan->opts.timeout_ms);

  /* From here on the call is counted: every path reaches the end. */
  uint64_t call, version;
  rs_plan_take_call(plan, explicit_version, version_in, &call, &version);
  int target = 0;
  if (dbuf) {
    int active = __atomic_load_n(&plan->active_copy, __ATOMIC_ACQUIRE);
    target = active < 0 ? 0 : 1 - active;
  }
  st.dst = dst_copies[target];
  st.reg = plan->host_reg;
  st.tag = plan->tag_base | (call & RS_TAG_EPOCH_MASK) << 48;
  st.call = call;
  /* the schedule (exec/schedule.h), from the agreement on */
  st.version = version;
  reshard_result_t r = rs_sched_run(plan, &host_sched, &st);
  if (r != RESHARD_SUCCESS) cancel_all(&st);
  r = rs_agree_end(st.agree, r, st.deadline);
  if (dbuf) r = commit(plan, st.deadline, r, call, version, target);
  free(block);
  free(vblock);
  *version_out = version;
  *call_out = call;
  *target_out = target;
  return r;
}

/* The host executor's execute: the call's agreement, then its rounds
 * (run_call); with double buffering the copy it wrote becomes the active
 * one. */
static reshard_result_t host_execute(const reshard_plan_t *plan, rs_exec_call *c) {
  int target = 0;
  const rs_host_reg *g = plan->host_reg;
  if (g) {
    reshard_result_t r = rs_direct_check_bufs(plan, g->bufs, g->nbufs, c->src, c->nsrc, c->dst, c->ndst);
    if (r != RESHARD_SUCCESS) return abort_call(plan, c->explicit_version, c->version_in, r);
  }
  RS_CHECK(run_call(plan, c->explicit_version, c->version_in, c->src, c->copies, &c->version, &c->call, &target));
  if (plan->opts.flags & RESHARD_FLAG_DOUBLE_BUFFER)
    __atomic_store_n(&((reshard_plan_t *)plan)->active_copy, target, __ATOMIC_RELEASE);
  rs_plan_record_success(plan, c->version);
  return RESHARD_SUCCESS;
}

/* The host executor's refuse: the call takes its place in the agreement
 * and the plan fails like the partners' (without partners or a commit
 * there is nobody to tell). */
static reshard_result_t host_refuse(const reshard_plan_t *plan, int explicit_version, uint64_t version_in,
                                    reshard_result_t r) {
  if (plan->npeers || (plan->opts.flags & RESHARD_FLAG_DOUBLE_BUFFER))
    r = abort_call(plan, explicit_version, version_in, r);
  return r;
}

static void host_free(reshard_plan_t *plan) { rs_host_reg_free(plan); }

const rs_executor rs_host_executor = {
    .name = "host",
    .execute = host_execute,
    .refuse = host_refuse,
    .register_buffers = rs_host_register,
    .free = host_free,
};
