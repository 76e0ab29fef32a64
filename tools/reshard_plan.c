/* reshard_plan: every rank's plan of a reshard, computed and checked in
 * one process (no MPI).
 *
 *   reshard_plan --shape 4096,4096 --src-mesh 4 --src-placements S0 \
 *       --dst-mesh 2,2 --dst-placements R,S1 --check
 *   reshard_plan --model-config configs/qwen2.5-0.5b.json --layers 4 \
 *       --train tp=2,pp=2 --infer tp=2,dp=2 --check
 *
 * Planning is collective only through its agreement allreduces, so one
 * process can play any rank with a fake communicator (bench/fake_comm.h)
 * whose allreduce returns the rank's own values. What a real run agrees
 * on is found in passes over the ranks (bench/plan_world.h), each rank's
 * first stage (nearly all the work) computed once and stored: the ranks'
 * largest spread and phase estimates, then their smallest chunk with
 * those; then every rank's plan with all of them, exactly the plan a real
 * run executes. The passes run on --threads threads. A sample of ranks
 * (--time-all: every rank) is also planned as given in a forked child,
 * for the time and memory a real run's creation takes on that rank.
 * The plans a real run executes are checked through the
 * internal plan struct:
 *   - every destination byte inside a fragment is written exactly once by
 *     the receive and local copies, and no byte outside fragments is;
 *   - every source byte read (send and local copies) lies inside one of the
 *     rank's source fragments;
 *   - each message's copies pack its staging bytes exactly once;
 *   - each (sender, receiver) pair agrees on the (round, size) of every
 *     message, in order. */
#define _GNU_SOURCE
#include <malloc.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli.h"
#include "cost_report.h"
#include "plan_cost.h"
#include "plan_json.h"
#include "plan_replay.h"
#include "plan_measure.h"
#include "proc_stats.h"
#include "reshard_internal.h"
#include "reshard.h"

/* ------------------------------------------------------------------ */
/* Checking plans                                                      */
/* ------------------------------------------------------------------ */

typedef struct checker {
  long violations;
} checker;

static void violation(checker *ck, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void violation(checker *ck, const char *fmt, ...) {
  if (ck->violations < 12) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stdout, "# VIOLATION: ");
    vfprintf(stdout, fmt, ap);
    fputc('\n', stdout);
    va_end(ap);
  } else if (ck->violations == 12) {
    printf("# (further violations not shown)\n");
  }
  ck->violations++;
}

typedef struct ival {
  uint64_t lo, hi;
} ival;

typedef struct ivec {
  ival *v;
  size_t n, cap;
} ivec;

static void ivec_push(ivec *x, uint64_t lo, uint64_t hi) {
  if (x->n && x->v[x->n - 1].hi == lo) { /* rows often follow each other */
    x->v[x->n - 1].hi = hi;
    return;
  }
  if (x->n == x->cap) {
    x->cap = x->cap ? 2 * x->cap : 64;
    x->v = realloc(x->v, x->cap * sizeof *x->v);
    if (!x->v) {
      fprintf(stderr, "reshard_plan: out of memory\n");
      exit(1);
    }
  }
  x->v[x->n++] = (ival){lo, hi};
}

static int cmp_ival(const void *a, const void *b) {
  const ival *x = a, *y = b;
  return x->lo < y->lo ? -1 : x->lo > y->lo ? 1 : x->hi < y->hi ? -1 : x->hi > y->hi;
}

/* Sorts and merges touching intervals; returns the first overlapping pair
 * through *olap (if non-NULL) and how many overlaps there were. */
static size_t ivec_normalize(ivec *x, ival *olap) {
  size_t overlaps = 0;
  if (x->n) qsort(x->v, x->n, sizeof *x->v, cmp_ival);
  size_t w = 0;
  for (size_t i = 0; i < x->n; i++) {
    if (w && x->v[i].lo < x->v[w - 1].hi) {
      if (!overlaps && olap) {
        olap->lo = x->v[i].lo;
        olap->hi = x->v[i].hi < x->v[w - 1].hi ? x->v[i].hi : x->v[w - 1].hi;
      }
      overlaps++;
      if (x->v[i].hi > x->v[w - 1].hi) x->v[w - 1].hi = x->v[i].hi;
    } else if (w && x->v[i].lo == x->v[w - 1].hi) {
      x->v[w - 1].hi = x->v[i].hi;
    } else {
      x->v[w++] = x->v[i];
    }
  }
  x->n = w;
  return overlaps;
}

/* Byte runs of a lowered fragment, appended to out[buffer]. */
static void fragment_runs(const reshard_layout_t *L, const reshard_fragment_info_t *f, ivec *out) {
  reshard_dtype_t dt;
  reshard_layout_tensor_info(L, f->tensor_id, NULL, &dt, NULL, NULL);
  uint64_t es = reshard_dtype_size(dt);
  int nd = f->ndim;
  for (int d = 0; d < nd; d++)
    if (f->extent[d] <= 0) return;
  ivec *x = &out[f->buffer_id];
  if (nd == 0) {
    ivec_push(x, f->byte_offset, f->byte_offset + es);
    return;
  }
  int64_t idx[RESHARD_MAX_DIMS] = {0};
  for (;;) {
    int64_t off = 0;
    for (int d = 0; d < nd - 1; d++) off += idx[d] * f->strides[d];
    uint64_t base = f->byte_offset + (uint64_t)(off * (int64_t)es);
    if (f->strides[nd - 1] == 1 || f->extent[nd - 1] == 1) {
      ivec_push(x, base, base + (uint64_t)f->extent[nd - 1] * es);
    } else {
      for (int64_t i = 0; i < f->extent[nd - 1]; i++) {
        uint64_t at = base + (uint64_t)(i * f->strides[nd - 1] * (int64_t)es);
        ivec_push(x, at, at + es);
      }
    }
    int d = nd - 2;
    while (d >= 0 && ++idx[d] == f->extent[d]) idx[d--] = 0;
    if (d < 0) return;
  }
}

/* Byte runs of one side of a copy descriptor (src/pack/copy.h; a cast
 * writes runs of the destination's element size). */
static void copy_runs(const rs_copy *c, int src_side, ivec *x) {
  int64_t idx[RS_COPY_MAX_DIMS] = {0};
  for (int d = 0; d < c->ndim; d++)
    if (c->extent[d] <= 0) return;
  for (;;) {
    int64_t off = (int64_t)(src_side ? c->src_off : c->dst_off);
    for (int d = 0; d < c->ndim; d++) off += idx[d] * (src_side ? c->src_stride[d] : c->dst_stride[d]);
    ivec_push(x, (uint64_t)off, (uint64_t)off + (src_side ? c->run_bytes : rs_copy_dst_run(c))); /* a cast's runs differ */
    int d = c->ndim - 1;
    while (d >= 0 && ++idx[d] == c->extent[d]) idx[d--] = 0;
    if (d < 0) return;
  }
}

