"""cffi builder of reshard's binding (API mode), run by CMake at build time.

    python _ffi_build.py OUT.c

writes the C source of the extension module ``reshard._reshard_cffi``,
which CMake compiles against the headers in include/ and links with
libreshard and libreshard_models (python/CMakeLists.txt). API mode means
the C compiler checks every declaration below against the real headers:
a struct field, an enum value or a signature that drifts from reshard.h
fails the build instead of corrupting memory at run time (the "..." in
the structs lets the compiler fill in the true layout).

Only declarations live here; the logic is the C library's. The few
rs_py_* shims take the transports' handle types (MPI_Comm, ncclComm_t)
as plain addresses so that the module compiles with or without MPI and
CUDA: a build without one returns RESHARD_ERROR_UNSUPPORTED from the shim.
"""
import sys

import cffi

CDEF = r"""
/* reshard.h */
int reshard_version(void);

typedef enum {
  RESHARD_SUCCESS = 0,
  RESHARD_ERROR_INVALID_ARGUMENT = 1,
  RESHARD_ERROR_INVALID_USAGE = 2,
  RESHARD_ERROR_OUT_OF_MEMORY = 3,
  RESHARD_ERROR_MISMATCH = 4,
  RESHARD_ERROR_BACKEND = 5,
  RESHARD_ERROR_REMOTE = 6,
  RESHARD_ERROR_TIMEOUT = 7,
  RESHARD_ERROR_UNSUPPORTED = 8,
  RESHARD_ERROR_INTERNAL = 9,
  RESHARD_ERROR_IN_DOUBT = 10,
  RESHARD_NUM_RESULTS = 11
} reshard_result_t;
const char *reshard_result_string(reshard_result_t result);
const char *reshard_last_error(void);

typedef enum {
  RESHARD_BF16 = 0, RESHARD_FP16 = 1, RESHARD_FP32 = 2, RESHARD_FP64 = 3,
  RESHARD_FP8_E4M3 = 4, RESHARD_FP8_E5M2 = 5, RESHARD_INT8 = 6,
  RESHARD_UINT8 = 7, RESHARD_INT32 = 8, RESHARD_UINT32 = 9,
  RESHARD_INT64 = 10, RESHARD_UINT64 = 11, RESHARD_BOOL = 12,
  RESHARD_NUM_DTYPES = 13
} reshard_dtype_t;
size_t reshard_dtype_size(reshard_dtype_t dtype);
const char *reshard_dtype_name(reshard_dtype_t dtype);

#define RESHARD_MAX_DIMS 8
#define RESHARD_MAX_MESH_DIMS 8

typedef struct reshard_layout reshard_layout_t;
reshard_result_t reshard_layout_create(reshard_layout_t **layout);
void reshard_layout_destroy(reshard_layout_t *layout);
reshard_result_t reshard_layout_add_tensor(reshard_layout_t *layout,
    const char *name, reshard_dtype_t dtype, int ndim, const int64_t *shape,
    int *tensor_id);
reshard_result_t reshard_layout_add_tensor_blocked(reshard_layout_t *layout,
    const char *name, reshard_dtype_t dtype, int ndim, const int64_t *shape,
    const int64_t *block, int *tensor_id);
reshard_result_t reshard_layout_tensor_block(const reshard_layout_t *layout,
    int tensor_id, int64_t *block, int *scale_id);
reshard_result_t reshard_layout_allow_partial(reshard_layout_t *layout,
    int tensor_id);
reshard_result_t reshard_layout_find_tensor(const reshard_layout_t *layout,
    const char *name, int *tensor_id);
int reshard_layout_num_tensors(const reshard_layout_t *layout);
reshard_result_t reshard_layout_tensor_info(const reshard_layout_t *layout,
    int tensor_id, const char **name, reshard_dtype_t *dtype, int *ndim,
    int64_t *shape);
reshard_result_t reshard_layout_add_mesh(reshard_layout_t *layout, int ndim,
    const int *shape, const int *ranks, int *mesh_id);
reshard_result_t reshard_layout_add_mesh_strided(reshard_layout_t *layout,
    int ndim, const int *shape, int start, int stride, int *mesh_id);

typedef enum {
  RESHARD_PLACEMENT_REPLICATE = 0,
  RESHARD_PLACEMENT_SHARD = 1
} reshard_placement_kind_t;
typedef struct {
  reshard_placement_kind_t kind;
  int dim;
  const int64_t *split_sizes;
  ...;
} reshard_placement_t;
reshard_result_t reshard_layout_place_named(reshard_layout_t *layout,
    const char *name, int tensor_id, int mesh_id,
    const reshard_placement_t *placements, int *buffer_id);

typedef struct {
  int tensor_id;
  int mesh_id;
  const reshard_placement_t *placements;
  const int64_t *padded_shape;
  ...;
} reshard_part_t;
reshard_result_t reshard_layout_add_fused(reshard_layout_t *layout,
    const char *name, int concat_dim, int num_groups, int num_parts,
    const reshard_part_t *parts, int *buffer_id);
reshard_result_t reshard_layout_add_windows(reshard_layout_t *layout,
    const char *name, int concat_dim, int num_parts,
    const reshard_part_t *parts, const int64_t *const *origins,
    int *buffer_id);

typedef struct {
  int q, k, v;
  int num_heads;
  int num_kv_heads;
  int64_t head_dim;
  ...;
} reshard_attention_t;
reshard_result_t reshard_layout_add_megatron_qkv(reshard_layout_t *layout,
    const char *name, const reshard_attention_t *attn, int mesh_id,
    int tp_axis, int *buffer_id);
reshard_result_t reshard_layout_add_vllm_qkv(reshard_layout_t *layout,
    const char *name, const reshard_attention_t *attn, int mesh_id,
    int tp_axis, int *buffer_id);
reshard_result_t reshard_layout_add_gate_up(reshard_layout_t *layout,
    const char *name, int gate, int up, int mesh_id, int tp_axis,
    int *buffer_id);

reshard_result_t reshard_layout_add_buffer(reshard_layout_t *layout,
    const char *name, int rank, size_t bytes, int *buffer_id);
typedef struct {
  int tensor_id;
  int buffer_id;
  const int64_t *start;
  const int64_t *extent;
  size_t byte_offset;
  const int64_t *strides;
  ...;
} reshard_fragment_t;
reshard_result_t reshard_layout_add_fragment(reshard_layout_t *layout,
    const reshard_fragment_t *frag);
int reshard_layout_num_buffers(const reshard_layout_t *layout);
reshard_result_t reshard_layout_buffer_name(const reshard_layout_t *layout,
    int buffer_id, const char **name);
reshard_result_t reshard_layout_find_buffer(const reshard_layout_t *layout,
    const char *name, int rank, int *buffer_id);
reshard_result_t reshard_layout_mesh_shape(const reshard_layout_t *layout,
    int mesh_id, int *ndim, int *shape);
reshard_result_t reshard_layout_buffer_bytes(const reshard_layout_t *layout,
    int buffer_id, int rank, size_t *bytes);
typedef struct {
  int tensor_id;
  int buffer_id;
  int ndim;
  int64_t start[8];
  int64_t extent[8];
  int64_t strides[8];
  size_t byte_offset;
  ...;
} reshard_fragment_info_t;
reshard_result_t reshard_layout_fragments(const reshard_layout_t *layout,
    int rank, reshard_fragment_info_t *out, size_t capacity, size_t *count);

typedef struct reshard_comm reshard_comm_t;
int reshard_comm_rank(const reshard_comm_t *comm);
int reshard_comm_size(const reshard_comm_t *comm);
void reshard_comm_destroy(reshard_comm_t *comm);

#define RESHARD_OPTIONS_VERSION 2
typedef struct {
  uint32_t struct_size;
  uint32_t version;
  size_t staging_bytes;
  size_t chunk_bytes;
  int64_t timeout_ms;
  const char *topology;
  int relay;
  uint32_t flags;
  ...;
} reshard_options_t;
#define RESHARD_FLAG_DOUBLE_BUFFER ...
#define RESHARD_FLAG_VERIFY ...
#define RESHARD_FLAG_FIRST_REPLICA ...
#define RESHARD_FLAG_SYNC ...
#define RESHARD_FLAG_NO_SPREAD ...
#define RESHARD_FLAG_SPREAD_ALWAYS ...

typedef struct reshard_plan reshard_plan_t;
reshard_result_t reshard_plan_create(reshard_comm_t *comm,
    const reshard_layout_t *src, const reshard_layout_t *dst,
    const reshard_options_t *options, reshard_plan_t **plan);
typedef struct {
  void *ptr;
  size_t bytes;
  ...;
} reshard_buffer_t;
reshard_result_t reshard_plan_execute_sized(const reshard_plan_t *plan,
    uint64_t version, const reshard_buffer_t *src, size_t num_src,
    const reshard_buffer_t *dst, size_t num_dst, void *stream);
reshard_result_t reshard_plan_execute_refused(const reshard_plan_t *plan,
                                              uint64_t version,
                                              reshard_result_t why,
                                              const char *reason);
typedef struct {
  uint32_t struct_size;
  int failed;
  reshard_result_t failure;
  uint64_t failed_call;
  uint64_t failed_version;
  const char *failure_message;
  uint64_t executes_completed;
  uint64_t committed_version;
  int active_copy;
  uint64_t in_doubt_version;
  int in_doubt_copy;
  ...;
} reshard_plan_status_t;
reshard_result_t reshard_plan_get_status(const reshard_plan_t *plan,
    reshard_plan_status_t *status);
reshard_result_t reshard_plan_resolve(const reshard_plan_t *plan, int timeout_ms);
reshard_result_t reshard_plan_rejoin(reshard_plan_t *plan);
reshard_result_t reshard_plan_register_buffers(reshard_plan_t *plan,
    void *const *src, size_t nsrc, void *const *dst, size_t ndst);
void reshard_plan_destroy(reshard_plan_t *plan);

#define RESHARD_ESTIMATE_VERSION 1
typedef enum {
  RESHARD_BOUND_NONE, RESHARD_NUM_BOUNDS, ...
} reshard_bound_t;
typedef struct {
  uint32_t struct_size;
  uint32_t version;
  double seconds;
  reshard_bound_t bound;
  int bound_where;
  double bound_seconds[11];
  double latency_seconds;
  int num_rounds;
  uint64_t bytes;
  ...;
} reshard_estimate_t;
reshard_result_t reshard_plan_estimate(const reshard_plan_t *plan,
    reshard_estimate_t *out);
reshard_result_t reshard_lower_bound(const reshard_layout_t *src,
    const reshard_layout_t *dst, int nranks, const char *topology,
    reshard_estimate_t *out);
const char *reshard_bound_name(reshard_bound_t bound);

typedef struct {
  int rank;
  int num_send_peers;
  int num_recv_peers;
  int num_chunks;
  size_t send_bytes;
  size_t recv_bytes;
  size_t send_messages;
  size_t recv_messages;
  size_t local_copy_bytes;
  size_t segments;
  size_t chunk_bytes;
  size_t staging_bytes;
  int phases;
  size_t wide_bytes;
  int pace_rounds;
  ...;
} reshard_plan_stats_t;
reshard_result_t reshard_plan_get_stats(const reshard_plan_t *plan,
    reshard_plan_stats_t *stats);
typedef struct {
  int peer;
  size_t send_bytes;
  size_t recv_bytes;
  size_t send_messages;
  size_t recv_messages;
  ...;
} reshard_peer_stats_t;
reshard_result_t reshard_plan_get_peer_stats(const reshard_plan_t *plan,
    reshard_peer_stats_t *out, size_t capacity, size_t *count);

/* reshard_inproc.h */
typedef struct reshard_inproc_world reshard_inproc_world_t;
reshard_result_t reshard_inproc_world_create(int nranks,
    reshard_inproc_world_t **world);
void reshard_inproc_world_destroy(reshard_inproc_world_t *world);
reshard_result_t reshard_comm_create_inproc(reshard_inproc_world_t *world,
    int rank, reshard_comm_t **comm);

/* reshard_selftest.h */
#define RESHARD_SELFTEST_SENTINEL 0xA5
typedef struct {
  int nbuf;
  unsigned char **ptr;
  size_t *bytes;
  ...;
} reshard_selftest_t;
reshard_result_t reshard_selftest_alloc(reshard_selftest_t *s,
    const reshard_layout_t *L, int rank, int64_t fill_step);
void reshard_selftest_fill(reshard_selftest_t *s, const reshard_layout_t *L,
    uint64_t step);
int64_t reshard_selftest_check(const reshard_selftest_t *s,
    const reshard_layout_t *L, int rank, uint64_t step, const char *label);
int64_t reshard_selftest_check_from(const reshard_selftest_t *s,
    const reshard_layout_t *L, const reshard_layout_t *src, int rank,
    uint64_t step, const char *label);
void reshard_selftest_free(reshard_selftest_t *s);
void reshard_selftest_expected(const char *name, uint64_t step,
    int64_t linear, size_t esize, unsigned char *out);
typedef enum reshard_selftest_values {
  RESHARD_SELFTEST_BITS = 0,
  RESHARD_SELFTEST_FINITE = 1
} reshard_selftest_values_t;
void reshard_selftest_set_values(reshard_selftest_values_t v);
reshard_selftest_values_t reshard_selftest_get_values(void);

/* reshard_models.h */
typedef struct rm_model rm_model;
typedef struct {
  int tp, pp, dp, ep;
  int etp;
  int64_t vocab;
  int first, last;
  int grouped_gemm;
  int sp_moe;
  int w31;
  int dp_shard, dp_replicate;
  int cp;
  int attn_dp, dp_lm_head, moe_dense_tp, shared_fusion;
  ...;
} rm_parallel;
reshard_result_t rm_parse_parallel(const char *spec, rm_parallel *out);
int rm_parallel_ranks(const rm_parallel *p);
typedef struct {
  int layers;
  reshard_dtype_t dtype;
  int per_expert;
  int block_scales;
  int64_t block[2];
  ...;
} rm_model_options;
reshard_result_t rm_model_load_ex(const char *config_path,
    const rm_model_options *opts, rm_model **out);
void rm_model_free(rm_model *m);
const char *rm_model_arch(const rm_model *m);
reshard_dtype_t rm_model_dtype(const rm_model *m);
int rm_model_num_experts(const rm_model *m);
int rm_model_layers(const rm_model *m);
int rm_model_num_tensors(const rm_model *m);
int64_t rm_model_num_params(const rm_model *m);
typedef struct {
  const char *name;
  int ndim;
  int64_t shape[8];
  reshard_dtype_t dtype;
  int scale;
  ...;
} rm_tensor;
const rm_tensor *rm_model_tensor(const rm_model *m, int i);
reshard_result_t rm_megatron_layout(const rm_model *m, const rm_parallel *p,
    int first_rank, reshard_layout_t **out);
reshard_result_t rm_vllm_layout(const rm_model *m, const rm_parallel *p,
    int first_rank, reshard_layout_t **out);
reshard_result_t rm_fsdp_layout(const rm_model *m, const rm_parallel *p,
    int first_rank, reshard_layout_t **out);
reshard_result_t rm_sglang_layout(const rm_model *m, const rm_parallel *p,
    int first_rank, reshard_layout_t **out);
reshard_result_t rm_parameter_name(const reshard_layout_t *layout,
    int buffer_id, int rank, const char **name);
typedef enum { RM_FRAMEWORK_MEGATRON = 0, RM_FRAMEWORK_VLLM = 1,
  RM_FRAMEWORK_SGLANG = 2 } rm_framework;
const char *rm_after_load(const rm_model *m, rm_framework framework,
    const reshard_layout_t *layout, int buffer_id);

/* The transports' shims (see SOURCE): which this build has, and their
 * constructors with handles as addresses. */
static const int RS_PY_HAVE_MPI;
static const int RS_PY_HAVE_CUDA;
static const int RS_PY_HAVE_UCX;
reshard_result_t rs_py_comm_create_ucx(const char *rendezvous, int rank,
    int size, int timeout_ms, reshard_comm_t **out);
reshard_result_t rs_py_comm_create_ucx_joining(const char *rendezvous,
    int rank, int size, int timeout_ms, reshard_comm_t **out);
reshard_result_t rs_py_comm_ucx_resize(reshard_comm_t *comm, const int *leaving,
                                       int nleave, int njoin, int timeout_ms);
reshard_result_t rs_py_comm_ucx_rejoin(reshard_comm_t *comm, const int *ranks,
    int n, int timeout_ms);
reshard_result_t rs_py_comm_create_mpi(const void *mpi_comm_addr,
    reshard_comm_t **out);
reshard_result_t rs_py_comm_create_nccl(uintptr_t nccl_comm,
    reshard_comm_t **out);
reshard_result_t rs_py_comm_create_nccl_with_mpi(uintptr_t nccl_comm,
    const void *mpi_comm_addr, reshard_comm_t **out);
reshard_result_t rs_py_comm_create_cuda_ipc(reshard_comm_t *host,
    reshard_comm_t **out);
reshard_result_t rs_py_comm_create_ucx_cuda(reshard_comm_t *ucx,
    reshard_comm_t **out);
/* The C initializers (RESHARD_OPTIONS_INITIALIZER, ...), so that Python
 * never restates a default. */
void rs_py_options_init(reshard_options_t *o);
void rs_py_estimate_init(reshard_estimate_t *e);
void rs_py_status_init(reshard_plan_status_t *s);
/* reshard_plan_dump into memory (open_memstream); free *out with free. */
reshard_result_t rs_py_plan_dump(const reshard_plan_t *plan, long max_segments,
    char **out, size_t *len);
void free(void *p);
"""

