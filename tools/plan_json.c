/* reshard_plan --json (plan_json.h): the collector and the writer. JSON
 * is written with plain fprintf; strings are escaped (json_str), and a
 * number that is not finite is written as null. */
#include "plan_json.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "reshard_internal.h"

typedef struct pj_pair {
  int32_t src, dst, phase; /* phase: -1 when its messages fall in several */
  uint64_t bytes, messages, fwd_bytes;
} pj_pair;

struct pj_world {
  int world;
  unsigned char *seen;
  /* per-peer scratch of the rank being added */
  uint64_t *p_bytes, *p_msgs, *p_fwd;
  int32_t *p_phase;
  pj_pair *pairs;
  size_t npairs, cap_pairs;
  /* per round: bytes and messages sent, over all ranks */
  uint64_t *r_bytes, *r_msgs;
  int nrounds, cap_rounds;
  /* the cost model's sums (once a plan with a topology came) */
  int has_cost;
  rs_topology topo;
  rs_rank_map map;
  rs_cost_acc acc;
};

pj_world *pj_create(int world) {
  pj_world *w = calloc(1, sizeof *w);
  if (!w) return NULL;
  size_t n = (size_t)world + 1;
  w->world = world;
  w->seen = calloc(n, 1);
  w->p_bytes = calloc(n, sizeof *w->p_bytes);
  w->p_msgs = calloc(n, sizeof *w->p_msgs);
  w->p_fwd = calloc(n, sizeof *w->p_fwd);
  w->p_phase = calloc(n, sizeof *w->p_phase);
  if (!w->seen || !w->p_bytes || !w->p_msgs || !w->p_fwd || !w->p_phase) {
    pj_free(w);
    return NULL;
  }
  return w;
}

void pj_free(pj_world *w) {
  if (!w) return;
  free(w->seen);
  free(w->p_bytes);
  free(w->p_msgs);
  free(w->p_fwd);
  free(w->p_phase);
  free(w->pairs);
  free(w->r_bytes);
  free(w->r_msgs);
  if (w->has_cost) {
    rs_cost_acc_free(&w->acc);
    free(w->map.node);
    free(w->map.domain);
  }
  free(w);
}

static reshard_result_t grow_rounds(pj_world *w, int n) {
  if (n <= w->cap_rounds) return RESHARD_SUCCESS;
  int cap = w->cap_rounds ? w->cap_rounds : 16;
  while (cap < n) cap *= 2;
  uint64_t *b = realloc(w->r_bytes, (size_t)cap * sizeof *b);
  if (b) w->r_bytes = b;
  uint64_t *m = realloc(w->r_msgs, (size_t)cap * sizeof *m);
  if (m) w->r_msgs = m;
  if (!b || !m) return rs_error(RESHARD_ERROR_OUT_OF_MEMORY, "--json: out of memory (%d rounds)", n);
  memset(w->r_bytes + w->cap_rounds, 0, (size_t)(cap - w->cap_rounds) * sizeof *b);
  memset(w->r_msgs + w->cap_rounds, 0, (size_t)(cap - w->cap_rounds) * sizeof *m);
  w->cap_rounds = cap;
  return RESHARD_SUCCESS;
}

static reshard_result_t push_pair(pj_world *w, pj_pair p) {
  if (w->npairs == w->cap_pairs) {
    size_t cap = w->cap_pairs ? 2 * w->cap_pairs : 256;
    pj_pair *v = realloc(w->pairs, cap * sizeof *v);
    if (!v) return rs_error(RESHARD_ERROR_OUT_OF_MEMORY, "--json: out of memory (%zu pairs)", cap);
    w->pairs = v;
    w->cap_pairs = cap;
  }
  w->pairs[w->npairs++] = p;
  return RESHARD_SUCCESS;
}

/* The cost model's share of the plan, summed as the estimate sums it. The
 * first plan with a topology gives the topology and the rank map (every
 * plan of the world has the same). */