typedef struct msgrec {
  int32_t src, dst, round;
  uint64_t bytes;
} msgrec;

typedef struct msgvec {
  msgrec *v;
  size_t n, cap;
} msgvec;

static void msgvec_push(msgvec *x, msgrec m) {
  if (x->n == x->cap) {
    x->cap = x->cap ? 2 * x->cap : 256;
    x->v = realloc(x->v, x->cap * sizeof *x->v);
    if (!x->v) {
      fprintf(stderr, "reshard_plan: out of memory\n");
      exit(1);
    }
  }
  x->v[x->n++] = m;
}

static int cmp_msg(const void *a, const void *b) {
  const msgrec *x = a, *y = b;
  if (x->src != y->src) return x->src < y->src ? -1 : 1;
  if (x->dst != y->dst) return x->dst < y->dst ? -1 : 1;
  if (x->round != y->round) return x->round < y->round ? -1 : 1;
  /* relay plans: several messages of one pair in one round */
  return (x->bytes > y->bytes) - (x->bytes < y->bytes);
}

/* Walks one direction's messages the way execute does: each message's
 * copies must pack its staging bytes exactly once, and every copy must
 * belong to exactly one message. The buffer side of each copy is appended
 * to side_runs[buffer] (sends read source buffers, receives write
 * destination buffers), or to fwd_runs[buffer] for relay forwards, which
 * read destination buffers. */
static void check_messages(checker *ck, int rank, const reshard_plan_t *P, int is_send, int nbuf, ivec *side_runs,
                           int nfwd, ivec *fwd_runs) {
  const rs_msg *msgs = is_send ? P->sends : P->recvs;
  size_t n = is_send ? P->nsends : P->nrecvs;
  const rs_copy *copies = is_send ? P->send_copies : P->recv_copies;
  size_t ncopies = is_send ? P->nsend_copies : P->nrecv_copies;
  const char *dir = is_send ? "send" : "receive";
  unsigned char *used = calloc(ncopies + 1, 1);
  ivec runs = {0};
  if (!used) exit(1);
  for (size_t i = 0; i < n; i++) {
    const rs_msg *m = &msgs[i];
    if ((uint64_t)m->first_copy + m->ncopies > ncopies) {
      violation(ck, "rank %d: %s message %zu: copies [%u, +%u) out of range", rank, dir, i, m->first_copy, m->ncopies);
      continue;
    }
    runs.n = 0;
    for (uint32_t k = 0; k < m->ncopies; k++) {
      const rs_copy *c = &copies[m->first_copy + k];
      if (used[m->first_copy + k]++) violation(ck, "rank %d: %s copy %u belongs to two messages", rank, dir, m->first_copy + k);
      copy_runs(c, !is_send, &runs);
      int b = is_send ? c->src_buf : c->dst_buf;
      const int fwd = is_send && m->fwd; /* (a forward's receive writes a destination buffer like any) */
      int nb = fwd ? nfwd : nbuf;
      if (b < 0 || b >= nb) violation(ck, "rank %d: %s copy %u touches buffer %d", rank, dir, m->first_copy + k, b);
      else copy_runs(c, is_send, fwd ? &fwd_runs[b] : &side_runs[b]);
    }
    ival o;
    size_t ov = ivec_normalize(&runs, &o);
    if (ov || runs.n != 1 || runs.v[0].lo != m->staging_off || runs.v[0].hi != m->staging_off + m->bytes)
      violation(ck, "rank %d: %s message %zu (peer %d, round %d, %llu bytes): its copies do not pack staging [%llu, %llu) "
                    "exactly once",
                rank, dir, i, m->peer, m->round, (unsigned long long)m->bytes, (unsigned long long)m->staging_off,
                (unsigned long long)(m->staging_off + m->bytes));
  }
  for (size_t k = 0; k < ncopies; k++)
    if (!used[k]) {
      violation(ck, "rank %d: %s copy %zu belongs to no message (never executed)", rank, dir, k);
      break;
    }
  free(used);
  free(runs.v);
}

