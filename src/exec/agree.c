/* The per-execute agreement: every rank and each of its partners swap a
 * header {magic, plan digest, call, version} and compare; then each tells
 * its partners how that went in a status word, which travels alongside
 * the data.
 *
 * The control tag carries no call number, so that the headers of ranks at
 * different calls still meet: both sides of such a pair see the other's
 * header and fail with RESHARD_ERROR_MISMATCH, instead of waiting for
 * data that will never come. Calls of one plan run one at a time (a
 * second, overlapping one is refused), so headers pair up in call order
 * on every rank (transports keep per-tag FIFO order).
 *
 * Posting the headers (rs_agree_post) and checking them (rs_agree_check)
 * are apart so that the headers cost no latency of their own: the host
 * executor sends round 0's data right behind its headers and checks the
 * partners' headers before anything lands in its destination buffers
 * (execute.c), so a header's round trip overlaps the data instead of
 * preceding it (issue 44: 3 to 4 us of a 46 us all-to-all on a 1 us
 * network).
 *
 * The status word makes one hop more fail fast without a second round
 * trip on the success path: it is sent right after the headers are
 * checked, polled while the data phase waits (rs_agree_poll) and
 * collected at the end, so a partner of a rank whose header check failed
 * returns RESHARD_ERROR_REMOTE at once. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"
#include "common/error.h"
#include "exec/exec_state.h"
#include "kernels/rs_agree.h"
#include "transport/transport.h"

#define RS_HDR_MAGIC 0x3230524448535253ull /* "RSHDR02": 256 bytes, with abort and why */

typedef struct rs_exec_hdr {
  uint64_t magic, digest, call, version;
  uint64_t abort;  /* the sender rejected this call: its result code */
  char why[216];   /* and why (the start of its reshard_last_error()) */
} rs_exec_hdr;

struct rs_agree {
  const reshard_plan_t *p;
  size_t n;                  /* partners: p->peers[i].peer */
  rs_exec_hdr mine;          /* sent: lives until the sends complete */
  uint64_t status;           /* likewise */
  rs_exec_hdr *in;           /* [n] */
  uint64_t *status_in;       /* [n] */
  unsigned char *got;        /* [n]: header arrived */
  rs_request **rreq, **sreq; /* [n] each */
  reshard_result_t r;        /* first failure */
  reshard_result_t abort;    /* this rank's own rejection of the call */
  int sent;                  /* the header exchange completed */
  int checked;               /* rs_agree_check ran */
  char msg[640];
  char own[640]; /* abort's message */
};

static void fail(rs_agree *a, reshard_result_t r, const char *prefix) {
  if (a->r) return;
  a->r = r;
  snprintf(a->msg, sizeof a->msg, "%s%s", prefix, reshard_last_error());
}

static void cancel_reqs(rs_agree *a, int recvs, int sends) {
  for (size_t i = 0; i < a->n; i++) {
    if (recvs && a->rreq[i]) a->p->comm->ops->cancel(a->p->comm, a->rreq[i]);
    if (sends && a->sreq[i]) a->p->comm->ops->cancel(a->p->comm, a->sreq[i]);
    if (recvs) a->rreq[i] = NULL;
    if (sends) a->sreq[i] = NULL;
  }
}

/* Waits for every pending request of one phase; a receive that completes
 * sets got[i] when `mark`. */
static void wait_all(rs_agree *a, int64_t deadline, const char *what, int mark) {
  const reshard_plan_t *p = a->p;
  char prefix[160];
  for (size_t i = 0; i < a->n; i++) {
    if (!a->rreq[i]) continue;
    reshard_result_t r = p->comm->ops->wait(p->comm, a->rreq[i], deadline);
    if (r != RESHARD_ERROR_TIMEOUT) a->rreq[i] = NULL;
    if (r == RESHARD_SUCCESS) {
      if (mark) a->got[i] = 1;
    } else {
      snprintf(prefix, sizeof prefix, "execute rank %d (agreement %s: receive from rank %d): ", p->rank, what,
               p->peers[i].peer);
      fail(a, r, prefix);
    }
  }
  for (size_t i = 0; i < a->n; i++) {
    if (!a->sreq[i]) continue;
    reshard_result_t r = p->comm->ops->wait(p->comm, a->sreq[i], deadline);
    if (r != RESHARD_ERROR_TIMEOUT) a->sreq[i] = NULL;
    if (r != RESHARD_SUCCESS) {
      snprintf(prefix, sizeof prefix, "execute rank %d (agreement %s: send to rank %d): ", p->rank, what,
               p->peers[i].peer);
      fail(a, r, prefix);
    }
  }
}

