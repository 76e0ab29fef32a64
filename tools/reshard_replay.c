/* reshard_replay: a plan's own schedule replayed on SimGrid's network
 * model, at sizes the real MPI executor under SMPI cannot reach (issue 44).
 *
 *   reshard_plan ... --topology PRESET --replay-out plan.sched
 *   reshard_replay plan.sched platform.xml [--wall-limit S]
 *                  [--detach-below BYTES] [--msg-us US] [--progress]
 *                  [--cfg=simgrid/option:value ...]
 *
 * The schedule file (tools/plan_replay.h) holds, per rank, the fields of
 * its plan that the schedule reads (per stage: a call runs its pre-plans,
 * fp8 gathering then source-side spreading, then the main plan; each rank
 * walks them in that order, each plan on mailboxes of its own as it has
 * its own tags). Each rank gets a skeleton
 * reshard_plan_t with just those and one SimGrid actor on host "h<rank>"
 * of the platform (scripts/simulate.sh's preset_platform writes it),
 * which walks the real schedule, rs_sched_run (src/exec/schedule.c), with
 * these operations, mirroring the host executor (src/exec/execute.c):
 *
 *   AGREE   a 256-byte header to and from every partner (receives posted
 *           first, then sends), not waited: the check (the headers
 *           waited, then an 8-byte status word posted each way, collected
 *           at the end: src/exec/agree.c) comes before LOCAL, or in round
 *           0 before the tail of a split direct message (below), after
 *           the round's sends (src/exec/execute.c: host_check, post_round);
 *   XFER k  round k's transfers but its relay forwards (FXFER k posts
 *           those, after UNPACK k-1) posted in rs_sched_xfers order: receives
 *           as sg_mailbox_get_async, sends as sg_mailbox_put_async of the
 *           message's bytes (nothing is carried), on one mailbox per
 *           (sender, receiver): both ends post a pair's messages in the
 *           same order, so FIFO matching pairs them as MPI's tags do;
 *           round 0's messages of 16 KiB or more as two, head and tail
 *           (rs_sched_head_bytes); before the check, receives land in
 *           staging, and a split direct message's tail, with every later
 *           receive from its sender, waits for the check;
 *   waits   "XFER j sent": the sends of every round up to j complete (the
 *           host completes them in round order); "XFER j received" (an
 *           UNPACK): round j's receives complete;
 *   PACK, LOCAL, UNPACK   cost nothing, as in the SMPI runs
 *           (smpi/simulate-computation:no): only the network is measured;
 *   CHECK   the sends still out, then the agreement's status words.
 *
 * Sends under --detach-below bytes (default 65536, SMPI's
 * smpi/send-is-detached-thresh) complete at once for the sender, as
 * SMPI's eager sends do; the transfer itself still takes its network time.
 *
 * --msg-us US: every data message occupies its route US microseconds
 * longer (it carries US x the route's bandwidth in bytes more: a
 * per-message cost in link time, as the cost model's net_msg_s, 1 us on
 * the network, and nvlink_msg_s, 0.5 us, charge it; here the same US on
 * both). The fluid network charges a message nothing of its own, and what
 * a real one costs is not measured yet: this shows how a plan's time
 * depends on it (default 0).
 *
 * --progress: rank 0 says on stderr where it is every 16 rounds
 * (simulated and wall seconds), to see how far a long run got.
 *
 * Prints, for scripts to parse:
 *   # replay: simulated_s=T ranks=N messages=M stages=G wall_s=W
 * T: the latest end over the ranks (all start at 0, as after reshard_perf's
 * barrier). Nothing waits forever: the run is ended with an error when it
 * passes --wall-limit seconds of wall time (default 1800), and a rank
 * whose walk does not end (a deadlock SimGrid reports) fails the run. */
#include <signal.h>
#include <simgrid/actor.h>
#include <simgrid/comm.h>
#include <simgrid/engine.h>
#include <simgrid/host.h>
#include <simgrid/mailbox.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "reshard_internal.h"
#include "plan_replay.h"

enum { HDR_BYTES = 256, STATUS_BYTES = 8 };

/* One direction of one round: its posted comms (NULL once complete). */
typedef struct comm_list {
  sg_comm_t *c;
  size_t n;
} comm_list;

/* One plan of one rank: a call runs its stages' plans in order (the
 * gathering and spreading pre-plans, then the main plan:
 * src/api/stages.c). */