static void check_rank(checker *ck, const cli_layouts *L, int rank, const reshard_plan_t *P, msgvec *sends,
                       msgvec *recvs) {
  const reshard_layout_t *sides[2] = {L->src, L->dst};
  ivec *frag[2], *touched[2], *forwarded;
  int nb[2];
  for (int s = 0; s < 2; s++) {
    nb[s] = reshard_layout_num_buffers(sides[s]);
    frag[s] = calloc((size_t)nb[s] + 1, sizeof(ivec));
    touched[s] = calloc((size_t)nb[s] + 1, sizeof(ivec));
    if (!frag[s] || !touched[s]) exit(1);
    size_t n = 0;
    reshard_layout_fragments(sides[s], rank, NULL, 0, &n);
    reshard_fragment_info_t *fr = calloc(n + 1, sizeof *fr);
    if (!fr) exit(1);
    reshard_layout_fragments(sides[s], rank, fr, n, &n);
    for (size_t i = 0; i < n; i++) fragment_runs(sides[s], &fr[i], frag[s]);
    free(fr);
    for (int b = 0; b < nb[s]; b++) ivec_normalize(&frag[s][b], NULL);
  }
  /* reads: send copies and local copies (relay forwards: destination
   * buffers); writes: receive copies and local copies */
  forwarded = calloc((size_t)nb[1] + 1, sizeof(ivec));
  if (!forwarded) exit(1);
  check_messages(ck, rank, P, 1, nb[0], touched[0], nb[1], forwarded);
  check_messages(ck, rank, P, 0, nb[1], touched[1], 0, NULL);
  for (size_t i = 0; i < P->nlocal_copies; i++) {
    const rs_copy *c = &P->local_copies[i];
    if (c->src_buf < 0 || c->src_buf >= nb[0] || c->dst_buf < 0 || c->dst_buf >= nb[1]) {
      violation(ck, "rank %d: local copy %zu between buffers %d and %d", rank, i, c->src_buf, c->dst_buf);
      continue;
    }
    copy_runs(c, 1, &touched[0][c->src_buf]);
    copy_runs(c, 0, &touched[1][c->dst_buf]);
  }
  for (int b = 0; b < nb[0]; b++) {
    ivec_normalize(&touched[0][b], NULL); /* reading twice is fine */
    const ivec *in = &frag[0][b], *rd = &touched[0][b];
    size_t j = 0;
    for (size_t i = 0; i < rd->n; i++) {
      while (j < in->n && in->v[j].hi <= rd->v[i].lo) j++;
      if (j == in->n || in->v[j].lo > rd->v[i].lo || in->v[j].hi < rd->v[i].hi) {
        violation(ck, "rank %d: source buffer %d bytes [%llu, %llu) read, not all inside a source fragment", rank, b,
                  (unsigned long long)rd->v[i].lo, (unsigned long long)rd->v[i].hi);
        break;
      }
    }
  }
  /* a forward sends what this rank received: inside its fragments */
  for (int b = 0; b < nb[1]; b++) {
    ivec_normalize(&forwarded[b], NULL);
    const ivec *in = &frag[1][b], *rd = &forwarded[b];
    size_t j = 0;
    for (size_t i = 0; i < rd->n; i++) {
      while (j < in->n && in->v[j].hi <= rd->v[i].lo) j++;
      if (j == in->n || in->v[j].lo > rd->v[i].lo || in->v[j].hi < rd->v[i].hi) {
        violation(ck, "rank %d: destination buffer %d bytes [%llu, %llu) forwarded, not all inside a fragment", rank, b,
                  (unsigned long long)rd->v[i].lo, (unsigned long long)rd->v[i].hi);
        break;
      }
    }
    free(forwarded[b].v);
  }
  free(forwarded);
  for (int b = 0; b < nb[1]; b++) {
    ival o;
    if (ivec_normalize(&touched[1][b], &o))
      violation(ck, "rank %d: destination buffer %d bytes [%llu, %llu) written more than once", rank, b,
                (unsigned long long)o.lo, (unsigned long long)o.hi);
    const ivec *want = &frag[1][b], *got = &touched[1][b];
    size_t k = 0;
    while (k < want->n && k < got->n && want->v[k].lo == got->v[k].lo && want->v[k].hi == got->v[k].hi) k++;
    if (k < want->n || k < got->n) {
      /* name the first byte where they differ */
      uint64_t wl = k < want->n ? want->v[k].lo : UINT64_MAX, gl = k < got->n ? got->v[k].lo : UINT64_MAX;
      uint64_t wh = k < want->n ? want->v[k].hi : UINT64_MAX, gh = k < got->n ? got->v[k].hi : UINT64_MAX;
      uint64_t at = wl != gl ? (wl < gl ? wl : gl) : (wh < gh ? wh : gh);
      int inside = 0;
      for (size_t i = 0; i < want->n && !inside; i++) inside = want->v[i].lo <= at && at < want->v[i].hi;
      violation(ck, "rank %d: destination buffer %d byte %llu (%s) %s", rank, b, (unsigned long long)at,
                inside ? "inside a fragment" : "outside every fragment", inside ? "never written" : "written");
    }
  }
  for (int s = 0; s < 2; s++) {
    for (int b = 0; b < nb[s]; b++) {
      free(frag[s][b].v);
      free(touched[s][b].v);
    }
    free(frag[s]);
    free(touched[s]);
  }
  for (size_t i = 0; i < P->nsends; i++)
    msgvec_push(sends, (msgrec){rank, P->sends[i].peer, P->sends[i].round, P->sends[i].bytes});
  for (size_t i = 0; i < P->nrecvs; i++)
    msgvec_push(recvs, (msgrec){P->recvs[i].peer, rank, P->recvs[i].round, P->recvs[i].bytes});
}

static void check_agreement(checker *ck, msgvec *sends, msgvec *recvs) {
  if (sends->n) qsort(sends->v, sends->n, sizeof *sends->v, cmp_msg);
  if (recvs->n) qsort(recvs->v, recvs->n, sizeof *recvs->v, cmp_msg);
  size_t i = 0, j = 0;
  while (i < sends->n || j < recvs->n) {
    const msgrec *s = i < sends->n ? &sends->v[i] : NULL, *r = j < recvs->n ? &recvs->v[j] : NULL;
    if (s && r && !cmp_msg(s, r)) {
      if (s->bytes != r->bytes)
        violation(ck, "rank %d -> rank %d round %d: sender packs %llu bytes, receiver expects %llu", s->src, s->dst,
                  s->round, (unsigned long long)s->bytes, (unsigned long long)r->bytes);
      i++, j++;
    } else if (s && (!r || cmp_msg(s, r) < 0)) {
      violation(ck, "rank %d -> rank %d round %d: %llu bytes sent, no matching receive", s->src, s->dst, s->round,
                (unsigned long long)s->bytes);
      i++;
    } else {
      violation(ck, "rank %d -> rank %d round %d: %llu bytes expected, never sent", r->src, r->dst, r->round,
                (unsigned long long)r->bytes);
      j++;
    }
  }
}

/* ------------------------------------------------------------------ */
/* main                                                                */
/* ------------------------------------------------------------------ */

/* What chose the phases: per phase count, the estimate without wide
 * streams and the best with them (the busiest rank's busiest link). */
static void print_phase_estimates(const uint64_t *est) {
  printf("# phase estimates (the busiest rank's busiest link, s; /wide: with streams over that many MiB wide):");
  for (int k = 0; k < RS_PHASE_COUNTS; k++) {
    int c = k * RS_WIDE_CANDIDATES, best = c;
    for (int w = 1; w < RS_WIDE_CANDIDATES; w++)
      if (est[c + w] < est[best]) best = c + w;
    if (est[best] == UINT64_MAX) continue; /* over RESHARD_MAX_PHASES, or no P that fits */
    if (est[c] == UINT64_MAX) printf(" %d:-", 1 << k);
    else printf(" %d:%.4g", 1 << k, (double)est[c] * 1e-12);
    if (best != c) printf("/%llu:%.4g", (unsigned long long)(rs_phase_wide_bytes(best) >> 20), (double)est[best] * 1e-12);
  }
  printf("\n");
}

static void print_header(void) {
  printf("%6s %5s %9s %9s %9s %10s %10s %10s %8s %8s %6s %6s %7s %9s\n", "rank", "role", "plan_ms", "cpu_ms", "peak_MiB",
         "out_MiB", "in_MiB", "local_MiB", "send_msg", "recv_msg", "to", "from", "rounds", "segments");
}

static void print_row(int rank, const char *role, const pm_result *m, const reshard_plan_stats_t *s) {
  char t[3][32];
  if (m->ok) {
    snprintf(t[0], sizeof t[0], "%.2f", m->plan_ms);
    snprintf(t[1], sizeof t[1], "%.2f", m->cpu_ms);
    snprintf(t[2], sizeof t[2], "%.1f%s", m->peak_mib, m->peak_exact ? " " : "?");
  } else { /* not timed */
    snprintf(t[0], sizeof t[0], "-");
    snprintf(t[1], sizeof t[1], "-");
    snprintf(t[2], sizeof t[2], "- ");
  }
  printf("%6d %5s %9s %9s %9s %10.2f %10.2f %10.2f %8zu %8zu %6d %6d %7d %9zu\n", rank, role, t[0], t[1], t[2],
         (double)s->send_bytes / 1048576.0, (double)s->recv_bytes / 1048576.0, (double)s->local_copy_bytes / 1048576.0,
         s->send_messages, s->recv_messages, s->num_send_peers, s->num_recv_peers, s->num_chunks, s->segments);
}

