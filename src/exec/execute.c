/* The host executor: replays a plan over any host transport, walking
 * the schedule (exec/schedule.h) that the device executor enqueues:
 * packing round k+1, transferring round k and unpacking round k-1
 * overlap with two staging halves per direction, local copies run while
 * round 0 is in flight, relay forwards (rs_msg.fwd) leave two rounds after
 * their data landed. Here a step runs when the walk reaches it; the sends
 * and receives a transfer posts complete later, its receives one by one
 * in the unpack that needs them, its sends when a step needs their
 * staging half (host_wait).
 *
 * Around the rounds: the per-execute agreement with every partner first
 * (agree.c), and, with RESHARD_FLAG_DOUBLE_BUFFER, a commit agreement of
 * all ranks last. RESHARD_FLAG_VERIFY adds a checksum message per
 * message (verify.c). A call that fails after its agreement started
 * leaves the plan failed (state.c). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"
#include "common/clock.h"
#include "common/debug.h"
#include "common/error.h"
#include "exec/exec_state.h"
#include "exec/host.h"
#include "exec/schedule.h"
#include "kernels/rs_agree.h"
#include "plan/plan.h"
#include "plan/quant.h"
#include "plan/spread.h"
#include "transport/transport.h"

typedef struct exec_state {
  const reshard_plan_t *plan;
  reshard_comm_t *comm;
  void *const *src;
  void *const *dst;
  unsigned char *send_stage[2], *recv_stage[2];
  rs_request **sreq[2], **rreq[2];
  size_t nsreq[2], nrreq[2];
  unsigned char *in_place[2]; /* per receive: landed in its buffers */
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
} exec_state;

/* How often a wait looks at the partners' statuses. */
#define RS_STATUS_POLL_NS 2000000

/* Waits for *slot until the deadline, looking at the partners' statuses
 * every RS_STATUS_POLL_NS, so that a partner that failed its agreement
 * (and will send nothing) ends the wait with RESHARD_ERROR_REMOTE. The
 * slot is cleared when the request completed (and was freed); after a
 * timeout or REMOTE it stays for cancel_all. */
