/* Relay plans (options.relay = 1): destination replicas forward to each
 * other, so each unique byte leaves the source side once and enters each
 * destination domain once.
 *
 * Every case executes for real over the in-process transport, several
 * steps, and checks every destination element and every byte outside the
 * fragments (support/harness). Plan-level checks read each rank's stats
 * and peer stats:
 *   - source egress: in a non-colocated relay plan, the bytes all source
 *     ranks send equal the bytes of the destination tensors;
 *   - domain ingress: each destination domain receives from outside
 *     itself exactly the bytes of the tensor elements its ranks hold.
 *
 * dense_flat          tp=2 -> tp=2 x dp=4, no topology: fused qkv and
 *                     gate_up destination buffers, uneven shards, several
 *                     tensors, a 4 KiB staging budget (many rounds,
 *                     forwards interleaved with primary messages);
 *                     relay 0 and 1 write identical destination bytes
 * topology_h100       8 source + 32 destination ranks on h100-8x400g:
 *                     replicas spread across and within nodes, so entries
 *                     and second hops occur
 * random_topology     seeded random meshes and shuffled rank lists on
 *                     h100-8x400g (40 ranks)
 * random_pairs        support/random_layout pairs with relay = 1
 * threshold           the default part threshold keeps small tensors
 *                     direct and relays large ones; relay -1 and 0 plan
 *                     direct
 * colocated           a member holding source data stays direct
 * stream_counts       forwards are one stream per (sender, receiver), not
 *                     one per (source, sender, receiver)
 * replica_choice      with a topology, a cell held in the receiver's domain
 *                     comes from there only (direct plans)
 * device_transport    relay = 1 on a device transport plans the same relay
 *                     plan as on a host transport (same bytes per rank)
 * forwards_as_ready   an owner's forwards go in the order their bytes
 *                     land, not in box order, and end with the network's
 *                     rounds
 * models              tiny llama Megatron tp=2 -> vLLM tp=2 x dp=4
 *
 * Seeds are printed on failure; RS_RELAY_SEED=<seed> replays one,
 * RS_RELAY_COUNT=<n> changes the number of random cases. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "reshard_models.h"
#include "plan/relay.h"
#include "plan/topology.h"
#include "reshard.h"
#include "support/harness.h"
#include "support/test_scale.h"
#include "support/random_layout.h"
#include "transport/stream.h"
#include "transport/transport.h"

#define MAXRANKS 64

/* ---- one collective run with per-rank stats ---- */

typedef struct run {
  const reshard_layout_t *src, *dst;
  reshard_options_t opts;
  int steps;
  /* results */
  int failures;
  int64_t bad;
  reshard_plan_stats_t stats[MAXRANKS];
  reshard_peer_stats_t *peers[MAXRANKS];
  size_t npeers[MAXRANKS];
  uint64_t dst_hash[MAXRANKS]; /* every destination byte, after the last step */
} run;

static pthread_mutex_t run_lock = PTHREAD_MUTEX_INITIALIZER;

static uint64_t hash_side(const th_side *s) {
  uint64_t h = 0xcbf29ce484222325ULL;
  for (int b = 0; b < s->nbuf; b++)
    for (size_t i = 0; s->ptr[b] && i < s->bytes[b]; i++) {
      h ^= s->ptr[b][i];
      h *= 0x100000001b3ULL;
    }
  return h;
}

static int run_rank(int rank, reshard_comm_t *comm, void *arg) {
  run *a = arg;
  reshard_plan_t *plan = NULL;
  int fails = 0;
  int64_t bad = 0;
  reshard_result_t r = reshard_plan_create(comm, a->src, a->dst, &a->opts, &plan);
  if (r) {
    fprintf(stderr, "rank %d: plan_create: %s: %s\n", rank, reshard_result_string(r), reshard_last_error());
    pthread_mutex_lock(&run_lock);
    a->failures++;
    pthread_mutex_unlock(&run_lock);
    return 1;
  }
  size_t np = 0;
  reshard_plan_get_stats(plan, &a->stats[rank]);
  reshard_plan_get_peer_stats(plan, NULL, 0, &np);
  a->peers[rank] = calloc(np + 1, sizeof *a->peers[rank]);
  reshard_plan_get_peer_stats(plan, a->peers[rank], np, &a->npeers[rank]);
  th_side dst;
  if (th_side_alloc(&dst, a->dst, rank, -1)) fails++;
  for (int step = 0; step < a->steps && !fails; step++) {
    th_side src;
    if (th_side_alloc(&src, a->src, rank, step)) {
      fails++;
      break;
    }
    r = reshard_plan_execute(plan, (void *const *)src.ptr, (size_t)src.nbuf, (void *const *)dst.ptr, (size_t)dst.nbuf, NULL);
    if (r) {
      fprintf(stderr, "rank %d step %d: execute: %s: %s\n", rank, step, reshard_result_string(r), reshard_last_error());
      fails++;
    } else {
      bad += th_side_check(&dst, a->dst, rank, (uint64_t)step, "relay");
    }
    th_side_free(&src);
  }
  a->dst_hash[rank] = hash_side(&dst);
  th_side_free(&dst);
  reshard_plan_destroy(plan);
  pthread_mutex_lock(&run_lock);
  a->bad += bad;
  a->failures += fails;
  pthread_mutex_unlock(&run_lock);
  return fails || bad;
}

static int64_t run_all(int nranks, run *a) {
  assert_true(nranks <= MAXRANKS);
  a->bad = 0;
  a->failures = 0;
  memset(a->peers, 0, sizeof a->peers);
  th_run_ranks(nranks, run_rank, a);
  return a->failures ? -1 : a->bad;
}

static void run_free(run *a, int nranks) {
  for (int r = 0; r < nranks; r++) {
    free(a->peers[r]);
    a->peers[r] = NULL;
  }
}

/* ---- what the plans should move ---- */

/* Bytes of the distinct tensor elements that the ranks with in[rank] set
 * hold on layout L (each element counted once however many hold it). */
