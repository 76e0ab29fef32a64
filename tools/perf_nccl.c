/* reshard_perf's NCCL backend: the only file of the tools that sees CUDA.
 * Built only with RESHARD_WITH_CUDA and RESHARD_WITH_MPI (see
 * tools/CMakeLists.txt). */
#include "perf_nccl.h"

#include <cuda_runtime.h>
#include <mpi.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "reshard_cuda_ipc.h"
#include "reshard_mpi.h"
#include "reshard_nccl.h"
#ifdef RESHARD_HAVE_UCX
#include "reshard_ucx.h"
#endif

struct perf_nccl {
  int device;
  int ipc;
  reshard_comm_t *host; /* --backend ipc: the MPI communicator under it; ucx-cuda: the UCX one */
  cudaStream_t stream;
  int nsrc, ndst;
  void **src, **dst; /* device buffers, NULL where the rank holds none */
  size_t *src_bytes, *dst_bytes;
  /* RESHARD_PERF_GRAPH=1: after the first execute of a plan, its execute
   * captured into a CUDA graph that later calls launch */
  int graph;
  const reshard_plan_t *graph_plan;
  cudaGraphExec_t graph_exec;
  int executed;
};

static int cuda_fail(char *err, size_t errlen, const char *what, cudaError_t e) {
  return cli_fail(err, errlen, "%s: %s (%s)", what, cudaGetErrorName(e), cudaGetErrorString(e));
}

/* The launcher's word first; otherwise the rank among the ranks sharing
 * this node's memory. *local_size: how many ranks share the node. */
static int local_rank(int *local_size) {
  MPI_Comm node;
  int r = 0;
  MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node);
  MPI_Comm_rank(node, &r);
  MPI_Comm_size(node, local_size);
  MPI_Comm_free(&node);
  const char *env = getenv("OMPI_COMM_WORLD_LOCAL_RANK");
  if (env && *env) {
    char *end;
    long v = strtol(env, &end, 10);
    if (!*end && v >= 0 && v < 1 << 30) r = (int)v;
  }
  return r;
}

int perf_nccl_open(perf_nccl **out, int ipc, char *desc, size_t desclen, char *err, size_t errlen) {
  *out = NULL;
  int ln = 1;
  int lr = local_rank(&ln); /* collective: before anything can fail */
  int n = 0;
  cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) return cuda_fail(err, errlen, "no usable CUDA device: cudaGetDeviceCount", e);
  if (n <= 0) return cli_fail(err, errlen, "no usable CUDA device: cudaGetDeviceCount found none");
  /* Local rank modulo the devices would put two ranks on one GPU, which
   * NCCL refuses (ncclCommInitRank fails, or hangs its peers). */
  if (ln > n && !ipc)
    return cli_fail(err, errlen, "%d ranks on this node but %d CUDA device%s: --backend nccl needs one GPU per rank "
                    "(start at most %d ranks per node)", ln, n, n == 1 ? "" : "s", n);
  perf_nccl *p = calloc(1, sizeof *p);
  if (!p) return cli_fail(err, errlen, "out of memory");
  p->device = lr % n;
  p->ipc = ipc;
  const char *graph = getenv("RESHARD_PERF_GRAPH");
  p->graph = graph && !strcmp(graph, "1");
  e = cudaSetDevice(p->device);
  if (e == cudaSuccess) e = cudaStreamCreateWithFlags(&p->stream, cudaStreamNonBlocking);
  if (e != cudaSuccess) {
    char what[96];
    snprintf(what, sizeof what, "device %d: cudaSetDevice/cudaStreamCreate", p->device);
    free(p);
    return cuda_fail(err, errlen, what, e);
  }
  struct cudaDeviceProp prop;
  if (cudaGetDeviceProperties(&prop, p->device) != cudaSuccess) snprintf(prop.name, sizeof prop.name, "?");
  snprintf(desc, desclen, "device %d (%s) of %d", p->device, prop.name, n);
  *out = p;
  return 0;
}

