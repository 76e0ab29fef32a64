/* Shared options and layouts of reshard_perf and reshard_plan. */
#include "cli.h"

#include <ctype.h>
#include <errno.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "reshard_internal.h"
#include "reshard_selftest.h"

#ifdef RESHARD_TOOLS_HAVE_MODELS
#include "reshard_models.h"
#endif

int cli_have_models(void) {
#ifdef RESHARD_TOOLS_HAVE_MODELS
  return 1;
#else
  return 0;
#endif
}

int cli_fail(char *err, size_t errlen, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(err, errlen, fmt, ap);
  va_end(ap);
  return -1;
}

static int parse_i64(const char *s, int64_t *out) {
  if (!s || !*s || isspace((unsigned char)*s)) return -1;
  char *end = NULL;
  errno = 0;
  long long v = strtoll(s, &end, 10);
  if (errno || !end || *end) return -1;
  *out = v;
  return 0;
}

static int parse_int(const char *s, int min_value, int *out) {
  int64_t v;
  if (parse_i64(s, &v) || v < min_value || v > 0x7fffffff) return -1;
  *out = (int)v;
  return 0;
}

int cli_parse_i64_list(const char *s, int64_t min_value, int max, int64_t *out, int *count) {
  int n = 0;
  if (!s || !*s) return -1;
  const char *p = s;
  for (;;) {
    char item[32];
    const char *comma = strchr(p, ',');
    size_t len = comma ? (size_t)(comma - p) : strlen(p);
    if (len == 0 || len >= sizeof item || n >= max) return -1;
    memcpy(item, p, len);
    item[len] = 0;
    if (parse_i64(item, &out[n]) || out[n] < min_value) return -1;
    n++;
    if (!comma) break;
    p = comma + 1;
  }
  *count = n;
  return 0;
}

int cli_parse_dtype(const char *s, reshard_dtype_t *out) {
  for (int d = 0; d < RESHARD_NUM_DTYPES; d++)
    if (!strcmp(s, reshard_dtype_name((reshard_dtype_t)d))) {
      *out = (reshard_dtype_t)d;
      return 0;
    }
  return -1;
}

int cli_parse_placements(const char *s, reshard_placement_t *out, int *count) {
  int n = 0;
  if (!s || !*s) return -1;
  const char *p = s;
  for (;;) {
    const char *comma = strchr(p, ',');
    size_t len = comma ? (size_t)(comma - p) : strlen(p);
    if (n >= RESHARD_MAX_MESH_DIMS) return -1;
    if (len == 1 && (p[0] == 'R' || p[0] == 'r')) {
      out[n++] = reshard_replicate();
    } else if (len >= 2 && len < 4 && (p[0] == 'S' || p[0] == 's') && isdigit((unsigned char)p[1]) &&
               (len == 2 || isdigit((unsigned char)p[2]))) {
      int d = p[1] - '0';
      if (len == 3) d = d * 10 + (p[2] - '0');
      out[n++] = reshard_shard(d);
    } else {
      return -1;
    }
    if (!comma) break;
    p = comma + 1;
  }
  *count = n;
  return 0;
}

int cli_parse_bytes(const char *s, size_t *out) {
  if (!s || !*s || !isdigit((unsigned char)*s)) return -1;
  char *end = NULL;
  errno = 0;
  unsigned long long v = strtoull(s, &end, 10);
  if (errno || !end) return -1;
  unsigned shift = 0;
  if (*end == 'K' || *end == 'k') shift = 10, end++;
  else if (*end == 'M' || *end == 'm') shift = 20, end++;
  else if (*end == 'G' || *end == 'g') shift = 30, end++;
  if (*end == 'i' && shift) end++; /* KiB-style "Mi" */
  if (*end == 'B' && shift) end++;
  if (*end) return -1;
  if (shift && v > (~0ULL >> shift)) return -1;
  *out = (size_t)(v << shift);
  return 0;
}

static int parse_mesh(const char *opt, const char *v, cli_mesh *m, char *err, size_t errlen) {
  int64_t vals[RESHARD_MAX_MESH_DIMS];
  int n = 0;
  if (cli_parse_i64_list(v, 1, RESHARD_MAX_MESH_DIMS, vals, &n))
    return cli_fail(err, errlen, "%s '%s': expected 1 to %d mesh sizes >= 1 separated by commas (e.g. 2,2)", opt, v,
                RESHARD_MAX_MESH_DIMS);
  int64_t total = 1;
  for (int i = 0; i < n; i++) {
    total *= vals[i];
    if (vals[i] > 1 << 20 || total > 1 << 24) return cli_fail(err, errlen, "%s '%s': mesh too large", opt, v);
    m->shape[i] = (int)vals[i];
  }
  m->ndim = n;
  return 0;
}

static int parse_baselines(const char *v, cli_opts *o, char *err, size_t errlen) {
  const char *p = v;
  if (!*p) return cli_fail(err, errlen, "--baseline '': expected broadcast, alltoallw or both, comma-separated");
  for (;;) {
    const char *comma = strchr(p, ',');
    size_t len = comma ? (size_t)(comma - p) : strlen(p);
    if (len == 9 && !strncmp(p, "broadcast", 9)) o->baseline_broadcast = 1;
    else if (len == 9 && !strncmp(p, "alltoallw", 9)) o->baseline_alltoallw = 1;
    else if (len == 4 && !strncmp(p, "none", 4)) o->baseline_broadcast = o->baseline_alltoallw = 0;
    else return cli_fail(err, errlen, "--baseline '%s': unknown baseline '%.*s' (known: broadcast, alltoallw)", v, (int)len, p);
    if (!comma) break;
    p = comma + 1;
  }
  return 0;
}

