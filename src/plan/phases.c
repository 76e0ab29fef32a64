/* Phases: which rounds a stream sends in, and how many phases a plan
 * takes (plan.h, reshard_plan_t.phases).
 *
 * A rank with S long streams and half-budget H sends S messages of about
 * H / S a round, each paying the per-message latency. With P phases the
 * stream from -> to sends only in the rounds congruent to its phase
 * modulo P: a round holds about S / P streams, each with messages up to P
 * times larger, so the bytes a round stay the same and the messages drop
 * P-fold. That holds only while every link's bytes spread evenly over the
 * phases: a link whose busiest phase carries more than 1/P of its bytes
 * stretches by that much, since a phase has 1/P of the rounds. So every
 * rank estimates, per candidate P, its busiest link's time (the bytes of
 * its busiest phase, P times) plus that link's messages at the chunk it
 * would size at P, times the latency; the plan takes the P whose worst
 * estimate over the ranks is lowest.
 *
 * Ranks in phases balance a link only as finely as its streams: a rank
 * that receives 64 streams of 80 MB and one of 230 MB (a relay forward)
 * has one phase 17% heavier than the rest at P = 8. So a stream longer
 * than a threshold is wide: it sends in every round, its bytes spread
 * over all phases. Its two ends know its bytes, so they agree on it; the
 * threshold is a candidate beside P (none, 1 GiB, 512 MiB, ... 1 MiB),
 * estimated and agreed with it. */
#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"
#include "common/error.h"
#include "plan/plan.h"
#include "plan/topology.h"

/* The phase of from -> to among P: the sum of both ranks' base-P digits,
 * mod P. A rank's peers are mostly arithmetic runs (the replicas, TP
 * shards or pipeline stages of a layout); with (from + to) mod P a run
 * whose step shares a factor with P (8 TP shards apart, P = 16) would
 * land in few phases, while the digit sum spreads it through the higher
 * digits, and a run of consecutive ranks still covers every phase. */
static int32_t phase_of(int64_t P, int32_t from, int32_t to) {
  if (P <= 1) return 0;
  int64_t sum = 0;
  for (int64_t x = from; x > 0; x /= P) sum += x % P;
  for (int64_t x = to; x > 0; x /= P) sum += x % P;
  return (int32_t)(sum % P);
}

/* Wide: over the threshold, as rounded to 64 bytes or not (a multiple
 * of 64 answers both alike). */
static int is_wide(uint64_t wide, uint64_t bytes) { return wide && bytes > wide; }

int rs_stream_wide(const reshard_plan_t *plan, uint64_t bytes) {
  return plan->phases > 1 && is_wide(plan->wide_bytes, bytes);
}

int32_t rs_stream_phase(const reshard_plan_t *plan, int32_t from, int32_t to, uint64_t bytes) {
  if (plan->phases <= 1) return 0;
  return rs_stream_wide(plan, bytes) ? -1 : phase_of(plan->phases, from, to);
}

uint64_t rs_phase_wide_bytes(int c) {
  int w = c % RS_WIDE_CANDIDATES;
  return w ? (uint64_t)1 << (30 - (w - 1)) : 0;
}

enum { MAX_P = 1 << (RS_PHASE_COUNTS - 1) };

/* Links of a rank: out or in, over the network or inside a domain. */
static int link_of(const reshard_plan_t *plan, int32_t from, int32_t to) {
  int inside = plan->map.domain && plan->map.domain[from] == plan->map.domain[to];
  return (from == plan->rank) * 2 + inside;
}

static uint64_t to_ps(double s) {
  double ps = s * 1e12;
  return ps < 1.8e19 ? (uint64_t)ps : (uint64_t)1.8e19;
}

/* The busiest link's time at P phases, seconds: its busiest phase's
 * bytes over the link's bandwidth, P times; phase[i] as rs_stream_phase
 * (-1: wide, a P-th of its bytes in each phase). */
