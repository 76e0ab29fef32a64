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
#include "device-emul/mock_device.h"
#include "kernels/rs_kernels.h"
#include "plan/plan.h"
#include "plan/relay.h"
#include "reshard.h"
#include "reshard_inproc.h"
#include "reshard_nccl.h"
#include "support/random_layout.h"
#include "transport/transport.h"
#include "reshard_selftest.h"

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
  /* what the communicator alone holds (the plan's device state, set up
   * with the plan, goes with it) */
  f->mem0 = M.mem, f->streams0 = M.streams, f->events0 = M.events;
  layouts_4(&f->src, &f->dst);
  reshard_options_t o = RESHARD_OPTIONS_INITIALIZER;
  o.staging_bytes = staging;
  o.timeout_ms = 200;
  reshard_result_t r = reshard_plan_create(f->comm, f->src, f->dst, &o, &f->plan);
  if (r) fail_msg("plan_create: %s", reshard_last_error());
  M.plan = f->plan;
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
    mop *start = mock_log(OP_CALLER, caller);
    (void)start;
    assert_int_equal(exec(&f, caller), 0);
    assert_int_equal(M.syncs, 0); /* no host synchronization */
    mock_log(OP_CALLER, caller);
    int n = M.nops;
    /* the agreement's group first (round -2 here), then the rounds in
     * order */
    int g = -1, hdr = -1;
    for (int i = 0; i < n; i++)
      if (M.ops[i].kind == OP_GROUP) {
        if (g < 0) hdr = i;
        M.ops[i].round = g < 0 ? -2 : g;
        g++;
      }
    assert_int_equal(g, p->nrounds);
    /* one header each way with every partner */
    assert_true(hdr >= 0);
    assert_int_equal(M.ops[hdr].nsend, 2 * (int)p->npeers);
    for (int j = M.ops[hdr].first_send; j < M.ops[hdr].first_send + M.ops[hdr].nsend; j++)
      assert_int_equal(M.p2p[j].bytes, sizeof(rs_dev_hdr));
    build_graph(n);
    /* the check precedes every write of a destination: all unpacks and
     * local copies */
    for (int i = 0; i < n; i++)
      if (M.ops[i].kind == OP_LAUNCH && M.ops[i].kind2 != 0) assert_true(before(hdr, i, n));
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
    assert_int_equal(mock_stream_drain((void *)0x99), 0);
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

/* Allocation failures of the device setup, which runs while the plan is
 * created: OUT_OF_MEMORY from plan_create, nothing leaked, and the
 * communicator serves once memory is back. */
static void alloc_failures(void **state) {
  (void)state;
  for (int which = 0; which < 4; which++) {
    mock_reset(1, 4);
    reshard_comm_t *comm;
    assert_int_equal(reshard_comm_create_nccl((ncclComm_t)0x1, &comm), 0);
    long mem0 = M.mem, streams0 = M.streams, events0 = M.events;
    reshard_layout_t *src, *dst;
    layouts_4(&src, &dst);
    reshard_options_t o = RESHARD_OPTIONS_INITIALIZER;
    o.staging_bytes = 4096;
    o.timeout_ms = 200;
    if (which < 3) M.fail_malloc_async_at = M.malloc_async_calls + which + 1;
    else M.fail_nccl_mem = 1;
    reshard_plan_t *plan = NULL;
    assert_int_equal(reshard_plan_create(comm, src, dst, &o, &plan), RESHARD_ERROR_OUT_OF_MEMORY);
    assert_non_null(strstr(reshard_last_error(), which < 3 ? "cudaMallocAsync" : "ncclMemAlloc"));
    assert_null(plan);
    assert_int_equal(M.mem, mem0);
    assert_int_equal(M.streams, streams0);
    assert_int_equal(M.events, events0);
    M.fail_malloc_async_at = 0, M.fail_nccl_mem = 0;
    assert_int_equal(reshard_plan_create(comm, src, dst, &o, &plan), 0);
    float sbuf[1024] = {0}, dbuf[1024] = {0};
    void *sp[1] = {sbuf}, *dp[1] = {dbuf};
    assert_int_equal(reshard_plan_execute(plan, sp, 1, dp, 1, NULL), 0);
    reshard_plan_destroy(plan);
    assert_int_equal(M.mem, mem0);
    reshard_layout_destroy(src);
    reshard_layout_destroy(dst);
    reshard_comm_destroy(comm);
    assert_int_equal(M.mem, 0);
    assert_int_equal(M.streams, 0);
    assert_int_equal(M.events, 0);
  }
}

