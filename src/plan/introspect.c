/* What a plan says about itself: its statistics and per-peer traffic,
 * and the buffers it touches, computed once when creation finishes
 * (rs_plan_peer_stats, rs_plan_fill_stats, rs_plan_collect_used, called
 * from create.c's finish_plan; rs_plan_add_pre_stats for plans with a
 * pre-plan), then read through reshard_plan_get_stats,
 * reshard_plan_get_peer_stats, the execute-time buffer checks and the
 * human-readable dump. The computing sits here, beside its readers,
 * rather than in create.c, whose business is building the plan. */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"
#include "common/error.h"
#include "plan/plan.h"
#include "plan/planner.h"
#include "transport/transport.h"

static void mark_used(const rs_copy *c, size_t n, int src_side, unsigned char *seen) {
  for (size_t i = 0; i < n; i++) {
    int id = src_side ? c[i].src_buf : c[i].dst_buf;
    if (id >= 0) seen[id] = 1;
  }
}

/* Buffers the executor will dereference, with their sizes and names for
 * execute-time checks. Sends read source buffers, relay forwards
 * destination buffers; receives and local copies write destination
 * buffers. */
reshard_result_t rs_plan_collect_used(const reshard_layout_t *L, const reshard_plan_t *p, int src_side,
                                      rs_used_buffer **out, int *nout) {
  unsigned char *seen = rs_calloc((size_t)L->nbuffers + 1, 1);
  if (!seen) return rs_error(RESHARD_ERROR_OUT_OF_MEMORY, "plan_create: out of memory");
  for (size_t i = 0; i < p->nsends; i++)
    if ((p->sends[i].fwd ? 0 : 1) == src_side) mark_used(p->send_copies + p->sends[i].first_copy, p->sends[i].ncopies, 1, seen);
  if (!src_side) mark_used(p->recv_copies, p->nrecv_copies, 0, seen);
  mark_used(p->local_copies, p->nlocal_copies, src_side, seen);
  int n = 0;
  for (int id = 0; id < L->nbuffers; id++) n += seen[id];
  rs_used_buffer *u = rs_calloc((size_t)n + 1, sizeof *u);
  if (!u) {
    free(seen);
    return rs_error(RESHARD_ERROR_OUT_OF_MEMORY, "plan_create: out of memory");
  }
  int k = 0;
  reshard_result_t r = RESHARD_SUCCESS;
  for (int id = 0; id < L->nbuffers && r == RESHARD_SUCCESS; id++) {
    if (!seen[id]) continue;
    u[k].id = id;
    r = rs_layout_buffer_bytes(L, id, p->rank, &u[k].bytes);
    u[k].name = rs_strdup(L->buffers[id].name);
    if (!u[k].name && r == RESHARD_SUCCESS) r = rs_error(RESHARD_ERROR_OUT_OF_MEMORY, "plan_create: out of memory");
    k++;
  }
  free(seen);
  *out = u;
  *nout = k;
  return r;
}

/* p->stats from the finished plan (its per-peer figures first). */
void rs_plan_fill_stats(reshard_plan_t *p) {
  reshard_plan_stats_t *s = &p->stats;
  memset(s, 0, sizeof *s);
  s->rank = p->rank;
  s->num_chunks = p->nrounds;
  s->chunk_bytes = p->chunk_bytes;
  s->phases = p->phases;
  s->wide_bytes = p->phases > 1 ? p->wide_bytes : 0;
  /* the horizon paces streams inside a domain, wide ones and the network
   * streams nothing waits on (rs_chunk_cap): 0 without a pace */
  uint64_t horizon = rs_pace_rounds(p, p->chunk_bytes);
  s->pace_rounds = horizon > INT32_MAX ? INT32_MAX : (int)horizon;
  s->staging_bytes = rs_staging_bytes(p);
  s->send_messages = p->nsends;
  s->recv_messages = p->nrecvs;
  s->segments = p->nsend_copies + p->nrecv_copies + p->nlocal_copies;
  for (size_t i = 0; i < p->nlocal_copies; i++) s->local_copy_bytes += rs_copy_bytes(&p->local_copies[i]);
  size_t npeers = 0;
  for (size_t i = 0; i < p->npeers; i++) {
    const reshard_peer_stats_t *ps = &p->peers[i];
    s->send_bytes += ps->send_bytes;
    s->recv_bytes += ps->recv_bytes;
    s->num_send_peers += ps->send_messages > 0;
    s->num_recv_peers += ps->recv_messages > 0;
    npeers++;
  }
  (void)npeers;
}