static double busiest_link(const reshard_plan_t *plan, const rs_streams *st, int64_t P, const int32_t *phase,
                           const double *bw) {
  double t[4][MAX_P], all[4] = {0, 0, 0, 0};
  memset(t, 0, sizeof t);
  for (size_t i = 0; i < st->n; i++) {
    int l = link_of(plan, st->from[i], st->to[i]);
    double s = (double)st->bytes[i] / bw[l & 1];
    if (phase[i] < 0) all[l] += s / (double)P;
    else t[l][phase[i]] += s;
  }
  double worst = 0;
  for (int l = 0; l < 4; l++)
    for (int64_t q = 0; q < P; q++)
      if (t[l][q] + all[l] > worst) worst = t[l][q] + all[l];
  return worst * (double)P;
}

/* The busiest link's latency at P phases, seconds: each message's own
 * cost, every stream cut at its cap for the chunk this rank would size,
 * plus the link's latency once for every round it is used in (the
 * longest stream of each phase, summed over the phases: a stream in one
 * phase sends every P-th round, beside the other streams of its phase). -1 when P does not fit the staging at all: a stream's spread
 * share is its bytes over the spread rounds a phase gets, and when a
 * phase holds more than its part of the bytes, those shares alone can
 * overflow the round. */
static double busiest_latency(reshard_plan_t *tmp, const rs_streams *st, const int32_t *phase, uint64_t *sums) {
  int64_t P = tmp->phases;
  uint64_t limit = rs_streams_limit(tmp, st, phase, tmp->opts.staging_bytes / 2, sums);
  if (limit < 64 && P > 1) return -1;
  uint64_t chunk = rs_chunk_bound(&tmp->opts, limit);
  /* The rounds a link is used in: a stream of m messages in phase p
   * sends in rounds p, p + P, ..., so the streams of one phase share
   * their rounds (the longest one's m of them) and phases use disjoint
   * rounds; a wide stream sends in rounds 0 .. m-1, which overlap the
   * phases' (counted as the larger of the two). */
  double msgs[4] = {0, 0, 0, 0}, wide[4] = {0, 0, 0, 0}, rounds[4] = {0, 0, 0, 0};
  double per_phase[4][MAX_P];
  memset(per_phase, 0, sizeof per_phase);
  for (size_t i = 0; i < st->n; i++) {
    uint64_t cap = rs_chunk_cap(tmp, chunk, st->bytes[i], st->kind[i]);
    double m = (double)((st->bytes[i] + cap - 1) / cap);
    int l = link_of(tmp, st->from[i], st->to[i]);
    msgs[l] += m;
    double *r = phase[i] < 0 ? &wide[l] : &per_phase[l][phase[i] % P];
    if (m > *r) *r = m;
  }
  for (int l = 0; l < 4; l++) {
    double phased = 0;
    for (int64_t p = 0; p < P; p++) phased += per_phase[l][p];
    rounds[l] = phased > wide[l] ? phased : wide[l];
  }
  double worst = 0;
  for (int l = 0; l < 4; l++) {
    int inside = l & 1;
    double t = rounds[l] * (inside ? tmp->topo.nvlink_latency_s : tmp->topo.net_latency_s) +
               msgs[l] * (inside ? tmp->topo.nvlink_msg_s : tmp->topo.net_msg_s);
    if (t > worst) worst = t;
  }
  return worst;
}

