/* The UCX transport (ucx.c): the rendezvous and communicator creation.
 * Rank 0 listens at "host:port"; the others connect to it and send their
 * worker addresses; rank 0 sends everyone the table and every rank
 * connects to every other by address, then a first agreement
 * (reshard_comm_create_ucx; reshard_comm_create_ucx_joining for a
 * newcomer, see ucx_rejoin.c). */
#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <ucp/api/ucp.h>

#include "common/clock.h"
#include "common/error.h"
#include "common/params.h"
#include "reshard_ucx.h"
#include "transport/transport.h"
#include "transport/ucx_internal.h"

static void on_conn_request(ucp_conn_request_h req, void *arg) {
  ux_comm *m = arg;
  ucp_conn_request_h *grown = realloc(m->conn_req, (size_t)(m->nconn_req + 1) * sizeof *grown);
  if (!grown) return; /* (the client times out) */
  m->conn_req = grown;
  m->conn_req[m->nconn_req++] = req;
}

static ucp_ep_params_t ep_params(ux_comm *m) {
  ucp_ep_params_t p;
  memset(&p, 0, sizeof p);
  p.field_mask = UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE | UCP_EP_PARAM_FIELD_ERR_HANDLER;
  p.err_mode = UCP_ERR_HANDLING_MODE_PEER;
  p.err_handler.cb = rs_ux_on_ep_error;
  p.err_handler.arg = m;
  return p;
}

static reshard_result_t resolve(const char *rendezvous, int rank, struct sockaddr_in *sa) {
  char host[256];
  const char *colon = rendezvous ? strrchr(rendezvous, ':') : NULL;
  if (!colon || colon == rendezvous || (size_t)(colon - rendezvous) >= sizeof host || !colon[1])
    return rs_error(RESHARD_ERROR_INVALID_ARGUMENT,
                    "comm_create_ucx rank %d: rendezvous '%s' is not \"host:port\"", rank,
                    rendezvous ? rendezvous : "(null)");
  memcpy(host, rendezvous, (size_t)(colon - rendezvous));
  host[colon - rendezvous] = 0;
  char *end = NULL;
  long port = strtol(colon + 1, &end, 10);
  if (*end || port < 1 || port > 65535)
    return rs_error(RESHARD_ERROR_INVALID_ARGUMENT, "comm_create_ucx rank %d: rendezvous '%s': port '%s'", rank,
                    rendezvous, colon + 1);
  struct addrinfo hints, *res = NULL;
  memset(&hints, 0, sizeof hints);
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  int e = getaddrinfo(host, NULL, &hints, &res);
  if (e || !res)
    return rs_error(RESHARD_ERROR_INVALID_ARGUMENT, "comm_create_ucx rank %d: rendezvous host '%s': %s", rank,
                    host, gai_strerror(e));
  memcpy(sa, res->ai_addr, sizeof *sa);
  freeaddrinfo(res);
  sa->sin_port = htons((uint16_t)port);
  return RESHARD_SUCCESS;
}

/* Waits (polling the worker) for a request of the rendezvous. */
reshard_result_t rs_ux_boot_wait(reshard_comm_t *c, rs_request *r, int64_t deadline, const char *what) {
  reshard_result_t res = rs_ux_wait(c, r, deadline);
  if (res == RESHARD_ERROR_TIMEOUT) {
    rs_ux_cancel(c, r);
    return rs_error(RESHARD_ERROR_TIMEOUT, "comm_create_ucx rank %d: %s did not complete before the deadline "
                    "(did every rank call reshard_comm_create_ucx with the same rendezvous and size?)",
                    c->rank, what);
  }
  return res;
}

/* Receives a message of unknown length with `tag` (probing), into a
 * malloc'd buffer. */