/* p->peers: each peer's traffic with this rank, sorted by peer. */
reshard_result_t rs_plan_peer_stats(reshard_plan_t *p) {
  int *slot = rs_malloc((size_t)p->size * sizeof *slot);
  if (!slot) return rs_error(RESHARD_ERROR_OUT_OF_MEMORY, "plan_create: out of memory");
  for (int i = 0; i < p->size; i++) slot[i] = -1;
  size_t n = 0;
  for (size_t i = 0; i < p->nsends + p->nrecvs; i++) {
    int peer = i < p->nsends ? p->sends[i].peer : p->recvs[i - p->nsends].peer;
    if (slot[peer] < 0) slot[peer] = (int)n++;
  }
  p->peers = rs_calloc(n + 1, sizeof *p->peers);
  if (!p->peers) {
    free(slot);
    return rs_error(RESHARD_ERROR_OUT_OF_MEMORY, "plan_create: out of memory");
  }
  /* sorted by peer */
  size_t k = 0;
  for (int peer = 0; peer < p->size; peer++)
    if (slot[peer] >= 0) {
      slot[peer] = (int)k;
      p->peers[k++].peer = peer;
    }
  for (size_t i = 0; i < p->nsends; i++) {
    reshard_peer_stats_t *ps = &p->peers[slot[p->sends[i].peer]];
    ps->send_bytes += p->sends[i].bytes;
    ps->send_messages++;
  }
  for (size_t i = 0; i < p->nrecvs; i++) {
    reshard_peer_stats_t *ps = &p->peers[slot[p->recvs[i].peer]];
    ps->recv_bytes += p->recvs[i].bytes;
    ps->recv_messages++;
  }
  p->npeers = n;
  free(slot);
  return RESHARD_SUCCESS;
}

/* Adds the pre-plan's traffic to the plan's totals: the bytes a plan with
 * block quantization or source-side spreading moves are both plans'. */
void rs_plan_add_pre_stats(reshard_plan_t *p, const reshard_plan_t *pre) {
  reshard_plan_stats_t *a = &p->stats;
  const reshard_plan_stats_t *b = &pre->stats;
  a->send_bytes += b->send_bytes;
  a->recv_bytes += b->recv_bytes;
  a->send_messages += b->send_messages;
  a->recv_messages += b->recv_messages;
  a->local_copy_bytes += b->local_copy_bytes;
  a->segments += b->segments;
}

reshard_result_t reshard_plan_get_stats(const reshard_plan_t *plan,
                                        reshard_plan_stats_t *stats) {
  rs_error_clear();
  if (!plan || !stats) return rs_error(RESHARD_ERROR_INVALID_ARGUMENT, "get_stats: NULL argument");
  *stats = plan->stats;
  return RESHARD_SUCCESS;
}

reshard_result_t reshard_plan_get_peer_stats(const reshard_plan_t *plan,
                                             reshard_peer_stats_t *out,
                                             size_t capacity, size_t *count) {
  rs_error_clear();
  if (!plan || !count || (capacity && !out))
    return rs_error(RESHARD_ERROR_INVALID_ARGUMENT, "get_peer_stats: NULL argument");
  size_t n = plan->npeers < capacity ? plan->npeers : capacity;
  if (n) memcpy(out, plan->peers, n * sizeof *out);
  *count = plan->npeers;
  return RESHARD_SUCCESS;
}

