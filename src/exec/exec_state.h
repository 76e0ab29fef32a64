/* What the host executor shares between its files: the per-call state of
 * a plan (failure, versions, double-buffer copy), the per-execute
 * agreement, and verify-mode checksums.
 *
 * The plan is const in execute, and calls of one plan run one at a time
 * (plan.h: busy); per-call state lives in plan fields touched through
 * atomics, since reshard_plan_get_status and destroy read them from other
 * threads. */
#ifndef RS_EXEC_EXEC_STATE_H
#define RS_EXEC_EXEC_STATE_H

#include <stdint.h>

#include "common/blame.h"
#include "kernels/rs_agree.h"
#include "plan/plan.h"

/* Tags. Bits 32-47 name the plan (tag_base), bits 48-62 the execute call
 * (data messages), bits 0-31 the round; bit 63 marks the per-execute
 * control messages, whose tag has no call number, so that headers of
 * mismatched calls still meet and can be compared. Bit 31 of the round
 * marks a verify-mode checksum message; bits 30 and 29 a registered
 * execute's tokens (exec/execute.c, direct_round). Control tag 4 (and 5)
 * carries a host registration's exchange (exec/register.c). */
#define RS_TAG_CONTROL ((uint64_t)1 << 63)
#define RS_TAG_EPOCH_MASK 0x7fffu
#define RS_TAG_VERIFY ((uint64_t)1 << 31)
#define RS_TAG_READY ((uint64_t)1 << 30)
#define RS_TAG_DONE ((uint64_t)1 << 29)
enum { RS_CTL_HEADER = 1, RS_CTL_STATUS = 2, RS_CTL_REGISTER = 4 };

/* ---- doubt.c ---- */

/* The host commit's vote: the words both executors vote
 * (kernels/rs_agree.h), then the failing rank and its reason
 * (common/blame.h), so that the others' REMOTE names them. */
#define RS_HOST_COMMIT_WORDS (RS_COMMIT_WORDS + RS_BLAME_WORDS)

/* The error of a commit whose reduced vote v (RS_HOST_COMMIT_WORDS) did
 * not commit `version`
 * at `call` (outcome RS_COMMIT_FAILED: REMOTE; RS_COMMIT_APART:
 * MISMATCH), saying what the active copy still holds; `lead` starts the
 * message. For the commit and for a version settled back. */
reshard_result_t rs_commit_refusal(const reshard_plan_t *p, const uint64_t *v, uint64_t call, uint64_t version,
                                   int outcome, const char *lead);

/* A double-buffered call whose commit vote this rank cast for success
 * and whose collective passed its deadline, still pending as `ticket`
 * (rs_transport_ops.allreduce_late): records the version in doubt, held
 * by `copy`. Caller holds the plan's busy flag. Returns RESHARD_ERROR_IN_DOUBT with
 * the story. */
reshard_result_t rs_plan_doubt(const reshard_plan_t *p, uint64_t ticket, uint64_t call, uint64_t version,
                               int copy);

/* Settles the version in doubt, if any, from its collective's result,
 * waiting for it until the deadline: rolls forward (the plan stays
 * usable) or back (the plan is failed, as on the other ranks); both are
 * RESHARD_SUCCESS. RESHARD_ERROR_IN_DOUBT if the result has not come.
 * Caller holds the plan's busy flag. */
reshard_result_t rs_plan_settle(const reshard_plan_t *p, int64_t deadline);

/* ---- execute.c ---- */

/* The plan's staging (rs_staging_bytes), allocated on first use and kept
 * for its calls (a registered plan's send halves are registered: the
 * same block for every call); NULL when out of memory or none needed. */
unsigned char *rs_host_staging(const reshard_plan_t *plan);

/* ---- state.c ---- */

/* Results that leave the plan failed (messages in flight, partners out of
 * step): TIMEOUT, REMOTE, MISMATCH and BACKEND. */
int rs_result_fails_plan(reshard_result_t r);

/* reshard_plan_register_buffers on a plan whose transport maps no peer
 * memory: UNSUPPORTED, naming the transport (both executors say it). */
reshard_result_t rs_register_unsupported(const reshard_plan_t *p);

/* Records the first failure (later ones are ignored). why: the detail. */
void rs_plan_mark_failed(const reshard_plan_t *p, uint64_t call,
                         uint64_t version, reshard_result_t r,
                         const char *why);

/* The plan's one failure record, for both executors (the device
 * executor's poll writes it too): the first failure's result, or
 * RESHARD_SUCCESS. */
reshard_result_t rs_plan_failed(const reshard_plan_t *p);

/* RESHARD_ERROR_INVALID_USAGE with the first failure's story if the plan
 * failed, RESHARD_SUCCESS otherwise. op: the refused call ("execute",
 * "register_buffers"), for the message. */
reshard_result_t rs_plan_refuse_if_failed(const reshard_plan_t *p, const char *op);

/* A successful execute of `version`. */
void rs_plan_record_success(const reshard_plan_t *p, uint64_t version);