/* --digest: a hash of everything a rank's plan executes (its messages
 * and copies, field by field), to show that two versions of the planner
 * or of this tool make the same plans byte for byte. */
static uint64_t digest_words(uint64_t h, const uint64_t *w, size_t n) { return rs_hash_bytes(w, n * sizeof *w, h); }

static uint64_t digest_copies(uint64_t h, const rs_copy *c, size_t n) {
  for (size_t i = 0; i < n; i++) {
    uint64_t w[7 + 3 * RS_COPY_MAX_DIMS];
    size_t k = 0;
    /* a cast's dtypes, only where there is one: plans without casts hash
     * as they did before casts existed (tests/plan_golden.sh) */
    if (c[i].cvt_from) w[k++] = (uint64_t)c[i].cvt_from << 8 | c[i].cvt_to;
    w[k++] = c[i].src_off;
    w[k++] = c[i].dst_off;
    w[k++] = c[i].run_bytes;
    w[k++] = (uint64_t)(int64_t)c[i].src_buf;
    w[k++] = (uint64_t)(int64_t)c[i].dst_buf;
    w[k++] = (uint64_t)c[i].ndim;
    for (int d = 0; d < c[i].ndim && d < RS_COPY_MAX_DIMS; d++) {
      w[k++] = (uint64_t)c[i].extent[d];
      w[k++] = (uint64_t)c[i].src_stride[d];
      w[k++] = (uint64_t)c[i].dst_stride[d];
    }
    h = digest_words(h, w, k);
  }
  return h;
}

static uint64_t digest_msgs(uint64_t h, const rs_msg *m, size_t n) {
  for (size_t i = 0; i < n; i++) {
    const uint64_t w[8] = {(uint64_t)(int64_t)m[i].peer, (uint64_t)(int64_t)m[i].round, m[i].bytes, m[i].staging_off,
                           m[i].first_copy, m[i].ncopies, m[i].direct, m[i].fwd};
    h = digest_words(h, w, 8);
  }
  return h;
}

static uint64_t plan_digest(const reshard_plan_t *p) {
  const uint64_t w[8] = {(uint64_t)p->nrounds, p->chunk_bytes, p->nsends, p->nrecvs, p->nlocal_copies,
                         p->send_half, p->recv_half, (uint64_t)p->phases};
  uint64_t h = digest_words(0x5eed, w, 8);
  h = digest_msgs(h, p->sends, p->nsends);
  h = digest_copies(h, p->send_copies, p->nsend_copies);
  h = digest_msgs(h, p->recvs, p->nrecvs);
  h = digest_copies(h, p->recv_copies, p->nrecv_copies);
  return digest_copies(h, p->local_copies, p->nlocal_copies);
}

/* The plans a real run executes (plan_world.h pass 3), one rank at a
 * time in rank order: their stats and digests, and with check_now the
 * checks. The pass that prices them serves for the stats; the checks,
 * when asked for, take one more pass over the plan kept. */
typedef struct final_pass {
  const cli_layouts *L;
  const cli_opts *o;
  size_t chunk;
  reshard_plan_stats_t *agreed; /* per rank */
  uint64_t *digest;             /* --digest: per rank */
  int check_now;
  checker ck;
  msgvec sends, recvs;
  int injected;
  pj_world *pj; /* --json: the plans' traffic and cost terms */
  rp_writer *rp; /* --replay-out: the plans' schedules */
} final_pass;

static reshard_result_t final_rank(int r, reshard_plan_t *plan, void *arg) {
  final_pass *f = arg;
  reshard_plan_get_stats(plan, &f->agreed[r]);
  if (f->digest) f->digest[r] = plan_digest(plan);
  if (f->pj) RS_CHECK(pj_add(f->pj, r, plan));
  if (f->rp) RS_CHECK(rp_add(f->rp, r, plan)); /* before the checker's --inject-error edits it */
  if (!f->check_now) return RESHARD_SUCCESS;
  if (plan->chunk_bytes != f->chunk)
    violation(&f->ck, "rank %d: planned with chunk %zu B, not the agreed %zu B", r, plan->chunk_bytes, f->chunk);
  if (!f->injected) { /* testing the checker: lose one copy */
    if (plan->nrecvs && plan->recvs[0].ncopies) plan->recvs[0].ncopies--, f->injected = 1;
    else if (plan->nlocal_copies) plan->nlocal_copies--, f->injected = 1;
    if (f->injected) printf("# --inject-error: dropped one copy from rank %d's plan\n", r);
  }
  if (!f->o->no_check) check_rank(&f->ck, f->L, r, plan, &f->sends, &f->recvs);
  return RESHARD_SUCCESS;
}

static int final_init(final_pass *f, const cli_layouts *L, const cli_opts *o, int world) {
  memset(f, 0, sizeof *f);
  f->L = L;
  f->o = o;
  f->injected = !o->inject_error;
  f->agreed = calloc((size_t)world + 1, sizeof *f->agreed);
  if (o->digest) f->digest = calloc((size_t)world + 1, sizeof *f->digest);
  if (o->json) f->pj = pj_create(world);
  if (o->replay_out) f->rp = rp_create(world);
  return f->agreed && (!o->digest || f->digest) && (!o->json || f->pj) && (!o->replay_out || f->rp) ? 0 : -1;
}

static void final_free(final_pass *f) {
  free(f->agreed);
  free(f->digest);
  free(f->sends.v);
  free(f->recvs.v);
  pj_free(f->pj);
  rp_free(f->rp);
  memset(f, 0, sizeof *f);
}

/* --profile: the time of the passes over the ranks, by role. */
static int role_class(int rank, void *arg) {
  const char *role = cli_role(arg, rank);
  return !strcmp(role, "src") ? 0 : !strcmp(role, "dst") ? 1 : !strcmp(role, "both") ? 2 : 3;
}

static void print_profile(double total_s) {
  static const char *pass_names[PW_PASSES] = {"stage", "chunk", "plans"};
  static const char *role_names[PW_CLASSES] = {"src", "dst", "both", "none"};
  pw_profile pf;
  pw_get_profile(&pf);
  double in_passes = 0;
  printf("# profile: %.1f s in all, %d threads; per pass kind: passes, wall s, then per role: ranks, CPU s, most one "
         "rank took (s)\n",
         total_s, pw_threads());
  for (int k = 0; k < PW_PASSES; k++) {
    in_passes += pf.wall_s[k];
    printf("# profile %-5s: %d passes, %.2f s wall;", pass_names[k], pf.passes[k], pf.wall_s[k]);
    for (int c = 0; c < PW_CLASSES; c++)
      if (pf.ranks[k][c])
        printf(" %s %ld ranks %.2f s (%.3f)", role_names[c], pf.ranks[k][c], pf.cpu_s[k][c], pf.max_rank_s[k][c]);
    printf("\n");
  }
  printf("# profile other: %.2f s wall (layouts, timing the sample, T_lower, single-threaded work)\n", total_s - in_passes);
}