static uint64_t unique_bytes(const reshard_layout_t *L, int nranks, const unsigned char *in) {
  uint64_t total = 0;
  for (int t = 0;; t++) {
    const char *name;
    reshard_dtype_t dt;
    int nd;
    int64_t shape[RESHARD_MAX_DIMS];
    if (reshard_layout_tensor_info(L, t, &name, &dt, &nd, shape) != RESHARD_SUCCESS) break;
    int64_t n = 1;
    for (int d = 0; d < nd; d++) n *= shape[d];
    unsigned char *seen = calloc((size_t)n + 1, 1);
    assert_non_null(seen);
    for (int r = 0; r < nranks; r++) {
      if (!in[r]) continue;
      size_t nf = 0;
      assert_int_equal(reshard_layout_fragments(L, r, NULL, 0, &nf), 0);
      reshard_fragment_info_t *f = calloc(nf + 1, sizeof *f);
      assert_int_equal(reshard_layout_fragments(L, r, f, nf, &nf), 0);
      for (size_t i = 0; i < nf; i++) {
        if (f[i].tensor_id != t) continue;
        int64_t cnt = 1, idx[RESHARD_MAX_DIMS] = {0};
        for (int d = 0; d < nd; d++) cnt *= f[i].extent[d];
        for (int64_t e = 0; e < cnt; e++) {
          int64_t lin = 0;
          for (int d = 0; d < nd; d++) lin = lin * shape[d] + f[i].start[d] + idx[d];
          seen[lin] = 1;
          for (int d = nd - 1; d >= 0 && ++idx[d] == f[i].extent[d]; d--) idx[d] = 0;
        }
      }
      free(f);
    }
    for (int64_t e = 0; e < n; e++) total += seen[e] * reshard_dtype_size(dt);
    free(seen);
  }
  return total;
}

/* Each byte leaves the source side once: what the source-only ranks send
 * is exactly the destination's distinct bytes. */
static void check_source_egress(const run *a, int nranks, const unsigned char *is_src) {
  unsigned char all[MAXRANKS] = {0};
  for (int r = 0; r < nranks; r++) all[r] = 1;
  uint64_t want = unique_bytes(a->dst, nranks, all), sent = 0;
  for (int r = 0; r < nranks; r++)
    if (is_src[r]) sent += a->stats[r].send_bytes;
  if (sent != want) fprintf(stderr, "source egress: %" PRIu64 " bytes sent, the destination has %" PRIu64 "\n", sent, want);
  assert_int_equal(sent, want);
}

/* Each destination domain receives each byte it holds from outside
 * itself once: the bytes its ranks receive from ranks of other domains
 * are the distinct bytes they hold. */
static void check_domain_ingress(const run *a, int nranks, const int32_t *domain, const unsigned char *is_dst) {
  for (int X = 0; X < MAXRANKS; X++) {
    unsigned char in[MAXRANKS] = {0};
    int any = 0;
    for (int r = 0; r < nranks; r++) {
      in[r] = is_dst[r] && domain[r] == X;
      any |= in[r];
    }
    if (!any) continue;
    uint64_t want = unique_bytes(a->dst, nranks, in), got = 0;
    for (int r = 0; r < nranks; r++) {
      if (!in[r]) continue;
      for (size_t i = 0; i < a->npeers[r]; i++)
        if (domain[a->peers[r][i].peer] != X) got += a->peers[r][i].recv_bytes;
    }
    if (got != want) fprintf(stderr, "domain %d: %" PRIu64 " bytes from outside, holds %" PRIu64 "\n", X, got, want);
    assert_int_equal(got, want);
  }
}

/* ---- layouts ---- */

/* A tensor of each side: name, dtype, shape. */
typedef struct tdesc {
  const char *name;
  reshard_dtype_t dtype;
  int ndim;
  int64_t shape[2];
} tdesc;

static int add_tensors(reshard_layout_t *L, const tdesc *t, int n, int *ids) {
  for (int i = 0; i < n; i++)
    if (reshard_layout_add_tensor(L, t[i].name, t[i].dtype, t[i].ndim, t[i].shape, &ids[i])) return -1;
  return 0;
}

/* The dense model of dense_flat and topology_h100: q, k, v, gate, up, an
 * embedding with rows not divisible by tp, an output layer sharded over
 * columns and a replicated norm. */
static const tdesc model[] = {
    {"q", RESHARD_FP32, 2, {256, 64}},     {"k", RESHARD_FP32, 2, {64, 64}},      {"v", RESHARD_FP32, 2, {64, 64}},
    {"gate", RESHARD_BF16, 2, {192, 64}}, {"up", RESHARD_BF16, 2, {192, 64}},   {"embed", RESHARD_FP32, 2, {1001, 24}},
    {"out", RESHARD_FP16, 2, {40, 77}},    {"norm", RESHARD_FP32, 1, {64, 0}},
};
enum { NMODEL = sizeof model / sizeof *model };

/* Training side: tp ranks (x dp replicas) over `ranks`, mesh [dp, tp],
 * every tensor in its own buffer. */
static reshard_layout_t *train_side(const int *ranks, int dp, int tp) {
  reshard_layout_t *L;
  int ids[NMODEL], mesh, b;
  assert_int_equal(reshard_layout_create(&L), 0);
  assert_int_equal(add_tensors(L, model, NMODEL, ids), 0);
  int shape[2] = {dp, tp};
  assert_int_equal(reshard_layout_add_mesh(L, 2, shape, ranks, &mesh), 0);
  for (int i = 0; i < NMODEL; i++) {
    reshard_placement_t p[2] = {reshard_replicate(), reshard_shard(0)};
    if (!strcmp(model[i].name, "out")) p[1] = reshard_shard(1);
    if (!strcmp(model[i].name, "norm")) p[1] = reshard_replicate();
    assert_int_equal(reshard_layout_place(L, ids[i], mesh, p, &b), 0);
  }
  return L;
}

/* Inference side, mesh [dp, tp] over `ranks`: q, k, v fused into qkv and
 * gate, up into gate_up (vLLM), embed with explicit uneven split sizes,
 * the rest in their own buffers. */
