/* The CUDA IPC transport's protocol on the device (src/transport/cuda_ipc.c):
 * mailboxes in IPC-mapped memory, written and polled by kernels, so that
 * ranks in different processes order their transfers without the host.
 * Like rs_tile.h and rs_agree.h, C11 and CUDA C++ at once: the kernels
 * (kernels/ipc_kernels.cu) and their CPU emulation in the tests
 * (tests/device-emul/mock_device.c) run this very code; only the spin loops
 * around it differ (a kernel spins on %globaltimer, the emulation steps).
 *
 * Every rank owns a *window* of device memory, exported once with
 * cudaIpcGetMemHandle and mapped by every other rank of the node:
 *   ack[n]          ack[r]: the last message of this rank's that rank r
 *                   has consumed (written by r, polled here);
 *   inbox[n][RING]  inbox[s][k % RING]: message k from rank s (written by
 *                   s, polled here): its sequence number, written last,
 *                   its size, and either the payload itself (up to
 *                   RS_IPC_INLINE bytes) or its offset in the sender's
 *                   staging pool, which this rank has mapped too;
 *   abort           nonzero: stop waiting (this rank's poison, a peer's
 *                   poison of the communicator, a failed wait here).
 * Flags live with the rank that polls them: a spin reads local memory,
 * and the remote side only writes.
 *
 * A point-to-point message s -> r with sequence number k (per ordered
 * pair, counted in posting order on both sides, from 1; the counts live
 * on the device, see rs_ipc_at) is:
 *   s: post     write inbox_r[s][k % RING] (payload or offset, size), then
 *               its sequence number, behind a system-scope fence;
 *   r: pull     wait until that slot holds k; copy the payload from it or
 *               from s's pool (mapped here) into the receive buffer;
 *   r: ack      after the pull (stream order): write ack_s[r] = k;
 *   s: acked    wait until ack_s[r] >= k: s's buffer is free again.
 * A group posts all its sends before it waits for anything, then pulls
 * its receives, acks them, and waits for its sends' acks: so every rank's
 * group completes if every rank issues the matching groups, in any
 * interleaving, as NCCL's do. A slot is reused RING messages later, and
 * a group completes only when its sends are acked, so a group may carry
 * up to RING messages per peer and direction.
 *
 * Every wait carries a timeout; when it passes, or the window's abort
 * word is set, the wait gives up: the plan's verdict (rs_dev_agree, the
 * gate of every later destination write) is closed with
 * RS_DEV_AGREE_TRANSPORT, naming the peer, and this window's abort word
 * is set so that the following waits give up at once. */
#ifndef RS_KERNELS_RS_IPC_H
#define RS_KERNELS_RS_IPC_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "kernels/rs_agree.h"
#include "kernels/rs_tile.h" /* RS_HD */

#define RS_IPC_RING 8u    /* slots per sender in a window */
#define RS_IPC_INLINE 96u /* payload bytes a slot carries itself */
#define RS_IPC_MAX_OPS 24 /* operations of one launch (kernel parameter) */

typedef struct rs_ipc_slot {
  uint64_t seq;   /* written last: the message is there once it matches */
  uint64_t bytes; /* the payload's size */
  uint64_t off;   /* payloads over RS_IPC_INLINE: offset in the sender's pool */
  uint64_t gen;   /* ... of the sender's pool generation (its mapping here must match) */
  unsigned char data[RS_IPC_INLINE];
} rs_ipc_slot; /* 128 bytes */

/* Byte offsets inside a window of an n-rank communicator. */
#define RS_IPC_ABORT_OFF ((uint64_t)0)
RS_HD uint64_t rs_ipc_ack_off(uint32_t r) { return 128 + 8 * (uint64_t)r; }
RS_HD uint64_t rs_ipc_slot_off(uint32_t n, uint32_t sender, uint64_t seq) {
  uint64_t acks = (128 + 8 * (uint64_t)n + 127) / 128 * 128;
  return acks + ((uint64_t)sender * RS_IPC_RING + seq % RS_IPC_RING) * sizeof(rs_ipc_slot);
}
RS_HD uint64_t rs_ipc_window_bytes(uint32_t n) { return rs_ipc_slot_off(n, n, 0); }

