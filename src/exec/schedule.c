/* The schedule of one execute (see schedule.h): the steps in walk order,
 * their dependencies, and the posting order of a round's transfers. */
#include "exec/schedule.h"

static rs_step step_of(rs_step_kind kind, int round) {
  static const rs_lane lane[] = {[RS_STEP_AGREE] = RS_LANE_XFER,    [RS_STEP_PACK] = RS_LANE_PACK,
                                 [RS_STEP_LOCAL] = RS_LANE_PACK,    [RS_STEP_XFER] = RS_LANE_XFER,
                                 [RS_STEP_UNPACK] = RS_LANE_UNPACK, [RS_STEP_CHECK] = RS_LANE_XFER,
                                 [RS_STEP_FPACK] = RS_LANE_PACK,    [RS_STEP_FXFER] = RS_LANE_XFER};
  rs_step s = {kind, lane[kind], round};
  return s;
}

size_t rs_sched_round_msgs(const reshard_plan_t *p, int k, int recv, size_t *first) {
  const rs_msg *m = recv ? p->recvs : p->sends;
  size_t n = recv ? p->nrecvs : p->nsends;
  const size_t *start = recv ? p->recv_round : p->send_round;
  *first = 0;
  /* a direction's round array covers its own rounds only (its last
   * message's round + 1), which may be fewer than the plan's */
  if (k < 0 || !n || k > m[n - 1].round) return 0;
  *first = start[k];
  return start[k + 1] - start[k];
}

int rs_sched_forwards(const reshard_plan_t *p, int k) {
  /* (a round's forwards are its last messages in each direction) */
  for (int recv = 0; recv < 2; recv++) {
    size_t first, n = rs_sched_round_msgs(p, k, recv, &first);
    if (n && (recv ? p->recvs : p->sends)[first + n - 1].fwd) return 1;
  }
  return 0;
}

int rs_sched_deps(const reshard_plan_t *p, rs_step s, rs_dep *deps) {
  int n = 0, k = s.round, last = p->nrounds - 1;
  switch (s.kind) {
  case RS_STEP_AGREE:
    break;
  case RS_STEP_PACK:
    if (k >= 2) deps[n++] = (rs_dep){step_of(RS_STEP_XFER, k - 2), RS_NEED_SENT};
    if (k >= 2 && rs_sched_forwards(p, k - 2)) deps[n++] = (rs_dep){step_of(RS_STEP_FXFER, k - 2), RS_NEED_SENT};
    break;
  case RS_STEP_LOCAL:
    deps[n++] = (rs_dep){step_of(RS_STEP_AGREE, -1), RS_NEED_DONE};
    break;
  case RS_STEP_XFER:
    deps[n++] = (rs_dep){step_of(RS_STEP_PACK, k), RS_NEED_DONE};
    if (k == 0) deps[n++] = (rs_dep){step_of(RS_STEP_AGREE, -1), RS_NEED_DONE};
    if (k >= 2) deps[n++] = (rs_dep){step_of(RS_STEP_UNPACK, k - 2), RS_NEED_DONE};
    break;
  case RS_STEP_UNPACK:
    deps[n++] = (rs_dep){step_of(RS_STEP_XFER, k), RS_NEED_RECEIVED};
    if (rs_sched_forwards(p, k)) deps[n++] = (rs_dep){step_of(RS_STEP_FXFER, k), RS_NEED_RECEIVED};
    break;
  case RS_STEP_FPACK:
    deps[n++] = k >= 1 ? (rs_dep){step_of(RS_STEP_UNPACK, k - 1), RS_NEED_DONE}
                       : (rs_dep){step_of(RS_STEP_LOCAL, -1), RS_NEED_DONE};
    break;
  case RS_STEP_FXFER:
    deps[n++] = (rs_dep){step_of(RS_STEP_FPACK, k), RS_NEED_DONE};
    break;
  case RS_STEP_CHECK:
    /* the pack lane ends with FPACK n-1, PACK n-1, or LOCAL (after PACK 0) */
    if (last >= 0 && rs_sched_forwards(p, last)) deps[n++] = (rs_dep){step_of(RS_STEP_FPACK, last), RS_NEED_DONE};
    else
      deps[n++] = last >= 1 ? (rs_dep){step_of(RS_STEP_PACK, last), RS_NEED_DONE}
                            : (rs_dep){step_of(RS_STEP_LOCAL, -1), RS_NEED_DONE};
    if (last >= 0) {
      deps[n++] = (rs_dep){step_of(RS_STEP_UNPACK, last), RS_NEED_DONE};
      deps[n++] = (rs_dep){step_of(RS_STEP_XFER, last), RS_NEED_SENT};
      if (rs_sched_forwards(p, last)) deps[n++] = (rs_dep){step_of(RS_STEP_FXFER, last), RS_NEED_SENT};
    }
    break;
  }
  return n;
}