static reshard_layout_t *infer_side(const int *ranks, int dp, int tp) {
  reshard_layout_t *L;
  int ids[NMODEL], mesh, b;
  assert_int_equal(reshard_layout_create(&L), 0);
  assert_int_equal(add_tensors(L, model, NMODEL, ids), 0);
  int shape[2] = {dp, tp};
  assert_int_equal(reshard_layout_add_mesh(L, 2, shape, ranks, &mesh), 0);
  reshard_placement_t rs0[2] = {reshard_replicate(), reshard_shard(0)};
  reshard_part_t qkv[3] = {{ids[0], mesh, rs0, NULL}, {ids[1], mesh, rs0, NULL}, {ids[2], mesh, rs0, NULL}};
  assert_int_equal(reshard_layout_add_fused(L, "qkv", 0, 1, 3, qkv, &b), 0);
  reshard_part_t gu[2] = {{ids[3], mesh, rs0, NULL}, {ids[4], mesh, rs0, NULL}};
  assert_int_equal(reshard_layout_add_fused(L, "gate_up", 0, 1, 2, gu, &b), 0);
  int64_t *sizes = calloc((size_t)tp, sizeof *sizes);
  int64_t left = model[5].shape[0];
  for (int i = 0; i < tp; i++) {
    sizes[i] = i == tp - 1 ? left : left / tp + 3 * (i + 1);
    left -= sizes[i];
  }
  reshard_placement_t emb[2] = {reshard_replicate(), reshard_shard_sizes(0, sizes)};
  assert_int_equal(reshard_layout_place(L, ids[5], mesh, emb, &b), 0);
  free(sizes);
  reshard_placement_t col[2] = {reshard_replicate(), reshard_shard(1)};
  assert_int_equal(reshard_layout_place(L, ids[6], mesh, col, &b), 0);
  reshard_placement_t rep[2] = {reshard_replicate(), reshard_replicate()};
  assert_int_equal(reshard_layout_place(L, ids[7], mesh, rep, &b), 0);
  return L;
}

static void seq(int *ranks, int n, int first) {
  for (int i = 0; i < n; i++) ranks[i] = first + i;
}

static reshard_options_t relay_opts(int relay, size_t staging) {
  reshard_options_t o = RESHARD_OPTIONS_INITIALIZER;
  o.relay = relay;
  if (staging) o.staging_bytes = staging;
  o.timeout_ms = 120000;
  return o;
}

/* Sum over ranks of the bytes sent. */
static uint64_t sent_by(const run *a, int nranks, const unsigned char *who) {
  uint64_t s = 0;
  for (int r = 0; r < nranks; r++)
    if (who[r]) s += a->stats[r].send_bytes;
  return s;
}

/* One weight "w" of dtype dt and shape[nd], placed by p on a mesh of
 * dims[mnd] over ranks. */
static reshard_layout_t *one_weight(reshard_dtype_t dt, int nd, const int64_t *shape, int mnd, const int *dims,
                                    const int *ranks, const reshard_placement_t *p) {
  reshard_layout_t *L;
  int t, m, b;
  assert_int_equal(reshard_layout_create(&L), 0);
  assert_int_equal(reshard_layout_add_tensor(L, "w", dt, nd, shape, &t), 0);
  assert_int_equal(reshard_layout_add_mesh(L, mnd, dims, ranks, &m), 0);
  assert_int_equal(reshard_layout_place(L, t, m, p, &b), 0);
  return L;
}

/* A run of S -> D with options o for `steps` steps, no results yet. */
static void run_setup(run *a, const reshard_layout_t *S, const reshard_layout_t *D, reshard_options_t o, int steps) {
  memset(a, 0, sizeof *a);
  a->src = S;
  a->dst = D;
  a->opts = o;
  a->steps = steps;
}

/* ---- tests ---- */

static void dense_flat(void **state) {
  (void)state;
  rs_relay_min_part_bytes = 0;
  enum { N = 10 };
  int sr[2], dr[8];
  seq(sr, 2, 0);
  seq(dr, 8, 2);
  reshard_layout_t *S = train_side(sr, 1, 2), *D = infer_side(dr, 4, 2);
  unsigned char is_src[N] = {1, 1}, is_dst[N];
  int32_t flat[N];
  for (int r = 0; r < N; r++) {
    is_dst[r] = r >= 2;
    flat[r] = r;
  }
  static run a, b;
  size_t stagings[3] = {0, 4096, 65536};
  for (int k = 0; k < 3; k++) {
    run_setup(&b, S, D, relay_opts(0, stagings[k]), 3);
    assert_int_equal(run_all(N, &b), 0);

    run_setup(&a, S, D, relay_opts(1, stagings[k]), 3);
    assert_int_equal(run_all(N, &a), 0);
    check_source_egress(&a, N, is_src);
    check_domain_ingress(&a, N, flat, is_dst);
    /* a direct plan sends every replica its bytes from the source side */
    uint64_t per_replica = 0;
    for (int r = 0; r < N; r++) {
      unsigned char one[N] = {0};
      one[r] = 1;
      per_replica += unique_bytes(D, N, one);
    }
    assert_int_equal(sent_by(&b, N, is_src), per_replica);
    assert_true(per_replica > 3 * sent_by(&a, N, is_src));
    /* forwards are counted: destination ranks send */
    assert_true(sent_by(&a, N, is_dst) > 0);
    if (stagings[k] == 4096) assert_true(a.stats[2].num_chunks > 20);
    /* relay 0 and 1 leave identical destination bytes */
    for (int r = 0; r < N; r++) assert_true(b.dst_hash[r] == a.dst_hash[r]);
    /* verify mode checks forwards too: sender and receiver of every
     * relayed box agree on its checksum */
    static run v;
    run_setup(&v, S, D, relay_opts(1, stagings[k]), 3);
    v.opts.flags = RESHARD_FLAG_VERIFY;
    assert_int_equal(run_all(N, &v), 0);
    for (int r = 0; r < N; r++) assert_true(v.dst_hash[r] == a.dst_hash[r]);
    run_free(&v, N);
    run_free(&a, N);
    run_free(&b, N);
  }
  reshard_layout_destroy(S);
  reshard_layout_destroy(D);
  rs_relay_min_part_bytes = RS_RELAY_MIN_PART_DEFAULT;
}

/* Runs S -> D over n ranks on h100-8x400g with relay, checks bytes,
 * domain ingress and (when egress_once) source egress: with 256-byte
 * parts a fragment too small for one part per replica stays direct when
 * its replicas are on different domains, and leaves the sources once per
 * replica. */
