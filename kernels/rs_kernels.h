/* C interface of the CUDA copy kernels (copy_kernels.cu). Plain C: the
 * executor and the tests include it without CUDA headers. */
#ifndef RS_KERNELS_RS_KERNELS_H
#define RS_KERNELS_RS_KERNELS_H

#include <stdint.h>

#include "kernels/rs_agree.h"
#include "kernels/rs_ipc.h"
#include "kernels/rs_verify.h"
#include "kernels/rs_tile.h"
#include "pack/copy.h"
#include "pack/quantize.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Threads per block of the copy kernel (the tile body's nthreads). */
#define RS_KERNEL_THREADS 256

/* Enqueues on `stream` (a cudaStream_t) one launch that copies every tile
 * of tiles[0, ntiles) (device memory): tile t copies part of descriptor
 * copies[tiles[t].desc] (device memory) from src_tab[src_buf] to
 * dst_tab[dst_buf], where RS_BUF_STAGING on either side means `staging`.
 * src_tab and dst_tab are device arrays of buffer base addresses; either
 * may be NULL when every descriptor uses staging on that side. Returns the
 * cudaError_t of the launch (0: enqueued); ntiles == 0 enqueues nothing. */
int rs_cuda_launch_copies(const rs_tile *tiles, uint64_t ntiles,
                          const rs_copy *copies, void *const *src_tab,
                          void *const *dst_tab, void *staging, void *stream);

/* The same, gated: when gate (device memory) is non-NULL and reads 0 when
 * the launch runs, nothing is written (the agreement failed). */
int rs_cuda_launch_copies_gated(const rs_tile *tiles, uint64_t ntiles,
                                const rs_copy *copies, void *const *src_tab,
                                void *const *dst_tab, void *staging,
                                const uint32_t *gate, void *stream);

/* The agreement (kernels/rs_agree.h): writes `mine` to out (device
 * memory), one header, on `stream`. */
int rs_cuda_agree_stamp(rs_dev_hdr *out, rs_dev_hdr mine, void *stream);

/* Checks the n headers at in (device memory) against want, sticky, into
 * *st (device memory), on `stream`. */
int rs_cuda_agree_check(const rs_dev_hdr *in, uint32_t n, rs_dev_hdr want,
                        rs_dev_agree *st, void *stream);

/* rs_dev_agree_export / rs_dev_agree_import (kernels/rs_agree.h) on
 * `stream`, around the communicator's reduction of the word. */
int rs_cuda_agree_export(const rs_dev_agree *st, uint64_t *word, void *stream);
int rs_cuda_agree_import(const uint64_t *word, rs_dev_hdr want,
                         rs_dev_agree *st, void *stream);

/* rs_dev_agree_absorb (kernels/rs_agree.h): *st closes when *prior is
 * closed, on `stream`. */
int rs_cuda_agree_absorb(const rs_dev_agree *prior, rs_dev_hdr want, rs_dev_agree *st, void *stream);

/* FP8 block quantization (src/pack/quant_block.h, quant_kernels.cu): every
 * block of boxes[0, nboxes) (device memory; bstart[i], device memory, the
 * first block of box i, bstart[nboxes] = nblocks), reading box i's input
 * from tab[in_buf] (device array of the call's buffers) or, for in_buf
 * < 0, from gather, writing its codes and scales at their offsets in
 * codes and scales; on `stream`. */
int rs_cuda_quantize(const rs_qbox *boxes, const uint64_t *bstart, uint32_t nboxes, uint64_t nblocks,
                     void *const *tab, const void *gather, void *codes, void *scales, void *stream);

/* RESHARD_FLAG_DOUBLE_BUFFER (kernels/rs_agree.h): the call's table of
 * buffers, this rank's vote (RS_COMMIT_WORDS words at v), and the commit
 * after the reduction of the votes. */
int rs_cuda_commit_select(void *const *tab, uint32_t nsrc, uint32_t ndst, const rs_dev_commit *c, void **cur,
                          void *stream);
int rs_cuda_commit_vote(const rs_dev_agree *st, uint64_t version, uint64_t call, uint64_t *v, void *stream);
int rs_cuda_commit_flip(const uint64_t *v, rs_dev_agree *st, uint64_t version, uint64_t call, rs_dev_commit *c,
                        void *stream);

/* RESHARD_FLAG_VERIFY (kernels/rs_verify.h): adds to sums[desc -
 * desc_base] the box sums of tiles[0, ntiles) on one side of their
 * descriptors (vboxes parallel to copies); compares n sums and records the
 * first difference in *st. */
int rs_cuda_verify_sums(const rs_tile *tiles, uint64_t ntiles, const rs_copy *copies, const rs_vbox *vboxes,
                        const rs_vtensor *vtensors, void *const *src_tab, void *const *dst_tab, int dst_side,
                        uint64_t *sums, uint32_t desc_base, void *stream);
int rs_cuda_verify_compare(const uint64_t *mine, const uint64_t *theirs, uint32_t n, uint32_t desc0, uint32_t kind,
                           rs_dev_agree *st, void *stream);

/* The CUDA IPC transport's protocol (kernels/rs_ipc.h, ipc_kernels.cu),
 * each on `stream`: post the sends of b; pull its receives (each waits
 * for its message, then blocks_per_op blocks copy it); acknowledge the
 * receives that arrived; wait for the sends' acknowledgements; the max,
 * word by word, of n vectors of k words (vector i at words[i * stride])
 * into out[0, k) (which counts as one of them). */
int rs_cuda_ipc_post(const rs_ipc_batch *b, rs_ipc_wait w, void *stream);
int rs_cuda_ipc_pull(const rs_ipc_batch *b, rs_ipc_wait w, unsigned blocks_per_op, void *stream);
int rs_cuda_ipc_ack(const rs_ipc_batch *b, void *stream);
int rs_cuda_ipc_acked(const rs_ipc_batch *b, rs_ipc_wait w, void *stream);
int rs_cuda_ipc_max(const uint64_t *words, uint32_t n, uint32_t stride, uint32_t k, uint64_t *out, void *stream);

#ifdef __cplusplus
}
#endif

#endif
