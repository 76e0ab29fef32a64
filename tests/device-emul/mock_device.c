/* The emulated CUDA device and NCCL of the CPU-side GPU tests; see
 * mock_device.h for the model. Every wrapper takes one global lock; work
 * runs in progress(), called after each enqueue and from every host
 * query, whichever rank's thread calls it. */
#include "device-emul/mock_device.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kernels/rs_kernels.h"
#include "kernels/rs_tile.h"
#include "pack/quant_block.h"
#include "support/quant_emul.h"
#include "transport/transport.h"

_Thread_local mock_thread M;
mock_world world = {.chan_cap = 1 << 30, .hang_ms = 3000};

/* ------------------------------------------------------------ state */

typedef struct mstream mstream;
typedef struct mcomm mcomm;
typedef struct mcap mcap;
typedef struct mevent mevent;

enum {
  D_WAIT, D_KERNEL, D_MEMCPY, D_GROUP, D_ALLRED, D_FREE, D_STAMP, D_CHECK, D_EXPORT, D_IMPORT,
  D_IPC_POST, D_IPC_PULL, D_IPC_ACK, D_IPC_ACKED, D_IPC_MAX, D_SELECT, D_FLIP, D_SUMS, D_COMPARE, D_MEMSET,
  D_QUANT, D_ABSORB, D_HOSTFN, D_VOTE
};

typedef struct dp2p {
  int peer, is_recv, done;
  void *buf;
  size_t bytes;
} dp2p;

typedef struct dop {
  int kind;
  mstream *ws; /* D_WAIT: the stream and position waited for */
  uint64_t wtarget;
  /* captured D_WAIT (a graph node): member stream wj's first wtarget
   * nodes, or (xev) the external event's state at launch; xrec: an
   * external record of xev (a node that waits for nothing) */
  int wj, xrec;
  mevent *xev;
  /* D_HOSTFN */
  cudaHostFn_t fn;
  void *arg;
  /* D_KERNEL */
  const rs_tile *tiles;
  uint64_t ntiles;
  const rs_copy *copies;
  void *const *src_tab, *const *dst_tab;
  void *staging;
  const uint32_t *gate;
  int64_t ns, started;
  /* D_STAMP / D_CHECK (the agreement kernels) */
  rs_dev_hdr hdr;
  rs_dev_agree *st;
  /* D_MEMCPY (snap: the pageable source, taken at the call) / D_FREE */
  void *dst;
  const void *src;
  size_t n;
  unsigned char *snap;
  long *mem; /* D_FREE: the owner's counter */
  /* D_GROUP / D_ALLRED */
  mcomm *comm;
  uint64_t ticket;
  dp2p *p;
  int np;
  uint64_t *vals;
  int nvals, arrived;
  uint64_t coll;
  /* D_SELECT / D_FLIP (the double-buffer commit) */
  rs_dev_commit *commit;
  uint32_t nsrc, ndst;
  uint64_t version, call;
  /* D_SUMS / D_COMPARE (verify) */
  const rs_vbox *vboxes;
  const rs_vtensor *vtensors;
  int dst_side;
  uint32_t desc_base, vkind; /* vkind: compare's kind, memset's value */
  /* D_IPC_*: the launch's operations, its wait, which are done */
  rs_ipc_batch *batch, *at; /* at: resolved at the first step (rs_ipc_at) */
  rs_ipc_wait iw;
  uint32_t ipc_done;
  /* D_QUANT (block quantization): boxes, their first blocks, the blocks */
  const rs_qbox *qboxes;
  const uint64_t *bstart;
  uint64_t nblocks;
  void *scales;
} dop;

struct mstream {
  void *key; /* the handle the caller passes */
  int rank, created, live;
  mcap *capt; /* the capture the stream is in (NULL: none) */
  int cj;    /* its index among the capture's streams */
  dop *q;
  size_t cap;
  uint64_t base, enq, done; /* q[i - base] is op i; done <= enq */
};

struct mevent {
  mstream *s; /* NULL: never recorded (complete) */
  uint64_t target;
  /* last recorded in a capture: node count cpos of its stream cj */
  mcap *cap;
  int cj;
  uint64_t cpos;
};

/* A stream capture, then the graph it made (mock_device.h: captures).
 * Its nodes in capture order, each on the capture's stream j: members[0]
 * is the origin, the others joined by waiting on a captured event. */
#define MAXCAP 16
typedef struct mnode {
  int j;
  dop op;
} mnode;
struct mcap {
  int rank, invalid, ended, refs;
  int mode;         /* cudaStreamCaptureMode of the capture */
  pthread_t thread; /* the thread that began it */
  int nmembers;
  mstream *members[MAXCAP];
  uint64_t cpos[MAXCAP]; /* nodes per member so far */
  mnode *nodes;
  size_t nn, capn;
  mcap *next; /* G.caps */
};
typedef struct mexec {
  mcap *g;
  mstream *r[MAXCAP]; /* the streams its launches run on, per member */
} mexec;

typedef struct mgroup {
  int gid, size;
  int split_arrived;
  /* NCCL connects each direction on its own: sreq[a][b], a posted a send
   * to b; rreq[a][b], a posted a receive from b. a -> b is connected once
   * sreq[a][b] and rreq[b][a]. */
  unsigned char sreq[MAXR][MAXR], rreq[MAXR][MAXR];
  struct mgroup *next;
} mgroup;

struct mcomm {
  int gid, rank, size, blocking;
  int aborted, destroyed, init_pending, finalizing;
  int splits; /* children split off so far */
  mcomm *split_child; /* a nonblocking parent's pending split */
  ncclComm_t *split_out; /* where it stores the child when done */
  uint64_t nccl_issued, nccl_done, coll_issued;
  mcomm *next;
};

typedef struct mail {
  struct mail *next;
  size_t bytes;
  unsigned char data[];
} mail;

typedef struct mchan {
  int gid, src, dst, count;
  mail *head, **tail;
  struct mchan *next;
} mchan;

typedef struct mcoll {
  int gid, arrived, consumed, done;
  int broken; /* a rank that arrived aborted its communicator first: as in
                 NCCL, the others' share never completes (and the freed
                 buffer of the aborted rank is not read) */
  uint64_t coll;
  int n;
  uint64_t *bufs[MAXR];
  struct mcoll *next;
} mcoll;

/* An address mapped with cudaIpcOpenMemHandle (the emulation maps every
 * allocation at its own address): how many mappings of it are open. */
typedef struct mmap_ {
  const void *base;
  int rank; /* the rank (process) that mapped it */
  int open;
  struct mmap_ *next;
} mmap_;

typedef struct mpin {
  void *p;
  size_t n;
  int nccl; /* ncclMemAlloc (staging accounting) rather than pinned host */
  struct mpin *next;
} mpin;

static struct {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  mstream **streams;
  size_t nstreams, capstreams;
  mgroup *groups;
  mcomm *comms; /* split children, kept until reset (use after free) */
  mcomm parents[MAXR];
  int parent_init[MAXR];
  mchan *chans;
  mcoll *colls;
  mpin *pins;
  mcap *caps; /* captures of the world, live and ended */
  mmap_ *maps;
} G = {.mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER};

static int64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

#define LOCK() pthread_mutex_lock(&G.mu)
#define UNLOCK() pthread_mutex_unlock(&G.mu)

/* ------------------------------------------------------------ tables */

static void free_stream(mstream *s) {
  for (uint64_t i = s->done; i < s->enq; i++) {
    dop *o = &s->q[i - s->base];
    free(o->snap);
    free(o->p);
    free(o->batch);
    free(o->at);
  }
  free(s->q);
  free(s);
}

/* Drops every stream, communicator, channel and collective. */
static void reset_tables(void) {
  for (size_t i = 0; i < G.nstreams; i++) free_stream(G.streams[i]);
  G.nstreams = 0;
  for (mgroup *g = G.groups, *nx; g; g = nx) nx = g->next, free(g);
  G.groups = NULL;
  for (mcomm *c = G.comms, *nx; c; c = nx) nx = c->next, free(c);
  G.comms = NULL;
  memset(G.parent_init, 0, sizeof G.parent_init);
  for (mchan *c = G.chans, *nx; c; c = nx) {
    nx = c->next;
    for (mail *m = c->head, *mn; m; m = mn) mn = m->next, free(m);
    free(c);
  }
  G.chans = NULL;
  for (mcoll *c = G.colls, *nx; c; c = nx) nx = c->next, free(c);
  G.colls = NULL;
  /* (graphs and their executables outlive a world only as handles the
   * tests no longer use) */
  for (mcap *c = G.caps, *nx; c; c = nx) {
    nx = c->next;
    for (size_t i = 0; i < c->nn; i++) free(c->nodes[i].op.p), free(c->nodes[i].op.batch);
    free(c->nodes);
    free(c);
  }
  G.caps = NULL;
  for (mmap_ *m = G.maps, *nx; m; m = nx) nx = m->next, free(m);
  G.maps = NULL;
}