typedef struct replay_plan {
  reshard_plan_t plan;      /* skeleton: the schedule's fields only */
  rs_msg *msgs;             /* sends, then receives */
  reshard_peer_stats_t *peers;
  size_t *round_starts;     /* send_round, then recv_round */
  comm_list *sent, *recvd;  /* per round */
  comm_list hdr_out, hdr_in;     /* the headers in flight, until the check */
  comm_list agree_out, agree_in; /* the status words in flight */
  int checked;                   /* the agreement's check ran */
  int sent_upto;            /* rounds before it have completed their sends */
  int stage;                /* its mailboxes' own: each plan has its tags */
  rs_xfer *xfers;
  struct replay_rank *rank;
} replay_plan;

typedef struct replay_rank {
  replay_plan *stages;
  comm_list eager;          /* sends under --detach-below */
  size_t eager_cap;
  void *sink;               /* where receives put the (unread) payload */
  double end_s;
  int done, failed;
} replay_rank;

static struct {
  int world, nstages;
  replay_rank *ranks;
  long detach_below;
  double msg_s;      /* --msg-us, in seconds */
  sg_host_t *hosts;  /* per rank */
  size_t messages;
  int progress; /* --progress */
  double t0;    /* wall seconds at the start */
} R;

static double wall_now(void);

static char payload; /* what every put carries: nothing is read */

static sg_mailbox_t mailbox(char kind, int stage, int from, int to) {
  char name[48];
  snprintf(name, sizeof name, "%c%d:%d>%d", kind, stage, from, to);
  return sg_mailbox_by_name(name);
}

/* ---- reading the schedule file ---- */

static int fail_read(const char *path, int rank, const char *what) {
  fprintf(stderr, "reshard_replay: error: %s: rank %d: %s\n", path, rank, what);
  return -1;
}

/* A direction's round starts from its messages' rounds (sorted: the
 * writer checked them against the plan's arrays). */
static size_t *round_starts(const rs_msg *m, size_t n, int nrounds, size_t *out) {
  size_t i = 0;
  for (int k = 0; k <= nrounds; k++) {
    while (i < n && m[i].round < k) i++;
    out[k] = i;
  }
  return out;
}

static int read_msgs(FILE *f, const char *path, int rank, char want, rs_msg *m, size_t n, int nrounds) {
  for (size_t i = 0; i < n; i++) {
    char dir;
    unsigned long long bytes;
    unsigned fwd, ncopies, direct = 0;
    if (fscanf(f, " %c %d %d %llu %u %u", &dir, &m[i].peer, &m[i].round, &bytes, &fwd, &ncopies) != 6 || dir != want ||
        fscanf(f, "%u", &direct) != 1)
      return fail_read(path, rank, "bad message line");
    if (m[i].peer < 0 || m[i].peer >= R.world || m[i].round < 0 || m[i].round >= nrounds ||
        (i && m[i].round < m[i - 1].round))
      return fail_read(path, rank, "message peer or round out of range or order");
    /* (the schedule finds a round's forwards at its end: rs_sched_forwards) */
    if (i && m[i].round == m[i - 1].round && m[i - 1].fwd && !fwd)
      return fail_read(path, rank, "a round's forwards are not its last messages");
    m[i].bytes = bytes;
    m[i].fwd = fwd;
    m[i].ncopies = ncopies;
    m[i].direct = direct != 0;
  }
  return 0;
}

