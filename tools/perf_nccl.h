/* reshard_perf's device backends, NCCL and CUDA IPC (tools/perf_nccl.c):
 * a GPU per MPI rank,
 * device copies of the host buffers, execution on a CUDA stream. No CUDA
 * type appears here, so reshard_perf.c compiles without CUDA; the
 * functions exist only when RESHARD_PERF_HAVE_NCCL is defined (a build
 * with RESHARD_WITH_CUDA and RESHARD_WITH_MPI). Every function returns 0,
 * or -1 with a message in err naming the CUDA/NCCL/reshard error. */
#ifndef RESHARD_TOOLS_PERF_NCCL_H
#define RESHARD_TOOLS_PERF_NCCL_H

#include <stddef.h>

#include "reshard.h"
#include "reshard_selftest.h"

typedef struct perf_nccl perf_nccl;

/* Picks this rank's device (local rank modulo the device count) and makes
 * a stream on it. Collective over MPI_COMM_WORLD (the local rank may come
 * from MPI_Comm_split_type). desc receives "device D (NAME) of N". ipc:
 * the CUDA IPC transport (several ranks per device allowed; NCCL refuses
 * them). */
int perf_nccl_open(perf_nccl **out, int ipc, char *desc, size_t desclen, char *err, size_t errlen);
/* reshard_comm_create_nccl_mpi(MPI_COMM_WORLD, ...) on that device, or
 * reshard_comm_create_cuda_ipc over reshard_comm_create_mpi(MPI_COMM_WORLD),
 * or (ucx not NULL: a UCX communicator of the same ranks, which p takes
 * over) reshard_comm_create_ucx_cuda over ucx; the host communicator is
 * destroyed by perf_nccl_close. Collective. */
int perf_nccl_comm(perf_nccl *p, reshard_comm_t *ucx, reshard_comm_t **comm, char *err, size_t errlen);
/* cudaMalloc of every buffer the two host sides hold (the same sizes). */
int perf_nccl_alloc(perf_nccl *p, const reshard_selftest_t *src, const reshard_selftest_t *dst, char *err, size_t errlen);
/* Host -> device copies of both sides' buffers. */
int perf_nccl_upload(perf_nccl *p, const reshard_selftest_t *src, const reshard_selftest_t *dst, char *err, size_t errlen);
/* reshard_plan_register_buffers with the device buffers (collective). */
int perf_nccl_register(perf_nccl *p, reshard_plan_t *plan, char *err, size_t errlen);
/* Device -> host copy of the destination buffers. */
int perf_nccl_download(perf_nccl *p, reshard_selftest_t *dst, char *err, size_t errlen);
/* reshard_plan_execute on the device buffers and the stream, then
 * cudaStreamSynchronize (so that a timed call covers the whole reshard).
 * With RESHARD_PERF_GRAPH=1 in the environment (perf_nccl_graphs), the
 * first call executes, the next captures the execute into a CUDA graph
 * (again whenever the plan changes), and every call from then on
 * launches that graph instead. */
int perf_nccl_execute(perf_nccl *p, reshard_plan_t *plan, char *err, size_t errlen);
/* Whether calls launch CUDA graphs (RESHARD_PERF_GRAPH=1). */
int perf_nccl_graphs(const perf_nccl *p);
/* Destroys the graph of perf_nccl_execute (before its plan goes). */
void perf_nccl_drop_graph(perf_nccl *p);
/* Frees the device buffers and the stream (the communicator is the
 * caller's to destroy, before this). NULL is fine. */
void perf_nccl_close(perf_nccl *p);

#endif