# The shims: a build without a transport keeps its constructor (the
# Python side raises UnsupportedError before calling it; the return value
# is the backstop). An MPI_Comm arrives as the address of a handle
# (mpi4py's MPI._addressof), whatever the MPI library's handle type is.
SOURCE = r"""
#define _POSIX_C_SOURCE 200809L /* open_memstream */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "reshard.h"
#include "reshard_inproc.h"
#include "reshard_models.h"
#include "reshard_selftest.h"
#ifdef RESHARD_HAVE_MPI
#include "reshard_mpi.h"
#endif
#ifdef RESHARD_HAVE_UCX
#include "reshard_ucx.h"
#endif
#ifdef RESHARD_HAVE_CUDA
#include "reshard_cuda_ipc.h"
#include "reshard_nccl.h"
#endif

#ifdef RESHARD_HAVE_MPI
static const int RS_PY_HAVE_MPI = 1;
#else
static const int RS_PY_HAVE_MPI = 0;
#endif
#ifdef RESHARD_HAVE_CUDA
static const int RS_PY_HAVE_CUDA = 1;
#else
static const int RS_PY_HAVE_CUDA = 0;
#endif
#ifdef RESHARD_HAVE_UCX
static const int RS_PY_HAVE_UCX = 1;
#else
static const int RS_PY_HAVE_UCX = 0;
#endif

static reshard_result_t rs_py_comm_create_ucx(const char *rendezvous,
                                              int rank, int size,
                                              int timeout_ms,
                                              reshard_comm_t **out) {
#ifdef RESHARD_HAVE_UCX
  return reshard_comm_create_ucx(rendezvous, rank, size, timeout_ms, out);
#else
  (void)rendezvous; (void)rank; (void)size; (void)timeout_ms; (void)out;
  return RESHARD_ERROR_UNSUPPORTED;
#endif
}

static reshard_result_t rs_py_comm_create_ucx_joining(const char *rendezvous,
                                                      int rank, int size,
                                                      int timeout_ms,
                                                      reshard_comm_t **out) {
#ifdef RESHARD_HAVE_UCX
  return reshard_comm_create_ucx_joining(rendezvous, rank, size, timeout_ms,
                                         out);
#else
  (void)rendezvous; (void)rank; (void)size; (void)timeout_ms; (void)out;
  return RESHARD_ERROR_UNSUPPORTED;
#endif
}

static reshard_result_t rs_py_comm_ucx_resize(reshard_comm_t *comm, const int *leaving,
                                              int nleave, int njoin, int timeout_ms) {
#ifdef RESHARD_HAVE_UCX
  return reshard_comm_ucx_resize(comm, leaving, nleave, njoin, timeout_ms);
#else
  (void)comm; (void)leaving; (void)nleave; (void)njoin; (void)timeout_ms;
  return RESHARD_ERROR_UNSUPPORTED;
#endif
}

static reshard_result_t rs_py_comm_ucx_rejoin(reshard_comm_t *comm, const int *ranks,
                                              int n, int timeout_ms) {
#ifdef RESHARD_HAVE_UCX
  return reshard_comm_ucx_rejoin_ranks(comm, ranks, n, timeout_ms);
#else
  (void)comm; (void)ranks; (void)n; (void)timeout_ms;
  return RESHARD_ERROR_UNSUPPORTED;
#endif
}

static reshard_result_t rs_py_comm_create_mpi(const void *mpi_comm_addr,
                                              reshard_comm_t **out) {
#ifdef RESHARD_HAVE_MPI
  return reshard_comm_create_mpi(*(const MPI_Comm *)mpi_comm_addr, out);
#else
  (void)mpi_comm_addr; (void)out;
  return RESHARD_ERROR_UNSUPPORTED;
#endif
}

static reshard_result_t rs_py_comm_create_nccl(uintptr_t nccl_comm,
                                               reshard_comm_t **out) {
#ifdef RESHARD_HAVE_CUDA
  return reshard_comm_create_nccl((ncclComm_t)nccl_comm, out);
#else
  (void)nccl_comm; (void)out;
  return RESHARD_ERROR_UNSUPPORTED;
#endif
}

static reshard_result_t rs_py_comm_create_nccl_with_mpi(
    uintptr_t nccl_comm, const void *mpi_comm_addr, reshard_comm_t **out) {
#if defined(RESHARD_HAVE_CUDA) && defined(RESHARD_HAVE_MPI)
  return reshard_comm_create_nccl_with_mpi((ncclComm_t)nccl_comm,
                                           *(const MPI_Comm *)mpi_comm_addr,
                                           out);
#else
  (void)nccl_comm; (void)mpi_comm_addr; (void)out;
  return RESHARD_ERROR_UNSUPPORTED;
#endif
}

static void rs_py_options_init(reshard_options_t *o) {
  reshard_options_t d = RESHARD_OPTIONS_INITIALIZER;
  *o = d;
}

static void rs_py_estimate_init(reshard_estimate_t *e) {
  reshard_estimate_t d = RESHARD_ESTIMATE_INITIALIZER;
  *e = d;
}

static void rs_py_status_init(reshard_plan_status_t *s) {
  memset(s, 0, sizeof *s);
  s->struct_size = sizeof *s;
}

static reshard_result_t rs_py_plan_dump(const reshard_plan_t *plan,
                                        long max_segments, char **out,
                                        size_t *len) {
  *out = NULL;
  *len = 0;
  FILE *f = open_memstream(out, len);
  if (!f) return RESHARD_ERROR_OUT_OF_MEMORY;
  reshard_result_t r = reshard_plan_dump(plan, f, max_segments);
  if (fclose(f) != 0 && r == RESHARD_SUCCESS) r = RESHARD_ERROR_OUT_OF_MEMORY;
  return r;
}

static reshard_result_t rs_py_comm_create_ucx_cuda(reshard_comm_t *ucx,
                                                   reshard_comm_t **out) {
#ifdef RESHARD_HAVE_UCX
  return reshard_comm_create_ucx_cuda(ucx, out);
#else
  (void)ucx; (void)out;
  return RESHARD_ERROR_UNSUPPORTED;
#endif
}

static reshard_result_t rs_py_comm_create_cuda_ipc(reshard_comm_t *host,
                                                   reshard_comm_t **out) {
#ifdef RESHARD_HAVE_CUDA
  return reshard_comm_create_cuda_ipc(host, out);
#else
  (void)host; (void)out;
  return RESHARD_ERROR_UNSUPPORTED;
#endif
}
"""


def builder():
    ffi = cffi.FFI()
    ffi.cdef(CDEF)
    ffi.set_source("reshard._reshard_cffi", SOURCE)
    return ffi


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: _ffi_build.py OUT.c")
    builder().emit_c_code(sys.argv[1])