/* Why a wait gave up (recorded in the verdict's got.magic). */
enum { RS_IPC_TIMEOUT = 1, RS_IPC_ABORTED = 2, RS_IPC_BAD_SIZE = 3, RS_IPC_STALE = 4 };

/* One operation of a launch; every pointer is computed by the host. As the
 * host enqueues it, an operation names its message by its place in its
 * group (seq: 1, 2, ... per peer and direction) and its slot by the
 * sender's ring of RS_IPC_RING slots in the receiver's window; the
 * messages of earlier groups with that peer in that direction are
 * counted on the device (*count), so that a group captured into a CUDA
 * graph numbers its messages after everything before it at every launch.
 * rs_ipc_at gives the operation with its sequence number and slot. */
typedef struct rs_ipc_op {
  rs_ipc_slot *slot;   /* post: in the receiver's window (mapped); pull: in this window */
  unsigned char *buf;  /* post: the payload (inline copy); pull: the destination */
  const unsigned char *pool; /* pull: the sender's pool as mapped here */
  uint64_t *ack;       /* pull: the sender's ack word for this rank (mapped);
                          acked: this window's ack word of the receiver */
  uint64_t *peer_abort; /* the peer's abort word (mapped): a wait that gives up
                           sets it too, so the peer stops at once */
  uint64_t seq, bytes;
  uint64_t off;        /* post: the payload's offset in this rank's pool */
  uint64_t gen;        /* post: this rank's pool generation; pull: the
                          sender's, as mapped here */
  uint64_t *count;     /* this rank's count of the messages before the
                          group with the peer in this direction (device);
                          NULL once rs_ipc_at resolved the operation */
  int32_t peer;
  uint32_t last;       /* on the group's last message with the peer in this
                          direction: the group's messages with it, which
                          rs_ipc_advance adds to *count; else 0 */
} rs_ipc_op;

typedef struct rs_ipc_batch {
  uint32_t n;
  uint32_t pad;
  rs_ipc_op op[RS_IPC_MAX_OPS];
} rs_ipc_batch;

/* What a wait needs besides its operation. */
typedef struct rs_ipc_wait {
  uint64_t *abort;    /* this window's abort word */
  rs_dev_agree *gate; /* the plan's verdict (may be NULL) */
  uint64_t timeout_ns;
} rs_ipc_wait;

/* The operation with its sequence number and slot (the count read once,
 * before the group's last use of it advances it: see rs_ipc_advance). */
RS_HD rs_ipc_op rs_ipc_at(const rs_ipc_op *o) {
  rs_ipc_op r = *o;
  if (o->count) {
    r.seq = *(const volatile uint64_t *)o->count + o->seq;
    r.slot = o->slot + r.seq % RS_IPC_RING;
    r.count = NULL;
  }
  return r;
}

/* After the group's last use of a count (the acks of its receives, the
 * wait for its sends' acks; every operation of the launch resolved
 * before): its last message with a peer moves that count on. u is the
 * operation as enqueued (not resolved). */
RS_HD void rs_ipc_advance(const rs_ipc_op *u) {
  if (u->count && u->last) *(volatile uint64_t *)u->count += u->last;
}

/* On the GPU a system-scope fence (the peer is another process, maybe on
 * another GPU); the CPU emulation runs every step under one lock, so a
 * compiler barrier keeps the order there. */
#ifdef __CUDA_ARCH__
#define RS_IPC_FENCE() __threadfence_system()
#else
#define RS_IPC_FENCE() __asm__ __volatile__("" ::: "memory")
#endif

RS_HD uint64_t rs_ipc_load(const uint64_t *p) { return *(const volatile uint64_t *)p; }
RS_HD void rs_ipc_store(uint64_t *p, uint64_t v) { *(volatile uint64_t *)p = v; }

/* post: the slot's fields, then (fenced) its sequence number. One thread
 * per operation. */
RS_HD void rs_ipc_post(const rs_ipc_op *o) {
  rs_ipc_slot *s = o->slot;
  s->bytes = o->bytes;
  s->off = o->off;
  s->gen = o->gen;
  if (o->bytes <= RS_IPC_INLINE)
    for (uint64_t i = 0; i < o->bytes; i++) ((volatile unsigned char *)s->data)[i] = o->buf[i];
  RS_IPC_FENCE();
  rs_ipc_store(&s->seq, o->seq);
}

