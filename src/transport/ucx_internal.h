/* What the three files of the UCX transport share (not installed): ucx.c
 * (messages, requests, waits, collectives, teardown), ucx_boot.c (the
 * rendezvous and communicator creation), ucx_rejoin.c (replacing a
 * rank) and ucx_rma.c (one-sided reads of registered buffers). The tags are described at the top of ucx.c. */
#ifndef RS_TRANSPORT_UCX_INTERNAL_H
#define RS_TRANSPORT_UCX_INTERNAL_H

#include <netinet/in.h>
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <ucp/api/ucp.h>

#include "transport/transport.h"

#define RANK_SHIFT 40
#define COLL_BIT (1ull << 39)
#define LOW_MASK (COLL_BIT - 1)
#define MAX_RANKS (1 << 24)
/* (collective numbers below this; the rendezvous' and the rejoin's own
 * tags above) */
#define TAG_ADDRESS (COLL_BIT | (1ull << 38) | 1)
#define TAG_TABLE (COLL_BIT | (1ull << 38) | 2)
/* replacing a rank (reshard_comm_ucx_rejoin): the newcomer's address to
 * rank 0, rank 0's table to the newcomer, the staying ranks' counters to
 * rank 0 and rank 0's answer to them */
#define TAG_JOIN (COLL_BIT | (1ull << 38) | 3)
#define TAG_JOIN_TABLE (COLL_BIT | (1ull << 38) | 4)
#define TAG_REJOIN_IN (COLL_BIT | (1ull << 38) | 5)
#define TAG_REJOIN_OUT (COLL_BIT | (1ull << 38) | 6)
#define AGREE_WORDS (RS_AGREE_MAX_WORDS + 2) /* values, n, ~n */

struct rs_request {
  void *ucx;       /* the UCP request; NULL once completed */
  int done, is_recv, peer;
  ucs_status_t status;
  size_t bytes, got; /* expected, and received (receives) */
  void *iov;          /* a boxes message's ucp_dt_iov_t array (freed with it) */
};

/* A collective: this rank's message to every other, and a slot for each
 * one's. */
typedef struct ux_coll {
  int n;
  int size; /* the communicator's size when it started (a resize changes it) */
  int cut; /* a rank it waited for was replaced (rejoin): it never completes */
  uint64_t *mine;  /* AGREE_WORDS */
  uint64_t *theirs; /* size x AGREE_WORDS */
  rs_request **send, **recv; /* size each (this rank's own: NULL) */
} ux_coll;

typedef struct ux_comm {
  pthread_mutex_t lock;
  int size;
  ucp_context_h ctx;
  ucp_worker_h worker;
  ucp_ep_h *ep;       /* to every rank (this one's own too) */
  ucp_ep_h boot_ep;   /* rendezvous: to rank 0 (others), NULL on rank 0 */
  ucp_listener_h listener;
  ucp_ep_h *accepted; /* rank 0: the rendezvous connections */
  int naccepted, nconn_req, accepted_cap;
  ucp_conn_request_h *conn_req;
  int *peer_failed;   /* a UCP error on that endpoint */
  int boot_failed;    /* on boot_ep */
  uint64_t coll_seq;
  /* Rejoins completed: salts the data tags, so that a message of the
   * replaced process (or of a plan before the rejoin) never pairs with
   * one of the newcomer's. */
  uint64_t epoch;
  int failed; /* a rejoin failed: every operation refuses (destroy it) */
  /* UCX (CUDA) communicators made over this one so far (ucx_cuda.c): the
   * newest one's number, agreed at its creation, salts its tags */
  uint64_t cuda_comms;
  struct sockaddr_in rdv; /* the rendezvous (rank 0 listens there while the communicator lives) */
  char rdv_name[256];
  /* rank 0: every rank's worker address (a newcomer gets the table) */
  void **addrs;
  size_t *alens;
  /* abandoned collectives (allreduce_late): ticket = index + 1 */
  ux_coll **abandoned;
  int nabandoned;
  /* iov arrays of abandoned boxes messages UCP may still read (a send
   * released to finish on its own): freed with the worker */
  void **orphans;
  size_t norphans;
  /* rs_ux_mem_map's registrations not yet released: those left (an
   * abandoned pool's, which a transfer may still use) are released after
   * the worker, which ends every transfer, and before the context, whose
   * cleanup aborts on a registration still held */
  void **memh;
  size_t nmemh, cap_memh;
} ux_comm;