static mmap_ *map_of(int rank, const void *base) {
  for (mmap_ *m = G.maps; m; m = m->next)
    if (m->base == base && m->rank == rank) return m;
  mmap_ *m = calloc(1, sizeof *m);
  m->base = base;
  m->rank = rank;
  m->next = G.maps;
  G.maps = m;
  return m;
}

static mstream *new_stream(void *key);

static mstream *stream_of(void *key) {
  for (size_t i = 0; i < G.nstreams; i++) {
    mstream *s = G.streams[i];
    if (s->key == key && (s->created || s->rank == M.rank)) return s;
  }
  /* a caller's stream (fake handle, or NULL: the legacy stream) */
  return new_stream(key);
}

static mstream *new_stream(void *key) {
  mstream *s = calloc(1, sizeof *s);
  s->key = key;
  s->rank = M.rank;
  s->live = 1;
  if (G.nstreams == G.capstreams) {
    G.capstreams = G.capstreams ? 2 * G.capstreams : 64;
    G.streams = realloc(G.streams, G.capstreams * sizeof *G.streams);
  }
  G.streams[G.nstreams++] = s;
  return s;
}

static dop *push(mstream *s, int kind) {
  if (s->capt) { /* captured: a node of the graph, run by its launches */
    mcap *c = s->capt;
    if (c->nn == c->capn) {
      c->capn = c->capn ? 2 * c->capn : 64;
      c->nodes = realloc(c->nodes, c->capn * sizeof *c->nodes);
    }
    mnode *n = &c->nodes[c->nn++];
    memset(n, 0, sizeof *n);
    n->j = s->cj;
    c->cpos[s->cj]++;
    n->op.kind = kind;
    return &n->op;
  }
  if (s->enq - s->base == s->cap) {
    s->cap = s->cap ? 2 * s->cap : 16;
    s->q = realloc(s->q, s->cap * sizeof *s->q);
  }
  dop *o = &s->q[s->enq - s->base];
  s->enq++;
  memset(o, 0, sizeof *o);
  o->kind = kind;
  return o;
}

static mgroup *group_of(int gid, int size) {
  for (mgroup *g = G.groups; g; g = g->next)
    if (g->gid == gid) return g;
  mgroup *g = calloc(1, sizeof *g);
  g->gid = gid;
  g->size = size;
  g->next = G.groups;
  G.groups = g;
  return g;
}

static mcomm *comm_of(ncclComm_t c) {
  if (c == MOCK_PARENT) {
    int r = M.rank;
    if (!G.parent_init[r]) {
      memset(&G.parents[r], 0, sizeof G.parents[r]);
      G.parents[r].rank = r;
      G.parents[r].size = M.size;
      G.parents[r].blocking = !M.parent_nonblocking;
      G.parent_init[r] = 1;
    }
    return &G.parents[r];
  }
  return (mcomm *)c;
}

/* Whether c is usable; counts a use after abort or destroy. */
static int usable(mcomm *c) {
  if (c->aborted || c->destroyed) {
    world.use_after_free++;
    return 0;
  }
  return 1;
}

static mchan *chan_of(int gid, int src, int dst) {
  for (mchan *c = G.chans; c; c = c->next)
    if (c->gid == gid && c->src == src && c->dst == dst) return c;
  mchan *c = calloc(1, sizeof *c);
  c->gid = gid, c->src = src, c->dst = dst;
  c->tail = &c->head;
  c->next = G.chans;
  G.chans = c;
  return c;
}

static int alone(const mcomm *c) { return world.n == 0 || c->size <= 1; }

/* Whether this rank's send to (is_recv: receive from) peer is connected. */
static int connected(const mcomm *c, int peer, int is_recv) {
  if (alone(c)) return 1;
  mgroup *g = group_of(c->gid, c->size);
  int me = c->rank;
  return is_recv ? g->rreq[me][peer] && g->sreq[peer][me] : g->sreq[me][peer] && g->rreq[peer][me];
}

/* Whether every direction this communicator asked for has been answered. */
static int all_connected(const mcomm *c) {
  if (alone(c)) return 1;
  mgroup *g = group_of(c->gid, c->size);
  int me = c->rank;
  for (int p = 0; p < c->size; p++)
    if ((g->sreq[me][p] && !g->rreq[p][me]) || (g->rreq[me][p] && !g->sreq[p][me])) return 0;
  return 1;
}

/* ------------------------------------------------------------ progress */

static void run_kernel(dop *o) {
  if (o->gate && !*o->gate) return; /* the agreement failed */

  for (uint64_t i = 0; i < o->ntiles; i++) {
    const rs_copy *c = &o->copies[o->tiles[i].desc];
    const unsigned char *s = c->src_buf == RS_BUF_STAGING ? o->staging : o->src_tab[c->src_buf];
    unsigned char *d = c->dst_buf == RS_BUF_STAGING ? o->staging : o->dst_tab[c->dst_buf];
    for (unsigned t = 0; t < 32; t++) rs_tile_copy(c, &o->tiles[i], s, d, t, 32);
  }
  /* a bit flipped in the first element a destination-writing copy wrote */
  if (world.corrupt_copy_next && o->ntiles) {
    const rs_copy *c = &o->copies[o->tiles[0].desc];
    if (c->dst_buf != RS_BUF_STAGING && o->dst_tab[c->dst_buf]) {
      ((unsigned char *)o->dst_tab[c->dst_buf])[c->dst_off] ^= 0x10;
      world.corrupt_copy_next = 0;
    }
  }
}

static int step_group(dop *o) {
  mcomm *c = o->comm;
  if (c->aborted || c->destroyed) return 1; /* abort drops pending work */
  if (c->nccl_done != o->ticket) return 0;  /* issue order */
  if (alone(c)) {
    /* no peers: each peer answers what this rank sent it in the group (a
     * partner in lockstep, so that the agreement headers match) */
    for (int i = 0; i < o->np; i++) {
      if (!o->p[i].is_recv) continue;
      for (int j = 0; j < o->np; j++)
        if (!o->p[j].is_recv && o->p[j].peer == o->p[i].peer) {
          memcpy(o->p[i].buf, o->p[j].buf, o->p[i].bytes < o->p[j].bytes ? o->p[i].bytes : o->p[j].bytes);
          break;
        }
    }
    c->nccl_done++;
    return 1;
  }
  int all = 1;
  for (int i = 0; i < o->np; i++) {
    dp2p *x = &o->p[i];
    if (x->done) continue;
    if (!connected(c, x->peer, x->is_recv)) {
      all = 0;
      continue;
    }
    if (!x->is_recv) {
      mchan *ch = chan_of(c->gid, c->rank, x->peer);
      if (ch->count >= world.chan_cap) {
        all = 0;
        continue;
      }
      mail *m = malloc(sizeof *m + x->bytes);
      m->next = NULL;
      m->bytes = x->bytes;
      memcpy(m->data, x->buf, x->bytes);
      *ch->tail = m;
      ch->tail = &m->next;
      ch->count++;
      x->done = 1;
    } else {
      mchan *ch = chan_of(c->gid, x->peer, c->rank);
      mail *m = ch->head;
      if (!m) {
        all = 0;
        continue;
      }
      ch->head = m->next;
      if (!ch->head) ch->tail = &ch->head;
      ch->count--;
      if (m->bytes != x->bytes) world.bad_size++;
      if (getenv("MOCK_TRACE"))
        fprintf(stderr, "trace: gid %d %d -> %d: %zu bytes into a receive of %zu\n", c->gid, x->peer, c->rank,
                m->bytes, x->bytes);
      world.delivered++;
      memcpy(x->buf, m->data, m->bytes < x->bytes ? m->bytes : x->bytes);
      if (world.corrupt_next && x->bytes > 64) { /* a bit flipped in flight */
        ((unsigned char *)x->buf)[x->bytes / 2] ^= 0x40;
        world.corrupt_next = 0;
      }
      free(m);
      x->done = 1;
    }
  }
  if (!all) return 0;
  c->nccl_done++;
  return 1;
}

static int step_allreduce(dop *o) {
  mcomm *c = o->comm;
  if (c->aborted || c->destroyed) return 1;
  if (c->nccl_done != o->ticket) return 0;
  if (alone(c)) {
    c->nccl_done++;
    return 1;
  }
  mcoll *k = G.colls;
  while (k && !(k->gid == c->gid && k->coll == o->coll)) k = k->next;
  if (!k) {
    k = calloc(1, sizeof *k);
    k->gid = c->gid, k->coll = o->coll, k->n = o->nvals;
    k->next = G.colls;
    G.colls = k;
  }
  if (k->broken) return 0; /* until this rank's own abort ends it */
  if (!o->arrived) {
    o->arrived = 1;
    k->bufs[c->rank] = o->vals;
    if (++k->arrived == c->size) {
      uint64_t mx[RS_AGREE_MAX_WORDS] = {0};
      for (int r = 0; r < c->size; r++)
        for (int i = 0; i < k->n; i++)
          if (k->bufs[r][i] > mx[i]) mx[i] = k->bufs[r][i];
      for (int r = 0; r < c->size; r++) memcpy(k->bufs[r], mx, (size_t)k->n * 8);
      k->done = 1;
    }
  }
  if (!k->done) return 0;
  if (++k->consumed == c->size) {
    for (mcoll **pk = &G.colls; *pk; pk = &(*pk)->next)
      if (*pk == k) {
        *pk = k->next;
        break;
      }
    free(k);
  }
  c->nccl_done++;
  return 1;
}