reshard_result_t rs_phase_estimates(const reshard_plan_t *plan, const rs_streams *st, int32_t spread, int32_t most,
                                    uint64_t *est) {
  est[0] = 0;
  for (int c = 1; c < RS_PHASE_CANDIDATES; c++) est[c] = UINT64_MAX;
  /* Phases need link speeds; on one host's memory (node_copy_bw, the
   * cpu preset) ranks copy rather than post messages over links, and the
   * estimate would not describe them. */
  if (!plan->has_topo || plan->topo.node_copy_bw > 0) return RESHARD_SUCCESS;
  double bw[2] = {rs_topology_rank_nic_bw(&plan->topo), plan->topo.nvlink_bw};
  if (!(bw[0] > 0)) bw[0] = bw[1];
  if (!(bw[1] > 0)) bw[1] = bw[0];
  if (!(bw[0] > 0)) return RESHARD_SUCCESS;
  uint64_t *sums = rs_malloc(2 * MAX_P * sizeof *sums);
  int32_t *phase = rs_malloc((st->n + 1) * sizeof *phase);
  reshard_plan_t *tmp = rs_malloc(sizeof *tmp);
  if (!sums || !phase || !tmp) {
    free(sums);
    free(phase);
    free(tmp);
    return rs_error(RESHARD_ERROR_OUT_OF_MEMORY, "out of memory estimating phases (%zu streams)", st->n);
  }
  *tmp = *plan; /* read only, but for spread, phases and wide_bytes */
  tmp->spread_rounds = spread;
  uint64_t longest = 0;
  for (size_t i = 0; i < st->n; i++)
    if (st->bytes[i] > longest) longest = st->bytes[i];
  for (int k = 0; k < RS_PHASE_COUNTS; k++) {
    int64_t P = (int64_t)1 << k;
    if (P > most) break;
    for (int w = 0; w < RS_WIDE_CANDIDATES && (w == 0 || P > 1); w++) {
      int c = k * RS_WIDE_CANDIDATES + w;
      tmp->phases = (int32_t)P;
      tmp->wide_bytes = rs_phase_wide_bytes(c);
      if (w > 0 && !is_wide(tmp->wide_bytes, longest)) {
        est[c] = est[k * RS_WIDE_CANDIDATES]; /* no stream of this rank is wide: the same plan */
        continue;
      }
      for (size_t i = 0; i < st->n; i++) phase[i] = rs_stream_phase(tmp, st->from[i], st->to[i], st->bytes[i]);
      /* this rank's spread is at most the agreed one, whose shares are
       * smaller: a candidate that fits here fits the plan */
      double lat = busiest_latency(tmp, st, phase, sums);
      if (lat >= 0) est[c] = to_ps(busiest_link(plan, st, P, phase, bw) + lat);
    }
  }
  free(sums);
  free(phase);
  free(tmp);
  return RESHARD_SUCCESS;
}

int32_t rs_phases_choose(const uint64_t *est, uint64_t *wide) {
  /* More phases must win by a margin: the estimate leaves out what
   * phases cost a relay plan (a forward waits for its stream's phase
   * after its data arrives, at every hop), so a gain within that error
   * is none. Llama-3.1-70B's relay plan estimated 0.3% better at 4
   * phases with wide streams than at one, and took 1.494 x T_lower
   * instead of 1.047; the gains kept on the panel were 1.3% or more. */
  int best = 0;
  for (int c = 1; c < RS_PHASE_CANDIDATES; c++) {
    uint64_t bar = est[best];
    if (c / RS_WIDE_CANDIDATES > best / RS_WIDE_CANDIDATES) bar -= bar / RS_PHASE_MARGIN;
    if (est[c] < bar) best = c;
  }
  int32_t P = (int32_t)1 << (best / RS_WIDE_CANDIDATES);
  *wide = P > 1 ? rs_phase_wide_bytes(best) : 0;
  return P;
}

void rs_pace_candidates(const rs_streams *st, rs_pace *cand) {
  for (int w = 0; w < RS_WIDE_CANDIDATES; w++) {
    uint64_t wide = rs_phase_wide_bytes(w);
    rs_pace most = {0, 0, 0};
    for (size_t i = 0; i < st->n; i++) {
      if (st->inside[i]) {
        if (st->bytes[i] > most.inside) most.inside = st->bytes[i];
        continue;
      }
      uint64_t *m = is_wide(wide, st->bytes[i]) ? &most.wide : &most.narrow;
      if (st->bytes[i] > *m) *m = st->bytes[i];
    }
    cand[w] = most;
  }
}

void rs_pace_merge(rs_pace *into, const rs_pace *from) {
  for (int w = 0; w < RS_WIDE_CANDIDATES; w++) {
    if (from[w].narrow > into[w].narrow) into[w].narrow = from[w].narrow;
    if (from[w].wide > into[w].wide) into[w].wide = from[w].wide;
    if (from[w].inside > into[w].inside) into[w].inside = from[w].inside;
  }
}

rs_pace rs_pace_choose(const rs_pace *cand, uint64_t wide) {
  for (int w = 0; w < RS_WIDE_CANDIDATES; w++)
    if (rs_phase_wide_bytes(w) == wide) return cand[w];
  return (rs_pace){0, 0, 0};
}