reshard_result_t rs_ux_boot_recv_any(reshard_comm_t *c, ucp_tag_t tag, ucp_tag_t mask, int64_t probe_until,
                                     int64_t deadline, const char *what, void **buf, size_t *len,
                                     ucp_tag_t *sender) {
  ux_comm *m = c->impl;
  for (unsigned spin = 0;; spin++) {
    ucp_tag_recv_info_t info;
    pthread_mutex_lock(&m->lock);
    ucp_worker_progress(m->worker);
    ucp_tag_message_h msg = ucp_tag_probe_nb(m->worker, tag, mask, 1, &info);
    pthread_mutex_unlock(&m->lock);
    if (msg) {
      *buf = malloc(info.length ? info.length : 1);
      if (!*buf) return rs_error(RESHARD_ERROR_OUT_OF_MEMORY, "comm_create_ucx rank %d: out of memory", c->rank);
      rs_request *r = calloc(1, sizeof *r);
      if (!r) return rs_error(RESHARD_ERROR_OUT_OF_MEMORY, "comm_create_ucx rank %d: out of memory", c->rank);
      r->is_recv = 1, r->bytes = info.length, r->peer = 0;
      ucp_request_param_t p;
      memset(&p, 0, sizeof p);
      p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FLAG_NO_IMM_CMPL;
      p.user_data = r;
      p.cb.recv = rs_ux_on_recv;
      pthread_mutex_lock(&m->lock);
      ucs_status_ptr_t s = ucp_tag_msg_recv_nbx(m->worker, *buf, info.length, msg, &p);
      pthread_mutex_unlock(&m->lock);
      if (UCS_PTR_IS_ERR(s)) {
        free(r);
        return rs_ux_fail(UCS_PTR_STATUS(s), "ucp_tag_msg_recv_nbx", c->rank, -1);
      }
      r->ucx = s;
      *len = info.length;
      if (sender) *sender = info.sender_tag;
      return rs_ux_boot_wait(c, r, deadline, what);
    }
    if (spin > 64 && rs_now_ns() > probe_until)
      return rs_error(RESHARD_ERROR_TIMEOUT, "comm_create_ucx rank %d: %s did not arrive before the deadline (did "
                      "every rank call reshard_comm_create_ucx with the same rendezvous and size?)",
                      c->rank, what);
    rs_nap(spin);
  }
}

/* Rank 0: turns the connection requests that arrived into endpoints.
 * Under the lock. */
static void accept_locked(ux_comm *m) {
  for (int i = 0; i < m->nconn_req; i++) {
    if (!m->conn_req[i]) continue;
    ucp_ep_params_t p = ep_params(m);
    p.field_mask |= UCP_EP_PARAM_FIELD_CONN_REQUEST;
    p.conn_request = m->conn_req[i];
    m->conn_req[i] = NULL;
    ucp_ep_h ep = NULL;
    if (m->naccepted == m->accepted_cap) {
      int cap = m->accepted_cap ? 2 * m->accepted_cap : 16;
      ucp_ep_h *grown = realloc(m->accepted, (size_t)cap * sizeof *grown);
      if (!grown) {
        ucp_listener_reject(m->listener, p.conn_request); /* (out of memory: UCX's own hazard, below) */
        continue;
      }
      m->accepted = grown;
      m->accepted_cap = cap;
    }
    if (ucp_ep_create(m->worker, &p, &ep) == UCS_OK) m->accepted[m->naccepted++] = ep;
  }
  m->nconn_req = 0;
}

/* Rank 0: progresses the worker and turns the connection requests that
 * arrived into endpoints. (Takes the lock.) */
void rs_ux_accept_pending(ux_comm *m) {
  pthread_mutex_lock(&m->lock);
  ucp_worker_progress(m->worker);
  accept_locked(m);
  pthread_mutex_unlock(&m->lock);
}

/* Rank 0: listens on the rendezvous (at creation, until the communicator
 * is destroyed: setup_root). */
static reshard_result_t rs_ux_listen_on(reshard_comm_t *c, const char *who) {
  ux_comm *m = c->impl;
  ucp_listener_params_t lp;
  memset(&lp, 0, sizeof lp);
  lp.field_mask = UCP_LISTENER_PARAM_FIELD_SOCK_ADDR | UCP_LISTENER_PARAM_FIELD_CONN_HANDLER;
  lp.sockaddr.addr = (const struct sockaddr *)&m->rdv;
  lp.sockaddr.addrlen = sizeof m->rdv;
  lp.conn_handler.cb = on_conn_request;
  lp.conn_handler.arg = m;
  pthread_mutex_lock(&m->lock);
  ucs_status_t s = ucp_listener_create(m->worker, &lp, &m->listener);
  pthread_mutex_unlock(&m->lock);
  if (s != UCS_OK)
    return rs_error(RESHARD_ERROR_BACKEND, "%s rank 0: cannot listen on %s: %s", who, m->rdv_name,
                    s == UCS_ERR_BUSY ? "the address is in use (another process listens there?)"
                                      : ucs_status_string(s));
  return RESHARD_SUCCESS;
}

