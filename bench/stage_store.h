/* Every rank's first planning stage (rs_plan_stage, plan/plan.h), kept
 * between the passes of a single-process planning tool: computed once,
 * read back by each later pass.
 *
 * A stage is encoded compactly (its segments in stream order, each as its
 * differences from the one before: 12 to 20 bytes a segment) and
 * appended to an unlinked temporary file in $TMPDIR (or /tmp): a job of
 * thousands of ranks holds gigabytes of segments, which
 * the page cache keeps in memory while it fits and the disk takes when it
 * does not. Thread-safe: ranks may be put and got concurrently. */
#ifndef RESHARD_BENCH_STAGE_STORE_H
#define RESHARD_BENCH_STAGE_STORE_H

#include <stddef.h>
#include <stdint.h>

#include "reshard_internal.h"
#include "reshard.h"

typedef struct ss_store ss_store;

reshard_result_t ss_store_create(int nranks, ss_store **out);
/* Stores rank's stage (once per rank); the stage is left as it was. */
reshard_result_t ss_store_put(ss_store *s, int rank, const rs_plan_stage *stage);
/* Decodes rank's stage into *out (freed first with rs_plan_stage_free,
 * except that the memory of its segment vector is reused when it is large
 * enough); the caller frees it, or hands it to a creation through
 * rs_plan_force.use (and .back, to have the memory back). */
reshard_result_t ss_store_get(ss_store *s, int rank, rs_plan_stage *out);
/* Segments in rank's stage (0 before it is put). */
size_t ss_store_segments(const ss_store *s, int rank);
void ss_store_free(ss_store *s);

#endif