static void check_header(rs_agree *a, size_t i) {
  const reshard_plan_t *p = a->p;
  rs_exec_hdr *h = &a->in[i];
  const rs_exec_hdr *mine = &a->mine;
  int peer = p->peers[i].peer;
  /* the comparison the device executor runs (kernels/rs_agree.h) */
  rs_dev_hdr got = {h->magic, h->digest, h->call, h->version}, want = {RS_HDR_MAGIC, p->digest, mine->call,
                                                                       mine->version};
  int how = rs_hdr_compare(&got, &want);
  if (how != RS_HDR_OTHER_PLAN && h->abort) {
    h->why[sizeof h->why - 1] = '\0';
    fail(a, rs_error(RESHARD_ERROR_REMOTE,
                     "execute rank %d: rank %d rejected execute call %llu with '%s': %s", p->rank, peer,
                     (unsigned long long)h->call, reshard_result_string((reshard_result_t)h->abort), h->why),
         "");
  } else if (how != RS_HDR_SAME) {
    fail(a, rs_verdict_header(p, peer, &got, &want, ""), "");
  }
}

static reshard_result_t partner_failed(const rs_agree *a, size_t i) {
  return rs_error(RESHARD_ERROR_REMOTE, "execute rank %d: partner rank %d failed its agreement with '%s' (see its error)",
                  a->p->rank, a->p->peers[i].peer, reshard_result_string((reshard_result_t)a->status_in[i]));
}

reshard_result_t rs_agree_post(const reshard_plan_t *p, uint64_t call, uint64_t version, reshard_result_t abort,
                               rs_agree **out) {
  *out = NULL;
  size_t n = p->npeers;
  if (n == 0) return abort;
  reshard_comm_t *comm = p->comm;
  const rs_transport_ops *ops = comm->ops;
  rs_agree *a = rs_calloc(1, sizeof *a + n * (sizeof(rs_exec_hdr) + sizeof(uint64_t) + 2 * sizeof(rs_request *) + 1));
  if (!a)
    return rs_error(RESHARD_ERROR_OUT_OF_MEMORY, "execute rank %d: out of memory for the agreement with %zu partners",
                    p->rank, n);
  a->p = p;
  a->n = n;
  a->in = (rs_exec_hdr *)(a + 1);
  a->status_in = (uint64_t *)(a->in + n);
  a->rreq = (rs_request **)(a->status_in + n);
  a->sreq = a->rreq + n;
  a->got = (unsigned char *)(a->sreq + n);
  a->abort = abort;
  if (abort) snprintf(a->own, sizeof a->own, "%s", reshard_last_error());
  a->mine = (rs_exec_hdr){RS_HDR_MAGIC, p->digest, call, version, (uint64_t)abort, ""};
  /* the start of the message; the initializer above left the rest NUL */
  memcpy(a->mine.why, a->own, strnlen(a->own, sizeof a->mine.why - 1));
  const uint64_t htag = p->tag_base | RS_TAG_CONTROL | RS_CTL_HEADER;
  char prefix[160];
  snprintf(prefix, sizeof prefix, "execute rank %d (agreement): ", p->rank);
  *out = a;

  /* Headers: receives first, so that no header waits unexpected. */
  reshard_result_t r;
  for (size_t i = 0; i < n && !a->r; i++)
    if ((r = ops->irecv(comm, p->peers[i].peer, htag, &a->in[i], sizeof a->in[i], &a->rreq[i]))) {
      a->rreq[i] = NULL;
      fail(a, r, prefix);
    }
  for (size_t i = 0; i < n && !a->r; i++)
    if ((r = ops->isend(comm, p->peers[i].peer, htag, &a->mine, sizeof a->mine, &a->sreq[i]))) {
      a->sreq[i] = NULL;
      fail(a, r, prefix);
    }
  if (a->r) rs_error(a->r, "%s", a->msg);
  return a->r;
}

