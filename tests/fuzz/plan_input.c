/* The plan fuzzer's decoder and checks (see plan_input.h). */
#include "plan_input.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "agree_comm.h"
#include "reshard.h"
#include "support/harness.h"

#define FZ_MAX_RANKS 8
#define FZ_MAX_TENSORS 3
#define FZ_MAX_MESHES 6
#define FZ_MAX_OPS 12
#define FZ_MAX_RAWS 8
#define FZ_EXEC_BYTES (256u << 10) /* execute cases whose buffers fit */
#define FZ_MAX_MESSAGES 1e5        /* plan cases with fewer messages */

static void fz_fail(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fprintf(stderr, "fuzz_plan: invariant violated: ");
  vfprintf(stderr, fmt, ap);
  fprintf(stderr, "\n");
  va_end(ap);
  abort();
}

/* ------------------------------------------------------------ reading */

typedef struct fz_reader {
  const uint8_t *p;
  size_t n, i;
} fz_reader;

static unsigned rd(fz_reader *r) { return r->i < r->n ? r->p[r->i++] : 0; }

/* A dimension-like value: mostly 0..8, now and then one at an edge. */
static int64_t rd_value(fz_reader *r) {
  unsigned b = rd(r);
  if (b < 240) return b % 9;
  static const int64_t edge[16] = {-1, INT64_MAX, (int64_t)1 << 32, (int64_t)1 << 40, INT32_MAX, 4096, 65, 13,
                                   INT64_MIN, (int64_t)1 << 62, 3, 16, 31, 100, 1000, -7};
  return edge[b - 240];
}

/* The decoder's own arithmetic on edge values wraps (two's complement)
 * instead of overflowing: the library must cope with whatever comes out. */
static int64_t wrap_add(int64_t a, int64_t b) { return (int64_t)((uint64_t)a + (uint64_t)b); }
static int64_t wrap_neg(int64_t a) { return (int64_t)(0 - (uint64_t)a); }
static int64_t wrap_mul(int64_t a, int64_t b) { return (int64_t)((uint64_t)a * (uint64_t)b); }

/* ------------------------------------------------------ one side's ops */

typedef struct fz_side {
  reshard_layout_t *L;
  const char *what; /* "source" / "destination" */
  int nranks;
  int nmesh;
  int mesh_ndim[FZ_MAX_MESHES];
  int mesh_shape[FZ_MAX_MESHES][3];
  int raw[FZ_MAX_RAWS]; /* raw buffer ids */
  int nraw;
  int nfused;
} fz_side;

typedef struct fz_counts {
  int tensors, buffers;
} fz_counts;

static fz_counts counts_of(const fz_side *s) {
  fz_counts c = {reshard_layout_num_tensors(s->L), reshard_layout_num_buffers(s->L)};
  return c;
}

/* Every failed call must say why and leave the layout as it was. Returns
 * whether the call succeeded. */
static int check_call(const fz_side *s, const char *call, reshard_result_t r, fz_counts before) {
  if (r == RESHARD_SUCCESS) return 1;
  if ((int)r < 0 || r >= RESHARD_NUM_RESULTS) fz_fail("%s layout: %s returned %d, not a result code", s->what, call, (int)r);
  if (reshard_last_error()[0] == '\0')
    fz_fail("%s layout: %s returned %s with an empty reshard_last_error()", s->what, call, reshard_result_string(r));
  fz_counts now = counts_of(s);
  if (now.tensors != before.tensors || now.buffers != before.buffers)
    fz_fail("%s layout: failed %s changed the layout (tensors %d -> %d, buffers %d -> %d)", s->what, call,
            before.tensors, now.tensors, before.buffers, now.buffers);
  return 0;
}

/* The counts are taken before the call is evaluated. */
#define FZ_CALL(s, name, expr)                 \
  __extension__({                              \
    fz_counts before_ = counts_of(s);          \
    check_call((s), (name), (expr), before_);  \
  })

