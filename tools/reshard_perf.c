/* reshard_perf: time a reshard on MPI ranks, nccl-tests style, against the
 * ways weights are synced today.
 *
 *   mpirun -np 8 reshard_perf --shape 4096,4096 --dtype f32 \
 *       --src-mesh 4 --src-placements S0 --dst-mesh 2,2 --dst-placements R,S1 \
 *       --baseline broadcast,alltoallw -c 1
 *   mpirun -np 8 reshard_perf --model-config configs/qwen2.5-0.5b.json \
 *       --layers 4 --train tp=2,pp=2 --infer tp=2,dp=2 --baseline broadcast
 *
 * Source ranks come first in MPI_COMM_WORLD, then destination ranks
 * (--colocate: both sides on ranks 0..). Each method (the reshard plan,
 * then each baseline) runs -w untimed and -n timed iterations on the same
 * buffers; an iteration's time is the slowest rank's (barrier, MPI_Wtime
 * around the call, max over ranks). With -c 1 each method then runs once
 * more, outside the timed loop, on freshly seeded sources and
 * sentinel-filled destinations, and every destination element and every
 * byte around the fragments is checked (reshard_selftest.h); wrong counts are
 * summed over ranks.
 *
 * Baselines:
 *   broadcast  for each tensor: gather its full contents at source rank 0
 *              (point-to-point from the first replica holding each box,
 *              received straight into the full tensor through subarray
 *              datatypes), MPI_Bcast it from there to every destination
 *              rank, and each destination copies its fragments out;
 *   alltoallw  one MPI_Alltoallw over MPI_COMM_WORLD, every destination box
 *              taken from the first source replica holding it, described in
 *              place on both sides (subarray datatypes where the buffer is
 *              row-major with padding, nested hvectors otherwise, one struct
 *              per peer at absolute addresses: fused and strided buffers
 *              included; RESHARD_PERF_HVECTOR=1 in the environment forces
 *              hvectors everywhere, to test that path).
 * "First replica": source fragments taken in rank order, a fragment skipped
 * when another one already taken holds the same box. A layout whose
 * replicas partially overlap (rather than repeat) cannot be split that way;
 * the baselines then say so and are skipped.
 *
 * --backend nccl (a build with CUDA): one GPU per rank (the local rank
 * modulo the device count), device copies of every buffer, the
 * communicator of reshard_comm_create_nccl_mpi(MPI_COMM_WORLD), and each
 * call is reshard_plan_execute on a CUDA stream followed by
 * cudaStreamSynchronize. -c 1 fills and checks host buffers as above and
 * moves them to and from the device around the checked run. The baselines
 * move host buffers over MPI, so they are refused (exit 2) with
 * --backend nccl rather than compared against another kind of memory.
 * --backend ipc: the same over reshard_comm_create_cuda_ipc (over
 * reshard_comm_create_mpi(MPI_COMM_WORLD)): ranks of one node, several
 * per GPU allowed; the device buffers are registered
 * (reshard_plan_register_buffers: direct copies, no staging) unless
 * RESHARD_PERF_IPC_STAGED=1. --backend ucx-cuda: the same over
 * reshard_comm_create_ucx_cuda (GPU memory over UCX) over a UCX
 * communicator made as --ucx's below; several ranks per GPU allowed;
 * staged (UCX moves the staging pool's device memory); the UCX loaded
 * must move CUDA memory (a CUDA-enabled UCX first on LD_LIBRARY_PATH).
 * RESHARD_PERF_GRAPH=1 (NCCL and CUDA IPC):
 * a plan's execute is captured into a CUDA graph at its second call, and
 * later calls launch the graph. The CUDA side lives in tools/perf_nccl.c.
 *
 * --ucx: the same plan over a UCX communicator (reshard_comm_create_ucx,
 * its rendezvous at rank 0's host name and a free port, or
 * RESHARD_PERF_UCX_RENDEZVOUS) runs as one more method, interleaved with
 * the MPI one (table row "ucx"), and its cost is printed before the
 * result line as
 *   # ucx: time_us=T ratio=R   (R = T / the MPI plan's median)
 * so the two host transports are compared in one run on the same data;
 * and a second UCX plan with its buffers registered
 * (reshard_plan_register_buffers: one-sided reads, no staging) as
 * "ucx-reg", printed the same way (skipped, with the reason, where the
 * plan cannot register: a cast).
 *
 * --verify: a second plan of the same layouts with RESHARD_FLAG_VERIFY
 * runs as one more method ("reshard+verify"), interleaved with the plain
 * one (table row "verify"), and its cost is printed before the result
 * line as
 *   # verify: time_us=T ratio=R   (R = T / the plain plan's median)
 * Every backend (on device transports the sums are kernels). */
#include <mpi.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef RESHARD_SIMGRID_BUILD
#include <sys/resource.h> /* getrusage: planning's real CPU time, which SMPI does not simulate */
/* RESHARD_SIM_FOLD=1 (main): every rank's data folded onto the same
 * pages, nothing checked. The baselines then move the same bytes between
 * the same ranks as plain bytes: SMPI charges bytes, not layouts, and
 * its copies through derived datatypes (into fresh temporary buffers)
 * would take the 2-core machine hours at panel size. */
static int folded;
#else
enum { folded = 0 };
#endif

#include "cli.h"
#include "reshard_internal.h"
#include "reshard.h"
#include "watchdog.h" /* examples/: every blocking MPI call of the tool ends at a deadline */
#include "perf_nccl.h"
#include "reshard_mpi.h"
#include "reshard_selftest.h"
#ifdef RESHARD_HAVE_UCX
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include "reshard_ucx.h"
#endif

static int world_rank, world_size;

