/* The agreements of plan creation: the allreduces through which every
 * rank learns, at each step of reshard_plan_create, whether any rank
 * failed, and agrees on what all must share. rs_create_agree (digests,
 * errors, spread, phase estimates and pace candidates), rs_create_agree_chunk
 * (the chunk, from every rank's staging limit and ladder of candidates),
 * rs_create_agree_outcome (after building), rs_create_agree_loads (source-side
 * spreading's loads), and rs_create_another_failed, the REMOTE error naming
 * the rank that failed. Apart from create.c, which sequences the steps,
 * because these are the collectives that keep creation all-or-nothing.
 *
 * Not to be confused with src/exec/agree.c, the per-execute agreement
 * (each rank's header with its partners before data moves, rs_agree_*):
 * these run once per plan creation, over the whole communicator.
 *
 * The first agreement: digests, errors, and each rank's spread
 * rounds (the max is the spread). Then rs_create_agree_chunk: CHUNK_LIMIT carries
 * ~(this rank's chunk limit), so that the max is the smallest limit (a
 * failed rank sends 0, which limits nothing); CHUNK_TOO_BIG has bit j set
 * when candidate chunk j (ladder_chunk) would exceed this rank's staging
 * budget.
 *
 * Plan identity: AGREE_SEQ carries ~(the plan's number), so that the
 * smallest wins. In a creation every rank proposes its count of plans
 * (the same everywhere); a newcomer's creation of a plan the staying
 * ranks kept (reshard_plan_rejoin) meets the kept plan's number, lower
 * than the newcomer's count, and takes it, so their messages pair.
 * AGREE_CALLS and AGREE_VERSION carry the kept plans' execute count and
 * last version (0 in a creation), which the newcomer's plan starts from;
 * AGREE_COMMITTED their committed versions (a kept plan in doubt learns
 * whether another committed). The rs_rejoin_agree_* functions are the
 * kept plan's side of the first agreement, replayed (plan/rejoin.c).
 * Every creation collective goes through rs_create_reduce, which records
 * it where the communicator replaces ranks (plan/transcript.c). */
#include <stdio.h>
#include <string.h>

#include "common/blame.h"
#include "common/clock.h"
#include "common/error.h"
#include "plan/planner.h"
#include "plan/spread.h"
#include "transport/transport.h"

enum { AGREE_DIGEST, AGREE_NOT_DIGEST, AGREE_ERROR, AGREE_SPREAD, AGREE_PHASE_EST,
       AGREE_PACE = AGREE_PHASE_EST + RS_PHASE_CANDIDATES, AGREE_PACE_INSIDE = AGREE_PACE + 2 * RS_WIDE_CANDIDATES,
       AGREE_SEQ, AGREE_CALLS, AGREE_VERSION, AGREE_COMMITTED, AGREE_BLAME, AGREE_N = AGREE_BLAME + RS_BLAME_WORDS };
_Static_assert(AGREE_N <= RS_AGREE_MAX_WORDS, "the first agreement outgrows what transports reduce");

/* What the ranks' descriptions must agree on: the options that shape the
 * plan (in hdr, for rs_explain_mismatch) and both layouts, hashed; `known`
 * (non-zero) is that digest, computed by an earlier creation of the same
 * layouts and options (the tools' stages), so not hashed again. */
uint64_t rs_creation_digest(const reshard_plan_t *p, const reshard_layout_t *src, const reshard_layout_t *dst,
                           uint64_t known, uint64_t *hdr) {
  const char *topo = p->opts.topology ? p->opts.topology : "";
  const uint64_t h[7] = {(uint64_t)p->size, p->opts.staging_bytes, p->opts.chunk_bytes,
                         (uint64_t)(int64_t)p->opts.relay, p->opts.flags, rs_hash_bytes(topo, strlen(topo), 0x7090),
                         rs_relay_min_part_bytes};
  memcpy(hdr, h, sizeof h);
  if (known) return known;
  uint64_t digest = rs_hash_bytes(h, sizeof h, 0x5eed);
  digest = rs_layout_digest(src, digest);
  return rs_layout_digest(dst, digest ^ 0xd57);
}

/* REMOTE for another rank's failure at plan creation (`what`: the step,
 * or ""), from the reduced result word and blame words (common/blame.h):
 * names the failing rank and its reason where the words carry them. */
