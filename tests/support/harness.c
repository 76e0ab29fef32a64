#include "support/harness.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "reshard_inproc.h"

typedef struct run_arg {
  int rank;
  reshard_inproc_world_t *world;
  th_rank_fn fn;
  void *arg;
  int rc;
} run_arg;

static void *run_thread(void *p) {
  run_arg *a = p;
  reshard_comm_t *comm = NULL;
  if (reshard_comm_create_inproc(a->world, a->rank, &comm)) {
    a->rc = 1;
    return NULL;
  }
  a->rc = a->fn(a->rank, comm, a->arg);
  reshard_comm_destroy(comm);
  return NULL;
}

int th_run_ranks(int nranks, th_rank_fn fn, void *arg) {
  reshard_inproc_world_t *w = NULL;
  if (reshard_inproc_world_create(nranks, &w)) return nranks;
  pthread_t *th = calloc((size_t)nranks, sizeof *th);
  run_arg *a = calloc((size_t)nranks, sizeof *a);
  for (int r = 0; r < nranks; r++) {
    a[r] = (run_arg){r, w, fn, arg, 0};
    pthread_create(&th[r], NULL, run_thread, &a[r]);
  }
  int failed = 0;
  for (int r = 0; r < nranks; r++) {
    pthread_join(th[r], NULL);
    failed += a[r].rc != 0;
  }
  free(th);
  free(a);
  reshard_inproc_world_destroy(w);
  return failed;
}

static pthread_mutex_t sync_lock = PTHREAD_MUTEX_INITIALIZER;

static int sync_rank(int rank, reshard_comm_t *comm, void *p) {
  th_sync_args *a = p;
  reshard_plan_t *plan = NULL;
  if (a->plan_hook) a->plan_hook(1);
  reshard_result_t r = reshard_plan_create(comm, a->src, a->dst, &a->opts, &plan);
  if (a->plan_hook) a->plan_hook(0);
  if (a->expect_fail) {
    if (r != a->expected_code) {
      fprintf(stderr, "rank %d: plan_create returned %d (%s), expected %d\n", rank, r, reshard_last_error(),
              a->expected_code);
      reshard_plan_destroy(plan);
      return 1;
    }
    return 0;
  }
  if (r) {
    fprintf(stderr, "rank %d: plan_create failed: %s: %s\n", rank, reshard_result_string(r), reshard_last_error());
    pthread_mutex_lock(&sync_lock);
    a->api_failures++;
    pthread_mutex_unlock(&sync_lock);
    return 1;
  }
  reshard_plan_stats_t st;
  reshard_plan_get_stats(plan, &st);
  int64_t bad = 0;
  int fails = 0;
  th_side dst;
  if (th_side_alloc(&dst, a->dst, rank, -1)) fails++;
  for (int step = 0; step < a->steps && !fails; step++) {
    th_side src;
    if (th_side_alloc(&src, a->src, rank, step)) fails++;
    r = reshard_plan_execute(plan, (void *const *)src.ptr, (size_t)src.nbuf, (void *const *)dst.ptr, (size_t)dst.nbuf, NULL);
    if (r) {
      fprintf(stderr, "rank %d: execute failed: %s: %s\n", rank, reshard_result_string(r), reshard_last_error());
      fails++;
    } else {
      bad += reshard_selftest_check_from(&dst, a->dst, a->src, rank, (uint64_t)step, "sync"); /* converted tensors too */
    }
    th_side_free(&src);
  }
  th_side_free(&dst);
  reshard_plan_destroy(plan);
  pthread_mutex_lock(&sync_lock);
  a->bad += bad;
  a->api_failures += fails;
  if (rank < 1024) {
    a->send_bytes[rank] = st.send_bytes;
    a->recv_bytes[rank] = st.recv_bytes;
    a->local_bytes[rank] = st.local_copy_bytes;
  }
  pthread_mutex_unlock(&sync_lock);
  return fails || bad;
}

int64_t th_sync(int nranks, th_sync_args *a) {
  a->bad = 0;
  a->api_failures = 0;
  th_run_ranks(nranks, sync_rank, a);
  if (a->api_failures) return -1;
  return a->bad;
}

int64_t th_side_written(const th_side *s) {
  int64_t n = 0;
  for (int b = 0; b < s->nbuf; b++)
    for (size_t i = 0; i < s->bytes[b]; i++) n += s->ptr[b] && s->ptr[b][i] != TH_SENTINEL;
  return n;
}

int th_sides_equal(const th_side *a, const th_side *b) {
  if (a->nbuf != b->nbuf) return 0;
  for (int i = 0; i < a->nbuf; i++)
    if (a->bytes[i] != b->bytes[i] || (a->bytes[i] && memcmp(a->ptr[i], b->ptr[i], a->bytes[i]))) return 0;
  return 1;
}
