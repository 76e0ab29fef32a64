/* What the front door's files share (src/api/): one execute's arguments
 * as they travel from the public entry points (execute.c) through the
 * stages of a composite plan (stages.c) to one stage's call (call.c),
 * and the argument checks (argcheck.c). Nothing below src/api/ sees this
 * header. */
#ifndef RS_API_FRONT_H
#define RS_API_FRONT_H

#include <stddef.h>
#include <stdint.h>

#include "plan/plan.h"

/* One execute's arguments, in the buffer counts of the plan they are for
 * (the caller's, or a stage's). src_bytes / dst_bytes NULL when sizes are
 * unknown (RESHARD_EXECUTE_FLAG_UNSIZED); rejected: an error already found (and
 * set) that the call reports to its partners instead of moving anything,
 * or RESHARD_SUCCESS. */
typedef struct rs_call_args {
  int explicit_version;
  uint64_t version_in;
  void *const *src;
  size_t nsrc;
  const size_t *src_bytes;
  void *const *dst;
  size_t ndst;
  const size_t *dst_bytes;
  void *stream;
  reshard_result_t rejected;
} rs_call_args;

/* ---- execute.c ---- */
/* Takes the plan's busy flag for a call of it (`op`, for the message):
 * INVALID_USAGE when another call of the plan runs, or rs_plan_current's
 * (plan/planner.h). rs_api_leave gives
 * it back. */
reshard_result_t rs_api_enter(const reshard_plan_t *plan, const char *op);
void rs_api_leave(const reshard_plan_t *plan);

/* ---- call.c ---- */
/* One call of one plan (a plain plan, or one stage of a composite one):
 * refused at once if the plan failed earlier; otherwise the arguments
 * are checked (unless already rejected), a refusal goes to the
 * executor's refuse (which tells the partners) and an accepted call to
 * its execute; a result that fails the plan is recorded in the plan's
 * one failure record (exec/exec_state.h: rs_plan_mark_failed). */
reshard_result_t rs_api_call(const reshard_plan_t *plan, const rs_call_args *a);

/* ---- stages.c ---- */
/* An execute of a composite plan (plan->quant or plan->spread): its
 * pre-plan stage, this rank's local work between the stages (block
 * quantization on the host), then the main plan, each stage told of an
 * earlier one's failure. Arguments in the caller's buffer counts. */
reshard_result_t rs_api_run_stages(const reshard_plan_t *plan, const rs_call_args *a);
/* reshard_plan_register_buffers of a composite plan (quantizing,
 * spreading or both): every stage. */
reshard_result_t rs_api_register_stages(reshard_plan_t *plan, void *const *src, size_t nsrc, void *const *dst,
                                        size_t ndst);
/* The caller's source buffer count of a plan (composite plans append
 * their scratch after the caller's buffers). */
size_t rs_api_user_nsrc(const reshard_plan_t *plan);

/* ---- argcheck.c ---- */
/* Everything an execute checks of its arguments before anything moves
 * (NCCL's argcheck.cc is the model: every check in one place), each
 * failure naming the rank, the side, the buffer and its tensor. */
reshard_result_t rs_argcheck_execute(const reshard_plan_t *plan, const rs_call_args *a);
/* A sized execute's counts, before any entry is read: a count
 * the layout cannot have is refused (nsrc_user: the caller's source
 * count, rs_api_user_nsrc). */
reshard_result_t rs_argcheck_counts(const reshard_plan_t *plan, size_t nsrc_user, const void *src, size_t num_src,
                                    const void *dst, size_t num_dst);
/* A quantizing plan's inputs: the caller's source buffers its boxes read,
 * present and large enough (checked before anything is read, so a bad
 * call quantizes nothing). */
reshard_result_t rs_argcheck_quant_inputs(const reshard_plan_t *plan, const rs_call_args *a);
/* reshard_plan_register_buffers of a composite plan: the source count. */
reshard_result_t rs_argcheck_stages_register(const reshard_plan_t *plan, void *const *src, size_t nsrc,
                                             void *const *dst, size_t ndst);

#endif