/* Which ranks to time: every one with --time-all, else per role the
 * first rank and the one with the most segments (the most planning). */
static void pick_timed(const cli_layouts *L, const pw_run *run, int world, int all, unsigned char *timed) {
  if (all) {
    memset(timed, 1, (size_t)world);
    return;
  }
  static const char *roles[] = {"src", "dst", "both", "none"};
  for (int k = 0; k < 4; k++) {
    int first = -1, busiest = -1;
    for (int r = 0; r < world; r++) {
      if (strcmp(cli_role(L, r), roles[k])) continue;
      if (first < 0) first = r;
      if (busiest < 0 || pw_run_segments(run, r) > pw_run_segments(run, busiest)) busiest = r;
    }
    if (first >= 0) timed[first] = timed[busiest] = 1;
  }
}

/* The run's state, step to step (main below). */
typedef struct plan_tool {
  struct timespec t_start;
  cli_opts o;
  cli_layouts L;
  int world;
  reshard_options_t opts;
  reshard_estimate_t direct_est, ours;
  int have_direct, priced, failed;
  pw_run *run;                /* every rank's first stage, and what the ranks agree on */
  final_pass fs[2], fs2[2];   /* the direct and the relay plans' figures (fs2: after spreading) */
  final_pass *f;              /* those kept */
  reshard_layout_t *user_src; /* the caller's source, also after spreading */
  pm_result *ms;
  unsigned char *timed;
  double worst_ms, worst_mib;
  int ntimed;
  const pw_agreed *ag;
  cr_figures cost;        /* --topology: what the cost report printed */
  int spread_kept;        /* source-side spreading kept: its pre-plan's */
  double spread_pre_s;    /* predicted time and the bytes it moves */
  uint64_t spread_moved;
  rp_writer *pre_rp;      /* --replay-out with spreading kept: the pre-plan's schedules */
  /* fp8 block quantization with blocks split across source ranks: the
   * caller's source (before the rewrite) and the gathering pre-plan's
   * destination (plan/quant.h), its predicted time and bytes, and with
   * --replay-out its schedules */
  reshard_layout_t *quant_src, *gather;
  double gather_pre_s;
  uint64_t gather_bytes;
  rp_writer *gather_rp;
} plan_tool;

/* Options, layouts and world; an exit status when done already (help,
 * a bad option, --show-layout), else -1. */
static int setup(plan_tool *t, int argc, char **argv) {
  char err[1024];
  if (cli_parse(CLI_TOOL_PLAN, argc, argv, &t->o, err, sizeof err)) {
    fprintf(stderr, "reshard_plan: error: %s\n", err);
    return 2;
  }
  if (t->o.help) {
    cli_usage(CLI_TOOL_PLAN, stdout);
    return 0;
  }
  if (cli_build_layouts(&t->o, &t->L, err, sizeof err)) {
    fprintf(stderr, "reshard_plan: error: %s\n", err);
    return 2;
  }
  t->world = t->o.world ? t->o.world : t->L.world_needed;
  if (t->world < t->L.world_needed) {
    fprintf(stderr, "reshard_plan: error: --world %d is too small: the layouts use %d ranks (%d source %s %d destination)\n",
            t->world, t->L.world_needed, t->L.nsrc, t->o.colocate ? "colocated with" : "+", t->L.ndst);
    cli_layouts_free(&t->L);
    return 2;
  }
  if (t->o.rank >= t->world) {
    fprintf(stderr, "reshard_plan: error: --rank %d is outside the %d ranks\n", t->o.rank, t->world);
    cli_layouts_free(&t->L);
    return 2;
  }
  if (t->o.show_layout) {
    int rc = cli_show_layout(&t->L, t->o.show_layout, t->o.rank, stdout, err, sizeof err);
    if (rc) fprintf(stderr, "reshard_plan: error: %s\n", err);
    cli_layouts_free(&t->L);
    return rc ? 1 : 0;
  }
  return -1;
}

static int quantize_layouts(plan_tool *t) {
  /* A destination quantized to fp8 blocks: the library plans it over
   * rewritten layouts (plan/quant.h); the staged planning below plans those
   * directly, every rank alike. */
  rs_quant_layouts ql;
  reshard_result_t qr = rs_quant_layouts_make(t->L.src, t->L.dst, t->world, -1, &ql);
  if (qr) {
    fprintf(stderr, "reshard_plan: error: %s: %s\n", reshard_result_string(qr), reshard_last_error());
    return 1;
  }
  if (ql.src) {
    printf("fp8 block quantization: source ranks quantize the weights they hold in whole blocks and send codes + "
           "scales%s\n",
           ql.gather ? "; blocks split across source ranks are first gathered by a pre-plan (priced below)" : "");
    /* the caller's source stays: the gathering pre-plan reads it */
    t->quant_src = t->L.src, t->gather = ql.gather;
    reshard_layout_destroy(t->L.dst);
    t->L.src = ql.src, t->L.dst = ql.dst;
    ql.src = ql.dst = ql.gather = NULL;
  }
  rs_quant_layouts_free(&ql);
  return 0;
}

/* The options, the passes' settings, and with relay -1 and a topology the
 * relay choice. */
static int choose_relay(plan_tool *t) {
  reshard_options_t opts = RESHARD_OPTIONS_INITIALIZER;
  t->opts = opts;
  if (t->o.staging) t->opts.staging_bytes = t->o.staging;
  t->opts.topology = t->o.topology;
  t->opts.relay = t->o.relay;

  /* relay -1 with a topology: reshard_plan_create builds both plans and
   * keeps the one the cost model predicts faster, collectively. Planned
   * here rank by rank against a fake communicator, each rank would price
   * only its own plan, so the choice is made here, globally, by the same
   * rule (the global and collective estimates are equal), before the
   * ranks are planned with it. */
  reshard_estimate_t none = RESHARD_ESTIMATE_INITIALIZER;
  t->direct_est = t->ours = none;
  pw_set_threads(t->o.threads);
  pw_set_rank_class(role_class, &t->L);
  /* the report's replica0 baseline is the direct plan with
   * RESHARD_FLAG_FIRST_REPLICA: planned with the direct one, when that
   * comes first (relay -1 prices it, relay 0 is it; with relay 1 the
   * report's balanced-direct baseline comes after the replica0 one) */
  pw_share_first_replica(t->o.topology != NULL && t->o.rank < 0 && t->o.relay != 1);
  t->f = &t->fs[0];
  if (final_init(&t->fs[0], &t->L, &t->o, t->world) || final_init(&t->fs[1], &t->L, &t->o, t->world)) {
    fprintf(stderr, "reshard_plan: error: out of memory\n");
    return 1;
  }
  if (t->o.rank < 0 && t->opts.relay == -1) {
    rs_topology topo;
    int has = 0;
    if (rs_topology_resolve(&t->opts, &topo, &has) == RESHARD_SUCCESS && has) {
      reshard_estimate_t relay_est;
      int relay;
      void *const args[2] = {&t->fs[0], &t->fs[1]};
      reshard_result_t r =
          pc_choose_relay(t->L.src, t->L.dst, t->world, &t->opts, &relay, &t->direct_est, &relay_est, final_rank, args, &t->run);
      if (r) {
        fprintf(stderr, "reshard_plan: error: relay choice: %s: %s\n", reshard_result_string(r), reshard_last_error());
        return 1;
      }
      t->have_direct = t->priced = 1;
      t->ours = relay ? relay_est : t->direct_est;
      t->f = &t->fs[relay];
      final_free(&t->fs[!relay]);
      t->opts.relay = relay;
      printf("# relay -1 on %s: direct %.6g s, relay %.6g s predicted: the %s plan is kept\n", topo.name,
             t->direct_est.seconds, relay_est.seconds, relay ? "relay" : "direct");
    }
  }
  return 0;
}