static void topo_case(const reshard_layout_t *S, const reshard_layout_t *D, int n, size_t staging, const char *what,
                      int egress_once) {
  static run a;
  run_setup(&a, S, D, relay_opts(1, staging), 2);
  a.opts.topology = "h100-8x400g";
  int64_t bad = run_all(n, &a);
  if (bad) fprintf(stderr, "%s: %lld bad\n", what, (long long)bad);
  assert_int_equal(bad, 0);
  rs_topology t;
  rs_rank_map map;
  assert_int_equal(rs_topology_preset("h100-8x400g", &t), 0);
  assert_int_equal(rs_rank_map_build(&t, S, D, n, &map), 0);
  unsigned char is_src[MAXRANKS] = {0}, is_dst[MAXRANKS] = {0};
  for (int r = 0; r < n; r++) {
    size_t nf = 0;
    reshard_layout_fragments(S, r, NULL, 0, &nf);
    is_src[r] = nf > 0;
    reshard_layout_fragments(D, r, NULL, 0, &nf);
    is_dst[r] = nf > 0;
  }
  int colocated = 0;
  for (int r = 0; r < n; r++) colocated |= is_src[r] && is_dst[r];
  if (!colocated) { /* colocated fragments copy locally, some stay direct */
    if (egress_once) check_source_egress(&a, n, is_src);
    check_domain_ingress(&a, n, map.domain, is_dst);
  }
  rs_rank_map_free(&map);
  run_free(&a, n);
}

/* Relay on h100-8x400g: source tp=4 x 2 replicas on ranks 0..7, the
 * destination [dp, tp] on ranks 8..39, each case executed and checked by
 * topo_case. The rows vary the destination mesh, the order of its ranks
 * (shuffle: a seed, 0 for rank order), the staging budget and the
 * smallest relay part (min_part: rs_relay_min_part_bytes). */
typedef struct topo_row {
  const char *name;
  int dp, tp;
  uint64_t shuffle;
  size_t staging;
  uint64_t min_part;
} topo_row;

static topo_row topo_rows[] = {
    /* [dp=16, tp=2] in rank order: each group has 4 members in each of the
     * 4 destination nodes (entries and second hops) */
    {"topology_h100/dp16_tp2", 16, 2, 0, 0, 0},
    {"topology_h100/dp16_tp2_small_staging", 16, 2, 0, 8192, 0},
    /* [dp=4, tp=8] with the ranks dealt so that groups have 1, 2 and 3
     * members in a node */
    {"topology_h100/dp4_tp8_shuffled", 4, 8, 77, 0, 0},
    /* 256-byte parts (few_parts checks the part counts) */
    {"few_parts/dp16_tp2", 16, 2, 0, 0, 256},
    {"few_parts/dp16_tp2_small_staging", 16, 2, 0, 8192, 256},
    {"few_parts/dp8_tp4", 8, 4, 0, 0, 256},
};

static void topology_case(void **state) {
  const topo_row *row = *state;
  rs_relay_min_part_bytes = row->min_part;
  int sr[8], dr[32];
  seq(sr, 8, 0);
  seq(dr, 32, 8);
  uint64_t s = row->shuffle;
  for (int i = 31; row->shuffle && i > 0; i--) {
    int j = (int)(th_rand(&s) % (uint64_t)(i + 1));
    int x = dr[i];
    dr[i] = dr[j];
    dr[j] = x;
  }
  reshard_layout_t *S = train_side(sr, 2, 4), *D = infer_side(dr, row->dp, row->tp);
  topo_case(S, D, 40, row->staging, row->name, 1);
  reshard_layout_destroy(D);
  reshard_layout_destroy(S);
  rs_relay_min_part_bytes = RS_RELAY_MIN_PART_DEFAULT;
}

/* Parts of at least 256 bytes: the norm (256 bytes, 32 replicas, 8 in
 * each of 4 nodes) travels as one part, the output layer's fragments
 * (3 KiB at tp=2, 16 replicas) as 12, at tp=4 (1.5 KiB, 8 replicas) as 6;
 * every fragment still leaves the sources once and enters each node once,
 * byte-exact (the few_parts/ rows of topo_rows execute these). */
static void few_parts(void **state) {
  (void)state;
  rs_relay_min_part_bytes = 256;
  enum { N = 40 };
  int sr[8], dr[32];
  seq(sr, 8, 0);
  seq(dr, 32, 8);
  reshard_layout_t *S = train_side(sr, 2, 4), *D = infer_side(dr, 16, 2);
  rs_topology t;
  rs_rank_map map;
  assert_int_equal(rs_topology_preset("h100-8x400g", &t), 0);
  assert_int_equal(rs_rank_map_build(&t, S, D, N, &map), 0);
  rs_relay_ctx ctx = {.src = S, .dst = D, .domain = map.domain, .min_part_bytes = 256};
  size_t nf = 0;
  assert_int_equal(reshard_layout_fragments(D, 8, NULL, 0, &nf), 0);
  assert_true(nf > 0);
  rs_frag_vec mine = {0};
  assert_int_equal(rs_layout_rank_fragments(D, 8, &mine), 0);
  int seen_one = 0;
  for (size_t i = 0; i < mine.n; i++) {
    rs_relay_group g;
    int st;
    assert_int_equal(reshard_layout_find_tensor(S, D->tensors[mine.v[i].tensor].name, &st), 0);
    assert_int_equal(rs_relay_group_of(&ctx, &mine.v[i], st, reshard_dtype_size(D->tensors[mine.v[i].tensor].dtype), &g), 0);
    if (!strcmp(D->tensors[mine.v[i].tensor].name, "norm")) {
      assert_int_equal(g.m, 32);
      assert_int_equal(g.nparts, 1);
      seen_one = 1;
    }
    assert_true(g.nparts >= 1 && g.nparts <= g.m);
  }
  assert_true(seen_one);
  /* without a topology every rank is its own domain: the norm, too small
   * for 32 parts, stays direct */
  rs_relay_ctx_free(&ctx);
  ctx = (rs_relay_ctx){.src = S, .dst = D, .min_part_bytes = 256};
  for (size_t i = 0; i < mine.n; i++) {
    if (strcmp(D->tensors[mine.v[i].tensor].name, "norm")) continue;
    rs_relay_group g;
    int st;
    assert_int_equal(reshard_layout_find_tensor(S, "norm", &st), 0);
    assert_int_equal(rs_relay_group_of(&ctx, &mine.v[i], st, 4, &g), 0);
    assert_int_equal(g.m, 0);
  }
  rs_frag_vec_free(&mine);
  rs_relay_ctx_free(&ctx);
  rs_rank_map_free(&map);
  reshard_layout_destroy(D);
  reshard_layout_destroy(S);
  rs_relay_min_part_bytes = RS_RELAY_MIN_PART_DEFAULT;
}

