/* The per-execute agreement of device transports: the header every rank
 * sends each partner before an execute's data, and the check of the
 * headers it received. Like rs_tile.h, C11 and CUDA C++ at once: the check
 * kernel (kernels/copy_kernels.cu) and its CPU emulation in the tests run
 * this very code.
 *
 * The check is sticky: the first mismatch is recorded and `ok` stays 0, so
 * that the unpacks and local copies of that call and of every later one
 * (which read `ok` as their gate) write no destination byte; the host
 * reads the record when the call's check is done (src/device). */
#ifndef RS_KERNELS_RS_AGREE_H
#define RS_KERNELS_RS_AGREE_H

#include <stdint.h>

#include "kernels/rs_tile.h" /* RS_HD */

#define RS_DEV_HDR_MAGIC 0x3130524448445352ull /* "RSDHDR01" */

/* What the host header (src/exec/agree.c) carries and the device can
 * check: the plan, the call number and the weight version. */
typedef struct rs_dev_hdr {
  uint64_t magic, digest, call, version;
} rs_dev_hdr;

typedef struct rs_dev_agree {
  uint32_t ok;        /* 1 until a received header differs */
  uint32_t bad_index; /* then: which partner (index into the plan's peers) */
  rs_dev_hdr want;    /* this rank's header of that call */
  rs_dev_hdr got;     /* and the partner's */
  /* 1 until a transport's wait gives up (kernels/rs_ipc.h): the packs'
   * gate. A difference of headers closes ok only: this rank's partners
   * that agreed with it still get its current data, packed as usual, and
   * not stale staging (a gated pack would leave that in the half). */
  uint32_t staging_ok;
  uint32_t pad;
} rs_dev_agree;

/* How a partner's header compares with this rank's: the one comparison
 * of both executors (the host's header, src/exec/agree.c, starts with
 * these four words and adds a rejection and its message). */
enum { RS_HDR_SAME = 0, RS_HDR_OTHER_PLAN = 1, RS_HDR_OTHER_CALL = 2 };

RS_HD int rs_hdr_compare(const rs_dev_hdr *got, const rs_dev_hdr *want) {
  if (got->magic != want->magic || got->digest != want->digest) return RS_HDR_OTHER_PLAN;
  if (got->call != want->call || got->version != want->version) return RS_HDR_OTHER_CALL;
  return RS_HDR_SAME;
}

/* Compares the n received headers with this rank's; records the first
 * difference in *st unless one is recorded already. One thread. */
RS_HD void rs_dev_agree_check(const rs_dev_hdr *in, uint32_t n, const rs_dev_hdr *want, rs_dev_agree *st) {
  if (!st->ok) return;
  st->want = *want; /* the call a later transport failure belongs to */
  for (uint32_t i = 0; i < n; i++) {
    const rs_dev_hdr *h = &in[i];
    if (rs_hdr_compare(h, want) != RS_HDR_SAME) {
      st->bad_index = i;
      st->want = *want;
      st->got = *h;
      st->ok = 0;
      return;
    }
  }
}

/* Relay plans: a rank's data can reach it through forwards from ranks it
 * swaps no header with (a source two hops away), so their verdict is made
 * global: every rank exports !ok, the words are max-reduced over the
 * communicator, and a nonzero result closes every gate, recorded as a
 * failure elsewhere (bad_index RS_DEV_AGREE_ELSEWHERE, want: this rank's
 * header of the call). */
#define RS_DEV_AGREE_ELSEWHERE 0xffffffffu

/* A transport's wait on the device gave up (kernels/rs_ipc.h): bad_index
 * RS_DEV_AGREE_TRANSPORT, got.magic why (RS_IPC_*), got.digest the peer,
 * want: the header of the call last checked. */
#define RS_DEV_AGREE_TRANSPORT 0xfffffffeu

/* RESHARD_FLAG_VERIFY on the device found a box whose sums differ
 * (kernels/rs_verify.h): got.magic 0 for a received box, 1 for a local
 * copy; got.digest the descriptor; got.call this rank's sum, got.version
 * the other side's. */
#define RS_DEV_AGREE_VERIFY 0xfffffffdu

/* A plan run after another in one call (block quantization's: the
 * pre-plan gathering blocks split across source ranks, src/plan/quant.h)
 * inherits its failure: when the earlier plan's gate (prior) closed, this
 * plan's closes too, before its own agreement (bad_index
 * RS_DEV_AGREE_PRIOR, want: this call's header, got: the header of the
 * earlier plan's failed call), so nothing computed from its data is
 * written or committed. */
#define RS_DEV_AGREE_PRIOR 0xfffffffcu

/* The communicator was aborted (poisoned: a failed or timed-out call on
 * it) while this plan's work was pending: the host closed the gate before
 * the abort (src/transport/dev_comm.c rs_dev_comm_close_gates), so that the
 * launches behind the aborted transfers write nothing. */
#define RS_DEV_AGREE_POISONED 0xfffffffbu

