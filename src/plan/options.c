/* The caller's plan options: read by version (a caller built against an
 * older header gets the defaults of the fields it does not know), then
 * the RESHARD_* environment parameters applied and everything checked.
 * Apart from plan creation (create.c) because it is the one place the
 * options' rules live, and it needs no communicator. */
#include <string.h>

#include "common/error.h"
#include "common/params.h"
#include "plan/planner.h"

/* The sizes of every published version of reshard_options_t: a caller
 * built against an older header passes its own size and gets the defaults
 * of the fields it does not know. */
static size_t options_size_of_version(uint32_t version) {
  switch (version) {
    case 1: return offsetof(reshard_options_t, timeout_ms) + sizeof(int64_t);
    case 2: return sizeof(reshard_options_t);
    default: return 0;
  }
}

/* The caller's options (NULL: the defaults) into out, checked against the
 * versions this library knows. */
reshard_result_t rs_options_read(const reshard_options_t *in, reshard_options_t *out) {
  reshard_options_t def = RESHARD_OPTIONS_INITIALIZER;
  *out = def;
  if (!in) return RESHARD_SUCCESS;
  if (in->struct_size < offsetof(reshard_options_t, staging_bytes))
    return rs_error(RESHARD_ERROR_INVALID_ARGUMENT,
                    "options: struct_size %u is not one this library knows (expected %zu); start from RESHARD_OPTIONS_INITIALIZER",
                    in->struct_size, sizeof(reshard_options_t));
  if (in->version < 1 || in->version > RESHARD_OPTIONS_VERSION)
    return rs_error(RESHARD_ERROR_INVALID_ARGUMENT, "options: version %u unknown (library has %d)", in->version, RESHARD_OPTIONS_VERSION);
  if (in->struct_size != options_size_of_version(in->version))
    return rs_error(RESHARD_ERROR_INVALID_ARGUMENT,
                    "options: struct_size %u does not match version %u (expected %zu); start from RESHARD_OPTIONS_INITIALIZER",
                    in->struct_size, in->version, options_size_of_version(in->version));
  memcpy(out, in, in->struct_size);
  out->struct_size = (uint32_t)sizeof(reshard_options_t);
  out->version = RESHARD_OPTIONS_VERSION;
  return RESHARD_SUCCESS;
}

/* Environment parameters override the caller's options (like NCCL_*), so
 * that a job can be tuned without a rebuild; ranks that disagree still
 * fail cleanly because the options are part of the digest. */
reshard_result_t rs_options_apply_params(reshard_options_t *o) {
  int64_t v;
  if (rs_param_get(RS_PARAM_STAGING_BYTES, &v)) o->staging_bytes = v > 0 ? (size_t)v : 0;
  if (rs_param_get(RS_PARAM_CHUNK_BYTES, &v)) o->chunk_bytes = v > 0 ? (size_t)v : 0;
  if (rs_param_get(RS_PARAM_TIMEOUT_MS, &v)) {
    if (v < 1)
      return rs_error(RESHARD_ERROR_INVALID_ARGUMENT,
                      "RESHARD_TIMEOUT_MS=%lld: every wait needs a deadline of at least 1 ms (0 and negative values, "
                      "which once meant none, are refused: a hung peer could not be told from a slow one)",
                      (long long)v);
    o->timeout_ms = v;
  }
  if (rs_param_get(RS_PARAM_RELAY, &v)) o->relay = (int)(v < -1 ? -2 : v > 1 ? 2 : v);
  if (rs_param_get(RS_PARAM_SPREAD, &v)) {
    if (v < 0 || v > 2) return rs_error(RESHARD_ERROR_INVALID_ARGUMENT, "RESHARD_SPREAD=%lld is not 0, 1 or 2", (long long)v);
    o->flags &= ~(uint32_t)(RESHARD_FLAG_NO_SPREAD | RESHARD_FLAG_SPREAD_ALWAYS);
    o->flags |= v == 0 ? RESHARD_FLAG_NO_SPREAD : v == 2 ? RESHARD_FLAG_SPREAD_ALWAYS : 0;
  }
  const char *topo = rs_param_get_string(RS_PARAM_TOPOLOGY);
  if (topo) o->topology = topo;
  if (o->relay < -1 || o->relay > 1)
    return rs_error(RESHARD_ERROR_INVALID_ARGUMENT, "options: relay %d is not -1 (auto), 0 (never) or 1 (always)", o->relay);
  if (o->flags & ~RS_KNOWN_FLAGS)
    return rs_error(RESHARD_ERROR_INVALID_ARGUMENT, "options: flags 0x%x has unknown bits 0x%x", o->flags,
                    o->flags & ~RS_KNOWN_FLAGS);
  if ((o->flags & RESHARD_FLAG_NO_SPREAD) && (o->flags & RESHARD_FLAG_SPREAD_ALWAYS))
    return rs_error(RESHARD_ERROR_INVALID_ARGUMENT, "options: flags RESHARD_FLAG_NO_SPREAD and RESHARD_FLAG_SPREAD_ALWAYS "
                    "contradict each other");
  if (o->timeout_ms < 1)
    return rs_error(RESHARD_ERROR_INVALID_ARGUMENT,
                    "options: timeout_ms %lld: every wait needs a deadline of at least 1 ms (0 and negative values, "
                    "which once meant none, are refused: a hung peer could not be told from a slow one); the default "
                    "is 60000 (RESHARD_OPTIONS_INITIALIZER)",
                    (long long)o->timeout_ms);
  if (o->staging_bytes < 4096)
    return rs_error(RESHARD_ERROR_INVALID_ARGUMENT, "options: staging_bytes %zu is below the minimum of 4096", o->staging_bytes);
  return RESHARD_SUCCESS;
}
