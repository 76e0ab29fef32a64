/* The schedule both executors walk (src/exec/schedule.h), checked on the
 * plans of random layout pairs (support/random_layout, direct and relay,
 * small staging budgets and chunks so that plans have many rounds and
 * relay forwards), rank by rank:
 *
 * walk           every step once (AGREE, PACK/XFER/UNPACK of each round,
 *                FPACK/FXFER of each round with forwards and of no
 *                other, LOCAL, CHECK), on its lane, and every dependency
 *                on a step the walk ran earlier: the host can run it in
 *                order
 * device_order   with the device's semantics (a lane runs in order, a
 *                dependency is an event wait, on the one event of the
 *                step's kind and round parity, which must have been
 *                recorded last by that very step), every pair of steps that
 *                touch the same staging half in conflicting ways (packs
 *                and transfers of a send half, transfers and unpack of a
 *                receive half, two rounds apart; the forwards' FPACK and
 *                FXFER alike) is ordered; the gate is
 *                written (AGREE) before it is read (LOCAL, UNPACK); CHECK
 *                comes after every write
 * host_order     with the host's semantics (a step is done when it
 *                returns, except a transfer: its sends complete at a wait
 *                for it, its receives in its unpack): a transfer posts into
 *                halves whose earlier sends completed and whose earlier
 *                receives were unpacked; the call ends with every send done
 * forwards       the bytes a relay forward reads from the destination
 *                buffers were written by receives (or local copies) that
 *                happen before the forward's pack on both executors: found
 *                byte by byte by walking the copy descriptors, not from
 *                the planner's rule
 * xfers          a round's posting order is its receives, then its sends,
 *                each followed by its sums in verify mode, every message
 *                once, for the whole round, its forwards (FXFER's part)
 *                and the rest (XFER's); each direction's forwards last
 *
 * The conflicts are this file's own model of what each step reads and
 * writes, not the schedule's dependency rules. Seeds are printed on
 * failure; RS_SCHED_SEED=<seed> replays one, RS_SCHED_COUNT=<n> changes
 * the number of cases. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "exec/schedule.h"
#include "plan/plan.h"
#include "plan/relay.h"
#include "reshard.h"
#include "support/harness.h"
#include "support/random_layout.h"
#include "support/test_scale.h"

/* ---- the walk, recorded ---- */

#define MAXSTEPS 200000

typedef struct rec {
  const reshard_plan_t *p;
  rs_step *steps;
  int *ndeps;
  rs_dep (*deps)[RS_SCHED_MAXDEP];
  size_t n;
  int bad_dep; /* a wait on a step the walk has not run */
  /* The device executor keeps one event per step kind and round parity
   * (src/device/execute.c step_event): a wait on another lane must find that
   * event last recorded by the very step it waits for. */
  long last[RS_STEP_CHECK + 1][2];
  int stale_event;
} rec;

static int same(rs_step a, rs_step b) { return a.kind == b.kind && a.round == b.round; }

static long find(const rec *r, rs_step s) {
  for (size_t i = 0; i < r->n; i++)
    if (same(r->steps[i], s)) return (long)i;
  return -1;
}

static reshard_result_t rec_wait(void *ctx, rs_step step, rs_dep dep) {
  rec *r = ctx;
  long at = find(r, dep.on);
  if (at < 0) r->bad_dep++;
  if (at >= 0 && dep.on.lane != step.lane && r->last[dep.on.kind][dep.on.round & 1] != at) r->stale_event++;
  int *nd = &r->ndeps[r->n];
  if (*nd < RS_SCHED_MAXDEP) r->deps[r->n][(*nd)++] = dep;
  else r->bad_dep++; /* more than rs_sched_deps may list */
  (void)step;
  return RESHARD_SUCCESS;
}

static reshard_result_t rec_run(void *ctx, rs_step step) {
  rec *r = ctx;
  if (r->n + 1 >= MAXSTEPS) return RESHARD_ERROR_INTERNAL;
  r->last[step.kind][step.round & 1] = (long)r->n;
  r->steps[r->n++] = step;
  r->ndeps[r->n] = 0;
  return RESHARD_SUCCESS;
}

