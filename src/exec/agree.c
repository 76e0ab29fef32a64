/* The per-execute agreement: before any data of an execute moves, every
 * rank and each of its partners swap a header {magic, plan digest, call,
 * version} and compare, then swap a status word.
 *
 * The control tag carries no call number, so that the headers of ranks at
 * different calls still meet: both sides of such a pair see the other's
 * header and fail with RESHARD_ERROR_MISMATCH, instead of waiting for
 * data that will never come. Agreements of concurrent executes of one plan
 * run one at a time in call order (rs_agree_turn_wait), so headers pair
 * up in that order on every rank (transports keep per-tag FIFO order).
 *
 * The status word makes one hop more fail fast: a rank whose header check
 * failed tells its other partners, which return RESHARD_ERROR_REMOTE. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/error.h"
#include "exec/exec_state.h"
#include "transport/transport.h"

#define RS_HDR_MAGIC 0x3130524448535253ull /* "RSHDR01" */

typedef struct rs_exec_hdr {
  uint64_t magic, digest, call, version;
} rs_exec_hdr;

typedef struct agree {
  const reshard_plan_t *p;
  size_t n;             /* partners: p->peers[i].peer */
  rs_exec_hdr *in;      /* [n] */
  uint64_t *status_in;  /* [n] */
  unsigned char *got;   /* [n]: header arrived */
  rs_request **rreq, **sreq; /* [n] each */
  reshard_result_t r;   /* first failure */
  char msg[640];
} agree;

static void fail(agree *a, reshard_result_t r, const char *prefix) {
  if (a->r) return;
  a->r = r;
  snprintf(a->msg, sizeof a->msg, "%s%s", prefix, reshard_last_error());
}

static void cancel_reqs(agree *a) {
  for (size_t i = 0; i < a->n; i++) {
    if (a->rreq[i]) a->p->comm->ops->cancel(a->p->comm, a->rreq[i]);
    if (a->sreq[i]) a->p->comm->ops->cancel(a->p->comm, a->sreq[i]);
    a->rreq[i] = a->sreq[i] = NULL;
  }
}

/* Waits for every request of one phase; a receive that completes sets
 * got[i] when `mark`. */
static void wait_phase(agree *a, int64_t deadline, const char *what, int mark) {
  const reshard_plan_t *p = a->p;
  char prefix[160];
  for (size_t i = 0; i < a->n; i++) {
    int peer = p->peers[i].peer;
    if (a->rreq[i]) {
      reshard_result_t r = p->comm->ops->wait(p->comm, a->rreq[i], deadline);
      if (r != RESHARD_ERROR_TIMEOUT) a->rreq[i] = NULL;
      if (r == RESHARD_SUCCESS) {
        if (mark) a->got[i] = 1;
      } else {
        snprintf(prefix, sizeof prefix, "execute rank %d (agreement %s: receive from rank %d): ", p->rank, what, peer);
        fail(a, r, prefix);
      }
    }
  }
  for (size_t i = 0; i < a->n; i++) {
    if (!a->sreq[i]) continue;
    reshard_result_t r = p->comm->ops->wait(p->comm, a->sreq[i], deadline);
    if (r != RESHARD_ERROR_TIMEOUT) a->sreq[i] = NULL;
    if (r != RESHARD_SUCCESS) {
      snprintf(prefix, sizeof prefix, "execute rank %d (agreement %s: send to rank %d): ", p->rank, what, p->peers[i].peer);
      fail(a, r, prefix);
    }
  }
}

static void check_header(agree *a, size_t i, const rs_exec_hdr *mine) {
  const reshard_plan_t *p = a->p;
  const rs_exec_hdr *h = &a->in[i];
  int peer = p->peers[i].peer;
  if (h->magic != RS_HDR_MAGIC || h->digest != p->digest) {
    fail(a, rs_error(RESHARD_ERROR_MISMATCH,
                     "execute rank %d: rank %d runs another plan or protocol (header magic %016llx digest %016llx, "
                     "expected %016llx %016llx)",
                     p->rank, peer, (unsigned long long)h->magic, (unsigned long long)h->digest,
                     (unsigned long long)RS_HDR_MAGIC, (unsigned long long)p->digest),
         "");
  } else if (h->call != mine->call || h->version != mine->version) {
    fail(a, rs_error(RESHARD_ERROR_MISMATCH,
                     "execute rank %d: rank %d is at another execute of this plan: expected call %llu version %llu, "
                     "received call %llu version %llu from rank %d (a rank skipped or repeated a step?)",
                     p->rank, peer, (unsigned long long)mine->call, (unsigned long long)mine->version,
                     (unsigned long long)h->call, (unsigned long long)h->version, peer),
         "");
  }
}