static void dump_copy(FILE *f, const char *what, const rs_copy *c) {
  fprintf(f, "    %s src_buf=%d+%" PRIu64 " dst_buf=%d+%" PRIu64 " run=%" PRIu64 " dims=[", what, c->src_buf, c->src_off,
          c->dst_buf, c->dst_off, c->run_bytes);
  for (int d = 0; d < c->ndim; d++) fprintf(f, "%s%" PRId64, d ? "," : "", c->extent[d]);
  fprintf(f, "] bytes=%" PRIu64 "\n", rs_copy_bytes(c));
}

reshard_result_t reshard_plan_dump(const reshard_plan_t *p, FILE *f,
                                   long max_segments) {
  rs_error_clear();
  if (!p || !f) return rs_error(RESHARD_ERROR_INVALID_ARGUMENT, "plan_dump: NULL argument");
  const reshard_plan_stats_t *s = &p->stats;
  fprintf(f, "reshard plan: rank %d of %d, transport %s, digest %016" PRIx64 "\n", p->rank, p->size, p->comm->ops->name, p->digest);
  fprintf(f, "  topology %s, relay %s\n", p->has_topo ? p->topo.name : "none",
          p->opts.relay == 1 ? "on" : p->opts.relay == 0 ? "off" : p->relay_chosen ? "auto: chosen by the cost model" : "auto: direct");
  fprintf(f, "  send %zu bytes in %zu messages to %d peers; receive %zu bytes in %zu messages from %d peers\n", s->send_bytes,
          s->send_messages, s->num_send_peers, s->recv_bytes, s->recv_messages, s->num_recv_peers);
  fprintf(f, "  local copies %zu bytes; %zu segments; %d rounds of at most %zu bytes per message, %d phases; staging %zu bytes\n",
          s->local_copy_bytes, s->segments, s->num_chunks, s->chunk_bytes, s->phases, s->staging_bytes);
  if (s->wide_bytes) fprintf(f, "  streams over %zu bytes send in every round\n", s->wide_bytes);
  if (s->pace_rounds)
    fprintf(f,
            "  paced over %d rounds (the longest network streams: narrow %" PRIu64 " bytes, wide %" PRIu64
            " bytes; inside a domain %" PRIu64 " bytes)\n",
            s->pace_rounds, p->pace.narrow, p->pace.wide, p->pace.inside);
  for (size_t i = 0; i < p->npeers; i++)
    fprintf(f, "  peer %d: send %zu bytes / %zu msgs, receive %zu bytes / %zu msgs\n", p->peers[i].peer, p->peers[i].send_bytes,
            p->peers[i].send_messages, p->peers[i].recv_bytes, p->peers[i].recv_messages);
  long left = max_segments < 0 ? -1 : max_segments;
  for (size_t i = 0; i < p->nsends && left; i++) {
    const rs_msg *m = &p->sends[i];
    fprintf(f, "  round %d %s to %d: %" PRIu64 " bytes at staging+%" PRIu64 ", %u segments\n", m->round,
            m->fwd ? "forward" : "send", m->peer, m->bytes, m->staging_off, m->ncopies);
    for (uint32_t k = 0; k < m->ncopies && left; k++, left--) dump_copy(f, "pack", &p->send_copies[m->first_copy + k]);
  }
  for (size_t i = 0; i < p->nrecvs && left; i++) {
    const rs_msg *m = &p->recvs[i];
    fprintf(f, "  round %d receive from %d: %" PRIu64 " bytes at staging+%" PRIu64 ", %u segments\n", m->round, m->peer, m->bytes,
            m->staging_off, m->ncopies);
    for (uint32_t k = 0; k < m->ncopies && left; k++, left--) dump_copy(f, "unpack", &p->recv_copies[m->first_copy + k]);
  }
  for (size_t i = 0; i < p->nlocal_copies && left; i++, left--) dump_copy(f, "local", &p->local_copies[i]);
  return RESHARD_SUCCESS;
}