/* ---- checks ---- */

typedef struct errs {
  int n;
  char first[256];
} errs;

static void err(errs *e, const char *fmt, ...) {
  if (e->n++) return;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(e->first, sizeof e->first, fmt, ap);
  va_end(ap);
}

static const char *kind_name(rs_step_kind k) {
  static const char *n[] = {"AGREE", "PACK", "LOCAL", "XFER", "UNPACK", "FPACK", "FXFER", "CHECK"};
  return n[k];
}

/* Whether round k has relay forwards to send or receive, from the
 * messages themselves. */
static int has_forwards(const reshard_plan_t *p, int k) {
  for (size_t i = 0; i < p->nsends; i++)
    if (p->sends[i].round == k && p->sends[i].fwd) return 1;
  for (size_t i = 0; i < p->nrecvs; i++)
    if (p->recvs[i].round == k && p->recvs[i].fwd) return 1;
  return 0;
}

/* walk: every step once, on its lane; FPACK k and FXFER k exactly for
 * the rounds with forwards. */
static void check_walk(const rec *r, errs *e) {
  const reshard_plan_t *p = r->p;
  int n = p->nrounds, nf = 0;
  for (int k = 0; k < n; k++) nf += has_forwards(p, k);
  if (r->bad_dep) err(e, "%d waits on steps not yet run (or past RS_SCHED_MAXDEP)", r->bad_dep);
  if (r->stale_event) err(e, "%d waits on another lane find the step's event recorded by a later step", r->stale_event);
  if (r->n != (size_t)(3 * n + 3 + 2 * nf)) err(e, "%zu steps for %d rounds, %d of them forwarding", r->n, n, nf);
  static const rs_lane lane[] = {RS_LANE_XFER,   RS_LANE_PACK, RS_LANE_PACK, RS_LANE_XFER,
                                 RS_LANE_UNPACK, RS_LANE_PACK, RS_LANE_XFER, RS_LANE_XFER};
  for (size_t i = 0; i < r->n; i++) {
    rs_step s = r->steps[i];
    if (s.lane != lane[s.kind]) err(e, "%s %d on lane %d", kind_name(s.kind), s.round, s.lane);
    int fwd_step = s.kind == RS_STEP_FPACK || s.kind == RS_STEP_FXFER;
    int rounded = s.kind == RS_STEP_PACK || s.kind == RS_STEP_XFER || s.kind == RS_STEP_UNPACK || fwd_step;
    if (rounded ? s.round < 0 || s.round >= n : s.round != -1) err(e, "%s with round %d", kind_name(s.kind), s.round);
    if (fwd_step && rounded && s.round >= 0 && s.round < n && !has_forwards(p, s.round))
      err(e, "%s %d in a round without forwards", kind_name(s.kind), s.round);
    for (size_t j = 0; j < i; j++)
      if (same(r->steps[j], s)) err(e, "%s %d twice", kind_name(s.kind), s.round);
  }
  if (r->n && r->steps[0].kind != RS_STEP_AGREE) err(e, "the walk does not start with AGREE");
  if (r->n && r->steps[r->n - 1].kind != RS_STEP_CHECK) err(e, "the walk does not end with CHECK");
}

/* Device semantics: happens-before through lane order and dependencies,
 * as vector clocks (the latest position on each lane known done). */
typedef struct vclock {
  long at[RS_LANES];
} vclock;

typedef struct device_hb {
  vclock *vc;    /* per step */
  long *lanepos; /* per step: its position on its lane */
} device_hb;