/* The CUDA IPC kernels' waits (kernels/ipc_kernels.cu's spin), one step:
 * each operation that can go goes (the very code of kernels/rs_ipc.h);
 * one that waits past the timeout, or finds the abort word set, gives
 * up as the kernel does. 1 when every operation is done. */
static int step_ipc_wait(dop *o, int acked, int rank) {
  int64_t t = now_ns();
  if (!o->started) {
    /* the kernel resolves every operation at its start */
    o->started = t;
    o->at = malloc(sizeof *o->at);
    *o->at = *o->batch;
    for (uint32_t i = 0; i < o->batch->n; i++) o->at->op[i] = rs_ipc_at(&o->batch->op[i]);
  }
  int all = 1;
  for (uint32_t i = 0; i < o->batch->n; i++) {
    if (o->ipc_done >> i & 1) continue;
    const rs_ipc_op *x = &o->at->op[i];
    if (acked ? rs_ipc_acked(x) : rs_ipc_arrived(x)) {
      if (!acked) {
        uint64_t bad = rs_ipc_check(x);
        if (bad) rs_ipc_give_up(&o->iw, x, bad);
        else {
          /* a pooled payload is read through the sender's pool as mapped
           * here: that mapping must still be open */
          if (x->bytes > RS_IPC_INLINE && map_of(rank, x->pool)->open <= 0) world.ipc_closed_reads++;
          rs_ipc_copy(x, 0, x->bytes, 0, 1);
          world.delivered++;
          if (world.corrupt_next && x->bytes > 64) { /* a bit flipped in flight */
            x->buf[x->bytes / 2] ^= 0x40;
            world.corrupt_next = 0;
          }
          if (x->bytes > RS_IPC_INLINE) world.ipc_pool_pulls++;
        }
      }
    } else if (rs_ipc_load(o->iw.abort)) {
      rs_ipc_give_up(&o->iw, x, RS_IPC_ABORTED);
    } else if ((uint64_t)(t - o->started) > o->iw.timeout_ns) {
      rs_ipc_give_up(&o->iw, x, RS_IPC_TIMEOUT);
      world.ipc_timeouts++;
    } else {
      all = 0;
      continue;
    }
    o->ipc_done |= 1u << i;
  }
  return all;
}

/* Runs the head op of s if it can run; 1 if it did. */
static int step(mstream *s) {
  if (s->done == s->enq) return 0;
  dop *o = &s->q[s->done - s->base];
  switch (o->kind) {
  case D_WAIT:
    if (o->ws->done < o->wtarget) return 0;
    break;
  case D_KERNEL:
    if (o->ns > 0) {
      int64_t t = now_ns();
      if (!o->started) o->started = t;
      if (t - o->started < o->ns) return 0;
    }

    run_kernel(o);
    break;
  case D_MEMCPY:
    memcpy(o->dst, o->snap ? o->snap : o->src, o->n);
    free(o->snap);
    break;
  case D_FREE:
    free(o->dst);
    (*o->mem)--;
    break;
  case D_STAMP:
    memcpy(o->dst, &o->hdr, sizeof o->hdr);
    break;
  case D_CHECK:
    rs_dev_agree_check(o->src, (uint32_t)o->n, &o->hdr, o->st);
    break;
  case D_EXPORT:
    rs_dev_agree_export(o->src, o->dst);
    break;
  case D_IMPORT:
    rs_dev_agree_import(o->src, &o->hdr, o->st);
    break;
  case D_GROUP:
    if (!step_group(o)) return 0;
    free(o->p);
    break;
  case D_ALLRED:
    if (!step_allreduce(o)) return 0;
    break;
  case D_IPC_POST: /* nothing once a wait here gave up (ipc_kernels.cu) */
    for (uint32_t i = 0; i < o->batch->n && !rs_ipc_load(o->iw.abort); i++) {
      const rs_ipc_op x = rs_ipc_at(&o->batch->op[i]);
      rs_ipc_post(&x);
    }
    free(o->batch);
    break;
  case D_IPC_ACK:
    for (uint32_t i = 0; i < o->batch->n; i++) {
      const rs_ipc_op x = rs_ipc_at(&o->batch->op[i]);
      if (rs_ipc_arrived(&x) && !rs_ipc_check(&x)) rs_ipc_ack(&x);
    }
    for (uint32_t i = 0; i < o->batch->n; i++) rs_ipc_advance(&o->batch->op[i]);
    free(o->batch);
    break;
  case D_IPC_PULL:
  case D_IPC_ACKED:
    if (!step_ipc_wait(o, o->kind == D_IPC_ACKED, s->rank)) return 0;
    if (o->kind == D_IPC_ACKED)
      for (uint32_t i = 0; i < o->batch->n; i++) rs_ipc_advance(&o->batch->op[i]);
    free(o->batch);
    free(o->at);
    break;
  case D_IPC_MAX:
    rs_ipc_max(o->src, (uint32_t)o->n, o->nsrc, o->ndst, o->dst);
    break;
  case D_SUMS:

    for (uint64_t i = 0; i < o->ntiles; i++) {
      const rs_tile *t = &o->tiles[i];
      const rs_copy *c = &o->copies[t->desc];
      const rs_vbox *v = &o->vboxes[t->desc];
      const unsigned char *b = o->dst_side ? o->dst_tab[c->dst_buf] : o->src_tab[c->src_buf];
      uint64_t sum = 0;
      for (unsigned th = 0; th < 32; th++) sum += rs_tile_sum(c, t, b, o->dst_side, v, &o->vtensors[v->tensor], th, 32);
      ((uint64_t *)o->dst)[t->desc - o->desc_base] += sum;


    }
    break;
  case D_COMPARE:
    if (getenv("MOCK_TRACE"))
      for (size_t i = 0; i < o->n; i++)
        fprintf(stderr, "trace: rank %d compare desc %u: %016llx vs %016llx\n", s->rank, o->desc_base + (unsigned)i,
                (unsigned long long)((const uint64_t *)o->src)[i], (unsigned long long)o->vals[i]);
    rs_verify_compare(o->src, o->vals, (uint32_t)o->n, o->desc_base, o->vkind, o->st);
    break;
  case D_MEMSET:
    memset(o->dst, (int)o->vkind, o->n);
    break;
  case D_SELECT:
    rs_dev_commit_select(o->src, o->nsrc, o->ndst, o->commit, o->dst);
    break;
  case D_VOTE:
    rs_dev_commit_vote(o->st, o->version, o->call, o->dst);
    break;
  case D_FLIP:
    rs_dev_commit_flip(o->src, o->st, o->version, o->call, o->commit);
    break;
  case D_ABSORB:
    rs_dev_agree_absorb(o->src, &o->hdr, o->st);
    break;
  case D_HOSTFN: /* (on a driver thread in CUDA; here whoever progresses) */
    o->fn(o->arg);
    break;
  case D_QUANT: /* each block as the kernel's threads run it (support/quant_emul.h) */
    for (uint64_t g = 0; g < o->nblocks; g++) {
      const uint32_t k = rs_qblock_box(o->bstart, (uint32_t)o->n, g);
      const rs_qbox *q = &o->qboxes[k];
      rs_emul_quant_block(q, q->in_buf < 0 ? o->src : o->src_tab[q->in_buf], g - o->bstart[k], o->dst, o->scales, 0);
    }
    break;
  }
  s->done++;
  if (s->done == s->enq) s->base = s->enq;
  return 1;
}

static void progress(void) {
  int any = 0;
  for (int changed = 1; changed;) {
    changed = 0;
    for (size_t i = 0; i < G.nstreams; i++)
      while (step(G.streams[i])) changed = any = 1;
  }
  if (any) pthread_cond_broadcast(&G.cv);
}

/* Waits (lock held) until done(arg) or hang_ms: 0, or -1 for a hang. */
static int wait_for(int (*done)(void *), void *arg, const char *what) {
  int64_t t0 = now_ns();
  for (;;) {
    progress();
    if (done(arg)) return 0;
    if (now_ns() - t0 > world.hang_ms * 1000000LL) {
      world.hangs++;
      fprintf(stderr, "mock: rank %d: %s would never end (cut after %lld ms)\n", M.rank, what,
              (long long)world.hang_ms);
      return -1;
    }
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_nsec += 1000000;
    if (ts.tv_nsec >= 1000000000L) ts.tv_sec++, ts.tv_nsec -= 1000000000L;
    pthread_cond_timedwait(&G.cv, &G.mu, &ts);
  }
}

