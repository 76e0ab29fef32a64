/* The executor: replays a plan over any transport.
 *
 * Round k's receives are posted and its messages packed and sent while
 * round k-1's messages are still arriving; round k-1 is unpacked next, so
 * packing, transfer and unpacking overlap with two staging halves per
 * direction. Local copies run while round 0 is in flight.
 *
 * Relay forwards (rs_msg.fwd) send from the destination buffers what this
 * rank received two rounds earlier: a receive of round q has landed in the
 * destination buffers when finish_round(q) returns, in run_rounds'
 * iteration q+1, before start_round(q+2) posts the forward. */
#include <stdlib.h>
#include <string.h>

#include "common/clock.h"
#include "common/debug.h"
#include "common/error.h"
#include "plan/plan.h"
#include "transport/transport.h"
#include "transport/stream.h"

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
} exec_state;

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
                    p->rank, side, bufs ? n : 0, bufs ? "array" : "NULL", expected);
  for (int i = 0; i < nused; i++)
    if (!bufs[used[i].id] && used[i].bytes)
      return rs_error(RESHARD_ERROR_INVALID_ARGUMENT, "execute rank %d: %s buffer %d '%s' (%llu bytes) is NULL",
                      p->rank, side, used[i].id, used[i].name, (unsigned long long)used[i].bytes);
  return RESHARD_SUCCESS;
}

static void cancel_all(exec_state *st) {
  for (int h = 0; h < 2; h++) {
    for (size_t i = 0; i < st->nsreq[h]; i++)
      if (st->sreq[h][i]) st->comm->ops->cancel(st->comm, st->sreq[h][i]);
    for (size_t i = 0; i < st->nrreq[h]; i++)
      if (st->rreq[h][i]) st->comm->ops->cancel(st->comm, st->rreq[h][i]);
    st->nsreq[h] = st->nrreq[h] = 0;
  }
}

static int rounds_of(const rs_msg *m, size_t n) { return n ? m[n - 1].round + 1 : 0; }

/* The buffers a send's copies read. */
static void *const *send_bases(const exec_state *st, const rs_msg *m) { return m->fwd ? st->dst : st->src; }

/* Posts round k: receives first, then packs and sends. */
static reshard_result_t start_round(exec_state *st, int k) {
  const reshard_plan_t *p = st->plan;
  int h = k & 1;
  uint64_t tag = st->tag | (uint64_t)k;
  if (k < rounds_of(p->recvs, p->nrecvs))
    for (size_t i = p->recv_round[k]; i < p->recv_round[k + 1]; i++) {
      const rs_msg *m = &p->recvs[i];
      rs_request **slot = &st->rreq[h][st->nrreq[h]++];
      *slot = NULL;
      unsigned char *at = st->recv_stage[h] + m->staging_off;
      const rs_copy *cps = &p->recv_copies[m->first_copy];
      st->in_place[h][st->nrreq[h] - 1] = 1;
      if (m->direct) {
        at = (unsigned char *)st->dst[cps->dst_buf] + cps->dst_off;
      } else if (st->comm->ops->irecv_boxes) {
        reshard_result_t r = st->comm->ops->irecv_boxes(st->comm, m->peer, tag, cps, m->ncopies, st->dst, m->bytes, slot);
        if (r == RESHARD_SUCCESS) continue;
        if (r != RESHARD_ERROR_UNSUPPORTED) return r;
      }
      st->in_place[h][st->nrreq[h] - 1] = m->direct;
      RS_CHECK(st->comm->ops->irecv(st->comm, m->peer, tag, at, m->bytes, slot));
    }
  if (k < rounds_of(p->sends, p->nsends))
      for (size_t i = p->send_round[k]; i < p->send_round[k + 1]; i++) {
        const rs_msg *m = &p->sends[i];
        const unsigned char *at = st->send_stage[h] + m->staging_off;
        rs_request **slot = &st->sreq[h][st->nsreq[h]++];
        *slot = NULL;
        if (m->direct) {
          const rs_copy *cp = &p->send_copies[m->first_copy];
          at = (const unsigned char *)send_bases(st, m)[cp->src_buf] + cp->src_off;
        } else {
          if (st->comm->ops->isend_boxes) {
            reshard_result_t r = st->comm->ops->isend_boxes(st->comm, m->peer, tag, &p->send_copies[m->first_copy],
                                                            m->ncopies, send_bases(st, m), m->bytes, slot);
            if (r == RESHARD_SUCCESS) continue;
            if (r != RESHARD_ERROR_UNSUPPORTED) return r;
          }
          for (uint32_t c = 0; c < m->ncopies; c++) {
            const rs_copy *cp = &p->send_copies[m->first_copy + c];
            rs_copy_run(cp, send_bases(st, m)[cp->src_buf], st->send_stage[h]);
          }
        }
        RS_CHECK(st->comm->ops->isend(st->comm, m->peer, tag, at, m->bytes, slot));
      }
  return RESHARD_SUCCESS;
}