/* A step: its waits, then its run. */
static reshard_result_t one(const reshard_plan_t *p, const rs_sched_ops *ops, void *ctx, rs_step s) {
  rs_dep deps[RS_SCHED_MAXDEP];
  int n = rs_sched_deps(p, s, deps);
  for (int i = 0; i < n; i++) RS_CHECK(ops->wait(ctx, s, deps[i]));
  return ops->run(ctx, s);
}

reshard_result_t rs_sched_run(const reshard_plan_t *p, const rs_sched_ops *ops, void *ctx) {
  RS_CHECK(one(p, ops, ctx, step_of(RS_STEP_AGREE, -1)));
  for (int k = 0; k < p->nrounds; k++) {
    RS_CHECK(one(p, ops, ctx, step_of(RS_STEP_PACK, k)));
    RS_CHECK(one(p, ops, ctx, step_of(RS_STEP_XFER, k)));
    if (k == 0) RS_CHECK(one(p, ops, ctx, step_of(RS_STEP_LOCAL, -1)));
    else RS_CHECK(one(p, ops, ctx, step_of(RS_STEP_UNPACK, k - 1)));
    if (rs_sched_forwards(p, k)) {
      RS_CHECK(one(p, ops, ctx, step_of(RS_STEP_FPACK, k)));
      RS_CHECK(one(p, ops, ctx, step_of(RS_STEP_FXFER, k)));
    }
  }
  if (p->nrounds == 0) RS_CHECK(one(p, ops, ctx, step_of(RS_STEP_LOCAL, -1)));
  else RS_CHECK(one(p, ops, ctx, step_of(RS_STEP_UNPACK, p->nrounds - 1)));
  return one(p, ops, ctx, step_of(RS_STEP_CHECK, -1));
}

uint64_t rs_sched_head_bytes(const rs_msg *m) {
  const uint64_t split_min = (uint64_t)16 << 10, head_max = (uint64_t)64 << 10;
  if (m->round != 0 || m->bytes < split_min) return 0;
  uint64_t h = (m->bytes / 8) & ~(uint64_t)63; /* (the copy loops like 64-byte alignment) */
  return h < head_max ? h : head_max;
}

size_t rs_sched_max_xfers(const reshard_plan_t *p, int verify) {
  return (p->max_round_msgs ? p->max_round_msgs : 1) * (verify ? 2 : 1);
}

size_t rs_sched_xfers(const reshard_plan_t *p, int k, int verify, rs_xfer_part part, rs_xfer *out) {
  size_t n = 0;
  for (int recv = 1; recv >= 0; recv--) {
    size_t first, cnt = rs_sched_round_msgs(p, k, recv, &first);
    /* (indexed only when there are messages: a direction without any
     * may have no array at all) */
    for (size_t i = first; i < first + cnt; i++) {
      const rs_msg *m = recv ? &p->recvs[i] : &p->sends[i];
      if (part != RS_XFER_ALL && (int)(m->fwd != 0) != (part == RS_XFER_FWD)) continue;
      out[n++] = (rs_xfer){m, (unsigned char)recv, 0};
      if (verify) out[n++] = (rs_xfer){m, (unsigned char)recv, 1};
    }
  }
  return n;
}