/* Whether message o->seq is in its slot (pull) or was consumed (acked). */
RS_HD int rs_ipc_arrived(const rs_ipc_op *o) { return rs_ipc_load(&o->slot->seq) == o->seq; }
RS_HD int rs_ipc_acked(const rs_ipc_op *o) { return rs_ipc_load(o->ack) >= o->seq; }

/* A wait on operation o gave up (why: RS_IPC_*): close the gate naming
 * the peer (first failure only) and set this window's abort word and the
 * peer's, so that later waits here and there give up at once (and this
 * rank posts nothing more). Called by one thread; the gate's record is
 * written before ok is cleared, and an earlier failure's record stays. */
RS_HD void rs_ipc_give_up(const rs_ipc_wait *w, const rs_ipc_op *o, uint64_t why) {
  if (w->gate && *(volatile uint32_t *)&w->gate->ok) {
    w->gate->bad_index = RS_DEV_AGREE_TRANSPORT;
    w->gate->got.magic = why;
    w->gate->got.digest = (uint64_t)(int64_t)o->peer;
    RS_IPC_FENCE();
    *(volatile uint32_t *)&w->gate->ok = 0;
  }
  if (w->gate) *(volatile uint32_t *)&w->gate->staging_ok = 0; /* (whatever closed ok before) */
  if (!rs_ipc_load(w->abort)) rs_ipc_store(w->abort, why);
  if (o->peer_abort && !rs_ipc_load(o->peer_abort)) rs_ipc_store(o->peer_abort, RS_IPC_ABORTED);
}

/* The check of an arrived message: 0 when it is what the receive
 * expects, else why the wait gives up: another size (the plans differ),
 * or a pooled payload from a pool generation other than the one mapped
 * here (the sender's pool was replaced without the exchange). */
RS_HD uint64_t rs_ipc_check(const rs_ipc_op *o) {
  if (o->slot->bytes != o->bytes) return RS_IPC_BAD_SIZE;
  if (o->bytes > RS_IPC_INLINE && o->slot->gen != o->gen) return RS_IPC_STALE;
  return 0;
}

/* pull: bytes [a, b) of an arrived message, thread t of nt. */
RS_HD void rs_ipc_copy(const rs_ipc_op *o, uint64_t a, uint64_t b, unsigned t, unsigned nt) {
  const unsigned char *src = o->bytes <= RS_IPC_INLINE ? o->slot->data : o->pool + o->slot->off;
  unsigned char *dst = o->buf;
  if ((((uintptr_t)src | (uintptr_t)dst | a | b) & 15) == 0) {
    for (uint64_t i = a + 16 * (uint64_t)t; i < b; i += 16 * (uint64_t)nt)
#ifdef __CUDA_ARCH__
      *(uint4 *)(dst + i) = *(const uint4 *)(src + i);
#else
      memcpy(dst + i, src + i, 16);
#endif
  } else {
    for (uint64_t i = a + t; i < b; i += nt) dst[i] = src[i];
  }
}

/* ack: the receive o is consumed (after its pull, in stream order). Acks
 * of one batch are written by one thread in order: receives from one
 * peer share its ack word, and the last must win. */
RS_HD void rs_ipc_ack(const rs_ipc_op *o) {
  RS_IPC_FENCE();
  rs_ipc_store(o->ack, o->seq);
}

/* The max, word by word, of n vectors of k words (vector i at words[i *
 * stride]) and out[0, k), into out (the reduction of the agreement's
 * verdict, k = 1, and of the commit's vote). */
RS_HD void rs_ipc_max(const uint64_t *words, uint32_t n, uint32_t stride, uint32_t k, uint64_t *out) {
  for (uint32_t j = 0; j < k; j++) {
    uint64_t m = out[j];
    for (uint32_t i = 0; i < n; i++)
      if (words[(uint64_t)i * stride + j] > m) m = words[(uint64_t)i * stride + j];
    out[j] = m;
  }
}

#endif
