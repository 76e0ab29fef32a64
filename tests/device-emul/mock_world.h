/* Ranks as threads over one emulated world (mock_device.h), each with an
 * in-process host world at hand (for CUDA IPC's bootstrap): the runner
 * the multi-rank tests of the emulated device share. */
#ifndef RS_TESTS_GPU_MOCK_WORLD_H
#define RS_TESTS_GPU_MOCK_WORLD_H

#include <stdint.h>
#include <stdio.h>

#include "device-emul/mock_device.h"
#include "reshard.h"
#include "reshard_inproc.h"

typedef struct mw_rank mw_rank;
typedef void (*mw_fn)(mw_rank *r);

struct mw_rank {
  int rank, n;
  reshard_inproc_world_t *host_world;
  void *ctx;
  mw_fn fn;
  int failed;
  char why[512];
  int64_t wrong; /* wrong bytes the rank counted */
};

/* The rank failed; the first reason stays. */
#define RFAIL(r, ...)                                                   \
  do {                                                                  \
    if (!(r)->failed) snprintf((r)->why, sizeof (r)->why, __VA_ARGS__); \
    (r)->failed = 1;                                                    \
  } while (0)

/* What a world left behind, read before it ended. */
typedef struct mw_outcome {
  int64_t wrong;           /* the ranks' wrong bytes, summed */
  int failed;              /* the first failed rank; -1: none */
  long hangs;              /* host waits that could never end */
  long ipc_mapped;         /* CUDA IPC mappings left open */
  long ipc_closed_reads;   /* pulls through a CUDA IPC mapping closed before */
  long ipc_freed_mapped;   /* cudaFree of memory another rank had mapped */
  long capture_violations; /* calls a CUDA stream capture forbids */
  long bad_size;           /* messages matched to a receive of another size */
} mw_outcome;

/* Runs fn on n rank threads (r[0, n): each thread resets its rank, logs no
 * calls, runs fn, and fails if it leaked device memory, streams or
 * events) in a fresh world whose host waits are cut after hang_ms, with
 * an in-process host world of n ranks; ends both. */
mw_outcome mw_run(int n, int64_t hang_ms, mw_fn fn, void *ctx, mw_rank *r);

/* The double-buffered commit over the device communicator c (every
 * stream transport's, created by the caller): mw_layouts_all with small
 * staging, versions 1 to 4 commit and flip the active copy (the inactive
 * one keeps the version before), then rank 1 runs a version ahead:
 * nothing commits anywhere and the active copy keeps version 4, byte for
 * byte. Failures are RFAIL'ed on r. */
void mw_double_buffer(mw_rank *r, reshard_comm_t *c);

/* The commit's vote catches ranks apart (test_cuda_ipc.c
 * commit_vote_catches_ranks_apart says how), over the device communicator
 * c of 3 ranks: rank `odd` (1 or 2) passes another version at the second
 * call; ranks 0 and 1 exchange a tensor, rank 2 only copies locally, so
 * only the vote can tell it. Failures are RFAIL'ed on r. */
void mw_commit_apart(mw_rank *r, reshard_comm_t *c, int odd);

/* Layouts in which all n ranks exchange one rows x cols fp32 tensor "w":
 * rows sharded over the ranks on the source, columns over them in
 * reverse on the destination (every rank sends to every other). */
void mw_layouts_all(int n, int64_t rows, int64_t cols, reshard_layout_t **src, reshard_layout_t **dst);

/* A random pair on n ranks for block quantization (seeded): two weights
 * (2-D, or stacked 3-D) quantized to fp8e4m3 in random blocks, split
 * unevenly on the source (blocks span source ranks) and randomly on the
 * destination (scales split like their weight, or replicated), and a
 * bf16 tensor that is not quantized. */
void mw_quant_pair(uint64_t seed, int n, reshard_layout_t **src, reshard_layout_t **dst);

/* Source-side spreading's case on 16 ranks (an h100-8x400g topology):
 * ranks 0..7 (one NVLink domain) hold "experts" [4, rows, 512] bf16 split
 * over ranks 0 and 1 by expert (one replica each: sole-held) and "dense"
 * [256, 256] f32 replicated on all eight; ranks 8..15 take both split by
 * rows (fp8: the experts as fp8e4m3 in 128 x 128 blocks, with their
 * scales split alike). */
void mw_moe_pair(int64_t rows, int fp8, reshard_layout_t **src, reshard_layout_t **dst);

#endif
