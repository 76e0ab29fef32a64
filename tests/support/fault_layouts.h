/* Layouts for the fault-injection tests: a small reshard over four ranks
 * that still goes through every builder and most planner paths (grouped
 * and plain fused buffers, parts on different meshes, uneven split sizes,
 * padding, raw buffers with strided fragments, a scalar, colocated local
 * copies, replicas), built through a guard so that a test can make any
 * builder call fail and retry it. */
#ifndef RS_TEST_FAULT_LAYOUTS_H
#define RS_TEST_FAULT_LAYOUTS_H

#include "reshard.h"

#define FL_NRANKS 4

/* Called when a builder call returns r != RESHARD_SUCCESS; returns nonzero
 * to retry the call once (its result then stands), zero to give up. */
typedef struct fl_guard {
  int (*on_fail)(void *ctx, reshard_result_t r, const char *call);
  void *ctx;
} fl_guard;

/* Builds both sides (g may be NULL). On failure returns the failing call's
 * result and leaves in *src and *dst whatever was created (NULL or a
 * layout for the caller to destroy). */
reshard_result_t fl_build_mixed(reshard_layout_t **src, reshard_layout_t **dst,
                                const fl_guard *g);

/* Options for fl_build_mixed's layouts: a staging budget and chunk small
 * enough for several rounds, and a topology preset so that the rank map is
 * built too. */
reshard_options_t fl_options(void);

#endif