/* Rank 0, at the communicator's end (under the lock): the port is free
 * again. The connection requests still pending are accepted, not
 * refused: ucp_listener_reject over TCP's sockcm can make UCX's async
 * thread call a callback the refused server endpoint never set (SIGSEGV;
 * UCX issue openucx/ucx#11235, open); their endpoints close with the
 * others. */
void rs_ux_stop_listening(ux_comm *m) {
  accept_locked(m);
  if (m->listener) ucp_listener_destroy(m->listener);
  m->listener = NULL;
}

/* Rank 0: accepts the others' connections and collects their worker
 * addresses; addr[p] = {size, address} as each sent it. */
static reshard_result_t boot_collect(reshard_comm_t *c, void **addr, size_t *alen, int64_t deadline) {
  ux_comm *m = c->impl;
  int have = 1;
  while (have < c->size) {
    rs_ux_accept_pending(m);
    void *buf = NULL;
    size_t len = 0;
    ucp_tag_t sender = 0;
    /* one address at a time, 2 ms each, until the deadline */
    int64_t slice = rs_now_ns() + 2000000;
    reshard_result_t r = rs_ux_boot_recv_any(c, TAG_ADDRESS, LOW_MASK | COLL_BIT, slice < deadline ? slice : deadline,
                                             deadline, "a rank's address", &buf, &len, &sender);
    if (r == RESHARD_ERROR_TIMEOUT) {
      if (rs_now_ns() < deadline) continue;
      return rs_error(RESHARD_ERROR_TIMEOUT, "comm_create_ucx rank 0: %d of %d ranks arrived before the deadline "
                      "(did every rank call reshard_comm_create_ucx with the same rendezvous and size?)",
                      have, c->size);
    }
    if (r) return r;
    const uint64_t from = sender >> RANK_SHIFT;
    if (from < 1 || from >= (uint64_t)c->size || addr[from] || len < 8) {
      free(buf);
      return rs_error(RESHARD_ERROR_MISMATCH, "comm_create_ucx rank 0: a rank %llu arrived (size %d, or twice): "
                      "every process must pass its own rank and the same size", (unsigned long long)from, c->size);
    }
    uint64_t their_size;
    memcpy(&their_size, buf, 8);
    if (their_size != (uint64_t)c->size) {
      free(buf);
      return rs_error(RESHARD_ERROR_MISMATCH, "comm_create_ucx rank 0: rank %llu passed size %llu, this rank %d",
                      (unsigned long long)from, (unsigned long long)their_size, c->size);
    }
    addr[from] = buf;
    alen[from] = len;
    have++;
  }
  return RESHARD_SUCCESS;
}

/* An endpoint to rank p's worker address. */
reshard_result_t rs_ux_connect_one(reshard_comm_t *c, int p, const void *address) {
  ux_comm *m = c->impl;
  ucp_ep_params_t ep = ep_params(m);
  /* UCP's peer-failure mode leaves out the transports that cannot
   * report a dead peer: in UCX 1.13, shared memory, so every byte
   * between processes of a node would cross the loopback TCP stack
   * (2.8 x MPI's time with 4 processes on 2 cores; 0.98 x without).
   * Off by default: a dead peer then costs the deadline, as on MPI. */
  int64_t peer_errors = 0;
  rs_param_get(RS_PARAM_UCX_PEER_ERRORS, &peer_errors);
  if (!peer_errors) ep.err_mode = UCP_ERR_HANDLING_MODE_NONE;
  ep.field_mask |= UCP_EP_PARAM_FIELD_REMOTE_ADDRESS;
  ep.address = (const ucp_address_t *)address;
  pthread_mutex_lock(&m->lock);
  ucs_status_t s = ucp_ep_create(m->worker, &ep, &m->ep[p]);
  m->peer_failed[p] = 0;
  pthread_mutex_unlock(&m->lock);
  if (s != UCS_OK) {
    m->ep[p] = NULL;
    return rs_ux_fail(s, "ucp_ep_create", c->rank, p);
  }
  return RESHARD_SUCCESS;
}