reshard_result_t rs_create_another_failed(const reshard_comm_t *comm, uint64_t code, const uint64_t *blame,
                                          const char *what) {
  char why[RS_BLAME_WORDS * RS_BLAME_BYTES_PER_WORD + 4];
  const int who = rs_blame_get(blame, why, sizeof why);
  const char *sp = what[0] ? " " : "";
  if (who < 0)
    return rs_error(RESHARD_ERROR_REMOTE, "plan_create rank %d: another rank failed%s%s with '%s'", comm->rank, sp,
                    what, reshard_result_string((reshard_result_t)code));
  return rs_error(RESHARD_ERROR_REMOTE, "plan_create rank %d: rank %d failed%s%s: %s", comm->rank, who, sp, what, why);
}

/* The creation's agreement: every rank's digest, local result, spread,
 * phase estimates and pace candidates in one reduction. On success the
 * plan holds the agreed spread, phases and pace, and *digest this rank's
 * digest; otherwise the failure, this rank's or another's, or the
 * mismatch narrowed down. p may be NULL (no plan memory), src and dst
 * too: then `local` says so. */
reshard_result_t rs_create_agree(reshard_comm_t *comm, reshard_plan_t *p, const reshard_layout_t *src,
                                 const reshard_layout_t *dst, reshard_result_t local, int32_t spread,
                                 uint64_t use_digest, uint64_t *digest_out) {
  char local_msg[1024] = "";
  if (local) snprintf(local_msg, sizeof local_msg, "%s", reshard_last_error());
  uint64_t digest = 0, hdr[7] = {0};
  if (src && dst && p) digest = rs_creation_digest(p, src, dst, use_digest, hdr);
  /* A rank without a digest (no plan memory, NULL layouts) has failed
   * locally and says so itself; it sends 0, the identity of max, so that
   * its peers report it as REMOTE rather than as a MISMATCH. */
  const int has_digest = src && dst && p;
  uint64_t v[AGREE_N] = {digest, has_digest ? ~digest : 0, (uint64_t)local, local ? 0 : (uint64_t)spread};
  for (int k = 0; k < RS_PHASE_CANDIDATES && !local && p; k++) v[AGREE_PHASE_EST + k] = p->phase_est[k];
  for (int k = 0; k < RS_WIDE_CANDIDATES && !local && p; k++) {
    v[AGREE_PACE + 2 * k] = p->pace_cand[k].narrow;
    v[AGREE_PACE + 2 * k + 1] = p->pace_cand[k].wide;
  }
  if (!local && p) v[AGREE_PACE_INSIDE] = p->pace_cand[0].inside; /* the same for every threshold */
  if (!local && p) v[AGREE_SEQ] = ~(uint64_t)p->seq;
  rs_blame_put(v + AGREE_BLAME, comm->rank, local ? local_msg : NULL, rs_blame_first_cause(local));
  int64_t timeout = p ? p->opts.timeout_ms : 60000;
  reshard_result_t r = rs_create_reduce(comm, v, AGREE_N, rs_deadline_after_ms(timeout), AGREE_ERROR, AGREE_BLAME);
  if (r != RESHARD_SUCCESS) {
    rs_error_prefix("plan_create rank %d: agreement failed: ", comm->rank);
    return r;
  }
  if (local) {
    rs_error(local, "%s", local_msg);
    return local;
  }
  /* Another rank's failure first: it may be why the digests differ (a
   * rank whose block-quantization rewrite ran out of memory plans the
   * caller's layouts, its peers the rewritten ones). */
  if (v[AGREE_ERROR]) return rs_create_another_failed(comm, v[AGREE_ERROR], v + AGREE_BLAME, "");
  if (v[AGREE_DIGEST] != digest || ~v[AGREE_NOT_DIGEST] != digest) {
    /* every rank sees the digests differ and that no rank failed alone:
     * all of them narrow it down together */
    char why[512] = "";
    rs_desc d;
    rs_desc_of(src, dst, hdr, &d);
    if (rs_explain_mismatch(comm, &d, digest, rs_deadline_after_ms(timeout), why, sizeof why))
      snprintf(why, sizeof why, "narrowing it down failed: %s", reshard_last_error());
    return rs_error(RESHARD_ERROR_MISMATCH,
                    "plan_create rank %d: ranks passed different layouts or options: %s (digest %016llx, others "
                    "range %016llx..%016llx)",
                    comm->rank, why[0] ? why : "the digests differ", (unsigned long long)digest,
                    (unsigned long long)~v[AGREE_NOT_DIGEST], (unsigned long long)v[AGREE_DIGEST]);
  }
  /* The most rounds any rank needs: with it every rank's spread shares
   * fit a quarter of its half-budget (rs_chunk_spread). */
  p->spread_rounds = rs_plan_force.set_spread ? rs_plan_force.spread : (int32_t)v[AGREE_SPREAD];
  /* The phases from the ranks' estimates (phases.c). */
  memcpy(p->phase_est, &v[AGREE_PHASE_EST], sizeof p->phase_est);
  for (int k = 0; k < RS_WIDE_CANDIDATES; k++)
    p->pace_cand[k] = (rs_pace){v[AGREE_PACE + 2 * k], v[AGREE_PACE + 2 * k + 1], v[AGREE_PACE_INSIDE]};
  p->phases = rs_phases_choose(p->phase_est, &p->wide_bytes);
  p->pace = rs_pace_choose(p->pace_cand, p->wide_bytes);
  p->seq = (uint32_t)~v[AGREE_SEQ];
  p->agree_entry = rs_transcript_mark_agree(comm, src, dst, hdr); /* (the description: to name a mismatch) */
  p->exec_calls = v[AGREE_CALLS];
  p->last_version = v[AGREE_VERSION];
  if (rs_plan_force.set_phases) {
    p->phases = rs_plan_force.phases;
    p->wide_bytes = rs_plan_force.wide;
    p->pace = rs_plan_force.pace;
  }
  *digest_out = digest;
  return RESHARD_SUCCESS;
}