static const char *dtype_list(void) {
  static char buf[160];
  if (!buf[0])
    for (int d = 0; d < RESHARD_NUM_DTYPES; d++) {
      size_t n = strlen(buf);
      snprintf(buf + n, sizeof buf - n, "%s%s", d ? ", " : "", reshard_dtype_name((reshard_dtype_t)d));
    }
  return buf;
}

/* What both tools read: the two modes' options and those of both. */
static void usage_modes(int perf, FILE *out) {
  fprintf(out,
          "usage: %s MODE [options]\n"
          "\n"
          "Model mode (Megatron training layout -> vLLM or SGLang inference layout)%s:\n"
          "  --model-config FILE   HuggingFace config.json\n"
          "  --layers N            keep only the first N layers (real shapes; default all)\n"
          "  --train SPEC          source side, Megatron: tp=2,pp=2,dp=1,ep=1 (missing keys are 1), or\n"
          "                        FSDP2: fsdp:dp_shard=8[,dp_replicate=2] (dense models)\n"
          "  --infer SPEC          destination side, vLLM: tp=2,dp=2 (or vllm:SPEC), or SGLang 0.5.23:\n"
          "                        sglang:tp=8,ep=8,attn_dp=8[,dp_lm_head=1,moe_dense_tp=1]\n"
          "  --dtype NAME          weights' dtype (default bf16)\n"
          "  --per-expert          one tensor per routed expert and projection (the checkpoint's\n"
          "                        model.layers.N.mlp.experts.E.gate_proj.weight, ...) instead of\n"
          "                        one stacked [experts, ...] tensor per layer and projection\n"
          "  --block-scales        the fp8 checkpoint format: linear weights fp8_e4m3, each with its\n"
          "                        fp32 weight_scale_inv (quantization_config.weight_block_size);\n"
          "                        --dtype then applies to the other tensors\n"
          "  --infer-dtype fp8e4m3 the inference side in that format, the trainer's in --dtype: the\n"
          "                        plan quantizes on the way (DeepSeek's per_block_cast_to_fp8)\n"
          "  --block R,C           the fp8 block (default: the config's weight_block_size); in\n"
          "                        synthetic mode, with --dst-dtype fp8e4m3, a block-quantized\n"
          "                        destination (scales placed like the tensor)\n"
          "Synthetic mode (one tensor, one mesh per side):\n"
          "  --shape D0,D1,...     the tensor's shape\n"
          "  --dtype NAME          %s\n"
          "                        (default f32)\n"
          "  --dst-dtype NAME      the destination's dtype (default: --dtype); f32, bf16, f16, fp8e4m3\n"
          "                        and fp8e5m2 convert into each other in flight\n"
          "  --src-mesh A0,A1,...  source mesh sizes; ranks row-major, last axis fastest\n"
          "  --src-placements P,.. one per source mesh axis: R (replicate) or S<dim> (shard dim)\n"
          "  --dst-mesh A0,...     destination mesh sizes\n"
          "  --dst-placements P,.. one per destination mesh axis\n"
          "Both modes:\n"
          "  --colocate            both sides on ranks 0.. (default: source ranks first, then\n"
          "                        destination ranks)\n"
          "  --staging BYTES       staging budget per rank (suffix K, M or G; default: the library's)\n"
          "  --topology PRESET     the machine (h100-8x400g, gb200-nvl72, flat, cpu): plan options'\n"
          "                        topology; %s\n"
          "  --relay -1|0|1        relays between destination replicas: -1 auto (default),\n"
          "                        0 never, 1 always\n",
          perf ? "mpirun -np N reshard_perf" : "reshard_plan",
          cli_have_models() ? "" : " [not in this build: no src/models]", dtype_list(),
          perf ? "also prints the cost model's prediction\n"
                 "                        (reshard_plan_estimate) beside the measured time"
               : "also prices the plan with the cost model and\n"
                 "                        prints the physical limit T_lower and the baselines");
}

/* reshard_perf's own options and how it measures. */
static const char usage_perf[] =
    "reshard_perf:\n"
    "  -n N                  timed iterations (default 20)\n"
    "  -w N                  warm-up iterations (default 5)\n"
    "  -c 0|1                check every destination element and the bytes around them\n"
    "                        against values computed from global coordinates (default 0)\n"
    "  --backend mpi|nccl|ipc|ucx-cuda\n"
    "                        mpi (default): host buffers, the MPI transport; nccl: one GPU\n"
    "                        per rank (local rank modulo the devices), device buffers,\n"
    "                        reshard_comm_create_nccl_mpi, execute on a CUDA stream and\n"
    "                        synchronize it (no baselines; needs a CUDA build); ipc: the\n"
    "                        same over reshard_comm_create_cuda_ipc, ranks of one node,\n"
    "                        several per GPU allowed; ucx-cuda: the same over\n"
    "                        reshard_comm_create_ucx_cuda (GPU memory over UCX, staged;\n"
    "                        moved by a CUDA-enabled UCX, else through host memory)\n"
    "  --baseline LIST       also run, on the same data: broadcast (gather each tensor to\n"
    "                        source rank 0, MPI_Bcast it to every destination rank, copy\n"
    "                        the fragments out), alltoallw (one MPI_Alltoallw with\n"
    "                        subarray/hvector datatypes, every box from the first source\n"
    "                        replica); comma-separated\n"
    "  --verify              also time a second plan with RESHARD_FLAG_VERIFY (end-to-end\n"
    "                        box checksums), interleaved with the plain one; prints its\n"
    "                        cost as '# verify: ... ratio=' (every backend)\n"
    "  --ucx                 also time the same plan over a UCX communicator\n"
    "                        (reshard_comm_create_ucx, rendezvous at rank 0's host),\n"
    "                        interleaved with the MPI one; prints '# ucx: ... ratio='\n"
    "                        (host buffers: --backend mpi; a build with UCX)\n"
    "  --values auto|bits|finite\n"
    "                        what the source's float elements hold: bits, every bit pattern\n"
    "                        (NaNs included: a fp8 block then takes the quantizer's NaN\n"
    "                        path); finite, weight-like finite values; auto (default):\n"
    "                        finite when the destination converts (--infer-dtype,\n"
    "                        --dst-dtype), else bits\n"
    "  --inject-error        (testing) corrupt one destination byte after each checked\n"
    "                        run, to show that the check catches it\n"
    "The world size must be the source ranks plus the destination ranks, or with\n"
    "--colocate the larger side's ranks. Time per iteration is the slowest rank's\n"
    "(barrier, then MPI_Wtime around the call); the median is reported. algbw = bytes\n"
    "delivered to destination buffers / time; busbw = bytes that crossed between ranks /\n"
    "time. Exit status 1 on any wrong element or failed call, 2 on bad options.\n";

