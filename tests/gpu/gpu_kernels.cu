/* The CUDA copy kernel against the host reference (rs_copy_run), on a GPU:
 * random batches of descriptors (transposes, odd element sizes, misaligned
 * offsets, reversed dims; many descriptors per launch; staging on either
 * side), byte-exact over the whole destination; offsets beyond 2^31
 * elements and 2^32 bytes on both sides; and the agreement kernels with
 * the copy gate they drive. Exit 77 without a device.
 * Usage: gpu_kernels [--small] [seed]  (--small: a few iterations, for
 * compute-sanitizer). */
#include <stdint.h>
#include <string.h>
#include <time.h>
#include <chrono>
#include <vector>

extern "C" {
#include "device/device.h"
#include "pack/copy.h"
#include "pack/quantize.h"
}
#include "gpu/gpu_common.h"
#include "device-emul/rand_copies.h"
#include "kernels/rs_kernels.h"

static int run_batch(uint64_t seed, int ndesc, uint64_t tile_bytes, int staging_side) {
  uint64_t s = seed;
  std::vector<rs_copy> c(ndesc);
  uint64_t sb = 0, db = 0;
  for (int i = 0; i < ndesc; i++) {
    uint64_t sl, dl;
    rc_copy(&s, sb, db, &c[i], &sl, &dl);
    sb += sl;
    db += dl;
    if (staging_side == 1) c[i].src_buf = RS_BUF_STAGING;
    if (staging_side == 2) c[i].dst_buf = RS_BUF_STAGING;
  }
  std::vector<unsigned char> src(sb), ref(db, 0xa5), got(db);
  for (auto &b : src) b = (unsigned char)(rc_rand(&s) >> 56);
  for (int i = 0; i < ndesc; i++) rs_copy_run(&c[i], src.data(), ref.data());
  uint64_t nt = rs_tiles_count(c.data(), ndesc, tile_bytes);
  std::vector<rs_tile> t(nt ? nt : 1);
  rs_tiles_build(c.data(), ndesc, 0, tile_bytes, t.data());

  unsigned char *dsrc, *ddst;
  rs_copy *dc;
  rs_tile *dt;
  void **tab;
  CK(cudaMalloc(&dsrc, sb));
  CK(cudaMalloc(&ddst, db));
  CK(cudaMalloc(&dc, ndesc * sizeof(rs_copy)));
  CK(cudaMalloc(&dt, t.size() * sizeof(rs_tile)));
  CK(cudaMalloc(&tab, 2 * sizeof(void *)));
  void *htab[2] = {dsrc, ddst};
  CK(cudaMemcpy(tab, htab, sizeof htab, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(dsrc, src.data(), sb, cudaMemcpyHostToDevice));
  CK(cudaMemset(ddst, 0xa5, db));
  CK(cudaMemcpy(dc, c.data(), ndesc * sizeof(rs_copy), cudaMemcpyHostToDevice));
  CK(cudaMemcpy(dt, t.data(), t.size() * sizeof(rs_tile), cudaMemcpyHostToDevice));
  void *staging = staging_side == 1 ? (void *)dsrc : staging_side == 2 ? (void *)ddst : NULL;
  CK((cudaError_t)rs_cuda_launch_copies(dt, nt, dc, tab, tab + 1, staging, 0));
  CK(cudaDeviceSynchronize());
  CK(cudaMemcpy(got.data(), ddst, db, cudaMemcpyDeviceToHost));
  int bad = 0;
  if (memcmp(ref.data(), got.data(), db) != 0) {
    uint64_t i = 0;
    while (ref[i] == got[i]) i++;
    fprintf(stderr, "FAIL seed %llu (%d descriptors, tile %llu, staging side %d): byte %llu is %02x, reference %02x\n",
            (unsigned long long)seed, ndesc, (unsigned long long)tile_bytes, staging_side, (unsigned long long)i,
            got[i], ref[i]);
    bad = 1;
  }
  cudaFree(dsrc);
  cudaFree(ddst);
  cudaFree(dc);
  cudaFree(dt);
  cudaFree(tab);
  return bad;
}

/* Offsets past 2^31 fp32 elements (8 GiB) on the source, strides whose
 * products pass 2^32 bytes, and a destination offset past 9 GiB. Only the
 * bytes the boxes touch are written and read back. */
static int run_large(void) {
  const uint64_t GiB = 1ull << 30, big = 10 * GiB;
  size_t freeb = 0, total = 0;
  CK(cudaMemGetInfo(&freeb, &total));
  if (freeb < big + GiB) {
    printf("large offsets: %zu bytes free, need %llu: not run\n", freeb, (unsigned long long)(big + GiB));
    return 0;
  }
  unsigned char *B, *small;
  CK(cudaMalloc(&B, big));
  CK(cudaMalloc(&small, 1 << 20));
  CK(cudaMemset(B, 0, big));
  CK(cudaMemset(small, 0xa5, 1 << 20));
  rs_copy c[3];
  /* A: 1000 runs of 4 floats, stride 16 floats, from element 2^31 + 3 */
  int64_t eA2[2] = {1000, 4}, sA2[2] = {16, 1}, dA2[2] = {4, 1};
  rs_copy_init(&c[0], 2, eA2, 4, 0, ((1ull << 31) + 3) * 4, sA2, 1, 0, dA2);
  /* B: 3 x 500 single floats, outer stride 3 GiB + 16 bytes */
  int64_t eB[2] = {3, 500}, sB[2] = {(int64_t)((3 * GiB + 16) / 4), 2}, dB[2] = {500, 1};
  rs_copy_init(&c[1], 2, eB, 4, 0, 100, sB, 1, 65536, dB);
  /* C: destination past 9 GiB (small -> B) */
  int64_t eC[2] = {7, 33}, sC[2] = {33, 1}, dC[2] = {1000, 1};
  rs_copy_init(&c[2], 2, eC, 2, 1, 200000, sC, 0, 9 * GiB + 6, dC);
  /* fill the source runs with a pattern of their byte offsets */
  std::vector<unsigned char> pat;
  for (int i = 0; i < 2; i++) {
    uint64_t runs = 1;
    for (int k = 0; k < c[i].ndim; k++) runs *= c[i].extent[k];
    for (uint64_t r = 0; r < runs; r++) {
      int64_t so, dof;
      rs_tile_run_offsets(&c[i], r, &so, &dof);
      uint64_t at = c[i].src_off + so;
      pat.resize(c[i].run_bytes);
      for (uint64_t b = 0; b < c[i].run_bytes; b++) pat[b] = (unsigned char)((at + b) * 2654435761u >> 13);
      CK(cudaMemcpy(B + at, pat.data(), pat.size(), cudaMemcpyHostToDevice));
    }
  }
  std::vector<unsigned char> sm(1 << 20);
  for (size_t i = 0; i < sm.size(); i++) sm[i] = (unsigned char)(i * 7 + 1);
  CK(cudaMemcpy(small + 200000, sm.data() + 200000, 7 * 33 * 2, cudaMemcpyHostToDevice));
  uint64_t nt = rs_tiles_count(c, 3, RS_TILE_BYTES);
  std::vector<rs_tile> t(nt);
  rs_tiles_build(c, 3, 0, RS_TILE_BYTES, t.data());
  rs_copy *dc;
  rs_tile *dt;
  void **tab;
  CK(cudaMalloc(&dc, sizeof c));
  CK(cudaMalloc(&dt, nt * sizeof(rs_tile)));
  CK(cudaMalloc(&tab, 2 * sizeof(void *)));
  void *htab[2] = {B, small};
  CK(cudaMemcpy(tab, htab, sizeof htab, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(dc, c, sizeof c, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(dt, t.data(), nt * sizeof(rs_tile), cudaMemcpyHostToDevice));
  /* descriptors 0, 1: B -> small; 2: small -> B. src_tab/dst_tab are the
   * same two-entry table read by buffer id. */
  CK((cudaError_t)rs_cuda_launch_copies(dt, nt, dc, tab, tab, NULL, 0));
  CK(cudaDeviceSynchronize());
  int bad = 0;
  std::vector<unsigned char> got(1 << 20);
  CK(cudaMemcpy(got.data(), small, got.size(), cudaMemcpyDeviceToHost));
  for (int i = 0; i < 2; i++) {
    uint64_t runs = 1;
    for (int k = 0; k < c[i].ndim; k++) runs *= c[i].extent[k];
    for (uint64_t r = 0; r < runs && !bad; r++) {
      int64_t so, dof;
      rs_tile_run_offsets(&c[i], r, &so, &dof);
      uint64_t at = c[i].src_off + so;
      for (uint64_t b = 0; b < c[i].run_bytes; b++)
        if (got[c[i].dst_off + dof + b] != (unsigned char)((at + b) * 2654435761u >> 13)) {
          fprintf(stderr, "FAIL large offsets: descriptor %d run %llu byte %llu\n", i, (unsigned long long)r,
                  (unsigned long long)b);
          bad = 1;
          break;
        }
    }
  }
  std::vector<unsigned char> gc(7 * 1000 * 2);
  CK(cudaMemcpy(gc.data(), B + 9 * GiB + 6, gc.size(), cudaMemcpyDeviceToHost));
  for (int i = 0; i < 7 && !bad; i++)
    for (int j = 0; j < 66; j++)
      if (gc[i * 2000 + j] != sm[200000 + i * 66 + j]) {
        fprintf(stderr, "FAIL large offsets: destination past 9 GiB, row %d byte %d\n", i, j);
        bad = 1;
        break;
      }
  cudaFree(B);
  cudaFree(small);
  cudaFree(dc);
  cudaFree(dt);
  cudaFree(tab);
  if (!bad) printf("large offsets (2^31 elements, 2^32 bytes): ok\n");
  return bad;
}

/* The agreement kernels and the gate (kernels/rs_agree.h): matching
 * headers keep the gate open and a gated copy writes; one differing
 * header closes it for good (sticky, the first difference recorded) and a
 * gated copy then writes nothing. */
static int run_agreement(void) {
  int bad = 0;
  rs_dev_hdr *d_out, *d_in;
  rs_dev_agree *d_st, st;
  CK(cudaMalloc((void **)&d_out, sizeof *d_out));
  CK(cudaMalloc((void **)&d_in, 3 * sizeof *d_in));
  CK(cudaMalloc((void **)&d_st, sizeof *d_st));
  memset(&st, 0, sizeof st);
  st.ok = 1;
  CK(cudaMemcpy(d_st, &st, sizeof st, cudaMemcpyHostToDevice));
  rs_dev_hdr mine = {RS_DEV_HDR_MAGIC, 0x1234, 5, 6};
  CK((cudaError_t)rs_cuda_agree_stamp(d_out, mine, 0));
  for (int i = 0; i < 3; i++) CK(cudaMemcpy(d_in + i, d_out, sizeof mine, cudaMemcpyDeviceToDevice));
  CK((cudaError_t)rs_cuda_agree_check(d_in, 3, mine, d_st, 0));
  /* a gated copy of 4 KiB */
  const size_t n = 4096;
  unsigned char *src, *dst;
  CK(cudaMalloc((void **)&src, n));
  CK(cudaMalloc((void **)&dst, n));
  CK(cudaMemset(src, 0x5a, n));
  rs_copy c;
  memset(&c, 0, sizeof c);
  c.run_bytes = n; /* one contiguous run, no outer dims */
  c.src_buf = 0, c.dst_buf = 0;
  rs_tile t;
  uint64_t nt = rs_tiles_count(&c, 1, RS_TILE_BYTES);
  if (nt != 1) {
    printf("agreement: %llu tiles for one 4 KiB run\n", (unsigned long long)nt);
    return 1;
  }
  rs_tiles_build(&c, 1, 0, RS_TILE_BYTES, &t);
  rs_copy *dc;
  rs_tile *dt;
  void **tab;
  CK(cudaMalloc((void **)&dc, sizeof c));
  CK(cudaMalloc((void **)&dt, sizeof t));
  CK(cudaMalloc((void **)&tab, 2 * sizeof(void *)));
  void *h_tab[2] = {src, dst};
  CK(cudaMemcpy(dc, &c, sizeof c, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(dt, &t, sizeof t, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(tab, h_tab, sizeof h_tab, cudaMemcpyHostToDevice));
  for (int round = 0; round < 2; round++) {
    if (round == 1) { /* one partner at another version */
      rs_dev_hdr other = mine;
      other.version = 9;
      CK(cudaMemcpy(d_in + 1, &other, sizeof other, cudaMemcpyHostToDevice));
      CK((cudaError_t)rs_cuda_agree_check(d_in, 3, mine, d_st, 0));
    }
    CK(cudaMemset(dst, 0, n));
    CK((cudaError_t)rs_cuda_launch_copies_gated(dt, nt, dc, tab, tab + 1, NULL, &d_st->ok, 0));
    CK(cudaDeviceSynchronize());
    std::vector<unsigned char> h(n);
    CK(cudaMemcpy(h.data(), dst, n, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(&st, d_st, sizeof st, cudaMemcpyDeviceToHost));
    unsigned char want = round == 0 ? 0x5a : 0;
    size_t wrong = 0;
    for (size_t i = 0; i < n; i++) wrong += h[i] != want;
    int ok_want = round == 0;
    if (wrong || (int)st.ok != ok_want || (round == 1 && (st.bad_index != 1 || st.got.version != 9 || st.want.version != 6))) {
      printf("agreement round %d: %zu wrong bytes, ok %u, bad_index %u\n", round, wrong, st.ok, st.bad_index);
      bad++;
    }
  }
  printf("agreement kernels and gate: %s\n", bad ? "FAILED" : "passed");
  cudaFree(d_out), cudaFree(d_in), cudaFree(d_st), cudaFree(src), cudaFree(dst), cudaFree(dc), cudaFree(dt), cudaFree(tab);
  return bad;
}

/* The double-buffer commit (kernels/rs_agree.h): select picks copy 0
 * before any commit, flip commits only on a vote without failure or
 * ranks apart and an open gate, and select then picks the other copy. */
static int run_commit(void) {
  int bad = 0;
  void *h_tab[5] = {(void *)0x10, (void *)0x20, (void *)0x30, (void *)0x40, (void *)0x50}; /* src, 2 x 2 dst */
  void **tab, **cur, *h_cur[3];
  rs_dev_commit *c, hc;
  rs_dev_agree *st, hst;
  uint64_t *word, vote[RS_COMMIT_WORDS];
  CK(cudaMalloc((void **)&tab, sizeof h_tab));
  CK(cudaMalloc((void **)&cur, sizeof h_cur));
  CK(cudaMalloc((void **)&c, sizeof hc));
  CK(cudaMalloc((void **)&st, sizeof hst));
  CK(cudaMalloc((void **)&word, sizeof vote));
  memset(&hc, 0, sizeof hc);
  hc.active = -1;
  memset(&hst, 0, sizeof hst);
  hst.ok = 1;
  CK(cudaMemcpy(tab, h_tab, sizeof h_tab, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(c, &hc, sizeof hc, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(st, &hst, sizeof hst, cudaMemcpyHostToDevice));
  for (int step = 0; step < 3; step++) {
    CK((cudaError_t)rs_cuda_commit_select(tab, 1, 2, c, cur, 0));
    CK(cudaMemcpy(h_cur, cur, sizeof h_cur, cudaMemcpyDeviceToHost));
    int inactive = step == 2 ? 1 : step; /* step 1 commits, step 2 does not */
    if (h_cur[0] != h_tab[0] || h_cur[1] != h_tab[1 + 2 * inactive] || h_cur[2] != h_tab[2 + 2 * inactive]) {
      printf("commit step %d: select picked the wrong copy\n", step);
      bad++;
    }
    rs_commit_vote(step == 1 ? 1 : 0, 100 + (uint64_t)step, (uint64_t)step, vote); /* step 1: a rank failed */
    CK(cudaMemcpy(word, vote, sizeof vote, cudaMemcpyHostToDevice));
    CK((cudaError_t)rs_cuda_commit_flip(word, st, 100 + step, step, c, 0));
    CK(cudaMemcpy(&hc, c, sizeof hc, cudaMemcpyDeviceToHost));
    int want_active = 0; /* step 0 commits copy 0; step 1 (a rank failed) keeps it; step 2 commits copy 1 */
    if (step == 2) want_active = 1;
    uint64_t want_version = step == 2 ? 102 : 100;
    if (hc.active != want_active || hc.version != want_version) {
      printf("commit step %d: active %d version %llu\n", step, hc.active, (unsigned long long)hc.version);
      bad++;
    }
  }
  printf("double-buffer commit kernels: %s\n", bad ? "FAILED" : "passed");
  cudaFree(tab), cudaFree(cur), cudaFree(c), cudaFree(st), cudaFree(word);
  return bad;
}

/* The CUDA IPC protocol's kernels (kernels/rs_ipc.h) between two ranks
 * in this process, on two streams: a pooled and an inline message arrive
 * whole and are acknowledged; then a receive nobody sends gives up at its
 * 2 ms timeout, closing the gate with RS_DEV_AGREE_TRANSPORT. */
static int run_ipc(void) {
  int bad = 0;
  const uint32_t n = 2;
  const uint64_t big = 100000;
  unsigned char *win[2], *pool, *dst;
  rs_dev_agree *gate, hg;
  cudaStream_t s[2];
  for (int r = 0; r < 2; r++) {
    CK(cudaMalloc((void **)&win[r], rs_ipc_window_bytes(n)));
    CK(cudaMemset(win[r], 0, rs_ipc_window_bytes(n)));
    CK(cudaStreamCreateWithFlags(&s[r], cudaStreamNonBlocking));
  }
  CK(cudaMalloc((void **)&pool, 4096 + big));
  CK(cudaMalloc((void **)&dst, big + 64));
  CK(cudaMalloc((void **)&gate, sizeof hg));
  memset(&hg, 0, sizeof hg);
  hg.ok = 1;
  CK(cudaMemcpy(gate, &hg, sizeof hg, cudaMemcpyHostToDevice));
  std::vector<unsigned char> h(big);
  for (uint64_t i = 0; i < big; i++) h[i] = (unsigned char)(i * 131 + 7);
  CK(cudaMemcpy(pool + 4096, h.data(), big, cudaMemcpyHostToDevice));
  CK(cudaMemset(pool, 0x77, 64)); /* the inline payload */
  CK(cudaDeviceSynchronize());
  rs_ipc_batch post, pull;
  memset(&post, 0, sizeof post);
  memset(&pull, 0, sizeof pull);
  post.n = pull.n = 2;
  for (int k = 0; k < 2; k++) {
    uint64_t seq = (uint64_t)k + 1, bytes = k == 0 ? big : 64;
    rs_ipc_op *o = &post.op[k];
    o->slot = (rs_ipc_slot *)(win[1] + rs_ipc_slot_off(n, 0, seq));
    o->buf = k == 0 ? pool + 4096 : pool;
    o->ack = (uint64_t *)(win[0] + rs_ipc_ack_off(1));
    o->peer_abort = (uint64_t *)(win[1] + RS_IPC_ABORT_OFF);
    o->seq = seq, o->bytes = bytes, o->off = k == 0 ? 4096u : 0u, o->gen = 1, o->peer = 1;
    o = &pull.op[k];
    o->slot = (rs_ipc_slot *)(win[1] + rs_ipc_slot_off(n, 0, seq));
    o->buf = k == 0 ? dst : dst + big;
    o->pool = pool;
    o->ack = (uint64_t *)(win[0] + rs_ipc_ack_off(1));
    o->peer_abort = (uint64_t *)(win[0] + RS_IPC_ABORT_OFF);
    o->seq = seq, o->bytes = bytes, o->gen = 1, o->peer = 0;
  }
  rs_ipc_wait w0 = {(uint64_t *)(win[0] + RS_IPC_ABORT_OFF), gate, 5000000000ull};
  rs_ipc_wait w1 = {(uint64_t *)(win[1] + RS_IPC_ABORT_OFF), gate, 5000000000ull};
  /* the receiver first: its wait must see the post that comes later */
  CK((cudaError_t)rs_cuda_ipc_pull(&pull, w1, 4, s[1]));
  CK((cudaError_t)rs_cuda_ipc_ack(&pull, s[1]));
  CK((cudaError_t)rs_cuda_ipc_post(&post, w0, s[0]));
  CK((cudaError_t)rs_cuda_ipc_acked(&post, w0, s[0]));
  CK(cudaDeviceSynchronize());
  std::vector<unsigned char> got(big + 64);
  CK(cudaMemcpy(got.data(), dst, big + 64, cudaMemcpyDeviceToHost));
  CK(cudaMemcpy(&hg, gate, sizeof hg, cudaMemcpyDeviceToHost));
  size_t wrong = 0;
  for (uint64_t i = 0; i < big; i++) wrong += got[i] != h[i];
  for (uint64_t i = 0; i < 64; i++) wrong += got[big + i] != 0x77;
  if (wrong || !hg.ok) {
    printf("ipc: %zu wrong bytes, gate %u\n", wrong, hg.ok);
    bad++;
  }
  /* a receive whose message never comes */
  rs_ipc_batch lone = pull;
  lone.n = 1;
  lone.op[0].seq = 3;
  lone.op[0].slot = (rs_ipc_slot *)(win[1] + rs_ipc_slot_off(n, 0, 3));
  w1.timeout_ns = 2000000;
  auto t0 = std::chrono::steady_clock::now();
  CK((cudaError_t)rs_cuda_ipc_pull(&lone, w1, 1, s[1]));
  CK(cudaStreamSynchronize(s[1]));
  double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  uint64_t abort_word = 0;
  CK(cudaMemcpy(&hg, gate, sizeof hg, cudaMemcpyDeviceToHost));
  CK(cudaMemcpy(&abort_word, win[1] + RS_IPC_ABORT_OFF, 8, cudaMemcpyDeviceToHost));
  if (hg.ok || hg.bad_index != RS_DEV_AGREE_TRANSPORT || hg.got.magic != RS_IPC_TIMEOUT || abort_word != RS_IPC_TIMEOUT ||
      ms > 1000) {
    printf("ipc timeout: gate %u bad_index %u why %llu abort %llu after %.1f ms\n", hg.ok, hg.bad_index,
           (unsigned long long)hg.got.magic, (unsigned long long)abort_word, ms);
    bad++;
  }
  printf("CUDA IPC protocol kernels: %s (the timeout took %.1f ms)\n", bad ? "FAILED" : "passed", ms);
  for (int r = 0; r < 2; r++) cudaFree(win[r]), cudaStreamDestroy(s[r]);
  cudaFree(pool), cudaFree(dst), cudaFree(gate);
  return bad;
}

/* FP8 block quantization: the kernel against the host (rs_quantize_box,
 * the same block code as one thread), byte for byte over codes and
 * scales: random 2-D and stacked 3-D boxes of bf16, f16 and f32 inputs
 * read with a row pitch wider than the box, random and 128 x 128 blocks
 * (ragged last ones), half the boxes aligned for the vector loops, mostly
 * finite values with a few zero blocks and a few holding a NaN or an
 * infinity, one launch over all boxes, some
 * read from the gather pointer. */
static int run_quant(uint64_t seed) {
  uint64_t s = seed ^ 0x51ed270b;
  const int nbox = 24;
  const reshard_dtype_t dts[3] = {RESHARD_BF16, RESHARD_FP16, RESHARD_FP32};
  std::vector<rs_qbox> q(nbox);
  std::vector<uint64_t> bstart(nbox + 1, 0);
  uint64_t in_bytes[2] = {0, 0}, codes = 0, scales = 0;
  for (int i = 0; i < nbox; i++) {
    rs_qbox &b = q[i];
    memset(&b, 0, sizeof b);
    b.ndim = rc_rand(&s) % 3 ? 2 : 3;
    b.in_dtype = dts[rc_rand(&s) % 3];
    b.in_buf = rc_rand(&s) % 4 ? 0 : -1; /* -1: the gather buffer */
    const int big = rc_rand(&s) % 4 == 0;
    b.block[0] = big ? 128 : 1 + (int64_t)(rc_rand(&s) % 40);
    b.block[1] = big ? 128 : 1 + (int64_t)(rc_rand(&s) % 40);
    for (int d = 0; d < b.ndim; d++)
      b.extent[d] = d < b.ndim - 2 ? 1 + (int64_t)(rc_rand(&s) % 3) : 1 + (int64_t)(rc_rand(&s) % (big ? 400 : 150));
    const int64_t es = b.in_dtype == RESHARD_FP32 ? 4 : 2, nd = b.ndim;
    /* half the boxes aligned for the kernel's vector loops where bf16
     * (pack/quant_block.h rs_qblock_vec: rows of a multiple of 8 elements,
     * 16-byte aligned, codes 8-byte aligned) */
    const int aligned = rc_rand(&s) % 2;
    if (aligned) b.extent[nd - 1] = (b.extent[nd - 1] + 7) / 8 * 8;
    const int64_t pitch = b.extent[nd - 1] + (aligned ? 8 * (int64_t)(rc_rand(&s) % 2) : (int64_t)(rc_rand(&s) % 9));
    b.in_stride[nd - 1] = 1;
    b.in_stride[nd - 2] = pitch;
    if (nd == 3) b.in_stride[0] = pitch * b.extent[1];
    const int k = b.in_buf < 0;
    b.in_off = (in_bytes[k] + 15) / 16 * 16 + (aligned ? 0 : (uint64_t)es * (rc_rand(&s) % 3));
    if (aligned) codes = (codes + 7) / 8 * 8;
    in_bytes[k] = b.in_off + (uint64_t)(es * (nd == 3 ? b.in_stride[0] * b.extent[0] : pitch * b.extent[nd - 2]));
    b.code_off = codes;
    b.scale_off = scales;
    codes += (uint64_t)rs_qbox_elems(&b);
    scales += 4 * (uint64_t)rs_qbox_blocks(&b);
    bstart[i + 1] = bstart[i] + (uint64_t)rs_qbox_blocks(&b);
  }
  std::vector<unsigned char> in[2] = {std::vector<unsigned char>(in_bytes[0] + 16),
                                      std::vector<unsigned char>(in_bytes[1] + 16)};
  for (int k = 0; k < 2; k++)
    for (size_t j = 0; j + 1 < in[k].size(); j += 2) {
      /* finite values of every magnitude, a zero run now and then */
      uint32_t f = (uint32_t)(rc_rand(&s) >> 32);
      uint32_t e = 100 + (f >> 24) % 40;
      uint32_t bits = (f & 0x807fffffu) | (e << 23);
      if ((j / 512) % 17 == 0) bits = 0;
      /* now and then a NaN or an infinity (its block's other path) */
      if (f % 150001 == 0) bits = f & 1 ? 0x7fc00000u : (f & 0x80000000u) | 0x7f800000u;
      in[k][j] = (unsigned char)(bits >> 16), in[k][j + 1] = (unsigned char)(bits >> 24);
    }
  std::vector<unsigned char> ref_c(codes + 1, 0xa5), ref_s(scales + 1, 0xa5), got_c(codes + 1), got_s(scales + 1);
  for (int i = 0; i < nbox; i++)
    rs_quantize_box(&q[i], in[q[i].in_buf < 0].data(), ref_c.data(), ref_s.data());
  rs_qbox *dq;
  uint64_t *dbs;
  unsigned char *din[2], *dc, *ds;
  void **tab;
  CK(cudaMalloc(&dq, nbox * sizeof(rs_qbox)));
  CK(cudaMalloc(&dbs, (nbox + 1) * sizeof(uint64_t)));
  for (int k = 0; k < 2; k++) {
    CK(cudaMalloc(&din[k], in[k].size()));
    CK(cudaMemcpy(din[k], in[k].data(), in[k].size(), cudaMemcpyHostToDevice));
  }
  CK(cudaMalloc(&dc, codes + 1));
  CK(cudaMalloc(&ds, scales + 1));
  CK(cudaMalloc(&tab, sizeof(void *)));
  CK(cudaMemset(dc, 0xa5, codes + 1));
  CK(cudaMemset(ds, 0xa5, scales + 1));
  CK(cudaMemcpy(dq, q.data(), nbox * sizeof(rs_qbox), cudaMemcpyHostToDevice));
  CK(cudaMemcpy(dbs, bstart.data(), (nbox + 1) * sizeof(uint64_t), cudaMemcpyHostToDevice));
  CK(cudaMemcpy(tab, &din[0], sizeof(void *), cudaMemcpyHostToDevice));
  CK((cudaError_t)rs_cuda_quantize(dq, dbs, nbox, bstart[nbox], tab, din[1], dc, ds, NULL));
  CK(cudaDeviceSynchronize());
  CK(cudaMemcpy(got_c.data(), dc, codes + 1, cudaMemcpyDeviceToHost));
  CK(cudaMemcpy(got_s.data(), ds, scales + 1, cudaMemcpyDeviceToHost));
  int bad = 0;
  for (uint64_t j = 0; j <= codes && bad < 5; j++)
    if (got_c[j] != ref_c[j]) printf("quantize (seed %llu): code %llu is %02x, host %02x\n", (unsigned long long)seed,
                                     (unsigned long long)j, got_c[j], ref_c[j]), bad++;
  for (uint64_t j = 0; j <= scales && bad < 5; j++)
    if (got_s[j] != ref_s[j]) printf("quantize (seed %llu): scale byte %llu is %02x, host %02x\n",
                                     (unsigned long long)seed, (unsigned long long)j, got_s[j], ref_s[j]), bad++;
  cudaFree(dq);
  cudaFree(dbs);
  cudaFree(din[0]);
  cudaFree(din[1]);
  cudaFree(dc);
  cudaFree(ds);
  cudaFree(tab);
  return bad != 0;
}

int main(int argc, char **argv) {
  gpu_require_device("gpu_kernels");
  int small = argc > 1 && strcmp(argv[1], "--small") == 0;
  uint64_t seed0 = argc > 1 + small ? strtoull(argv[1 + small], NULL, 0) : (uint64_t)time(NULL);
  printf("gpu_kernels: seed %llu\n", (unsigned long long)seed0);
  const uint64_t tiles[] = {RS_TILE_BYTES, 256, 16};
  const int ndescs[] = {1, 7, 300};
  int iters = small ? 6 : 240, bad = 0;
  for (int it = 0; it < iters && bad < 5; it++)
    bad += run_batch(seed0 + (uint64_t)it * 7919, ndescs[it % 3], tiles[(it / 3) % 3], (it / 9) % 3);
  printf("random batches: %d iterations, %d failed\n", iters, bad);
  if (!small) bad += run_large();
  bad += run_agreement();
  bad += run_commit();
  bad += run_ipc();
  int qbad = 0;
  for (int it = 0; it < (small ? 2 : 20); it++) qbad += run_quant(seed0 + (uint64_t)it * 104729);
  printf("quantize kernel against the host: %d of %d launches differ\n", qbad, small ? 2 : 20);
  bad += qbad;
  printf("gpu_kernels: %s\n", bad ? "FAILED" : "passed");
  return bad ? 1 : 0;
}