static reshard_result_t add_cost(pj_world *w, const reshard_plan_t *plan) {
  if (!plan->has_topo) return RESHARD_SUCCESS;
  if (!w->has_cost) {
    const rs_rank_map *m = &plan->map;
    w->topo = plan->topo;
    w->map = *m;
    w->map.node = malloc(((size_t)m->nranks + 1) * sizeof *w->map.node);
    w->map.domain = malloc(((size_t)m->nranks + 1) * sizeof *w->map.domain);
    if (!w->map.node || !w->map.domain) {
      free(w->map.node);
      free(w->map.domain);
      return rs_error(RESHARD_ERROR_OUT_OF_MEMORY, "--json: out of memory");
    }
    memcpy(w->map.node, m->node, (size_t)m->nranks * sizeof *m->node);
    memcpy(w->map.domain, m->domain, (size_t)m->nranks * sizeof *m->domain);
    rs_cost_acc_init(&w->acc, &w->topo, &w->map, w->world);
    w->has_cost = 1;
  }
  rs_cost_rank c;
  RS_CHECK(rs_cost_rank_compute(plan, &c));
  reshard_result_t r = rs_cost_acc_add(&w->acc, &c);
  rs_cost_rank_free(&c);
  return r;
}

reshard_result_t pj_add(pj_world *w, int rank, const reshard_plan_t *plan) {
  if (rank < 0 || rank >= w->world || w->seen[rank]) return RESHARD_SUCCESS;
  w->seen[rank] = 1;
  const int P = plan->phases > 1 ? plan->phases : 1;
  RS_CHECK(grow_rounds(w, plan->nrounds));
  if (plan->nrounds > w->nrounds) w->nrounds = plan->nrounds;
  for (size_t i = 0; i < plan->nsends; i++) {
    const rs_msg *m = &plan->sends[i];
    if (m->peer < 0 || m->peer >= w->world || m->round < 0 || m->round >= plan->nrounds)
      return rs_error(RESHARD_ERROR_INTERNAL, "--json: rank %d: message to %d in round %d out of range", rank, m->peer,
                      m->round);
    int32_t ph = m->round % P;
    if (!w->p_msgs[m->peer]) w->p_phase[m->peer] = ph;
    else if (w->p_phase[m->peer] != ph) w->p_phase[m->peer] = -1;
    w->p_bytes[m->peer] += m->bytes;
    w->p_msgs[m->peer]++;
    if (m->fwd) w->p_fwd[m->peer] += m->bytes;
    w->r_bytes[m->round] += m->bytes;
    w->r_msgs[m->round]++;
  }
  reshard_result_t r = RESHARD_SUCCESS;
  for (int q = 0; q < w->world; q++) {
    if (!w->p_msgs[q]) continue;
    pj_pair p = {rank, q, w->p_phase[q], w->p_bytes[q], w->p_msgs[q], w->p_fwd[q]};
    if (!r) r = push_pair(w, p);
    w->p_bytes[q] = w->p_msgs[q] = w->p_fwd[q] = 0;
  }
  return r ? r : add_cost(w, plan);
}

/* ---- writing ---- */

static void json_str(FILE *f, const char *s) {
  fputc('"', f);
  for (const unsigned char *p = (const unsigned char *)(s ? s : ""); *p; p++) {
    if (*p == '"' || *p == '\\') fprintf(f, "\\%c", *p);
    else if (*p == '\n') fputs("\\n", f);
    else if (*p == '\t') fputs("\\t", f);
    else if (*p == '\r') fputs("\\r", f);
    else if (*p < 0x20) fprintf(f, "\\u%04x", *p);
    else fputc(*p, f);
  }
  fputc('"', f);
}

static void json_num(FILE *f, double x) {
  if (isfinite(x)) fprintf(f, "%.15g", x);
  else fputs("null", f);
}

static void json_key(FILE *f, const char *k) {
  json_str(f, k);
  fputc(':', f);
}

/* An estimate's per-kind seconds, the non-zero ones, as an object. */
static void json_bound_seconds(FILE *f, const reshard_estimate_t *e) {
  fputc('{', f);
  int first = 1;
  for (int k = 1; k < RESHARD_NUM_BOUNDS; k++) {
    if (!(e->bound_seconds[k] > 0)) continue;
    if (!first) fputc(',', f);
    first = 0;
    json_key(f, reshard_bound_name((reshard_bound_t)k));
    json_num(f, e->bound_seconds[k]);
  }
  fputc('}', f);
}