/* Completes round k: unpacks each message as it arrives, then makes sure
 * the round's sends are done before their staging half is reused. */
static reshard_result_t finish_round(exec_state *st, int k) {
  const reshard_plan_t *p = st->plan;
  int h = k & 1;
  size_t first = 0;
  if (k < rounds_of(p->recvs, p->nrecvs)) first = p->recv_round[k];
  for (size_t i = 0; i < st->nrreq[h]; i++) {
    const rs_msg *m = &p->recvs[first + i];
    reshard_result_t r = st->comm->ops->wait(st->comm, st->rreq[h][i], st->deadline);
    if (r != RESHARD_SUCCESS) {
      if (r != RESHARD_ERROR_TIMEOUT) st->rreq[h][i] = NULL; /* completed with an error: freed */
      rs_error_prefix("execute rank %d round %d (receive from rank %d): ", p->rank, k, m->peer);
      return r;
    }
    st->rreq[h][i] = NULL;
    if (st->in_place[h][i]) continue; /* landed in its buffers */
    for (uint32_t c = 0; c < m->ncopies; c++) {
      const rs_copy *cp = &p->recv_copies[m->first_copy + c];
      rs_copy_run(cp, st->recv_stage[h], st->dst[cp->dst_buf]);
    }
  }
  st->nrreq[h] = 0;
  for (size_t i = 0; i < st->nsreq[h]; i++) {
    reshard_result_t r = st->comm->ops->wait(st->comm, st->sreq[h][i], st->deadline);
    if (r != RESHARD_SUCCESS) {
      if (r != RESHARD_ERROR_TIMEOUT) st->sreq[h][i] = NULL;
      rs_error_prefix("execute rank %d round %d (send): ", p->rank, k);
      return r;
    }
    st->sreq[h][i] = NULL;
  }
  st->nsreq[h] = 0;
  return RESHARD_SUCCESS;
}

static reshard_result_t run_rounds(exec_state *st) {
  const reshard_plan_t *p = st->plan;
  for (int k = 0; k < p->nrounds; k++) {
    RS_CHECK(start_round(st, k));
    if (k == 0)
      for (size_t i = 0; i < p->nlocal_copies; i++) {
        const rs_copy *cp = &p->local_copies[i];
        rs_copy_run(cp, st->src[cp->src_buf], st->dst[cp->dst_buf]);
      }
    if (k > 0) RS_CHECK(finish_round(st, k - 1));
  }
  if (p->nrounds > 0) RS_CHECK(finish_round(st, p->nrounds - 1));
  else
    for (size_t i = 0; i < p->nlocal_copies; i++) {
      const rs_copy *cp = &p->local_copies[i];
      rs_copy_run(cp, st->src[cp->src_buf], st->dst[cp->dst_buf]);
    }
  return RESHARD_SUCCESS;
}

