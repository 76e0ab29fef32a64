/* Parallel settings: "tp=4,pp=2,dp=2,ep=8,etp=1" parsing, the checks both
 * layout builders share, and the split of layers into pipeline stages. */
#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "common/error.h"
#include "models_internal.h"

reshard_result_t rm_parse_parallel(const char *spec, rm_parallel *out) {
  rs_error_clear();
  if (!spec || !out) return rs_error(RESHARD_ERROR_INVALID_ARGUMENT, "parallel spec: NULL argument");
  rm_parallel p = {1, 1, 1, 1, 1};
  static const char *const keys[5] = {"tp", "pp", "dp", "ep", "etp"};
  int *fields[5] = {&p.tp, &p.pp, &p.dp, &p.ep, &p.etp};
  int seen[5] = {0};
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
    for (int i = 0; i < 5; i++)
      if (strlen(keys[i]) == klen && !strncmp(s, keys[i], klen)) k = i;
    if (k < 0)
      return rs_error(RESHARD_ERROR_INVALID_ARGUMENT, "parallel spec '%s': unknown key '%.*s' (keys: tp, pp, dp, ep, etp)",
                      spec, (int)klen, s);
    if (seen[k]++)
      return rs_error(RESHARD_ERROR_INVALID_ARGUMENT, "parallel spec '%s': key '%s' given twice", spec, keys[k]);
    const char *v = after_key + 1;
    while (*v == ' ') v++;
    char *end = NULL;
    errno = 0;
    long x = isdigit((unsigned char)*v) ? strtol(v, &end, 10) : 0;
    if (end)
      while (*end == ' ') end++;
    if (!end || end == v || (*end != ',' && *end != '\0'))
      return rs_error(RESHARD_ERROR_INVALID_ARGUMENT, "parallel spec '%s': key '%s' needs a positive integer, found '%.*s'",
                      spec, keys[k], (int)strcspn(v, ","), v);
    if (errno == ERANGE || x < 1 || x > (1 << 20))
      return rs_error(RESHARD_ERROR_INVALID_ARGUMENT, "parallel spec '%s': key '%s' = %.*s is outside [1, %d]", spec,
                      keys[k], (int)strcspn(v, ","), v, 1 << 20);
    *fields[k] = (int)x;
    if (*end == '\0') break;
    s = end + 1;
    while (*s == ' ') s++;
  }
  *out = p;
  return RESHARD_SUCCESS;
}

int rm_parallel_ranks(const rm_parallel *p) {
  if (!p || p->tp < 1 || p->pp < 1 || p->dp < 1) return 0;
  int64_t n = (int64_t)p->tp * p->pp * p->dp;
  return n > INT_MAX ? 0 : (int)n;
}

reshard_result_t rm_check_common(const rm_model *m, const rm_parallel *p, int first_rank, const char *side) {
  if (p->tp < 1 || p->pp < 1 || p->dp < 1 || p->ep < 1 || p->etp < 1)
    return rs_error(RESHARD_ERROR_INVALID_ARGUMENT, "%s layout: tp %d, pp %d, dp %d, ep %d and etp %d must be >= 1",
                    side, p->tp, p->pp, p->dp, p->ep, p->etp);
  if (first_rank < 0) return rs_error(RESHARD_ERROR_INVALID_ARGUMENT, "%s layout: first rank %d is negative", side, first_rank);
  int64_t n = (int64_t)p->tp * p->pp * p->dp;
  if (n + first_rank > INT_MAX)
    return rs_error(RESHARD_ERROR_INVALID_ARGUMENT, "%s layout: tp x pp x dp = %lld ranks from rank %d overflow int",
                    side, (long long)n, first_rank);
  if (p->pp > m->layers)
    return rs_error(RESHARD_ERROR_INVALID_ARGUMENT, "%s layout: pp %d exceeds the %d layers", side, p->pp, m->layers);
  if (m->c.heads % p->tp)
    return rs_error(RESHARD_ERROR_INVALID_ARGUMENT, "%s layout: tp %d does not divide the %lld attention heads", side,
                    p->tp, (long long)m->c.heads);
  if (m->c.experts == 0) {
    if (p->ep != 1 || p->etp != 1)
      return rs_error(RESHARD_ERROR_INVALID_ARGUMENT, "%s layout: ep %d / etp %d given for the dense model '%s'",
                      side, p->ep, p->etp, m->path);
    return RESHARD_SUCCESS;
  }
  int64_t stage = (int64_t)p->tp * p->dp;
  if (stage % ((int64_t)p->ep * p->etp))
    return rs_error(RESHARD_ERROR_INVALID_ARGUMENT, "%s layout: ep %d x etp %d does not divide tp x dp = %lld", side,
                    p->ep, p->etp, (long long)stage);
  if (m->c.experts % p->ep)
    return rs_error(RESHARD_ERROR_INVALID_ARGUMENT, "%s layout: ep %d does not divide the %lld experts", side, p->ep,
                    (long long)m->c.experts);
  return RESHARD_SUCCESS;
}

void rm_stage_layers(int layers, int pp, int stage, int vllm_style, int *first, int *count) {
  int base = layers / pp, rem = layers % pp;
  int f = 0;
  for (int s = 0; s <= stage; s++) {
    int extra = vllm_style ? (s >= pp - 1 - rem && s <= pp - 2) : (s < rem);
    int n = base + extra;
    if (s == stage) {
      *first = f;
      *count = n;
    }
    f += n;
  }
}