static uint64_t first_seed(uint64_t dflt, int *count) {
  const char *n = getenv("RS_RELAY_COUNT");
  if (n && *n) *count = atoi(n);
  const char *e = getenv("RS_RELAY_SEED");
  if (e && *e) {
    *count = 1;
    return strtoull(e, NULL, 0);
  }
  return dflt;
}

/* Random [dp, tp] meshes over shuffled destination ranks and random
 * source sharding, on h100-8x400g; a third of the cases colocated (the
 * destination drawn from all 40 ranks). */
static void random_topology(void **state) {
  (void)state;
  int count = (int)rs_test_scaled(18);
  uint64_t seed0 = first_seed(5000, &count);
  for (int c = 0; c < count; c++) {
    uint64_t seed = seed0 + (uint64_t)c, s = seed * 0x9E3779B97F4A7C15ULL + 1;
    th_rand(&s);
    static const int divs[] = {1, 2, 4, 8};
    int stp = divs[th_rand_range(&s, 0, 3)];
    int sdp = 8 / stp;
    int ndst = (int)th_rand_range(&s, 2, 32);
    int dtp = divs[th_rand_range(&s, 0, 3)];
    while (ndst % dtp) dtp /= 2;
    int ddp = ndst / dtp;
    int sr[8], dr[40];
    int colocate = th_rand_range(&s, 0, 2) == 0, pool = colocate ? 40 : 32;
    seq(sr, 8, 0);
    seq(dr, pool, colocate ? 0 : 8);
    for (int i = pool - 1; i > 0; i--) {
      int j = (int)(th_rand(&s) % (uint64_t)(i + 1));
      int x = dr[i];
      dr[i] = dr[j];
      dr[j] = x;
    }
    int n = 8;
    for (int i = 0; i < ndst; i++)
      if (dr[i] + 1 > n) n = dr[i] + 1;
    reshard_layout_t *S = train_side(sr, sdp, stp), *D = infer_side(dr, ddp, dtp);
    /* 256-byte parts: the smallest fragments (the norm's) still relay,
     * in fewer parts than members */
    rs_relay_min_part_bytes = th_rand_range(&s, 0, 1) ? 256 : 0;
    char what[160];
    snprintf(what, sizeof what, "seed %" PRIu64 ": source [%d, %d], destination [%d, %d] over %d ranks%s, parts >= %" PRIu64 " B",
             seed, sdp, stp, ddp, dtp, n, colocate ? ", colocated" : "", rs_relay_min_part_bytes);
    fprintf(stderr, "random_topology %s\n", what);
    topo_case(S, D, n, th_rand_range(&s, 0, 1) ? 0 : 8192, what, rs_relay_min_part_bytes == 0);
    reshard_layout_destroy(S);
    reshard_layout_destroy(D);
  }
  rs_relay_min_part_bytes = RS_RELAY_MIN_PART_DEFAULT;
}

static void random_pairs(void **state) {
  (void)state;
  rs_relay_min_part_bytes = 0;
  int count = (int)rs_test_scaled(300), failed = 0;
  uint64_t seed0 = first_seed(9000000, &count);
  for (int c = 0; c < count; c++) {
    uint64_t seed = seed0 + (uint64_t)c;
    rl_pair p;
    if (rl_pair_make(seed, seed % 4 == 0 ? RL_FULL_REPLICAS : RL_ANY, &p)) {
      fprintf(stderr, "seed %" PRIu64 ": generator failed\n", seed);
      failed++;
      continue;
    }
    th_sync_args a = {.src = p.src, .dst = p.dst, .opts = relay_opts(1, seed % 3 == 0 ? 4096 : 0), .steps = 2};
    if (seed % 6 == 0) a.opts.chunk_bytes = (size_t)(64 + seed % 200);
    int64_t bad = th_sync(p.nranks, &a);
    if (bad) {
      fprintf(stderr, "seed %" PRIu64 ": %lld bad (RS_RELAY_SEED=%" PRIu64 " replays)\n", seed, (long long)bad, seed);
      if (failed < 2) rl_pair_print(&p, stderr);
      failed++;
    }
    rl_pair_free(&p);
  }
  rs_relay_min_part_bytes = RS_RELAY_MIN_PART_DEFAULT;
  assert_int_equal(failed, 0);
}

/* With the default threshold, a fragment whose parts would be under
 * RS_RELAY_MIN_PART_DEFAULT stays direct: source egress counts it once
 * per replica, a large one once. relay -1 plans like 0. */
static void threshold(void **state) {
  (void)state;
  reshard_layout_t *S, *D;
  int t, m, b;
  int64_t big[2] = {512, 512}, small[1] = {4096};
  assert_int_equal(reshard_layout_create(&S), 0);
  assert_int_equal(reshard_layout_create(&D), 0);
  reshard_layout_t *L[2] = {S, D};
  for (int k = 0; k < 2; k++) {
    assert_int_equal(reshard_layout_add_tensor(L[k], "big", RESHARD_FP32, 2, big, &t), 0);
    assert_int_equal(reshard_layout_add_tensor(L[k], "small", RESHARD_FP32, 1, small, &t), 0);
    int n = k ? 2 : 1;
    assert_int_equal(reshard_layout_add_mesh_strided(L[k], 1, &n, k, 1, &m), 0);
    reshard_placement_t p[1] = {reshard_replicate()};
    for (int i = 0; i < 2; i++) assert_int_equal(reshard_layout_place(L[k], i, m, p, &b), 0);
  }
  unsigned char is_src[3] = {1, 0, 0};
  static run a;
  int relays[3] = {1, 0, -1};
  uint64_t want[3] = {512 * 512 * 4 + 2 * 4096 * 4, 2 * (512 * 512 * 4 + 4096 * 4), 2 * (512 * 512 * 4 + 4096 * 4)};
  for (int k = 0; k < 3; k++) {
    run_setup(&a, S, D, relay_opts(relays[k], 0), 2);
    assert_int_equal(run_all(3, &a), 0);
    assert_int_equal(sent_by(&a, 3, is_src), want[k]);
    run_free(&a, 3);
  }
  reshard_layout_destroy(S);
  reshard_layout_destroy(D);
}