/* The double-buffer commit's vote found the ranks at different calls
 * (rs_commit_outcome: a rank out of step that no partner's header
 * caught, one without partners): got.call and got.version the largest
 * call and version voted, got.digest and got.magic the smallest; want:
 * this rank's header of the call. Nothing is committed. */
#define RS_DEV_AGREE_APART 0xfffffffau

/* The commit's vote found a rank that failed the call (and this rank's
 * gate open: its partners agreed with it): nothing is committed, and this
 * rank fails too, as the host's commit does (want: this rank's header). */
#define RS_DEV_AGREE_NOCOMMIT 0xfffffff9u

RS_HD void rs_dev_agree_absorb(const rs_dev_agree *prior, const rs_dev_hdr *want, rs_dev_agree *st) {
  if (!st->ok || prior->ok) return;
  st->ok = 0;
  st->bad_index = RS_DEV_AGREE_PRIOR;
  st->want = *want;
  st->got = prior->want;
}

RS_HD void rs_dev_agree_export(const rs_dev_agree *st, uint64_t *word) { *word = st->ok ? 0 : 1; }

RS_HD void rs_dev_agree_import(const uint64_t *word, const rs_dev_hdr *want, rs_dev_agree *st) {
  if (!*word || !st->ok) return;
  st->ok = 0;
  st->bad_index = RS_DEV_AGREE_ELSEWHERE;
  st->want = *want;
  st->got = *want;
}

/* RESHARD_FLAG_DOUBLE_BUFFER: the commit's vote, the one of both
 * executors (the host's commit, src/exec/execute.c, and the device's
 * flip below). Every rank's RS_COMMIT_WORDS words are max-reduced over
 * the communicator: word 0 says whether some rank failed (its failure
 * code; 0: none), the others whether every rank is at the same call and
 * version (the max of each and of its complement give the largest and
 * the smallest): a rank out of step that no partner's header caught (one
 * without partners) makes the call commit nowhere. */
#define RS_COMMIT_WORDS 5
enum { RS_COMMIT_OK = 0, RS_COMMIT_FAILED = 1, RS_COMMIT_APART = 2 };

RS_HD void rs_commit_vote(uint64_t failure, uint64_t version, uint64_t call, uint64_t *v) {
  v[0] = failure;
  v[1] = version;
  v[2] = ~version;
  v[3] = call;
  v[4] = ~call;
}

/* The outcome of the reduced vote v for a rank at (version, call). */
RS_HD int rs_commit_outcome(const uint64_t *v, uint64_t version, uint64_t call) {
  if (v[0]) return RS_COMMIT_FAILED;
  if (v[1] != version || ~v[2] != version || v[3] != call || ~v[4] != call) return RS_COMMIT_APART;
  return RS_COMMIT_OK;
}

/* On the device: the commit record, in device memory, and the steps
 * around an execute. select writes the table every launch of the call
 * reads (src pointers, then the inactive copy's destination pointers:
 * copy 0 before the first commit); vote writes this rank's vote (its
 * gate closed: a failure); flip, after the reduction, makes the inactive
 * copy active, and the call's version the committed one, only when the
 * outcome is RS_COMMIT_OK and this rank's own gate is open (otherwise
 * the gate closes: RS_DEV_AGREE_APART, RS_DEV_AGREE_NOCOMMIT). */
typedef struct rs_dev_commit {
  int32_t active; /* the copy holding the committed version; -1: none yet */
  uint32_t pad;
  uint64_t version, call, commits;
} rs_dev_commit;

RS_HD void rs_dev_commit_select(void *const *tab, uint32_t nsrc, uint32_t ndst, const rs_dev_commit *c,
                                void **cur) {
  uint32_t inactive = c->active == 0 ? 1u : 0u;
  for (uint32_t i = 0; i < nsrc; i++) cur[i] = tab[i];
  for (uint32_t i = 0; i < ndst; i++) cur[nsrc + i] = tab[nsrc + inactive * ndst + i];
}

RS_HD void rs_dev_commit_vote(const rs_dev_agree *st, uint64_t version, uint64_t call, uint64_t *v) {
  rs_commit_vote(st->ok ? 0 : 1, version, call, v);
}

RS_HD void rs_dev_commit_flip(const uint64_t *v, rs_dev_agree *st, uint64_t version, uint64_t call,
                              rs_dev_commit *c) {
  const int outcome = rs_commit_outcome(v, version, call);
  if (outcome == RS_COMMIT_APART && st->ok) {
    st->bad_index = RS_DEV_AGREE_APART;
    st->got.call = v[3];
    st->got.version = v[1];
    st->got.digest = ~v[4];
    st->got.magic = ~v[2];
    st->ok = 0;
  } else if (outcome == RS_COMMIT_FAILED && st->ok) {
    st->bad_index = RS_DEV_AGREE_NOCOMMIT;
    st->ok = 0;
  }
  if (outcome != RS_COMMIT_OK || !st->ok) return;
  c->active = c->active == 0 ? 1 : 0;
  c->version = version;
  c->call = call;
  c->commits++;
}

#endif