static void op_mesh(fz_reader *r, fz_side *s) {
  int ndim = 1 + (int)(rd(r) % 3), shape[3], size = 1, id = -1, ok_ = 0;
  for (int i = 0; i < ndim; i++) {
    unsigned b = rd(r);
    shape[i] = b >= 250 ? (int)(b & 1) - 1 : 1 + (int)(b % 4); /* 0 or -1 now and then */
    size *= shape[i] > 0 ? shape[i] : 1;
  }
  unsigned mode = rd(r) % 4;
  if (mode < 2) {
    int start = (int)(rd(r) % (unsigned)s->nranks), stride = 1 + (int)(rd(r) % 3);
    ok_ = FZ_CALL(s, "add_mesh_strided", reshard_layout_add_mesh_strided(s->L, ndim, shape, start, stride, &id));
  } else {
    int ranks[64];
    int start = (int)rd(r);
    for (int i = 0; i < size; i++)
      ranks[i] = mode == 2 ? (start + i) % s->nranks : (int)(rd(r) % (unsigned)(s->nranks + 1));
    ok_ = FZ_CALL(s, "add_mesh", reshard_layout_add_mesh(s->L, ndim, shape, ranks, &id));
  }
  if (ok_ && s->nmesh < FZ_MAX_MESHES && id == s->nmesh) {
    s->mesh_ndim[id] = ndim;
    memcpy(s->mesh_shape[id], shape, sizeof shape);
    s->nmesh++;
  }
}

/* Placements of tensor t on mesh m (one per mesh axis; one when m is not a
 * mesh), with split sizes in sizes[axis][]. pl has RESHARD_MAX_MESH_DIMS
 * entries, every one set (replicated beyond the decoded axes): a builder
 * may have added meshes this decoder does not count (reshard_layout_add_
 * vllm_qkv's TP split), whose axes the library then reads, and stack
 * garbage there made a run depend on the inputs before it (a misaligned
 * split_sizes pointer seen by UBSan once, not reproducible alone). */
static int rd_placements(fz_reader *r, const fz_side *s, int t, int m, reshard_placement_t *pl,
                         int64_t sizes[3][4]) {
  for (int a = 0; a < RESHARD_MAX_MESH_DIMS; a++) pl[a] = reshard_replicate();
  int naxes = m < s->nmesh ? s->mesh_ndim[m] : 1;
  int ndim = 0;
  int64_t shape[RESHARD_MAX_DIMS] = {0};
  reshard_layout_tensor_info(s->L, t, NULL, NULL, &ndim, shape);
  for (int a = 0; a < naxes; a++) {
    unsigned b = rd(r);
    int dim = (int)((b / 8) % (unsigned)(ndim + 1)); /* ndim: out of range */
    switch (b % 8) {
    case 0: case 1: case 2:
      pl[a] = reshard_replicate();
      break;
    case 3: case 4:
      pl[a] = reshard_shard(dim);
      break;
    case 5: case 6: {
      int k = m < s->nmesh ? s->mesh_shape[m][a] : 1;
      if (k < 1 || k > 4) k = 1;
      if (dim >= ndim) dim = 0;
      int64_t left = ndim ? shape[dim] : 0;
      for (int i = 0; i < k; i++) {
        /* pieces summing to the extent, or (bit 7) any sizes */
        int64_t v = (b & 0x80) ? rd_value(r)
                    : i == k - 1 ? left
                                 : (int64_t)(rd(r) % (uint64_t)(left > 0 && left < 64 ? left + 1 : 2));
        sizes[a][i] = v;
        if (!(b & 0x80)) left -= v; /* both in 0..left here */
      }
      pl[a] = reshard_shard_sizes(dim, sizes[a]);
      break;
    }
    default:
      pl[a].kind = (reshard_placement_kind_t)(2 + b % 3);
      pl[a].dim = (int)(b / 8) - 16;
      pl[a].split_sizes = NULL;
    }
  }
  return naxes;
}

static void op_place(fz_reader *r, fz_side *s, int nt) {
  int t = (int)(rd(r) % (unsigned)(nt + 1)), m = (int)(rd(r) % (unsigned)(s->nmesh + 1)), id = -1;
  reshard_placement_t pl[RESHARD_MAX_MESH_DIMS];
  int64_t sizes[3][4];
  rd_placements(r, s, t < nt ? t : 0, m, pl, sizes);
  FZ_CALL(s, "place", reshard_layout_place(s->L, t, m, pl, &id));
}

