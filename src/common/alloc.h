/* The library's allocator: libc's malloc, calloc, realloc and strdup,
 * with a fault-injection hook so that tests can make any single allocation
 * fail and check that every error path frees what it took and reports
 * RESHARD_ERROR_OUT_OF_MEMORY.
 *
 * The hook is per thread, because in-process ranks are threads: a test can
 * fault one rank's plan creation while its peers allocate normally. */
#ifndef RS_COMMON_ALLOC_H
#define RS_COMMON_ALLOC_H

#include <stddef.h>

void *rs_malloc(size_t bytes);
void *rs_calloc(size_t n, size_t size);
void *rs_realloc(void *ptr, size_t bytes); /* NULL: *ptr is left as it was */
char *rs_strdup(const char *s);

/* Bulk data (the host executor's staging, the self-test's buffers):
 * rs_malloc unless a tool replaced the pair with rs_alloc_set_bulk (the
 * simulation's folded runs map every simulated rank's bulk data onto the
 * same pages: SMPI_SHARED_MALLOC, tools/reshard_perf.c). Not for memory
 * that holds control data. */
void *rs_bulk_malloc(size_t bytes);
void rs_bulk_free(void *ptr); /* NULL is a no-op */
void rs_alloc_set_bulk(void *(*alloc)(size_t bytes), void (*release)(void *ptr));

/* Test hook: the allocation n allocations from now on this thread fails
 * (0: the next one), once; n < 0 disarms. Re-arming clears the fired flag. */
void rs_alloc_fail_after(long n);
/* Whether the fault armed last on this thread has fired. */
int rs_alloc_fault_fired(void);
/* Allocation calls made on this thread so far (failed ones included). */
unsigned long rs_alloc_count(void);

#endif
