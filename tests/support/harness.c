#include "support/harness.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static uint64_t mix(uint64_t x) {
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ULL;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebULL;
  x ^= x >> 31;
  return x;
}

static uint64_t name_hash(const char *s) {
  uint64_t h = 1469598103934665603ULL;
  while (*s) h = (h ^ (unsigned char)*s++) * 1099511628211ULL;
  return h;
}

void th_expected(const char *name, uint64_t step, int64_t linear,
                 size_t esize, unsigned char *out) {
  uint64_t v = mix(name_hash(name) ^ mix(step + 0x9e37) ^ mix((uint64_t)linear * 0x100000001b3ULL + 7));
  for (size_t i = 0; i < esize; i++) {
    out[i] = (unsigned char)(v >> (8 * (i % 8)));
    if (i % 8 == 7) v = mix(v);
  }
  /* never equal to the sentinel everywhere, so a missed write shows */
  if (esize == 1 && out[0] == TH_SENTINEL) out[0] ^= 0x5a;
}

/* Walks every element of a fragment: global linear index and byte
 * position in the buffer. */
typedef void (*elem_fn)(void *ctx, int64_t linear, size_t pos);

static void for_each_elem(const reshard_fragment_info_t *f,
                          const int64_t *shape, size_t es, elem_fn fn,
                          void *ctx) {
  int nd = f->ndim;
  int64_t idx[RESHARD_MAX_DIMS] = {0};
  for (int d = 0; d < nd; d++)
    if (f->extent[d] == 0) return;
  for (;;) {
    int64_t lin = 0, off = (int64_t)f->byte_offset;
    for (int d = 0; d < nd; d++) {
      lin = lin * shape[d] + f->start[d] + idx[d];
      off += idx[d] * f->strides[d] * (int64_t)es;
    }
    fn(ctx, lin, (size_t)off);
    int d = nd - 1;
    while (d >= 0 && ++idx[d] == f->extent[d]) idx[d--] = 0;
    if (d < 0) return;
  }
}

typedef struct fill_ctx {
  const char *name;
  uint64_t step;
  size_t es;
  unsigned char *buf, *mask;
  int64_t bad;
  const char *label;
  int rank;
} fill_ctx;

static void fill_elem(void *c, int64_t lin, size_t pos) {
  fill_ctx *x = c;
  if (x->buf) th_expected(x->name, x->step, lin, x->es, x->buf + pos);
  memset(x->mask + pos, 1, x->es);
}

static void check_elem(void *c, int64_t lin, size_t pos) {
  fill_ctx *x = c;
  unsigned char want[16];
  th_expected(x->name, x->step, lin, x->es, want);
  if (memcmp(want, x->buf + pos, x->es)) {
    if (x->bad < 5)
      fprintf(stderr, "%s: rank %d tensor '%s' element %lld (buffer byte %zu) wrong\n", x->label, x->rank, x->name,
              (long long)lin, pos);
    x->bad++;
  }
}

static int fragments_of(const reshard_layout_t *L, int rank,
                        reshard_fragment_info_t **out, size_t *n) {
  size_t count = 0;
  if (reshard_layout_fragments(L, rank, NULL, 0, &count)) return -1;
  *out = calloc(count + 1, sizeof **out);
  if (reshard_layout_fragments(L, rank, *out, count, n)) return -1;
  return 0;
}

/* The tensor's shape, name and element size, read back through the
 * fragment's tensor id (tests keep the layouts they built). */
typedef struct tinfo {
  const char *name;
  int64_t shape[RESHARD_MAX_DIMS];
  size_t es;
} tinfo;

/* Test-only access to tensor metadata through the internal layout. */
#include "layout/layout.h"
static tinfo tensor_info(const reshard_layout_t *L, int t) {
  tinfo ti;
  ti.name = L->tensors[t].name;
  memcpy(ti.shape, L->tensors[t].shape, sizeof ti.shape);
  ti.es = reshard_dtype_size(L->tensors[t].dtype);
  return ti;
}

int th_side_alloc(th_side *s, const reshard_layout_t *L, int rank,
                  int64_t fill_step) {
  memset(s, 0, sizeof *s);
  s->nbuf = reshard_layout_num_buffers(L);
  s->ptr = calloc((size_t)s->nbuf + 1, sizeof *s->ptr);
  s->mask = calloc((size_t)s->nbuf + 1, sizeof *s->mask);
  s->bytes = calloc((size_t)s->nbuf + 1, sizeof *s->bytes);
  for (int b = 0; b < s->nbuf; b++) {
    if (reshard_layout_buffer_bytes(L, b, rank, &s->bytes[b])) return -1;
    if (!s->bytes[b]) continue;
    s->ptr[b] = malloc(s->bytes[b]);
    s->mask[b] = calloc(s->bytes[b], 1);
    memset(s->ptr[b], TH_SENTINEL, s->bytes[b]);
  }
  reshard_fragment_info_t *f;
  size_t n;
  if (fragments_of(L, rank, &f, &n)) return -1;
  for (size_t i = 0; i < n; i++) {
    tinfo ti = tensor_info(L, f[i].tensor_id);
    fill_ctx c = {ti.name, (uint64_t)(fill_step < 0 ? 0 : fill_step), ti.es, fill_step >= 0 ? s->ptr[f[i].buffer_id] : NULL,
                  s->mask[f[i].buffer_id], 0, "", rank};
    for_each_elem(&f[i], ti.shape, ti.es, fill_elem, &c);
  }
  free(f);
  return 0;
}

void th_side_free(th_side *s) {
  for (int b = 0; b < s->nbuf; b++) {
    free(s->ptr[b]);
    free(s->mask[b]);
  }
  free(s->ptr);
  free(s->mask);
  free(s->bytes);
  memset(s, 0, sizeof *s);
}

int64_t th_side_check(const th_side *s, const reshard_layout_t *L, int rank,
                      uint64_t step, const char *label) {
  reshard_fragment_info_t *f;
  size_t n;
  if (fragments_of(L, rank, &f, &n)) return 1;
  int64_t bad = 0;
  for (size_t i = 0; i < n; i++) {
    tinfo ti = tensor_info(L, f[i].tensor_id);
    fill_ctx c = {ti.name, step, ti.es, s->ptr[f[i].buffer_id], NULL, 0, label, rank};
    for_each_elem(&f[i], ti.shape, ti.es, check_elem, &c);
    bad += c.bad;
  }
  free(f);
  for (int b = 0; b < s->nbuf; b++)
    for (size_t k = 0; k < s->bytes[b]; k++)
      if (!s->mask[b][k] && s->ptr[b][k] != TH_SENTINEL) {
        if (bad < 5) fprintf(stderr, "%s: rank %d buffer %d byte %zu outside fragments was written\n", label, rank, b, k);
        bad++;
      }
  return bad;
}

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
  reshard_result_t r = reshard_plan_create(comm, a->src, a->dst, &a->opts, &plan);
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
      bad += th_side_check(&dst, a->dst, rank, (uint64_t)step, "sync");
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