int perf_nccl_graphs(const perf_nccl *p) { return p && p->graph; }

int perf_nccl_comm(perf_nccl *p, reshard_comm_t *ucx, reshard_comm_t **comm, char *err, size_t errlen) {
  if (ucx) {
    p->host = ucx;
#ifdef RESHARD_HAVE_UCX
    reshard_result_t r = reshard_comm_create_ucx_cuda(ucx, comm);
    if (r)
      return cli_fail(err, errlen, "reshard_comm_create_ucx_cuda: %s: %s", reshard_result_string(r), reshard_last_error());
    return 0;
#else
    return cli_fail(err, errlen, "this build has no UCX transport");
#endif
  }
  if (p->ipc) {
    reshard_result_t r = reshard_comm_create_mpi(MPI_COMM_WORLD, &p->host);
    if (r) return cli_fail(err, errlen, "reshard_comm_create_mpi: %s: %s", reshard_result_string(r), reshard_last_error());
    r = reshard_comm_create_cuda_ipc(p->host, comm);
    if (r)
      return cli_fail(err, errlen, "reshard_comm_create_cuda_ipc: %s: %s", reshard_result_string(r), reshard_last_error());
    return 0;
  }
  reshard_result_t r = reshard_comm_create_nccl_mpi(MPI_COMM_WORLD, comm);
  if (r)
    return cli_fail(err, errlen, "reshard_comm_create_nccl_mpi: %s: %s", reshard_result_string(r), reshard_last_error());
  return 0;
}

static int alloc_side(const reshard_selftest_t *s, void ***ptr, size_t **bytes, int *nbuf, char *err, size_t errlen) {
  *nbuf = s->nbuf;
  *ptr = calloc((size_t)s->nbuf + 1, sizeof **ptr);
  *bytes = calloc((size_t)s->nbuf + 1, sizeof **bytes);
  if (!*ptr || !*bytes) return cli_fail(err, errlen, "out of memory");
  for (int b = 0; b < s->nbuf; b++) {
    if (!s->ptr[b]) continue;
    /* cudaMalloc of 0 bytes gives NULL, which would read as "not held" */
    cudaError_t e = cudaMalloc(&(*ptr)[b], s->bytes[b] ? s->bytes[b] : 1);
    if (e != cudaSuccess) {
      char what[96];
      snprintf(what, sizeof what, "cudaMalloc of %zu bytes", s->bytes[b]);
      return cuda_fail(err, errlen, what, e);
    }
    (*bytes)[b] = s->bytes[b];
  }
  return 0;
}

int perf_nccl_alloc(perf_nccl *p, const reshard_selftest_t *src, const reshard_selftest_t *dst, char *err, size_t errlen) {
  if (alloc_side(src, &p->src, &p->src_bytes, &p->nsrc, err, errlen)) return -1;
  return alloc_side(dst, &p->dst, &p->dst_bytes, &p->ndst, err, errlen);
}

static int copy_side(void **dev, unsigned char **host, const size_t *bytes, int n, int to_device, char *err,
                     size_t errlen) {
  for (int b = 0; b < n; b++) {
    if (!dev[b] || !bytes[b]) continue;
    cudaError_t e = to_device ? cudaMemcpy(dev[b], host[b], bytes[b], cudaMemcpyHostToDevice)
                              : cudaMemcpy(host[b], dev[b], bytes[b], cudaMemcpyDeviceToHost);
    if (e != cudaSuccess) return cuda_fail(err, errlen, to_device ? "cudaMemcpy (to the device)" : "cudaMemcpy (to the host)", e);
  }
  return 0;
}

int perf_nccl_upload(perf_nccl *p, const reshard_selftest_t *src, const reshard_selftest_t *dst, char *err, size_t errlen) {
  if (copy_side(p->src, src->ptr, p->src_bytes, p->nsrc, 1, err, errlen)) return -1;
  return copy_side(p->dst, dst->ptr, p->dst_bytes, p->ndst, 1, err, errlen);
}

