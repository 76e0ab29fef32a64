/* Parallel settings: "tp=4,pp=2,dp=2,ep=8,etp=1" parsing, the checks both
 * layout builders share, and the split of layers into pipeline stages. */
#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/error.h"
#include "models_internal.h"

/* The keys of a parallel spec: which field, its range, and whose key it
 * is (the builders refuse a framework's key on the other side when it is
 * set to anything but its default). */
static const struct spec_key {
  const char *name;
  size_t offset;
  int is64;
  int64_t min, max;
} spec_keys[] = {
    {"tp", offsetof(rm_parallel, tp), 0, 1, 1 << 20},
    {"pp", offsetof(rm_parallel, pp), 0, 1, 1 << 20},
    {"dp", offsetof(rm_parallel, dp), 0, 1, 1 << 20},
    {"ep", offsetof(rm_parallel, ep), 0, 1, 1 << 20},
    {"etp", offsetof(rm_parallel, etp), 0, 1, 1 << 20},
    {"vocab", offsetof(rm_parallel, vocab), 1, 1, INT32_MAX},
    {"first", offsetof(rm_parallel, first), 0, 1, 1 << 20},
    {"last", offsetof(rm_parallel, last), 0, 1, 1 << 20},
    {"grouped_gemm", offsetof(rm_parallel, grouped_gemm), 0, 0, 1},
    {"sp_moe", offsetof(rm_parallel, sp_moe), 0, 0, 1},
    {"w31", offsetof(rm_parallel, w31), 0, 0, 1},
    {"dp_shard", offsetof(rm_parallel, dp_shard), 0, 1, 1 << 20},
    {"dp_replicate", offsetof(rm_parallel, dp_replicate), 0, 1, 1 << 20},
    {"cp", offsetof(rm_parallel, cp), 0, 1, 1 << 20},
    /* SGLang's (rm_sglang_layout) */
    {"attn_dp", offsetof(rm_parallel, attn_dp), 0, 1, 1 << 20},
    {"dp_lm_head", offsetof(rm_parallel, dp_lm_head), 0, 0, 1},
    {"moe_dense_tp", offsetof(rm_parallel, moe_dense_tp), 0, 1, 1 << 20},
    {"shared_fusion", offsetof(rm_parallel, shared_fusion), 0, 0, 0},
};
#define NKEYS ((int)(sizeof spec_keys / sizeof spec_keys[0]))
#define KEY_LIST                                                                                               \
  "tp, pp, dp, ep, etp, cp, vocab, first, last, grouped_gemm, sp_moe, w31, dp_shard, dp_replicate, attn_dp, " \
  "dp_lm_head, moe_dense_tp, shared_fusion"

