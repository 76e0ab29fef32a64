/* The NCCL transport and the device executor against mocked CUDA and NCCL
 * (-Wl,--wrap, see tests.cmake): no GPU or driver needed.
 *
 * "Device" memory is host memory, copies happen at enqueue time and the
 * copy kernel is emulated on the CPU (kernels/rs_tile.h), so a one-rank
 * plan moves real data. Every stream operation is logged; the call
 * sequence of an execute is checked as a graph of stream order plus event
 * edges: per round one group with the plan's sends and receives, its pack
 * before its sends, its unpack after its receives, staging halves never
 * reused early, everything after the caller's prior work and before its
 * later work, and no host synchronization. Error injection covers
 * allocation failures, ncclRemoteError, ncclSystemError, asynchronous
 * errors and a nonblocking communicator that never completes.
 *
 * Built a second time with RS_MOCK_MPI and real MPI (test_gpu_nccl_mpi_mock,
 * run under mpirun, one mocked NCCL rank per MPI process): then only the
 * tests of reshard_comm_create_nccl_with_mpi run, whose plan agreement goes
 * over MPI and never through NCCL. */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <cmocka.h>

#include <cuda_runtime.h>
#include <nccl.h>
#ifdef RS_MOCK_MPI
#include <mpi.h> /* before reshard_nccl.h: declares its MPI functions */
#endif

#include "device/device.h"
#include "kernels/rs_kernels.h"
#include "plan/plan.h"
#include "reshard.h"
#include "reshard_nccl.h"
#include "support/random_layout.h"
#include "transport/transport.h"
#include "reshard_selftest.h"

/* ------------------------------------------------------------ the mock */

enum { OP_LAUNCH, OP_GROUP, OP_WAIT, OP_REC, OP_MEMCPY, OP_SYNC, OP_CALLER };

typedef struct mop {
  int kind;
  void *stream;
  void *ev;   /* OP_REC / OP_WAIT */
  int kind2;  /* OP_LAUNCH: 0 pack, 1 unpack, 2 local; */
  int round;  /* OP_LAUNCH / OP_GROUP */
  int first_send, nsend, first_recv, nrecv; /* OP_GROUP: into p2p log */
} mop;

typedef struct mp2p {
  int peer, is_recv;
  size_t bytes;
  void *stream;
  void *buf;
} mp2p;

#define MAXOPS 4096
/* Per thread: the multi-rank test runs one rank per thread. */
static _Thread_local struct {
  int log_off; /* the multi-rank test: no op log */
  mop ops[MAXOPS];
  int nops;
  mp2p p2p[MAXOPS];
  int np2p;
  int in_group, group_first;
  int rank, size;
  /* live resources */
  long mem, streams, events;
  long syncs; /* host synchronizations */
  int aborts;
  /* injection */
  int fail_malloc_async_at; /* n-th cudaMallocAsync fails (1-based) */
  int fail_nccl_mem;
  int fail_malloc;              /* cudaMalloc fails */
  ncclResult_t allreduce_result;
  int allreduce_calls;
  int malloc_async_calls;
  ncclResult_t group_end_result;
  int group_end_fail_at; /* which group (1-based) */
  int groups;
  ncclResult_t async_error;
  int inprogress_polls; /* ncclInProgress this many polls, -1: forever */
  const reshard_plan_t *plan; /* to classify launches */
} M;

static void mock_reset(int rank, int size) {
  memset(&M, 0, sizeof M);
  M.rank = rank;
  M.size = size;
  M.group_end_result = ncclSuccess;
  M.async_error = ncclSuccess;
}

static mop *log_op(int kind, void *stream) {
  static _Thread_local mop sink;
  if (M.log_off) return &sink;
  assert_true(M.nops < MAXOPS);
  mop *o = &M.ops[M.nops++];
  memset(o, 0, sizeof *o);
  o->kind = kind;
  o->stream = stream;
  o->round = -1;
  return o;
}

static void *dev_alloc(size_t n) {
  M.mem++;
  return calloc(1, n ? n : 1);
}
static void dev_free(void *p) {
  if (!p) return;
  M.mem--;
  free(p);
}

cudaError_t __wrap_cudaMalloc(void **p, size_t n) {
  if (M.fail_malloc) return cudaErrorMemoryAllocation;
  *p = dev_alloc(n);
  return cudaSuccess;
}
cudaError_t __wrap_cudaMallocAsync(void **p, size_t n, cudaStream_t s) {
  (void)s;
  if (++M.malloc_async_calls == M.fail_malloc_async_at) return cudaErrorMemoryAllocation;
  *p = dev_alloc(n);
  return cudaSuccess;
}
cudaError_t __wrap_cudaMallocHost(void **p, size_t n) {
  *p = dev_alloc(n);
  return cudaSuccess;
}
cudaError_t __wrap_cudaFree(void *p) {
  dev_free(p);
  return cudaSuccess;
}
cudaError_t __wrap_cudaFreeAsync(void *p, cudaStream_t s) {
  (void)s;
  dev_free(p);
  return cudaSuccess;
}
cudaError_t __wrap_cudaFreeHost(void *p) {
  dev_free(p);
  return cudaSuccess;
}
ncclResult_t __wrap_ncclMemAlloc(void **p, size_t n) {
  if (M.fail_nccl_mem) return ncclSystemError;
  *p = dev_alloc(n);
  return ncclSuccess;
}
ncclResult_t __wrap_ncclMemFree(void *p) {
  dev_free(p);
  return ncclSuccess;
}
static char stream_ids[64], event_ids[64];
static _Thread_local int next_stream, next_event;
cudaError_t __wrap_cudaStreamCreateWithFlags(cudaStream_t *s, unsigned f) {
  (void)f;
  M.streams++;
  *s = (cudaStream_t)&stream_ids[next_stream++ % 64];
  return cudaSuccess;
}
cudaError_t __wrap_cudaStreamDestroy(cudaStream_t s) {
  (void)s;
  M.streams--;
  return cudaSuccess;
}
cudaError_t __wrap_cudaEventCreateWithFlags(cudaEvent_t *e, unsigned f) {
  (void)f;
  M.events++;
  *e = (cudaEvent_t)&event_ids[next_event++ % 64];
  return cudaSuccess;
}
cudaError_t __wrap_cudaEventDestroy(cudaEvent_t e) {
  (void)e;
  M.events--;
  return cudaSuccess;
}
cudaError_t __wrap_cudaStreamSynchronize(cudaStream_t s) {
  M.syncs++;
  log_op(OP_SYNC, s);
  return cudaSuccess;
}
cudaError_t __wrap_cudaDeviceSynchronize(void) {
  M.syncs++;
  log_op(OP_SYNC, NULL);
  return cudaSuccess;
}
cudaError_t __wrap_cudaEventSynchronize(cudaEvent_t e) {
  (void)e;
  M.syncs++;
  log_op(OP_SYNC, NULL);
  return cudaSuccess;
}
cudaError_t __wrap_cudaStreamQuery(cudaStream_t s) {
  (void)s;
  return cudaSuccess;
}
cudaError_t __wrap_cudaEventQuery(cudaEvent_t e) {
  (void)e;
  return cudaSuccess;
}
cudaError_t __wrap_cudaEventRecord(cudaEvent_t e, cudaStream_t s) {
  log_op(OP_REC, s)->ev = e;
  return cudaSuccess;
}
cudaError_t __wrap_cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned f) {
  (void)f;
  log_op(OP_WAIT, s)->ev = e;
  return cudaSuccess;
}
cudaError_t __wrap_cudaMemcpyAsync(void *d, const void *s, size_t n, enum cudaMemcpyKind k, cudaStream_t st) {
  (void)k;
  memcpy(d, s, n);
  log_op(OP_MEMCPY, st);
  return cudaSuccess;
}