/* Candidate chunks beyond the streams-all-at-once limit: half the budget
 * times 2^(-j/4) (in integers, alike everywhere), within
 * options.chunk_bytes and what one int counts. */
enum { LADDER_N = 64 };
static size_t ladder_chunk(const reshard_options_t *o, int j) {
  static const size_t quarter[4] = {1024, 861, 724, 609}; /* 1024 x 2^(-k/4) */
  size_t c = ((size_t)(o->staging_bytes / 2) >> (j / 4)) / 1024 * quarter[j % 4];
  if (o->chunk_bytes && o->chunk_bytes < c) c = o->chunk_bytes;
  if (c > ((size_t)INT32_MAX & ~(size_t)63)) c = (size_t)INT32_MAX & ~(size_t)63;
  return c & ~(size_t)63;
}

/* Which ladder chunks this rank cannot take: most streams are short and
 * done after a few rounds, so a round rarely holds every stream, and the
 * actual cut (rs_chunk_staging) often fits a far larger chunk than the
 * all-at-once bound `limit`. Candidates up to limit fit by that bound;
 * above it they are cut, smallest first, and the first that overflows
 * rules out the larger ones too, so every rank's feasible set is a
 * prefix and the agreed mask picks a chunk that fits on every rank. */
static reshard_result_t ladder_too_big(reshard_plan_t *p, rs_seg_vec *segs, uint64_t limit, uint64_t *mask) {
  *mask = 0;
  int failed = 0;
  for (int j = LADDER_N - 1; j >= 0; j--) {
    size_t c = ladder_chunk(&p->opts, j);
    if (c < 64 || failed) {
      *mask |= (uint64_t)1 << j;
      continue;
    }
    if (c <= limit) continue;
    uint64_t staging = 0;
    RS_CHECK(rs_chunk_staging(p, segs, c, &staging));
    if (staging > p->opts.staging_bytes) {
      failed = 1;
      *mask |= (uint64_t)1 << j;
    }
  }
  return RESHARD_SUCCESS;
}

/* The chunk, once the spread is agreed: every rank's busiest round fits
 * the budget, double buffered. A round holds at most, per stream,
 * min(its bytes, its cap), the cap being the chunk (divided inside a
 * domain) or the stream's spread share when larger, then paced
 * (rs_chunk_cap); rs_chunk_limit finds
 * the largest chunk at which that sum fits half the budget (the spread
 * shares alone take at most a quarter of it); the ladder's trial cuts,
 * with the agreed spread, find larger chunks that fit. The agreed chunk
 * is the largest every rank fits. Streams shorter than the chunk take
 * less than a chunk, so ranks with many small streams
 * (the norms and biases sent to every replica) do not shrink everyone's
 * messages as if each of their streams were long. Collective; a rank that
 * fails here (memory) makes the others return REMOTE. */
enum { CHUNK_ERROR, CHUNK_LIMIT, CHUNK_TOO_BIG, CHUNK_BLAME, CHUNK_N = CHUNK_BLAME + RS_BLAME_WORDS };