reshard_result_t rm_parse_parallel(const char *spec, rm_parallel *out) {
  rs_error_clear();
  if (!spec || !out) return rs_error(RESHARD_ERROR_INVALID_ARGUMENT, "parallel spec: NULL argument");
  rm_parallel p = RM_PARALLEL_INIT;
  int seen[NKEYS] = {0};
  const char *s = spec;
  while (*s == ' ') s++;
  if (*s == '\0') {
    *out = p; /* nothing said: one rank */
    return RESHARD_SUCCESS;
  }
  for (;;) {
    const char *item = s;
    size_t klen = strcspn(s, "=,");
    while (klen > 0 && s[klen - 1] == ' ') klen--;
    const char *after_key = s + strcspn(s, "=,");
    if (*after_key != '=')
      return rs_error(RESHARD_ERROR_INVALID_ARGUMENT, "parallel spec '%s': item '%.*s' is not key=value", spec,
                      (int)strcspn(item, ","), item);
    int k = -1;
    for (int i = 0; i < NKEYS; i++)
      if (strlen(spec_keys[i].name) == klen && !strncmp(s, spec_keys[i].name, klen)) k = i;
    if (k < 0)
      return rs_error(RESHARD_ERROR_INVALID_ARGUMENT, "parallel spec '%s': unknown key '%.*s' (keys: " KEY_LIST ")",
                      spec, (int)klen, s);
    const struct spec_key *key = &spec_keys[k];
    if (seen[k]++)
      return rs_error(RESHARD_ERROR_INVALID_ARGUMENT, "parallel spec '%s': key '%s' given twice", spec, key->name);
    const char *v = after_key + 1;
    while (*v == ' ') v++;
    char *end = NULL;
    errno = 0;
    long long x = isdigit((unsigned char)*v) ? strtoll(v, &end, 10) : 0;
    if (end)
      while (*end == ' ') end++;
    if (!end || end == v || (*end != ',' && *end != '\0'))
      return rs_error(RESHARD_ERROR_INVALID_ARGUMENT, "parallel spec '%s': key '%s' needs an integer, found '%.*s'",
                      spec, key->name, (int)strcspn(v, ","), v);
    if (errno == ERANGE || x < key->min || x > key->max)
      return rs_error(RESHARD_ERROR_INVALID_ARGUMENT, "parallel spec '%s': key '%s' = %.*s is outside [%lld, %lld]",
                      spec, key->name, (int)strcspn(v, ","), v, (long long)key->min, (long long)key->max);
    char *field = (char *)&p + key->offset;
    if (key->is64) *(int64_t *)(void *)field = (int64_t)x;
    else *(int *)(void *)field = (int)x;
    if (*end == '\0') break;
    s = end + 1;
    while (*s == ' ') s++;
  }
  *out = p;
  return RESHARD_SUCCESS;
}

int rm_parallel_ranks(const rm_parallel *p) {
  if (!p || p->tp < 1 || p->pp < 1 || p->dp < 1) return 0;
  if (p->dp_shard < 0 || p->dp_replicate < 0 || p->cp < 0) return 0;
  /* FSDP2's keys (the other factors are 1 there: rm_fsdp_layout) and
   * Megatron's context parallelism */
  int64_t n = (int64_t)p->tp * p->pp * p->dp * (p->dp_shard ? p->dp_shard : 1) *
              (p->dp_replicate ? p->dp_replicate : 1) * (p->cp ? p->cp : 1);
  return n > INT_MAX ? 0 : (int)n;
}

const char *rm_sglang_key(const rm_parallel *p) {
  return p->attn_dp ? "attn_dp" : p->dp_lm_head ? "dp_lm_head" : p->moe_dense_tp ? "moe_dense_tp"
         : p->shared_fusion >= 0                  ? "shared_fusion"
                                                  : NULL;
}

reshard_result_t rm_check_common(const rm_model *m, const rm_parallel *p, int etp, int first_rank, const char *side) {
  if (p->tp < 1 || p->pp < 1 || p->dp < 1 || p->ep < 1 || etp < 1)
    return rs_error(RESHARD_ERROR_INVALID_ARGUMENT, "%s layout: tp %d, pp %d, dp %d, ep %d and etp %d must be >= 1",
                    side, p->tp, p->pp, p->dp, p->ep, etp);
  if (first_rank < 0) return rs_error(RESHARD_ERROR_INVALID_ARGUMENT, "%s layout: first rank %d is negative", side, first_rank);
  const int cp = p->cp ? p->cp : 1; /* (Megatron's alone: the other builders refuse it) */
  int64_t n = (int64_t)p->tp * p->pp * p->dp * cp;
  if (n + first_rank > INT_MAX)
    return rs_error(RESHARD_ERROR_INVALID_ARGUMENT, "%s layout: tp x pp x dp%s = %lld ranks from rank %d overflow int",
                    side, cp > 1 ? " x cp" : "", (long long)n, first_rank);
  if (p->pp > m->layers)
    return rs_error(RESHARD_ERROR_INVALID_ARGUMENT, "%s layout: pp %d exceeds the %d layers", side, p->pp, m->layers);
  if (m->c.heads % p->tp)
    return rs_error(RESHARD_ERROR_INVALID_ARGUMENT, "%s layout: tp %d does not divide the %lld attention heads", side,
                    p->tp, (long long)m->c.heads);
  if (m->c.experts == 0) {
    /* ep 1 and etp 0 are the defaults (RM_PARALLEL_INIT: etp 0 is unset),
     * ep=1 / etp=1 say nothing more; name only what was set beyond them */
    const int bad_ep = p->ep != 1, bad_etp = p->etp != 0 && p->etp != 1;
    if (bad_ep && bad_etp)
      return rs_error(RESHARD_ERROR_INVALID_ARGUMENT,
                      "%s layout: ep %d and etp %d given for the dense model '%s' (it has no experts: leave both out)",
                      side, p->ep, p->etp, m->path);
    if (bad_ep || bad_etp)
      return rs_error(RESHARD_ERROR_INVALID_ARGUMENT,
                      "%s layout: %s %d given for the dense model '%s' (it has no experts: leave it out)", side,
                      bad_ep ? "ep" : "etp", bad_ep ? p->ep : p->etp, m->path);
    return RESHARD_SUCCESS;
  }
  int64_t stage = (int64_t)p->tp * p->dp * cp;
  if (stage % ((int64_t)p->ep * etp))
    return rs_error(RESHARD_ERROR_INVALID_ARGUMENT, "%s layout: ep %d x etp %d does not divide tp x dp%s = %lld", side,
                    p->ep, etp, cp > 1 ? " x cp" : "", (long long)stage);
  return RESHARD_SUCCESS;
}