/* Which launch this is, from its first tile's descriptor: send copies come
 * first in the device array, then receive copies, then local ones. */
static void classify(mop *o, const rs_tile *t) {
  const reshard_plan_t *p = M.plan;
  uint32_t d = t->desc;
  const rs_msg *m;
  size_t n;
  if (d < p->nsend_copies) {
    o->kind2 = 0, m = p->sends, n = p->nsends;
  } else if (d < p->nsend_copies + p->nrecv_copies) {
    o->kind2 = 1, m = p->recvs, n = p->nrecvs, d -= (uint32_t)p->nsend_copies;
  } else {
    o->kind2 = 2;
    return;
  }
  for (size_t i = 0; i < n; i++)
    if (d >= m[i].first_copy && d < m[i].first_copy + m[i].ncopies) o->round = m[i].round;
}

int __wrap_rs_cuda_launch_copies(const rs_tile *tiles, uint64_t ntiles, const rs_copy *copies,
                                 void *const *src_tab, void *const *dst_tab, void *staging, void *stream) {
  assert_true(ntiles > 0);
  mop *o = log_op(OP_LAUNCH, stream);
  if (M.plan) classify(o, &tiles[0]);
  /* the kernel, emulated: every tile by 32 threads */
  for (uint64_t i = 0; i < ntiles; i++) {
    const rs_copy *c = &copies[tiles[i].desc];
    const unsigned char *s = c->src_buf == RS_BUF_STAGING ? staging : src_tab[c->src_buf];
    unsigned char *d = c->dst_buf == RS_BUF_STAGING ? staging : dst_tab[c->dst_buf];
    for (unsigned t = 0; t < 32; t++) rs_tile_copy(c, &tiles[i], s, d, t, 32);
  }
  return 0;
}

ncclResult_t __wrap_ncclGroupStart(void) {
  assert_false(M.in_group);
  M.in_group = 1;
  M.group_first = M.np2p;
  return ncclSuccess;
}
static ncclResult_t p2p(int is_recv, size_t count, ncclDataType_t dt, int peer, cudaStream_t s) {
  assert_true(M.in_group);
  assert_int_equal(dt, ncclInt8);
  if (M.np2p == MAXOPS) M.np2p = M.group_first = 0; /* log_off: only the group matters */
  M.p2p[M.np2p++] = (mp2p){peer, is_recv, count, s, NULL};
  return ncclSuccess;
}
ncclResult_t __wrap_ncclSend(const void *b, size_t count, ncclDataType_t dt, int peer, ncclComm_t c,
                             cudaStream_t s) {
  (void)c;
  ncclResult_t r = p2p(0, count, dt, peer, s);
  M.p2p[M.np2p - 1].buf = (void *)b;
  return r;
}
ncclResult_t __wrap_ncclRecv(void *b, size_t count, ncclDataType_t dt, int peer, ncclComm_t c, cudaStream_t s) {
  (void)c;
  ncclResult_t r = p2p(1, count, dt, peer, s);
  M.p2p[M.np2p - 1].buf = b;
  return r;
}

/* The multi-rank world: messages through mailboxes (eager sends, blocking
 * receives at group end: the group's sends are all deposited first, so
 * ranks never wait on each other in a cycle), and a real max-allreduce. */
#define MAXR 64
typedef struct mail {
  struct mail *next;
  size_t bytes;
  unsigned char data[];
} mail;
static struct {
  int n;
  pthread_mutex_t mu;
  pthread_cond_t cv;
  mail *head[MAXR][MAXR], **tail[MAXR][MAXR];
  pthread_barrier_t bar;
  uint64_t red[MAXR][RS_AGREE_MAX_WORDS];
  int bad_size;
  long delivered; /* messages, over all worlds */
} W = {.mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER};

