/* The RESHARD_* environment parameters: every tunable is read once, from
 * this one table, with a doc line each (docs/TUNING.md). */
#ifndef RS_COMMON_PARAMS_H
#define RS_COMMON_PARAMS_H

#include <stdint.h>

typedef enum rs_param_id {
  RS_PARAM_STAGING_BYTES = 0,
  RS_PARAM_CHUNK_BYTES,
  RS_PARAM_TIMEOUT_MS,
  RS_PARAM_MPI_DATATYPES,
  RS_PARAM_NCCL_REGISTER,
  RS_PARAM_RELAY,
  RS_PARAM_TOPOLOGY, /* a string */
  RS_PARAM_MAX_PHASES,
  RS_PARAM_SPREAD,
  RS_PARAM_UCX_PEER_ERRORS,
  RS_NUM_PARAMS
} rs_param_id;

/* Whether the variable is set (to a valid integer), and its value. */
int rs_param_get(rs_param_id id, int64_t *value);

/* A string parameter's value, or NULL when unset. */
const char *rs_param_get_string(rs_param_id id);

/* Name and doc line, for listings. */
const char *rs_param_name(rs_param_id id);
const char *rs_param_doc(rs_param_id id);

#endif