/* The chunk the reduced words v give. */
static size_t chunk_of(const reshard_plan_t *p, const uint64_t *v) {
  size_t chunk = rs_chunk_bound(&p->opts, ~v[CHUNK_LIMIT]);
  for (int j = 0; j < LADDER_N; j++) /* the largest chunk every rank fits */
    if (!(v[CHUNK_TOO_BIG] >> j & 1) && ladder_chunk(&p->opts, j) > chunk) {
      chunk = ladder_chunk(&p->opts, j);
      break;
    }
  return chunk;
}

reshard_result_t rs_create_agree_chunk(reshard_comm_t *comm, reshard_plan_t *p, rs_seg_vec *segs, size_t *out) {
  uint64_t limit = UINT64_MAX, too_big = 0;
  reshard_result_t local = rs_chunk_limit(p, segs, p->opts.staging_bytes / 2, &limit);
  if (!local) local = ladder_too_big(p, segs, limit, &too_big);
  char msg[1024];
  snprintf(msg, sizeof msg, "%s", reshard_last_error());
  uint64_t v[CHUNK_N] = {(uint64_t)local, local ? 0 : ~limit, local ? 0 : too_big};
  rs_blame_put(v + CHUNK_BLAME, comm->rank, local ? msg : NULL, rs_blame_first_cause(local));
  reshard_result_t r =
      rs_create_reduce(comm, v, CHUNK_N, rs_deadline_after_ms(p->opts.timeout_ms), CHUNK_ERROR, CHUNK_BLAME);
  if (local) return rs_error(local, "%s", msg);
  if (r != RESHARD_SUCCESS) {
    rs_error_prefix("plan_create rank %d: agreement on the chunk failed: ", comm->rank);
    return r;
  }
  if (v[CHUNK_ERROR]) return rs_create_another_failed(comm, v[CHUNK_ERROR], v + CHUNK_BLAME, "sizing its chunk");
  *out = chunk_of(p, v);
  return RESHARD_SUCCESS;
}

/* The end of plan creation: every rank learns whether any failed its last
 * step (`what`), so that no rank keeps a plan its peers lack. Returns this
 * rank's own failure (its message kept), the agreement's, or REMOTE naming
 * another rank's result. */
reshard_result_t rs_create_agree_outcome(reshard_comm_t *comm, const reshard_plan_t *p, reshard_result_t r,
                                         const char *what) {
  char msg[1024];
  snprintf(msg, sizeof msg, "%s", reshard_last_error());
  uint64_t e[1 + RS_BLAME_WORDS] = {(uint64_t)r};
  rs_blame_put(e + 1, comm->rank, r ? msg : NULL, rs_blame_first_cause(r));
  reshard_result_t r2 = rs_create_reduce(comm, e, 1 + RS_BLAME_WORDS, rs_deadline_after_ms(p->opts.timeout_ms), 0, 1);
  if (r != RESHARD_SUCCESS) return rs_error(r, "%s", msg);
  if (r2 != RESHARD_SUCCESS) return r2;
  if (e[0]) return rs_create_another_failed(comm, e[0], e + 1, what);
  return RESHARD_SUCCESS;
}

/* Every rank's egress out of its NVLink domain in plan p (plus one; 0 for
 * a rank holding no source data) and held source bytes, agreed into w
 * (2 x size words), and whether some rank failed (*any). The reduction
 * runs in slices through a fixed buffer, so a rank without memory for w
 * (*local set) still takes part. */
reshard_result_t rs_create_agree_loads(reshard_comm_t *comm, const reshard_plan_t *p, const reshard_layout_t *src,
                                       uint64_t *w, reshard_result_t *local, int *any) {
  const int N = comm->size, me = comm->rank;
  const uint64_t egress = rs_spread_egress(p);
  uint64_t held = 0;
  size_t nfrags = 0;
  if (!*local) *local = rs_layout_rank_bytes(src, me, &held, &nfrags);
  const int holds = nfrags > 0;
  const size_t total = 2 * (size_t)N + 1; /* the last word: a rank that failed */
  const int64_t deadline = rs_deadline_after_ms(p->opts.timeout_ms);
  *any = 0;
  for (size_t at = 0; at < total; at += RS_AGREE_MAX_WORDS) {
    uint64_t v[RS_AGREE_MAX_WORDS] = {0};
    const size_t k = total - at < RS_AGREE_MAX_WORDS ? total - at : RS_AGREE_MAX_WORDS;
    const size_t mine[3] = {(size_t)me, (size_t)N + (size_t)me, 2 * (size_t)N};
    const uint64_t val[3] = {holds ? egress + 1 : 0, held, (uint64_t)(*local != RESHARD_SUCCESS)};
    for (int j = 0; j < 3; j++)
      if (mine[j] >= at && mine[j] < at + k) v[mine[j] - at] = val[j];
    RS_CHECK(rs_create_reduce(comm, v, (int)k, deadline, -1, 0)); /* (the verdict after it carries failures) */
    if (w) memcpy(w + at, v, k * sizeof *v);
    if (2 * (size_t)N >= at && 2 * (size_t)N < at + k && v[2 * (size_t)N - at]) *any = 1;
  }
  return RESHARD_SUCCESS;
}

