/* Plan statistics and the human-readable dump. */
#include <inttypes.h>
#include <string.h>

#include "common/error.h"
#include "plan/plan.h"
#include "transport/transport.h"

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