static void device_hb_build(const rec *r, device_hb *h) {
  h->vc = calloc(r->n + 1, sizeof *h->vc);
  h->lanepos = calloc(r->n + 1, sizeof *h->lanepos);
  assert_non_null(h->vc);
  assert_non_null(h->lanepos);
  long count[RS_LANES] = {0}, last[RS_LANES] = {-1, -1, -1};
  for (size_t i = 0; i < r->n; i++) {
    rs_lane l = r->steps[i].lane;
    vclock v;
    for (int k = 0; k < RS_LANES; k++) v.at[k] = -1;
    if (last[l] >= 0) { /* the lane's previous step and what it knew */
      v = h->vc[last[l]];
      v.at[l] = h->lanepos[last[l]];
    }
    for (int d = 0; d < r->ndeps[i]; d++) {
      long j = find(r, r->deps[i][d].on);
      if (j < 0) continue;
      for (int k = 0; k < RS_LANES; k++)
        if (h->vc[j].at[k] > v.at[k]) v.at[k] = h->vc[j].at[k];
      rs_lane lj = r->steps[j].lane;
      if (h->lanepos[j] > v.at[lj]) v.at[lj] = h->lanepos[j];
    }
    h->vc[i] = v;
    h->lanepos[i] = count[l]++;
    last[l] = (long)i;
  }
}

/* Whether step a (index) is done before step b starts, on the device. */
static int device_before(const rec *r, const device_hb *h, long a, long b) {
  return a >= 0 && b >= 0 && h->lanepos[a] <= h->vc[b].at[r->steps[a].lane];
}

static rs_step mk(rs_step_kind k, int round) {
  rs_step s = {k, RS_LANE_XFER, round};
  return s;
}

/* device_order: the conflicts of this file's model, ordered. */
static void check_device(const rec *r, const device_hb *h, errs *e) {
  int n = r->p->nrounds;
  long agree = find(r, mk(RS_STEP_AGREE, -1)), local = find(r, mk(RS_STEP_LOCAL, -1)),
       check = find(r, mk(RS_STEP_CHECK, -1));
  if (!device_before(r, h, agree, local)) err(e, "device: LOCAL may read the gate before AGREE wrote it");
  for (int k = 0; k < n; k++) {
    long pk = find(r, mk(RS_STEP_PACK, k)), xk = find(r, mk(RS_STEP_XFER, k)), uk = find(r, mk(RS_STEP_UNPACK, k));
    /* a round's forwards: packed by FPACK, sent and received by FXFER */
    long fp = find(r, mk(RS_STEP_FPACK, k)), fx = find(r, mk(RS_STEP_FXFER, k));
    /* send half k%2: pack writes, transfer reads */
    if (!device_before(r, h, pk, xk)) err(e, "device: XFER %d may send before PACK %d packed", k, k);
    if (fp >= 0 && !device_before(r, h, fp, fx)) err(e, "device: FXFER %d may send before FPACK %d packed", k, k);
    /* receive half k%2: transfer writes, unpack reads; unpack writes dst under the gate */
    if (!device_before(r, h, xk, uk)) err(e, "device: UNPACK %d may read before XFER %d received", k, k);
    if (fx >= 0 && !device_before(r, h, fx, uk)) err(e, "device: UNPACK %d may read before FXFER %d received", k, k);
    if (!device_before(r, h, agree, uk)) err(e, "device: UNPACK %d may read the gate before AGREE", k);
    if (!device_before(r, h, uk, check)) err(e, "device: CHECK before UNPACK %d", k);
    if (!device_before(r, h, pk, check)) err(e, "device: CHECK before PACK %d", k);
    if (!device_before(r, h, xk, check)) err(e, "device: CHECK before XFER %d", k);
    if (fp >= 0 && !device_before(r, h, fp, check)) err(e, "device: CHECK before FPACK %d", k);
    if (fx >= 0 && !device_before(r, h, fx, check)) err(e, "device: CHECK before FXFER %d", k);
    for (int k2 = k + 2; k2 < n; k2 += 2) {
      long p2 = find(r, mk(RS_STEP_PACK, k2)), x2 = find(r, mk(RS_STEP_XFER, k2));
      long f2 = find(r, mk(RS_STEP_FPACK, k2)), g2 = find(r, mk(RS_STEP_FXFER, k2));
      long writers[2] = {p2, f2}, readers[2] = {xk, fx};
      for (int a = 0; a < 2; a++)
        for (int b = 0; b < 2; b++)
          if (writers[a] >= 0 && readers[b] >= 0 && !device_before(r, h, readers[b], writers[a]))
            err(e, "device: %s %d may overwrite send half %d before %s %d sent", a ? "FPACK" : "PACK", k2, k & 1,
                b ? "FXFER" : "XFER", k);
      if (!device_before(r, h, uk, x2))
        err(e, "device: XFER %d may overwrite receive half %d before UNPACK %d read it", k2, k & 1, k);
      if (g2 >= 0 && !device_before(r, h, uk, g2))
        err(e, "device: FXFER %d may overwrite receive half %d before UNPACK %d read it", k2, k & 1, k);
    }
  }
  if (!device_before(r, h, local, check)) err(e, "device: CHECK before LOCAL");
}