/* The fused-layout builders with decoded numbers, edges included. */
static void op_builder(fz_reader *r, fz_side *s, int nt) {
  int kind = (int)(rd(r) % 3), m = (int)(rd(r) % (unsigned)(s->nmesh + 1)), tp_axis = (int)(rd(r) % 4) - 1;
  int t[3];
  for (int i = 0; i < 3; i++) t[i] = (int)(rd(r) % (unsigned)(nt + 1));
  reshard_attention_t a = {t[0], t[1], t[2], (int)rd_value(r), (int)rd_value(r), rd_value(r)};
  char name[32];
  snprintf(name, sizeof name, "built%d", s->nfused++);
  int id = -1;
  if (kind == 0) FZ_CALL(s, "add_megatron_qkv", reshard_layout_add_megatron_qkv(s->L, name, &a, m, tp_axis, &id));
  else if (kind == 1) FZ_CALL(s, "add_vllm_qkv", reshard_layout_add_vllm_qkv(s->L, name, &a, m, tp_axis, &id));
  else FZ_CALL(s, "add_gate_up", reshard_layout_add_gate_up(s->L, name, t[0], t[1], m, tp_axis, &id));
}

static void op_fused(fz_reader *r, fz_side *s, int nt) {
  unsigned c = rd(r);
  if (c >= 250) { /* rare, so that older corpus inputs keep their meaning */
    op_builder(r, s, nt);
    return;
  }
  int concat = (int)(c % 3);
  unsigned g = rd(r);
  int groups = g % 4 == 3 ? 2 + (int)(g / 4 % 3) : 1;
  int nparts = 1 + (int)(rd(r) % 3);
  reshard_part_t parts[3];
  reshard_placement_t pl[3][RESHARD_MAX_MESH_DIMS];
  int64_t sizes[3][3][4], padded[3][RESHARD_MAX_DIMS];
  for (int i = 0; i < nparts; i++) {
    int t = (int)(rd(r) % (unsigned)(nt + 1)), m = (int)(rd(r) % (unsigned)(s->nmesh + 1));
    rd_placements(r, s, t < nt ? t : 0, m, pl[i], sizes[i]);
    parts[i] = (reshard_part_t){t, m, pl[i], NULL};
    if (rd(r) % 4 == 3) {
      int ndim = 0;
      int64_t shape[RESHARD_MAX_DIMS] = {0};
      reshard_layout_tensor_info(s->L, t < nt ? t : 0, NULL, NULL, &ndim, shape);
      for (int d = 0; d < RESHARD_MAX_DIMS; d++) padded[i][d] = wrap_add(shape[d], d < ndim ? (int64_t)(rd(r) % 3) : 0);
      parts[i].padded_shape = padded[i];
    }
  }
  char name[32];
  snprintf(name, sizeof name, "fused%d", s->nfused++);
  int id = -1;
  FZ_CALL(s, "add_fused", reshard_layout_add_fused(s->L, name, concat, groups, nparts, parts, &id));
}

