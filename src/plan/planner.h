/* The planner's internals shared between its own files (the .c files of src/plan/)
 * while it builds a plan: nothing here is read by executors, which include
 * plan/plan.h only. */
#ifndef RESHARD_PLAN_PLANNER_H
#define RESHARD_PLAN_PLANNER_H

#include <stddef.h>
#include <stdint.h>

#include "plan/plan.h"

/* options.c: the caller's options (NULL: the defaults) into out, checked
 * against the versions this library knows; then the RESHARD_* parameters
 * over them, and every option checked. */
reshard_result_t rs_options_read(const reshard_options_t *in, reshard_options_t *out);
reshard_result_t rs_options_apply_params(reshard_options_t *o);

/* mismatch.c: run by every rank when the creation's digests differ and no
 * rank failed alone; writes what differs between rank 0 and the lowest
 * rank unlike it into msg. hdr: the 7 option words of creation_digest. */
reshard_result_t rs_explain_mismatch(reshard_comm_t *comm, const reshard_layout_t *src, const reshard_layout_t *dst,
                                     const uint64_t *hdr, uint64_t digest, int64_t deadline, char *msg, size_t len);

#endif