/* host_order: the host back end's semantics, simulated along the walk. */
static void check_host(const rec *r, errs *e) {
  int n = r->p->nrounds;
  int sent_upto = 0; /* rounds before it completed their sends */
  unsigned char *posted = calloc((size_t)n + 1, 1), *unpacked = calloc((size_t)n + 1, 1);
  assert_non_null(posted);
  assert_non_null(unpacked);
  int agreed = 0;
  for (size_t i = 0; i < r->n; i++) {
    rs_step s = r->steps[i];
    for (int d = 0; d < r->ndeps[i]; d++) { /* the host's waits (execute.c host_wait) */
      rs_dep dep = r->deps[i][d];
      if (dep.on.kind == RS_STEP_XFER && dep.need != RS_NEED_RECEIVED && dep.on.round + 1 > sent_upto)
        sent_upto = dep.on.round + 1;
    }
    int k = s.round;
    switch (s.kind) {
    case RS_STEP_AGREE:
      agreed = 1;
      break;
    case RS_STEP_XFER: /* packs into send half k%2, posts receives into receive half k%2 */
    case RS_STEP_FXFER: /* the same, for the round's forwards */
      if (!agreed) err(e, "host: %s %d before AGREE", kind_name(s.kind), k);
      if (k >= 2 && sent_upto < k - 1)
        err(e, "host: %s %d packs over round %d's sends in flight", kind_name(s.kind), k, k - 2);
      if (k >= 2 && !unpacked[k - 2])
        err(e, "host: %s %d receives over round %d's data not unpacked", kind_name(s.kind), k, k - 2);
      posted[k] |= s.kind == RS_STEP_XFER ? 1 : 2;
      break;
    case RS_STEP_UNPACK:
      if (!(posted[k] & 1) || (has_forwards(r->p, k) && !(posted[k] & 2)))
        err(e, "host: UNPACK %d before its receives were posted", k);
      unpacked[k] = 1;
      break;
    case RS_STEP_LOCAL:
      if (!agreed) err(e, "host: LOCAL before AGREE");
      break;
    case RS_STEP_PACK:
    case RS_STEP_FPACK:
    case RS_STEP_CHECK:
      break;
    }
  }
  if (sent_upto < n) err(e, "host: the call ends with round %d's sends in flight", sent_upto);
  for (int k = 0; k < n; k++)
    if (!unpacked[k]) err(e, "host: round %d never unpacked", k);
  free(posted);
  free(unpacked);
}

/* ---- forwards: which receive wrote the bytes a forward reads ---- */

/* Calls fn on each contiguous run of copy c on one side (0: source,
 * 1: destination) as (offset, bytes). Byte copies only. */
static void runs(const rs_copy *c, int side, void (*fn)(void *, uint64_t, uint64_t), void *arg) {
  int64_t idx[RS_COPY_MAX_DIMS] = {0};
  for (;;) {
    uint64_t off = side ? c->dst_off : c->src_off;
    for (int d = 0; d < c->ndim; d++) off += (uint64_t)(idx[d] * (side ? c->dst_stride[d] : c->src_stride[d]));
    fn(arg, off, c->run_bytes);
    int d = c->ndim - 1;
    for (; d >= 0 && ++idx[d] == c->extent[d]; d--) idx[d] = 0;
    if (d < 0) return;
  }
}