static int stream_done(void *a) {
  mstream *s = a;
  return s->done == s->enq;
}
static int event_done(void *a) {
  mevent *e = a;
  return !e->s || e->s->done >= e->target;
}
static int rank_done(void *a) {
  (void)a;
  for (size_t i = 0; i < G.nstreams; i++)
    if (G.streams[i]->rank == M.rank && G.streams[i]->done != G.streams[i]->enq) return 0;
  return 1;
}

/* ------------------------------------------------------------ harness */

void mock_reset(int rank, int size) {
  LOCK();
  if (world.n == 0) reset_tables(); /* single-rank tests: one thread */
  UNLOCK();
  memset(&M, 0, sizeof M);
  M.rank = rank;
  M.size = size;
  M.group_end_result = ncclSuccess;
  M.async_error = ncclSuccess;
}

void mock_world_begin(int n, int chan_cap) {
  LOCK();
  reset_tables();
  world.n = n;
  world.chan_cap = chan_cap > 0 ? chan_cap : 1 << 30;
  world.hangs = world.bad_size = world.use_after_free = 0;
  world.ipc_mapped = world.ipc_timeouts = world.ipc_pool_pulls = 0;
  world.parent_aborts = world.parent_destroys = world.leftover = 0;
  world.corrupt_next = world.corrupt_copy_next = 0;
  world.capture_violations = 0;
  world.ipc_closed_reads = 0;
  world.ipc_freed_mapped = 0;
  UNLOCK();
}

void mock_world_end(void) {
  LOCK();
  for (mchan *c = G.chans; c; c = c->next) world.leftover += c->count;
  reset_tables();
  world.n = 0;
  UNLOCK();
}

mop *mock_log(int kind, void *stream) {
  static _Thread_local mop sink;
  if (M.log_off || M.nops == MAXOPS) return &sink;
  mop *o = &M.ops[M.nops++];
  memset(o, 0, sizeof *o);
  o->kind = kind;
  o->stream = stream;
  o->round = -1;
  return o;
}

void mock_corrupt_next(void) {
  LOCK();
  world.corrupt_next = 1;
  UNLOCK();
}

void mock_corrupt_next_copy(void) {
  LOCK();
  world.corrupt_copy_next = 1;
  UNLOCK();
}

int mock_stream_drain(void *stream) {
  LOCK();
  int r = wait_for(stream_done, stream_of(stream), "mock_stream_drain");
  UNLOCK();
  return r;
}

/* ------------------------------------------------------------ CUDA */

static void *dev_alloc(size_t n) {
  M.mem++;
  return calloc(1, n ? n : 1);
}

/* A "potentially unsafe" call (allocation, synchronous copies, device
 * synchronization, queries) that a stream capture forbids, as
 * cudaThreadExchangeStreamCaptureMode says: in the calling thread's mode
 * (M.capture_mode), relaxed allows everything; otherwise an open capture
 * of this thread not begun relaxed forbids it, and in global mode so
 * does a global capture of another thread of the process (a rank). The
 * captures concerned are invalidated and the call fails. Lock held. */
static int forbidden(void) {
  if (M.capture_mode == cudaStreamCaptureModeRelaxed) return 0;
  int hit = 0;
  for (mcap *c = G.caps; c; c = c->next) {
    if (c->ended || c->rank != M.rank) continue;
    int mine = pthread_equal(c->thread, pthread_self());
    if ((mine && c->mode != cudaStreamCaptureModeRelaxed) ||
        (!mine && M.capture_mode == cudaStreamCaptureModeGlobal && c->mode == cudaStreamCaptureModeGlobal)) {
      c->invalid = 1;
      hit = 1;
    }
  }
  if (hit) world.capture_violations++;
  return hit;
}

/* What a capture refuses of a call (lock held): any call on a capturing
 * stream s that the emulation does not capture (queries,
 * synchronization, stream-ordered allocation), any call on an event e
 * last recorded in a capture (it has no status), and (unsafe) a
 * potentially unsafe call forbidden(). cudaSuccess, or the error:
 * counted, and the capture invalidated where CUDA does. */
static cudaError_t capture_refuses(mstream *s, const mevent *e, int unsafe) {
  if (s && s->capt) {
    s->capt->invalid = 1;
    world.capture_violations++;
    return cudaErrorStreamCaptureUnsupported;
  }
  if (e && e->cap) {
    world.capture_violations++;
    return cudaErrorCapturedEvent;
  }
  if (unsafe && forbidden()) return cudaErrorStreamCaptureUnsupported;
  return cudaSuccess;
}

cudaError_t __wrap_cudaGetDevice(int *d) {
  *d = M.device;
  return cudaSuccess;
}
cudaError_t __wrap_cudaSetDevice(int d) {
  M.device = d;
  return cudaSuccess;
}
cudaError_t __wrap_cudaMalloc(void **p, size_t n) {
  if (M.fail_malloc) return cudaErrorMemoryAllocation;
  LOCK();
  if (forbidden()) {
    UNLOCK();
    return cudaErrorStreamCaptureUnsupported;
  }
  *p = dev_alloc(n);
  UNLOCK();
  return cudaSuccess;
}
cudaError_t __wrap_cudaMallocAsync(void **p, size_t n, cudaStream_t s) {
  if (++M.malloc_async_calls == M.fail_malloc_async_at) return cudaErrorMemoryAllocation;
  LOCK();
  cudaError_t no = capture_refuses(stream_of(s), NULL, 0); /* (graph allocation nodes: not emulated) */
  if (no) {
    UNLOCK();
    return no;
  }
  *p = dev_alloc(n);
  UNLOCK();
  return cudaSuccess;
}
cudaError_t __wrap_cudaMallocHost(void **p, size_t n) {
  LOCK();
  *p = dev_alloc(n);
  mpin *q = calloc(1, sizeof *q);
  q->p = *p, q->n = n, q->next = G.pins;
  G.pins = q;
  UNLOCK();
  return cudaSuccess;
}
static mpin *unpin(void *p) {
  for (mpin **q = &G.pins; *q; q = &(*q)->next)
    if ((*q)->p == p) {
      mpin *x = *q;
      *q = x->next;
      return x;
    }
  return NULL;
}
cudaError_t __wrap_cudaFree(void *p) {
  if (!p) return cudaSuccess;
  LOCK();
  /* freeing memory another process still has mapped is undefined */
  for (mmap_ *m = G.maps; m; m = m->next)
    if (m->base == p && m->open > 0 && m->rank != M.rank) world.ipc_freed_mapped++;
  progress();
  M.mem--;
  free(p);
  UNLOCK();
  return cudaSuccess;
}
cudaError_t __wrap_cudaFreeAsync(void *p, cudaStream_t s) {
  if (!p) return cudaSuccess;
  LOCK();
  cudaError_t no = capture_refuses(stream_of(s), NULL, 0);
  if (no) {
    UNLOCK();
    return no;
  }
  dop *o = push(stream_of(s), D_FREE);
  o->dst = p;
  o->mem = &M.mem;
  progress();
  UNLOCK();
  return cudaSuccess;
}
cudaError_t __wrap_cudaFreeHost(void *p) {
  if (!p) return cudaSuccess;
  LOCK();
  free(unpin(p));
  M.mem--;
  free(p);
  UNLOCK();
  return cudaSuccess;
}
cudaError_t __wrap_cudaStreamCreateWithFlags(cudaStream_t *out, unsigned f) {
  (void)f;
  LOCK();
  M.streams++;
  mstream *s = new_stream(NULL);
  s->key = s;
  s->created = 1;
  *out = (cudaStream_t)s;
  UNLOCK();
  return cudaSuccess;
}
cudaError_t __wrap_cudaStreamDestroy(cudaStream_t s) {
  (void)s;
  /* pending work still runs (CUDA semantics); the entry stays */
  LOCK();
  M.streams--;
  stream_of(s)->live = 0;
  UNLOCK();
  return cudaSuccess;
}
cudaError_t __wrap_cudaEventCreateWithFlags(cudaEvent_t *e, unsigned f) {
  (void)f;
  LOCK();
  M.events++;
  *e = (cudaEvent_t)calloc(1, sizeof(mevent));
  UNLOCK();
  return cudaSuccess;
}
cudaError_t __wrap_cudaEventDestroy(cudaEvent_t e) {
  LOCK();
  M.events--;
  free(e);
  UNLOCK();
  return cudaSuccess;
}
cudaError_t __wrap_cudaStreamSynchronize(cudaStream_t s) {
  M.syncs++;
  mock_log(OP_SYNC, s);
  LOCK();
  cudaError_t no = capture_refuses(stream_of(s), NULL, 1);
  if (no) {
    UNLOCK();
    return no;
  }
  int r = wait_for(stream_done, stream_of(s), "cudaStreamSynchronize");
  UNLOCK();
  return r ? cudaErrorLaunchTimeout : cudaSuccess;
}
cudaError_t __wrap_cudaDeviceSynchronize(void) {
  M.syncs++;
  mock_log(OP_SYNC, NULL);
  LOCK();
  if (forbidden()) {
    UNLOCK();
    return cudaErrorStreamCaptureUnsupported;
  }
  int r = wait_for(rank_done, NULL, "cudaDeviceSynchronize");
  UNLOCK();
  return r ? cudaErrorLaunchTimeout : cudaSuccess;
}
cudaError_t __wrap_cudaEventSynchronize(cudaEvent_t e) {
  M.syncs++;
  mock_log(OP_SYNC, NULL);
  LOCK();
  cudaError_t no = capture_refuses(NULL, (const mevent *)e, 1);
  if (no) {
    UNLOCK();
    return no;
  }
  int r = wait_for(event_done, e, "cudaEventSynchronize");
  UNLOCK();
  return r ? cudaErrorLaunchTimeout : cudaSuccess;
}
cudaError_t __wrap_cudaStreamQuery(cudaStream_t s) {
  LOCK();
  cudaError_t no = capture_refuses(stream_of(s), NULL, 1);
  if (no) {
    UNLOCK();
    return no;
  }
  progress();
  int d = stream_done(stream_of(s));
  UNLOCK();
  return d ? cudaSuccess : cudaErrorNotReady;
}
cudaError_t __wrap_cudaEventQuery(cudaEvent_t e) {
  LOCK();
  cudaError_t no = capture_refuses(NULL, (const mevent *)e, 1);
  if (no) {
    UNLOCK();
    return no;
  }
  progress();
  int d = event_done(e);
  UNLOCK();
  return d ? cudaSuccess : cudaErrorNotReady;
}
cudaError_t __wrap_cudaEventRecord(cudaEvent_t e, cudaStream_t s) {
  mock_log(OP_REC, s)->ev = e;
  LOCK();
  mevent *ev = (mevent *)e;
  mstream *st = stream_of(s);
  if (st->capt) { /* a captured event: the position in the capture */
    ev->s = NULL;
    ev->cap = st->capt;
    ev->cj = st->cj;
    ev->cpos = st->capt->cpos[st->cj];
  } else {
    ev->cap = NULL;
    ev->s = st;
    ev->target = st->enq;
  }
  UNLOCK();
  return cudaSuccess;
}
/* cudaEventRecordExternal: only in a capture, where it is a node that
 * records the event each time a launch of the graph reaches it. */