/* table: {address length, address} per rank. */
static reshard_result_t connect_all(reshard_comm_t *c, const uint8_t *table, size_t len) {
  ux_comm *m = c->impl;
  size_t at = 0;
  for (int p = 0; p < c->size; p++) {
    uint64_t n = 0;
    if (at + 8 > len) break;
    memcpy(&n, table + at, 8);
    at += 8;
    if (n > len - at) break;
    RS_CHECK(rs_ux_connect_one(c, p, table + at));
    at += n;
  }
  for (int p = 0; p < c->size; p++)
    if (!m->ep[p])
      return rs_error(RESHARD_ERROR_MISMATCH, "comm_create_ucx rank %d: the address table from rank 0 is short",
                      c->rank);
  return RESHARD_SUCCESS;
}

/* Rank 0: the table of m->addrs after `head` bytes of header (zeroed),
 * malloc'd. */
reshard_result_t rs_ux_build_table(reshard_comm_t *c, size_t head, uint8_t **out, size_t *len) {
  ux_comm *m = c->impl;
  size_t n = head;
  for (int p = 0; p < c->size; p++) n += 8 + m->alens[p];
  uint8_t *t = calloc(1, n);
  if (!t) return rs_error(RESHARD_ERROR_OUT_OF_MEMORY, "rank 0: out of memory for the address table");
  size_t at = head;
  for (int p = 0; p < c->size; p++) {
    uint64_t a = m->alens[p];
    memcpy(t + at, &a, 8);
    memcpy(t + at + 8, m->addrs[p], a);
    at += 8 + a;
  }
  *out = t;
  *len = n;
  return RESHARD_SUCCESS;
}

/* A rank other than 0: connects to the rendezvous and sends its worker
 * address (with its size) under `tag` (TAG_ADDRESS, or TAG_JOIN for a
 * newcomer). Rank 0 may not listen yet: a refused connection is retried
 * on a new endpoint every 20 ms until the deadline. */
static reshard_result_t boot_send_address(reshard_comm_t *c, const struct sockaddr_in *sa, const void *msg,
                                          size_t len, ucp_tag_t tag, int64_t deadline) {
  ux_comm *m = c->impl;
  for (;;) {
    ucp_ep_params_t ep = ep_params(m);
    ep.field_mask |= UCP_EP_PARAM_FIELD_FLAGS | UCP_EP_PARAM_FIELD_SOCK_ADDR;
    ep.flags = UCP_EP_PARAMS_FLAGS_CLIENT_SERVER;
    ep.sockaddr.addr = (const struct sockaddr *)sa;
    ep.sockaddr.addrlen = sizeof *sa;
    rs_request *q = calloc(1, sizeof *q);
    if (!q) return rs_error(RESHARD_ERROR_OUT_OF_MEMORY, "comm_create_ucx rank %d: out of memory", c->rank);
    q->bytes = len;
    ucp_request_param_t p;
    memset(&p, 0, sizeof p);
    p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FLAG_NO_IMM_CMPL;
    p.user_data = q;
    p.cb.send = rs_ux_on_send;
    pthread_mutex_lock(&m->lock);
    m->boot_failed = 0;
    ucs_status_t s = ucp_ep_create(m->worker, &ep, &m->boot_ep);
    ucs_status_ptr_t sp = NULL;
    if (s == UCS_OK) sp = ucp_tag_send_nbx(m->boot_ep, msg, len, (uint64_t)c->rank << RANK_SHIFT | tag, &p);
    pthread_mutex_unlock(&m->lock);
    if (s != UCS_OK) {
      m->boot_ep = NULL;
      free(q);
      return rs_ux_fail(s, "ucp_ep_create (to the rendezvous)", c->rank, 0);
    }
    if (UCS_PTR_IS_ERR(sp)) {
      free(q);
      return rs_ux_fail(UCS_PTR_STATUS(sp), "sending this rank's address", c->rank, 0);
    }
    q->ucx = sp;
    int st = 0;
    for (unsigned spin = 0; !st; spin++) {
      pthread_mutex_lock(&m->lock);
      ucp_worker_progress(m->worker);
      st = q->done ? (q->status == UCS_OK ? 1 : -1) : m->boot_failed ? -1 : 0;
      pthread_mutex_unlock(&m->lock);
      if (!st && rs_now_ns() > deadline) break;
      if (!st) rs_nap(spin);
    }
    if (st == 1) return rs_ux_finish(c, q);
    rs_ux_cancel(c, q);
    pthread_mutex_lock(&m->lock);
    rs_ux_close_ep(m, m->boot_ep);
    m->boot_ep = NULL;
    pthread_mutex_unlock(&m->lock);
    if (rs_now_ns() > deadline)
      return rs_error(RESHARD_ERROR_TIMEOUT, "comm_create_ucx rank %d: rank 0 did not accept this rank's connection "
                      "before the deadline (is it listening on the rendezvous address%s?)", c->rank,
                      tag == TAG_JOIN ? ", inside reshard_comm_ucx_rejoin" : "");
    struct timespec ts = {0, 20000000};
    nanosleep(&ts, NULL);
  }
}