/* Destination replicas on the source's ranks: a group with a member that
 * holds the fragment's source data copies locally and stays direct; the
 * other groups relay. */
static void colocated(void **state) {
  (void)state;
  rs_relay_min_part_bytes = 0;
  int sr[2], dr[8];
  seq(sr, 2, 0);
  seq(dr, 8, 0);
  reshard_layout_t *S = train_side(sr, 1, 2), *D = infer_side(dr, 4, 2);
  static run a;
  run_setup(&a, S, D, relay_opts(1, 4096), 2);
  assert_int_equal(run_all(8, &a), 0);
  /* rank 0 copies its shard locally for every tensor */
  assert_true(a.stats[0].local_copy_bytes > 0);
  run_free(&a, 8);
  /* source shards that no member holds: tp=2 source on ranks 0,1 and a
   * [dp=2, tp=2] destination on ranks 1..4: rank 1 holds source shard 1
   * but destination shard 0 */
  reshard_layout_destroy(D);
  seq(dr, 4, 1);
  D = infer_side(dr, 2, 2);
  run_setup(&a, S, D, relay_opts(1, 0), 2);
  assert_int_equal(run_all(5, &a), 0);
  run_free(&a, 5);
  reshard_layout_destroy(S);
  reshard_layout_destroy(D);
  rs_relay_min_part_bytes = RS_RELAY_MIN_PART_DEFAULT;
}

/* Forwards are aggregated per (sender, receiver): with 4 source replicas
 * and 4 destination replicas (no topology), each member receives its own
 * part from the 4 sources and one message from each other member, not
 * one per (source, member); it sends one message to each other member. */
static void stream_counts(void **state) {
  (void)state;
  rs_relay_min_part_bytes = 0;
  int64_t shape[2] = {64, 256};
  int sr[4], dr[4];
  seq(sr, 4, 0);
  seq(dr, 4, 4);
  reshard_placement_t rep[1] = {reshard_replicate()};
  reshard_layout_t *S = one_weight(RESHARD_FP32, 2, shape, 1, (int[]){4}, sr, rep);
  reshard_layout_t *D = one_weight(RESHARD_FP32, 2, shape, 1, (int[]){4}, dr, rep);
  static run a;
  run_setup(&a, S, D, relay_opts(1, 0), 2);
  assert_int_equal(run_all(8, &a), 0);
  for (int r = 0; r < 4; r++) assert_int_equal(a.stats[r].send_messages, 4);
  for (int r = 4; r < 8; r++) {
    assert_int_equal(a.stats[r].recv_messages, 4 + 3);
    assert_int_equal(a.stats[r].send_messages, 3);
    assert_int_equal(a.stats[r].recv_bytes, 64 * 256 * 4);
  }
  run_free(&a, 8);
  reshard_layout_destroy(S);
  reshard_layout_destroy(D);
  rs_relay_min_part_bytes = RS_RELAY_MIN_PART_DEFAULT;
}

/* A 1 -> 8 fan-out of one 16 MiB weight (no topology: every member its
 * own domain, so each part is forwarded over the network): the source ->
 * owner streams (2 MiB each) go in RS_RELAY_PIPELINE_ROUNDS messages of
 * 256 KiB, and each forward leaves the round after its own bytes landed,
 * not after its whole part: 8 messages of 256 KiB in rounds 1 to 8 to
 * each other member (9 rounds), where waiting for whole parts sent one
 * 2 MiB message each in round 8. Every element checked, two steps. */
static void pipelined_fanout(void **state) {
  (void)state;
  enum { M = 8, N = M + 1 };
  int sr[1] = {0}, dr[M];
  seq(dr, M, 1);
  int64_t shape[2] = {2048, 2048};
  reshard_placement_t rep[1] = {reshard_replicate()};
  reshard_layout_t *S = one_weight(RESHARD_FP32, 2, shape, 1, (int[]){1}, sr, rep);
  reshard_layout_t *D = one_weight(RESHARD_FP32, 2, shape, 1, (int[]){M}, dr, rep);
  static run a;
  run_setup(&a, S, D, relay_opts(1, 0), 2);
  assert_int_equal(run_all(N, &a), 0);
  unsigned char is_src[N] = {1};
  check_source_egress(&a, N, is_src);
  const uint64_t part = (uint64_t)2048 * 2048 * 4 / M;
  assert_int_equal(a.stats[0].send_messages, M * RS_RELAY_PIPELINE_ROUNDS);
  assert_int_equal(a.stats[0].num_chunks, RS_RELAY_PIPELINE_ROUNDS);
  for (int r = 1; r < N; r++) {
    assert_int_equal(a.stats[r].recv_bytes, M * part);
    assert_int_equal(a.stats[r].send_bytes, (M - 1) * part);
    /* each 256 KiB forwarded to each other member as it lands (whole
     * parts: one message each, all in round 8) */
    assert_int_equal(a.stats[r].send_messages, (M - 1) * RS_RELAY_PIPELINE_ROUNDS);
    assert_int_equal(a.stats[r].num_chunks, RS_RELAY_PIPELINE_ROUNDS + 1);
  }
  run_free(&a, N);
  /* relay -1 on the flat preset (a network without NVLink domains): the
   * cost model keeps this relay plan, the same plan */
  reshard_options_t flat = relay_opts(-1, 0);
  flat.topology = "flat";
  run_setup(&a, S, D, flat, 1);
  assert_int_equal(run_all(N, &a), 0);
  check_source_egress(&a, N, is_src);
  for (int r = 1; r < N; r++) assert_int_equal(a.stats[r].send_messages, (M - 1) * RS_RELAY_PIPELINE_ROUNDS);
  run_free(&a, N);
  reshard_layout_destroy(S);
  reshard_layout_destroy(D);
}

/* Forwards in the order their data lands. Two weights replicated on the
 * 8 destination ranks of one gb200-nvl72 domain: t0 (64 MiB of bf16) from
 * source rank 0, t1 (16 MiB) from source rank 1, in 256 KiB messages.
 * Each owner's stream from source 0 (8 MiB) sets the plan's rounds; the
 * one from source 1 (2 MiB) is done in its first rounds. Each owner
 * forwards its parts of both in one stream per member: in (box, piece)
 * order t1's bytes waited behind t0's, which land until the last network
 * round, and went after it; in the order they land they go first, and
 * the forwards end with the network's rounds. Every element checked,
 * two steps. */