static void say0(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void say0(const char *fmt, ...) {
  if (world_rank) return;
  va_list ap;
  va_start(ap, fmt);
  vprintf(fmt, ap);
  va_end(ap);
  fflush(stdout);
}

/* ------------------------------------------------------------------ */
/* Boxes and fragments                                                 */
/* ------------------------------------------------------------------ */

static size_t tensor_esize(const reshard_layout_t *L, int t) {
  reshard_dtype_t dt;
  reshard_layout_tensor_info(L, t, NULL, &dt, NULL, NULL);
  return reshard_dtype_size(dt);
}

static int64_t box_elems(int nd, const int64_t *ext) {
  int64_t n = 1;
  for (int d = 0; d < nd; d++) n *= ext[d];
  return n;
}

/* Copies a box of `ext` elements between two strided views (element
 * strides), innermost rows with memcpy where both sides are contiguous. */
static void box_copy(int nd, const int64_t *ext, size_t es, const unsigned char *src, const int64_t *sstr,
                     unsigned char *dst, const int64_t *dstr) {
  if (folded) return; /* garbage data, and host copies cost no simulated time */
  for (int d = 0; d < nd; d++)
    if (ext[d] <= 0) return;
  if (nd == 0) {
    memcpy(dst, src, es);
    return;
  }
  int64_t idx[RESHARD_MAX_DIMS] = {0};
  int64_t n = ext[nd - 1];
  int contiguous = sstr[nd - 1] == 1 && dstr[nd - 1] == 1;
  for (;;) {
    int64_t so = 0, dof = 0;
    for (int d = 0; d < nd - 1; d++) {
      so += idx[d] * sstr[d];
      dof += idx[d] * dstr[d];
    }
    const unsigned char *s = src + so * (int64_t)es;
    unsigned char *t = dst + dof * (int64_t)es;
    if (contiguous) {
      memcpy(t, s, (size_t)n * es);
    } else {
      for (int64_t i = 0; i < n; i++) memcpy(t + i * dstr[nd - 1] * (int64_t)es, s + i * sstr[nd - 1] * (int64_t)es, es);
    }
    int d = nd - 2;
    while (d >= 0 && ++idx[d] == ext[d]) idx[d--] = 0;
    if (d < 0) return;
  }
}

static void dense_strides(int nd, const int64_t *ext, int64_t *str) {
  int64_t s = 1;
  for (int d = nd - 1; d >= 0; d--) {
    str[d] = s;
    s *= ext[d];
  }
}

static int frag_is_dense(const reshard_fragment_info_t *f) {
  int64_t s = 1;
  for (int d = f->ndim - 1; d >= 0; d--) {
    if (f->extent[d] > 1 && f->strides[d] != s) return 0;
    s *= f->extent[d];
  }
  return 1;
}

/* Element offset (in the fragment's buffer, from its byte_offset) of
 * global coordinate `at`. */
static int64_t frag_elem_offset(const reshard_fragment_info_t *f, const int64_t *at) {
  int64_t off = 0;
  for (int d = 0; d < f->ndim; d++) off += (at[d] - f->start[d]) * f->strides[d];
  return off;
}

static int boxes_intersect(int nd, const int64_t *as, const int64_t *ae, const int64_t *bs, const int64_t *be,
                           int64_t *start, int64_t *ext) {
  for (int d = 0; d < nd; d++) {
    int64_t lo = as[d] > bs[d] ? as[d] : bs[d];
    int64_t hi = as[d] + ae[d] < bs[d] + be[d] ? as[d] + ae[d] : bs[d] + be[d];
    if (hi <= lo) return 0;
    if (start) start[d] = lo, ext[d] = hi - lo;
  }
  return 1;
}

/* ------------------------------------------------------------------ */
/* The run context                                                     */
/* ------------------------------------------------------------------ */

typedef struct ctx {
  cli_opts o;
  cli_layouts L;
  reshard_selftest_t s, d;
  int is_src, is_dst;
  int64_t delivered;       /* bytes of destination fragments, all ranks */
  int64_t delivered_elems;
  int *src_of_dst;         /* destination tensor id -> source tensor id */
  perf_nccl *dev;          /* --backend nccl: device buffers and stream */
} ctx;

typedef struct method {
  const char *name;
  int (*run)(ctx *c, void *state); /* 0 or an error (printed by the method) */
  void *state;
  int64_t crossed; /* bytes that crossed between ranks per iteration, all ranks */
  int64_t max_out, max_in; /* the busiest rank's bytes sent to / received from
                              other ranks per iteration */
  /* results */
  int skipped;
  char note[256]; /* why it was skipped */
  char info[256]; /* how it was set up */
  double med_us, min_us, max_us;
  int64_t wrong;
  int failed;
} method;

/* Collective: the largest per-rank egress and ingress. */
static void set_peaks(method *m, int64_t out, int64_t in) {
  int64_t v[2] = {out, in}, mx[2];
  WD_CALL(MPI_Allreduce(v, mx, 2, MPI_INT64_T, MPI_MAX, MPI_COMM_WORLD));
  m->max_out = mx[0];
  m->max_in = mx[1];
}

static void reset_destination(ctx *c) {
  for (int b = 0; b < c->d.nbuf; b++)
    if (c->d.ptr[b]) memset(c->d.ptr[b], RESHARD_SELFTEST_SENTINEL, c->d.bytes[b]);
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

/* One timed call of m on every rank: the slowest rank's seconds, or -1
 * when the call failed on any rank (every rank learns it). */
static double time_once(ctx *c, method *m) {
  WD_CALL(MPI_Barrier(MPI_COMM_WORLD));
  double t0 = MPI_Wtime();
  int err = m->run(c, m->state);
  double dt = MPI_Wtime() - t0;
  double v[2] = {dt, err ? 1.0 : 0.0}, mx[2];
  WD_CALL(MPI_Allreduce(v, mx, 2, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD));
  return mx[1] > 0 ? -1.0 : mx[0];
}

/* The methods run interleaved, iteration by iteration, so that the load of
 * a shared machine falls on all of them alike and their ratios mean
 * something. Every rank makes the same calls; an error on any rank stops
 * that method on every rank. */
static void run_methods(ctx *c, method *ms, int nm) {
  int n = c->o.iters;
  double **t = calloc((size_t)nm, sizeof *t);
  for (int k = 0; k < nm; k++) {
    t[k] = calloc((size_t)n, sizeof **t);
    if (!t[k]) abort();
  }
  for (int k = 0; k < nm; k++)
    for (int i = 0; i < c->o.warmup && !ms[k].skipped && !ms[k].failed; i++)
      if (time_once(c, &ms[k]) < 0) ms[k].failed = 1;
  for (int i = 0; i < n; i++)
    for (int k = 0; k < nm; k++) {
      if (ms[k].skipped || ms[k].failed) continue;
      double dt = time_once(c, &ms[k]);
      if (dt < 0) ms[k].failed = 1;
      else t[k][i] = dt * 1e6;
    }
  for (int k = 0; k < nm; k++) {
    method *m = &ms[k];
    if (!m->skipped && !m->failed) {
      qsort(t[k], (size_t)n, sizeof **t, cmp_double);
      m->med_us = n % 2 ? t[k][n / 2] : 0.5 * (t[k][n / 2 - 1] + t[k][n / 2]);
      m->min_us = t[k][0];
      m->max_us = t[k][n - 1];
    }
    free(t[k]);
    if (m->skipped || m->failed || !c->o.check) continue;
    /* Fresh values for this method only, and destinations back to the
     * sentinel, so that nothing an earlier run wrote can pass for this
     * one's result. */
    uint64_t step = (uint64_t)k + 1;
    reshard_selftest_fill(&c->s, c->L.src, step);
    reset_destination(c);
    char derr[512];
    int err = 0;
#ifdef RESHARD_PERF_HAVE_NCCL
    if (c->dev && perf_nccl_upload(c->dev, &c->s, &c->d, derr, sizeof derr)) {
      fprintf(stderr, "reshard_perf: rank %d: %s\n", world_rank, derr);
      err = 1;
    }
#endif
    WD_CALL(MPI_Barrier(MPI_COMM_WORLD));
    if (!err) err = m->run(c, m->state);
#ifdef RESHARD_PERF_HAVE_NCCL
    if (!err && c->dev && perf_nccl_download(c->dev, &c->d, derr, sizeof derr)) {
      fprintf(stderr, "reshard_perf: rank %d: %s\n", world_rank, derr);
      err = 1;
    }
#endif
    (void)derr;
    int64_t bad = 0;
    if (!err) {
      if (c->o.inject_error && c->d.nfrags && world_rank == c->L.first_dst) {
        const reshard_fragment_info_t *f = &c->d.frags[0];
        c->d.ptr[f->buffer_id][f->byte_offset] ^= 0x5a;
      }
      bad = reshard_selftest_check_from(&c->d, c->L.dst, c->L.src, world_rank, step, m->name); /* casts too */
    }
    int64_t v[2] = {bad, err ? 1 : 0}, sum[2];
    WD_CALL(MPI_Allreduce(v, sum, 2, MPI_INT64_T, MPI_SUM, MPI_COMM_WORLD));
    m->wrong = sum[0];
    if (sum[1]) m->failed = 1;
    reshard_selftest_fill(&c->s, c->L.src, 0);
  }
  free(t);
}

/* ------------------------------------------------------------------ */
/* reshard                                                             */
/* ------------------------------------------------------------------ */

typedef struct reshard_state {
  reshard_plan_t *plan;
} reshard_state;

static int run_reshard(ctx *c, void *state) {
  reshard_state *st = state;
#ifdef RESHARD_PERF_HAVE_NCCL
  if (c->dev) {
    char err[1024];
    if (!perf_nccl_execute(c->dev, st->plan, err, sizeof err)) return 0;
    fprintf(stderr, "reshard_perf: rank %d: %s\n", world_rank, err);
    return 1;
  }
#endif
  reshard_result_t r = reshard_plan_execute(st->plan, (void *const *)c->s.ptr, (size_t)c->s.nbuf,
                                            (void *const *)c->d.ptr, (size_t)c->d.nbuf, NULL);
  if (r) {
    fprintf(stderr, "reshard_perf: rank %d: reshard_plan_execute: %s: %s\n", world_rank, reshard_result_string(r),
            reshard_last_error());
    /* A partner that stopped or failed: waiting in the tool's own
     * collectives for it would only end at the watchdog. */
    if (r == RESHARD_ERROR_TIMEOUT || r == RESHARD_ERROR_REMOTE) MPI_Abort(MPI_COMM_WORLD, 1);
    return 1;
  }
  return 0;
}

/* ------------------------------------------------------------------ */
/* First-replica selection (both baselines)                            */
/* ------------------------------------------------------------------ */

typedef struct chosen {
  int rank;
  reshard_fragment_info_t f;
} chosen;

typedef struct selection {
  int ntensors;
  chosen **by_tensor;
  int *count, *cap;
} selection;

static void selection_free(selection *sel) {
  for (int t = 0; t < sel->ntensors; t++) free(sel->by_tensor[t]);
  free(sel->by_tensor);
  free(sel->count);
  free(sel->cap);
  memset(sel, 0, sizeof *sel);
}

/* Source fragments in rank order, skipping repeats of a box already taken.
 * Returns 0, or -1 with why in note. */
static int select_first_replica(ctx *c, selection *sel, char *note, size_t notelen) {
  const reshard_layout_t *S = c->L.src;
  sel->ntensors = reshard_layout_num_tensors(S);
  sel->by_tensor = calloc((size_t)sel->ntensors + 1, sizeof *sel->by_tensor);
  sel->count = calloc((size_t)sel->ntensors + 1, sizeof *sel->count);
  sel->cap = calloc((size_t)sel->ntensors + 1, sizeof *sel->cap);
  if (!sel->by_tensor || !sel->count || !sel->cap) return snprintf(note, notelen, "out of memory"), -1;
  reshard_fragment_info_t *fr = NULL;
  size_t frcap = 0;
  for (int r = 0; r < world_size; r++) {
    size_t n = 0;
    if (reshard_layout_fragments(S, r, NULL, 0, &n)) return snprintf(note, notelen, "%s", reshard_last_error()), -1;
    if (n > frcap) {
      free(fr);
      frcap = n;
      fr = malloc(n * sizeof *fr);
      if (!fr) return snprintf(note, notelen, "out of memory"), -1;
    }
    if (n && reshard_layout_fragments(S, r, fr, n, &n)) {
      free(fr);
      return snprintf(note, notelen, "%s", reshard_last_error()), -1;
    }
    for (size_t i = 0; i < n; i++) {
      const reshard_fragment_info_t *f = &fr[i];
      int t = f->tensor_id, take = 1;
      for (int k = 0; k < sel->count[t] && take; k++) {
        const reshard_fragment_info_t *g = &sel->by_tensor[t][k].f;
        if (!boxes_intersect(f->ndim, f->start, f->extent, g->start, g->extent, NULL, NULL)) continue;
        int same = 1;
        for (int d = 0; d < f->ndim; d++) same &= f->start[d] == g->start[d] && f->extent[d] == g->extent[d];
        if (!same) {
          const char *name;
          reshard_layout_tensor_info(S, t, &name, NULL, NULL, NULL);
          snprintf(note, notelen, "tensor '%s': source fragments of ranks %d and %d partially overlap (no first replica)",
                   name, sel->by_tensor[t][k].rank, r);
          free(fr);
          return -1;
        }
        take = 0;
      }
      if (!take) continue;
      if (sel->count[t] == sel->cap[t]) {
        int cap = sel->cap[t] ? 2 * sel->cap[t] : 4;
        chosen *v = realloc(sel->by_tensor[t], (size_t)cap * sizeof *v);
        if (!v) {
          free(fr);
          return snprintf(note, notelen, "out of memory"), -1;
        }
        sel->by_tensor[t] = v;
        sel->cap[t] = cap;
      }
      sel->by_tensor[t][sel->count[t]++] = (chosen){r, *f};
    }
  }
  free(fr);
  return 0;
}

/* ------------------------------------------------------------------ */
/* Baseline: gather to source rank 0, broadcast                        */
/* ------------------------------------------------------------------ */

typedef struct bcast_state {
  selection sel;
  MPI_Comm bcomm;          /* rank 0 and every destination rank */
  MPI_Datatype **root_types; /* [tensor][chosen]: the box in the full tensor */
  unsigned char *full, *pack;
  int64_t *tensor_bytes;
  int **dst_frags;         /* [src tensor]: indices into c->d.frags */
  int *ndst_frags;
} bcast_state;

static void bcast_free(bcast_state *b) {
  if (!b) return;
  if (b->root_types)
    for (int t = 0; t < b->sel.ntensors; t++) {
      for (int k = 0; b->root_types[t] && k < b->sel.count[t]; k++)
        if (b->root_types[t][k] != MPI_DATATYPE_NULL) MPI_Type_free(&b->root_types[t][k]);
      free(b->root_types[t]);
    }
  free(b->root_types);
  if (b->dst_frags)
    for (int t = 0; t < b->sel.ntensors; t++) free(b->dst_frags[t]);
  free(b->dst_frags);
  free(b->ndst_frags);
  free(b->tensor_bytes);
  rs_bulk_free(b->full);
  rs_bulk_free(b->pack);
  if (b->bcomm != MPI_COMM_NULL) MPI_Comm_free(&b->bcomm);
  selection_free(&b->sel);
  free(b);
}

static MPI_Datatype elem_type(size_t es) {
  MPI_Datatype t;
  MPI_Type_contiguous((int)es, MPI_BYTE, &t);
  MPI_Type_commit(&t);
  return t;
}

static int run_broadcast(ctx *c, void *state) {
  bcast_state *b = state;
  const reshard_layout_t *S = c->L.src;
  for (int t = 0; t < b->sel.ntensors; t++) {
    int64_t bytes = b->tensor_bytes[t];
    if (bytes == 0) continue;
    size_t es = tensor_esize(S, t);
    int nd;
    int64_t shape[RESHARD_MAX_DIMS], full_str[RESHARD_MAX_DIMS];
    reshard_layout_tensor_info(S, t, NULL, NULL, &nd, shape);
    dense_strides(nd, shape, full_str);
    const chosen *ch = b->sel.by_tensor[t];
    int nch = b->sel.count[t];
    /* gather */
    if (world_rank == 0) {
      MPI_Request *req = malloc((size_t)(nch + 1) * sizeof *req);
      int nreq = 0;
      for (int k = 0; k < nch; k++)
        if (ch[k].rank != 0 && folded)
          MPI_Irecv(b->full, (int)(box_elems(nd, ch[k].f.extent) * (int64_t)es), MPI_BYTE, ch[k].rank, 0, MPI_COMM_WORLD,
                    &req[nreq++]);
        else if (ch[k].rank != 0)
          MPI_Irecv(b->full, 1, b->root_types[t][k], ch[k].rank, 0, MPI_COMM_WORLD, &req[nreq++]);
      for (int k = 0; k < nch; k++)
        if (ch[k].rank == 0) {
          const reshard_fragment_info_t *f = &ch[k].f;
          int64_t o = 0;
          for (int d = 0; d < nd; d++) o += f->start[d] * full_str[d];
          box_copy(nd, f->extent, es, c->s.ptr[f->buffer_id] + f->byte_offset, f->strides, b->full + o * (int64_t)es,
                   full_str);
        }
      WD_CALL(MPI_Waitall(nreq, req, MPI_STATUSES_IGNORE));
      free(req);
    } else {
      for (int k = 0; k < nch; k++) {
        if (ch[k].rank != world_rank) continue;
        const reshard_fragment_info_t *f = &ch[k].f;
        int64_t n = box_elems(f->ndim, f->extent);
        const unsigned char *from = c->s.ptr[f->buffer_id] + f->byte_offset;
        if (!frag_is_dense(f)) {
          int64_t str[RESHARD_MAX_DIMS];
          dense_strides(f->ndim, f->extent, str);
          box_copy(f->ndim, f->extent, es, from, f->strides, b->pack, str);
          from = b->pack;
        }
        /* one message per fragment (at most 1 GiB: see bcast_setup) */
        WD_CALL(MPI_Send(from, (int)(n * (int64_t)es), MPI_BYTE, 0, 0, MPI_COMM_WORLD));
      }
    }
    /* broadcast */
    if (b->bcomm != MPI_COMM_NULL) {
      for (int64_t off = 0; off < bytes;) {
        int piece = bytes - off > (1 << 30) ? 1 << 30 : (int)(bytes - off);
        WD_CALL(MPI_Bcast(b->full + off, piece, MPI_BYTE, 0, b->bcomm));
        off += piece;
      }
    }
    /* copy out */
    for (int i = 0; i < b->ndst_frags[t]; i++) {
      const reshard_fragment_info_t *f = &c->d.frags[b->dst_frags[t][i]];
      int64_t o = 0;
      for (int d = 0; d < nd; d++) o += f->start[d] * full_str[d];
      box_copy(nd, f->extent, es, b->full + o * (int64_t)es, full_str, c->d.ptr[f->buffer_id] + f->byte_offset,
               f->strides);
    }
  }
  return 0;
}

/* What bcast_setup counts over the tensors: the bytes that cross between
 * ranks (all ranks'), this rank's own out and in, and the largest tensor
 * and source fragment (the buffers' sizes). */
typedef struct bcast_tally {
  int64_t *crossed, my_out, my_in, max_tensor, max_frag;
} bcast_tally;

/* One gather message's bytes at most; RESHARD_PERF_BCAST_MAX_MSG lowers it
 * (tests: the skip path without gigabytes). */
static int64_t bcast_max_msg(void) {
  int64_t max_msg = 1 << 30;
  const char *mm = getenv("RESHARD_PERF_BCAST_MAX_MSG");
  if (mm && atoll(mm) > 0 && atoll(mm) < max_msg) max_msg = atoll(mm);
  return max_msg;
}

/* The per-tensor arrays of b; 1 with a note when out of memory. */
static int bcast_alloc(bcast_state *b, int nt, char *note, size_t notelen) {
  b->tensor_bytes = calloc((size_t)nt + 1, sizeof *b->tensor_bytes);
  b->root_types = calloc((size_t)nt + 1, sizeof *b->root_types);
  b->dst_frags = calloc((size_t)nt + 1, sizeof *b->dst_frags);
  b->ndst_frags = calloc((size_t)nt + 1, sizeof *b->ndst_frags);
  if (!b->tensor_bytes || !b->root_types || !b->dst_frags || !b->ndst_frags)
    return snprintf(note, notelen, "out of memory"), 1;
  return 0;
}

/* Rank 0's datatype for receiving fragment f of tensor `name` (nd dims of
 * shape, elements el) in place in the full tensor; 1 with a note when a
 * dim exceeds MPI's int (*type then stays MPI_DATATYPE_NULL). */
static int root_subarray(int nd, const int64_t *shape, const reshard_fragment_info_t *f, MPI_Datatype el,
                         const char *name, MPI_Datatype *type, char *note, size_t notelen) {
  if (nd == 0) {
    MPI_Type_dup(el, type);
    return 0;
  }
  int bad = 0;
  int sizes[RESHARD_MAX_DIMS], sub[RESHARD_MAX_DIMS], st[RESHARD_MAX_DIMS];
  for (int d = 0; d < nd; d++) {
    if (shape[d] > 0x7fffffff) {
      bad = 1;
      snprintf(note, notelen, "tensor '%s': dim %d exceeds MPI's int", name, d);
    }
    sizes[d] = (int)shape[d];
    sub[d] = (int)f->extent[d];
    st[d] = (int)f->start[d];
  }
  if (bad) return 1;
  MPI_Type_create_subarray(nd, sizes, sub, st, MPI_ORDER_C, el, type);
  MPI_Type_commit(type);
  return 0;
}

/* Source tensor t: its bytes, rank 0's receive types for its chosen
 * fragments, and what it adds to the tally; 1 with a note when the
 * baseline cannot move it. */
static int bcast_tensor(ctx *c, bcast_state *b, int t, int64_t max_msg, int nmembers, bcast_tally *y, char *note,
                        size_t notelen) {
  const reshard_layout_t *S = c->L.src;
  int bad = 0;
  int nd;
  int64_t shape[RESHARD_MAX_DIMS];
  const char *name;
  reshard_layout_tensor_info(S, t, &name, NULL, &nd, shape);
  size_t es = tensor_esize(S, t);
  int64_t vol = box_elems(nd, shape), covered = 0;
  b->tensor_bytes[t] = vol * (int64_t)es;
  if (b->tensor_bytes[t] > y->max_tensor) y->max_tensor = b->tensor_bytes[t];
  b->root_types[t] = calloc((size_t)b->sel.count[t] + 1, sizeof **b->root_types);
  if (!b->root_types[t]) return snprintf(note, notelen, "out of memory"), 1;
  /* every entry a null handle before any can be skipped: a zeroed
   * handle is not MPI_DATATYPE_NULL where handles are pointers (Open
   * MPI, SMPI), and bcast_free would free it */
  for (int k = 0; k < b->sel.count[t]; k++) b->root_types[t][k] = MPI_DATATYPE_NULL;
  MPI_Datatype el = elem_type(es);
  for (int k = 0; k < b->sel.count[t]; k++) {
    const reshard_fragment_info_t *f = &b->sel.by_tensor[t][k].f;
    int64_t fb = box_elems(nd, f->extent) * (int64_t)es;
    covered += box_elems(nd, f->extent);
    b->root_types[t][k] = MPI_DATATYPE_NULL;
    if (b->sel.by_tensor[t][k].rank != 0) {
      *y->crossed += fb;
      if (world_rank == 0) y->my_in += fb;
      if (world_rank == b->sel.by_tensor[t][k].rank) y->my_out += fb;
    }
    if (fb > y->max_frag) y->max_frag = fb;
    if (fb > max_msg) {
      bad = 1;
      snprintf(note, notelen, "tensor '%s': a source fragment of %lld bytes exceeds one gather message", name,
               (long long)fb);
      break;
    }
    if (world_rank != 0 || b->sel.by_tensor[t][k].rank == 0) continue;
    if ((bad = root_subarray(nd, shape, f, el, name, &b->root_types[t][k], note, notelen))) break;
  }
  MPI_Type_free(&el);
  if (!bad && covered != vol) {
    bad = 1;
    snprintf(note, notelen, "tensor '%s': the source fragments cover %lld of %lld elements", name, (long long)covered,
             (long long)vol);
  }
  *y->crossed += b->tensor_bytes[t] * (nmembers - 1);
  /* at least one copy leaves the root; every other member receives one */
  if (world_rank == 0 && nmembers > 1) y->my_out += b->tensor_bytes[t];
  if (world_rank != 0 && c->is_dst) y->my_in += b->tensor_bytes[t];
  return bad;
}

/* Once every rank agreed to run it: the baseline's description, the
 * destination fragments by source tensor, the broadcast communicator and
 * the buffers. */
static void bcast_finish(ctx *c, bcast_state *b, method *m, int nmembers, const bcast_tally *y) {
  int nt = b->sel.ntensors;
  set_peaks(m, y->my_out, y->my_in);
  long long nfr = 0;
  for (int t = 0; t < nt; t++) nfr += b->sel.count[t];
  snprintf(m->info, sizeof m->info,
           "per tensor: gather %lld first-replica fragments (of %d tensors) at rank 0, MPI_Bcast to %d ranks, copy out",
           nfr, nt, nmembers);
  /* destination fragments by source tensor */
  for (size_t i = 0; i < c->d.nfrags; i++) {
    int t = c->src_of_dst[c->d.frags[i].tensor_id];
    int *v2 = realloc(b->dst_frags[t], (size_t)(b->ndst_frags[t] + 1) * sizeof *v2);
    if (!v2) abort();
    b->dst_frags[t] = v2;
    v2[b->ndst_frags[t]++] = (int)i;
  }
  int member = world_rank == 0 || c->is_dst;
  WD_CALL(MPI_Comm_split(MPI_COMM_WORLD, member ? 0 : MPI_UNDEFINED, world_rank, &b->bcomm));
  if (member) b->full = rs_bulk_malloc((size_t)y->max_tensor + 1);
  b->pack = rs_bulk_malloc((size_t)y->max_frag + 1);
  if ((member && !b->full) || !b->pack) {
    fprintf(stderr, "reshard_perf: rank %d: out of memory for the broadcast baseline\n", world_rank);
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
}

/* Each gather message is one source fragment, received at the root in
 * place through a subarray datatype; fragments over 1 GiB (beyond one
 * message's int count) skip the baseline. Returns NULL with a note when the
 * baseline cannot run. */
static bcast_state *bcast_setup(ctx *c, method *m, char *note, size_t notelen) {
  bcast_tally y = {.crossed = &m->crossed};
  bcast_state *b = calloc(1, sizeof *b);
  if (!b) return snprintf(note, notelen, "out of memory"), NULL;
  b->bcomm = MPI_COMM_NULL;
  int bad = select_first_replica(c, &b->sel, note, notelen) != 0;
  int nt = b->sel.ntensors;
  int64_t max_msg = bcast_max_msg();
  *y.crossed = 0;
  int nmembers = 1;
  for (int r = c->L.first_dst; r < c->L.first_dst + c->L.ndst; r++) nmembers += r != 0;
  if (!bad) bad = bcast_alloc(b, nt, note, notelen);
  for (int t = 0; t < nt && !bad; t++) bad = bcast_tensor(c, b, t, max_msg, nmembers, &y, note, notelen);
  /* every rank must agree to run the baseline */
  int v = bad, any;
  WD_CALL(MPI_Allreduce(&v, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD));
  if (any) {
    if (!bad) snprintf(note, notelen, "another rank could not set the baseline up");
    bcast_free(b);
    return NULL;
  }
  bcast_finish(c, b, m, nmembers, &y);
  return b;
}

/* ------------------------------------------------------------------ */
/* Baseline: one MPI_Alltoallw                                         */
/* ------------------------------------------------------------------ */

typedef struct a2aw_state {
  MPI_Datatype *stypes, *rtypes;
  int *scounts, *rcounts, *sdispls, *rdispls;
  /* folded runs: each peer's bytes, moved as plain bytes from scratch */
  int64_t *sbytes, *rbytes;
  unsigned char *scratch;
} a2aw_state;

static void a2aw_free(a2aw_state *a) {
  if (!a) return;
  for (int r = 0; r < world_size; r++) {
    if (a->stypes && a->scounts[r]) MPI_Type_free(&a->stypes[r]);
    if (a->rtypes && a->rcounts[r]) MPI_Type_free(&a->rtypes[r]);
  }
  free(a->stypes);
  free(a->rtypes);
  free(a->scounts);
  free(a->rcounts);
  free(a->sdispls);
  free(a->rdispls);
  free(a->sbytes);
  free(a->rbytes);
  rs_bulk_free(a->scratch);
  free(a);
}

/* The box [bs, bs+be) of fragment f, which lies in buf: a subarray of the
 * fragment when its strides are row-major with padding (sizes derived from
 * the strides), nested hvectors otherwise. *addr receives the absolute
 * address the type is relative to. */
static int box_datatype(const reshard_fragment_info_t *f, unsigned char *buf, const int64_t *bs, const int64_t *be,
                        MPI_Datatype el, size_t es, MPI_Aint *addr, MPI_Datatype *out) {
  int nd = f->ndim;
  static int force_hvector = -1;
  if (force_hvector < 0) force_hvector = getenv("RESHARD_PERF_HVECTOR") != NULL;
  int sub_ok = nd > 0 && f->strides[nd - 1] == 1 && !force_hvector;
  int sizes[RESHARD_MAX_DIMS], sub[RESHARD_MAX_DIMS], st[RESHARD_MAX_DIMS];
  for (int d = 0; d < nd && sub_ok; d++) {
    if (d > 0 && (f->strides[d] <= 0 || f->strides[d - 1] % f->strides[d])) {
      sub_ok = 0;
      break;
    }
    int64_t size = d == 0 ? f->extent[0] : f->strides[d - 1] / f->strides[d];
    if (size < f->extent[d] || size > 0x7fffffff || be[d] > 0x7fffffff) sub_ok = 0;
    sizes[d] = (int)size;
    sub[d] = (int)be[d];
    st[d] = (int)(bs[d] - f->start[d]);
  }
  if (sub_ok) {
    MPI_Get_address(buf + f->byte_offset, addr);
    MPI_Type_create_subarray(nd, sizes, sub, st, MPI_ORDER_C, el, out);
    return 1;
  }
  MPI_Get_address(buf + f->byte_offset + (size_t)(frag_elem_offset(f, bs) * (int64_t)es), addr);
  MPI_Datatype t;
  MPI_Type_dup(el, &t);
  for (int d = nd - 1; d >= 0; d--) {
    MPI_Datatype v;
    MPI_Type_create_hvector((int)be[d], 1, (MPI_Aint)(f->strides[d] * (int64_t)es), t, &v);
    MPI_Type_free(&t);
    t = v;
  }
  *out = t;
  return 0;
}

typedef struct typelist {
  MPI_Datatype *t;
  MPI_Aint *a;
  int n, cap;
} typelist;

static void typelist_push(typelist *l, MPI_Datatype t, MPI_Aint a) {
  if (l->n == l->cap) {
    l->cap = l->cap ? 2 * l->cap : 8;
    l->t = realloc(l->t, (size_t)l->cap * sizeof *l->t);
    l->a = realloc(l->a, (size_t)l->cap * sizeof *l->a);
    if (!l->t || !l->a) abort();
  }
  l->t[l->n] = t;
  l->a[l->n++] = a;
}

/* One struct per peer over the boxes of its list (freed). */
static int typelist_commit(typelist *l, MPI_Datatype *out) {
  if (!l->n) return 0;
  int *ones = malloc((size_t)l->n * sizeof *ones);
  if (!ones) abort();
  for (int i = 0; i < l->n; i++) ones[i] = 1;
  MPI_Type_create_struct(l->n, ones, l->a, l->t, out);
  MPI_Type_commit(out);
  for (int i = 0; i < l->n; i++) MPI_Type_free(&l->t[i]);
  free(ones);
  free(l->t);
  free(l->a);
  memset(l, 0, sizeof *l);
  return 1;
}

static a2aw_state *a2aw_setup(ctx *c, method *m, char *note, size_t notelen) {
  selection sel;
  memset(&sel, 0, sizeof sel);
  int bad = select_first_replica(c, &sel, note, notelen) != 0;
  a2aw_state *a = calloc(1, sizeof *a);
  typelist *sl = calloc((size_t)world_size, sizeof *sl), *rl = calloc((size_t)world_size, sizeof *rl);
  if (!a || !sl || !rl) abort();
  a->stypes = calloc((size_t)world_size, sizeof *a->stypes);
  a->rtypes = calloc((size_t)world_size, sizeof *a->rtypes);
  a->scounts = calloc((size_t)world_size, sizeof(int));
  a->rcounts = calloc((size_t)world_size, sizeof(int));
  a->sdispls = calloc((size_t)world_size, sizeof(int));
  a->rdispls = calloc((size_t)world_size, sizeof(int));
  a->sbytes = calloc((size_t)world_size, sizeof *a->sbytes);
  a->rbytes = calloc((size_t)world_size, sizeof *a->rbytes);
  if (!a->stypes || !a->rtypes || !a->scounts || !a->rcounts || !a->sdispls || !a->rdispls || !a->sbytes || !a->rbytes)
    abort();
  if (folded && !(a->scratch = rs_bulk_malloc((size_t)1 << 30))) abort();
  int64_t my_cross = 0, my_in = 0, kinds[2] = {0, 0};
  reshard_fragment_info_t *fr = NULL;
  size_t frcap = 0;
  MPI_Datatype *els = calloc(17, sizeof *els);
  if (!els) abort();
  /* Every rank walks every destination rank's fragments in the same order,
   * so a pair's boxes line up on both sides. */
  for (int d = c->L.first_dst; d < c->L.first_dst + c->L.ndst && !bad; d++) {
    size_t n = 0;
    reshard_layout_fragments(c->L.dst, d, NULL, 0, &n);
    if (n > frcap) {
      free(fr);
      frcap = n;
      fr = malloc(n * sizeof *fr);
      if (!fr) abort();
    }
    if (n) reshard_layout_fragments(c->L.dst, d, fr, n, &n);
    for (size_t i = 0; i < n; i++) {
      const reshard_fragment_info_t *fd = &fr[i];
      int t = c->src_of_dst[fd->tensor_id];
      size_t es = tensor_esize(c->L.src, t);
      if (es > 16) abort();
      if (!els[es]) els[es] = elem_type(es);
      for (int k = 0; k < sel.count[t]; k++) {
        const chosen *ch = &sel.by_tensor[t][k];
        int64_t bs[RESHARD_MAX_DIMS], be[RESHARD_MAX_DIMS];
        if (fd->ndim && !boxes_intersect(fd->ndim, fd->start, fd->extent, ch->f.start, ch->f.extent, bs, be)) continue;
        int s = ch->rank;
        if (s != world_rank && d != world_rank) continue;
        MPI_Datatype ty;
        MPI_Aint addr;
        if (folded) { /* plain bytes: no types */
          int64_t nb = box_elems(fd->ndim, be) * (int64_t)es;
          if (s == world_rank) a->sbytes[d] += nb;
          if (d == world_rank) a->rbytes[s] += nb;
          if (s == world_rank && d != s) my_cross += nb;
          if (d == world_rank && d != s) my_in += nb;
          continue;
        }
        if (s == world_rank) {
          kinds[box_datatype(&ch->f, c->s.ptr[ch->f.buffer_id], bs, be, els[es], es, &addr, &ty)]++;
          typelist_push(&sl[d], ty, addr);
          if (d != s) my_cross += box_elems(fd->ndim, be) * (int64_t)es;
        }
        if (d == world_rank) {
          kinds[box_datatype(fd, c->d.ptr[fd->buffer_id], bs, be, els[es], es, &addr, &ty)]++;
          typelist_push(&rl[s], ty, addr);
          if (d != s) my_in += box_elems(fd->ndim, be) * (int64_t)es;
        }
      }
    }
  }
  free(fr);
  for (int r = 0; r < world_size; r++) {
    a->scounts[r] = typelist_commit(&sl[r], &a->stypes[r]);
    a->rcounts[r] = typelist_commit(&rl[r], &a->rtypes[r]);
    if (!a->scounts[r]) a->stypes[r] = MPI_BYTE;
    if (!a->rcounts[r]) a->rtypes[r] = MPI_BYTE;
  }
  for (int e = 0; e <= 16; e++)
    if (els[e]) MPI_Type_free(&els[e]);
  free(els);
  free(sl);
  free(rl);
  selection_free(&sel);
  int v = bad, any;
  WD_CALL(MPI_Allreduce(&v, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD));
  if (any) {
    if (!bad) snprintf(note, notelen, "another rank could not set the baseline up");
    a2aw_free(a);
    return NULL;
  }
  WD_CALL(MPI_Allreduce(&my_cross, &m->crossed, 1, MPI_INT64_T, MPI_SUM, MPI_COMM_WORLD));
  set_peaks(m, my_cross, my_in);
  int64_t k_all[2];
  WD_CALL(MPI_Allreduce(kinds, k_all, 2, MPI_INT64_T, MPI_SUM, MPI_COMM_WORLD));
  snprintf(m->info, sizeof m->info,
           "one MPI_Alltoallw, boxes from the first source replica; %lld box sides as subarrays, %lld as hvectors "
           "(strided)",
           (long long)k_all[1], (long long)k_all[0]);
  return a;
}

/* A folded run's alltoallw: every pair's bytes as messages of at most
 * 1 GiB, all posted at once, then waited for, as SMPI's MPI_Alltoallw
 * posts every pair's send and receive and waits for them all. */
static int run_folded_alltoallw(const a2aw_state *a) {
  const int64_t piece = (int64_t)1 << 30;
  int64_t n = 0;
  for (int r = 0; r < world_size; r++) n += (a->sbytes[r] + piece - 1) / piece + (a->rbytes[r] + piece - 1) / piece;
  MPI_Request *req = malloc((size_t)(n + 1) * sizeof *req);
  if (!req) abort();
  int k = 0;
  for (int r = 0; r < world_size; r++)
    for (int64_t off = 0; off < a->rbytes[r]; off += piece)
      MPI_Irecv(a->scratch, (int)(a->rbytes[r] - off < piece ? a->rbytes[r] - off : piece), MPI_BYTE, r, 7,
                MPI_COMM_WORLD, &req[k++]);
  for (int r = 0; r < world_size; r++)
    for (int64_t off = 0; off < a->sbytes[r]; off += piece)
      MPI_Isend(a->scratch, (int)(a->sbytes[r] - off < piece ? a->sbytes[r] - off : piece), MPI_BYTE, r, 7,
                MPI_COMM_WORLD, &req[k++]);
  wd_enter("alltoallw as plain bytes (folded baseline)");
  int err = MPI_Waitall(k, req, MPI_STATUSES_IGNORE);
  wd_leave();
  free(req);
  return err != MPI_SUCCESS;
}

static int run_alltoallw(ctx *c, void *state) {
  (void)c;
  a2aw_state *a = state;
  if (folded) return run_folded_alltoallw(a);
  wd_enter("MPI_Alltoallw (baseline)");
  int err = MPI_Alltoallw(MPI_BOTTOM, a->scounts, a->sdispls, a->stypes, MPI_BOTTOM, a->rcounts, a->rdispls, a->rtypes,
                          MPI_COMM_WORLD);
  wd_leave();
  return err != MPI_SUCCESS;
}

/* ------------------------------------------------------------------ */
/* main                                                                */
/* ------------------------------------------------------------------ */

static int finish(int rc) {
  WD_CALL(MPI_Finalize());
  return rc;
}

static void print_row(const method *m, const ctx *c) {
  if (m->skipped) {
    say0("%12s  skipped: %s\n", m->name, m->note);
    return;
  }
  if (m->failed) {
    say0("%12s  FAILED (a call failed on some rank; see stderr)\n", m->name);
    return;
  }
  double s = m->med_us * 1e-6;
  say0("%12s %14lld %12lld %8s %12.1f %12.1f %12.1f %9.3f %9.3f %9.1f %9.1f %8lld%s\n", m->name,
       (long long)c->delivered, (long long)c->delivered_elems, reshard_dtype_name(c->o.dtype), m->med_us, m->min_us,
       m->max_us, (double)c->delivered / s / 1e9, (double)m->crossed / s / 1e9, (double)m->max_out / 1048576.0,
       (double)m->max_in / 1048576.0, (long long)m->wrong, c->o.check ? "" : " (unchecked)");
}

#ifdef RESHARD_SIMGRID_BUILD
/* RESHARD_SIM_FOLD=1 (scripts/simulate.sh): every simulated rank's bulk
 * data (its buffers, staging, the broadcast baseline's tensor) maps onto
 * the same few pages, so that panel-size runs fit in memory; the data is
 * then garbage, and nothing can be checked. */
static void *fold_alloc(size_t n) { return SMPI_SHARED_MALLOC(n ? n : 1); }
static void fold_free(void *p) { SMPI_SHARED_FREE(p); }

/* A folded run's buffers for one side: their sizes only, no values, no
 * sentinel and no mask (nothing is checked), so that none of their pages
 * is touched (page faults over hundreds of GB of folded mappings were
 * most of a panel-size run's real time). Freed by reshard_selftest_free. */
static int fold_buffers(reshard_selftest_t *s, const reshard_layout_t *L) {
  memset(s, 0, sizeof *s);
  s->nbuf = reshard_layout_num_buffers(L);
  s->ptr = calloc((size_t)s->nbuf + 1, sizeof *s->ptr);
  s->bytes = calloc((size_t)s->nbuf + 1, sizeof *s->bytes);
  if (!s->ptr || !s->bytes) return 1;
  for (int b = 0; b < s->nbuf; b++) {
    if (reshard_layout_buffer_bytes(L, b, world_rank, &s->bytes[b])) return 1;
    if (s->bytes[b] && !(s->ptr[b] = rs_bulk_malloc(s->bytes[b]))) return 1;
  }
  size_t n = 0; /* the fragments: the figures count their bytes */
  if (reshard_layout_fragments(L, world_rank, NULL, 0, &n)) return 1;
  if (!(s->frags = calloc(n + 1, sizeof *s->frags))) return 1;
  return reshard_layout_fragments(L, world_rank, s->frags, n, &s->nfrags) != RESHARD_SUCCESS;
}

/* The simulation process's real CPU seconds (user + system): SMPI does
 * not simulate computation, so plan creation's cost is read here. */
static double process_cpu_s(void) {
  struct rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  return (double)ru.ru_utime.tv_sec + (double)ru.ru_stime.tv_sec +
         1e-6 * (double)(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec);
}
#endif

#ifdef RESHARD_HAVE_UCX
/* --ucx: a UCX communicator of the same ranks. Rank 0 picks the
 * rendezvous (its host name and a port the kernel says is free, or
 * RESHARD_PERF_UCX_RENDEZVOUS) and tells the others over MPI. */
static reshard_comm_t *ucx_comm(void) {
  char rdv[300] = "";
  if (!world_rank) {
    const char *env = getenv("RESHARD_PERF_UCX_RENDEZVOUS");
    if (env && *env) {
      snprintf(rdv, sizeof rdv, "%s", env);
    } else {
      char host[256] = "127.0.0.1";
      int port = 0, fd = socket(AF_INET, SOCK_STREAM, 0);
      struct sockaddr_in sa;
      socklen_t len = sizeof sa;
      memset(&sa, 0, sizeof sa);
      sa.sin_family = AF_INET;
      if (fd >= 0 && !bind(fd, (struct sockaddr *)&sa, sizeof sa) && !getsockname(fd, (struct sockaddr *)&sa, &len))
        port = ntohs(sa.sin_port);
      if (fd >= 0) close(fd);
      if (world_size > 1 && gethostname(host, sizeof host)) snprintf(host, sizeof host, "127.0.0.1");
      host[sizeof host - 1] = 0;
      snprintf(rdv, sizeof rdv, "%s:%d", host, port);
    }
  }
  WD_CALL(MPI_Bcast(rdv, (int)sizeof rdv, MPI_CHAR, 0, MPI_COMM_WORLD));
  reshard_comm_t *u = NULL;
  if (reshard_comm_create_ucx(rdv, world_rank, world_size, 60000, &u)) {
    fprintf(stderr, "reshard_perf: rank %d: reshard_comm_create_ucx(%s): %s\n", world_rank, rdv, reshard_last_error());
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  say0("# ucx: a UCX communicator, rendezvous %s\n", rdv);
  return u;
}
#endif

/* The run's state, step to step (main below). */
typedef struct perf_tool {
  ctx c;
  int nccl;            /* --backend nccl or ipc: device buffers */
  const char *bname;   /* that backend's name, for messages */
  const char *staged;  /* RESHARD_PERF_IPC_STAGED */
  char devdesc[256];   /* rank 0's device, for the header */
  reshard_selftest_values_t values;
  int ndt;             /* destination tensors */
  reshard_comm_t *comm, *ucomm;
  reshard_options_t opts;
  /* the plain plan, --verify's, --ucx's and --ucx's registered one */
  reshard_state rst, vst, ust, urst;
  double plan_max_s;
#ifdef RESHARD_SIMGRID_BUILD
  double plan_cpu_s;
#endif
  reshard_plan_stats_t st;
  int64_t sum[6], mx[4]; /* figures over all ranks (gather_figures) */
  method ms[5];
  int nm, ucx_at, ucx_reg_at, first_baseline;
  bcast_state *bst;
  a2aw_state *ast;
} perf_tool;

/* What this build cannot do, refused before the layouts are built:
 * RESHARD_SIM_FOLD outside simulation (or with checks), a backend or
 * transport not compiled in, and combinations that cannot be compared.
 * 0, or the exit status. */
static int check_build(perf_tool *t) {
  const cli_opts *o = &t->c.o;
  const char *fold = getenv("RESHARD_SIM_FOLD");
  if (fold && !strcmp(fold, "1")) {
#ifdef RESHARD_SIMGRID_BUILD
    if (o->check) {
      if (!world_rank)
        fprintf(stderr, "reshard_perf: error: RESHARD_SIM_FOLD=1 maps every rank's buffers onto the same pages, so "
                        "nothing can be checked: use -c 0 (the checks are proven on real runs)\n");
      return 2;
    }
    rs_alloc_set_bulk(fold_alloc, fold_free);
    folded = 1;
    rs_copy_skip = 1; /* garbage data: the pack and unpack copies cost no simulated time */
#else
    if (!world_rank)
      fprintf(stderr, "reshard_perf: error: RESHARD_SIM_FOLD=1 is for simulation builds (scripts/simulate.sh)\n");
    return 2;
#endif
  }
  /* the device backends: NCCL or CUDA IPC */
  t->nccl = o->backend == CLI_BACKEND_NCCL || o->backend == CLI_BACKEND_IPC || o->backend == CLI_BACKEND_UCX_CUDA;
  t->bname = o->backend == CLI_BACKEND_IPC ? "ipc" : o->backend == CLI_BACKEND_UCX_CUDA ? "ucx-cuda" : "nccl";
#ifndef RESHARD_PERF_HAVE_NCCL
  if (t->nccl) {
    if (!world_rank)
      fprintf(stderr, "reshard_perf: error: --backend %s: this build has no CUDA backend (configure with "
                      "-DRESHARD_WITH_CUDA=ON and MPI)\n", t->bname);
    return 2;
  }
#endif
#ifndef RESHARD_HAVE_UCX
  if (o->backend == CLI_BACKEND_UCX_CUDA) {
    if (!world_rank) fprintf(stderr, "reshard_perf: error: --backend ucx-cuda: this build has no UCX transport (libucx-dev)\n");
    return 2;
  }
  if (o->ucx) {
    if (!world_rank) fprintf(stderr, "reshard_perf: error: --ucx: this build has no UCX transport (libucx-dev)\n");
    return 2;
  }
#endif
  if (o->ucx && t->nccl) {
    if (!world_rank) fprintf(stderr, "reshard_perf: error: --ucx compares host transports: use --backend mpi\n");
    return 2;
  }
  if (t->nccl && (o->baseline_broadcast || o->baseline_alltoallw)) {
    if (!world_rank)
      fprintf(stderr, "reshard_perf: error: --baseline with --backend %s: the baselines move host buffers over MPI "
                      "and cannot run on device buffers; drop --baseline (or use --backend mpi)\n", t->bname);
    return 2;
  }
  return 0;
}

/* Options, layouts and the world's size checked against them; an exit
 * status when done already (help, a bad option), else -1. Every rank
 * parses alike, so all return the same; rank 0 alone prints. */
static int setup(perf_tool *t, int argc, char **argv) {
  ctx *c = &t->c;
  char err[1024];
  if (cli_parse(CLI_TOOL_PERF, argc, argv, &c->o, err, sizeof err)) {
    if (!world_rank) fprintf(stderr, "reshard_perf: error: %s\n", err);
    return 2;
  }
  if (c->o.help) {
    if (!world_rank) cli_usage(CLI_TOOL_PERF, stdout);
    return 0;
  }
  int rc = check_build(t);
  if (rc) return rc;
  if (cli_build_layouts(&c->o, &c->L, err, sizeof err)) {
    if (!world_rank) fprintf(stderr, "reshard_perf: error: %s\n", err);
    return 2;
  }
  if (((c->o.mode == CLI_MODE_SYNTHETIC && c->o.dst_dtype != c->o.dtype) || c->o.infer_fp8) &&
      (c->o.baseline_broadcast || c->o.baseline_alltoallw)) {
    if (!world_rank)
      fprintf(stderr, "reshard_perf: error: --baseline with %s: the baselines move bytes as they are and "
                      "cannot convert; drop --baseline (or %s)\n",
              c->o.infer_fp8 ? "--infer-dtype" : "--dst-dtype", c->o.infer_fp8 ? "--infer-dtype" : "--dst-dtype");
    return 2;
  }
  if (world_size != c->L.world_needed) {
    if (!world_rank)
      fprintf(stderr,
              "reshard_perf: error: %d MPI ranks, but the layouts need exactly %d (%d source %s %d destination%s): "
              "run with mpirun -np %d\n",
              world_size, c->L.world_needed, c->L.nsrc, c->o.colocate ? "colocated with" : "+", c->L.ndst,
              c->o.colocate ? ", on the larger side's ranks" : "", c->L.world_needed);
    cli_layouts_free(&c->L);
    return 2;
  }
  return -1;
}

/* This rank's roles, the source's values, and each destination tensor's
 * source tensor; 0, or the exit status. */
static int match_tensors(perf_tool *t) {
  ctx *c = &t->c;
  c->is_src = world_rank < c->L.nsrc;
  c->is_dst = world_rank >= c->L.first_dst && world_rank < c->L.first_dst + c->L.ndst;
  /* the source's values: finite ones where the destination converts, so
   * that the conversion and quantization are timed on the paths real
   * weights take (random bits put a NaN in nearly every fp8 block) */
  const int converts = (c->o.mode == CLI_MODE_SYNTHETIC && c->o.dst_dtype != c->o.dtype) || c->o.infer_fp8;
  t->values = c->o.values >= 0 ? (reshard_selftest_values_t)c->o.values
              : converts       ? RESHARD_SELFTEST_FINITE
                               : RESHARD_SELFTEST_BITS;
  reshard_selftest_set_values(t->values);

  /* tensor ids across the sides (the plan matches them by name too) */
  t->ndt = reshard_layout_num_tensors(c->L.dst);
  c->src_of_dst = calloc((size_t)t->ndt + 1, sizeof *c->src_of_dst);
  for (int i = 0; i < t->ndt; i++) {
    const char *name;
    reshard_layout_tensor_info(c->L.dst, i, &name, NULL, NULL, NULL);
    if (reshard_layout_find_tensor(c->L.src, name, &c->src_of_dst[i])) {
      if (c->o.infer_fp8 || c->o.block[0]) {
        /* the scales of a weight quantized on the way: made by the plan
         * (only the baselines, refused then, look a tensor up) */
        c->src_of_dst[i] = -1;
        continue;
      }
      if (!world_rank) fprintf(stderr, "reshard_perf: error: tensor '%s' is missing on the source side\n", name);
      return 2;
    }
  }
  return 0;
}

/* The communicators: NCCL's (or CUDA IPC's) or MPI's, and --ucx's. 0, or
 * the exit status (a rank without a device); a rank that cannot create
 * one aborts the job, as the others would wait for it. */
static int open_comms(perf_tool *t) {
#ifdef RESHARD_PERF_HAVE_NCCL
  if (t->nccl) {
    char err[1024];
    /* Every rank learns whether any lacks a device, so that all exit
     * instead of waiting in NCCL's setup for the missing one. */
    wd_enter("perf_nccl_open (MPI_Comm_split_type)");
    int nodev = perf_nccl_open(&t->c.dev, t->c.o.backend != CLI_BACKEND_NCCL, t->devdesc, sizeof t->devdesc, err,
                               sizeof err) != 0,
        any_nodev;
    wd_leave();
    if (nodev) fprintf(stderr, "reshard_perf: rank %d: --backend %s: %s\n", world_rank, t->bname, err);
    WD_CALL(MPI_Allreduce(&nodev, &any_nodev, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD));
    if (any_nodev) {
      perf_nccl_close(t->c.dev);
      free(t->c.src_of_dst);
      cli_layouts_free(&t->c.L);
      return 1;
    }
    reshard_comm_t *over = NULL;
#ifdef RESHARD_HAVE_UCX
    if (t->c.o.backend == CLI_BACKEND_UCX_CUDA) over = ucx_comm(); /* (perf_nccl_close destroys it) */
#endif
    if (perf_nccl_comm(t->c.dev, over, &t->comm, err, sizeof err)) {
      fprintf(stderr, "reshard_perf: rank %d: %s\n", world_rank, err);
      MPI_Abort(MPI_COMM_WORLD, 1);
    }
  } else
#endif
  {
    if (reshard_comm_create_mpi(MPI_COMM_WORLD, &t->comm)) {
      fprintf(stderr, "reshard_perf: rank %d: reshard_comm_create_mpi: %s\n", world_rank, reshard_last_error());
      MPI_Abort(MPI_COMM_WORLD, 1);
    }
  }
#ifdef RESHARD_HAVE_UCX
  if (t->c.o.ucx) t->ucomm = ucx_comm();
#endif
  return 0;
}

/* One plan creation, its error printed; 1 when it failed. */
static int create_plan(perf_tool *t, reshard_comm_t *comm, const reshard_options_t *opts, reshard_plan_t **plan,
                       const char *what) {
  reshard_result_t r = reshard_plan_create(comm, t->c.L.src, t->c.L.dst, opts, plan);
  if (r != RESHARD_SUCCESS)
    fprintf(stderr, "reshard_perf: rank %d: reshard_plan_create%s: %s: %s\n", world_rank, what,
            reshard_result_string(r), reshard_last_error());
  return r != RESHARD_SUCCESS;
}

/* The plans (the plain one timed, --verify's and --ucx's after it), all
 * ranks together; 0, or the exit status when any rank's failed. */
static int create_plans(perf_tool *t) {
  ctx *c = &t->c;
  const reshard_options_t defaults = RESHARD_OPTIONS_INITIALIZER;
  t->opts = defaults;
  if (c->o.staging) t->opts.staging_bytes = c->o.staging;
  t->opts.topology = c->o.topology;
  t->opts.relay = c->o.relay;
  WD_CALL(MPI_Barrier(MPI_COMM_WORLD));
#ifdef RESHARD_SIMGRID_BUILD
  /* In simulation, computation takes no simulated time
   * (smpi/simulate-computation:no): plan creation's MPI_Wtime span is its
   * agreement's communication only. Its real cost is reported apart: the
   * simulation process's CPU time from here (no rank has started
   * planning) to after the allreduce below (every rank has finished),
   * all simulated ranks' planning together, since SMPI runs them one at a
   * time in this process. */
  double plan_cpu0 = world_rank ? 0 : process_cpu_s();
#endif
  double t0 = MPI_Wtime();
  int bad = create_plan(t, t->comm, &t->opts, &t->rst.plan, "");
  double plan_s = MPI_Wtime() - t0;
  int any_bad;
  if (!bad && c->o.verify) {
    reshard_options_t vopts = t->opts;
    vopts.flags |= RESHARD_FLAG_VERIFY;
    bad = create_plan(t, t->comm, &vopts, &t->vst.plan, " (RESHARD_FLAG_VERIFY)");
  }
  if (!bad && t->ucomm) bad = create_plan(t, t->ucomm, &t->opts, &t->ust.plan, " (UCX)");
  if (!bad && t->ucomm) bad = create_plan(t, t->ucomm, &t->opts, &t->urst.plan, " (UCX, to register)");
  WD_CALL(MPI_Allreduce(&plan_s, &t->plan_max_s, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD));
  WD_CALL(MPI_Allreduce(&bad, &any_bad, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD));
#ifdef RESHARD_SIMGRID_BUILD
  t->plan_cpu_s = world_rank ? 0 : process_cpu_s() - plan_cpu0;
#endif
  if (any_bad) {
    reshard_plan_destroy(t->rst.plan);
    reshard_plan_destroy(t->vst.plan);
    reshard_plan_destroy(t->ust.plan);
    reshard_plan_destroy(t->urst.plan);
    reshard_comm_destroy(t->ucomm);
    reshard_comm_destroy(t->comm);
#ifdef RESHARD_PERF_HAVE_NCCL
    perf_nccl_close(c->dev);
#endif
    return 1;
  }
  return 0;
}

/* Both sides' buffers (folded in simulation), and on the device backends
 * their device copies; out of memory aborts the job. */
static void alloc_buffers(perf_tool *t) {
  ctx *c = &t->c;
#ifdef RESHARD_SIMGRID_BUILD
  int nobufs = folded ? fold_buffers(&c->s, c->L.src) || fold_buffers(&c->d, c->L.dst)
                      : reshard_selftest_alloc(&c->s, c->L.src, world_rank, 0) ||
                            reshard_selftest_alloc(&c->d, c->L.dst, world_rank, -1);
#else
  int nobufs =
      reshard_selftest_alloc(&c->s, c->L.src, world_rank, 0) || reshard_selftest_alloc(&c->d, c->L.dst, world_rank, -1);
#endif
  if (nobufs) {
    fprintf(stderr, "reshard_perf: rank %d: out of memory for the buffers\n", world_rank);
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  /* --backend ipc: the device buffers registered (direct copies, no
   * staging) unless RESHARD_PERF_IPC_STAGED=1 (to time the staged path) */
  t->staged = getenv("RESHARD_PERF_IPC_STAGED");
#ifdef RESHARD_PERF_HAVE_NCCL
  char err[1024];
  if (c->dev &&
      (perf_nccl_alloc(c->dev, &c->s, &c->d, err, sizeof err) || perf_nccl_upload(c->dev, &c->s, &c->d, err, sizeof err))) {
    fprintf(stderr, "reshard_perf: rank %d: --backend %s: %s\n", world_rank, t->bname, err);
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  if (c->dev && c->o.backend == CLI_BACKEND_IPC && !(t->staged && !strcmp(t->staged, "1")) &&
      perf_nccl_register(c->dev, t->rst.plan, err, sizeof err)) {
    fprintf(stderr, "reshard_perf: rank %d: --backend ipc: %s\n", world_rank, err);
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
#endif
}

/* The plan's figures summed (sum) and maxed (mx) over all ranks, and the
 * bytes delivered per iteration (collective). */
static void gather_figures(perf_tool *t) {
  ctx *c = &t->c;
  const reshard_plan_stats_t *st = &t->st;
  reshard_plan_get_stats(t->rst.plan, &t->st);
  int64_t mine[6] = {0, 0, (int64_t)st->send_bytes, (int64_t)st->local_copy_bytes, (int64_t)st->send_messages,
                     (int64_t)st->segments};
  for (size_t i = 0; i < c->d.nfrags; i++) {
    const reshard_fragment_info_t *f = &c->d.frags[i];
    int64_t n = box_elems(f->ndim, f->extent);
    mine[0] += n * (int64_t)tensor_esize(c->L.dst, f->tensor_id);
    mine[1] += n;
  }
  WD_CALL(MPI_Allreduce(mine, t->sum, 6, MPI_INT64_T, MPI_SUM, MPI_COMM_WORLD));
  int64_t mx_in[4] = {(int64_t)st->num_chunks, (int64_t)st->staging_bytes, (int64_t)st->chunk_bytes, st->phases};
  WD_CALL(MPI_Allreduce(mx_in, t->mx, 4, MPI_INT64_T, MPI_MAX, MPI_COMM_WORLD));
  c->delivered = t->sum[0];
  c->delivered_elems = t->sum[1];
}

/* The header: the run, the backend, the plan, and with --topology the
 * cost model's prediction (collective) and the physical limit. */
static void print_header(perf_tool *t) {
  const ctx *c = &t->c;
  const int64_t *sum = t->sum, *mx = t->mx;
  say0("# reshard_perf, %d MPI ranks: %s\n", world_size, c->L.desc);
  say0("# ranks %d (%d source, %d destination%s), tensors %d, -n %d -w %d -c %d\n", world_size, c->L.nsrc, c->L.ndst,
       c->o.colocate ? ", colocated" : "", t->ndt, c->o.iters, c->o.warmup, c->o.check);
  say0("# values: %s\n",
       t->values == RESHARD_SELFTEST_FINITE ? "finite (weight-like floats)" : "bits (every bit pattern)");
  const char *how = "execute";
#ifdef RESHARD_PERF_HAVE_NCCL
  if (perf_nccl_graphs(c->dev))
    how = "execute captured into a CUDA graph at the second call, then launched (RESHARD_PERF_GRAPH=1)";
#endif
  if (t->nccl)
    say0("# backend %s: device buffers%s, %s on a CUDA stream + cudaStreamSynchronize; rank 0 on %s\n", t->bname,
         c->o.backend != CLI_BACKEND_IPC          ? ""
         : t->staged && !strcmp(t->staged, "1") ? " (staged: RESHARD_PERF_IPC_STAGED=1)"
                                                  : " (registered: direct copies)",
         how, t->devdesc);
  say0("# plan: created in %.2f ms (slowest rank), chunk %lld B, up to %lld rounds in %lld phases, staging up to %.1f "
       "MiB/rank, %lld messages, %lld segments, %.1f MiB between ranks + %.1f MiB local copies per iteration\n",
       t->plan_max_s * 1e3, (long long)mx[2], (long long)mx[0], (long long)mx[3], (double)mx[1] / 1048576.0,
       (long long)sum[4], (long long)sum[5], (double)sum[2] / 1048576.0, (double)sum[3] / 1048576.0);
#ifdef RESHARD_SIMGRID_BUILD
  say0("# plan (real CPU, not simulated): %.3f s for all %d simulated ranks' plan creation, %.2f ms per rank on "
       "average (each rank plans for itself, in parallel, on a real machine; the simulator's own work in that span "
       "is included: an upper bound); the created-in time above is the agreement's simulated communication only\n",
       t->plan_cpu_s, world_size, t->plan_cpu_s / world_size * 1e3);
#endif

  if (c->o.topology) {
    /* the cost model's prediction (collective) and the physical limit */
    reshard_estimate_t e = RESHARD_ESTIMATE_INITIALIZER, lb = RESHARD_ESTIMATE_INITIALIZER;
    reshard_result_t r = reshard_plan_estimate(t->rst.plan, &e);
    if (!r) r = reshard_lower_bound(c->L.src, c->L.dst, world_size, c->o.topology, &lb);
    if (r) {
      fprintf(stderr, "reshard_perf: rank %d: cost model: %s: %s\n", world_rank, reshard_result_string(r),
              reshard_last_error());
      MPI_Abort(MPI_COMM_WORLD, 1);
    }
    say0("# cost model (%s): predicted_us=%.1f over %d rounds, bound by %s at %d (latency %.1f us); T_lower_us=%.1f (%s)\n",
         c->o.topology, e.seconds * 1e6, e.num_rounds, reshard_bound_name(e.bound), e.bound_where,
         e.latency_seconds * 1e6, lb.seconds * 1e6, reshard_bound_name(lb.bound));
  }
}

/* One more run of the plain plan's movement (--verify, --ucx): the same
 * bytes and peaks (set_peaks is collective). */
static void add_plan_method(perf_tool *t, const char *name, reshard_state *state, const char *info) {
  method *m = &t->ms[t->nm++];
  *m = (method){.name = name, .run = run_reshard, .state = state, .crossed = t->sum[2]};
  set_peaks(m, (int64_t)t->st.send_bytes, (int64_t)t->st.recv_bytes);
  if (info) snprintf(m->info, sizeof m->info, "%s", info);
}

/* The methods timed: the plan, --verify's and --ucx's, then the
 * baselines (set up collectively; skipped with a note where they cannot
 * run). */
static void setup_methods(perf_tool *t) {
  ctx *c = &t->c;
  add_plan_method(t, "reshard", &t->rst, NULL);
  if (c->o.verify) add_plan_method(t, "verify", &t->vst, "the same plan with RESHARD_FLAG_VERIFY");
  t->ucx_at = t->ucomm ? t->nm : -1;
  if (t->ucomm) add_plan_method(t, "ucx", &t->ust, "the same plan over a UCX communicator");
  /* --ucx's plan again with the buffers registered (one-sided reads, no
   * staging); a plan that cannot (a cast) is skipped with the reason */
  t->ucx_reg_at = -1;
  if (t->ucomm) {
    reshard_result_t r = reshard_plan_register_buffers(t->urst.plan, (void *const *)c->s.ptr, (size_t)c->s.nbuf,
                                                       (void *const *)c->d.ptr, (size_t)c->d.nbuf);
    t->ucx_reg_at = t->nm;
    add_plan_method(t, "ucx-reg", &t->urst, "the UCX plan with its buffers registered (one-sided reads)");
    if (r) {
      t->ms[t->ucx_reg_at].skipped = 1;
      snprintf(t->ms[t->ucx_reg_at].note, sizeof t->ms[t->ucx_reg_at].note, "register_buffers: %s: %s",
               reshard_result_string(r), reshard_last_error());
      say0("# ucx-reg: skipped (%s)\n", t->ms[t->ucx_reg_at].note);
    }
  }
  t->first_baseline = t->nm;
  if (c->o.baseline_broadcast) {
    method *m = &t->ms[t->nm++];
    m->name = "broadcast";
    m->run = run_broadcast;
    t->bst = bcast_setup(c, m, m->note, sizeof m->note);
    m->state = t->bst;
    m->skipped = !t->bst;
  }
  if (c->o.baseline_alltoallw) {
    method *m = &t->ms[t->nm++];
    m->name = "alltoallw";
    m->run = run_alltoallw;
    t->ast = a2aw_setup(c, m, m->note, sizeof m->note);
    m->state = t->ast;
    m->skipped = !t->ast;
  }
  for (int i = 1; i < t->nm; i++)
    if (!t->ms[i].skipped) say0("# method %s: %s\n", t->ms[i].name, t->ms[i].info);
}

/* A second run of the plan's (--verify, --ucx) against the plain one. */
static void print_ratio(const char *name, const method *m, const method *R) {
  if (m->failed) say0("# %s: time_us=nan ratio=nan\n", name);
  else if (R->failed) say0("# %s: time_us=%.1f ratio=nan\n", name, m->med_us);
  else say0("# %s: time_us=%.1f ratio=%.2f\n", name, m->med_us, m->med_us / R->med_us);
}

/* The table and the summary lines; the exit status (1 when anything was
 * wrong or failed). */
static int report(perf_tool *t) {
  const ctx *c = &t->c;
  const method *ms = t->ms;
  say0("#\n#%11s %14s %12s %8s %12s %12s %12s %9s %9s %9s %9s %8s\n", "method", "bytes", "count", "type", "time(us)",
       "min(us)", "max(us)", "algbw", "busbw", "out(MiB)", "in(MiB)", "#wrong");
  say0("#%11s %14s %12s %8s %12s %12s %12s %9s %9s %9s %9s %8s\n", "", "", "(elements)", "", "median", "", "", "(GB/s)",
       "(GB/s)", "max/rank", "max/rank", "");
  for (int i = 0; i < t->nm; i++) print_row(&ms[i], c);
  say0("#\n");
  int64_t wrong = 0;
  int failed = 0;
  for (int i = 0; i < t->nm; i++) {
    wrong += ms[i].wrong;
    failed |= ms[i].failed;
  }
  const method *R = &ms[0];
  if (c->o.verify) print_ratio("verify", &ms[1], R);
  if (t->ucx_at >= 0) print_ratio("ucx", &ms[t->ucx_at], R);
  if (t->ucx_reg_at >= 0 && !ms[t->ucx_reg_at].skipped) print_ratio("ucx-reg", &ms[t->ucx_reg_at], R);
  if (R->failed) say0("# reshard_perf: bytes=%lld time_us=nan algbw_GBps=nan wrong=%lld\n", (long long)c->delivered,
                      (long long)R->wrong);
  else
    say0("# reshard_perf: bytes=%lld time_us=%.1f algbw_GBps=%.3f wrong=%lld\n", (long long)c->delivered, R->med_us,
         (double)c->delivered / (R->med_us * 1e-6) / 1e9, (long long)R->wrong);
  for (int i = t->first_baseline; i < t->nm; i++) {
    const method *m = &ms[i];
    if (m->skipped) say0("# baseline %s: skipped (%s)\n", m->name, m->note);
    else if (m->failed) say0("# baseline %s: time_us=nan ratio=nan\n", m->name);
    else if (R->failed) say0("# baseline %s: time_us=%.1f ratio=nan\n", m->name, m->med_us);
    else say0("# baseline %s: time_us=%.1f ratio=%.2f\n", m->name, m->med_us, m->med_us / R->med_us);
  }
  return wrong || failed ? 1 : 0;
}

static void perf_tool_free(perf_tool *t) {
  ctx *c = &t->c;
  bcast_free(t->bst);
  a2aw_free(t->ast);
  reshard_selftest_free(&c->s);
  reshard_selftest_free(&c->d);
#ifdef RESHARD_PERF_HAVE_NCCL
  perf_nccl_drop_graph(c->dev);
#endif
  reshard_plan_destroy(t->rst.plan);
  reshard_plan_destroy(t->vst.plan);
  reshard_plan_destroy(t->ust.plan);
  reshard_plan_destroy(t->urst.plan);
  reshard_comm_destroy(t->ucomm);
  reshard_comm_destroy(t->comm);
#ifdef RESHARD_PERF_HAVE_NCCL
  perf_nccl_close(c->dev);
#endif
  free(c->src_of_dst);
  cli_layouts_free(&c->L);
}

int main(int argc, char **argv) {
  /* static: zeroed, as the steps expect (no plan, communicator or
   * baseline yet), and off the stack */
  static perf_tool tool;
  perf_tool *t = &tool;
  MPI_Init(&argc, &argv);
  MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world_size);
  wd_start(world_rank);
  int rc = setup(t, argc, argv);
  if (rc >= 0) return finish(rc);
  if ((rc = match_tensors(t)) || (rc = open_comms(t)) || (rc = create_plans(t))) return finish(rc);
  alloc_buffers(t);
  gather_figures(t);
  print_header(t);
  setup_methods(t);
  run_methods(&t->c, t->ms, t->nm);
  rc = report(t);
  perf_tool_free(t);
  return finish(rc);
}