/* Failures while creating the communicator or agreeing on a plan: the
 * right code and nothing left behind. */
static void create_failures(void **state) {
  (void)state;
  mock_reset(0, 4);
  reshard_comm_t *comm = NULL;
  M.fail_malloc_async_at = M.malloc_async_calls + 1; /* the agreement's scratch */
  assert_int_equal(reshard_comm_create_nccl((ncclComm_t)0x1, &comm), RESHARD_ERROR_OUT_OF_MEMORY);
  assert_null(comm);
  assert_int_equal(M.mem, 0);
  assert_int_equal(M.streams, 0);
  assert_int_equal(M.events, 0);
  assert_int_equal(world.parent_aborts + world.parent_destroys, 0); /* never the caller's */
  M.fail_malloc_async_at = 0;
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
  int relay;           /* options.relay */
  const char *topology; /* options.topology */
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
  o.relay = a->relay;
  o.topology = a->topology;
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
    } else if (mock_stream_drain(NULL)) {
      a->failed = 1;
    } else {
      a->bad += reshard_selftest_check_from(&d, a->pair->dst, a->pair->src, a->rank, (uint64_t)step, "mock world");
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
  /* RS_SEED0, RS_IT0, RS_ITERS replay a failure (seed = seed0 + it * 104729) */
  const char *e0 = getenv("RS_SEED0"), *ei = getenv("RS_ITERS"), *ef = getenv("RS_IT0");
  uint64_t seed0 = e0 ? strtoull(e0, NULL, 10) : (uint64_t)time(NULL);
  int iters = ei ? atoi(ei) : 300, it0 = ef ? atoi(ef) : 0;
  for (int it = it0; it < it0 + iters; it++) {
    uint64_t seed = seed0 + (uint64_t)it * 104729;
    rl_pair pair;
    /* every fifth world converts dtypes: the kernels' casts */
    if (rl_pair_make(seed, it % 5 == 2 ? RL_CASTS : RL_ANY, &pair))
      fail_msg("seed %llu: layout generation failed", (unsigned long long)seed);
    int n = pair.nranks;
    assert_true(n <= MAXR);
    mock_world_begin(n, it % 2 ? 1 : 0); /* channels of one message, or unbounded */
    rank_arg args[MAXR];
    pthread_t th[MAXR];
    size_t staging = it % 3 == 0 ? (size_t)1 << 20 : it % 3 == 1 ? 4096 : 16384; /* few or many rounds */
    /* direct, relay (every part, however small), or the cost model's
     * choice on a topology */
    int relay = it % 4 == 1 ? 1 : it % 4 == 3 ? -1 : 0;
    const char *topo = it % 4 == 3 ? "h100-8x400g" : NULL;
    rs_relay_min_part_bytes = relay ? 0 : RS_RELAY_MIN_PART_DEFAULT;
    for (int r = 0; r < n; r++) {
      args[r] = (rank_arg){&pair, staging, relay, topo, r, 0, 0};
      pthread_create(&th[r], NULL, rank_main, &args[r]);
    }
    int64_t bad = 0;
    int failed = 0;
    for (int r = 0; r < n; r++) {
      pthread_join(th[r], NULL);
      bad += args[r].bad;
      failed += args[r].failed;
    }
    long bad_size = world.bad_size, hangs = world.hangs;
    mock_world_end();
    failed += (int)world.leftover; /* a message nobody received */
    if (bad || failed || bad_size || hangs) {
      rl_pair_print(&pair, stderr);
      fail_msg("seed %llu (%d ranks, staging %zu, relay %d): %lld wrong, %d ranks failed, %ld size mismatches, "
               "%ld hangs", (unsigned long long)seed, n, staging, relay, (long long)bad, failed, bad_size, hangs);
    }
    rl_pair_free(&pair);
  }
  /* the worlds did exchange data (not only local copies) */
  printf("random worlds: %ld messages delivered\n", world.delivered);
  rs_relay_min_part_bytes = RS_RELAY_MIN_PART_DEFAULT;
  if (iters >= 300) assert_true(world.delivered > 1000);
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
    assert_int_equal(mock_stream_drain((void *)0x99), 0);
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
   * rank alike (no rank left waiting); NCCL requires the communicator's
   * abort then, so reshard's is gone and later plans are refused */
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
  assert_int_equal(M.aborts, 1);
  assert_int_equal(reshard_plan_create(comm, src, dst, &o, &plan), RESHARD_ERROR_INVALID_USAGE);
  assert_non_null(strstr(reshard_last_error(), "aborted"));
  assert_null(plan);
  assert_int_equal(M.allreduce_calls, 0);
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