static void write_topology(FILE *f, const pj_world *w) {
  json_key(f, "topology");
  if (!w->has_cost) {
    fputs("null", f);
    return;
  }
  const rs_topology *t = &w->topo;
  fputc('{', f);
  json_key(f, "name");
  json_str(f, t->name);
  fprintf(f, ",\"ranks_per_node\":%d,\"domain_size\":%d,\"domain_used\":%d,\"nodes\":%d,\"domains\":%d", t->ranks_per_node,
          t->domain_size, t->domain_used, w->map.nnodes, w->map.ndomains);
  fputs(",\"nic_bytes_per_s\":", f);
  json_num(f, rs_topology_rank_nic_bw(t));
  fputs(",\"nvlink_bytes_per_s\":", f);
  json_num(f, t->nvlink_bw);
  fputs(",\"node_copy_bytes_per_s\":", f);
  json_num(f, t->node_copy_bw);
  fputs(",\"net_latency_s\":", f);
  json_num(f, t->net_latency_s);
  fputs(",\"nvlink_latency_s\":", f);
  json_num(f, t->nvlink_latency_s);
  fputs(",\"net_msg_s\":", f);
  json_num(f, t->net_msg_s);
  fputs(",\"nvlink_msg_s\":", f);
  json_num(f, t->nvlink_msg_s);
  fputc('}', f);
}

static void write_phases(FILE *f, const pj_meta *m) {
  fprintf(f, "\"phases\":{\"count\":%d,\"wide_bytes\":%llu,\"pace_rounds\":%d,\"estimates\":[", m->phases,
          (unsigned long long)m->wide_bytes, m->pace_rounds);
  int first = 1;
  for (int k = 0; m->phase_est && k < RS_PHASE_COUNTS; k++) {
    const uint64_t *est = m->phase_est;
    int c = k * RS_WIDE_CANDIDATES, best = c;
    for (int x = 1; x < RS_WIDE_CANDIDATES; x++)
      if (est[c + x] < est[best]) best = c + x;
    if (est[best] == UINT64_MAX) continue; /* over RESHARD_MAX_PHASES, or none fits */
    fprintf(f, "%s{\"phases\":%d,\"seconds\":", first ? "" : ",", 1 << k);
    first = 0;
    json_num(f, est[c] == UINT64_MAX ? NAN : (double)est[c] * 1e-12);
    fputs(",\"best_seconds\":", f);
    json_num(f, (double)est[best] * 1e-12);
    fprintf(f, ",\"best_wide_bytes\":%llu}", (unsigned long long)(best == c ? 0 : rs_phase_wide_bytes(best)));
  }
  fputs("]}", f);
}

static void write_ranks(FILE *f, const pj_world *w, const pj_meta *m) {
  fputs("\"ranks\":[", f);
  for (int r = 0; r < m->world; r++) {
    const reshard_plan_stats_t *s = &m->stats[r];
    fprintf(f, "%s\n{\"rank\":%d,\"role\":", r ? "," : "", r);
    json_str(f, cli_role(m->L, r));
    if (w->has_cost && r < w->map.nranks) fprintf(f, ",\"node\":%d,\"domain\":%d", w->map.node[r], w->map.domain[r]);
    else fputs(",\"node\":null,\"domain\":null", f);
    fprintf(f,
            ",\"send_bytes\":%zu,\"recv_bytes\":%zu,\"local_copy_bytes\":%zu,\"send_messages\":%zu,\"recv_messages\":%zu,"
            "\"send_peers\":%d,\"recv_peers\":%d,\"rounds\":%d,\"segments\":%zu}",
            s->send_bytes, s->recv_bytes, s->local_copy_bytes, s->send_messages, s->recv_messages, s->num_send_peers,
            s->num_recv_peers, s->num_chunks, s->segments);
  }
  fputs("]", f);
}

static void write_pairs(FILE *f, const pj_world *w) {
  fputs("\"pairs\":[", f);
  for (size_t i = 0; i < w->npairs; i++) {
    const pj_pair *p = &w->pairs[i];
    const char *link = "null";
    if (w->has_cost && p->src < w->map.nranks && p->dst < w->map.nranks)
      link = w->map.domain[p->src] == w->map.domain[p->dst] ? "\"nvlink\"" : "\"nic\"";
    fprintf(f,
            "%s\n{\"src\":%d,\"dst\":%d,\"bytes\":%llu,\"messages\":%llu,\"forward_bytes\":%llu,\"link\":%s,"
            "\"phase\":%d}",
            i ? "," : "", p->src, p->dst, (unsigned long long)p->bytes, (unsigned long long)p->messages,
            (unsigned long long)p->fwd_bytes, link, p->phase);
  }
  fputs("]", f);
}