/* Megatron-core, megatron/core/transformer/transformer_block.py
 * get_num_layers_to_build: without num_layers_in_first/last_pipeline_stage
 * every stage builds num_layers / pp layers (asserting pp divides them);
 * with them, the given stages build that many and the stages left share
 * the rest evenly (asserting it divides). */
reshard_result_t rm_megatron_stages(const rm_model *m, const rm_parallel *p, int *start) {
  const int L = m->layers, pp = p->pp;
  if (!p->first && !p->last) {
    if (L % pp)
      return rs_error(RESHARD_ERROR_INVALID_ARGUMENT,
                      "megatron layout: pp %d does not divide the %d layers; Megatron-core needs that unless the "
                      "first or last stage's layer count is given (say first=<n> and/or last=<n>, "
                      "num_layers_in_first/last_pipeline_stage)",
                      pp, L);
    for (int s = 0; s <= pp; s++) start[s] = s * (L / pp);
    return RESHARD_SUCCESS;
  }
  if (pp < 2)
    return rs_error(RESHARD_ERROR_INVALID_ARGUMENT, "megatron layout: first=%d / last=%d need pp > 1", p->first,
                    p->last);
  int64_t rest = (int64_t)L - p->first - p->last;
  int left = pp - (p->first > 0) - (p->last > 0);
  if (rest < 0 || (left == 0 && rest != 0) || (left > 0 && (rest == 0 || rest % left)))
    return rs_error(RESHARD_ERROR_INVALID_ARGUMENT,
                    "megatron layout: first=%d, last=%d: the %lld layers left do not split evenly over the %d other "
                    "stage%s of pp %d (%d layers in all; get_num_layers_to_build)",
                    p->first, p->last, (long long)rest, left, left == 1 ? "" : "s", pp, L);
  const int mid = left ? (int)(rest / left) : 0;
  start[0] = 0;
  for (int s = 0; s < pp; s++) {
    int n = s == 0 && p->first ? p->first : s == pp - 1 && p->last ? p->last : mid;
    start[s + 1] = start[s] + n;
  }
  return RESHARD_SUCCESS;
}

/* vLLM, vllm/distributed/utils.py get_pp_indices (no
 * VLLM_PP_LAYER_PARTITION): num_layers // pp each, the remainder one more
 * each on the stages just before the last (the last stage holds the
 * lm_head and never gets one). */
void rm_vllm_stage_layers(int layers, int pp, int stage, int *first, int *count) {
  int base = layers / pp, rem = layers % pp;
  int f = 0;
  for (int s = 0; s <= stage; s++) {
    int n = base + (s >= pp - 1 - rem && s <= pp - 2);
    if (s == stage) {
      *first = f;
      *count = n;
    }
    f += n;
  }
}