/* reshard_plan's own options and how it plans and checks. */
static const char usage_plan[] =
    "reshard_plan:\n"
    "  --world N             communicator size (default: the sides' ranks summed, or the\n"
    "                        larger side's with --colocate)\n"
    "  --rank R              plan rank R only: its figures, no coverage check\n"
    "                        (the last line then says coverage=skipped); its chunk size\n"
    "                        derives from its own peer count, not the largest of all ranks\n"
    "  --check               exit 1 on any violation (coverage, reads, pair agreement)\n"
    "  --inject-error        (testing) drop one receive copy from a plan before checking\n"
    "  --no-check            skip the checks (coverage=skipped): plan, and with --topology\n"
    "                        price, every rank only (large models: the checks walk every row)\n"
    "  --show-layout src|dst print what each rank of that side holds (with --rank R: rank R\n"
    "                        only), one line per fragment, and exit without planning:\n"
    "                        rank=R name=N tensor=T dtype=D box=lo0:hi0,lo1:hi1,... offset=B\n"
    "                        (N: the buffer's name; in model mode the framework's parameter\n"
    "                        name on that rank; boxes half-open in tensor coordinates; B: the\n"
    "                        byte offset in the buffer; ranks global, source side first)\n"
    "  --threads N           planning threads (default: the CPUs online)\n"
    "  --time-all            time every rank's planning (default: a sample, the first and\n"
    "                        the busiest rank of each role; '-' for the others)\n"
    "  --digest              print a hash of each rank's plan (its messages and copies,\n"
    "                        field by field): '# digest rank R HEX'\n"
    "  --profile             print where the time went: per pass over the ranks (first\n"
    "                        stages, chunks, plans) wall seconds, and per role CPU seconds\n"
    "  --json FILE           also write the planned world as JSON to FILE: ranks, traffic\n"
    "                        per pair and per round, phases, and with --topology each\n"
    "                        round's busiest links, the prediction, T_lower and the\n"
    "                        baselines (schema: tools/README.md); stdout is unchanged\n"
    "Every rank's plan is computed in this one process with a fake communicator, as a\n"
    "real run agrees on it: each rank's first stage (the replica choice and relay trees,\n"
    "nearly all the work) once, kept in a temporary file in $TMPDIR; the ranks' largest\n"
    "spread and phase estimates, then their smallest chunk with those; then each rank's\n"
    "plan with all of them, and those plans are checked: every destination byte inside\n"
    "a fragment written exactly once (receive and local copies), none outside; every\n"
    "source byte read lies inside the rank's source fragments; each (sender, receiver)\n"
    "pair agrees on the (round, size) of every message, in order. Timed ranks are\n"
    "planned as-is in a forked child (plan_ms: wall time, cpu_ms, peak_MiB: peak RSS\n"
    "growth). With --topology and --relay -1 the direct and relay plans are both priced\n"
    "and the faster kept, as the library chooses.\n"
    "Exit status 1 on a failed plan (or a violation with --check), 2 on bad options.\n";

void cli_usage(int tool, FILE *out) {
  int perf = tool == CLI_TOOL_PERF;
  usage_modes(perf, out);
  fputs(perf ? usage_perf : usage_plan, out);
}

static int need_value(int argc, char **argv, int i, char *err, size_t errlen) {
  if (i + 1 >= argc) return cli_fail(err, errlen, "option %s needs a value", argv[i]);
  return 0;
}

/* What the command line named, for the checks after it is read. */
typedef struct cli_seen {
  int dtype, dst_dtype, src_pl, dst_pl, src_mesh, dst_mesh, shape, layers;
  const char *src_pl_arg, *dst_pl_arg;
} cli_seen;

/* The option parsers below: 0 when the option at argv[*i] was theirs
 * (*i past its value), 1 when it was not, -1 on a bad value (err set). */
#define VALUE()                                              \
  do {                                                       \
    if (need_value(argc, argv, *i, err, errlen)) return -1; \
    (*i)++;                                                  \
  } while (0)

/* Options of both tools and both modes. */
static int parse_common_option(int argc, char **argv, int *i, cli_opts *o, cli_seen *seen, char *err, size_t errlen) {
  const char *a = argv[*i];
  const char *v = *i + 1 < argc ? argv[*i + 1] : NULL;
  (void)seen;
  if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
    o->help = 1;
  } else if (!strcmp(a, "--colocate")) {
    o->colocate = 1;
  } else if (!strcmp(a, "--staging")) {
    VALUE();
    if (cli_parse_bytes(v, &o->staging) || o->staging == 0)
      return cli_fail(err, errlen, "--staging '%s': expected a positive byte count (suffix K, M or G allowed)", v);
  } else if (!strcmp(a, "--topology")) {
    VALUE();
    rs_topology t;
    if (rs_topology_preset(v, &t))
      return cli_fail(err, errlen, "--topology '%s': unknown preset (known: %s)", v, rs_topology_preset_names());
    o->topology = v;
  } else if (!strcmp(a, "--relay")) {
    VALUE();
    if (strcmp(v, "-1") && strcmp(v, "0") && strcmp(v, "1"))
      return cli_fail(err, errlen, "--relay '%s': expected -1 (auto), 0 (never) or 1 (always)", v);
    o->relay = atoi(v);
  } else if (!strcmp(a, "--inject-error")) {
    o->inject_error = 1;
  } else {
    return 1;
  }
  return 0;
}

