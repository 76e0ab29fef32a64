/* Option parsing and layout construction shared by reshard_perf and
 * reshard_plan.
 *
 * Two ways to describe a reshard:
 *   model mode      --model-config FILE [--layers N] --train SPEC --infer SPEC
 *                   [--per-expert] [--block-scales]
 *                   (Megatron layout on the source side, vLLM layout on the
 *                   destination side, from src/models);
 *   synthetic mode  --shape 4096,4096 --src-mesh 4 --src-placements S0
 *                   --dst-mesh 2,2 --dst-placements R,S1
 *                   (one tensor, one mesh per side, ranks row-major with the
 *                   last axis fastest, one placement per mesh axis).
 * Source ranks come first, then destination ranks; --colocate puts both
 * sides on ranks 0.. instead. */
#ifndef RESHARD_TOOLS_CLI_H
#define RESHARD_TOOLS_CLI_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "reshard.h"

enum { CLI_TOOL_PERF = 1, CLI_TOOL_PLAN = 2 };
enum { CLI_MODE_NONE = 0, CLI_MODE_SYNTHETIC = 1, CLI_MODE_MODEL = 2 };
enum { CLI_BACKEND_MPI = 0, CLI_BACKEND_NCCL = 1, CLI_BACKEND_IPC = 2, CLI_BACKEND_UCX_CUDA = 3 };

/* One side of a synthetic reshard: a mesh and its placements. */
typedef struct cli_mesh {
  int ndim;
  int shape[RESHARD_MAX_MESH_DIMS];
  int nplacements;
  reshard_placement_t placements[RESHARD_MAX_MESH_DIMS];
} cli_mesh;

typedef struct cli_opts {
  int tool;
  int mode;
  int help;
  /* model mode */
  const char *model_config;
  int layers; /* 0: all */
  const char *train, *infer;
  int per_expert;   /* --per-expert: one tensor per routed expert */
  int block_scales; /* --block-scales: fp8 weights + weight_scale_inv */
  /* --infer-dtype fp8e4m3: the inference side's linear weights fp8 with
   * block scales, quantized on the way from the trainer's --dtype */
  int infer_fp8;
  /* --block R,C: the fp8 block (model mode: instead of the config's
   * quantization_config.weight_block_size; synthetic mode: with
   * --dst-dtype fp8e4m3, a block-quantized destination); 0: none */
  int64_t block[2];
  /* synthetic mode */
  int ndim;
  int64_t shape[RESHARD_MAX_DIMS];
  cli_mesh src, dst;
  /* both */
  reshard_dtype_t dtype; /* default bf16 (model) or f32 (synthetic) */
  /* synthetic mode: --dst-dtype, the destination's dtype (default: dtype;
   * a float dtype converts in flight) */
  reshard_dtype_t dst_dtype;
  int colocate;
  size_t staging; /* 0: the library's default */
  const char *topology; /* --topology PRESET, or NULL */
  int relay;            /* --relay -1|0|1 (default -1: auto) */
  /* reshard_perf */
  int iters, warmup, check;
  int baseline_broadcast, baseline_alltoallw;
  int inject_error; /* testing: corrupt one destination byte after a run */
  int verify;       /* also time the plan with RESHARD_FLAG_VERIFY */
  int ucx;          /* also time the plan over a UCX communicator */
  int values;       /* --values: -1 auto, else a reshard_selftest_values_t */
  int backend;      /* CLI_BACKEND_*: MPI over host buffers, NCCL, CUDA IPC or UCX (CUDA) */
  /* reshard_plan */
  int world; /* 0: derived */
  int rank;  /* -1: every rank */
  int strict; /* --check */
  int no_check; /* --no-check: plan and price only */
  int show_layout; /* --show-layout: 0 no, 1 src, 2 dst */
  int threads;     /* --threads N: planning threads (0: the CPUs online) */
  int time_all;    /* --time-all: time every rank, not a sample */
  int digest;      /* --digest: print a hash of each rank's plan */
  int profile;     /* --profile: where the time went */
  const char *json; /* --json FILE: the planned world, machine-readable (tools/plan_json.h) */
  const char *replay_out; /* --replay-out FILE: every rank's schedule for reshard_replay (tools/plan_replay.h) */
} cli_opts;

/* Parses argv for the given tool. Returns 0, or -1 with a message in err
 * (which names the offending option and value). */
int cli_parse(int tool, int argc, char **argv, cli_opts *o, char *err,
              size_t errlen);
void cli_usage(int tool, FILE *out);

/* Formats an error into err (errlen bytes) and returns -1, so that error
 * paths of the tools read `return cli_fail(err, errlen, "...", ...)`. */
int cli_fail(char *err, size_t errlen, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* Parses "4096,4096" (count 1..max, each >= min_value). */
int cli_parse_i64_list(const char *s, int64_t min_value, int max, int64_t *out,
                       int *count);
/* "bf16", "f32", ... (the names of reshard_dtype_name). */
int cli_parse_dtype(const char *s, reshard_dtype_t *out);
/* "R,S1" for a mesh of ndim axes. */
int cli_parse_placements(const char *s, reshard_placement_t *out, int *count);
/* "256M", "4096", "1G": bytes with an optional binary K/M/G suffix. */
int cli_parse_bytes(const char *s, size_t *out);

/* Both sides' layouts and where their ranks lie. */
typedef struct cli_layouts {
  reshard_layout_t *src, *dst;
  int nsrc, ndst;     /* ranks of each side */
  int first_dst;      /* the destination side's first rank */
  int world_needed;   /* nsrc + ndst, or max(nsrc, ndst) when colocated */
  char desc[512];     /* one line saying what is moved */
} cli_layouts;

/* Builds the layouts the options describe. Returns 0, or -1 with a
 * message in err (including the library's reshard_last_error()). */
int cli_build_layouts(const cli_opts *o, cli_layouts *out, char *err,
                      size_t errlen);
void cli_layouts_free(cli_layouts *l);

/* "src", "dst", "both" or "none". */
const char *cli_role(const cli_layouts *l, int rank);

/* --show-layout: one line per fragment that `rank` (every rank of the
 * side when < 0) holds on the side (1 source, 2 destination):
 *   rank=R name=N tensor=T dtype=D box=lo0:hi0,lo1:hi1,... offset=B
 * (N: the buffer's name, the framework's parameter name in model mode;
 * boxes half-open, in tensor coordinates; B: byte offset in the buffer),
 * after '#' lines that say what is shown. Returns 0, or -1 with a message
 * in err. */
int cli_show_layout(const cli_layouts *l, int side, int rank, FILE *out, char *err, size_t errlen);
/* One such line (no newline) for fragment f of L held by rank, into buf;
 * -1 when it does not fit or the ids are not L's. */
int cli_format_fragment(const reshard_layout_t *L, int rank, const reshard_fragment_info_t *f, char *buf,
                        size_t len);

/* Whether this build has the model front-end (src/models). */
int cli_have_models(void);

#endif