#define UNWRITTEN (-3)
#define BY_LOCAL (-2)

typedef struct marks {
  int32_t **round_of; /* per destination buffer, per byte: the round that wrote it */
  uint64_t *size;
  int mark;
  int worst; /* reading: the latest receive round seen */
  int unwritten, local;
  int32_t *cur; /* the buffer the copy at hand touches */
} marks;

static void grow(void *arg, uint64_t off, uint64_t len) {
  uint64_t *end = arg;
  if (off + len > *end) *end = off + len;
}

static void mark_run(void *arg, uint64_t off, uint64_t len) {
  marks *m = arg;
  for (uint64_t b = off; b < off + len; b++) m->cur[b] = m->mark;
}

static void read_run(void *arg, uint64_t off, uint64_t len) {
  marks *m = arg;
  for (uint64_t b = off; b < off + len; b++) {
    if (m->cur[b] == UNWRITTEN) m->unwritten++;
    else if (m->cur[b] == BY_LOCAL) m->local = 1;
    else if (m->cur[b] > m->worst) m->worst = m->cur[b];
  }
}

static void check_forwards(const rec *r, const device_hb *h, errs *e, int *nfwd) {
  const reshard_plan_t *p = r->p;
  int nb = p->num_dst_buffers;
  marks m = {calloc((size_t)nb + 1, sizeof(int32_t *)), calloc((size_t)nb + 1, sizeof(uint64_t)), 0, 0, 0, 0, NULL};
  assert_non_null(m.round_of);
  assert_non_null(m.size);
  /* buffer extents from every copy that touches a destination buffer */
  for (size_t i = 0; i < p->nrecv_copies; i++) runs(&p->recv_copies[i], 1, grow, &m.size[p->recv_copies[i].dst_buf]);
  for (size_t i = 0; i < p->nlocal_copies; i++)
    runs(&p->local_copies[i], 1, grow, &m.size[p->local_copies[i].dst_buf]);
  for (size_t i = 0; i < p->nsends; i++)
    for (uint32_t c = 0; p->sends[i].fwd && c < p->sends[i].ncopies; c++) {
      const rs_copy *cp = &p->send_copies[p->sends[i].first_copy + c];
      runs(cp, 0, grow, &m.size[cp->src_buf]);
    }
  for (int b = 0; b < nb; b++) {
    m.round_of[b] = malloc((m.size[b] + 1) * sizeof(int32_t));
    assert_non_null(m.round_of[b]);
    for (uint64_t i = 0; i <= m.size[b]; i++) m.round_of[b][i] = UNWRITTEN;
  }
  for (size_t i = 0; i < p->nrecvs; i++)
    for (uint32_t c = 0; c < p->recvs[i].ncopies; c++) {
      const rs_copy *cp = &p->recv_copies[p->recvs[i].first_copy + c];
      m.mark = p->recvs[i].round;
      m.cur = m.round_of[cp->dst_buf];
      runs(cp, 1, mark_run, &m);
    }
  for (size_t i = 0; i < p->nlocal_copies; i++) {
    m.mark = BY_LOCAL;
    m.cur = m.round_of[p->local_copies[i].dst_buf];
    runs(&p->local_copies[i], 1, mark_run, &m);
  }
  long local = find(r, mk(RS_STEP_LOCAL, -1));
  for (size_t i = 0; i < p->nsends; i++) {
    const rs_msg *s = &p->sends[i];
    if (!s->fwd) continue;
    ++*nfwd;
    /* a forward is packed by FPACK (device) and packed as it is posted by
     * FXFER (host) */
    long pk = find(r, mk(RS_STEP_FPACK, s->round)), xk = find(r, mk(RS_STEP_FXFER, s->round));
    if (pk < 0 || xk < 0) {
      err(e, "forward to rank %d in round %d: no FPACK or FXFER", s->peer, s->round);
      continue;
    }
    for (uint32_t c = 0; c < s->ncopies; c++) {
      const rs_copy *cp = &p->send_copies[s->first_copy + c];
      m.worst = -1;
      m.unwritten = m.local = 0;
      m.cur = m.round_of[cp->src_buf];
      runs(cp, 0, read_run, &m);
      if (m.unwritten) err(e, "forward to rank %d in round %d reads %d bytes nothing here wrote", s->peer, s->round,
                           m.unwritten);
      if (m.local) {
        if (!device_before(r, h, local, pk)) err(e, "device: forward in round %d may read before LOCAL", s->round);
        if (local > xk) err(e, "host: forward in round %d posted before LOCAL", s->round);
      }
      if (m.worst >= 0) {
        long uj = find(r, mk(RS_STEP_UNPACK, m.worst));
        if (!device_before(r, h, uj, pk))
          err(e, "device: forward in round %d reads data of round %d before its unpack", s->round, m.worst);
        /* the host packs a forward when it posts it (FXFER) */
        if (uj > xk) err(e, "host: forward in round %d reads data of round %d before its unpack", s->round, m.worst);
      }
    }
  }
  for (int b = 0; b < nb; b++) free(m.round_of[b]);
  free(m.round_of);
  free(m.size);
}

