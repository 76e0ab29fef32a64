#include "plan_measure.h"

#include <malloc.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "fake_comm.h"
#include "reshard_internal.h"
#include "proc_stats.h"

reshard_result_t pm_plan_rank(const reshard_layout_t *src,
                              const reshard_layout_t *dst, int rank,
                              int nranks, const reshard_options_t *opts,
                              reshard_comm_t **comm, reshard_plan_t **plan) {
  *plan = NULL;
  *comm = NULL;
  reshard_result_t r = bench_fake_comm_create(rank, nranks, comm);
  if (r) return r;
  r = reshard_plan_create(*comm, src, dst, opts, plan);
  if (r) {
    reshard_comm_destroy(*comm);
    *comm = NULL;
  }
  return r;
}

void pm_plan_free(reshard_comm_t *comm, reshard_plan_t *plan) {
  reshard_plan_destroy(plan); /* before its communicator */
  reshard_comm_destroy(comm);
}

void pm_measure(const reshard_layout_t *src, const reshard_layout_t *dst,
                int rank, int nranks, const reshard_options_t *opts,
                pm_result *out) {
  int fd[2];
  memset(out, 0, sizeof *out);
  if (pipe(fd)) {
    snprintf(out->err, sizeof out->err, "pipe failed");
    return;
  }
  fflush(NULL);
  pid_t pid = fork();
  if (pid == 0) {
    close(fd[0]);
    pm_result m;
    memset(&m, 0, sizeof m);
    /* the allocator as a real run has it (glibc's defaults; the tools
     * keep freed memory across creations, which one creation must not
     * measure) */
    mallopt(M_MMAP_MAX, 65536);
    mallopt(M_MMAP_THRESHOLD, 128 * 1024);
    mallopt(M_TRIM_THRESHOLD, 128 * 1024);
    malloc_trim(0);
    m.peak_exact = ps_reset_peak_rss() == 0;
    long rss0 = ps_status_kib("VmRSS");
    struct mallinfo2 h0 = mallinfo2();
    reshard_comm_t *comm = NULL;
    reshard_plan_t *plan = NULL;
    double t0 = ps_clock_ms(CLOCK_MONOTONIC), c0 = ps_clock_ms(CLOCK_THREAD_CPUTIME_ID);
    reshard_result_t r = pm_plan_rank(src, dst, rank, nranks, opts, &comm, &plan);
    m.plan_ms = ps_clock_ms(CLOCK_MONOTONIC) - t0;
    m.cpu_ms = ps_clock_ms(CLOCK_THREAD_CPUTIME_ID) - c0;
    if (r == RESHARD_SUCCESS) {
      struct mallinfo2 h1 = mallinfo2();
      m.peak_mib = (double)(ps_status_kib("VmHWM") - rss0) / 1024.0;
      m.plan_mib = ((double)(h1.uordblks + h1.hblkhd) - (double)(h0.uordblks + h0.hblkhd)) / 1048576.0;
      reshard_plan_get_stats(plan, &m.stats);
      m.ok = 1;
    } else {
      snprintf(m.err, sizeof m.err, "%s: %s", reshard_result_string(r), reshard_last_error());
    }
    ssize_t w = write(fd[1], &m, sizeof m);
    _exit(w == (ssize_t)sizeof m ? 0 : 1);
  }
  close(fd[1]);
  if (pid < 0) {
    close(fd[0]);
    snprintf(out->err, sizeof out->err, "fork failed");
    return;
  }
  ssize_t got = read(fd[0], out, sizeof *out);
  close(fd[0]);
  int st = 0;
  waitpid(pid, &st, 0);
  if (got != (ssize_t)sizeof *out) {
    memset(out, 0, sizeof *out);
    snprintf(out->err, sizeof out->err, "the measuring child died (status %d)", st);
  }
}