static void forwards_as_ready(void **state) {
  (void)state;
  rs_relay_min_part_bytes = 4096;
  enum { M = 8, N = M + 2 };
  int s0[1] = {0}, s1[1] = {1}, dr[M];
  seq(dr, M, 2);
  reshard_placement_t rep[1] = {reshard_replicate()};
  reshard_layout_t *S, *D;
  int t, m0, m1, md, b;
  assert_int_equal(reshard_layout_create(&S), 0);
  assert_int_equal(reshard_layout_create(&D), 0);
  assert_int_equal(reshard_layout_add_mesh(S, 1, (int[]){1}, s0, &m0), 0);
  assert_int_equal(reshard_layout_add_mesh(S, 1, (int[]){1}, s1, &m1), 0);
  assert_int_equal(reshard_layout_add_mesh(D, 1, (int[]){M}, dr, &md), 0);
  for (int k = 0; k < 2; k++) {
    int64_t shape[2] = {k ? 4096 : 16384, 2048};
    const char *name = k ? "t1" : "t0";
    assert_int_equal(reshard_layout_add_tensor(S, name, RESHARD_BF16, 2, shape, &t), 0);
    assert_int_equal(reshard_layout_place(S, t, k ? m1 : m0, rep, &b), 0);
    assert_int_equal(reshard_layout_add_tensor(D, name, RESHARD_BF16, 2, shape, &t), 0);
    assert_int_equal(reshard_layout_place(D, t, md, rep, &b), 0);
  }
  static run a;
  /* 256 KiB messages and room for them: many rounds, none short of
   * staging */
  reshard_options_t o = relay_opts(1, (size_t)64 << 20);
  o.chunk_bytes = (size_t)256 << 10;
  o.topology = "gb200-nvl72";
  o.flags |= RESHARD_FLAG_NO_SPREAD; /* source 1 takes no share of t0 */
  run_setup(&a, S, D, o, 2);
  assert_int_equal(run_all(N, &a), 0);
  const int net = a.stats[0].num_chunks;
  for (int r = 2; r < N; r++) {
    assert_int_equal(a.stats[r].recv_bytes, (uint64_t)20480 * 2048 * 2);
    /* the last forward leaves the round after the last network round */
    if (a.stats[r].num_chunks > net + 1)
      fail_msg("rank %d: %d rounds, the network's %d (%d phases)", r, a.stats[r].num_chunks, net, a.stats[r].phases);
  }
  run_free(&a, N);
  reshard_layout_destroy(S);
  reshard_layout_destroy(D);
}

/* Topology-aware replica choice (direct plans): two source replicas in
 * two h100 nodes, the destination re-sharded over the same 16 ranks. A
 * cell held in the receiver's node comes from there only, so every rank
 * receives from its own node; without a topology both replicas serve. */
static void replica_choice(void **state) {
  (void)state;
  int64_t shape[2] = {512, 64};
  int all[16];
  seq(all, 16, 0);
  reshard_placement_t sp[2] = {reshard_replicate(), reshard_shard(0)}, dp[2] = {reshard_replicate(), reshard_shard(1)};
  reshard_layout_t *S = one_weight(RESHARD_FP32, 2, shape, 2, (int[]){2, 8}, all, sp);
  reshard_layout_t *D = one_weight(RESHARD_FP32, 2, shape, 2, (int[]){4, 4}, all, dp);
  static run a;
  for (int topo = 0; topo < 2; topo++) {
    run_setup(&a, S, D, relay_opts(0, 0), 2);
    a.opts.topology = topo ? "h100-8x400g" : NULL;
    assert_int_equal(run_all(16, &a), 0);
    int cross = 0;
    for (int r = 0; r < 16; r++)
      for (size_t i = 0; i < a.npeers[r]; i++) cross += a.peers[r][i].peer / 8 != r / 8;
    if (topo) assert_int_equal(cross, 0);
    else assert_true(cross > 0);
    run_free(&a, 16);
  }
  reshard_layout_destroy(S);
  reshard_layout_destroy(D);
}

/* On a device (stream-ordered) transport relay = 1 plans direct: the
 * in-process transport planned for a stream-ordered executor (plans only,
 * never executed). */
typedef struct device_arg {
  const reshard_layout_t *src, *dst;
  size_t sent[8];
  int fails;
  int host; /* plan on the transport as it is, not as a device transport */
} device_arg;

/* A stream-ordered executor as far as plan creation sees it: it sets
 * nothing up (the plan is never executed). */
static const rs_executor not_a_device = {.name = "not-a-device", .stream_ordered = 1};

static int device_rank(int rank, reshard_comm_t *comm, void *p) {
  device_arg *a = p;
  reshard_options_t o = relay_opts(1, 0);
  reshard_plan_t *plan = NULL;
  reshard_plan_stats_t st;
  int bad = (a->host ? reshard_plan_create(comm, a->src, a->dst, &o, &plan)
                     : rs_plan_create(comm, &not_a_device, a->src, a->dst, &o, &plan)) != RESHARD_SUCCESS;
  if (!bad) {
    reshard_plan_get_stats(plan, &st);
    a->sent[rank] = st.send_bytes;
  }
  reshard_plan_destroy(plan);
  return bad;
}

/* relay -1 (auto) with a topology: the cost model keeps the relay plan
 * where destination replicas would otherwise pull every byte through the
 * source NICs, and the direct plan where nothing is replicated; either
 * way the bytes are exact. */