static void op_fragment(fz_reader *r, fz_side *s, int nt, int buffer) {
  int t = (int)(rd(r) % (unsigned)(nt + 1));
  int ndim = 0;
  int64_t shape[RESHARD_MAX_DIMS] = {0}, start[RESHARD_MAX_DIMS] = {0}, extent[RESHARD_MAX_DIMS] = {0},
          strides[RESHARD_MAX_DIMS] = {0};
  reshard_dtype_t dt = RESHARD_FP32;
  reshard_layout_tensor_info(s->L, t < nt ? t : 0, NULL, &dt, &ndim, shape);
  for (int d = 0; d < ndim; d++) {
    unsigned b = rd(r);
    start[d] = b >= 250 ? rd_value(r) : (int64_t)(b % (uint64_t)(shape[d] >= 0 && shape[d] < 64 ? shape[d] + 1 : 2));
    int64_t room = wrap_add(shape[d], wrap_neg(start[d]));
    b = rd(r);
    extent[d] = b >= 250 ? rd_value(r) : (int64_t)(b % (uint64_t)(room >= 0 && room < 64 ? room + 2 : 2));
  }
  size_t esize = reshard_dtype_size(dt);
  unsigned mode = rd(r) % 4;
  /* dense row-major with some padding per row, column-major, or raw */
  int64_t step = 1;
  for (int d = ndim - 1; d >= 0; d--) {
    if (mode == 1) {
      strides[d] = step;
      step = wrap_mul(step, wrap_add(extent[d] > 0 ? extent[d] : 1, (int64_t)(rd(r) % 2)));
    } else if (mode == 3) {
      strides[d] = rd_value(r);
    }
  }
  if (mode == 2) {
    step = 1;
    for (int d = 0; d < ndim; d++) {
      strides[d] = step;
      step = wrap_mul(step, extent[d] > 0 ? extent[d] : 1);
    }
  }
  unsigned ob = rd(r);
  size_t off = ob >= 250 ? (size_t)rd_value(r) : (size_t)ob * (esize ? esize : 1);
  reshard_fragment_t f = {t, buffer, start, extent, off, mode == 0 ? NULL : strides};
  FZ_CALL(s, "add_fragment", reshard_layout_add_fragment(s->L, &f));
}

static void op_raw(fz_reader *r, fz_side *s, int nt) {
  int rank = (int)(rd(r) % (unsigned)(s->nranks + 1));
  unsigned b = rd(r);
  size_t bytes = b >= 250 ? (size_t)rd_value(r) : (size_t)b * 16;
  char name[32];
  snprintf(name, sizeof name, "raw%d", s->nraw);
  int id = -1, ok_;
  ok_ = FZ_CALL(s, "add_buffer", reshard_layout_add_buffer(s->L, name, rank, bytes, &id));
  if (!ok_) return;
  if (s->nraw < FZ_MAX_RAWS) s->raw[s->nraw++] = id;
  int nfrag = (int)(rd(r) % 4);
  for (int i = 0; i < nfrag; i++) op_fragment(r, s, nt, id);
}

static void decode_side(fz_reader *r, fz_side *s, int nt) {
  int nops = (int)(rd(r) % (FZ_MAX_OPS + 1));
  for (int i = 0; i < nops; i++) {
    switch (rd(r) % 5) {
    case 0: op_mesh(r, s); break;
    case 1: op_place(r, s, nt); break;
    case 2: op_fused(r, s, nt); break;
    case 3: op_raw(r, s, nt); break;
    default: {
      /* another fragment in a raw buffer, or in a buffer that is not raw */
      unsigned b = rd(r);
      int buf = s->nraw && b % 4 ? s->raw[b % (unsigned)s->nraw] : (int)(b % 8);
      op_fragment(r, s, nt, buf);
    }
    }
  }
}

/* ------------------------------------------------------------ checks */

typedef struct fz_rank_traffic {
  size_t send[FZ_MAX_RANKS], recv[FZ_MAX_RANKS], smsg[FZ_MAX_RANKS], rmsg[FZ_MAX_RANKS];
} fz_rank_traffic;

/* Bytes of rank's destination fragments. */
static size_t fragment_bytes(const reshard_layout_t *L, int rank) {
  size_t n = 0;
  if (reshard_layout_fragments(L, rank, NULL, 0, &n)) fz_fail("layout_fragments(rank %d) failed: %s", rank, reshard_last_error());
  reshard_fragment_info_t *f = calloc(n ? n : 1, sizeof *f);
  size_t got = 0, bytes = 0;
  if (!f || reshard_layout_fragments(L, rank, f, n, &got) || got != n) fz_fail("layout_fragments(rank %d) refill", rank);
  for (size_t i = 0; i < n; i++) {
    reshard_dtype_t dt;
    reshard_layout_tensor_info(L, f[i].tensor_id, NULL, &dt, NULL, NULL);
    size_t e = reshard_dtype_size(dt);
    for (int d = 0; d < f[i].ndim; d++) e *= (size_t)f[i].extent[d];
    bytes += e;
  }
  free(f);
  return bytes;
}