reshard_result_t rs_agree_check(rs_agree *a, int64_t deadline) {
  if (!a) return RESHARD_SUCCESS;
  if (a->checked) return a->r;
  a->checked = 1;
  const reshard_plan_t *p = a->p;
  reshard_comm_t *comm = p->comm;
  const rs_transport_ops *ops = comm->ops;
  const size_t n = a->n;
  const uint64_t stag = p->tag_base | RS_TAG_CONTROL | RS_CTL_STATUS;
  char prefix[160];
  snprintf(prefix, sizeof prefix, "execute rank %d (agreement): ", p->rank);
  reshard_result_t r;
  if (!a->r) wait_all(a, deadline, "header", 1);
  a->sent = !a->r; /* every header went out (and every partner's came in) */
  if (a->abort) { /* this rank's own rejection is the story, whatever else happened */
    a->r = a->abort;
    snprintf(a->msg, sizeof a->msg, "%s", a->own);
  }
  for (size_t i = 0; i < n; i++)
    if (a->got[i]) check_header(a, i);
  cancel_reqs(a, 1, 1);

  /* Status: sent to every partner (one that arrives late still learns of
   * a failure here); received only while this rank has nothing to report
   * itself. Receives are posted before sends, so control messages keep
   * pairing in order. */
  if (!a->r)
    for (size_t i = 0; i < n && !a->r; i++)
      if ((r = ops->irecv(comm, p->peers[i].peer, stag, &a->status_in[i], sizeof(uint64_t), &a->rreq[i]))) {
        a->rreq[i] = NULL;
        fail(a, r, prefix);
      }
  a->status = (uint64_t)a->r;
  /* a->status is the send buffer of every status message, so a send that
   * fails cannot change what the others carry: the partner it was meant for
   * stops at its deadline, and this rank reports the failure itself. */
  reshard_result_t send_failed = RESHARD_SUCCESS;
  for (size_t i = 0; i < n; i++)
    if ((r = ops->isend(comm, p->peers[i].peer, stag, &a->status, sizeof a->status, &a->sreq[i])) != RESHARD_SUCCESS) {
      a->sreq[i] = NULL;
      if (!send_failed) {
        send_failed = r;
        if (!a->r) {
          rs_error_prefix("execute rank %d (agreement status: send to rank %d): ", p->rank, p->peers[i].peer);
          fail(a, r, "");
        }
      }
    }
  if (a->r) rs_error(a->r, "%s", a->msg);
  return a->r;
}

reshard_result_t rs_agree_begin(const reshard_plan_t *p, uint64_t call, uint64_t version, int64_t deadline,
                                reshard_result_t abort, rs_agree **out) {
  reshard_result_t r = rs_agree_post(p, call, version, abort, out);
  return *out ? rs_agree_check(*out, deadline) : r;
}

reshard_result_t rs_agree_poll(rs_agree *a) {
  /* before the check the receives are the headers' */
  if (!a || !a->checked) return RESHARD_SUCCESS;
  for (size_t i = 0; i < a->n; i++) {
    if (!a->rreq[i]) continue;
    int done = 0;
    reshard_result_t r = a->p->comm->ops->test(a->p->comm, a->rreq[i], &done);
    if (!done) continue;
    a->rreq[i] = NULL;
    if (r != RESHARD_SUCCESS) {
      rs_error_prefix("execute rank %d (agreement status: receive from rank %d): ", a->p->rank, a->p->peers[i].peer);
      return r;
    }
    if (a->status_in[i]) return partner_failed(a, i);
  }
  return RESHARD_SUCCESS;
}

int rs_agree_sent(const rs_agree *a) { return a && a->sent; }

int rs_agree_checked(const rs_agree *a) { return !a || a->checked; }

reshard_result_t rs_agree_end(rs_agree *a, reshard_result_t r, int64_t deadline) {
  if (!a) return r;
  if (!a->checked) {
    /* a call that failed between post and check (a data send it could not
     * post) still completes the exchange: its partners wait for the
     * headers and statuses; its own failure stays the story */
    char msg[1024];
    snprintf(msg, sizeof msg, "%s", reshard_last_error());
    reshard_result_t rc = rs_agree_check(a, deadline);
    if (r == RESHARD_SUCCESS) r = rc;
    else rs_error(r, "%s", msg);
  }
  if (r == RESHARD_SUCCESS) {
    /* statuses already received were checked by rs_agree_poll, except
     * those it had no occasion to look at */
    for (size_t i = 0; i < a->n && r == RESHARD_SUCCESS; i++) {
      if (!a->rreq[i]) continue;
      r = a->p->comm->ops->wait(a->p->comm, a->rreq[i], deadline);
      if (r != RESHARD_ERROR_TIMEOUT) a->rreq[i] = NULL;
      if (r != RESHARD_SUCCESS)
        rs_error_prefix("execute rank %d (agreement status: receive from rank %d): ", a->p->rank, a->p->peers[i].peer);
      else if (a->status_in[i])
        r = partner_failed(a, i);
    }
  }
  /* The status sends get their chance to leave even after a failure:
   * they are what tells the partners. */
  for (size_t i = 0; i < a->n; i++) {
    if (!a->sreq[i]) continue;
    reshard_result_t rs = a->p->comm->ops->wait(a->p->comm, a->sreq[i], deadline);
    if (rs != RESHARD_ERROR_TIMEOUT) a->sreq[i] = NULL;
    if (rs != RESHARD_SUCCESS && r == RESHARD_SUCCESS) {
      rs_error_prefix("execute rank %d (agreement status: send to rank %d): ", a->p->rank, a->p->peers[i].peer);
      r = rs;
    }
  }
  cancel_reqs(a, 1, 1);
  free(a);
  return r;
}