/* A newcomer that gives up (its deadline passed before rank 0 answered)
 * withdraws its address: its size alone under TAG_JOIN, which rank 0
 * (where its address waits for the staying ranks' call) takes as the
 * newest word of the slot and skips; best effort, 200 ms. */
static void withdraw(reshard_comm_t *c) {
  ux_comm *m = c->impl;
  uint64_t *word = malloc(sizeof *word); /* (UCX may read it after this returns) */
  if (!word) return;
  *word = (uint64_t)c->size;
  ucp_request_param_t p;
  memset(&p, 0, sizeof p);
  pthread_mutex_lock(&m->lock);
  ucs_status_ptr_t s = ucp_tag_send_nbx(m->boot_ep, word, 8, (uint64_t)c->rank << RANK_SHIFT | TAG_JOIN, &p);
  for (int64_t until = rs_now_ns() + 200000000LL;
       UCS_PTR_IS_PTR(s) && ucp_request_check_status(s) == UCS_INPROGRESS && rs_now_ns() < until;)
    ucp_worker_progress(m->worker);
  int done = !UCS_PTR_IS_PTR(s) || ucp_request_check_status(s) != UCS_INPROGRESS;
  if (UCS_PTR_IS_PTR(s)) {
    if (!done) ucp_request_cancel(m->worker, s);
    ucp_request_free(s);
  }
  pthread_mutex_unlock(&m->lock);
  if (done) free(word); /* (else left to UCX: 8 bytes) */
}

void rs_ux_take_counters(reshard_comm_t *c, const uint64_t *w) {
  ux_comm *m = c->impl;
  m->epoch = w[JOIN_EPOCH];
  m->coll_seq = w[JOIN_SEQ];
  c->plans_created = (uint32_t)w[JOIN_PLANS];
  c->rejoins = (uint32_t)w[JOIN_EPOCH];
}

/* Rank 0 at creation: listens, collects every address, keeps them (a
 * newcomer gets the table later), hands the table out. */
static reshard_result_t setup_root(reshard_comm_t *c, const uint8_t *mine, size_t mylen, int64_t deadline) {
  ux_comm *m = c->impl;
  void **addr = calloc((size_t)c->size, sizeof *addr);
  size_t *alen = calloc((size_t)c->size, sizeof *alen);
  if (!addr || !alen) {
    free(addr);
    free(alen);
    return rs_error(RESHARD_ERROR_OUT_OF_MEMORY, "comm_create_ucx: out of memory");
  }
  m->addrs = addr;
  m->alens = alen;
  /* Rank 0 listens for as long as its communicator lives, not only while
   * a call waits for a rank: a listener destroyed while a client connects
   * (a newcomer started early, retrying every 20 ms) made UCX 1.13's
   * async thread call into the freed listener (SIGSEGV in
   * ucp_cm_server_conn_request_cb, seen in test_ucx_resize; UCX issue
   * openucx/ucx#11087, open). A client that connects between calls waits
   * to be accepted by the next call that looks for it (rs_ux_accept_pending). */
  reshard_result_t r = rs_ux_listen_on(c, "comm_create_ucx");
  if (!r) r = boot_collect(c, addr, alen, deadline);
  /* addr[p] held {size, address}: the address alone is kept */
  for (int p = 1; !r && p < c->size; p++) {
    memmove(addr[p], (uint8_t *)addr[p] + 8, alen[p] - 8);
    alen[p] -= 8;
  }
  if (!r && !(addr[0] = malloc(mylen ? mylen : 1))) r = rs_error(RESHARD_ERROR_OUT_OF_MEMORY, "comm_create_ucx: out of memory");
  if (!r) memcpy(addr[0], mine, mylen), alen[0] = mylen;
  uint8_t *table = NULL;
  size_t tlen = 0;
  if (!r) r = rs_ux_build_table(c, 0, &table, &tlen);
  if (!r) r = connect_all(c, table, tlen);
  for (int p = 1; !r && p < c->size; p++) {
    rs_request *q = NULL;
    r = rs_ux_post(c, p, (uint64_t)0 << RANK_SHIFT | TAG_TABLE, table, tlen, 0, &q);
    if (!r) r = rs_ux_boot_wait(c, q, deadline, "sending the address table");
  }
  free(table);
  return r;
}