static void world_deliver(int first, int end) {
  for (int i = first; i < end; i++) {
    mp2p *x = &M.p2p[i];
    if (x->is_recv) continue;
    mail *m = malloc(sizeof *m + x->bytes);
    m->next = NULL;
    m->bytes = x->bytes;
    memcpy(m->data, x->buf, x->bytes);
    pthread_mutex_lock(&W.mu);
    if (!W.tail[M.rank][x->peer]) W.tail[M.rank][x->peer] = &W.head[M.rank][x->peer];
    *W.tail[M.rank][x->peer] = m;
    W.tail[M.rank][x->peer] = &m->next;
    pthread_cond_broadcast(&W.cv);
    pthread_mutex_unlock(&W.mu);
  }
  for (int i = first; i < end; i++) {
    mp2p *x = &M.p2p[i];
    if (!x->is_recv) continue;
    pthread_mutex_lock(&W.mu);
    while (!W.head[x->peer][M.rank]) pthread_cond_wait(&W.cv, &W.mu);
    mail *m = W.head[x->peer][M.rank];
    W.head[x->peer][M.rank] = m->next;
    if (!m->next) W.tail[x->peer][M.rank] = &W.head[x->peer][M.rank];
    pthread_mutex_unlock(&W.mu);
    if (m->bytes != x->bytes) W.bad_size = 1;
    __atomic_fetch_add(&W.delivered, 1, __ATOMIC_RELAXED);
    memcpy(x->buf, m->data, m->bytes < x->bytes ? m->bytes : x->bytes);
    free(m);
  }
}
ncclResult_t __wrap_ncclGroupEnd(void) {
  assert_true(M.in_group);
  M.in_group = 0;
  M.groups++;
  if (M.group_end_fail_at == M.groups) return M.group_end_result;
  if (M.group_first == M.np2p) return ncclSuccess;
  if (W.n) world_deliver(M.group_first, M.np2p);
  mop *o = log_op(OP_GROUP, M.p2p[M.group_first].stream);
  o->first_send = M.group_first;
  o->nsend = M.np2p - M.group_first; /* sends and receives together */
  if (M.inprogress_polls) return ncclInProgress;
  return ncclSuccess;
}
ncclResult_t __wrap_ncclCommGetAsyncError(ncclComm_t c, ncclResult_t *st) {
  (void)c;
  if (M.inprogress_polls) {
    if (M.inprogress_polls > 0) M.inprogress_polls--;
    *st = ncclInProgress;
    return ncclSuccess;
  }
  *st = M.async_error;
  return ncclSuccess;
}
const char *__wrap_ncclGetLastError(ncclComm_t c) {
  (void)c;
  return "mock detail";
}
ncclResult_t __wrap_ncclCommAbort(ncclComm_t c) {
  (void)c;
  M.aborts++;
  return ncclSuccess;
}
ncclResult_t __wrap_ncclCommDestroy(ncclComm_t c) {
  (void)c;
  return ncclSuccess;
}
ncclResult_t __wrap_ncclAllReduce(const void *s, void *r, size_t n, ncclDataType_t dt, ncclRedOp_t op,
                                  ncclComm_t c, cudaStream_t st) {
  (void)c, (void)st;
  assert_int_equal(dt, ncclUint64);
  assert_int_equal(op, ncclMax);
  M.allreduce_calls++;
  if (M.allreduce_result) return M.allreduce_result;
  if (s != r) memcpy(r, s, n * 8);
  if (!W.n) return ncclSuccess; /* one rank alone: max is identity */
  assert_true(n <= RS_AGREE_MAX_WORDS);
  memcpy(W.red[M.rank], r, n * 8);
  pthread_barrier_wait(&W.bar);
  uint64_t *v = r;
  for (int k = 0; k < W.n; k++)
    for (size_t i = 0; i < n; i++)
      if (W.red[k][i] > v[i]) v[i] = W.red[k][i];
  pthread_barrier_wait(&W.bar);
  return ncclSuccess;
}
ncclResult_t __wrap_ncclCommCount(ncclComm_t c, int *n) {
  (void)c;
  *n = M.size;
  return ncclSuccess;
}
ncclResult_t __wrap_ncclCommUserRank(ncclComm_t c, int *r) {
  (void)c;
  *r = M.rank;
  return ncclSuccess;
}

/* ------------------------------------------------------------ layouts */

/* 64 x 64 fp32, rows over 4 ranks on the source, columns over 4 on the
 * destination: every rank exchanges with every other. */
static void layouts_4(reshard_layout_t **src, reshard_layout_t **dst) {
  int64_t shape[2] = {64, 64};
  int t, m, b;
  int s4[1] = {4};
  assert_int_equal(reshard_layout_create(src), 0);
  assert_int_equal(reshard_layout_create(dst), 0);
  assert_int_equal(reshard_layout_add_tensor(*src, "w", RESHARD_FP32, 2, shape, &t), 0);
  assert_int_equal(reshard_layout_add_tensor(*dst, "w", RESHARD_FP32, 2, shape, &t), 0);
  assert_int_equal(reshard_layout_add_mesh_strided(*src, 1, s4, 0, 1, &m), 0);
  reshard_placement_t p0[1] = {reshard_shard(0)}, p1[1] = {reshard_shard(1)};
  assert_int_equal(reshard_layout_place(*src, t, m, p0, &b), 0);
  assert_int_equal(reshard_layout_add_mesh_strided(*dst, 1, s4, 0, 1, &m), 0);
  assert_int_equal(reshard_layout_place(*dst, t, m, p1, &b), 0);
}

typedef struct fixture {
  reshard_comm_t *comm;
  reshard_layout_t *src, *dst;
  reshard_plan_t *plan;
  long mem0, streams0, events0;
  float sbuf[1024], dbuf[1024];
  void *sp[1], *dp[1];
} fixture;

static void setup_plan(fixture *f, int rank, size_t staging) {
  memset(f, 0, sizeof *f);
  mock_reset(rank, 4);
  assert_int_equal(reshard_comm_create_nccl((ncclComm_t)0x1, &f->comm), 0);
  layouts_4(&f->src, &f->dst);
  reshard_options_t o = RESHARD_OPTIONS_INITIALIZER;
  o.staging_bytes = staging;
  o.timeout_ms = 200;
  reshard_result_t r = reshard_plan_create(f->comm, f->src, f->dst, &o, &f->plan);
  if (r) fail_msg("plan_create: %s", reshard_last_error());
  M.plan = f->plan;
  f->mem0 = M.mem, f->streams0 = M.streams, f->events0 = M.events;
  f->sp[0] = f->sbuf;
  f->dp[0] = f->dbuf;
}

static reshard_result_t exec(fixture *f, void *stream) {
  return reshard_plan_execute(f->plan, f->sp, 1, f->dp, 1, stream);
}

static void teardown_plan(fixture *f) {
  reshard_plan_destroy(f->plan);
  /* no leak: back to what the communicator alone holds */
  assert_int_equal(M.mem, f->mem0);
  assert_int_equal(M.streams, f->streams0);
  assert_int_equal(M.events, f->events0);
  reshard_layout_destroy(f->src);
  reshard_layout_destroy(f->dst);
  reshard_comm_destroy(f->comm);
  assert_int_equal(M.mem, 0);
  assert_int_equal(M.streams, 0);
  assert_int_equal(M.events, 0);
}

/* ------------------------------------------------- happens-before graph */

#define MAXN MAXOPS
static int node_preds[MAXN][2];
static unsigned char *reach; /* reach[i * n + j]: j happens before i */

/* Builds the graph of ops [0, n): each op follows the previous one on its
 * stream; a wait also follows the op the event captured when recorded. */