/* One rank's record into its skeleton plan of stage st. */
static int read_rank(FILE *f, const char *path, int r, int st) {
  replay_plan *x = &R.ranks[r].stages[st];
  reshard_plan_t *p = &x->plan;
  x->stage = st;
  x->rank = &R.ranks[r];
  int rank, nrounds;
  size_t ns, nr, np, nl, mrm;
  unsigned flags;
  if (fscanf(f, " rank %d nrounds %d nsends %zu nrecvs %zu npeers %zu nlocal %zu flags %u max_round_msgs %zu", &rank,
             &nrounds, &ns, &nr, &np, &nl, &flags, &mrm) != 8 ||
      rank != r || nrounds < 0)
    return fail_read(path, r, "bad rank header");
  x->msgs = calloc(ns + nr + 1, sizeof *x->msgs);
  x->peers = calloc(np + 1, sizeof *x->peers);
  x->round_starts = calloc(2 * ((size_t)nrounds + 1), sizeof *x->round_starts);
  x->sent = calloc((size_t)nrounds + 1, sizeof *x->sent);
  x->recvd = calloc((size_t)nrounds + 1, sizeof *x->recvd);
  if (!x->msgs || !x->peers || !x->round_starts || !x->sent || !x->recvd) return fail_read(path, r, "out of memory");
  if (fscanf(f, " p") != 0) return fail_read(path, r, "bad peer line");
  for (size_t i = 0; i < np; i++)
    if (fscanf(f, "%d", &x->peers[i].peer) != 1 || x->peers[i].peer < 0 || x->peers[i].peer >= R.world)
      return fail_read(path, r, "bad peer");
  if (read_msgs(f, path, r, 's', x->msgs, ns, nrounds) || read_msgs(f, path, r, 'r', x->msgs + ns, nr, nrounds))
    return -1;
  p->rank = r;
  p->size = R.world;
  p->nrounds = nrounds;
  p->sends = x->msgs, p->nsends = ns;
  p->recvs = x->msgs + ns, p->nrecvs = nr;
  p->send_round = round_starts(p->sends, ns, nrounds, x->round_starts);
  p->recv_round = round_starts(p->recvs, nr, nrounds, x->round_starts + nrounds + 1);
  p->max_round_msgs = mrm;
  p->peers = x->peers, p->npeers = np;
  p->nlocal_copies = nl;
  p->opts.flags = flags;
  x->xfers = calloc(rs_sched_max_xfers(p, (flags & RESHARD_FLAG_VERIFY) != 0), sizeof *x->xfers);
  if (!x->xfers) return fail_read(path, r, "out of memory");
  R.messages += ns;
  return 0;
}

static int read_stages(FILE *f, const char *path) {
  R.ranks = calloc((size_t)R.world, sizeof *R.ranks);
  if (!R.ranks) return fail_read(path, -1, "out of memory");
  for (int r = 0; r < R.world; r++)
    if (!(R.ranks[r].stages = calloc((size_t)R.nstages, sizeof *R.ranks[r].stages)))
      return fail_read(path, r, "out of memory");
  for (int st = 0; st < R.nstages; st++) {
    int got = -1;
    if (fscanf(f, " stage %d", &got) != 1 || got != st) return fail_read(path, -1, "bad stage line");
    for (int r = 0; r < R.world; r++)
      if (read_rank(f, path, r, st)) return -1;
  }
  char end[8] = "";
  if (fscanf(f, " %7s", end) != 1 || strcmp(end, "end")) return fail_read(path, R.world, "no end line");
  return 0;
}

static int read_schedule(const char *path) {
  FILE *f = fopen(path, "r");
  if (!f) {
    perror(path);
    return -1;
  }
  int v = 0, rc;
  if (fscanf(f, "reshard-replay %d world %d stages %d", &v, &R.world, &R.nstages) != 3 || v != 3 || R.world <= 0 ||
      R.nstages < 1 || R.nstages > RP_MAX_STAGES) {
    fprintf(stderr, "reshard_replay: error: %s: not a version 3 schedule (reshard_plan --replay-out)\n", path);
    fclose(f);
    return -1;
  }
  rc = read_stages(f, path);
  fclose(f);
  return rc;
}

/* ---- the executor's operations ---- */

/* Completes a list's comms; a failed one fails the rank's walk. */
static reshard_result_t wait_list(int rank, comm_list *l, const char *what, int k) {
  for (size_t i = 0; i < l->n; i++) {
    if (!l->c[i]) continue;
    sg_error_t e = sg_comm_wait(l->c[i]);
    l->c[i] = NULL;
    if (e != SG_OK)
      return rs_error(RESHARD_ERROR_BACKEND, "replay rank %d round %d: %s failed (SimGrid error %d)", rank, k, what,
                      (int)e);
  }
  free(l->c);
  l->c = NULL;
  l->n = 0;
  return RESHARD_SUCCESS;
}

/* A data message's bytes with its --msg-us padding. */
static uint64_t padded(int from, int to, uint64_t bytes) {
  if (R.msg_s <= 0) return bytes;
  return bytes + (uint64_t)(R.msg_s * sg_host_get_route_bandwidth(R.hosts[from], R.hosts[to]));
}