cudaError_t __wrap_cudaEventRecordWithFlags(cudaEvent_t e, cudaStream_t s, unsigned f) {
  if (!(f & cudaEventRecordExternal)) return __wrap_cudaEventRecord(e, s);
  mock_log(OP_REC, s)->ev = e;
  LOCK();
  mstream *st = stream_of(s);
  if (!st->capt) {
    world.capture_violations++;
    UNLOCK();
    return cudaErrorInvalidValue;
  }
  dop *o = push(st, D_WAIT);
  o->xev = (mevent *)e;
  o->xrec = 1;
  UNLOCK();
  return cudaSuccess;
}
cudaError_t __wrap_cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned f) {
  mock_log(OP_WAIT, s)->ev = e;
  LOCK();
  mevent *ev = (mevent *)e;
  mstream *st = stream_of(s);
  cudaError_t bad = cudaSuccess;
  if (f & cudaEventWaitExternal) {
    /* only in a capture: a node waiting for the event as recorded when
     * a launch of the graph is enqueued */
    if (!st->capt || ev->cap) bad = cudaErrorInvalidValue;
    else push(st, D_WAIT)->xev = ev;
  } else if (ev->cap) {
    /* an event of a capture: the waiting stream joins it (fork), or
     * waits inside it (join); never across captures, nor from outside
     * one that ended */
    mcap *c = ev->cap;
    if (c->ended || (st->capt && st->capt != c) || (!st->capt && c->nmembers == MAXCAP)) {
      bad = cudaErrorStreamCaptureIsolation;
      c->invalid = 1;
    } else {
      if (!st->capt) {
        st->capt = c;
        st->cj = c->nmembers;
        c->members[c->nmembers++] = st;
        c->cpos[st->cj] = 0;
      }
      dop *o = push(st, D_WAIT);
      o->wj = ev->cj;
      o->wtarget = ev->cpos;
    }
  } else if (st->capt && ev->s) {
    /* CUDA: a capturing stream may wait for an event recorded outside
     * the capture only with cudaEventWaitExternal */
    bad = cudaErrorStreamCaptureIsolation;
    st->capt->invalid = 1;
  } else if (st->capt) {
    /* (a never-recorded event: nothing to wait for) */
  } else if (ev->s) { /* waiting for a never-recorded event is a no-op */
    mstream *ws = ev->s;
    uint64_t target = ev->target;
    dop *o = push(st, D_WAIT);
    o->ws = ws;
    o->wtarget = target;
    progress();
  }
  if (bad) world.capture_violations++;
  UNLOCK();
  return bad;
}
cudaError_t __wrap_cudaMemcpyAsync(void *d, const void *s, size_t n, enum cudaMemcpyKind k, cudaStream_t st) {
  mock_log(OP_MEMCPY, st);
  LOCK();
  int pinned = 0;
  for (mpin *q = G.pins; q; q = q->next)
    if ((const unsigned char *)s >= (unsigned char *)q->p && (const unsigned char *)s < (unsigned char *)q->p + q->n)
      pinned = 1;
  mstream *ms = stream_of(st);
  if (ms->capt && k == cudaMemcpyHostToDevice && !pinned) {
    /* (a graph reads its copy's source at each launch: pageable memory
     * the caller may reuse at once is a bug there) */
    ms->capt->invalid = 1;
    world.capture_violations++;
    UNLOCK();
    return cudaErrorStreamCaptureUnsupported;
  }
  dop *o = push(ms, D_MEMCPY);
  o->dst = d;
  o->src = s;
  o->n = n;
  if (k == cudaMemcpyHostToDevice && !pinned) { /* pageable host memory is read at the call */
    o->snap = malloc(n ? n : 1);
    memcpy(o->snap, s, n);
  }
  progress();
  UNLOCK();
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

int __wrap_rs_cuda_launch_copies_gated(const rs_tile *tiles, uint64_t ntiles, const rs_copy *copies,
                                       void *const *src_tab, void *const *dst_tab, void *staging,
                                       const uint32_t *gate, void *stream) {
  if (++M.launches == M.fail_launch_at) return (int)cudaErrorLaunchOutOfResources;
  mop *lg = mock_log(OP_LAUNCH, stream);
  LOCK();
  mstream *s = stream_of(stream);
  progress(); /* the tiles' upload, if it can run */
  if (M.plan && ntiles) classify(lg, &tiles[0]);
  dop *o = push(s, D_KERNEL);
  o->tiles = tiles, o->ntiles = ntiles, o->copies = copies;
  o->src_tab = src_tab, o->dst_tab = dst_tab, o->staging = staging;
  o->gate = gate;
  o->ns = M.kernel_ns;
  progress();
  UNLOCK();
  return 0;
}

/* The agreement kernels, emulated: the very check of kernels/rs_agree.h. */
/* Whether this rank's headers of the plan with this digest are tampered. */
static int tampered(uint64_t digest) { return M.tamper_version && (!M.tamper_digest || M.tamper_digest == digest); }

int __wrap_rs_cuda_agree_stamp(rs_dev_hdr *out, rs_dev_hdr mine, void *stream) {
  if (tampered(mine.digest)) mine.version += M.tamper_version; /* a rank at another step */
  LOCK();
  dop *o = push(stream_of(stream), D_STAMP);
  o->dst = out;
  o->hdr = mine;
  progress();
  UNLOCK();
  return 0;
}
int __wrap_rs_cuda_agree_export(const rs_dev_agree *st, uint64_t *word, void *stream) {
  LOCK();
  dop *o = push(stream_of(stream), D_EXPORT);
  o->src = st;
  o->dst = word;
  progress();
  UNLOCK();
  return 0;
}
int __wrap_rs_cuda_agree_import(const uint64_t *word, rs_dev_hdr want, rs_dev_agree *st, void *stream) {
  if (tampered(want.digest)) want.version += M.tamper_version;
  LOCK();
  dop *o = push(stream_of(stream), D_IMPORT);
  o->src = word;
  o->hdr = want;
  o->st = st;
  progress();
  UNLOCK();
  return 0;
}
int __wrap_rs_cuda_agree_check(const rs_dev_hdr *in, uint32_t n, rs_dev_hdr want, rs_dev_agree *st,
                               void *stream) {
  if (tampered(want.digest)) want.version += M.tamper_version;
  LOCK();
  dop *o = push(stream_of(stream), D_CHECK);
  o->src = in;
  o->n = n;
  o->hdr = want;
  o->st = st;
  progress();
  UNLOCK();
  return 0;
}

/* Verify's kernels, emulated (kernels/rs_verify.h): 32 threads' parts. */
int __wrap_rs_cuda_verify_sums(const rs_tile *tiles, uint64_t ntiles, const rs_copy *copies, const rs_vbox *vboxes,
                               const rs_vtensor *vtensors, void *const *src_tab, void *const *dst_tab, int dst_side,
                               uint64_t *sums, uint32_t desc_base, void *stream) {
  LOCK();
  dop *o = push(stream_of(stream), D_SUMS);
  o->tiles = tiles, o->ntiles = ntiles, o->copies = copies;
  o->vboxes = vboxes, o->vtensors = vtensors;
  o->src_tab = src_tab, o->dst_tab = dst_tab, o->dst_side = dst_side;
  o->dst = sums;
  o->desc_base = desc_base;
  progress();
  UNLOCK();
  return 0;
}
int __wrap_rs_cuda_verify_compare(const uint64_t *mine, const uint64_t *theirs, uint32_t n, uint32_t desc0,
                                  uint32_t kind, rs_dev_agree *st, void *stream) {
  LOCK();
  dop *o = push(stream_of(stream), D_COMPARE);
  o->src = mine;
  o->vals = (uint64_t *)theirs;
  o->n = n;
  o->desc_base = desc0, o->vkind = kind;
  o->st = st;
  progress();
  UNLOCK();
  return 0;
}
cudaError_t __wrap_cudaMemsetAsync(void *p, int v, size_t n, cudaStream_t st) {
  LOCK();
  dop *o = push(stream_of(st), D_MEMSET);
  o->dst = p;
  o->vkind = (uint32_t)v;
  o->n = n;
  progress();
  UNLOCK();
  return cudaSuccess;
}

/* The double-buffer commit's kernels, emulated (kernels/rs_agree.h). */
int __wrap_rs_cuda_commit_select(void *const *tab, uint32_t nsrc, uint32_t ndst, const rs_dev_commit *c, void **cur,
                                 void *stream) {
  LOCK();
  dop *o = push(stream_of(stream), D_SELECT);
  o->src = tab;
  o->nsrc = nsrc, o->ndst = ndst;
  o->commit = (rs_dev_commit *)c;
  o->dst = cur;
  progress();
  UNLOCK();
  return 0;
}
int __wrap_rs_cuda_commit_vote(const rs_dev_agree *st, uint64_t version, uint64_t call, uint64_t *v, void *stream) {
  LOCK();
  dop *o = push(stream_of(stream), D_VOTE);
  o->st = (rs_dev_agree *)st;
  o->version = version, o->call = call;
  o->dst = v;
  progress();
  UNLOCK();
  return 0;
}

int __wrap_rs_cuda_commit_flip(const uint64_t *v, rs_dev_agree *st, uint64_t version, uint64_t call,
                               rs_dev_commit *c, void *stream) {
  LOCK();
  dop *o = push(stream_of(stream), D_FLIP);
  o->src = v;
  o->st = st;
  o->version = version, o->call = call;
  o->commit = c;
  progress();
  UNLOCK();
  return 0;
}

/* Block quantization and the pre-plan's verdict, emulated
 * (pack/quant_block.h, kernels/rs_agree.h). */
int __wrap_rs_cuda_quantize(const rs_qbox *boxes, const uint64_t *bstart, uint32_t nboxes, uint64_t nblocks,
                            void *const *tab, const void *gather, void *codes, void *scales, void *stream) {
  if (!nblocks) return 0;
  LOCK();
  dop *o = push(stream_of(stream), D_QUANT);
  o->qboxes = boxes, o->bstart = bstart, o->n = nboxes, o->nblocks = nblocks;
  o->src_tab = tab, o->src = gather, o->dst = codes, o->scales = scales;
  progress();
  UNLOCK();
  return 0;
}
int __wrap_rs_cuda_agree_absorb(const rs_dev_agree *prior, rs_dev_hdr want, rs_dev_agree *st, void *stream) {
  LOCK();
  dop *o = push(stream_of(stream), D_ABSORB);
  o->src = prior;
  o->hdr = want;
  o->st = st;
  progress();
  UNLOCK();
  return 0;
}

/* ------------------------------------------------------------ CUDA IPC */

/* A handle carries the address (every rank is a thread of this process);
 * opening one counts a mapping, closing it uncounts it. */
cudaError_t __wrap_cudaIpcGetMemHandle(cudaIpcMemHandle_t *h, void *p) {
  memset(h, 0, sizeof *h);
  memcpy(h->reserved, &p, sizeof p);
  return cudaSuccess;
}
cudaError_t __wrap_cudaIpcOpenMemHandle(void **p, cudaIpcMemHandle_t h, unsigned flags) {
  (void)flags;
  if (M.fail_ipc_open) return cudaErrorInvalidResourceHandle;
  memcpy(p, h.reserved, sizeof *p);
  LOCK();
  world.ipc_mapped++;
  map_of(M.rank, *p)->open++;
  UNLOCK();
  return cudaSuccess;
}
cudaError_t __wrap_cudaIpcCloseMemHandle(void *p) {
  LOCK();
  world.ipc_mapped--;
  map_of(M.rank, p)->open--;
  UNLOCK();
  return cudaSuccess;
}
/* The synchronous copy: after the device's work so far, as the legacy
 * stream would order it. */
cudaError_t __wrap_cudaMemcpy(void *d, const void *src, size_t n, enum cudaMemcpyKind k) {
  (void)k;
  LOCK();
  if (forbidden()) {
    UNLOCK();
    return cudaErrorStreamCaptureUnsupported;
  }
  progress();
  memcpy(d, src, n);
  UNLOCK();
  return cudaSuccess;
}
cudaError_t __wrap_cudaMemset(void *p, int v, size_t n) {
  LOCK();
  if (forbidden()) {
    UNLOCK();
    return cudaErrorStreamCaptureUnsupported;
  }
  progress();
  memset(p, v, n);
  UNLOCK();
  return cudaSuccess;
}
/* Every buffer is its own allocation here. */
int __wrap_rs_cuda_mem_range(const void *p, void **base, size_t *size) {
  *base = (void *)p;
  *size = 1;
  return 0;
}
/* Ranks of a world are threads of one process that the transport must
 * treat as processes (cudaIpcOpenMemHandle), as they would be. */
pid_t __real_getpid(void);
pid_t __wrap_getpid(void) { return world.n ? (pid_t)(100000 + M.rank) : __real_getpid(); }

static int ipc_launch(int kind, const rs_ipc_batch *b, const rs_ipc_wait *w, void *stream) {
  LOCK();
  dop *o = push(stream_of(stream), kind);
  o->batch = malloc(sizeof *b);
  memcpy(o->batch, b, sizeof *b);
  if (w) o->iw = *w;
  progress();
  UNLOCK();
  return 0;
}
int __wrap_rs_cuda_ipc_post(const rs_ipc_batch *b, rs_ipc_wait w, void *stream) {
  return ipc_launch(D_IPC_POST, b, &w, stream);
}
int __wrap_rs_cuda_ipc_pull(const rs_ipc_batch *b, rs_ipc_wait w, unsigned blocks, void *stream) {
  (void)blocks;
  return ipc_launch(D_IPC_PULL, b, &w, stream);
}
int __wrap_rs_cuda_ipc_ack(const rs_ipc_batch *b, void *stream) { return ipc_launch(D_IPC_ACK, b, NULL, stream); }
int __wrap_rs_cuda_ipc_acked(const rs_ipc_batch *b, rs_ipc_wait w, void *stream) {
  return ipc_launch(D_IPC_ACKED, b, &w, stream);
}
int __wrap_rs_cuda_ipc_max(const uint64_t *words, uint32_t n, uint32_t stride, uint32_t k, uint64_t *out,
                           void *stream) {
  LOCK();
  dop *o = push(stream_of(stream), D_IPC_MAX);
  o->src = words;
  o->n = n;
  o->nsrc = stride, o->ndst = k; /* (the dop's spare words) */
  o->dst = out;
  progress();
  UNLOCK();
  return 0;
}

/* ------------------------------------------------------------ graphs */

cudaError_t __wrap_cudaLaunchHostFunc(cudaStream_t s, cudaHostFn_t fn, void *arg) {
  LOCK();
  dop *o = push(stream_of(s), D_HOSTFN);
  o->fn = fn;
  o->arg = arg;
  progress();
  UNLOCK();
  return cudaSuccess;
}

cudaError_t __wrap_cudaThreadExchangeStreamCaptureMode(enum cudaStreamCaptureMode *mode) {
  enum cudaStreamCaptureMode old = (enum cudaStreamCaptureMode)M.capture_mode;
  M.capture_mode = (int)*mode;
  *mode = old;
  return cudaSuccess;
}

cudaError_t __wrap_cudaStreamBeginCapture(cudaStream_t s, enum cudaStreamCaptureMode mode) {
  if (!s) return cudaErrorStreamCaptureUnsupported; /* the legacy stream */
  LOCK();
  mstream *st = stream_of(s);
  if (st->capt) {
    UNLOCK();
    return cudaErrorIllegalState;
  }
  mcap *c = calloc(1, sizeof *c);
  c->rank = M.rank;
  c->refs = 1;
  c->mode = (int)mode;
  c->thread = pthread_self();
  c->members[0] = st;
  c->nmembers = 1;
  c->next = G.caps;
  G.caps = c;
  st->capt = c;
  st->cj = 0;
  UNLOCK();
  return cudaSuccess;
}

cudaError_t __wrap_cudaStreamIsCapturing(cudaStream_t s, enum cudaStreamCaptureStatus *out) {
  LOCK();
  mstream *st = s ? stream_of(s) : NULL;
  *out = !st || !st->capt ? cudaStreamCaptureStatusNone
         : st->capt->invalid ? cudaStreamCaptureStatusInvalidated
                             : cudaStreamCaptureStatusActive;
  UNLOCK();
  return cudaSuccess;
}

/* Ends the capture begun on s: every stream that joined must have been
 * joined back into s (here: s waited for its last node directly). */
cudaError_t __wrap_cudaStreamEndCapture(cudaStream_t s, cudaGraph_t *out) {
  *out = NULL;
  LOCK();
  mstream *st = stream_of(s);
  mcap *c = st->capt;
  if (!c || c->members[0] != st) {
    UNLOCK();
    return cudaErrorStreamCaptureUnmatched;
  }
  cudaError_t r = cudaSuccess;
  for (int j = 1; j < c->nmembers; j++) {
    int joined = 0;
    for (size_t i = 0; i < c->nn; i++) {
      const mnode *n = &c->nodes[i];
      if (n->j == 0 && n->op.kind == D_WAIT && !n->op.xev && n->op.wj == j && n->op.wtarget >= c->cpos[j]) joined = 1;
    }
    if (!joined) r = cudaErrorStreamCaptureUnjoined;
  }
  if (c->invalid) r = cudaErrorStreamCaptureInvalidated;
  for (int j = 0; j < c->nmembers; j++) c->members[j]->capt = NULL;
  c->ended = 1;
  if (r) {
    world.capture_violations++;
    c->refs = 0; /* (freed with the world) */
  } else {
    *out = (cudaGraph_t)c;
  }
  UNLOCK();
  return r;
}

cudaError_t __wrap_cudaGraphInstantiate(cudaGraphExec_t *out, cudaGraph_t g, unsigned long long flags) {
  (void)flags;
  mexec *x = calloc(1, sizeof *x);
  LOCK();
  x->g = (mcap *)g;
  x->g->refs++;
  UNLOCK();
  *out = (cudaGraphExec_t)x;
  return cudaSuccess;
}

cudaError_t __wrap_cudaGraphDestroy(cudaGraph_t g) {
  LOCK();
  ((mcap *)g)->refs--; /* (freed with the world) */
  UNLOCK();
  return cudaSuccess;
}

cudaError_t __wrap_cudaGraphExecDestroy(cudaGraphExec_t e) {
  mexec *x = (mexec *)e;
  LOCK();
  x->g->refs--;
  for (int j = 0; j < MAXCAP; j++)
    if (x->r[j]) x->r[j]->live = 0;
  UNLOCK();
  free(x);
  return cudaSuccess;
}

/* A launch: the graph's nodes, in capture order, onto the executable's
 * own streams (one per captured stream), after the work on s; s then
 * waits for all of them. Waits inside the graph point into this launch,
 * external waits at the events as they stand now, external records
 * record there; NCCL work takes its place in the communicator's issue
 * order now, as a fresh launch of NCCL's kernels would. */
cudaError_t __wrap_cudaGraphLaunch(cudaGraphExec_t e, cudaStream_t s) {
  mexec *x = (mexec *)e;
  LOCK();
  mstream *L = stream_of(s);
  mcap *g = x->g;
  if (L->capt) { /* (a graph launched into a capture: not emulated) */
    UNLOCK();
    return cudaErrorStreamCaptureUnsupported;
  }
  uint64_t base[MAXCAP];
  for (int j = 0; j < g->nmembers; j++) {
    if (!x->r[j]) {
      x->r[j] = new_stream(NULL);
      x->r[j]->key = x->r[j];
      x->r[j]->created = 1;
    }
    if (j == 0) {
      dop *w = push(x->r[0], D_WAIT);
      w->ws = L;
      w->wtarget = L->enq;
    }
    base[j] = x->r[j]->enq;
  }
  for (size_t i = 0; i < g->nn; i++) {
    const mnode *n = &g->nodes[i];
    mstream *R = x->r[n->j];
    dop *o = push(R, n->op.kind);
    *o = n->op;
    switch (o->kind) {
    case D_WAIT:
      if (o->xev && o->xrec) { /* records the event here; waits for nothing */
        o->xev->s = R;
        o->xev->target = R->enq - 1;
        o->xev->cap = NULL;
        o->ws = R, o->wtarget = 0;
      } else if (o->xev) {
        o->ws = o->xev->s ? o->xev->s : R;
        o->wtarget = o->xev->s ? o->xev->target : 0;
      } else {
        o->ws = x->r[o->wj];
        o->wtarget = base[o->wj] + o->wtarget;
      }
      o->xev = NULL;
      break;
    case D_GROUP:
      o->p = malloc((size_t)o->np * sizeof *o->p);
      memcpy(o->p, n->op.p, (size_t)o->np * sizeof *o->p);
      o->ticket = o->comm->nccl_issued++;
      break;
    case D_ALLRED:
      o->ticket = o->comm->nccl_issued++;
      o->coll = o->comm->coll_issued++;
      break;
    case D_IPC_POST:
    case D_IPC_PULL:
    case D_IPC_ACK:
    case D_IPC_ACKED:
      o->batch = malloc(sizeof *o->batch);
      memcpy(o->batch, n->op.batch, sizeof *o->batch);
      o->at = NULL;
      break;
    default:
      break;
    }
  }
  for (int j = 0; j < g->nmembers; j++) {
    dop *w = push(L, D_WAIT);
    w->ws = x->r[j];
    w->wtarget = x->r[j]->enq;
  }
  progress();
  UNLOCK();
  return cudaSuccess;
}

/* ------------------------------------------------------------ NCCL */

ncclResult_t __wrap_ncclMemAlloc(void **p, size_t n) {
  if (M.fail_nccl_mem) return ncclSystemError;
  LOCK();
  *p = dev_alloc(n);
  mpin *q = calloc(1, sizeof *q);
  q->p = *p, q->n = n, q->nccl = 1, q->next = G.pins;
  G.pins = q;
  world.staging_live += n;
  if (world.staging_live > world.staging_peak) world.staging_peak = world.staging_live;
  UNLOCK();
  return ncclSuccess;
}
ncclResult_t __wrap_ncclMemFree(void *p) {
  if (!p) return ncclSuccess;
  LOCK();
  progress();
  mpin *q = unpin(p);
  if (q) world.staging_live -= q->n;
  free(q);
  M.mem--;
  free(p);
  UNLOCK();
  return ncclSuccess;
}

ncclResult_t __wrap_ncclGroupStart(void) {
  if (M.group_depth++ == 0) M.group_first = M.np2p;
  return ncclSuccess;
}

static ncclResult_t p2p(int is_recv, void *buf, size_t count, ncclDataType_t dt, int peer, ncclComm_t c,
                        cudaStream_t s) {
  if (M.group_depth == 0 || dt != ncclInt8) {
    fprintf(stderr, "mock: ncclSend/ncclRecv outside a group or not in bytes\n");
    abort();
  }
  LOCK();
  int ok = usable(comm_of(c));
  UNLOCK();
  if (!ok) return ncclInvalidArgument;
  if (M.np2p == MAXOPS) {
    /* log full (worlds without logging): keep only the open group */
    int k = M.np2p - M.group_first;
    memmove(M.p2p, M.p2p + M.group_first, (size_t)k * sizeof *M.p2p);
    M.np2p = k, M.group_first = 0;
    if (k == MAXOPS) abort();
  }
  M.p2p[M.np2p++] = (mp2p){peer, is_recv, count, s, buf, c};
  return M.p2p_inprogress ? ncclInProgress : ncclSuccess;
}
ncclResult_t __wrap_ncclSend(const void *b, size_t count, ncclDataType_t dt, int peer, ncclComm_t c,
                             cudaStream_t s) {
  return p2p(0, (void *)b, count, dt, peer, c, s);
}
ncclResult_t __wrap_ncclRecv(void *b, size_t count, ncclDataType_t dt, int peer, ncclComm_t c, cudaStream_t s) {
  return p2p(1, b, count, dt, peer, c, s);
}

static int conn_done(void *a) { return all_connected(a); }

ncclResult_t __wrap_ncclGroupEnd(void) {
  if (M.group_depth == 0) return ncclInvalidUsage;
  if (--M.group_depth > 0) return ncclSuccess; /* nested: launches nothing yet */
  M.groups++;
  int first = M.group_first, n = M.np2p - first;
  if (M.group_end_fail_at == M.groups) {
    M.np2p = first; /* the failed group is dropped */
    return M.group_end_result;
  }
  if (n == 0) return ncclSuccess;
  mop *lg = mock_log(OP_GROUP, M.p2p[first].stream);
  lg->first_send = first;
  lg->nsend = n;
  ncclComm_t handle = M.p2p[first].comm;
  LOCK();
  mcomm *c = comm_of(handle);
  mstream *gs = stream_of(M.p2p[first].stream);
  dop *o = push(gs, D_GROUP);
  o->comm = c;
  if (!gs->capt) o->ticket = c->nccl_issued++; /* (captured: at each launch) */
  o->p = calloc((size_t)n, sizeof *o->p);
  o->np = n;
  mgroup *g = alone(c) ? NULL : group_of(c->gid, c->size);
  for (int i = 0; i < n; i++) {
    mp2p *x = &M.p2p[first + i];
    o->p[i] = (dp2p){x->peer, x->is_recv, 0, x->buf, x->bytes};
    if (getenv("MOCK_TRACE"))
      fprintf(stderr, "trace: rank %d gid %d ticket %llu: %s %d, %zu bytes\n", c->rank, c->gid,
              (unsigned long long)o->ticket, x->is_recv ? "recv from" : "send to", x->peer, x->bytes);
    if (g) (x->is_recv ? g->rreq : g->sreq)[c->rank][x->peer] = 1; /* connect lazily */
  }
  progress();
  pthread_cond_broadcast(&G.cv);
  ncclResult_t r = ncclSuccess;
  if (!c->blocking || M.inprogress_polls) {
    r = ncclInProgress; /* the caller polls ncclCommGetAsyncError */
  } else if (!all_connected(c) && wait_for(conn_done, c, "ncclGroupEnd (connecting peers)")) {
    r = ncclSystemError; /* (a hang, counted) */
  }
  UNLOCK();
  return r;
}

ncclResult_t __wrap_ncclGroupSimulateEnd(ncclSimInfo_t *si) {
  if (M.group_depth == 0) return ncclInvalidUsage;
  if (--M.group_depth > 0) return ncclSuccess;
  M.np2p = M.group_first;
  return si->magic == 0x74685283 ? ncclSuccess : ncclInvalidArgument;
}

static int split_complete(mcomm *c);
static int split_done(void *a) { return split_complete(a); }

static int split_complete(mcomm *c) {
  if (M.split_never) return 0;
  if (!c->init_pending) return 1;
  if (world.n == 0 || group_of(c->gid, c->size)->split_arrived >= c->size) c->init_pending = 0;
  return !c->init_pending;
}

ncclResult_t __wrap_ncclCommGetAsyncError(ncclComm_t h, ncclResult_t *st) {
  LOCK();
  mcomm *c = comm_of(h);
  int ok = usable(c);
  progress();
  ncclResult_t r = M.async_error;
  if (c->split_child) { /* a nonblocking parent's split: its state is the parent's */
    if (M.split_result) {
      r = M.split_result;
      c->split_child = NULL;
    } else if (split_complete(c->split_child)) {
      __atomic_store_n(c->split_out, (ncclComm_t)c->split_child, __ATOMIC_RELEASE);
      c->split_child = NULL;
    } else {
      r = ncclInProgress;
    }
  } else if (M.inprogress_polls) {
    if (M.inprogress_polls > 0) M.inprogress_polls--;
    r = ncclInProgress;
  } else if (!split_complete(c)) {
    r = ncclInProgress;
  } else if (!c->blocking && !all_connected(c)) {
    r = ncclInProgress;
  } else if (c->finalizing && c->nccl_done < c->nccl_issued) {
    r = ncclInProgress;
  }
  UNLOCK();
  *st = r;
  return ok ? ncclSuccess : ncclInvalidArgument;
}
const char *__wrap_ncclGetLastError(ncclComm_t c) {
  (void)c;
  return "mock detail";
}
ncclResult_t __wrap_ncclCommAbort(ncclComm_t h) {
  LOCK();
  M.aborts++;
  if (h == MOCK_PARENT) world.parent_aborts++;
  mcomm *c = comm_of(h);
  usable(c);
  c->aborted = 1;
  /* its share of collectives still waiting for others is withdrawn */
  for (mcoll *k = G.colls; k; k = k->next)
    if (k->gid == c->gid && !k->done && k->bufs[c->rank]) k->broken = 1, k->bufs[c->rank] = NULL;
  progress();
  pthread_cond_broadcast(&G.cv);
  UNLOCK();
  return ncclSuccess;
}
ncclResult_t __wrap_ncclCommDestroy(ncclComm_t h) {
  LOCK();
  if (h == MOCK_PARENT) world.parent_destroys++;
  mcomm *c = comm_of(h);
  usable(c);
  c->destroyed = 1;
  for (mcoll *k = G.colls; k; k = k->next) /* (as in abort) */
    if (k->gid == c->gid && !k->done && k->bufs[c->rank]) k->broken = 1, k->bufs[c->rank] = NULL;
  progress();
  UNLOCK();
  return ncclSuccess;
}
ncclResult_t __wrap_ncclCommFinalize(ncclComm_t h) {
  LOCK();
  mcomm *c = comm_of(h);
  int ok = usable(c);
  c->finalizing = 1;
  UNLOCK();
  return ok ? (c->blocking ? ncclSuccess : ncclInProgress) : ncclInvalidArgument;
}
ncclResult_t __wrap_ncclCommSplit(ncclComm_t h, int color, int key, ncclComm_t *out, ncclConfig_t *cfg) {
  (void)color, (void)key; /* reshard splits everyone into one, in rank order */
  LOCK();
  mcomm *p = comm_of(h);
  if (!usable(p)) {
    UNLOCK();
    return ncclInvalidArgument;
  }
  M.splits++;
  mcomm *c = calloc(1, sizeof *c);
  c->gid = (p->gid + 1) * 100 + ++p->splits;
  c->rank = p->rank;
  c->size = p->size;
  c->blocking = !(cfg && cfg->blocking == 0);
  c->init_pending = 1;
  c->next = G.comms;
  G.comms = c;
  group_of(c->gid, c->size)->split_arrived++;
  pthread_cond_broadcast(&G.cv);
  /* NCCL runs the split in the parent's blocking mode (src/init.cc,
   * ncclCommInitChildComm launches it on the parent); the child's own
   * config governs the child afterwards. A nonblocking parent's split
   * stores the child once it is done: here at once, polled as pending. */
  ncclResult_t r = ncclSuccess;
  if (!p->blocking) {
    /* the child is stored when the split is done (seen by polling the
     * parent), as NCCL does */
    p->split_child = c;
    p->split_out = out;
    *out = NULL;
    UNLOCK();
    return ncclInProgress;
  }
  if (wait_for(split_done, c, "ncclCommSplit")) r = ncclSystemError; /* (a hang, counted) */
  UNLOCK();
  *out = (ncclComm_t)c;
  return r;
}
ncclResult_t __wrap_ncclCommCuDevice(ncclComm_t h, int *d) {
  (void)h;
  *d = M.comm_device;
  return ncclSuccess;
}
ncclResult_t __wrap_ncclAllReduce(const void *s, void *r, size_t n, ncclDataType_t dt, ncclRedOp_t op,
                                  ncclComm_t h, cudaStream_t st) {
  if (dt != ncclUint64 || op != ncclMax || n > RS_AGREE_MAX_WORDS) abort();
  M.allreduce_calls++;
  if (M.allreduce_result) return M.allreduce_result;
  LOCK();
  mcomm *c = comm_of(h);
  if (!usable(c)) {
    UNLOCK();
    return ncclInvalidArgument;
  }
  if (s != r) memcpy(r, s, n * 8);
  mstream *as = stream_of(st);
  dop *o = push(as, D_ALLRED);
  o->comm = c;
  if (!as->capt) { /* (captured: at each launch) */
    o->ticket = c->nccl_issued++;
    o->coll = c->coll_issued++;
  }
  o->vals = r;
  o->nvals = (int)n;
  progress();
  UNLOCK();
  return ncclSuccess;
}
ncclResult_t __wrap_ncclCommCount(ncclComm_t h, int *n) {
  LOCK();
  *n = comm_of(h)->size;
  UNLOCK();
  return ncclSuccess;
}
ncclResult_t __wrap_ncclCommUserRank(ncclComm_t h, int *r) {
  LOCK();
  *r = comm_of(h)->rank;
  UNLOCK();
  return ncclSuccess;
}