/* xfers: a round's posting order. */
static void check_xfers(const reshard_plan_t *p, errs *e) {
  for (int verify = 0; verify < 2; verify++) {
    /* (room for every message of the plan: an overflow of cap is
     * reported, not written past the buffer) */
    size_t cap = rs_sched_max_xfers(p, verify), seen_r = 0, seen_s = 0, room = 2 * (p->nsends + p->nrecvs) + 2;
    rs_xfer *x = calloc(room, sizeof *x);
    assert_non_null(x);
    for (int k = 0; k < p->nrounds; k++)
      for (int part = RS_XFER_PLAIN; part <= RS_XFER_ALL; part++) {
        size_t n = rs_sched_xfers(p, k, verify, (rs_xfer_part)part, x), at = 0;
        if (n > cap) err(e, "round %d: %zu transfers, room for %zu", k, n, cap);
        for (int recv = 1; recv >= 0; recv--) {
          const rs_msg *m = recv ? p->recvs : p->sends;
          size_t nm = recv ? p->nrecvs : p->nsends;
          int fwd_seen = 0;
          for (size_t i = 0; i < nm; i++) {
            if (m[i].round != k) continue;
            /* a round's forwards come last in each direction (the device
             * packs them as one range of tiles) */
            if (fwd_seen && !m[i].fwd) err(e, "round %d: %s %zu after a forward", k, recv ? "receive" : "send", i);
            fwd_seen |= m[i].fwd != 0;
            if (part != RS_XFER_ALL && (m[i].fwd != 0) != (part == RS_XFER_FWD)) continue;
            for (int sums = 0; sums <= verify; sums++, at++)
              if (at >= n || x[at].m != &m[i] || x[at].recv != recv || x[at].sums != sums)
                err(e, "round %d: transfer %zu is not %s %zu%s", k, at, recv ? "receive" : "send", i,
                    sums ? " (sums)" : "");
            if (part == RS_XFER_ALL) *(recv ? &seen_r : &seen_s) += 1;
          }
        }
        if (at != n) err(e, "round %d: %zu transfers, %zu expected", k, n, at);
      }
    if (seen_r != p->nrecvs || seen_s != p->nsends) err(e, "messages outside every round");
    free(x);
  }
}

/* ---- the cases ---- */

typedef struct world {
  const reshard_layout_t *src, *dst;
  reshard_options_t opts;
  pthread_mutex_t mu;
  int failures, rounds, fwd;
  char first[320];
} world;