/* Model mode: a config and both sides' parallelism. */
static int parse_model_option(int argc, char **argv, int *i, cli_opts *o, cli_seen *seen, char *err, size_t errlen) {
  const char *a = argv[*i];
  const char *v = *i + 1 < argc ? argv[*i + 1] : NULL;
  if (!strcmp(a, "--model-config")) {
    VALUE();
    o->model_config = v;
  } else if (!strcmp(a, "--layers")) {
    VALUE();
    if (parse_int(v, 1, &o->layers)) return cli_fail(err, errlen, "--layers '%s': expected an integer >= 1", v);
    seen->layers = 1;
  } else if (!strcmp(a, "--per-expert")) {
    o->per_expert = 1;
  } else if (!strcmp(a, "--block-scales")) {
    o->block_scales = 1;
  } else if (!strcmp(a, "--infer-dtype")) {
    VALUE();
    reshard_dtype_t dt;
    if (cli_parse_dtype(v, &dt) || dt != RESHARD_FP8_E4M3)
      return cli_fail(err, errlen, "--infer-dtype '%s': only fp8e4m3 (fp8 weights with block scales, quantized on "
                                   "the way) differs from --dtype today", v);
    o->infer_fp8 = 1;
  } else if (!strcmp(a, "--block")) {
    VALUE();
    int nb = 0;
    if (cli_parse_i64_list(v, 1, 2, o->block, &nb) || nb != 2 || o->block[0] < 1 || o->block[1] < 1)
      return cli_fail(err, errlen, "--block '%s': expected two sizes >= 1, rows and columns (e.g. 128,128)", v);
  } else if (!strcmp(a, "--train")) {
    VALUE();
    o->train = v;
  } else if (!strcmp(a, "--infer")) {
    VALUE();
    o->infer = v;
  } else {
    return 1;
  }
  return 0;
}

/* Synthetic mode: one tensor, both meshes and placements (and the dtypes,
 * which model mode reads too). */
static int parse_synthetic_option(int argc, char **argv, int *i, cli_opts *o, cli_seen *seen, char *err, size_t errlen) {
  const char *a = argv[*i];
  const char *v = *i + 1 < argc ? argv[*i + 1] : NULL;
  if (!strcmp(a, "--shape")) {
    VALUE();
    if (cli_parse_i64_list(v, 0, RESHARD_MAX_DIMS, o->shape, &o->ndim))
      return cli_fail(err, errlen, "--shape '%s': expected 1 to %d sizes >= 0 separated by commas (e.g. 4096,4096)", v,
                  RESHARD_MAX_DIMS);
    seen->shape = 1;
  } else if (!strcmp(a, "--dtype")) {
    VALUE();
    if (cli_parse_dtype(v, &o->dtype)) return cli_fail(err, errlen, "--dtype '%s': unknown dtype (known: %s)", v, dtype_list());
    seen->dtype = 1;
  } else if (!strcmp(a, "--dst-dtype")) {
    VALUE();
    if (cli_parse_dtype(v, &o->dst_dtype))
      return cli_fail(err, errlen, "--dst-dtype '%s': unknown dtype (known: %s)", v, dtype_list());
    seen->dst_dtype = 1;
  } else if (!strcmp(a, "--src-mesh")) {
    VALUE();
    if (parse_mesh(a, v, &o->src, err, errlen)) return -1;
    seen->src_mesh = 1;
  } else if (!strcmp(a, "--dst-mesh")) {
    VALUE();
    if (parse_mesh(a, v, &o->dst, err, errlen)) return -1;
    seen->dst_mesh = 1;
  } else if (!strcmp(a, "--src-placements")) {
    VALUE();
    seen->src_pl_arg = v;
    if (cli_parse_placements(v, o->src.placements, &o->src.nplacements))
      return cli_fail(err, errlen, "--src-placements '%s': expected R or S<dim> per mesh axis, comma-separated (e.g. R,S1)", v);
    seen->src_pl = 1;
  } else if (!strcmp(a, "--dst-placements")) {
    VALUE();
    seen->dst_pl_arg = v;
    if (cli_parse_placements(v, o->dst.placements, &o->dst.nplacements))
      return cli_fail(err, errlen, "--dst-placements '%s': expected R or S<dim> per mesh axis, comma-separated (e.g. R,S1)", v);
    seen->dst_pl = 1;
  } else {
    return 1;
  }
  return 0;
}