/* The counters a newcomer takes from rank 0 (the header of its table, and
 * of the staying ranks' answer): they must equal the staying ranks'. */
enum { JOIN_EPOCH, JOIN_SEQ, JOIN_PLANS, JOIN_WORDS };
/* Rank 0's answer in a rejoin when not every newcomer came, to the
 * staying ranks and to the newcomers that did: one word, shorter than any
 * real answer (the counters and addresses, or the table). */
#define NO_NEWCOMER UINT64_C(0x6e6f6e65)

/* ucx.c */

/* The transport's operations (a UCX communicator's c->ops). */
extern const rs_transport_ops rs_ux_ops;
/* INVALID_USAGE: the communicator failed in a rejoin. */
reshard_result_t rs_ux_refuse_failed(const reshard_comm_t *c);
/* The UCS memory type of CUDA device memory as the UCX this process
 * loaded knows it: UCS_MEMORY_TYPE_CUDA where its context lists it (a
 * CUDA-enabled UCX on a machine with a GPU driver), -1 where UCX moves no
 * CUDA memory (ucx_cuda.c then bounces through pinned host memory). The emulated
 * device's tests wrap it: their "device" memory is host memory. */
int rs_ux_device_memtype(const reshard_comm_t *c);
/* isend / irecv (transport.h: reshard's 64-bit tag, the same matching and
 * completion) of memory whose UCS memory type is declared to UCP
 * (memtype): UCP need not find it (its cache of CUDA allocations misses
 * memory from a statically linked CUDA runtime, which it would take for
 * host memory); memh: rs_ux_mem_map's registration holding the buffer,
 * or NULL. */
reshard_result_t rs_ux_post_mem(reshard_comm_t *c, int peer, uint64_t tag, void *buf, size_t bytes, int is_recv,
                                int memtype, void *memh, rs_request **out);
/* Registers [addr, addr + bytes), of UCS memory type memtype (-1: UCX
 * finds it), with the communicator's UCP context, once: the handle (a
 * ucp_mem_h) to pass to rs_ux_post_mem for messages inside it, which then
 * need no registration of their own (UCX's registration cache still
 * holds the memory: it stays as trustworthy as UCX's memory hooks); NULL
 * where UCX cannot (logged: the messages register as they go). The
 * communicator keeps the handle until rs_ux_mem_unmap, or until it is
 * destroyed (a handle a transfer of a failed call may still use is just
 * never unmapped before). */
void *rs_ux_mem_map(reshard_comm_t *c, void *addr, size_t bytes, int memtype);
/* Releases rs_ux_mem_map's handle (NULL: nothing); no message may still
 * use it. */
void rs_ux_mem_unmap(reshard_comm_t *c, void *memh);
/* Whether a failed membership change left the communicator unusable. */
int rs_ux_failed(const reshard_comm_t *c);
/* BACKEND with UCX's text for a failed UCP call `what` (peer -1: none). */
reshard_result_t rs_ux_fail(ucs_status_t s, const char *what, int rank, int peer);
/* UCP send completion: marks the rs_request in `user` done. */
void rs_ux_on_send(void *request, ucs_status_t status, void *user);
/* UCP receive completion: marks the rs_request in `user` done, with its length. */
void rs_ux_on_recv(void *request, ucs_status_t status, const ucp_tag_recv_info_t *info, void *user);
/* UCP endpoint error handler (arg: the ux_comm): marks the rank failed. */
void rs_ux_on_ep_error(void *arg, ucp_ep_h ep, ucs_status_t status);
/* Posts a send or receive with the full UCP tag; *out: the request. */
reshard_result_t rs_ux_post(reshard_comm_t *c, int peer, ucp_tag_t tag, void *buf, size_t bytes, int is_recv,
                            rs_request **out);