static void build_graph(int n) {
  void *streams[16];
  int last[16], ns = 0;
  void *evs[32];
  int evnode[32], ne = 0;
  free(reach);
  reach = calloc((size_t)n * n, 1);
  for (int i = 0; i < n; i++) {
    mop *o = &M.ops[i];
    int si = 0;
    while (si < ns && streams[si] != o->stream) si++;
    if (si == ns) {
      assert_true(ns < 16);
      streams[ns] = o->stream, last[ns] = -1, ns++;
    }
    node_preds[i][0] = last[si];
    node_preds[i][1] = -1;
    if (o->kind == OP_WAIT || o->kind == OP_REC) {
      int ei = 0;
      while (ei < ne && evs[ei] != o->ev) ei++;
      if (o->kind == OP_REC) {
        if (ei == ne) evs[ne++] = o->ev;
        evnode[ei] = i;
      } else if (ei < ne) {
        node_preds[i][1] = evnode[ei];
      }
    }
    last[si] = i;
    reach[(size_t)i * n + i] = 1;
    for (int k = 0; k < 2; k++) {
      int pr = node_preds[i][k];
      if (pr < 0) continue;
      for (int j = 0; j < n; j++) reach[(size_t)i * n + j] |= reach[(size_t)pr * n + j];
    }
  }
}

static int before(int a, int b, int n) { return reach[(size_t)b * n + a]; }

static int find_op(int kind, int kind2, int round) {
  for (int i = 0; i < M.nops; i++)
    if (M.ops[i].kind == kind && (kind != OP_LAUNCH || M.ops[i].kind2 == kind2) && M.ops[i].round == round)
      return i;
  return -1;
}

/* ------------------------------------------------------------ tests */

static void call_sequence(void **state) {
  (void)state;
  for (int rank = 0; rank < 4; rank++) {
    fixture f;
    setup_plan(&f, rank, 4096); /* small staging: several rounds */
    const reshard_plan_t *p = f.plan;
    assert_true(p->nrounds >= 3);
    void *caller = (void *)0x77;
    assert_int_equal(exec(&f, caller), 0); /* first: sets up */
    /* the second execute is the steady state */
    M.nops = 0, M.np2p = 0, M.syncs = 0;
    mop *start = log_op(OP_CALLER, caller);
    (void)start;
    assert_int_equal(exec(&f, caller), 0);
    assert_int_equal(M.syncs, 0); /* no host synchronization */
    log_op(OP_CALLER, caller);
    int n = M.nops;
    /* rounds: label groups in order */
    int g = 0;
    for (int i = 0; i < n; i++)
      if (M.ops[i].kind == OP_GROUP) M.ops[i].round = g++;
    assert_int_equal(g, p->nrounds);
    build_graph(n);
    void *xfer = NULL;
    for (int k = 0; k < p->nrounds; k++) {
      int gi = find_op(OP_GROUP, 0, k);
      mop *go = &M.ops[gi];
      if (!xfer) xfer = go->stream;
      assert_ptr_equal(go->stream, xfer);
      assert_ptr_not_equal(xfer, caller);
      /* the group holds exactly the round's messages */
      size_t ns = 0, nr = 0;
      for (int j = go->first_send; j < go->first_send + go->nsend; j++) {
        mp2p *x = &M.p2p[j];
        assert_int_not_equal(x->peer, rank);
        int found = 0;
        const rs_msg *m = x->is_recv ? p->recvs : p->sends;
        size_t cnt = x->is_recv ? p->nrecvs : p->nsends;
        for (size_t i = 0; i < cnt; i++)
          if (m[i].round == k && m[i].peer == x->peer && m[i].bytes == x->bytes) found++;
        assert_int_equal(found, 1);
        if (x->is_recv) nr++;
        else ns++;
      }
      size_t es = 0, er = 0;
      for (size_t i = 0; i < p->nsends; i++) es += p->sends[i].round == k;
      for (size_t i = 0; i < p->nrecvs; i++) er += p->recvs[i].round == k;
      assert_int_equal(ns, es);
      assert_int_equal(nr, er);
      int pk = find_op(OP_LAUNCH, 0, k), up = find_op(OP_LAUNCH, 1, k);
      if (es) {
        assert_true(pk >= 0);
        assert_true(before(pk, gi, n));  /* pack before its sends */
        assert_true(before(0, pk, n));   /* after the caller's work */
      }
      if (er) {
        assert_true(up >= 0);
        assert_true(before(gi, up, n));  /* unpack after its receives */
        assert_true(before(up, n - 1, n)); /* before the caller's later work */
      }
      assert_true(before(0, gi, n));
      assert_true(before(gi, n - 1, n));
      if (k >= 2) {
        int g2 = find_op(OP_GROUP, 0, k - 2), u2 = find_op(OP_LAUNCH, 1, k - 2);
        if (pk >= 0) assert_true(before(g2, pk, n)); /* send half free */
        if (u2 >= 0) assert_true(before(u2, gi, n)); /* receive half free */
      }
      /* and pipelining: pack k+1 need not wait for transfer k */
      int pk1 = find_op(OP_LAUNCH, 0, k + 1);
      if (pk1 >= 0) assert_false(before(gi, pk1, n));
    }
    teardown_plan(&f);
  }
}

/* One rank, local copies only: real data through the emulated kernels,
 * into a transposed, misaligned raw destination. */