/* Every rank (a newcomer too, `joining`): UCP, its worker, the rendezvous,
 * the endpoints to every rank, a first agreement. */
static reshard_result_t setup(reshard_comm_t *c, const char *rendezvous, int joining, int64_t deadline) {
  ux_comm *m = c->impl;
  RS_CHECK(resolve(rendezvous, c->rank, &m->rdv));
  snprintf(m->rdv_name, sizeof m->rdv_name, "%s", rendezvous);
  ucp_config_t *cfg = NULL;
  ucs_status_t s = ucp_config_read(NULL, NULL, &cfg);
  if (s != UCS_OK) return rs_ux_fail(s, "ucp_config_read", c->rank, -1);
  /* The rendezvous port is listened on again by the next communicator
   * (or after a failed creation, or by a rejoin) while the last one's
   * connections are in TIME_WAIT: SO_REUSEADDR, unless the caller set
   * UCX_CM_REUSEADDR. */
  if (!getenv("UCX_CM_REUSEADDR")) (void)ucp_config_modify(cfg, "CM_REUSEADDR", "y");
  ucp_params_t pp;
  memset(&pp, 0, sizeof pp);
  pp.field_mask = UCP_PARAM_FIELD_FEATURES;
  pp.features = UCP_FEATURE_TAG | UCP_FEATURE_RMA; /* RMA: registered buffers (ucx_rma.c) */
  s = ucp_init(&pp, cfg, &m->ctx);
  ucp_config_release(cfg);
  if (s != UCS_OK) return rs_ux_fail(s, "ucp_init", c->rank, -1);
  ucp_worker_params_t wp;
  memset(&wp, 0, sizeof wp);
  wp.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
  wp.thread_mode = UCS_THREAD_MODE_SINGLE;
  if ((s = ucp_worker_create(m->ctx, &wp, &m->worker)) != UCS_OK) return rs_ux_fail(s, "ucp_worker_create", c->rank, -1);
  ucp_address_t *my = NULL;
  size_t mylen = 0;
  if ((s = ucp_worker_get_address(m->worker, &my, &mylen)) != UCS_OK)
    return rs_ux_fail(s, "ucp_worker_get_address", c->rank, -1);
  uint8_t *mine = malloc(8 + mylen);
  if (!mine) {
    ucp_worker_release_address(m->worker, my);
    return rs_error(RESHARD_ERROR_OUT_OF_MEMORY, "comm_create_ucx rank %d: out of memory", c->rank);
  }
  uint64_t n64 = (uint64_t)c->size;
  memcpy(mine, &n64, 8);
  memcpy(mine + 8, my, mylen);
  ucp_worker_release_address(m->worker, my);
  reshard_result_t r = RESHARD_SUCCESS;
  if (c->rank == 0) {
    r = setup_root(c, mine + 8, mylen, deadline);
  } else {
    void *table = NULL;
    size_t tlen = 0, head = joining ? JOIN_WORDS * 8 : 0;
    r = boot_send_address(c, &m->rdv, mine, 8 + mylen, joining ? TAG_JOIN : TAG_ADDRESS, deadline);
    if (!r)
      r = rs_ux_boot_recv_any(c, joining ? TAG_JOIN_TABLE : TAG_TABLE, UINT64_MAX, deadline, deadline,
                              "the address table from rank 0", &table, &tlen, NULL);
    if (r == RESHARD_ERROR_TIMEOUT && joining && m->boot_ep) withdraw(c);
    uint64_t first = 0;
    if (!r && joining && tlen == sizeof first) memcpy(&first, table, sizeof first);
    if (!r && first == NO_NEWCOMER)
      r = rs_error(RESHARD_ERROR_TIMEOUT, "comm_create_ucx_joining rank %d: rank 0 gave up: not every rank it was "
                   "waiting for got its newcomer before its deadline (start this process again for the next "
                   "reshard_comm_ucx_rejoin or _resize), or this process passed size %d and the communicator's "
                   "change makes another", c->rank, c->size);
    else if (!r && tlen < head)
      r = rs_error(RESHARD_ERROR_MISMATCH, "comm_create_ucx_joining rank %d: rank 0's answer is short", c->rank);
    if (!r && joining) {
      uint64_t w[JOIN_WORDS];
      memcpy(w, table, sizeof w);
      rs_ux_take_counters(c, w);
      c->joined = c->rejoins + 1;
    }
    if (!r) r = connect_all(c, (uint8_t *)table + head, tlen - head);
    free(table);
  }
  free(mine);
  if (r) return r;
  /* every rank connected to every other: a first agreement */
  uint64_t one = 1;
  r = rs_ux_allreduce(c, &one, 1, deadline);
  if (r) rs_error_prefix("comm_create_ucx rank %d: the first agreement: ", c->rank);
  return r;
}