/* ---- the kept plan's side (reshard_plan_rejoin, plan/rejoin.c) ---- */

/* The words a kept plan's replayed first agreement carries apart from its
 * creation's: the execute count and versions, which the newcomer's plan
 * starts from (0 for a candidate the creation discarded, as then). */
void rs_rejoin_agree_fill(uint64_t *v, const reshard_plan_t *live) {
  v[AGREE_CALLS] = live ? __atomic_load_n(&live->exec_calls, __ATOMIC_ACQUIRE) : 0;
  v[AGREE_VERSION] = live ? __atomic_load_n(&live->last_version, __ATOMIC_ACQUIRE) : 0;
  v[AGREE_COMMITTED] = live ? __atomic_load_n(&live->committed_version, __ATOMIC_ACQUIRE) : 0;
}

/* What a word of the first agreement is, for a message. */
static const char *agree_word(int k) {
  if (k == AGREE_SPREAD) return "spread rounds";
  if (k >= AGREE_PHASE_EST && k < AGREE_PACE) return "phase estimates";
  if (k >= AGREE_PACE && k <= AGREE_PACE_INSIDE) return "pace";
  if (k == AGREE_SEQ) return "plan number";
  return "agreement words";
}

/* A replayed first agreement: the reduced words `got` (with the
 * newcomer's) against those its creation reduced (`want`), `mine` this
 * rank's. The digests differ: the newcomer passed other layouts or
 * options, which it sees too, so every rank names it (rs_explain_mismatch,
 * with the kept description) and fails with MISMATCH here. Another word
 * differs: the newcomer's plan would differ (a different build or
 * environment) and only the staying ranks see it: *differs says what,
 * for the caller to carry into the next agreement. Else agreed = the
 * maxima of the execute count and versions. */
reshard_result_t rs_rejoin_agree_check(reshard_comm_t *comm, const uint64_t *mine, const uint64_t *got,
                                       const uint64_t *want, const rs_desc *desc, int64_t timeout_ms,
                                       uint64_t agreed[3], char *differs, size_t len) {
  const uint64_t digest = mine[AGREE_DIGEST];
  differs[0] = 0;
  if (got[AGREE_DIGEST] != want[AGREE_DIGEST] || got[AGREE_NOT_DIGEST] != want[AGREE_NOT_DIGEST]) {
    char why[512] = "";
    if (!desc) snprintf(why, sizeof why, "this plan kept no description to narrow it down with");
    else if (rs_explain_mismatch(comm, desc, digest, rs_deadline_after_ms(timeout_ms), why, sizeof why))
      snprintf(why, sizeof why, "narrowing it down failed: %s", reshard_last_error());
    return rs_error(RESHARD_ERROR_MISMATCH,
                    "plan_rejoin rank %d: the newcomer's plan_create passed other layouts or options than this "
                    "kept plan's: %s (digest %016llx, others range %016llx..%016llx)", comm->rank, why,
                    (unsigned long long)digest, (unsigned long long)~got[AGREE_NOT_DIGEST],
                    (unsigned long long)got[AGREE_DIGEST]);
  }
  for (int k = 0; k < AGREE_N; k++)
    if (got[k] != want[k] && (k < AGREE_CALLS || k > AGREE_COMMITTED)) {
      snprintf(differs, len, "plan_rejoin rank %d: the newcomer's plan of the same layouts would differ from this "
               "kept plan in its %s (a different build or environment, e.g. RESHARD_* settings?)", comm->rank,
               agree_word(k));
      return RESHARD_SUCCESS;
    }
  agreed[0] = got[AGREE_CALLS];
  agreed[1] = got[AGREE_VERSION];
  agreed[2] = got[AGREE_COMMITTED];
  return RESHARD_SUCCESS;
}