static void local_copies_data(void **state) {
  (void)state;
  mock_reset(0, 1);
  reshard_comm_t *comm;
  assert_int_equal(reshard_comm_create_nccl((ncclComm_t)0x1, &comm), 0);
  reshard_layout_t *src, *dst;
  assert_int_equal(reshard_layout_create(&src), 0);
  assert_int_equal(reshard_layout_create(&dst), 0);
  int64_t sw[2] = {12, 10}, sv[2] = {5, 7};
  int tw, tv, m, b;
  for (int side = 0; side < 2; side++) {
    reshard_layout_t *L = side ? dst : src;
    assert_int_equal(reshard_layout_add_tensor(L, "w", RESHARD_FP32, 2, sw, &tw), 0);
    assert_int_equal(reshard_layout_add_tensor(L, "v", RESHARD_BF16, 2, sv, &tv), 0);
  }
  int s1[1] = {1};
  assert_int_equal(reshard_layout_add_mesh_strided(src, 1, s1, 0, 1, &m), 0);
  reshard_placement_t r1[1] = {reshard_replicate()};
  assert_int_equal(reshard_layout_place(src, tw, m, r1, &b), 0);
  assert_int_equal(reshard_layout_place(src, tv, m, r1, &b), 0);
  assert_int_equal(reshard_layout_add_buffer(dst, "raw", 0, 4096, &b), 0);
  int64_t z[2] = {0, 0}, colmajor[2] = {1, 12};
  reshard_fragment_t fw = {tw, b, z, sw, 16, colmajor};
  reshard_fragment_t fv = {tv, b, z, sv, 16 + 480 + 6, NULL};
  assert_int_equal(reshard_layout_add_fragment(dst, &fw), 0);
  assert_int_equal(reshard_layout_add_fragment(dst, &fv), 0);
  reshard_plan_t *plan;
  reshard_options_t o = RESHARD_OPTIONS_INITIALIZER;
  assert_int_equal(reshard_plan_create(comm, src, dst, &o, &plan), 0);
  M.plan = plan;
  assert_int_equal(plan->nsends + plan->nrecvs, 0);
  assert_true(plan->nlocal_copies > 0);
  reshard_selftest_t s, d;
  for (int step = 0; step < 2; step++) {
    assert_int_equal(reshard_selftest_alloc(&s, src, 0, step), 0);
    assert_int_equal(reshard_selftest_alloc(&d, dst, 0, -1), 0);
    M.np2p = 0;
    /* new buffer addresses each step: the table is uploaded again */
    assert_int_equal(reshard_plan_execute(plan, (void *const *)s.ptr, (size_t)s.nbuf, (void *const *)d.ptr,
                                          (size_t)d.nbuf, (void *)0x99), 0);
    assert_int_equal(M.np2p, 0); /* no NCCL self-send */
    assert_int_equal(reshard_selftest_check(&d, dst, 0, (uint64_t)step, "mock local"), 0);
    reshard_selftest_free(&s);
    reshard_selftest_free(&d);
  }
  reshard_plan_destroy(plan);
  reshard_layout_destroy(src);
  reshard_layout_destroy(dst);
  reshard_comm_destroy(comm);
  assert_int_equal(M.mem, 0);
  assert_int_equal(M.streams, 0);
  assert_int_equal(M.events, 0);
}

/* Allocation failures at setup: OUT_OF_MEMORY, nothing leaked, nothing
 * cached, and the plan works once memory is back. */
static void alloc_failures(void **state) {
  (void)state;
  for (int which = 0; which < 4; which++) {
    fixture f;
    setup_plan(&f, 1, 4096);
    if (which < 3) M.fail_malloc_async_at = M.malloc_async_calls + which + 1;
    else M.fail_nccl_mem = 1;
    assert_int_equal(exec(&f, NULL), RESHARD_ERROR_OUT_OF_MEMORY);
    assert_non_null(strstr(reshard_last_error(), which < 3 ? "cudaMallocAsync" : "ncclMemAlloc"));
    assert_null(f.plan->device);
    assert_int_equal(M.mem, f.mem0);
    assert_int_equal(M.streams, f.streams0);
    assert_int_equal(M.events, f.events0);
    M.fail_malloc_async_at = 0, M.fail_nccl_mem = 0;
    assert_int_equal(exec(&f, NULL), 0); /* reusable */
    teardown_plan(&f);
  }
}

/* Failures while creating the communicator or agreeing on a plan: the
 * right code and nothing left behind. */
static void create_failures(void **state) {
  (void)state;
  mock_reset(0, 4);
  reshard_comm_t *comm = NULL;
  M.fail_malloc = 1;
  assert_int_equal(reshard_comm_create_nccl((ncclComm_t)0x1, &comm), RESHARD_ERROR_OUT_OF_MEMORY);
  assert_null(comm);
  assert_int_equal(M.mem, 0);
  assert_int_equal(M.streams, 0);
  M.fail_malloc = 0;
  assert_int_equal(reshard_comm_create_nccl(NULL, &comm), RESHARD_ERROR_INVALID_ARGUMENT);
  assert_int_equal(reshard_comm_create_nccl((ncclComm_t)0x1, &comm), 0);
  reshard_layout_t *src, *dst;
  layouts_4(&src, &dst);
  reshard_options_t o = RESHARD_OPTIONS_INITIALIZER;
  reshard_plan_t *plan = NULL;
  M.allreduce_result = ncclRemoteError;
  assert_int_equal(reshard_plan_create(comm, src, dst, &o, &plan), RESHARD_ERROR_REMOTE);
  assert_non_null(strstr(reshard_last_error(), "ncclAllReduce"));
  M.allreduce_result = ncclSystemError;
  assert_int_equal(reshard_plan_create(comm, src, dst, &o, &plan), RESHARD_ERROR_BACKEND);
  assert_null(plan);
  M.allreduce_result = ncclSuccess;
  assert_int_equal(reshard_plan_create(comm, src, dst, &o, &plan), 0);
  reshard_plan_destroy(plan);
  reshard_layout_destroy(src);
  reshard_layout_destroy(dst);
  reshard_comm_destroy(comm);
  assert_int_equal(M.mem, 0);
  assert_int_equal(M.streams, 0);
}

/* NCCL errors while enqueueing: the right code, the plan marked failed
 * (INVALID_USAGE afterwards), and destroy releases everything. */
static void nccl_errors(void **state) {
  (void)state;
  struct {
    ncclResult_t e;
    reshard_result_t want;
  } cases[] = {{ncclRemoteError, RESHARD_ERROR_REMOTE}, {ncclSystemError, RESHARD_ERROR_BACKEND},
               {ncclUnhandledCudaError, RESHARD_ERROR_BACKEND}};
  for (int i = 0; i < 3; i++) {
    fixture f;
    setup_plan(&f, 2, 4096);
    M.group_end_result = cases[i].e;
    M.group_end_fail_at = M.groups + 2; /* the second round */
    assert_int_equal(exec(&f, NULL), cases[i].want);
    assert_non_null(strstr(reshard_last_error(), "ncclGroupEnd"));
    assert_int_equal(exec(&f, NULL), RESHARD_ERROR_INVALID_USAGE);
    assert_non_null(strstr(reshard_last_error(), "failed earlier"));
    teardown_plan(&f);
  }
  /* an asynchronous error of the communicator, seen at the next execute */
  fixture f;
  setup_plan(&f, 3, 4096);
  assert_int_equal(exec(&f, NULL), 0);
  M.async_error = ncclRemoteError;
  assert_int_equal(exec(&f, NULL), RESHARD_ERROR_REMOTE);
  assert_non_null(strstr(reshard_last_error(), "mock detail"));
  M.async_error = ncclSuccess;
  assert_int_equal(exec(&f, NULL), RESHARD_ERROR_INVALID_USAGE);
  teardown_plan(&f);
}