int perf_nccl_register(perf_nccl *p, reshard_plan_t *plan, char *err, size_t errlen) {
  reshard_result_t r = reshard_plan_register_buffers(plan, p->src, (size_t)p->nsrc, p->dst, (size_t)p->ndst);
  if (r)
    return cli_fail(err, errlen, "reshard_plan_register_buffers: %s: %s", reshard_result_string(r),
                    reshard_last_error());
  return 0;
}

int perf_nccl_download(perf_nccl *p, reshard_selftest_t *dst, char *err, size_t errlen) {
  return copy_side(p->dst, dst->ptr, p->dst_bytes, p->ndst, 0, err, errlen);
}

void perf_nccl_drop_graph(perf_nccl *p) {
  if (p && p->graph_exec) cudaGraphExecDestroy(p->graph_exec);
  if (p) p->graph_exec = NULL, p->graph_plan = NULL;
}

/* The plan's execute captured into p->graph_exec (its first execute ran
 * already: a capture needs the buffer table in place). */
static int capture(perf_nccl *p, reshard_plan_t *plan, char *err, size_t errlen) {
  perf_nccl_drop_graph(p);
  cudaGraph_t g = NULL;
  cudaError_t e = cudaStreamBeginCapture(p->stream, cudaStreamCaptureModeGlobal);
  if (e != cudaSuccess) return cuda_fail(err, errlen, "cudaStreamBeginCapture", e);
  reshard_result_t r =
      reshard_plan_execute(plan, p->src, (size_t)p->nsrc, p->dst, (size_t)p->ndst, (void *)p->stream);
  char why[512];
  snprintf(why, sizeof why, "%s", reshard_last_error());
  e = cudaStreamEndCapture(p->stream, &g);
  if (r) {
    if (g) cudaGraphDestroy(g);
    return cli_fail(err, errlen, "captured reshard_plan_execute: %s: %s", reshard_result_string(r), why);
  }
  if (e != cudaSuccess) return cuda_fail(err, errlen, "cudaStreamEndCapture", e);
  e = cudaGraphInstantiate(&p->graph_exec, g, 0);
  cudaGraphDestroy(g);
  if (e != cudaSuccess) return cuda_fail(err, errlen, "cudaGraphInstantiate", e);
  p->graph_plan = plan;
  return 0;
}

int perf_nccl_execute(perf_nccl *p, reshard_plan_t *plan, char *err, size_t errlen) {
  if (p->graph && p->executed && p->graph_plan != plan && capture(p, plan, err, errlen)) return -1;
  if (p->graph && p->graph_plan == plan) {
    cudaError_t e = cudaGraphLaunch(p->graph_exec, p->stream);
    if (e != cudaSuccess) return cuda_fail(err, errlen, "cudaGraphLaunch", e);
  } else {
    reshard_result_t r =
        reshard_plan_execute(plan, p->src, (size_t)p->nsrc, p->dst, (size_t)p->ndst, (void *)p->stream);
    if (r)
      return cli_fail(err, errlen, "reshard_plan_execute: %s: %s", reshard_result_string(r), reshard_last_error());
    p->executed = 1;
  }
  cudaError_t e = cudaStreamSynchronize(p->stream);
  if (e != cudaSuccess) return cuda_fail(err, errlen, "cudaStreamSynchronize", e);
  return 0;
}

void perf_nccl_close(perf_nccl *p) {
  if (!p) return;
  perf_nccl_drop_graph(p);
  for (int b = 0; p->src && b < p->nsrc; b++) cudaFree(p->src[b]);
  for (int b = 0; p->dst && b < p->ndst; b++) cudaFree(p->dst[b]);
  free(p->src);
  free(p->dst);
  free(p->src_bytes);
  free(p->dst_bytes);
  if (p->stream) cudaStreamDestroy(p->stream);
  reshard_comm_destroy(p->host);
  free(p);
}