/* Numbers a call, for both executors: its call number (0 for the
 * plan's first; every call that reaches its partners takes one, so the
 * numbers in the agreement headers match across ranks) and its version
 * (the explicit one, or the previous call's + 1). Called once per call,
 * in call order (calls of a plan do not overlap). */
void rs_plan_take_call(const reshard_plan_t *p, int explicit_version,
                       uint64_t version_in, uint64_t *call,
                       uint64_t *version);

/* A kept plan after a newcomer's creation of it (reshard_plan_rejoin):
 * agreed = the maxima over every rank of the execute count, the last
 * version and the committed version (plan/rejoin.c). A version in doubt
 * here rolls forward if another rank committed it (every vote was then a
 * success: this rank's other copy holds it whole) and back otherwise;
 * the failure the replaced rank's death left is cleared; the call count
 * and last version become the agreed ones, as on the newcomer's plan, so
 * that the next execute's headers match everywhere. The active copy is
 * untouched unless rolled forward. Caller holds the plan's busy flag. */
void rs_plan_rejoin_state(const reshard_plan_t *p, const uint64_t agreed[3]);

/* ---- agree.c ---- */

/* The per-execute agreement with every partner (ranks this one sends to
 * or receives from). Host transports only. */
typedef struct rs_agree rs_agree;

/* Posts the header exchange with every partner: {magic, digest, call,
 * version, abort} sent, theirs received. abort (0: none) is this rank's
 * own rejection of the call (its arguments, its memory), sent with the
 * first words of reshard_last_error() in the header. Returns at once; a
 * failure to post is the call's result. *out (NULL without partners)
 * must be passed to rs_agree_end, whatever the result. */
reshard_result_t rs_agree_post(const reshard_plan_t *p, uint64_t call,
                               uint64_t version, reshard_result_t abort,
                               rs_agree **out);

/* Waits for the partners' headers and compares them
 * (RESHARD_ERROR_MISMATCH naming both ranks; RESHARD_ERROR_REMOTE naming
 * a partner that rejected the call; abort if this rank did), then posts
 * the status exchange: this rank's result goes to every partner, and
 * theirs are received while the data moves. Runs once: later calls
 * return its result. NULL: success. */
reshard_result_t rs_agree_check(rs_agree *a, int64_t deadline);

/* rs_agree_post, then rs_agree_check: the whole exchange before anything
 * else (a rejected call, which sends no data). */
reshard_result_t rs_agree_begin(const reshard_plan_t *p, uint64_t call,
                                uint64_t version, int64_t deadline,
                                reshard_result_t abort, rs_agree **out);

/* Whether the headers were exchanged with every partner (so a rejection
 * they carried reached them); 0 for NULL. */
int rs_agree_sent(const rs_agree *a);

/* Whether rs_agree_check ran; 1 for NULL (nothing to check). */
int rs_agree_checked(const rs_agree *a);

/* Never blocks: RESHARD_ERROR_REMOTE if a partner's status arrived saying
 * it failed its agreement. NULL: success. */
reshard_result_t rs_agree_poll(rs_agree *a);

/* Runs the check if the call failed before it, then completes the status
 * exchange when r (the call's result so far) is success:
 * RESHARD_ERROR_REMOTE if a partner failed. Then cancels what is left and
 * frees a. Returns the call's result. */
reshard_result_t rs_agree_end(rs_agree *a, reshard_result_t r,
                              int64_t deadline);

/* ---- verdict.c: the messages of verdicts, for both executors ---- */

/* A partner's header (got) differs from this rank's (want): MISMATCH,
 * saying whether it runs another plan (magic or digest) or another
 * execute (call or version), naming rank `peer`; `then` ("" or "; ..."):
 * what the executor did about the call's writes. */
reshard_result_t rs_verdict_header(const reshard_plan_t *p, int peer, const rs_dev_hdr *got, const rs_dev_hdr *want,
                                   const char *then);

/* A box's checksum here differs from the source's: MISMATCH naming the
 * tensor, the box (v; NULL: unknown) and the rank it was received from
 * (received) or copied on. when ("" or "at call N ...: "): the call, where
 * the executor learns of it later; then: as above. */
reshard_result_t rs_verdict_verify(const reshard_plan_t *p, const char *when, const rs_vbox *v, int received, int peer,
                                   uint64_t here, uint64_t there, const char *then);

/* ---- verify.c ---- */

/* The position-keyed checksum of the elements of copy c on one side
 * (dst_side: the destination side, else the source side) with that
 * side's buffer at base: the sum mod 2^64 over the box of
 * mix(tensor, global linear index, element bytes). */
uint64_t rs_box_sum(const rs_copy *c, int dst_side, const void *base,
                    const rs_vbox *v, const rs_vtensor *t);

/* "[s0, s1) x [..)" of a box, for messages. */
void rs_vbox_format(const rs_vbox *v, char *buf, size_t n);

#endif