/* One round's links: per link of the cost model, its busiest rank, that
 * rank's time on it, the latency part, and the bytes of the term
 * (time - latency) x bandwidth. */
static void write_round_links(FILE *f, const pj_world *w, int k) {
  static const char *names[RS_NLINKS] = {"nic-egress", "nic-ingress", "nvlink-egress", "nvlink-ingress", "local-copy"};
  fputs(",\"links\":{", f);
  for (int l = 0; l < RS_NLINKS; l++) {
    size_t i = (size_t)k * RS_NLINKS + (size_t)l;
    uint64_t ps = k < w->acc.nrounds ? w->acc.max_ps[i] : 0;
    if (l) fputc(',', f);
    json_key(f, names[l]);
    if (!ps) {
      fputs("null", f);
      continue;
    }
    uint64_t lat = w->acc.where_lat[i];
    double bw = l <= RS_LINK_NIC_IN ? rs_topology_rank_nic_bw(&w->topo) : w->topo.nvlink_bw;
    fprintf(f, "{\"rank\":%d,\"seconds\":", w->acc.where[i]);
    json_num(f, (double)ps * 1e-12);
    fputs(",\"latency_s\":", f);
    json_num(f, (double)lat * 1e-12);
    fprintf(f, ",\"bytes\":%.0f}", floor((double)(ps - lat) * 1e-12 * bw + 0.5));
  }
  fputc('}', f);
}

static int write_rounds(FILE *f, const pj_world *w, const pj_meta *m) {
  int n = w->nrounds;
  if (w->has_cost && w->acc.nrounds > n) n = w->acc.nrounds;
  size_t sz = (size_t)n + 1;
  int *kind = malloc(sz * sizeof *kind);
  uint64_t *dur = malloc(sz * sizeof *dur);
  int32_t *node_where = malloc(sz * sizeof *node_where);
  if (!kind || !dur || !node_where) {
    free(kind);
    free(dur);
    free(node_where);
    return -1;
  }
  if (w->has_cost) /* acc's arrays cover its rounds; n exceeds them only without cost rounds */
    rs_cost_round_bounds(&w->topo, w->map.nnodes, w->acc.nrounds, w->acc.max_ps, w->acc.node_bytes, kind, dur,
                         node_where);
  const int P = m->phases > 1 ? m->phases : 1;
  fputs("\"rounds\":[", f);
  for (int k = 0; k < n; k++) {
    fprintf(f, "%s\n{\"round\":%d,\"bytes\":%llu,\"messages\":%llu,\"phase\":%d", k ? "," : "", k,
            (unsigned long long)(k < w->nrounds ? w->r_bytes[k] : 0), (unsigned long long)(k < w->nrounds ? w->r_msgs[k] : 0),
            k % P);
    if (w->has_cost && k < w->acc.nrounds && kind[k] >= 0) {
      fputs(",\"seconds\":", f);
      json_num(f, (double)dur[k] * 1e-12);
      fputs(",\"bound\":", f);
      json_str(f, reshard_bound_name((reshard_bound_t)(kind[k] + 1)));
      fprintf(f, ",\"bound_where\":%d", kind[k] < RS_NLINKS ? w->acc.where[(size_t)k * RS_NLINKS + (size_t)kind[k]]
                                                            : node_where[k]);
      write_round_links(f, w, k);
    } else {
      fputs(",\"seconds\":null,\"bound\":null,\"bound_where\":null,\"links\":null", f);
    }
    fputc('}', f);
  }
  fputs("]", f);
  free(kind);
  free(dur);
  free(node_where);
  return 0;
}