reshard_result_t reshard_plan_execute(const reshard_plan_t *plan,
                                      void *const *src_buffers,
                                      size_t num_src,
                                      void *const *dst_buffers,
                                      size_t num_dst, void *stream) {
  rs_error_clear();
  if (!plan) return rs_error(RESHARD_ERROR_INVALID_ARGUMENT, "execute: plan is NULL");
  /* Every call, failed or not, is one instance of the collective: tag it
   * so that messages a failed call left in flight never match a later one. */
  uint64_t epoch = __atomic_fetch_add(&((reshard_plan_t *)plan)->exec_calls, 1, __ATOMIC_RELAXED);
  const rs_stream_ops *dev = plan->comm->ops->stream_ops;
  if (stream && !dev)
    return rs_error(RESHARD_ERROR_INVALID_ARGUMENT, "execute rank %d: stream must be NULL on the %s transport",
                    plan->rank, plan->comm->ops->name);
  RS_CHECK(check_buffers(plan, "source", src_buffers, num_src, plan->num_src_buffers, plan->src_used, plan->nsrc_used));
  RS_CHECK(check_buffers(plan, "destination", dst_buffers, num_dst, plan->num_dst_buffers, plan->dst_used, plan->ndst_used));
  if (dev) return rs_stream_execute(plan, src_buffers, num_src, dst_buffers, num_dst, stream, epoch);

  /* Staging and request slots in one block. */
  size_t stage = (size_t)(2 * (plan->send_half + plan->recv_half));
  size_t nreq = 2 * plan->max_round_msgs; /* two halves, sends + receives */
  size_t need = stage + nreq * sizeof(rs_request *) + 64 + nreq;
  reshard_plan_t *mut = (reshard_plan_t *)plan; /* the staging cache only */
  void *block = NULL;
  int cached = !__atomic_exchange_n(&mut->staging_busy, 1, __ATOMIC_ACQUIRE);
  if (cached) {
    if (mut->staging_cache_bytes < need) {
      free(mut->staging_cache);
      mut->staging_cache = malloc(need);
      mut->staging_cache_bytes = mut->staging_cache ? need : 0;
    }
    block = mut->staging_cache;
  } else {
    block = malloc(need);
  }
  if (!block) {
    if (cached) __atomic_store_n(&mut->staging_busy, 0, __ATOMIC_RELEASE);
    return rs_error(RESHARD_ERROR_OUT_OF_MEMORY, "execute rank %d: cannot allocate %zu bytes of staging", plan->rank, need);
  }
  exec_state st;
  memset(&st, 0, sizeof st);
  st.plan = plan;
  st.comm = plan->comm;
  st.src = src_buffers;
  st.dst = dst_buffers;
  unsigned char *b = block;
  st.send_stage[0] = b;
  st.send_stage[1] = b + plan->send_half;
  st.recv_stage[0] = b + 2 * plan->send_half;
  st.recv_stage[1] = b + 2 * plan->send_half + plan->recv_half;
  rs_request **reqs = (rs_request **)(((uintptr_t)(b + stage) + 63) & ~(uintptr_t)63);
  /* max_round_msgs bounds sends + receives of one round, so each half's
   * sends and receives share one slice of it */
  size_t per = plan->max_round_msgs;
  st.sreq[0] = reqs;
  st.rreq[0] = reqs + plan->max_round_sends;
  st.sreq[1] = reqs + per;
  st.rreq[1] = reqs + per + plan->max_round_sends;
  st.in_place[0] = (unsigned char *)(reqs + nreq);
  st.in_place[1] = st.in_place[0] + per;
  st.deadline = rs_deadline_after_ms(plan->opts.timeout_ms);
  st.tag = plan->tag_base | (epoch & 0xffffu) << 48;
  reshard_result_t r = run_rounds(&st);
  if (r != RESHARD_SUCCESS) cancel_all(&st);
  if (cached) __atomic_store_n(&mut->staging_busy, 0, __ATOMIC_RELEASE);
  else free(block);
  return r;
}