static int check_rank(int rank, reshard_comm_t *comm, void *arg) {
  world *w = arg;
  reshard_plan_t *plan = NULL;
  errs e = {0, ""};
  int nfwd = 0;
  if (reshard_plan_create(comm, w->src, w->dst, &w->opts, &plan)) {
    err(&e, "plan_create: %s", reshard_last_error());
  } else {
    rec r;
    memset(&r, 0, sizeof r);
    r.p = plan;
    r.steps = calloc(MAXSTEPS, sizeof(rs_step));
    r.ndeps = calloc(MAXSTEPS, sizeof(int));
    r.deps = calloc(MAXSTEPS, sizeof(rs_dep[RS_SCHED_MAXDEP]));
    for (int k = 0; k <= RS_STEP_CHECK; k++) r.last[k][0] = r.last[k][1] = -1;
    assert_non_null(r.steps);
    assert_non_null(r.ndeps);
    assert_non_null(r.deps);
    rs_sched_ops ops = {rec_wait, rec_run};
    if (rs_sched_run(plan, &ops, &r)) err(&e, "the walk failed");
    check_walk(&r, &e);
    device_hb h;
    device_hb_build(&r, &h);
    check_device(&r, &h, &e);
    check_host(&r, &e);
    check_forwards(&r, &h, &e, &nfwd);
    check_xfers(plan, &e);
    free(h.vc);
    free(h.lanepos);
    free(r.steps);
    free(r.ndeps);
    free(r.deps);
  }
  pthread_mutex_lock(&w->mu);
  if (plan && plan->nrounds > w->rounds) w->rounds = plan->nrounds;
  w->fwd += nfwd;
  if (e.n && !w->failures++) snprintf(w->first, sizeof w->first, "rank %d: %s (%d problems)", rank, e.first, e.n);
  pthread_mutex_unlock(&w->mu);
  reshard_plan_destroy(plan);
  return e.n != 0;
}

static uint64_t first_seed(uint64_t dflt, int *count) {
  const char *n = getenv("RS_SCHED_COUNT");
  if (n && *n) *count = atoi(n);
  const char *e = getenv("RS_SCHED_SEED");
  if (e && *e) {
    *count = 1;
    return strtoull(e, NULL, 0);
  }
  return dflt;
}

static void random_plans(void **state) {
  (void)state;
  rs_relay_min_part_bytes = 0;
  int count = (int)rs_test_scaled(240), failed = 0, most_rounds = 0, forwards = 0;
  uint64_t seed0 = first_seed(7100000, &count);
  for (int c = 0; c < count; c++) {
    uint64_t seed = seed0 + (uint64_t)c;
    rl_pair pair;
    if (rl_pair_make(seed, seed % 3 == 0 ? RL_FULL_REPLICAS : RL_ANY, &pair)) {
      fprintf(stderr, "seed %" PRIu64 ": generator failed\n", seed);
      failed++;
      continue;
    }
    world w;
    memset(&w, 0, sizeof w);
    pthread_mutex_init(&w.mu, NULL);
    w.src = pair.src;
    w.dst = pair.dst;
    w.opts = (reshard_options_t)RESHARD_OPTIONS_INITIALIZER;
    w.opts.relay = seed % 2 ? 1 : 0;
    if (seed % 4 < 2) w.opts.staging_bytes = 4096 + seed % 1024;
    w.opts.chunk_bytes = seed % 5 == 0 ? 0 : (size_t)(16 + seed % 300);
    w.opts.timeout_ms = 60000;
    if (th_run_ranks(pair.nranks, check_rank, &w)) {
      fprintf(stderr, "seed %" PRIu64 ": %s (RS_SCHED_SEED=%" PRIu64 " replays)\n", seed, w.first, seed);
      if (failed < 2) rl_pair_print(&pair, stderr);
      failed++;
    }
    if (w.rounds > most_rounds) most_rounds = w.rounds;
    forwards += w.fwd;
    pthread_mutex_destroy(&w.mu);
    rl_pair_free(&pair);
  }
  rs_relay_min_part_bytes = RS_RELAY_MIN_PART_DEFAULT;
  fprintf(stderr, "%d cases, up to %d rounds, %d relay forwards\n", count, most_rounds, forwards);
  assert_int_equal(failed, 0);
  /* the cases must exercise what they check */
  if (count >= 20) {
    assert_true(most_rounds >= 8);
    assert_true(forwards > 0);
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {cmocka_unit_test(random_plans)};
  return cmocka_run_group_tests(tests, NULL, NULL);
}