static void write_estimate(FILE *f, const pj_meta *m) {
  json_key(f, "estimate");
  if (!m->ours || !m->cost) {
    fputs("null,\"baselines\":null", f);
    return;
  }
  const reshard_estimate_t *e = m->ours, *lb = &m->cost->lower;
  fputs("{\"predicted_s\":", f);
  json_num(f, e->seconds);
  fputs(",\"lower_s\":", f);
  json_num(f, lb->seconds);
  fputs(",\"ratio\":", f);
  json_num(f, lb->seconds > 0 ? e->seconds / lb->seconds : NAN);
  fprintf(f, ",\"rounds\":%d,\"bytes\":%llu,\"bound\":", e->num_rounds, (unsigned long long)e->bytes);
  json_str(f, reshard_bound_name(e->bound));
  fprintf(f, ",\"bound_where\":%d,\"latency_s\":", e->bound_where);
  json_num(f, e->latency_seconds);
  fputs(",\"bound_seconds\":", f);
  json_bound_seconds(f, e);
  fputs(",\"lower\":{\"bound\":", f);
  json_str(f, reshard_bound_name(lb->bound));
  fprintf(f, ",\"bound_where\":%d,\"unique_bytes\":%llu,\"terms\":", lb->bound_where, (unsigned long long)lb->bytes);
  json_bound_seconds(f, lb);
  fputs("}},\n\"baselines\":{\"gather-broadcast\":", f);
  json_num(f, m->cost->gather_broadcast_s);
  fputs(",\"replica0-direct\":", f);
  json_num(f, m->cost->replica0.seconds);
  fputs(",\"balanced-direct\":", f);
  json_num(f, m->cost->balanced.seconds);
  fputc('}', f);
}

static void write_header(FILE *f, const pj_meta *m) {
  size_t tot[6] = {0};
  for (int r = 0; r < m->world; r++) {
    const reshard_plan_stats_t *s = &m->stats[r];
    tot[0] += s->send_bytes, tot[1] += s->recv_bytes, tot[2] += s->local_copy_bytes;
    tot[3] += s->send_messages, tot[4] += s->recv_messages, tot[5] += s->segments;
  }
  fputs("{\"schema\":\"reshard-plan\",\"version\":1,\"description\":", f);
  json_str(f, m->L->desc);
  fprintf(f, ",\n\"world\":%d,\"sources\":%d,\"destinations\":%d,\"colocated\":%s,\"tensors\":%d", m->world, m->L->nsrc,
          m->L->ndst, m->colocated ? "true" : "false", reshard_layout_num_tensors(m->L->dst));
  fprintf(f, ",\"staging_bytes\":%zu,\"chunk_bytes\":%zu,\"relay\":%d,\"spread_rounds\":%d,\n", m->opts->staging_bytes,
          m->chunk, m->relay, m->spread_rounds);
  fprintf(f,
          "\"totals\":{\"send_bytes\":%zu,\"recv_bytes\":%zu,\"local_copy_bytes\":%zu,\"send_messages\":%zu,"
          "\"recv_messages\":%zu,\"segments\":%zu},\n",
          tot[0], tot[1], tot[2], tot[3], tot[4], tot[5]);
  json_key(f, "spreading");
  if (m->spread_kept) {
    fputs("{\"kept\":true,\"pre_plan_s\":", f);
    json_num(f, m->spread_pre_s);
    fprintf(f, ",\"moved_bytes\":%llu}", (unsigned long long)m->spread_moved_bytes);
  } else {
    fputs("null", f);
  }
  fputc(',', f);
  json_key(f, "gathering");
  if (m->gather_priced) {
    fputs("{\"pre_plan_s\":", f);
    json_num(f, m->gather_pre_s);
    fprintf(f, ",\"bytes\":%llu}", (unsigned long long)m->gather_bytes);
  } else {
    fputs("null", f);
  }
  fputs(",\n", f);
}

int pj_write(const pj_world *w, const pj_meta *m, const char *path) {
  FILE *f = fopen(path, "w");
  if (!f) {
    fprintf(stderr, "reshard_plan: error: --json '%s': %s\n", path, strerror(errno));
    return -1;
  }
  write_header(f, m);
  write_phases(f, m);
  fputs(",\n", f);
  write_topology(f, w);
  fputs(",\n", f);
  write_estimate(f, m);
  fputs(",\n", f);
  write_ranks(f, w, m);
  fputs(",\n", f);
  write_pairs(f, w);
  fputs(",\n", f);
  int rc = write_rounds(f, w, m);
  fputs("}\n", f);
  if (ferror(f)) rc = -1;
  if (fclose(f)) rc = -1;
  if (rc) fprintf(stderr, "reshard_plan: error: --json '%s': write failed (%s)\n", path, strerror(errno ? errno : EIO));
  return rc;
}