static sg_comm_t post_send(int stage, int from, int to, char kind, uint64_t bytes) {
  sg_comm_t c = sg_mailbox_put_async(mailbox(kind, stage, from, to), &payload, (long)bytes);
  if ((long)bytes >= R.detach_below) return c;
  /* an eager send: done for the sender at once; its comm is completed
   * after the rank's end time is taken (the same for the simulated time
   * as detaching it, and nothing is left in flight at the end) */
  replay_rank *x = &R.ranks[from];
  if (x->eager.n == x->eager_cap) {
    size_t cap = x->eager_cap ? 2 * x->eager_cap : 64;
    sg_comm_t *c2 = realloc(x->eager.c, cap * sizeof *c2);
    if (!c2) {
      sg_comm_wait(c); /* no room: wait for it now rather than lose it */
      return NULL;
    }
    x->eager.c = c2, x->eager_cap = cap;
  }
  x->eager.c[x->eager.n++] = c;
  return NULL;
}

/* A receive's payload pointer lands in the receiving rank's sink (it
 * must outlive the comm; nothing reads it). */
static sg_comm_t post_recv(int stage, int from, int to, char kind) {
  return sg_mailbox_get_async(mailbox(kind, stage, from, to), &R.ranks[to].sink);
}

/* The agreement: headers both ways, posted; checked later (replay_check). */
static reshard_result_t run_agree(replay_plan *x) {
  const reshard_plan_t *p = &x->plan;
  size_t n = p->npeers;
  x->hdr_in = (comm_list){calloc(n + 1, sizeof(sg_comm_t)), n};
  x->hdr_out = (comm_list){calloc(n + 1, sizeof(sg_comm_t)), n};
  x->agree_in = (comm_list){calloc(n + 1, sizeof(sg_comm_t)), n};
  x->agree_out = (comm_list){calloc(n + 1, sizeof(sg_comm_t)), n};
  if (!x->hdr_in.c || !x->hdr_out.c || !x->agree_in.c || !x->agree_out.c)
    return rs_error(RESHARD_ERROR_OUT_OF_MEMORY, "replay: agreement");
  for (size_t i = 0; i < n; i++) x->hdr_in.c[i] = post_recv(x->stage, p->peers[i].peer, p->rank, 'a');
  for (size_t i = 0; i < n; i++) x->hdr_out.c[i] = post_send(x->stage, p->rank, p->peers[i].peer, 'a', HDR_BYTES);
  return RESHARD_SUCCESS;
}

/* The agreement's check: the headers waited, the status words posted. */
static reshard_result_t replay_check(replay_plan *x) {
  const reshard_plan_t *p = &x->plan;
  if (x->checked) return RESHARD_SUCCESS;
  x->checked = 1;
  RS_CHECK(wait_list(p->rank, &x->hdr_in, "agreement header receive", -1));
  RS_CHECK(wait_list(p->rank, &x->hdr_out, "agreement header send", -1));
  for (size_t i = 0; i < p->npeers; i++) x->agree_in.c[i] = post_recv(x->stage, p->peers[i].peer, p->rank, 'a');
  for (size_t i = 0; i < p->npeers; i++)
    x->agree_out.c[i] = post_send(x->stage, p->rank, p->peers[i].peer, 'a', STATUS_BYTES);
  return RESHARD_SUCCESS;
}

/* One receive transfer of round k, or what of it may be posted before
 * the check (early), as post_recv in src/exec/execute.c: a split message
 * (rs_sched_head_bytes) is two receives, its head posted early; a direct
 * message's tail waits for the check (returns 1: the rest is posted
 * later); anything else lands in staging and is posted at once. */
static int replay_recv(replay_plan *x, const rs_xfer *t, int early, int head_posted, comm_list *r) {
  const reshard_plan_t *p = &x->plan;
  if (!t->sums && rs_sched_head_bytes(t->m) && !head_posted) {
    r->c[r->n++] = post_recv(x->stage, t->m->peer, p->rank, 'd');
    if (early && t->m->direct) return 1;
  }
  r->c[r->n++] = post_recv(x->stage, t->m->peer, p->rank, 'd');
  return 0;
}

/* Round k's transfers of `part` (XFER: all but the forwards; FXFER: the
 * forwards) in the schedule's posting order, as post_round in
 * src/exec/execute.c: before the check, receives land in staging; a
 * split direct message's tail, and every later receive from its sender,
 * waits for the check, which runs after the round's sends. */