reshard_result_t rs_exec_agree(const reshard_plan_t *p, uint64_t call, uint64_t version, int64_t deadline) {
  size_t n = p->npeers;
  if (n == 0) return RESHARD_SUCCESS;
  reshard_comm_t *comm = p->comm;
  const rs_transport_ops *ops = comm->ops;
  agree a;
  memset(&a, 0, sizeof a);
  a.p = p;
  a.n = n;
  void *block = calloc(n, sizeof(rs_exec_hdr) + sizeof(uint64_t) + 2 * sizeof(rs_request *) + 1);
  if (!block)
    return rs_error(RESHARD_ERROR_OUT_OF_MEMORY, "execute rank %d: out of memory for the agreement with %zu partners",
                    p->rank, n);
  a.in = block;
  a.status_in = (uint64_t *)(a.in + n);
  a.rreq = (rs_request **)(a.status_in + n);
  a.sreq = a.rreq + n;
  a.got = (unsigned char *)(a.sreq + n);
  const rs_exec_hdr mine = {RS_HDR_MAGIC, p->digest, call, version};
  const uint64_t htag = p->tag_base | RS_TAG_CONTROL | RS_CTL_HEADER;
  const uint64_t stag = p->tag_base | RS_TAG_CONTROL | RS_CTL_STATUS;
  char prefix[160];

  /* Headers: receives first, so that no header waits unexpected. */
  for (size_t i = 0; i < n && !a.r; i++) {
    reshard_result_t r = ops->irecv(comm, p->peers[i].peer, htag, &a.in[i], sizeof a.in[i], &a.rreq[i]);
    if (r) {
      a.rreq[i] = NULL;
      snprintf(prefix, sizeof prefix, "execute rank %d (agreement): ", p->rank);
      fail(&a, r, prefix);
    }
  }
  for (size_t i = 0; i < n && !a.r; i++) {
    reshard_result_t r = ops->isend(comm, p->peers[i].peer, htag, &mine, sizeof mine, &a.sreq[i]);
    if (r) {
      a.sreq[i] = NULL;
      snprintf(prefix, sizeof prefix, "execute rank %d (agreement): ", p->rank);
      fail(&a, r, prefix);
    }
  }
  if (!a.r) wait_phase(&a, deadline, "header", 1);
  for (size_t i = 0; i < n; i++)
    if (a.got[i]) check_header(&a, i, &mine);
  cancel_reqs(&a);

  /* Status: sent to every partner (one that arrives late still learns of
   * a failure here); received only while this rank has nothing to report
   * itself. */
  uint64_t status = (uint64_t)a.r;
  if (!a.r)
    for (size_t i = 0; i < n && !a.r; i++) {
      reshard_result_t r = ops->irecv(comm, p->peers[i].peer, stag, &a.status_in[i], sizeof(uint64_t), &a.rreq[i]);
      if (r) {
        a.rreq[i] = NULL;
        snprintf(prefix, sizeof prefix, "execute rank %d (agreement): ", p->rank);
        fail(&a, r, prefix);
      }
    }
  status = (uint64_t)a.r;
  for (size_t i = 0; i < n; i++)
    if (ops->isend(comm, p->peers[i].peer, stag, &status, sizeof status, &a.sreq[i]) != RESHARD_SUCCESS)
      a.sreq[i] = NULL; /* best effort: the partner then stops at its deadline */
  reshard_result_t before = a.r;
  wait_phase(&a, deadline, "status", 0);
  if (!before && !a.r)
    for (size_t i = 0; i < n; i++)
      if (a.status_in[i]) {
        a.r = rs_error(RESHARD_ERROR_REMOTE, "execute rank %d: partner rank %d failed its agreement with '%s' (see its error)",
                       p->rank, p->peers[i].peer, reshard_result_string((reshard_result_t)a.status_in[i]));
        snprintf(a.msg, sizeof a.msg, "%s", reshard_last_error());
        break;
      }
  cancel_reqs(&a);
  reshard_result_t r = a.r;
  if (r) rs_error(r, "%s", a.msg);
  free(block);
  return r;
}