/* --rank R: one rank, as given: its figures, no agreement. */
static int plan_one_rank(plan_tool *t) {
  pm_result m;
  pm_measure(t->L.src, t->L.dst, t->o.rank, t->world, &t->opts, &m);
  if (!m.ok) {
    fprintf(stderr, "reshard_plan: error: rank %d: plan failed: %s\n", t->o.rank, m.err);
  } else {
    printf("# rank %d alone: its chunk size (%zu B) derives from its own peer count; a real run may use a\n"
           "# smaller one (more messages, the same bytes); no coverage check\n",
           t->o.rank, m.stats.chunk_bytes);
    print_header();
    print_row(t->o.rank, cli_role(&t->L, t->o.rank), &m, &m.stats);
  }
  printf("# reshard_plan: ranks=1 plan_ms=%.2f peak_MiB=%.1f coverage=skipped\n", m.ok ? m.plan_ms : 0.0,
         m.ok ? m.peak_mib : 0.0);
  return m.ok ? 0 : 1;
}

/* Every rank's first stage, priced when a topology is given. */
static void plan_all(plan_tool *t) {
  if (!t->run) {
    reshard_result_t rc = pw_run_create(t->L.src, t->L.dst, t->world, &t->opts, &t->run);
    if (!rc && t->o.topology) { /* priced, and the figures taken, in one pass */
      rc = pc_price_run(t->run, t->L.src, t->L.dst, t->world, &t->opts, final_rank, t->f, &t->ours);
      t->priced = 1;
    }
    if (rc) {
      fprintf(stderr, "reshard_plan: error: %s: %s\n", reshard_result_string(rc), reshard_last_error());
      t->failed = 1;
    }
  }
}

static reshard_result_t pre_rank(int r, reshard_plan_t *plan, void *arg) { return rp_add(arg, r, plan); }

/* A pre-plan's options, as reshard_plan_create plans it (src/plan/create.c:
 * relay 0, its destination scratch, not double buffered). */
static reshard_options_t pre_options(const plan_tool *t) {
  reshard_options_t po = t->opts;
  po.relay = 0;
  po.flags &= ~(uint32_t)RESHARD_FLAG_DOUBLE_BUFFER;
  return po;
}

/* --replay-out with a pre-plan (spreading kept, or fp8 gathering): it
 * runs before the main plan (src/api/stages.c), so its schedule is a
 * stage of the replay before the main plan's: planned here as
 * reshard_plan_create plans it, from src to the scratch. NULL (and the
 * run failed) on an error. */
static rp_writer *replay_pre_plan(plan_tool *t, const reshard_layout_t *src, const reshard_layout_t *pre_dst,
                                  const char *what) {
  reshard_options_t po = pre_options(t);
  pw_run *run = NULL;
  rp_writer *w = rp_create(t->world);
  reshard_result_t rc = w ? pw_run_create(src, pre_dst, t->world, &po, &run) : RESHARD_ERROR_OUT_OF_MEMORY;
  if (!rc) rc = pw_run_plans(run, pre_rank, w);
  pw_run_free(run);
  if (rc) {
    fprintf(stderr, "reshard_plan: error: --replay-out: the %s pre-plan: %s: %s\n", what, reshard_result_string(rc),
            reshard_last_error());
    t->failed = 1;
    rp_free(w);
    return NULL;
  }
  return w;
}

/* fp8 gathering: the blocks split across source ranks are gathered
 * before the quantization, by a pre-plan from the caller's source
 * (src/plan/create.c), which a call runs first (src/api/stages.c). Priced
 * as reshard_plan_estimate prices it: its time comes before the main
 * plan's (and a spreading pre-plan's). */
static void gather_pre_plan(plan_tool *t) {
  if (t->failed || !t->gather) return;
  if (t->priced) {
    reshard_options_t po = pre_options(t);
    reshard_estimate_t est = RESHARD_ESTIMATE_INITIALIZER;
    reshard_result_t rc = pc_estimate_global(t->quant_src, t->gather, t->world, &po, &est, NULL);
    if (rc) {
      fprintf(stderr, "reshard_plan: error: the fp8 gathering pre-plan: %s: %s\n", reshard_result_string(rc),
              reshard_last_error());
      t->failed = 1;
      return;
    }
    printf("# fp8 gathering: %.3g MiB of blocks split across source ranks gathered first (%.6g s predicted, over %d "
           "rounds): the prediction adds it\n",
           (double)est.bytes / 1048576.0, est.seconds, (int)est.num_rounds);
    rs_cost_add_before(&t->ours, &est);
    t->gather_pre_s = est.seconds;
    t->gather_bytes = est.bytes;
  }
  if (t->o.replay_out) t->gather_rp = replay_pre_plan(t, t->quant_src, t->gather, "fp8 gathering");
}