/* reshard_perf only. */
static int parse_perf_option(int argc, char **argv, int *i, cli_opts *o, cli_seen *seen, char *err, size_t errlen) {
  const char *a = argv[*i];
  const char *v = *i + 1 < argc ? argv[*i + 1] : NULL;
  (void)seen;
  if (!strcmp(a, "-n")) {
    VALUE();
    if (parse_int(v, 1, &o->iters)) return cli_fail(err, errlen, "-n '%s': expected an integer >= 1", v);
  } else if (!strcmp(a, "-w")) {
    VALUE();
    if (parse_int(v, 0, &o->warmup)) return cli_fail(err, errlen, "-w '%s': expected an integer >= 0", v);
  } else if (!strcmp(a, "-c")) {
    VALUE();
    if (parse_int(v, 0, &o->check) || o->check > 1) return cli_fail(err, errlen, "-c '%s': expected 0 or 1", v);
  } else if (!strcmp(a, "--backend")) {
    VALUE();
    if (!strcmp(v, "mpi")) o->backend = CLI_BACKEND_MPI;
    else if (!strcmp(v, "nccl")) o->backend = CLI_BACKEND_NCCL;
    else if (!strcmp(v, "ipc")) o->backend = CLI_BACKEND_IPC;
    else if (!strcmp(v, "ucx-cuda")) o->backend = CLI_BACKEND_UCX_CUDA;
    else return cli_fail(err, errlen, "--backend '%s': expected mpi, nccl, ipc or ucx-cuda", v);
  } else if (!strcmp(a, "--baseline")) {
    VALUE();
    if (parse_baselines(v, o, err, errlen)) return -1;
  } else if (!strcmp(a, "--verify")) {
    o->verify = 1;
  } else if (!strcmp(a, "--ucx")) {
    o->ucx = 1;
  } else if (!strcmp(a, "--values")) {
    VALUE();
    if (!strcmp(v, "auto")) o->values = -1;
    else if (!strcmp(v, "bits")) o->values = RESHARD_SELFTEST_BITS;
    else if (!strcmp(v, "finite")) o->values = RESHARD_SELFTEST_FINITE;
    else return cli_fail(err, errlen, "--values '%s': expected auto, bits or finite", v);
  } else {
    return 1;
  }
  return 0;
}

/* reshard_plan only. */
static int parse_plan_option(int argc, char **argv, int *i, cli_opts *o, cli_seen *seen, char *err, size_t errlen) {
  const char *a = argv[*i];
  const char *v = *i + 1 < argc ? argv[*i + 1] : NULL;
  (void)seen;
  if (!strcmp(a, "--world")) {
    VALUE();
    if (parse_int(v, 1, &o->world)) return cli_fail(err, errlen, "--world '%s': expected an integer >= 1", v);
  } else if (!strcmp(a, "--rank")) {
    VALUE();
    if (parse_int(v, 0, &o->rank)) return cli_fail(err, errlen, "--rank '%s': expected an integer >= 0", v);
  } else if (!strcmp(a, "--check")) {
    o->strict = 1;
  } else if (!strcmp(a, "--no-check")) {
    o->no_check = 1;
  } else if (!strcmp(a, "--threads")) {
    VALUE();
    if (parse_int(v, 1, &o->threads) || o->threads > 64)
      return cli_fail(err, errlen, "--threads '%s': expected an integer from 1 to 64", v);
  } else if (!strcmp(a, "--time-all")) {
    o->time_all = 1;
  } else if (!strcmp(a, "--digest")) {
    o->digest = 1;
  } else if (!strcmp(a, "--profile")) {
    o->profile = 1;
  } else if (!strcmp(a, "--json")) {
    VALUE();
    if (!*v) return cli_fail(err, errlen, "--json needs a file name");
    o->json = v;
  } else if (!strcmp(a, "--replay-out")) {
    VALUE();
    if (!*v) return cli_fail(err, errlen, "--replay-out needs a file name");
    o->replay_out = v;
  } else if (!strcmp(a, "--show-layout")) {
    VALUE();
    if (!strcmp(v, "src")) o->show_layout = 1;
    else if (!strcmp(v, "dst")) o->show_layout = 2;
    else return cli_fail(err, errlen, "--show-layout '%s': expected src or dst", v);
  } else {
    return 1;
  }
  return 0;
}

#undef VALUE

/* Model mode's options complete and consistent. */
static int check_model(cli_opts *o, const cli_seen *seen, char *err, size_t errlen) {
  o->mode = CLI_MODE_MODEL;
  if (!o->model_config) return cli_fail(err, errlen, "model mode needs --model-config FILE");
  if (!o->train) return cli_fail(err, errlen, "model mode needs --train SPEC (e.g. tp=2,pp=2)");
  if (!o->infer) return cli_fail(err, errlen, "model mode needs --infer SPEC (e.g. tp=2,dp=2)");
  if (!seen->dtype) o->dtype = RESHARD_BF16;
  if (seen->dst_dtype)
    return cli_fail(err, errlen, "--dst-dtype is for synthetic mode: in model mode, --infer-dtype fp8e4m3 gives the "
                                 "inference side fp8 weights with block scales (the rest keeps --dtype)");
  if (o->block[0] && !o->block_scales && !o->infer_fp8)
    return cli_fail(err, errlen, "--block in model mode sets the fp8 block of --infer-dtype fp8e4m3 or --block-scales; "
                                 "give one of them");
  return 0;
}

/* Synthetic mode's options complete, and the placements fitting the
 * meshes and the shape. */
