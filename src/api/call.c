/* One call of one plan, as the front door runs it for a plain plan and
 * for each stage of a composite one: the plan's earlier failure, the
 * argument checks (argcheck.c), then the plan's executor (plan/executor.h:
 * refuse for a rejected call, execute for an accepted one), and the plan's
 * one failure record for whatever the executor returns that fails the
 * plan. */
#include <stdio.h>

#include "api/front.h"
#include "common/error.h"
#include "exec/exec_state.h"
#include "plan/executor.h"

reshard_result_t rs_api_call(const reshard_plan_t *plan, const rs_call_args *a) {
  if (!a->rejected) rs_error_clear();
  RS_CHECK(rs_plan_refuse_if_failed(plan, "execute"));
  const rs_executor *ex = plan->executor;
  reshard_result_t r = a->rejected ? a->rejected : rs_argcheck_execute(plan, a);
  /* Nothing moves, but the partners must hear of it (or be kept from
   * pairing with this call): the executor's refuse. */
  if (r != RESHARD_SUCCESS) return ex->refuse ? ex->refuse(plan, a->explicit_version, a->version_in, r) : r;
  /* copy 1 exists only where the rank passed both copies (a rank without
   * destination buffers may pass none) */
  const int dbuf = !ex->stream_ordered && (plan->opts.flags & RESHARD_FLAG_DOUBLE_BUFFER) != 0;
  const size_t nd = (size_t)plan->num_dst_buffers;
  rs_exec_call c = {.explicit_version = a->explicit_version,
                    .version_in = a->version_in,
                    .src = a->src,
                    .nsrc = a->nsrc,
                    .dst = a->dst,
                    .ndst = a->ndst,
                    .copies = {a->dst, dbuf && a->dst && a->ndst == 2 * nd ? a->dst + nd : a->dst},
                    .stream = a->stream};
  r = ex->execute(plan, &c);
  if (r != RESHARD_SUCCESS && rs_result_fails_plan(r)) {
    char why[640];
    snprintf(why, sizeof why, "%s", reshard_last_error());
    rs_plan_mark_failed(plan, c.call, c.version, r, why);
  }
  return r;
}