int64_t rs_ux_deadline_of(int timeout_ms) {
  int64_t ms = timeout_ms;
  if (ms < 1) {
    ms = 60000;
    int64_t v = 0;
    if (rs_param_get(RS_PARAM_TIMEOUT_MS, &v) && v >= 1) ms = v;
  }
  return rs_deadline_after_ms(ms);
}

static reshard_result_t create(const char *rendezvous, int rank, int size, int timeout_ms, int joining,
                               reshard_comm_t **out) {
  const char *fn = joining ? "comm_create_ucx_joining" : "comm_create_ucx";
  rs_error_clear();
  if (!out) return rs_error(RESHARD_ERROR_INVALID_ARGUMENT, "%s: out is NULL", fn);
  *out = NULL;
  if (size < 1 || size >= MAX_RANKS)
    return rs_error(RESHARD_ERROR_INVALID_ARGUMENT, "%s: size %d (1 to %d)", fn, size, MAX_RANKS - 1);
  if (rank < 0 || rank >= size)
    return rs_error(RESHARD_ERROR_INVALID_ARGUMENT, "%s: rank %d of size %d", fn, rank, size);
  if (joining && rank == 0)
    return rs_error(RESHARD_ERROR_INVALID_ARGUMENT, "%s: rank 0 holds the rendezvous and cannot be replaced; a "
                    "newcomer takes the slot of a rank 1 .. size-1", fn);
  const int64_t deadline = rs_ux_deadline_of(timeout_ms);
  reshard_comm_t *c = calloc(1, sizeof *c);
  ux_comm *m = calloc(1, sizeof *m);
  if (m) {
    m->ep = calloc((size_t)size, sizeof *m->ep);
    m->peer_failed = calloc((size_t)size, sizeof *m->peer_failed);
  }
  if (!c || !m || !m->ep || !m->peer_failed) {
    if (m) free(m->ep), free(m->peer_failed);
    free(c);
    free(m);
    return rs_error(RESHARD_ERROR_OUT_OF_MEMORY, "%s: out of memory", fn);
  }
  pthread_mutex_init(&m->lock, NULL);
  m->size = size;
  c->rank = rank;
  c->size = size;
  c->ops = &rs_ux_ops;
  c->impl = m;
  reshard_result_t r = setup(c, rendezvous, joining, deadline);
  if (r) {
    char msg[1024];
    snprintf(msg, sizeof msg, "%s%s", joining ? "(joining) " : "", reshard_last_error());
    reshard_comm_destroy(c);
    return rs_error(r, "%s", msg);
  }
  *out = c;
  return RESHARD_SUCCESS;
}

reshard_result_t reshard_comm_create_ucx(const char *rendezvous, int rank, int size, int timeout_ms,
                                         reshard_comm_t **out) {
  return create(rendezvous, rank, size, timeout_ms, 0, out);
}

reshard_result_t reshard_comm_create_ucx_joining(const char *rendezvous, int rank, int size, int timeout_ms,
                                                 reshard_comm_t **out) {
  return create(rendezvous, rank, size, timeout_ms, 1, out);
}