static void auto_choice(void **state) {
  (void)state;
  rs_relay_min_part_bytes = 0;
  enum { N = 10 };
  int sr[2], dr[8];
  seq(sr, 2, 0);
  seq(dr, 8, 2);
  unsigned char is_src[N] = {1, 1}, is_dst[N];
  for (int r = 0; r < N; r++) is_dst[r] = r >= 2;
  static run a, d;
  /* one 4 MiB weight, tp=2 -> tp=2 x dp=4: four replicas of every
   * destination box (big enough that bandwidth, not latency, decides) */
  int64_t shape[2] = {2048, 1024};
  reshard_placement_t s0[1] = {reshard_shard(0)}, rs0[2] = {reshard_replicate(), reshard_shard(0)};
  reshard_layout_t *S = one_weight(RESHARD_BF16, 2, shape, 1, (int[]){2}, sr, s0);
  reshard_layout_t *D = one_weight(RESHARD_BF16, 2, shape, 2, (int[]){4, 2}, dr, rs0);
  reshard_options_t h100 = relay_opts(-1, 0);
  h100.topology = "h100-8x400g";
  run_setup(&a, S, D, h100, 2);
  assert_int_equal(run_all(N, &a), 0);
  check_source_egress(&a, N, is_src);
  assert_true(sent_by(&a, N, is_dst) > 0); /* the relay plan: forwards */
  /* the same without a topology: no cost model, direct */
  run_setup(&d, S, D, relay_opts(-1, 0), 1);
  assert_int_equal(run_all(N, &d), 0);
  assert_int_equal(sent_by(&d, N, is_dst), 0);
  assert_true(sent_by(&d, N, is_src) > 3 * sent_by(&a, N, is_src));
  run_free(&a, N);
  run_free(&d, N);
  reshard_layout_destroy(D);
  /* tp=2 -> tp=8: no replicas, nothing to relay: direct is kept */
  reshard_placement_t s1[1] = {reshard_shard(1)};
  D = one_weight(RESHARD_BF16, 2, shape, 1, (int[]){8}, dr, s1);
  run_setup(&a, S, D, h100, 2);
  assert_int_equal(run_all(N, &a), 0);
  assert_int_equal(sent_by(&a, N, is_dst), 0);
  run_free(&a, N);
  reshard_layout_destroy(S);
  reshard_layout_destroy(D);
  rs_relay_min_part_bytes = RS_RELAY_MIN_PART_DEFAULT;
}

static void device_transport(void **state) {
  (void)state;
  rs_relay_min_part_bytes = 0;
  int sr[2], dr[4];
  seq(sr, 2, 0);
  seq(dr, 4, 2);
  reshard_layout_t *S = train_side(sr, 1, 2), *D = infer_side(dr, 2, 2);
  device_arg dev = {S, D, {0}, 0, 0}, host = {S, D, {0}, 0, 1};
  assert_int_equal(th_run_ranks(6, device_rank, &dev), 0);
  assert_int_equal(th_run_ranks(6, device_rank, &host), 0);
  /* the same plan: every rank sends the same bytes, and the destination
   * replicas forward (the sources send each byte once, not per replica) */
  uint64_t src_sent = 0, fwd = 0;
  for (int r = 0; r < 6; r++) {
    assert_int_equal(dev.sent[r], host.sent[r]);
    if (r < 2) src_sent += dev.sent[r];
    else fwd += dev.sent[r];
  }
  assert_true(fwd > 0);
  unsigned char all[6] = {0, 0, 1, 1, 1, 1};
  assert_int_equal(src_sent, unique_bytes(D, 6, all));
  reshard_layout_destroy(S);
  reshard_layout_destroy(D);
  rs_relay_min_part_bytes = RS_RELAY_MIN_PART_DEFAULT;
}

/* Megatron tp=2 -> vLLM tp=2 x dp=4 of a tiny llama (fused qkv with GQA,
 * gate_up, vocabulary padding) with relay. */
static void models(void **state) {
  (void)state;
  rs_relay_min_part_bytes = 0;
  rm_model *m = NULL;
  rm_parallel tp, ip;
  reshard_layout_t *S = NULL, *D = NULL;
  assert_int_equal(rm_model_load(RESHARD_TEST_DATA "/tiny-llama.json", 0, RESHARD_BF16, &m), 0);
  assert_int_equal(rm_parse_parallel("tp=2", &tp), 0);
  assert_int_equal(rm_parse_parallel("tp=2,dp=4", &ip), 0);
  assert_int_equal(rm_megatron_layout(m, &tp, 0, &S), 0);
  assert_int_equal(rm_vllm_layout(m, &ip, 2, &D), 0);
  th_sync_args a = {.src = S, .dst = D, .opts = relay_opts(1, 8192), .steps = 3};
  assert_int_equal(th_sync(10, &a), 0);
  a.opts.topology = "h100-8x400g";
  assert_int_equal(th_sync(10, &a), 0);
  uint64_t src_sent = a.send_bytes[0] + a.send_bytes[1];
  unsigned char all[10];
  memset(all, 1, sizeof all);
  assert_int_equal(src_sent, unique_bytes(D, 10, all));
  reshard_layout_destroy(S);
  reshard_layout_destroy(D);
  rm_model_free(m);
  rs_relay_min_part_bytes = RS_RELAY_MIN_PART_DEFAULT;
}

/* One CMocka test per row of a case table, named by the row, run by fn
 * with the row as its state. */
#define ADD_ROWS(tests, n, rows, fn)                                                    \
  for (size_t i_ = 0; i_ < sizeof rows / sizeof *rows; i_++)                            \
  (tests)[(n)++] = (struct CMUnitTest) { (rows)[i_].name, (fn), NULL, NULL, &(rows)[i_] }

/* Most tests lower rs_relay_min_part_bytes and put it back at their end;
 * a test that fails midway would leave it lowered for the next ones, so
 * every test's teardown puts it back (cmocka runs it after a failure). */
static int default_min_part(void **state) {
  (void)state;
  rs_relay_min_part_bytes = RS_RELAY_MIN_PART_DEFAULT;
  return 0;
}

int main(void) {
  struct CMUnitTest tests[32] = {
      cmocka_unit_test(dense_flat),       cmocka_unit_test(random_topology),  cmocka_unit_test(random_pairs),
      cmocka_unit_test(threshold),        cmocka_unit_test(colocated),        cmocka_unit_test(models),
      cmocka_unit_test(stream_counts),    cmocka_unit_test(pipelined_fanout), cmocka_unit_test(replica_choice),
      cmocka_unit_test(device_transport), cmocka_unit_test(auto_choice),      cmocka_unit_test(few_parts),
      cmocka_unit_test(forwards_as_ready),
  };
  size_t n = 0;
  while (tests[n].name) n++;
  ADD_ROWS(tests, n, topo_rows, topology_case);
  assert_true(n <= sizeof tests / sizeof *tests);
  for (size_t i = 0; i < n; i++) tests[i].teardown_func = default_min_part;
  return _cmocka_run_group_tests("test_relay", tests, n, NULL, NULL);
}