/* A nonblocking communicator: ncclInProgress is waited for; one that never
 * completes ends in a timeout and ncclCommAbort, not a hang. */
static void nonblocking(void **state) {
  (void)state;
  fixture f;
  setup_plan(&f, 0, 4096);
  M.inprogress_polls = 3;
  assert_int_equal(exec(&f, NULL), 0);
  assert_int_equal(M.aborts, 0);
  M.inprogress_polls = -1;
  assert_int_equal(exec(&f, NULL), RESHARD_ERROR_TIMEOUT);
  assert_int_equal(M.aborts, 1);
  assert_non_null(strstr(reshard_last_error(), "aborted"));
  M.inprogress_polls = 0;
  assert_int_equal(exec(&f, NULL), RESHARD_ERROR_INVALID_USAGE);
  teardown_plan(&f);
}

/* The stream argument: device transports take one, host transports keep
 * refusing it. */
static void stream_argument(void **state) {
  (void)state;
  reshard_inproc_world_t *w;
  reshard_comm_t *c;
  assert_int_equal(reshard_inproc_world_create(1, &w), 0);
  assert_int_equal(reshard_comm_create_inproc(w, 0, &c), 0);
  reshard_layout_t *src, *dst;
  int64_t shape[1] = {4};
  int t, m, b, s1[1] = {1};
  assert_int_equal(reshard_layout_create(&src), 0);
  assert_int_equal(reshard_layout_create(&dst), 0);
  reshard_placement_t r1[1] = {reshard_replicate()};
  for (int side = 0; side < 2; side++) {
    reshard_layout_t *L = side ? dst : src;
    assert_int_equal(reshard_layout_add_tensor(L, "x", RESHARD_FP32, 1, shape, &t), 0);
    assert_int_equal(reshard_layout_add_mesh_strided(L, 1, s1, 0, 1, &m), 0);
    assert_int_equal(reshard_layout_place(L, t, m, r1, &b), 0);
  }
  reshard_plan_t *p;
  reshard_options_t o = RESHARD_OPTIONS_INITIALIZER;
  assert_int_equal(reshard_plan_create(c, src, dst, &o, &p), 0);
  float x[4] = {1, 2, 3, 4}, y[4] = {0};
  void *sp[1] = {x}, *dp[1] = {y};
  assert_int_equal(reshard_plan_execute(p, sp, 1, dp, 1, (void *)0x5), RESHARD_ERROR_INVALID_ARGUMENT);
  assert_int_equal(reshard_plan_execute(p, sp, 1, dp, 1, NULL), 0);
  assert_true(y[3] == 4);
  reshard_plan_destroy(p);
  reshard_comm_destroy(c);
  reshard_inproc_world_destroy(w);
  reshard_layout_destroy(src);
  reshard_layout_destroy(dst);
}

/* Random layout pairs (tests/support/random_layout.h) over a world of
 * mocked ranks, one thread each: the device executor's staging offsets,
 * halves, tiles and groups move the data every destination element
 * expects, checked byte for byte (also the bytes around fragments). */
typedef struct rank_arg {
  const rl_pair *pair;
  size_t staging;
  int rank;
  int64_t bad;
  int failed;
} rank_arg;

static void *rank_main(void *vp) {
  rank_arg *a = vp;
  mock_reset(a->rank, a->pair->nranks);
  M.log_off = 1;
  reshard_comm_t *comm = NULL;
  reshard_plan_t *plan = NULL;
  reshard_options_t o = RESHARD_OPTIONS_INITIALIZER;
  o.staging_bytes = a->staging;
  o.timeout_ms = 20000;
  if (reshard_comm_create_nccl((ncclComm_t)0x1, &comm) ||
      reshard_plan_create(comm, a->pair->src, a->pair->dst, &o, &plan)) {
    fprintf(stderr, "rank %d: %s\n", a->rank, reshard_last_error());
    a->failed = 1;
    /* the other ranks' agreement collective still needs this one */
    reshard_comm_destroy(comm);
    return NULL;
  }
  M.plan = plan;
  reshard_selftest_t s, d;
  if (reshard_selftest_alloc(&d, a->pair->dst, a->rank, -1)) a->failed = 1;
  for (int step = 0; step < 2 && !a->failed; step++) {
    if (reshard_selftest_alloc(&s, a->pair->src, a->rank, step)) {
      a->failed = 1;
      break;
    }
    reshard_result_t r = reshard_plan_execute(plan, (void *const *)s.ptr, (size_t)s.nbuf, (void *const *)d.ptr,
                                              (size_t)d.nbuf, NULL);
    if (r) {
      fprintf(stderr, "rank %d: execute: %s\n", a->rank, reshard_last_error());
      a->failed = 1;
    } else {
      a->bad += reshard_selftest_check(&d, a->pair->dst, a->rank, (uint64_t)step, "mock world");
    }
    reshard_selftest_free(&s);
  }
  reshard_selftest_free(&d);
  reshard_plan_destroy(plan);
  reshard_comm_destroy(comm);
  if (M.mem || M.streams || M.events) a->failed = 1; /* leaks */
  return NULL;
}

static void random_worlds(void **state) {
  (void)state;
  uint64_t seed0 = (uint64_t)time(NULL);
  for (int it = 0; it < 300; it++) {
    uint64_t seed = seed0 + (uint64_t)it * 104729;
    rl_pair pair;
    if (rl_pair_make(seed, RL_ANY, &pair)) fail_msg("seed %llu: layout generation failed", (unsigned long long)seed);
    int n = pair.nranks;
    assert_true(n <= MAXR);
    W.n = n;
    W.bad_size = 0;
    pthread_barrier_init(&W.bar, NULL, (unsigned)n);
    rank_arg args[MAXR];
    pthread_t th[MAXR];
    size_t staging = it % 3 == 0 ? (size_t)1 << 20 : it % 3 == 1 ? 4096 : 16384; /* few or many rounds */
    for (int r = 0; r < n; r++) {
      args[r] = (rank_arg){&pair, staging, r, 0, 0};
      pthread_create(&th[r], NULL, rank_main, &args[r]);
    }
    int64_t bad = 0;
    int failed = 0;
    for (int r = 0; r < n; r++) {
      pthread_join(th[r], NULL);
      bad += args[r].bad;
      failed += args[r].failed;
    }
    pthread_barrier_destroy(&W.bar);
    for (int i = 0; i < MAXR; i++)
      for (int j = 0; j < MAXR; j++) {
        if (W.head[i][j]) failed++; /* a message nobody received */
        W.head[i][j] = NULL;
        W.tail[i][j] = NULL;
      }
    W.n = 0;
    if (bad || failed || W.bad_size) {
      rl_pair_print(&pair, stderr);
      fail_msg("seed %llu (%d ranks, staging %zu): %lld wrong, %d ranks failed, size mismatch %d",
               (unsigned long long)seed, n, staging, (long long)bad, failed, W.bad_size);
    }
    rl_pair_free(&pair);
  }
  /* the worlds did exchange data (not only local copies) */
  printf("random worlds: %ld messages delivered\n", W.delivered);
  assert_true(W.delivered > 1000);
}