static reshard_result_t run_xfer(replay_plan *x, int k, rs_xfer_part part) {
  const reshard_plan_t *p = &x->plan;
  const int verify = (p->opts.flags & RESHARD_FLAG_VERIFY) != 0;
  /* (room for the whole round, allocated by its first part, XFER: each
   * transfer at most two, a split message's head and tail) */
  size_t first, all = rs_sched_round_msgs(p, k, 0, &first) + rs_sched_round_msgs(p, k, 1, &first);
  all *= verify ? 2 : 1;
  comm_list *s = &x->sent[k], *r = &x->recvd[k];
  if (!s->c) s->c = calloc(2 * all + 1, sizeof(sg_comm_t));
  if (!r->c) r->c = calloc(2 * all + 1, sizeof(sg_comm_t));
  size_t n = rs_sched_xfers(p, k, verify, part, x->xfers);
  const int early = !x->checked;
  /* per transfer: 0 posted, 1 its tail waits, 2 all of it waits; per rank: blocked */
  unsigned char *defer = early ? calloc(n + 1, 1) : NULL, *blocked = early ? calloc((size_t)R.world, 1) : NULL;
  if (!s->c || !r->c || (early && (!defer || !blocked))) {
    free(defer);
    free(blocked);
    return rs_error(RESHARD_ERROR_OUT_OF_MEMORY, "replay rank %d round %d", p->rank, k);
  }
  int any = 0;
  for (size_t i = 0; i < n; i++) {
    const rs_xfer *t = &x->xfers[i];
    if (!t->recv) {
      /* verify mode: each message's box sums follow it, 8 bytes a copy */
      uint64_t bytes = t->sums ? (uint64_t)t->m->ncopies * sizeof(uint64_t) : t->m->bytes;
      uint64_t head = t->sums ? 0 : rs_sched_head_bytes(t->m);
      if (head) s->c[s->n++] = post_send(x->stage, p->rank, t->m->peer, 'd', padded(p->rank, t->m->peer, head));
      s->c[s->n++] = post_send(x->stage, p->rank, t->m->peer, 'd', padded(p->rank, t->m->peer, bytes - head));
    } else if (early && blocked[t->m->peer]) {
      defer[i] = 2;
    } else if (replay_recv(x, t, early, 0, r)) {
      defer[i] = 1;
      blocked[t->m->peer] = 1;
    }
    any |= early && defer[i];
  }
  if (any) {
    reshard_result_t rc = replay_check(x);
    for (size_t i = 0; i < n && rc == RESHARD_SUCCESS; i++)
      if (defer[i]) replay_recv(x, &x->xfers[i], 0, defer[i] == 1, r);
    if (rc != RESHARD_SUCCESS) {
      free(defer);
      free(blocked);
      return rc;
    }
  }
  free(defer);
  free(blocked);
  return RESHARD_SUCCESS;
}

static reshard_result_t replay_wait(void *ctx, rs_step step, rs_dep dep) {
  (void)step;
  replay_plan *x = ctx;
  const int me = x->plan.rank;
  /* (FXFER k's transfers join XFER k's lists) */
  if (dep.on.kind != RS_STEP_XFER && dep.on.kind != RS_STEP_FXFER) return RESHARD_SUCCESS; /* done when run: free */
  if (dep.need == RS_NEED_RECEIVED) return wait_list(me, &x->recvd[dep.on.round], "receive", dep.on.round);
  for (; x->sent_upto <= dep.on.round; x->sent_upto++)
    RS_CHECK(wait_list(me, &x->sent[x->sent_upto], "send", x->sent_upto));
  return RESHARD_SUCCESS;
}

static reshard_result_t replay_run(void *ctx, rs_step step) {
  replay_plan *x = ctx;
  switch (step.kind) {
  case RS_STEP_AGREE:
    return run_agree(x);
  case RS_STEP_XFER:
    if (R.progress && x->plan.rank == 0 && step.round % 16 == 0) /* where a long run is */
      fprintf(stderr, "# replay progress: rank 0 stage %d round %d of %d: simulated_s=%.6f wall_s=%.1f\n", x->stage,
              step.round, x->plan.nrounds, simgrid_get_clock(), wall_now() - R.t0);
    return run_xfer(x, step.round, RS_XFER_PLAIN);
  case RS_STEP_FXFER:
    return run_xfer(x, step.round, RS_XFER_FWD);
  case RS_STEP_CHECK: /* the walk's end: the agreement's statuses (rs_agree_end) */
    RS_CHECK(wait_list(x->plan.rank, &x->agree_in, "agreement status receive", -1));
    return wait_list(x->plan.rank, &x->agree_out, "agreement status send", -1);
  case RS_STEP_LOCAL: /* nothing lands before the check (host_check) */
  case RS_STEP_UNPACK:
    return replay_check(x);
  case RS_STEP_PACK:
  case RS_STEP_FPACK:
    break;
  }
  return RESHARD_SUCCESS;
}

