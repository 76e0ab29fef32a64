/* The schedule of one execute: what runs, in which order, and what waits
 * for what. It is written once and driven by both executors, which differ
 * only in how they run a step and how they wait:
 *
 *   - the host executor (src/exec/execute.c) runs each step when the
 *     walk reaches it; a step is done when its run returns, except a
 *     transfer, whose requests complete later: waiting for a transfer
 *     completes its sends (and those of the rounds before it), and an
 *     unpack waits for each of its receives as it unpacks it;
 *   - the device executor (src/device/execute.c) enqueues each
 *     step on its lane's stream and records an event behind it; waiting
 *     for a step on another lane is a stream wait on that event.
 *
 * Three lanes: pack (packs, local copies), transfer (agreement, the
 * rounds' transfers, the checks after the last write) and unpack. Within
 * a lane steps run in walk order, and waiting for a step waits for every
 * earlier step of its lane (a stream does that by itself; the host
 * completes its transfers in round order).
 *
 * The steps, in walk order (n = plan->nrounds):
 *
 *   AGREE, PACK 0, XFER 0, LOCAL, [FPACK 0, FXFER 0,] PACK 1, XFER 1,
 *   UNPACK 0, [FPACK 1, FXFER 1,] ..., PACK k, XFER k, UNPACK k-1,
 *   [FPACK k, FXFER k,] ..., UNPACK n-1, CHECK
 *
 * (AGREE, LOCAL, CHECK when n = 0; FPACK k and FXFER k where round k has
 * relay forwards, rs_msg.fwd, to send or to receive). A round's forwards
 * travel apart from its other messages: XFER k posts the others, and
 * FXFER k, once round k-1 is unpacked, the forwards, which leave the
 * round after the one that brought their data (plan/chunk.c). The rest of
 * the round does not wait for that unpack (posting the whole round after
 * it stalls the network streams into a relay member: diary "Forwards one
 * round after their data"). The dependencies:
 *
 *   PACK k    after XFER k-2 and FXFER k-2 have sent (send half k mod 2
 *             is free again)
 *   LOCAL     after AGREE (a failed agreement writes nothing)
 *   XFER k    after PACK k, after AGREE, and after UNPACK k-2 (receive
 *             half k mod 2 is free again)
 *   UNPACK k  after XFER k and FXFER k have received (hence after AGREE:
 *             its gate)
 *   FPACK k   after UNPACK k-1 (and after LOCAL, earlier on its lane),
 *             which wrote what the forwards read, into send half k mod 2
 *             beside PACK k's messages
 *   FXFER k   after FPACK k (and XFER k, earlier on its lane: a pair's
 *             forwards are posted after its other messages of the round
 *             at both ends, in the order of the messages, forwards last)
 *   CHECK     after every write of the call: the last step of the pack
 *             lane, UNPACK n-1, and XFER n-1 (and FXFER n-1) sent
 *
 * so packing round k+1, transferring round k and unpacking round k-1
 * overlap with two staging halves per direction, and local copies overlap
 * round 0. The walk order is one in which every step comes after what it
 * waits for, which is what lets the host run it as it goes.
 *
 * A round's transfers are posted in one order on both ends of every pair
 * (rs_sched_xfers): the receives, then the sends, each message followed by
 * its box sums in verify mode. Transports match messages of a pair in
 * posting order (NCCL: issue order), so both ends must agree on it. */
#ifndef RS_EXEC_SCHEDULE_H
#define RS_EXEC_SCHEDULE_H

#include <stddef.h>

#include "common/error.h"
#include "plan/plan.h"

typedef enum rs_lane { RS_LANE_PACK, RS_LANE_XFER, RS_LANE_UNPACK, RS_LANES } rs_lane;

typedef enum rs_step_kind {
  RS_STEP_AGREE,  /* the per-execute agreement with the partners */
  RS_STEP_PACK,   /* round k's sends into send half k mod 2 */
  RS_STEP_LOCAL,  /* the local copies */
  RS_STEP_XFER,   /* round k's transfers */
  RS_STEP_UNPACK, /* round k's receives out of receive half k mod 2 */
  RS_STEP_FPACK,  /* round k's forwards into send half k mod 2 */
  RS_STEP_FXFER,  /* round k's forward messages, both directions */
  RS_STEP_CHECK   /* after the last write: verify, commit, verdict */
} rs_step_kind;

typedef struct rs_step {
  rs_step_kind kind;
  rs_lane lane;
  int round; /* PACK, XFER, UNPACK, FPACK, FXFER; -1 otherwise */
} rs_step;

/* What a step needs of one it waits for. A transfer is done when it has
 * both sent and received; the other steps are done or not. */
typedef enum rs_need { RS_NEED_DONE, RS_NEED_SENT, RS_NEED_RECEIVED } rs_need;

typedef struct rs_dep {
  rs_step on;
  rs_need need;
} rs_dep;

/* Most dependencies a step has. */
#define RS_SCHED_MAXDEP 4

/* How an executor runs the schedule. wait: make `step` (about to run)
 * wait until `dep.on` (an earlier step, on any lane) did what `dep.need`
 * says; run: run or enqueue `step`. A failure of either ends the walk and
 * is its result. */
typedef struct rs_sched_ops {
  reshard_result_t (*wait)(void *ctx, rs_step step, rs_dep dep);
  reshard_result_t (*run)(void *ctx, rs_step step);
} rs_sched_ops;

/* Walks the plan's steps in order: for each, its waits, then its run. */
reshard_result_t rs_sched_run(const reshard_plan_t *p, const rs_sched_ops *ops, void *ctx);

/* The dependencies of `s` in plan p (at most RS_SCHED_MAXDEP), into
 * deps; returns how many. Same-lane dependencies are listed too (the
 * host needs its transfers' completions); an executor whose lanes are
 * ordered may skip them. */
int rs_sched_deps(const reshard_plan_t *p, rs_step s, rs_dep *deps);

/* One transfer of a round: message m (a receive or a send of p), or its
 * box sums (verify mode). */
typedef struct rs_xfer {
  const rs_msg *m;
  unsigned char recv, sums;
} rs_xfer;

/* Which of a round's messages: those XFER posts, those FXFER posts
 * (rs_msg.fwd), or all (registered buffers: the round is one step). */
typedef enum rs_xfer_part { RS_XFER_PLAIN, RS_XFER_FWD, RS_XFER_ALL } rs_xfer_part;

/* Round k's transfers of `part` in posting order, into out (room for
 * rs_sched_max_xfers); returns how many. */
size_t rs_sched_xfers(const reshard_plan_t *p, int k, int verify, rs_xfer_part part, rs_xfer *out);
size_t rs_sched_max_xfers(const reshard_plan_t *p, int verify);

/* Round 0's split on the host (exec/execute.c, post_recv): a round-0
 * message of 16 KiB or more travels as two messages, its first
 * rs_sched_head_bytes(m) bytes (an eighth, 64-byte aligned, at most
 * 64 KiB), which land in staging before the agreement's check, and the
 * rest; 0: one message. Both ends of a message compute it from its round
 * and size alone, so they always agree on it. */
uint64_t rs_sched_head_bytes(const rs_msg *m);

/* Whether round k has relay forwards (rs_msg.fwd) to send or receive:
 * whether the walk has FPACK k and FXFER k. */
int rs_sched_forwards(const reshard_plan_t *p, int k);

/* The messages of one direction in round k: [*first, *first + return). */
size_t rs_sched_round_msgs(const reshard_plan_t *p, int k, int recv, size_t *first);

#endif