static void check_plan(const reshard_plan_t *plan, int rank, int nranks, const reshard_layout_t *dst,
                       fz_rank_traffic *t) {
  reshard_plan_stats_t st;
  if (reshard_plan_get_stats(plan, &st)) fz_fail("get_stats rank %d: %s", rank, reshard_last_error());
  size_t n = 0;
  if (reshard_plan_get_peer_stats(plan, NULL, 0, &n)) fz_fail("get_peer_stats rank %d: %s", rank, reshard_last_error());
  if (n > (size_t)nranks) fz_fail("rank %d: %zu peers in a world of %d", rank, n, nranks);
  reshard_peer_stats_t ps[FZ_MAX_RANKS];
  size_t got = 0;
  if (reshard_plan_get_peer_stats(plan, ps, n, &got) || got != n) fz_fail("get_peer_stats rank %d refill", rank);
  size_t sb = 0, rb = 0, sm = 0, rm = 0;
  for (size_t i = 0; i < n; i++) {
    int p = ps[i].peer;
    if (p < 0 || p >= nranks || p == rank || (i && p <= ps[i - 1].peer))
      fz_fail("rank %d: peer %d (entry %zu) out of range, itself or unsorted", rank, p, i);
    if (!ps[i].send_bytes != !ps[i].send_messages || !ps[i].recv_bytes != !ps[i].recv_messages)
      fz_fail("rank %d peer %d: bytes without messages or messages without bytes", rank, p);
    t->send[p] = ps[i].send_bytes;
    t->recv[p] = ps[i].recv_bytes;
    t->smsg[p] = ps[i].send_messages;
    t->rmsg[p] = ps[i].recv_messages;
    sb += ps[i].send_bytes, rb += ps[i].recv_bytes, sm += ps[i].send_messages, rm += ps[i].recv_messages;
  }
  if (sb != st.send_bytes || rb != st.recv_bytes || sm != st.send_messages || rm != st.recv_messages)
    fz_fail("rank %d: per-peer sums (%zu/%zu bytes, %zu/%zu messages) differ from the totals (%zu/%zu, %zu/%zu)", rank,
            sb, rb, sm, rm, st.send_bytes, st.recv_bytes, st.send_messages, st.recv_messages);
  size_t want = fragment_bytes(dst, rank);
  if (st.recv_bytes + st.local_copy_bytes != want)
    fz_fail("rank %d: receives %zu + copies %zu bytes, its destination fragments hold %zu", rank, st.recv_bytes,
            st.local_copy_bytes, want);
  if (st.chunk_bytes && (st.send_messages || st.recv_messages)) {
    for (size_t i = 0; i < n; i++)
      if (ps[i].send_messages && ps[i].send_bytes > ps[i].send_messages * st.chunk_bytes)
        fz_fail("rank %d: %zu bytes to %d in %zu messages of at most %zu", rank, ps[i].send_bytes, ps[i].peer,
                ps[i].send_messages, st.chunk_bytes);
  }
}

static size_t side_bytes(const reshard_layout_t *L, int nranks) {
  size_t total = 0;
  for (int b = 0; b < reshard_layout_num_buffers(L); b++)
    for (int r = 0; r < nranks; r++) {
      size_t n = 0;
      if (reshard_layout_buffer_bytes(L, b, r, &n)) fz_fail("buffer_bytes(%d, %d): %s", b, r, reshard_last_error());
      if (n > FZ_EXEC_BYTES || total + n > FZ_EXEC_BYTES) return (size_t)-1;
      total += n;
    }
  return total;
}