static int check_synthetic(cli_opts *o, const cli_seen *seen, char *err, size_t errlen) {
  o->mode = CLI_MODE_SYNTHETIC;
  if (!seen->shape) return cli_fail(err, errlen, "synthetic mode needs --shape (e.g. --shape 4096,4096)");
  if (!seen->src_mesh) return cli_fail(err, errlen, "synthetic mode needs --src-mesh (e.g. --src-mesh 4)");
  if (!seen->dst_mesh) return cli_fail(err, errlen, "synthetic mode needs --dst-mesh (e.g. --dst-mesh 2,2)");
  if (!seen->src_pl) return cli_fail(err, errlen, "synthetic mode needs --src-placements (e.g. --src-placements S0)");
  if (!seen->dst_pl) return cli_fail(err, errlen, "synthetic mode needs --dst-placements (e.g. --dst-placements R,S1)");
  if (!seen->dtype) o->dtype = RESHARD_FP32;
  if (!seen->dst_dtype) o->dst_dtype = o->dtype;
  if (o->block[0] && (o->dst_dtype != RESHARD_FP8_E4M3 || o->ndim < 2))
    return cli_fail(err, errlen, "--block quantizes the destination in fp8 blocks: it needs --dst-dtype fp8e4m3 and a "
                                 "--shape of at least 2 dims");
  const cli_mesh *ms[2] = {&o->src, &o->dst};
  const char *names[2] = {"src", "dst"}, *args[2] = {seen->src_pl_arg, seen->dst_pl_arg};
  for (int s = 0; s < 2; s++) {
    if (ms[s]->nplacements != ms[s]->ndim)
      return cli_fail(err, errlen, "--%s-placements '%s' has %d placement%s but --%s-mesh has %d ax%s: give one per axis",
                  names[s], args[s], ms[s]->nplacements, ms[s]->nplacements == 1 ? "" : "s", names[s], ms[s]->ndim,
                  ms[s]->ndim == 1 ? "is" : "es");
    for (int k = 0; k < ms[s]->nplacements; k++)
      if (ms[s]->placements[k].kind == RESHARD_PLACEMENT_SHARD && ms[s]->placements[k].dim >= o->ndim)
        return cli_fail(err, errlen, "--%s-placements '%s': S%d shards dim %d but --shape has %d dim%s (0..%d)", names[s],
                    args[s], ms[s]->placements[k].dim, ms[s]->placements[k].dim, o->ndim, o->ndim == 1 ? "" : "s",
                    o->ndim - 1);
  }
  return 0;
}

/* reshard_plan's options that exclude each other. */
static int check_plan(const cli_opts *o, char *err, size_t errlen) {
  if (o->json && (o->show_layout || o->rank >= 0))
    return cli_fail(err, errlen, "--json describes every rank's plan, which %s skips", o->show_layout ? "--show-layout" : "--rank");
  if (o->replay_out && (o->show_layout || o->rank >= 0))
    return cli_fail(err, errlen, "--replay-out writes every rank's plan, which %s skips",
                    o->show_layout ? "--show-layout" : "--rank");
  if (o->show_layout) {
    if (o->topology || o->strict || o->no_check || o->inject_error || o->relay != -1)
      return cli_fail(err, errlen, "--show-layout prints the layout and plans nothing: --topology, --relay, --check, "
                                   "--no-check and --inject-error do not apply");
    return 0;
  }
  if (o->rank >= 0 && o->topology)
    return cli_fail(err, errlen, "--topology prices every rank's plan, which --rank skips");
  if (o->no_check && (o->strict || o->inject_error))
    return cli_fail(err, errlen, "--no-check cannot be combined with --check or --inject-error");
  if (o->rank >= 0 && o->inject_error)
    return cli_fail(err, errlen, "--inject-error needs the coverage check, which --rank skips");
  if (o->rank >= 0 && o->time_all)
    return cli_fail(err, errlen, "--time-all times every rank, which --rank skips");
  return 0;
}

int cli_parse(int tool, int argc, char **argv, cli_opts *o, char *err, size_t errlen) {
  memset(o, 0, sizeof *o);
  o->tool = tool;
  o->iters = 20;
  o->values = -1;
  o->warmup = 5;
  o->rank = -1;
  o->relay = -1;
  cli_seen seen = {0};
  int perf = tool == CLI_TOOL_PERF, plan = tool == CLI_TOOL_PLAN;
  for (int i = 1; i < argc; i++) {
    int r = parse_common_option(argc, argv, &i, o, &seen, err, errlen);
    if (r == 1) r = parse_model_option(argc, argv, &i, o, &seen, err, errlen);
    if (r == 1) r = parse_synthetic_option(argc, argv, &i, o, &seen, err, errlen);
    if (r == 1 && perf) r = parse_perf_option(argc, argv, &i, o, &seen, err, errlen);
    if (r == 1 && plan) r = parse_plan_option(argc, argv, &i, o, &seen, err, errlen);
    if (r == 1) return cli_fail(err, errlen, "unknown option '%s' (see --help)", argv[i]);
    if (r) return -1;
  }
  if (o->help) return 0;

  int model = o->model_config || o->train || o->infer || seen.layers || o->per_expert || o->block_scales || o->infer_fp8;
  int synthetic = seen.shape || seen.src_mesh || seen.dst_mesh || seen.src_pl || seen.dst_pl;
  if (model && synthetic)
    return cli_fail(err, errlen, "model options (--model-config, --layers, --train, --infer, --per-expert, --block-scales) and synthetic options "
                             "(--shape, --src-mesh, --src-placements, --dst-mesh, --dst-placements) cannot be mixed");
  if (!model && !synthetic)
    return cli_fail(err, errlen, "no reshard described: give --model-config FILE --train SPEC --infer SPEC, or --shape, "
                             "--src-mesh, --src-placements, --dst-mesh and --dst-placements (see --help)");
  if (model ? check_model(o, &seen, err, errlen) : check_synthetic(o, &seen, err, errlen)) return -1;
  return plan ? check_plan(o, err, errlen) : 0;
}

static int mesh_size(const cli_mesh *m) {
  int n = 1;
  for (int i = 0; i < m->ndim; i++) n *= m->shape[i];
  return n;
}

static void format_mesh(char *buf, size_t len, const cli_mesh *m) {
  size_t n = 0;
  buf[0] = 0;
  for (int i = 0; i < m->ndim && n < len; i++) n += (size_t)snprintf(buf + n, len - n, "%s%d", i ? "x" : "", m->shape[i]);
  if (n < len) n += (size_t)snprintf(buf + n, len - n, " [");
  for (int i = 0; i < m->nplacements && n < len; i++) {
    const reshard_placement_t *p = &m->placements[i];
    if (p->kind == RESHARD_PLACEMENT_REPLICATE) n += (size_t)snprintf(buf + n, len - n, "%sR", i ? "," : "");
    else n += (size_t)snprintf(buf + n, len - n, "%sS%d", i ? "," : "", p->dim);
  }
  if (n < len) snprintf(buf + n, len - n, "]");
}

