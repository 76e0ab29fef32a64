/* Process measurements for the benchmarks and tools: clocks and peak
 * resident memory (Linux /proc). */
#ifndef RESHARD_BENCH_PROC_STATS_H
#define RESHARD_BENCH_PROC_STATS_H

#include <time.h>

/* Milliseconds on clock id (CLOCK_MONOTONIC, CLOCK_THREAD_CPUTIME_ID, ...). */
double ps_clock_ms(clockid_t id);

/* A field of /proc/self/status in KiB (e.g. "VmRSS", "VmHWM"); -1 if absent. */
long ps_status_kib(const char *field);

/* Resets the peak RSS (VmHWM) to the current RSS; 0 on success, -1 where
 * the kernel does not allow it. */
int ps_reset_peak_rss(void);

#endif