static const rs_sched_ops replay_ops = {replay_wait, replay_run};

/* A rank's call: its stages' plans one after the other. */
static void rank_actor(int argc, char **argv) {
  (void)argc, (void)argv;
  replay_rank *x = sg_actor_self_get_data();
  for (int st = 0; st < R.nstages && !x->failed; st++) {
    replay_plan *sp = &x->stages[st];
    reshard_result_t r = rs_sched_run(&sp->plan, &replay_ops, sp);
    if (r != RESHARD_SUCCESS) {
      fprintf(stderr, "reshard_replay: rank %d stage %d: %s: %s\n", sp->plan.rank, st, reshard_result_string(r),
              reshard_last_error());
      x->failed = 1;
    }
  }
  x->end_s = simgrid_get_clock();
  if (wait_list((int)(x - R.ranks), &x->eager, "eager send", -1) != RESHARD_SUCCESS) x->failed = 1;
  x->done = 1;
}

/* ---- the run ---- */

static void wall_limit_hit(int sig) {
  (void)sig;
  static const char msg[] = "reshard_replay: error: the wall-clock limit (--wall-limit) passed; simulation abandoned\n";
  ssize_t w = write(2, msg, sizeof msg - 1);
  (void)w;
  _exit(3);
}

static double wall_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int usage(void) {
  fprintf(stderr, "usage: reshard_replay SCHEDULE PLATFORM.xml [--wall-limit S] [--detach-below BYTES] "
                  "[--msg-us US] [--progress] [--cfg=simgrid/option:value ...]\n");
  return 2;
}

static int start_actors(void) {
  R.hosts = calloc((size_t)R.world + 1, sizeof *R.hosts);
  if (!R.hosts) return -1;
  for (int r = 0; r < R.world; r++) {
    char name[32];
    snprintf(name, sizeof name, "h%d", r);
    sg_host_t h = R.hosts[r] = sg_host_by_name(name);
    if (!h) {
      fprintf(stderr, "reshard_replay: error: the platform has no host %s (%d ranks)\n", name, R.world);
      return -1;
    }
    sg_actor_t a = sg_actor_init(name, h);
    sg_actor_set_data(a, &R.ranks[r]);
    sg_actor_start(a, rank_actor, 0, NULL);
  }
  return 0;
}

int main(int argc, char **argv) {
  double t0 = R.t0 = wall_now();
  simgrid_init(&argc, argv); /* takes the --cfg= and --log= arguments out */
  const char *paths[2] = {NULL, NULL};
  int npaths = 0;
  long wall_limit = 1800;
  R.detach_below = 65536;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--wall-limit") && i + 1 < argc) wall_limit = strtol(argv[++i], NULL, 10);
    else if (!strcmp(argv[i], "--detach-below") && i + 1 < argc) R.detach_below = strtol(argv[++i], NULL, 10);
    else if (!strcmp(argv[i], "--msg-us") && i + 1 < argc) R.msg_s = strtod(argv[++i], NULL) * 1e-6;
    else if (!strcmp(argv[i], "--progress")) R.progress = 1;
    else if (argv[i][0] != '-' && npaths < 2) paths[npaths++] = argv[i];
    else return usage();
  }
  if (npaths != 2 || wall_limit <= 0 || R.detach_below < 0 || R.msg_s < 0) return usage();
  signal(SIGALRM, wall_limit_hit);
  alarm((unsigned)wall_limit);
  if (read_schedule(paths[0])) return 1;
  simgrid_load_platform(paths[1]);
  if (start_actors()) return 1;
  simgrid_run();
  double end = 0;
  int bad = 0;
  for (int r = 0; r < R.world; r++) {
    if (!R.ranks[r].done || R.ranks[r].failed) {
      if (!bad) fprintf(stderr, "reshard_replay: error: rank %d %s\n", r, R.ranks[r].done ? "failed" : "never finished its walk");
      bad = 1;
    }
    if (R.ranks[r].end_s > end) end = R.ranks[r].end_s;
  }
  if (bad) return 1;
  printf("# replay: simulated_s=%.9f ranks=%d messages=%zu stages=%d wall_s=%.1f\n", end, R.world, R.messages, R.nstages,
         wall_now() - t0);
  return 0;
}