static int lib_fail(char *err, size_t errlen, const char *what, reshard_result_t r) {
  return cli_fail(err, errlen, "%s: %s: %s", what, reshard_result_string(r), reshard_last_error());
}

static int build_synthetic(const cli_opts *o, cli_layouts *l, char *err, size_t errlen) {
  l->nsrc = mesh_size(&o->src);
  l->ndst = mesh_size(&o->dst);
  l->first_dst = o->colocate ? 0 : l->nsrc;
  const cli_mesh *ms[2] = {&o->src, &o->dst};
  reshard_layout_t **ls[2] = {&l->src, &l->dst};
  int first[2] = {0, l->first_dst};
  const char *side[2] = {"source", "destination"};
  for (int s = 0; s < 2; s++) {
    int tid, mid, bid;
    reshard_result_t r = reshard_layout_create(ls[s]);
    const int blocked = s && o->block[0];
    if (!r && blocked) r = reshard_layout_add_tensor_blocked(*ls[s], "tensor", o->dst_dtype, o->ndim, o->shape, o->block, &tid);
    else if (!r) r = reshard_layout_add_tensor(*ls[s], "tensor", s ? o->dst_dtype : o->dtype, o->ndim, o->shape, &tid);
    if (!r) r = reshard_layout_add_mesh_strided(*ls[s], ms[s]->ndim, ms[s]->shape, first[s], 1, &mid);
    if (!r) r = reshard_layout_place(*ls[s], tid, mid, ms[s]->placements, &bid);
    /* the block scales ("tensor_scale_inv") are placed like their weight */
    if (!r && blocked) r = reshard_layout_place(*ls[s], tid + 1, mid, ms[s]->placements, &bid);
    if (r) {
      char what[64];
      snprintf(what, sizeof what, "building the %s layout", side[s]);
      return lib_fail(err, errlen, what, r);
    }
  }
  char sm[128], dm[128], shape[128];
  format_mesh(sm, sizeof sm, &o->src);
  format_mesh(dm, sizeof dm, &o->dst);
  size_t n = 0;
  shape[0] = 0;
  for (int i = 0; i < o->ndim && n < sizeof shape; i++)
    n += (size_t)snprintf(shape + n, sizeof shape - n, "%s%lld", i ? "x" : "", (long long)o->shape[i]);
  char dts[32];
  if (o->dst_dtype == o->dtype) snprintf(dts, sizeof dts, "%s", reshard_dtype_name(o->dtype));
  else snprintf(dts, sizeof dts, "%s->%s", reshard_dtype_name(o->dtype), reshard_dtype_name(o->dst_dtype));
  if (o->block[0]) {
    size_t k = strlen(dts);
    snprintf(dts + k, sizeof dts - k, " (%lldx%lld blocks)", (long long)o->block[0], (long long)o->block[1]);
  }
  snprintf(l->desc, sizeof l->desc, "synthetic %s %s: mesh %s -> mesh %s", shape, dts, sm, dm);
  return 0;
}

#ifdef RESHARD_TOOLS_HAVE_MODELS
static int build_model(const cli_opts *o, cli_layouts *l, char *err, size_t errlen) {
  rm_parallel tp, ip;
  rm_model *m = NULL;
  /* --train fsdp:SPEC: the trainer is FSDP2 (rm_fsdp_layout), else
   * Megatron (megatron:SPEC or SPEC) */
  const int fsdp = !strncmp(o->train, "fsdp:", 5);
  const char *train = fsdp ? o->train + 5 : !strncmp(o->train, "megatron:", 9) ? o->train + 9 : o->train;
  reshard_result_t r = rm_parse_parallel(train, &tp);
  if (r) return cli_fail(err, errlen, "--train '%s': %s", o->train, reshard_last_error());
  /* --infer sglang:SPEC: the inference engine is SGLang (rm_sglang_layout),
   * else vLLM (vllm:SPEC or SPEC) */
  const int sglang = !strncmp(o->infer, "sglang:", 7);
  const char *infer = sglang ? o->infer + 7 : !strncmp(o->infer, "vllm:", 5) ? o->infer + 5 : o->infer;
  r = rm_parse_parallel(infer, &ip);
  if (r) return cli_fail(err, errlen, "--infer '%s': %s", o->infer, reshard_last_error());
  rm_model_options mo = RM_MODEL_OPTIONS_INIT;
  mo.layers = o->layers;
  mo.dtype = o->dtype;
  mo.per_expert = o->per_expert;
  mo.block_scales = o->block_scales;
  mo.block[0] = o->block[0], mo.block[1] = o->block[1];
  r = rm_model_load_ex(o->model_config, &mo, &m);
  if (r) return cli_fail(err, errlen, "--model-config '%s': %s", o->model_config, reshard_last_error());
  /* --infer-dtype fp8e4m3: the inference side's model has block scales
   * (fp8 weights declared blocked), the trainer's has not: the plan
   * quantizes on the way */
  rm_model *mi = m;
  if (o->infer_fp8 && !o->block_scales) {
    mo.block_scales = 1;
    r = rm_model_load_ex(o->model_config, &mo, &mi);
    if (r) {
      rm_model_free(m);
      return cli_fail(err, errlen, "--infer-dtype fp8e4m3 with --model-config '%s': %s (or give --block R,C)",
                      o->model_config, reshard_last_error());
    }
  }
  l->nsrc = rm_parallel_ranks(&tp);
  l->ndst = rm_parallel_ranks(&ip);
  l->first_dst = o->colocate ? 0 : l->nsrc;
  r = (fsdp ? rm_fsdp_layout : rm_megatron_layout)(m, &tp, 0, &l->src);
  if (r) {
    cli_fail(err, errlen, "--train '%s': %s", o->train, reshard_last_error());
    rm_model_free(m);
    if (mi != m) rm_model_free(mi);
    return -1;
  }
  r = (sglang ? rm_sglang_layout : rm_vllm_layout)(mi, &ip, l->first_dst, &l->dst);
  if (mi != m) rm_model_free(mi);
  if (r) {
    cli_fail(err, errlen, "--infer '%s': %s", o->infer, reshard_last_error());
    rm_model_free(m);
    return -1;
  }
  snprintf(l->desc, sizeof l->desc, "model %s (%s, %d layers, %d tensors%s%s, %.1f M params, %s): %s %s -> %s %s",
           o->model_config, rm_model_arch(m), rm_model_layers(m), rm_model_num_tensors(m),
           o->per_expert ? ", per-expert" : "",
           o->block_scales ? ", fp8 + block scales" : o->infer_fp8 ? ", quantized to fp8 blocks for inference" : "",
           (double)rm_model_num_params(m) / 1e6, reshard_dtype_name(o->dtype), fsdp ? "fsdp" : "megatron", train,
           sglang ? "sglang" : "vllm", infer);
  rm_model_free(m);
  return 0;
}
#endif