#ifdef RS_MOCK_MPI
/* ------------------------------------------- agreement over MPI (mpirun) */

static int mpi_rank, mpi_size;

/* Every rank copies locally only (nothing for the mocked NCCL to carry
 * between processes): "w" replicated -> rows sharded, "v" rows sharded on
 * both sides but transposed into a raw destination buffer at an odd
 * offset. */
static void layouts_local(reshard_layout_t **src, reshard_layout_t **dst) {
  int n = mpi_size;
  int64_t sw[2] = {8 * n, 6}, sv[2] = {4 * n, 10};
  int tw, tv, m, b;
  assert_int_equal(reshard_layout_create(src), 0);
  assert_int_equal(reshard_layout_create(dst), 0);
  for (int side = 0; side < 2; side++) {
    reshard_layout_t *L = side ? *dst : *src;
    assert_int_equal(reshard_layout_add_tensor(L, "w", RESHARD_FP32, 2, sw, &tw), 0);
    assert_int_equal(reshard_layout_add_tensor(L, "v", RESHARD_BF16, 2, sv, &tv), 0);
  }
  int sn[1] = {n};
  reshard_placement_t r1[1] = {reshard_replicate()}, s0[1] = {reshard_shard(0)};
  assert_int_equal(reshard_layout_add_mesh_strided(*src, 1, sn, 0, 1, &m), 0);
  assert_int_equal(reshard_layout_place(*src, tw, m, r1, &b), 0);
  assert_int_equal(reshard_layout_place(*src, tv, m, s0, &b), 0);
  assert_int_equal(reshard_layout_add_mesh_strided(*dst, 1, sn, 0, 1, &m), 0);
  assert_int_equal(reshard_layout_place(*dst, tw, m, s0, &b), 0);
  for (int r = 0; r < n; r++) {
    assert_int_equal(reshard_layout_add_buffer(*dst, "raw", r, 4 * 10 * 2 + 64, &b), 0);
    int64_t start[2] = {4 * r, 0}, ext[2] = {4, 10}, colmajor[2] = {1, 4};
    reshard_fragment_t f = {tv, b, start, ext, 6, colmajor};
    assert_int_equal(reshard_layout_add_fragment(*dst, &f), 0);
  }
}

static reshard_comm_t *create_with_mpi(void) {
  mock_reset(mpi_rank, mpi_size);
  reshard_comm_t *comm = NULL;
  reshard_result_t r = reshard_comm_create_nccl_with_mpi((ncclComm_t)0x1, MPI_COMM_WORLD, &comm);
  if (r) fail_msg("rank %d: comm_create_nccl_with_mpi: %s", mpi_rank, reshard_last_error());
  /* no agreement stream or scratch: the agreement is MPI's */
  assert_int_equal(M.mem, 0);
  assert_int_equal(M.streams, 0);
  assert_int_equal(reshard_comm_rank(comm), mpi_rank);
  assert_int_equal(reshard_comm_size(comm), mpi_size);
  return comm;
}

/* Plans agreed over MPI move the right data; NCCL's allreduce is never
 * called. */
static void mpi_agreement_data(void **state) {
  (void)state;
  reshard_comm_t *comm = create_with_mpi();
  reshard_layout_t *src, *dst;
  layouts_local(&src, &dst);
  reshard_options_t o = RESHARD_OPTIONS_INITIALIZER;
  o.timeout_ms = 20000;
  reshard_plan_t *plan;
  reshard_result_t r = reshard_plan_create(comm, src, dst, &o, &plan);
  if (r) fail_msg("rank %d: plan_create: %s", mpi_rank, reshard_last_error());
  M.plan = plan;
  assert_int_equal(plan->nsends + plan->nrecvs, 0);
  assert_true(plan->nlocal_copies > 0);
  reshard_selftest_t s, d;
  for (int step = 0; step < 2; step++) {
    assert_int_equal(reshard_selftest_alloc(&s, src, mpi_rank, step), 0);
    assert_int_equal(reshard_selftest_alloc(&d, dst, mpi_rank, -1), 0);
    M.np2p = 0;
    assert_int_equal(reshard_plan_execute(plan, (void *const *)s.ptr, (size_t)s.nbuf, (void *const *)d.ptr,
                                          (size_t)d.nbuf, (void *)0x99), 0);
    assert_int_equal(M.np2p, 0);
    assert_int_equal(reshard_selftest_check(&d, dst, mpi_rank, (uint64_t)step, "mock with_mpi"), 0);
    reshard_selftest_free(&s);
    reshard_selftest_free(&d);
  }
  assert_int_equal(M.allreduce_calls, 0);
  reshard_plan_destroy(plan);
  reshard_layout_destroy(src);
  reshard_layout_destroy(dst);
  reshard_comm_destroy(comm);
  assert_int_equal(M.mem, 0);
  assert_int_equal(M.streams, 0);
  assert_int_equal(M.events, 0);
}

/* Ranks that pass different options are told so on every rank, through
 * the MPI agreement (several ranks only). */