static void spread_sources(plan_tool *t) {
  /* Source-side spreading (plan/spread.h), decided and priced as
   * reshard_plan_create does: from the kept plan's egress per rank, then
   * the pre-plan and the main plan priced against it. When kept, the
   * rest of the report is the main plan's (its source: the caller's plus
   * the scratch copies), the prediction adds the pre-plan's, and T_lower
   * stays the caller's layouts'. */
  t->user_src = t->L.src;
  int64_t spread_env = 1;
  if (rs_param_get(RS_PARAM_SPREAD, &spread_env) && spread_env == 2) t->opts.flags |= RESHARD_FLAG_SPREAD_ALWAYS;
  if (!t->failed && t->priced && spread_env != 0) {
    rs_spread_layouts sl;
    reshard_estimate_t pre_est = RESHARD_ESTIMATE_INITIALIZER, main_est = RESHARD_ESTIMATE_INITIALIZER;
    reshard_result_t rc = pc_spread_decide(t->run, t->L.src, t->L.dst, t->world, &t->opts, &sl);
    pw_run *mrun = NULL;
    int mrelay = t->opts.relay;
    if (!rc && sl.src) {
      reshard_options_t po = t->opts;
      po.relay = 0;
      rc = pc_estimate_global(t->L.src, sl.pre, t->world, &po, &pre_est, NULL);
      if (!rc && final_init(&t->fs2[0], &t->L, &t->o, t->world)) rc = RESHARD_ERROR_OUT_OF_MEMORY;
      if (!rc && final_init(&t->fs2[1], &t->L, &t->o, t->world)) rc = RESHARD_ERROR_OUT_OF_MEMORY;
      reshard_options_t mo = t->opts;
      if (!rc && t->o.relay == -1) {
        reshard_estimate_t md = RESHARD_ESTIMATE_INITIALIZER, mr = RESHARD_ESTIMATE_INITIALIZER;
        void *const args[2] = {&t->fs2[0], &t->fs2[1]};
        mo.relay = -1;
        rc = pc_choose_relay(sl.src, t->L.dst, t->world, &mo, &mrelay, &md, &mr, final_rank, args, &mrun);
        main_est = mrelay ? mr : md;
      } else if (!rc) {
        rc = pw_run_create(sl.src, t->L.dst, t->world, &mo, &mrun);
        if (!rc) rc = pc_price_run(mrun, sl.src, t->L.dst, t->world, &mo, final_rank, &t->fs2[mrelay > 0], &main_est);
      }
    }
    if (rc) {
      fprintf(stderr, "reshard_plan: error: source-side spreading: %s: %s\n", reshard_result_string(rc),
              reshard_last_error());
      t->failed = 1;
    } else if (sl.src) {
      const double with = pre_est.seconds + main_est.seconds;
      const int keep = (t->opts.flags & RESHARD_FLAG_SPREAD_ALWAYS) || with < t->ours.seconds * 0.98;
      printf("# source-side spreading: %.1f MiB of sole-held data copied over NVLink first (%.6g s) + the main plan "
             "(%.6g s%s) = %.6g s predicted, against %.6g s without: %s\n",
             (double)sl.moved / 1048576.0, pre_est.seconds, main_est.seconds, mrelay ? ", relay" : ", direct", with,
             t->ours.seconds, keep ? "kept (the report below is the main plan's, the prediction both plans')"
                                : "not kept");
      if (keep) {
        pw_run_free(t->run);
        t->run = mrun, mrun = NULL;
        t->f = &t->fs2[mrelay > 0];
        t->opts.relay = mrelay;
        t->L.src = sl.src, sl.src = NULL;
        t->ours = main_est;
        rs_cost_add_before(&t->ours, &pre_est);
        t->spread_kept = 1;
        t->spread_pre_s = pre_est.seconds;
        t->spread_moved = sl.moved;
        if (t->o.replay_out) t->pre_rp = replay_pre_plan(t, t->user_src, sl.pre, "spreading");
      }
    }
    pw_run_free(mrun);
    rs_spread_layouts_free(&sl);
  }
}

static int time_sample(plan_tool *t) {
  /* Planning time and memory, each timed rank planned as given in a
   * forked child: what that rank's creation costs in a real run. */
  t->ms = calloc((size_t)t->world + 1, sizeof *t->ms);
  t->timed = calloc((size_t)t->world + 1, 1);
  if (!t->ms || !t->timed) return -1;
  if (!t->failed) {
    pick_timed(&t->L, t->run, t->world, t->o.time_all, t->timed);
    for (int r = 0; r < t->world && !t->failed; r++) {
      if (!t->timed[r]) continue;
      pm_measure(t->L.src, t->L.dst, r, t->world, &t->opts, &t->ms[r]);
      if (!t->ms[r].ok) {
        fprintf(stderr, "reshard_plan: error: rank %d: plan failed: %s\n", r, t->ms[r].err);
        t->failed = 1;
      }
      if (t->ms[r].plan_ms > t->worst_ms) t->worst_ms = t->ms[r].plan_ms;
      if (t->ms[r].peak_mib > t->worst_mib) t->worst_mib = t->ms[r].peak_mib;
      t->ntimed++;
    }
  }
  return 0;
}

static void final_plans(plan_tool *t) {
  /* The plans a real run executes: their figures (unless the pricing
   * took them) and the checks. */
  t->ag = t->failed ? NULL : pw_run_agreed(t->run);
  if (t->ag) t->f->chunk = t->ag->chunk;
  t->f->check_now = !t->o.no_check || t->o.inject_error;
  if (!t->failed && (t->f->check_now || !t->priced)) {
    reshard_result_t rc = pw_run_plans(t->run, final_rank, t->f);
    if (rc) {
      fprintf(stderr, "reshard_plan: error: plan with the agreed chunk (%zu B): %s: %s\n", t->f->chunk,
              reshard_result_string(rc), reshard_last_error());
      t->failed = 1;
    }
  }
  if (!t->failed && !t->o.no_check) check_agreement(&t->f->ck, &t->f->sends, &t->f->recvs);
}

/* The per-rank table, totals, digests and checks. */
static void print_table(plan_tool *t) {
  const reshard_plan_stats_t *agreed = t->f->agreed;
  printf("# timed: %d of %d ranks (%s), each planned as given in a forked child\n"
         "# (plan_ms, cpu_ms, peak_MiB; '?': peak not resettable; '-': not timed, --time-all times all);\n",
         t->ntimed, t->world, t->o.time_all ? "--time-all" : "the first and the busiest of each role");
  printf("# traffic from the plans with the agreed chunk of %zu B, spread of %d rounds and %d phases (the\n"
         "# smallest chunk and largest spread of the ranks', phases from their largest estimates, as a real run)\n",
         t->ag->chunk, (int)t->ag->spread, (int)t->ag->phases);
  if (t->ag->wide) printf("# streams over %llu MiB send in every round (wide)\n", (unsigned long long)(t->ag->wide >> 20));
  if (t->world > 0 && agreed[0].pace_rounds && !t->ag->pace.narrow && !t->ag->pace.wide)
    printf("# paced over %d rounds (no network stream; the longest inside an NVLink domain: %.1f MiB): every stream\n"
           "# keeps to them\n",
           agreed[0].pace_rounds, (double)t->ag->pace.inside / (1 << 20));
  else if (t->world > 0 && agreed[0].pace_rounds)
    printf("# paced over %d rounds (the longest network streams: narrow %.1f MiB, wide %.1f MiB): streams inside an\n"
           "# NVLink domain finish within them; wide network streams, and those nothing waits on past NVLink,\n"
           "# spread over them\n",
           agreed[0].pace_rounds, (double)t->ag->pace.narrow / (1 << 20), (double)t->ag->pace.wide / (1 << 20));
  if (t->ag->phases > 1 || t->ag->est[RS_WIDE_CANDIDATES] != UINT64_MAX) print_phase_estimates(t->ag->est);
  print_header();
  reshard_plan_stats_t tot;
  memset(&tot, 0, sizeof tot);
  for (int r = 0; r < t->world; r++) {
    print_row(r, cli_role(&t->L, r), &t->ms[r], &agreed[r]);
    tot.send_bytes += agreed[r].send_bytes;
    tot.recv_bytes += agreed[r].recv_bytes;
    tot.local_copy_bytes += agreed[r].local_copy_bytes;
    tot.send_messages += agreed[r].send_messages;
    tot.recv_messages += agreed[r].recv_messages;
    tot.segments += agreed[r].segments;
  }
  printf("%6s %5s %9s %9s %9s %10.2f %10.2f %10.2f %8zu %8zu %6s %6s %7s %9zu\n", "total", "", "", "", "",
         (double)tot.send_bytes / 1048576.0, (double)tot.recv_bytes / 1048576.0,
         (double)tot.local_copy_bytes / 1048576.0, tot.send_messages, tot.recv_messages, "", "", "", tot.segments);
  for (int r = 0; r < t->world && t->f->digest; r++) printf("# digest rank %d %016llx\n", r, (unsigned long long)t->f->digest[r]);
  if (t->o.no_check) printf("# checks: skipped (--no-check)\n");
  else printf("# checks: %ld violation%s\n", t->f->ck.violations, t->f->ck.violations == 1 ? "" : "s");
}