static reshard_result_t wait_slot(exec_state *st, rs_request **slot) {
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

static reshard_result_t check_buffers(const reshard_plan_t *p,
                                      const char *side, void *const *bufs,
                                      size_t n, int expected,
                                      const rs_used_buffer *used,
                                      int nused) {
  if (nused == 0) {
    if (bufs && n != (size_t)expected && n != 0)
      return rs_error(RESHARD_ERROR_INVALID_USAGE, "execute rank %d: %zu %s buffers given, the layout has %d",
                      p->rank, n, side, expected);
    return RESHARD_SUCCESS;
  }
  if (!bufs || n != (size_t)expected)
    return rs_error(RESHARD_ERROR_INVALID_USAGE, "execute rank %d: %s buffers: %zu given (%s), the layout has %d",
                    p->rank, side, n, bufs ? "array" : "NULL", expected);
  for (int i = 0; i < nused; i++)
    if (!bufs[used[i].id] && used[i].bytes)
      return rs_error(RESHARD_ERROR_INVALID_ARGUMENT, "execute rank %d: %s buffer %d '%s' (%llu bytes) is NULL",
                      p->rank, side, used[i].id, used[i].name, (unsigned long long)used[i].bytes);
  return RESHARD_SUCCESS;
}

static void cancel_all(exec_state *st) {
  for (int h = 0; h < 2; h++) {
    for (size_t i = 0; i < st->nsreq[h]; i++) {
      if (st->sreq[h][i]) st->comm->ops->cancel(st->comm, st->sreq[h][i]);
      if (st->verify && st->vsreq[h][i]) st->comm->ops->cancel(st->comm, st->vsreq[h][i]);
    }
    for (size_t i = 0; i < st->nrreq[h]; i++) {
      if (st->rreq[h][i]) st->comm->ops->cancel(st->comm, st->rreq[h][i]);
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

static reshard_result_t sum_mismatch(const reshard_plan_t *p, const rs_vbox *v, const char *from, int peer,
                                     uint64_t got, uint64_t want) {
  char box[256];
  rs_vbox_format(v, box, sizeof box);
  return rs_error(RESHARD_ERROR_MISMATCH,
                  "execute rank %d: verify: tensor '%s' box %s %s rank %d: checksum %016llx of the elements here, "
                  "%016llx at the source (corrupted or misplaced data)",
                  p->rank, p->vtensors[v->tensor].name, box, from, peer, (unsigned long long)got,
                  (unsigned long long)want);
}

/* Local copies, then (verify mode) their checks. */
static reshard_result_t run_local(exec_state *st) {
  const reshard_plan_t *p = st->plan;
  for (size_t i = 0; i < p->nlocal_copies; i++) {
    const rs_copy *cp = &p->local_copies[i];
    rs_copy_run(cp, st->src[cp->src_buf], st->dst[cp->dst_buf]);
    if (!st->verify) continue;
    const rs_vbox *v = &p->local_vbox[i];
    const rs_vtensor *t = &p->vtensors[v->tensor];
    uint64_t want = rs_box_sum(cp, 0, st->src[cp->src_buf], v, t);
    uint64_t got = rs_box_sum(cp, 1, st->dst[cp->dst_buf], v, t);
    if (got != want) return sum_mismatch(p, v, "copied locally on", p->rank, got, want);
  }
  return RESHARD_SUCCESS;
}

/* Posts one receive: into its buffers when the message is one run of
 * them (direct) or the transport takes boxes, else into staging. */
static reshard_result_t post_recv(exec_state *st, const rs_msg *m, int h, uint64_t tag, size_t slot_i) {
  const reshard_plan_t *p = st->plan;
  rs_request **slot = &st->rreq[h][slot_i];
  const rs_copy *cps = &p->recv_copies[m->first_copy];
  unsigned char *at = st->recv_stage[h] + m->staging_off;
  st->in_place[h][slot_i] = 1;
  if (m->direct) {
    at = (unsigned char *)st->dst[cps->dst_buf] + cps->dst_off;
  } else if (st->comm->ops->irecv_boxes) {
    reshard_result_t r = st->comm->ops->irecv_boxes(st->comm, m->peer, tag, cps, m->ncopies, st->dst, m->bytes, slot);
    if (r == RESHARD_SUCCESS) return r;
    if (r != RESHARD_ERROR_UNSUPPORTED) return r;
  }
  st->in_place[h][slot_i] = m->direct;
  return st->comm->ops->irecv(st->comm, m->peer, tag, at, m->bytes, slot);
}

/* The buffers a send's copies read: forwards (relay) read the destination
 * buffers. */
static void *const *send_bases(const exec_state *st, const rs_msg *m) { return m->fwd ? st->dst : st->src; }

/* Posts one send: from its buffer (direct), as boxes, or packed. */
static reshard_result_t post_send(exec_state *st, const rs_msg *m, int h, uint64_t tag, rs_request **slot) {
  const reshard_plan_t *p = st->plan;
  const unsigned char *at = st->send_stage[h] + m->staging_off;
  if (m->direct) {
    const rs_copy *cp = &p->send_copies[m->first_copy];
    at = (const unsigned char *)send_bases(st, m)[cp->src_buf] + cp->src_off;
  } else {
    if (st->comm->ops->isend_boxes) {
      reshard_result_t r = st->comm->ops->isend_boxes(st->comm, m->peer, tag, &p->send_copies[m->first_copy],
                                                      m->ncopies, send_bases(st, m), m->bytes, slot);
      if (r != RESHARD_ERROR_UNSUPPORTED) return r;
    }
    for (uint32_t c = 0; c < m->ncopies; c++) {
      const rs_copy *cp = &p->send_copies[m->first_copy + c];
      rs_copy_run(cp, send_bases(st, m)[cp->src_buf], st->send_stage[h]);
    }
  }
  return st->comm->ops->isend(st->comm, m->peer, tag, at, m->bytes, slot);
}

/* Posts round k (RS_STEP_XFER): its transfers in the schedule's order,
 * each send packed as it is posted (so that packing overlaps the sends
 * already out: the host's PACK step is this). In verify mode each message
 * is followed by its box sums (transports keep per-tag order; MPI's tags
 * ignore the round). */
static reshard_result_t post_round(exec_state *st, int k) {
  const reshard_plan_t *p = st->plan;
  int h = k & 1;
  uint64_t tag = st->tag | (uint64_t)k;
  size_t n = rs_sched_xfers(p, k, st->verify, st->xfers);
  for (size_t i = 0; i < n; i++) {
    const rs_xfer *x = &st->xfers[i];
    const rs_msg *m = x->m;
    if (x->recv && !x->sums) {
      size_t si = st->nrreq[h]++;
      st->rreq[h][si] = NULL;
      if (st->verify) st->vrreq[h][si] = NULL;
      RS_CHECK(post_recv(st, m, h, tag, si));
    } else if (x->recv) {
      RS_CHECK(st->comm->ops->irecv(st->comm, m->peer, tag | RS_TAG_VERIFY, st->recv_sums + m->first_copy,
                                    (size_t)m->ncopies * sizeof(uint64_t), &st->vrreq[h][st->nrreq[h] - 1]));
    } else if (!x->sums) {
      size_t si = st->nsreq[h]++;
      st->sreq[h][si] = NULL;
      if (st->verify) st->vsreq[h][si] = NULL;
      RS_CHECK(post_send(st, m, h, tag, &st->sreq[h][si]));
    } else {
      uint64_t *sums = st->send_sums + m->first_copy;
      sum_copies(p, &p->send_copies[m->first_copy], &p->send_vbox[m->first_copy], m->ncopies, 0, send_bases(st, m),
                 sums);
      RS_CHECK(st->comm->ops->isend(st->comm, m->peer, tag | RS_TAG_VERIFY, sums,
                                    (size_t)m->ncopies * sizeof(uint64_t), &st->vsreq[h][st->nsreq[h] - 1]));
    }
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
    if (got != st->recv_sums[ci]) return sum_mismatch(p, v, "received from", m->peer, got, st->recv_sums[ci]);
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
  rs_sched_round_msgs(p, k, 1, &first);
  for (size_t i = 0; i < st->nrreq[h]; i++) {
    const rs_msg *m = &p->recvs[first + i];
    reshard_result_t r = wait_slot(st, &st->rreq[h][i]);
    if (r != RESHARD_SUCCESS) {
      rs_error_prefix("execute rank %d round %d (receive from rank %d): ", p->rank, k, m->peer);
      return r;
    }
    st->rreq[h][i] = NULL;
    if (!st->in_place[h][i]) /* else it landed in its buffers */
      for (uint32_t c = 0; c < m->ncopies; c++) {
        const rs_copy *cp = &p->recv_copies[m->first_copy + c];
        rs_copy_run(cp, st->recv_stage[h], st->dst[cp->dst_buf]);
      }
    if (st->verify) RS_CHECK(check_sums(st, m, h, i, k));
  }
  st->nrreq[h] = 0;
  return RESHARD_SUCCESS;
}

/* The host's way of waiting for a transfer to have sent: its sends, and
 * those of the rounds before it, complete (their staging half is free). */
static reshard_result_t complete_sends(exec_state *st, int through) {
  for (; st->sent_upto <= through; st->sent_upto++) {
    int k = st->sent_upto, h = k & 1;
    for (size_t i = 0; i < st->nsreq[h]; i++) {
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
  if (dep.on.kind != RS_STEP_XFER || dep.need == RS_NEED_RECEIVED) return RESHARD_SUCCESS;
  return complete_sends(st, dep.on.round);
}

/* The agreement (RS_STEP_AGREE): a failure that fails the plan is
 * recorded at once, so that the plan's next call is refused rather than
 * meeting this call's leftover control messages. */
static reshard_result_t host_agree(exec_state *st) {
  const reshard_plan_t *p = st->plan;
  reshard_result_t r = rs_agree_begin(p, st->call, st->version, st->deadline, RESHARD_SUCCESS, &st->agree);
  if (rs_result_fails_plan(r)) rs_plan_mark_failed(p, st->call, st->version, r, reshard_last_error());
  return r;
}

/* The schedule's steps on the host. PACK is done by XFER, which packs
 * each send as it posts it; CHECK has nothing left to run once its waits
 * completed the sends: the agreement's end and the commit follow the
 * walk in run_call, on every path (a failed call joins them too). */
static reshard_result_t host_run(void *ctx, rs_step step) {
  exec_state *st = ctx;
  switch (step.kind) {
  case RS_STEP_AGREE:
    return host_agree(st);
  case RS_STEP_XFER:
    return post_round(st, step.round);
  case RS_STEP_LOCAL:
    return run_local(st);
  case RS_STEP_UNPACK:
    return unpack_round(st, step.round);
  case RS_STEP_PACK:
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
  reshard_plan_t *mut = (reshard_plan_t *)plan;
  const int dbuf = (plan->opts.flags & RESHARD_FLAG_DOUBLE_BUFFER) != 0;
  const int64_t deadline = rs_deadline_after_ms(plan->opts.timeout_ms);
  const uint64_t call = __atomic_fetch_add(&mut->exec_calls, 1, __ATOMIC_RELAXED);
  uint64_t version = 0;
  rs_agree *agree = NULL;
  version = rs_plan_take_version(plan, explicit_version, version_in);
  rs_error(why, "%s", msg); /* what the header carries */
  reshard_result_t r = rs_agree_begin(plan, call, version, deadline, why, &agree);
  if (rs_agree_sent(agree) || dbuf) snprintf(full, sizeof full, "%s (its partners were told)", msg);
  rs_plan_mark_failed(plan, call, version, why, full);
  r = rs_agree_end(agree, r, deadline);
  if (dbuf) commit(plan, deadline, why, call, version, -1);
  return rs_error(why, "%s", full);
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
  size_t stage = (size_t)(2 * (plan->send_half + plan->recv_half));
  size_t nreq = 2 * plan->max_round_msgs; /* two halves, sends + receives */
  size_t nxf = rs_sched_max_xfers(plan, verify);
  size_t need = nreq * sizeof(rs_request *) + nxf * sizeof(rs_xfer) + nreq;
  size_t vneed = verify ? nreq * sizeof(rs_request *) + (plan->nsend_copies + plan->nrecv_copies) * sizeof(uint64_t) : 0;
  reshard_plan_t *mut = (reshard_plan_t *)plan; /* the staging cache only */
  void *block = rs_malloc(need ? need : 1), *vblock = NULL;
  if (mut->staging_cache_bytes < stage) {
    rs_bulk_free(mut->staging_cache);
    mut->staging_cache = rs_bulk_malloc(stage);
    mut->staging_cache_bytes = mut->staging_cache ? stage : 0;
  }
  void *sblock = mut->staging_cache;
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
  unsigned char *b = sblock;
  st.send_stage[0] = b;
  st.send_stage[1] = b ? b + plan->send_half : NULL;
  st.recv_stage[0] = b ? b + 2 * plan->send_half : NULL;
  st.recv_stage[1] = b ? b + 2 * plan->send_half + plan->recv_half : NULL;
  rs_request **reqs = block;
  st.xfers = (rs_xfer *)(reqs + nreq);
  /* max_round_msgs bounds sends + receives of one round, so each half's
   * sends and receives share one slice of it */
  size_t per = plan->max_round_msgs;
  st.sreq[0] = reqs;
  st.rreq[0] = reqs + plan->max_round_sends;
  st.sreq[1] = reqs + per;
  st.rreq[1] = reqs + per + plan->max_round_sends;
  st.in_place[0] = (unsigned char *)(st.xfers + nxf);
  st.in_place[1] = st.in_place[0] + per;
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
  uint64_t call = __atomic_fetch_add(&mut->exec_calls, 1, __ATOMIC_RELAXED);
  uint64_t version = 0;
  int target = 0;
  if (dbuf) {
    int active = __atomic_load_n(&plan->active_copy, __ATOMIC_ACQUIRE);
    target = active < 0 ? 0 : 1 - active;
  }
  st.dst = dst_copies[target];
  st.tag = plan->tag_base | (call & RS_TAG_EPOCH_MASK) << 48;
  st.call = call;
  /* the schedule (exec/schedule.h), from the agreement on */
  version = st.version = rs_plan_take_version(plan, explicit_version, version_in);
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

/* The sizes of every buffer the plan uses, against the layout's. */
static reshard_result_t check_sizes(const reshard_plan_t *p, const char *side, const size_t *bytes, void *const *bufs,
                                    size_t n, size_t base, const rs_used_buffer *used, int nused) {
  for (int i = 0; bytes && i < nused; i++) {
    size_t k = base + (size_t)used[i].id;
    if (k >= n || !bufs[k]) continue; /* the count and NULL checks say why */
    if (bytes[k] < used[i].bytes)
      return rs_error(RESHARD_ERROR_INVALID_ARGUMENT,
                      "execute rank %d: %s buffer %d '%s' is %zu bytes, the layout needs %llu on this rank", p->rank,
                      side, used[i].id, used[i].name, bytes[k], (unsigned long long)used[i].bytes);
  }
  return RESHARD_SUCCESS;
}

/* Destination memory written twice: two buffers (or a buffer's two
 * copies) whose byte ranges, as large as the layout says on this rank,
 * overlap would each overwrite the other with a clean status. Sorted by
 * address, an overlapping pair always has an overlapping neighbour. */
typedef struct dst_span {
  uintptr_t lo, hi;
  int id, copy;
  const char *name;
} dst_span;

static int cmp_span(const void *a, const void *b) {
  const dst_span *x = a, *y = b; /* ties: copy 0 first, then by id (a stable message) */
  if (x->lo != y->lo) return x->lo < y->lo ? -1 : 1;
  if (x->copy != y->copy) return x->copy - y->copy;
  return x->id - y->id;
}

static reshard_result_t check_dst_overlap(const reshard_plan_t *p, void *const *bufs, size_t nd, int copies) {
  if (!bufs || p->ndst_used < 1 || (p->ndst_used < 2 && copies < 2)) return RESHARD_SUCCESS;
  dst_span *s = rs_malloc((size_t)p->ndst_used * (size_t)copies * sizeof *s);
  if (!s) return rs_error(RESHARD_ERROR_OUT_OF_MEMORY, "execute rank %d: out of memory checking buffers", p->rank);
  size_t n = 0;
  for (int c = 0; c < copies; c++)
    for (int i = 0; i < p->ndst_used; i++) {
      const rs_used_buffer *u = &p->dst_used[i];
      void *b = bufs[(size_t)c * nd + (size_t)u->id];
      if (b && u->bytes) s[n++] = (dst_span){(uintptr_t)b, (uintptr_t)b + u->bytes, u->id, c, u->name};
    }
  if (n > 1) qsort(s, n, sizeof *s, cmp_span);
  reshard_result_t r = RESHARD_SUCCESS;
  for (size_t i = 0; i + 1 < n && !r; i++)
    if (s[i + 1].lo < s[i].hi) {
      char a[32] = "", b[32] = "";
      if (copies > 1) snprintf(a, sizeof a, " copy %d", s[i].copy), snprintf(b, sizeof b, " copy %d", s[i + 1].copy);
      r = rs_error(RESHARD_ERROR_INVALID_ARGUMENT,
                   "execute rank %d: destination buffers %d '%s'%s and %d '%s'%s share memory (bytes %llu .. %llu of "
                   "the first, as large as the layout makes them): each would overwrite the other",
                   p->rank, s[i].id, s[i].name, a, s[i + 1].id, s[i + 1].name, b,
                   (unsigned long long)(s[i + 1].lo - s[i].lo),
                   (unsigned long long)((s[i + 1].hi < s[i].hi ? s[i + 1].hi : s[i].hi) - s[i].lo));
    }
  free(s);
  return r;
}

/* What execute checks of its arguments before anything moves. */
static reshard_result_t check_args(const reshard_plan_t *plan, void *const *src_buffers, size_t num_src,
                                   const size_t *src_bytes, void *const *dst_buffers, size_t num_dst,
                                   const size_t *dst_bytes, void *stream) {
  const int dbuf = (plan->opts.flags & RESHARD_FLAG_DOUBLE_BUFFER) != 0;
  if (stream && !plan->executor->stream_ordered)
    return rs_error(RESHARD_ERROR_INVALID_ARGUMENT, "execute rank %d: stream must be NULL on the %s transport",
                    plan->rank, plan->comm->ops->name);
  RS_CHECK(check_buffers(plan, "source", src_buffers, num_src, plan->num_src_buffers, plan->src_used, plan->nsrc_used));
  RS_CHECK(check_sizes(plan, "source", src_bytes, src_buffers, num_src, 0, plan->src_used, plan->nsrc_used));
  const size_t nd = (size_t)plan->num_dst_buffers;
  if (dbuf) {
    if (plan->ndst_used && (!dst_buffers || num_dst != 2 * nd))
      return rs_error(RESHARD_ERROR_INVALID_USAGE,
                      "execute rank %d: destination buffers: %zu given (%s); RESHARD_FLAG_DOUBLE_BUFFER needs 2 x %zu "
                      "(copy 0 of every buffer, then copy 1)",
                      plan->rank, dst_buffers ? num_dst : 0, dst_buffers ? "array" : "NULL", nd);
    if (plan->ndst_used) {
      RS_CHECK(check_buffers(plan, "destination (copy 0)", dst_buffers, nd, plan->num_dst_buffers, plan->dst_used,
                             plan->ndst_used));
      RS_CHECK(check_buffers(plan, "destination (copy 1)", dst_buffers + nd, nd, plan->num_dst_buffers,
                             plan->dst_used, plan->ndst_used));
      RS_CHECK(check_sizes(plan, "destination (copy 0)", dst_bytes, dst_buffers, num_dst, 0, plan->dst_used,
                           plan->ndst_used));
      RS_CHECK(check_sizes(plan, "destination (copy 1)", dst_bytes, dst_buffers, num_dst, nd, plan->dst_used,
                           plan->ndst_used));
    } else if (dst_buffers && num_dst != 0 && num_dst != 2 * nd) {
      return rs_error(RESHARD_ERROR_INVALID_USAGE,
                      "execute rank %d: %zu destination buffers given, RESHARD_FLAG_DOUBLE_BUFFER needs 2 x %zu or none",
                      plan->rank, num_dst, nd);
    }
  } else {
    RS_CHECK(check_buffers(plan, "destination", dst_buffers, num_dst, plan->num_dst_buffers, plan->dst_used,
                           plan->ndst_used));
    RS_CHECK(check_sizes(plan, "destination", dst_bytes, dst_buffers, num_dst, 0, plan->dst_used, plan->ndst_used));
  }
  if (plan->ndst_used) RS_CHECK(check_dst_overlap(plan, dst_buffers, nd, dbuf ? 2 : 1));
  return RESHARD_SUCCESS;
}

/* rejected: an error the caller already found (and set), or SUCCESS for
 * execute to check the arguments itself. */
reshard_result_t rs_execute_call(const reshard_plan_t *plan, int explicit_version, uint64_t version_in,
                                 void *const *src_buffers, size_t num_src, const size_t *src_bytes,
                                 void *const *dst_buffers, size_t num_dst, const size_t *dst_bytes, void *stream,
                                 reshard_result_t rejected) {
  if (!rejected) rs_error_clear();
  if (!plan) return rs_error(RESHARD_ERROR_INVALID_ARGUMENT, "execute: plan is NULL");
  RS_CHECK(rs_plan_refuse_if_failed(plan));
  const rs_executor *ex = plan->executor;
  reshard_result_t r =
      rejected ? rejected
               : check_args(plan, src_buffers, num_src, src_bytes, dst_buffers, num_dst, dst_bytes, stream);
  /* Nothing moves, but the partners must hear of it (or be kept from
   * pairing with this call): the executor's refuse. */
  if (r != RESHARD_SUCCESS) return ex->refuse ? ex->refuse(plan, explicit_version, version_in, r) : r;
  /* copy 1 exists only where the rank passed both copies (a rank without
   * destination buffers may pass none) */
  const int dbuf = !ex->stream_ordered && (plan->opts.flags & RESHARD_FLAG_DOUBLE_BUFFER) != 0;
  const size_t nd = (size_t)plan->num_dst_buffers;
  rs_exec_call c = {.explicit_version = explicit_version,
                    .version_in = version_in,
                    .src = src_buffers,
                    .nsrc = num_src,
                    .dst = dst_buffers,
                    .ndst = num_dst,
                    .copies = {dst_buffers, dbuf && dst_buffers && num_dst == 2 * nd ? dst_buffers + nd : dst_buffers},
                    .stream = stream};
  r = ex->execute(plan, &c);
  if (r != RESHARD_SUCCESS && rs_result_fails_plan(r)) {
    char why[640];
    snprintf(why, sizeof why, "%s", reshard_last_error());
    rs_plan_mark_failed(plan, c.call, c.version, r, why);
  }
  return r;
}

/* The host executor's execute: the call's agreement, then its rounds
 * (run_call); with double buffering the copy it wrote becomes the active
 * one. */
static reshard_result_t host_execute(const reshard_plan_t *plan, rs_exec_call *c) {
  int target = 0;
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

const rs_executor rs_host_executor = {
    .name = "host",
    .execute = host_execute,
    .refuse = host_refuse,
};

/* A version this rank left in doubt is settled before the next call
 * runs (within the call's deadline): rolled forward, the call goes on;
 * rolled back, the plan failed like everywhere else and the call is
 * refused; still unknown, the call is refused with
 * RESHARD_ERROR_IN_DOUBT and the plan is failed (reshard_plan_resolve
 * can still settle it). */
static reshard_result_t settle_first(const reshard_plan_t *plan, reshard_result_t rejected) {
  char own[640] = "";
  if (rejected) snprintf(own, sizeof own, "%s", reshard_last_error());
  reshard_result_t r = rs_plan_settle(plan, rs_deadline_after_ms(plan->opts.timeout_ms));
  if (r == RESHARD_ERROR_IN_DOUBT) {
    char why[700];
    snprintf(why, sizeof why, "%s", reshard_last_error());
    rs_plan_mark_failed(plan, plan->doubt_call, __atomic_load_n(&plan->doubt_version, __ATOMIC_ACQUIRE), r, why);
    return rs_error(r, "execute rank %d: refused: %s", plan->rank, why);
  }
  if (r != RESHARD_SUCCESS) return r;
  if (rejected) rs_error(rejected, "%s", own); /* the caller's own rejection comes next */
  else rs_error_clear();
  return RESHARD_SUCCESS;
}

static reshard_result_t execute(const reshard_plan_t *plan, int explicit_version, uint64_t version_in,
                                void *const *src_buffers, size_t num_src, const size_t *src_bytes,
                                void *const *dst_buffers, size_t num_dst, const size_t *dst_bytes, void *stream,
                                reshard_result_t rejected) {
  if (!plan) return rs_execute_call(plan, 0, 0, NULL, 0, NULL, NULL, 0, NULL, stream, rejected);
  /* counted, so that a destroy on another thread waits for this call to
   * return instead of freeing the plan under it */
  reshard_plan_t *mut = (reshard_plan_t *)plan;
  __atomic_fetch_add(&mut->in_use, 1, __ATOMIC_ACQ_REL);
  reshard_result_t r;
  /* One call of a plan at a time: a second one, from another thread of
   * this rank, would pair with the partners' calls in whatever order the
   * threads happened to run (the data of one step landing in the
   * buffers of another). Refused, changing nothing: the running call is
   * not disturbed and the plan stays as it was. */
  if (__atomic_exchange_n(&mut->busy, 1, __ATOMIC_ACQUIRE)) {
    __atomic_fetch_sub(&mut->in_use, 1, __ATOMIC_ACQ_REL);
    return rs_error(RESHARD_ERROR_INVALID_USAGE,
                    "execute rank %d: another call of this plan is running on this rank (another thread?); calls "
                    "of one plan must not overlap: nothing done, the running call goes on",
                    plan->rank);
  }
  if (__atomic_load_n(&plan->doubt_version, __ATOMIC_ACQUIRE) && (r = settle_first(plan, rejected)) != RESHARD_SUCCESS)
    ; /* still in doubt, or settled by rolling back: nothing runs */
  else if (plan->quant)
    r = rs_quant_execute(plan, explicit_version, version_in, src_buffers, num_src, src_bytes, dst_buffers, num_dst,
                         dst_bytes, stream, rejected);
  else if (plan->spread)
    r = rs_spread_execute(plan, explicit_version, version_in, src_buffers, num_src, src_bytes, dst_buffers, num_dst,
                          dst_bytes, stream, rejected);
  else
    r = rs_execute_call(plan, explicit_version, version_in, src_buffers, num_src, src_bytes, dst_buffers, num_dst,
                        dst_bytes, stream, rejected);
  __atomic_store_n(&mut->busy, 0, __ATOMIC_RELEASE);
  __atomic_fetch_sub(&mut->in_use, 1, __ATOMIC_ACQ_REL);
  return r;
}

reshard_result_t reshard_plan_execute(const reshard_plan_t *plan, void *const *src_buffers, size_t num_src,
                                      void *const *dst_buffers, size_t num_dst, void *stream) {
  return execute(plan, 0, 0, src_buffers, num_src, NULL, dst_buffers, num_dst, NULL, stream, RESHARD_SUCCESS);
}

reshard_result_t reshard_plan_execute_version(const reshard_plan_t *plan, uint64_t version,
                                              void *const *src_buffers, size_t num_src, void *const *dst_buffers,
                                              size_t num_dst, void *stream) {
  return execute(plan, 1, version, src_buffers, num_src, NULL, dst_buffers, num_dst, NULL, stream,
                 RESHARD_SUCCESS);
}

reshard_result_t reshard_plan_execute_sized(const reshard_plan_t *plan, uint64_t version, const reshard_buffer_t *src,
                                            size_t num_src, const reshard_buffer_t *dst, size_t num_dst,
                                            void *stream) {
  rs_error_clear();
  if (!plan) return rs_error(RESHARD_ERROR_INVALID_ARGUMENT, "execute: plan is NULL");
  /* The counts before the arrays: an entry is read only where the count
   * is one the layout can have (the caller's source count, the
   * destination count or twice it with copies), so a count larger than
   * the array is refused, not read past, and no size below wraps. The
   * refusal takes its turn in the agreement like execute's own. */
  const size_t us = plan->quant    ? (size_t)plan->quant->user_nsrc
                    : plan->spread ? (size_t)plan->spread->user_nsrc
                                   : (size_t)plan->num_src_buffers;
  const size_t ud = (size_t)plan->num_dst_buffers;
  if ((src && num_src && num_src != us) || (dst && num_dst && num_dst != ud && num_dst != 2 * ud)) {
    reshard_result_t bad = rs_error(RESHARD_ERROR_INVALID_USAGE,
                                    "execute rank %d: %zu source and %zu destination buffers given, the layout has %zu "
                                    "and %zu (2 x %zu with RESHARD_FLAG_DOUBLE_BUFFER); no entry was read",
                                    plan->rank, num_src, num_dst, us, ud, ud);
    return execute(plan, version != 0, version, NULL, 0, NULL, NULL, 0, NULL, stream, bad);
  }
  /* NULL arrays go on as NULL pointer arrays, for execute's own checks
   * (accepted where this rank has no buffers on that side); running out of
   * memory for the copies is a rejection execute tells the partners of */
  const size_t n = num_src + num_dst;
  void **ptrs = rs_malloc((n + 1) * sizeof *ptrs);
  size_t *bytes = rs_malloc((n + 1) * sizeof *bytes);
  reshard_result_t rejected = RESHARD_SUCCESS;
  if (!ptrs || !bytes) {
    rejected = rs_error(RESHARD_ERROR_OUT_OF_MEMORY, "execute rank %d: out of memory for %zu buffer entries",
                        plan->rank, n);
  } else {
    for (size_t i = 0; src && i < num_src; i++) ptrs[i] = src[i].ptr, bytes[i] = src[i].bytes;
    for (size_t i = 0; dst && i < num_dst; i++) ptrs[num_src + i] = dst[i].ptr, bytes[num_src + i] = dst[i].bytes;
  }
  reshard_result_t r = execute(plan, version != 0, version, src && ptrs ? ptrs : NULL, num_src, bytes,
                               dst && ptrs ? ptrs + num_src : NULL, num_dst, bytes ? bytes + num_src : NULL, stream,
                               rejected);
  free(ptrs);
  free(bytes);
  return r;
}

reshard_result_t reshard_plan_execute_refused(const reshard_plan_t *plan, uint64_t version, reshard_result_t why,
                                              const char *reason) {
  rs_error_clear();
  if (!plan) return rs_error(RESHARD_ERROR_INVALID_ARGUMENT, "execute_refused: plan is NULL");
  if (why == RESHARD_SUCCESS) why = RESHARD_ERROR_INVALID_ARGUMENT;
  reshard_result_t rejected =
      rs_error(why, "%s", reason && *reason ? reason : "execute refused by the caller (no reason given)");
  return execute(plan, version != 0, version, NULL, 0, NULL, NULL, 0, NULL, NULL, rejected);
}

reshard_result_t reshard_plan_register_buffers(reshard_plan_t *plan, void *const *src, size_t nsrc,
                                               void *const *dst, size_t ndst) {
  rs_error_clear();
  if (!plan) return rs_error(RESHARD_ERROR_INVALID_ARGUMENT, "register_buffers: plan is NULL");
  if (!plan->executor->register_buffers) return rs_register_unsupported(plan);
  if (plan->quant) return rs_quant_register(plan, src, nsrc, dst, ndst);
  return plan->executor->register_buffers(plan, src, nsrc, dst, ndst);
}