static void mpi_agreement_mismatch(void **state) {
  (void)state;
  if (mpi_size < 2) skip();
  reshard_comm_t *comm = create_with_mpi();
  reshard_layout_t *src, *dst;
  layouts_local(&src, &dst);
  reshard_options_t o = RESHARD_OPTIONS_INITIALIZER;
  o.timeout_ms = 20000;
  if (mpi_rank == 1) o.staging_bytes = 1 << 20;
  else o.staging_bytes = 2 << 20;
  reshard_plan_t *plan = NULL;
  assert_int_equal(reshard_plan_create(comm, src, dst, &o, &plan), RESHARD_ERROR_MISMATCH);
  assert_null(plan);
  assert_int_equal(M.allreduce_calls, 0);
  /* the communicator is still usable */
  o.staging_bytes = 2 << 20;
  assert_int_equal(reshard_plan_create(comm, src, dst, &o, &plan), 0);
  reshard_plan_destroy(plan);
  reshard_layout_destroy(src);
  reshard_layout_destroy(dst);
  reshard_comm_destroy(comm);
  assert_int_equal(M.mem, 0);
}

/* A rank that comes late: the waiting rank times out at its deadline
 * instead of hanging, cannot agree again, and its NCCL communicator is not
 * aborted (several ranks only). */
static void mpi_agreement_timeout(void **state) {
  (void)state;
  if (mpi_size < 2) skip();
  reshard_comm_t *comm = create_with_mpi();
  reshard_layout_t *src, *dst;
  layouts_local(&src, &dst);
  reshard_options_t o = RESHARD_OPTIONS_INITIALIZER;
  reshard_plan_t *plan = NULL;
  MPI_Barrier(MPI_COMM_WORLD);
  if (mpi_rank == 0) {
    o.timeout_ms = 200;
    double t0 = MPI_Wtime();
    assert_int_equal(reshard_plan_create(comm, src, dst, &o, &plan), RESHARD_ERROR_TIMEOUT);
    double dt = MPI_Wtime() - t0;
    assert_true(dt >= 0.15 && dt < 1.5);
    assert_non_null(strstr(reshard_last_error(), "over MPI did not complete"));
    assert_int_equal(M.aborts, 0);
    assert_int_equal(reshard_plan_create(comm, src, dst, &o, &plan), RESHARD_ERROR_INVALID_USAGE);
    assert_null(plan);
  } else {
    struct timespec ts = {2, 0};
    nanosleep(&ts, NULL);
    /* The first agreement pairs with rank 0's abandoned one (rank 0
     * progresses it in the barrier below; ranks beyond 1 join the same
     * collective); the second, which confirms that every rank built its
     * plan, never completes: no rank keeps a plan that rank 0 lacks. */
    o.timeout_ms = 1000;
    assert_int_equal(reshard_plan_create(comm, src, dst, &o, &plan), RESHARD_ERROR_TIMEOUT);
    assert_null(plan);
  }
  MPI_Barrier(MPI_COMM_WORLD);
  reshard_layout_destroy(src);
  reshard_layout_destroy(dst);
  reshard_comm_destroy(comm);
  assert_int_equal(M.mem, 0);
}

/* Bad arguments, a rank whose NCCL and MPI ranks differ (that rank:
 * INVALID_ARGUMENT, the others: REMOTE; nobody gets a communicator), and
 * an NCCL error seen before the agreement. */
static void mpi_create_errors(void **state) {
  (void)state;
  mock_reset(mpi_rank, mpi_size);
  reshard_comm_t *comm = (reshard_comm_t *)0x1;
  assert_int_equal(reshard_comm_create_nccl_with_mpi(NULL, MPI_COMM_WORLD, &comm), RESHARD_ERROR_INVALID_ARGUMENT);
  assert_null(comm);
  assert_int_equal(reshard_comm_create_nccl_with_mpi((ncclComm_t)0x1, MPI_COMM_NULL, &comm),
                   RESHARD_ERROR_INVALID_ARGUMENT);
  assert_int_equal(reshard_comm_create_nccl_with_mpi((ncclComm_t)0x1, MPI_COMM_WORLD, NULL),
                   RESHARD_ERROR_INVALID_ARGUMENT);
  /* rank 0's NCCL communicator claims one rank more than MPI has */
  if (mpi_rank == 0) M.size = mpi_size + 1;
  reshard_result_t r = reshard_comm_create_nccl_with_mpi((ncclComm_t)0x1, MPI_COMM_WORLD, &comm);
  assert_int_equal(r, mpi_rank == 0 ? RESHARD_ERROR_INVALID_ARGUMENT : RESHARD_ERROR_REMOTE);
  if (mpi_rank == 0) assert_non_null(strstr(reshard_last_error(), "NCCL rank 0 of"));
  assert_null(comm);
  assert_int_equal(M.mem, 0);
  assert_int_equal(M.streams, 0);
  /* an asynchronous NCCL error: reported before any agreement, on every
   * rank alike (no rank left waiting) */
  comm = create_with_mpi();
  reshard_layout_t *src, *dst;
  layouts_local(&src, &dst);
  reshard_options_t o = RESHARD_OPTIONS_INITIALIZER;
  o.timeout_ms = 20000;
  reshard_plan_t *plan = NULL;
  M.async_error = ncclRemoteError;
  assert_int_equal(reshard_plan_create(comm, src, dst, &o, &plan), RESHARD_ERROR_REMOTE);
  assert_null(plan);
  M.async_error = ncclSuccess;
  assert_int_equal(reshard_plan_create(comm, src, dst, &o, &plan), 0);
  assert_int_equal(M.allreduce_calls, 0);
  reshard_plan_destroy(plan);
  reshard_layout_destroy(src);
  reshard_layout_destroy(dst);
  reshard_comm_destroy(comm);
  assert_int_equal(M.mem, 0);
}

int main(int argc, char **argv) {
  MPI_Init(&argc, &argv);
  MPI_Comm_rank(MPI_COMM_WORLD, &mpi_rank);
  MPI_Comm_size(MPI_COMM_WORLD, &mpi_size);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(mpi_agreement_data),
      cmocka_unit_test(mpi_agreement_mismatch),
      cmocka_unit_test(mpi_agreement_timeout),
      cmocka_unit_test(mpi_create_errors),
  };
  int r = cmocka_run_group_tests(tests, NULL, NULL);
  /* every rank's verdict, so that mpirun fails when any rank did */
  int any = r;
  MPI_Allreduce(&r, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  MPI_Finalize();
  return any ? 1 : 0;
}
#else
int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(call_sequence), cmocka_unit_test(local_copies_data), cmocka_unit_test(alloc_failures),
      cmocka_unit_test(nccl_errors),   cmocka_unit_test(nonblocking),       cmocka_unit_test(stream_argument),
      cmocka_unit_test(random_worlds),   cmocka_unit_test(create_failures),
  };
  int r = cmocka_run_group_tests(tests, NULL, NULL);
  free(reach);
  return r;
}
#endif