/* The result line, the cost report (--topology) and the profile; 0 when
 * every check passed. */
static int report(plan_tool *t) {
  int ok = !t->failed && t->f->ck.violations == 0;
  printf("# reshard_plan: ranks=%d plan_ms=%.2f peak_MiB=%.1f coverage=%s\n", t->world, t->worst_ms, t->worst_mib,
         t->o.no_check && !t->failed ? "skipped" : ok ? "ok" : "FAILED");
  if (t->o.topology && !t->failed) {
    fflush(stdout);
    /* the balanced-direct baseline is the direct plan: priced already
     * when the relay choice priced it, or when it is ours */
    const reshard_estimate_t *direct = t->have_direct ? &t->direct_est : t->opts.relay == 0 && t->L.src == t->user_src ? &t->ours : NULL;
    /* bounds and baselines over the caller's layouts, also after spreading */
    cli_layouts Lu = t->L;
    Lu.src = t->user_src;
    if (cr_report(&Lu, t->world, &t->opts, &t->ours, direct, stdout, &t->cost)) t->failed = 1;
  }
  if (t->o.profile) {
    struct timespec t_end;
    clock_gettime(CLOCK_MONOTONIC, &t_end);
    print_profile((double)(t_end.tv_sec - t->t_start.tv_sec) + 1e-9 * (double)(t_end.tv_nsec - t->t_start.tv_nsec));
  }
  return ok;
}

/* --json FILE: the kept plans' description (plan_json.h). */
static int write_json(plan_tool *t) {
  const int topo = t->o.topology != NULL;
  pj_meta m = {.L = &t->L,
               .world = t->world,
               .colocated = t->o.colocate,
               .relay = t->opts.relay,
               .opts = &t->opts,
               .chunk = t->ag->chunk,
               .spread_rounds = (int)t->ag->spread,
               .phases = (int)t->ag->phases,
               .pace_rounds = t->world > 0 ? t->f->agreed[0].pace_rounds : 0,
               .wide_bytes = t->ag->wide,
               .phase_est = t->ag->est,
               .stats = t->f->agreed,
               .ours = topo ? &t->ours : NULL,
               .cost = topo ? &t->cost : NULL,
               .spread_kept = t->spread_kept,
               .spread_pre_s = t->spread_pre_s,
               .spread_moved_bytes = t->spread_moved,
               .gather_priced = t->gather != NULL && t->priced,
               .gather_pre_s = t->gather_pre_s,
               .gather_bytes = t->gather_bytes};
  return pj_write(t->f->pj, &m, t->o.json);
}

static void plan_tool_free(plan_tool *t) {
  final_free(&t->fs[0]);
  final_free(&t->fs[1]);
  final_free(&t->fs2[0]);
  final_free(&t->fs2[1]);
  pw_run_free(t->run);
  rp_free(t->pre_rp);
  rp_free(t->gather_rp);
  reshard_layout_destroy(t->quant_src);
  reshard_layout_destroy(t->gather);
  pw_share_first_replica(0);
  if (t->user_src && t->L.src != t->user_src) reshard_layout_destroy(t->user_src);
  free(t->timed);
  free(t->ms);
  cli_layouts_free(&t->L);
}

int main(int argc, char **argv) {
  static plan_tool tool;
  plan_tool *t = &tool;
  clock_gettime(CLOCK_MONOTONIC, &t->t_start);
  /* Thousands of plan creations each allocate and free tens to hundreds
   * of MiB: keep freed memory for the next instead of returning it to
   * the kernel and faulting it in again (the timed children trim first).
   * glibc maps blocks over 32 MiB (its highest mmap threshold) afresh at
   * every malloc and unmaps them at free: no mmap at all, so that they
   * come from the heap, which keeps them (a thread's arena that cannot
   * hold one passes it to the main arena). */
  mallopt(M_MMAP_MAX, 0);
  mallopt(M_TRIM_THRESHOLD, 1 << 30);
  int rc = setup(t, argc, argv);
  if (rc >= 0) return rc;
  if (quantize_layouts(t) || choose_relay(t)) return 1;
  printf("# reshard_plan, one process: %s\n", t->L.desc);
  printf("# world %d (%d source, %d destination%s), tensors %d, staging %zu B\n", t->world, t->L.nsrc, t->L.ndst,
         t->o.colocate ? ", colocated" : "", reshard_layout_num_tensors(t->L.dst), t->opts.staging_bytes);
  if (t->o.rank >= 0) {
    rc = plan_one_rank(t);
    plan_tool_free(t);
    return rc;
  }
  plan_all(t);
  spread_sources(t);
  gather_pre_plan(t);
  if (time_sample(t)) return 1;
  final_plans(t);
  if (!t->failed) print_table(t);
  int ok = report(t);
  if (t->o.json && !t->failed && write_json(t)) t->failed = 1;
  if (t->o.replay_out && !t->failed) {
    /* the stages a call runs, in order (src/api/stages.c) */
    rp_writer *stages[3];
    int n = 0;
    if (t->gather_rp) stages[n++] = t->gather_rp;
    if (t->pre_rp) stages[n++] = t->pre_rp;
    stages[n++] = t->f->rp;
    if (rp_write(stages, n, t->o.replay_out)) t->failed = 1;
  }
  plan_tool_free(t);
  if (t->failed) return 1;
  return t->o.strict && !ok ? 1 : 0;
}