/* Plans every rank exactly (agree_comm.h) and checks the plans. */
static fz_outcome plan_all(const reshard_layout_t *src, const reshard_layout_t *dst, const reshard_options_t *opts,
                     int nranks) {
  fz_agree_world w;
  fz_agree_init(&w, nranks);
  reshard_comm_t *comms[FZ_MAX_RANKS] = {0};
  reshard_plan_t *plans[FZ_MAX_RANKS] = {0};
  int planned = 0;
  reshard_result_t res_of[FZ_MAX_RANKS];
  /* every agreement call's contributions follow the calls before it, so
   * the passes settle within one more than the calls (agree_comm.h) */
  for (int pass = 0;; pass++) {
    if (pass > FZ_AGREE_MAX_CALLS + 1) fz_fail("the agreement did not settle in %d passes", pass);
    if (pass) fz_agree_replay(&w);
    planned = 0;
    for (int r = 0; r < nranks; r++) {
      if (fz_agree_comm_create(&w, r, &comms[r])) fz_fail("agreement communicator: %s", reshard_last_error());
      reshard_result_t res = reshard_plan_create(comms[r], src, dst, opts, &plans[r]);
      if (res != RESHARD_SUCCESS) {
        if ((int)res < 0 || res >= RESHARD_NUM_RESULTS || reshard_last_error()[0] == '\0' || plans[r])
          fz_fail("rank %d: plan_create returned %d with message '%s' and plan %p", r, (int)res, reshard_last_error(),
                  (void *)plans[r]);
      } else {
        planned++;
      }
      res_of[r] = res;
    }
    if (pass && fz_agree_settled(&w)) break;
    for (int r = 0; r < nranks; r++) {
      reshard_plan_destroy(plans[r]);
      plans[r] = NULL;
      reshard_comm_destroy(comms[r]);
      comms[r] = NULL;
    }
  }
  for (int r = 1; r < nranks; r++)
    if ((res_of[r] == RESHARD_SUCCESS) != (res_of[0] == RESHARD_SUCCESS))
      fz_fail("rank %d planned %s but rank 0 %s: ranks disagree after agreement", r, reshard_result_string(res_of[r]),
              reshard_result_string(res_of[0]));
  if (planned == nranks) {
    fz_rank_traffic t[FZ_MAX_RANKS];
    memset(t, 0, sizeof t);
    for (int r = 0; r < nranks; r++) check_plan(plans[r], r, nranks, dst, &t[r]);
    for (int a = 0; a < nranks; a++)
      for (int b = 0; b < nranks; b++)
        if (t[a].send[b] != t[b].recv[a] || t[a].smsg[b] != t[b].rmsg[a])
          fz_fail("rank %d sends %zu bytes in %zu messages to rank %d, which receives %zu bytes in %zu messages", a,
                  t[a].send[b], t[a].smsg[b], b, t[b].recv[a], t[b].rmsg[a]);
  }
  for (int r = 0; r < nranks; r++) {
    reshard_plan_destroy(plans[r]);
    reshard_comm_destroy(comms[r]);
  }
  if (planned != nranks) return FZ_REJECTED;

  /* Small enough: move the data over threads and check every byte. */
  if (side_bytes(src, nranks) == (size_t)-1 || side_bytes(dst, nranks) == (size_t)-1) return FZ_PLANNED;
  static th_sync_args args; /* large (per-rank arrays) */
  memset(&args, 0, sizeof args);
  args.src = src;
  args.dst = dst;
  args.opts = *opts;
  args.opts.timeout_ms = 20000;
  args.steps = 1;
  int64_t bad = th_sync(nranks, &args);
  if (bad != 0) fz_fail("executing over the in-process transport: %lld (-1: a call failed)", (long long)bad);
  return FZ_EXECUTED;
}

/* A bound on the messages of a plan: the bytes of all tensors over the
 * smallest chunk the options allow. The planner's memory grows with the
 * messages, so terabyte tensors cut into 64-byte messages would only
 * measure the machine's memory: such inputs are not planned. */
static double messages_bound(const reshard_layout_t *L, const reshard_options_t *o) {
  double bytes = 0;
  for (int t = 0; t < reshard_layout_num_tensors(L); t++) {
    reshard_dtype_t dt;
    int ndim = 0;
    int64_t shape[RESHARD_MAX_DIMS];
    reshard_layout_tensor_info(L, t, NULL, &dt, &ndim, shape);
    double n = (double)reshard_dtype_size(dt);
    for (int d = 0; d < ndim; d++) n *= shape[d] > 0 ? (double)shape[d] : 0;
    bytes += n;
  }
  double chunk = (double)o->staging_bytes / (2.0 * FZ_MAX_RANKS);
  if (o->chunk_bytes && (double)o->chunk_bytes < chunk) chunk = (double)o->chunk_bytes;
  if (chunk < 64) chunk = 64;
  return bytes / chunk;
}