/* The same for a message of iov[0..niov) (ucp_dt_iov_t, malloc'd: the
 * request owns it from here, also on failure). */
reshard_result_t rs_ux_post_iov(reshard_comm_t *c, int peer, ucp_tag_t tag, void *iov, size_t niov, size_t bytes,
                                int is_recv, rs_request **out);
/* The result of a completed request; frees it. */
reshard_result_t rs_ux_finish(reshard_comm_t *c, rs_request *r);
/* Waits for a request until the deadline (ops.wait). */
reshard_result_t rs_ux_wait(reshard_comm_t *c, rs_request *r, int64_t deadline);
/* Abandons a request and frees it (ops.cancel). */
void rs_ux_cancel(reshard_comm_t *c, rs_request *r);
/* Ends a request of a failed call for good: cancels it (a receive not yet
 * matched ends at once) and drives the worker until it has completed or
 * the deadline passes; 1: it completed and UCP no longer touches its
 * buffer; 0: released still running (rs_ux_cancel): keep its memory. */
int rs_ux_settle(reshard_comm_t *c, rs_request *r, int64_t deadline);
/* Drives the worker once (its messages in flight move on); never blocks. */
void rs_ux_progress(reshard_comm_t *c);
/* A numbered all-to-all agreement, the max of every rank's (ops.allreduce_max_u64). */
reshard_result_t rs_ux_allreduce(reshard_comm_t *c, uint64_t *vals, int n, int64_t deadline);
/* Closes an endpoint (forced, a second at most). Under the lock. */
void rs_ux_close_ep(ux_comm *m, ucp_ep_h ep);
/* Takes the unreceived messages matching tag/mask off the worker. Under the lock. */
void rs_ux_drain_unexpected(ux_comm *m, ucp_tag_t tag, ucp_tag_t mask);

/* ucx_rma.c: the transport's rma_* operations (transport.h) */
reshard_result_t rs_ux_rma_share(reshard_comm_t *c, uint64_t tag, void *const *bufs, const uint64_t *bytes,
                                 size_t nbufs, struct rs_share *sh, size_t n, int64_t deadline, void *keep,
                                 void **set);
void rs_ux_rma_adopt(reshard_comm_t *c, void *set, void *keep);
reshard_result_t rs_ux_rma_get(reshard_comm_t *c, void *set, size_t t, uint64_t off, void *to, size_t bytes);
reshard_result_t rs_ux_rma_flush(reshard_comm_t *c, void *set, int64_t deadline);
void rs_ux_rma_unshare(reshard_comm_t *c, void *set);

/* ucx_boot.c */

/* rs_ux_wait for a request of the rendezvous; cancels it at the deadline. */
reshard_result_t rs_ux_boot_wait(reshard_comm_t *c, rs_request *r, int64_t deadline, const char *what);
/* Receives a message of unknown length with tag/mask into a malloc'd buffer. */
reshard_result_t rs_ux_boot_recv_any(reshard_comm_t *c, ucp_tag_t tag, ucp_tag_t mask, int64_t probe_until,
                                     int64_t deadline, const char *what, void **buf, size_t *len,
                                     ucp_tag_t *sender);
/* Rank 0: progresses the worker, turns the pending connection requests into endpoints. Takes the lock. */
void rs_ux_accept_pending(ux_comm *m);
/* Rank 0 at teardown (under the lock): accepts the connections still
 * pending and stops listening. */
void rs_ux_stop_listening(ux_comm *m);
/* An endpoint to rank p's worker address. */
reshard_result_t rs_ux_connect_one(reshard_comm_t *c, int p, const void *address);
/* Rank 0: the address table after `head` zeroed bytes, malloc'd. */
reshard_result_t rs_ux_build_table(reshard_comm_t *c, size_t head, uint8_t **out, size_t *len);
/* Takes the counters w[JOIN_WORDS] (epoch, collective number, plans). */
void rs_ux_take_counters(reshard_comm_t *c, const uint64_t *w);
/* The deadline of a call's timeout_ms (below 1: RESHARD_TIMEOUT_MS or 60 s). */
int64_t rs_ux_deadline_of(int timeout_ms);

#endif