int cli_build_layouts(const cli_opts *o, cli_layouts *out, char *err, size_t errlen) {
  memset(out, 0, sizeof *out);
  int rc;
  if (o->mode == CLI_MODE_SYNTHETIC) {
    rc = build_synthetic(o, out, err, errlen);
  } else if (o->mode == CLI_MODE_MODEL) {
#ifdef RESHARD_TOOLS_HAVE_MODELS
    rc = build_model(o, out, err, errlen);
#else
    rc = cli_fail(err, errlen, "model mode: this build has no model front-end (src/models, target reshard_models)");
#endif
  } else {
    rc = cli_fail(err, errlen, "no mode");
  }
  if (rc) {
    cli_layouts_free(out);
    return -1;
  }
  out->world_needed = o->colocate ? (out->nsrc > out->ndst ? out->nsrc : out->ndst) : out->nsrc + out->ndst;
  if (o->colocate) {
    size_t n = strlen(out->desc);
    snprintf(out->desc + n, sizeof out->desc - n, ", colocated");
  }
  return 0;
}

void cli_layouts_free(cli_layouts *l) {
  reshard_layout_destroy(l->src);
  reshard_layout_destroy(l->dst);
  l->src = l->dst = NULL;
}

const char *cli_role(const cli_layouts *l, int rank) {
  int in_src = rank >= 0 && rank < l->nsrc;
  int in_dst = rank >= l->first_dst && rank < l->first_dst + l->ndst;
  return in_src && in_dst ? "both" : in_src ? "src" : in_dst ? "dst" : "none";
}

int cli_format_fragment(const reshard_layout_t *L, int rank, const reshard_fragment_info_t *f, char *buf,
                        size_t len) {
  const char *bname = NULL, *tname = NULL;
  reshard_dtype_t dt;
  if (reshard_layout_buffer_name(L, f->buffer_id, &bname) ||
      reshard_layout_tensor_info(L, f->tensor_id, &tname, &dt, NULL, NULL))
    return -1;
  size_t n = (size_t)snprintf(buf, len, "rank=%d name=%s tensor=%s dtype=%s box=", rank, bname, tname,
                              reshard_dtype_name(dt));
  for (int d = 0; d < f->ndim && n < len; d++)
    n += (size_t)snprintf(buf + n, len - n, "%s%lld:%lld", d ? "," : "", (long long)f->start[d],
                          (long long)(f->start[d] + f->extent[d]));
  if (n < len) n += (size_t)snprintf(buf + n, len - n, " offset=%zu", f->byte_offset);
  return n < len ? 0 : -1;
}

int cli_show_layout(const cli_layouts *l, int side, int rank, FILE *out, char *err, size_t errlen) {
  const reshard_layout_t *L = side == 1 ? l->src : l->dst;
  const int lo = side == 1 ? 0 : l->first_dst, n = side == 1 ? l->nsrc : l->ndst;
  const char *what = side == 1 ? "source" : "destination";
  fprintf(out, "# %s\n# %s side: ranks %d..%d; one line per fragment: rank name tensor dtype box offset\n", l->desc,
          what, lo, lo + n - 1);
  if (rank >= 0 && (rank < lo || rank >= lo + n)) {
    fprintf(out, "# rank %d holds nothing on the %s side\n", rank, what);
    return 0;
  }
  size_t cap = 0, count = 0;
  reshard_fragment_info_t *f = NULL;
  int r0 = rank >= 0 ? rank : lo, r1 = rank >= 0 ? rank : lo + n - 1;
  int rc = 0;
  char line[2048];
  for (int r = r0; r <= r1 && !rc; r++) {
    reshard_result_t res = reshard_layout_fragments(L, r, f, cap, &count);
    if (!res && count > cap) {
      free(f);
      cap = count;
      f = malloc(cap * sizeof *f);
      if (!f) return cli_fail(err, errlen, "--show-layout: out of memory");
      res = reshard_layout_fragments(L, r, f, cap, &count);
    }
    if (res) {
      rc = lib_fail(err, errlen, "--show-layout", res);
      break;
    }
    for (size_t i = 0; i < count && !rc; i++) {
      if (cli_format_fragment(L, r, &f[i], line, sizeof line))
        rc = cli_fail(err, errlen, "--show-layout: rank %d fragment %zu: %s", r, i, reshard_last_error());
      else
        fprintf(out, "%s\n", line);
    }
  }
  free(f);
  return rc;
}