fz_outcome fz_plan_input(const uint8_t *data, size_t size) {
  fz_reader r = {data, size, 0};
  int nranks = 1 + (int)(rd(&r) % FZ_MAX_RANKS);
  unsigned o1 = rd(&r), o2 = rd(&r);
  static const size_t staging[8] = {4096, 8192, 1 << 16, (size_t)256 << 20, 100, 0, 5000, 1 << 20};
  static const size_t chunk[8] = {0, 0, 0, 64, 100, 4096, (size_t)1 << 30, 65};
  static const char *const topo[6] = {NULL, NULL, NULL, "cpu", "h100-8x400g", "no-such-machine"};
  reshard_options_t opts = RESHARD_OPTIONS_INITIALIZER;
  opts.staging_bytes = staging[o1 % 8];
  opts.chunk_bytes = chunk[o1 / 8 % 8];
  opts.relay = (int)(o1 / 64 % 3) - 1;
  opts.topology = topo[o2 % 6];
  opts.flags = o2 / 6 % 8 == 7 ? 1u << (o2 % 32) : 0;
  opts.timeout_ms = 1000;

  fz_side src = {NULL, "source", nranks, 0, {0}, {{0}}, {0}, 0, 0};
  fz_side dst = {NULL, "destination", nranks, 0, {0}, {{0}}, {0}, 0, 0};
  if (reshard_layout_create(&src.L) || reshard_layout_create(&dst.L)) fz_fail("layout_create: %s", reshard_last_error());

  int nt = 1 + (int)(rd(&r) % FZ_MAX_TENSORS);
  for (int t = 0; t < nt; t++) {
    char name[16];
    snprintf(name, sizeof name, "t%d", t);
    reshard_dtype_t dt = (reshard_dtype_t)(rd(&r) % (RESHARD_NUM_DTYPES + 1));
    unsigned nb = rd(&r);
    int ndim = nb < 250 ? (int)(nb % 4) : (int)nb - 250 + 4; /* 4..8, 9 out of range */
    int64_t shape[RESHARD_MAX_DIMS + 2];
    for (int d = 0; d < ndim && d < RESHARD_MAX_DIMS + 2; d++) shape[d] = rd_value(&r);
    int id = -1;
    FZ_CALL(&src, "add_tensor", reshard_layout_add_tensor(src.L, name, dt, ndim, shape, &id));
    FZ_CALL(&dst, "add_tensor", reshard_layout_add_tensor(dst.L, name, dt, ndim, shape, &id));
  }
  nt = reshard_layout_num_tensors(src.L);
  unsigned tweak = rd(&r);
  if (tweak % 8 == 7) {
    /* a destination tensor that the source lacks (or describes differently) */
    int64_t shape[2] = {1 + (int64_t)(tweak / 8 % 4), 2};
    int id = -1;
    FZ_CALL(&dst, "add_tensor", reshard_layout_add_tensor(dst.L, tweak & 0x80 ? "t0" : "extra", RESHARD_INT8, 2, shape, &id));
  }
  decode_side(&r, &src, nt);
  decode_side(&r, &dst, reshard_layout_num_tensors(dst.L));
  /* three inputs in four let both sides hold tensors in part (the planner's
   * own hole checks run); the fourth keeps the rule that a side holds every
   * tensor it declares whole */
  if (tweak / 32 % 4 != 3) {
    for (int t = 0; t < reshard_layout_num_tensors(src.L); t++) reshard_layout_allow_partial(src.L, t);
    for (int t = 0; t < reshard_layout_num_tensors(dst.L); t++) reshard_layout_allow_partial(dst.L, t);
  }

  fz_outcome out = FZ_SKIPPED;
  if (messages_bound(src.L, &opts) <= FZ_MAX_MESSAGES) out = plan_all(src.L, dst.L, &opts, nranks);
  reshard_layout_destroy(src.L);
  reshard_layout_destroy(dst.L);
  return out;
}
