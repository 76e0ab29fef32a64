#include "common/params.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "common/debug.h"

static struct {
  const char *name;
  const char *doc;
  int set;
  int64_t value;
  int is_string;
  char string[64];
} rs_params[RS_NUM_PARAMS] = {
    [RS_PARAM_STAGING_BYTES] = {.name = "RESHARD_STAGING_BYTES",
        .doc = "staging memory per rank in bytes (overrides options.staging_bytes)"},
    [RS_PARAM_CHUNK_BYTES] = {.name = "RESHARD_CHUNK_BYTES",
        .doc = "upper bound on one message in bytes (overrides options.chunk_bytes)"},
    [RS_PARAM_TIMEOUT_MS] = {.name = "RESHARD_TIMEOUT_MS",
        .doc = "deadline of every wait in ms, >= 1 (overrides options.timeout_ms; 0 and negative values are refused)"},
    [RS_PARAM_MPI_DATATYPES] = {.name = "RESHARD_MPI_DATATYPES",
        .doc = "1 (default): the MPI transport sends and receives strided boxes in place with "
                "derived datatypes; 0: pack into staging"},
    [RS_PARAM_NCCL_REGISTER] = {.name = "RESHARD_NCCL_REGISTER",
        .doc = "1: the NCCL transport registers its staging pool (ncclCommRegister); 0 (default): not"},
    [RS_PARAM_RELAY] = {.name = "RESHARD_RELAY",
        .doc = "relays between destination replicas: -1 (default) the cost model chooses, 0 never, 1 always "
                "(overrides options.relay)"},
    [RS_PARAM_TOPOLOGY] = {.name = "RESHARD_TOPOLOGY",
        .doc = "machine preset: h100-8x400g, gb200-nvl72, flat, cpu, or none (overrides options.topology)",
        .is_string = 1},
    [RS_PARAM_MAX_PHASES] = {.name = "RESHARD_MAX_PHASES",
        .doc = "the most phases a plan with a topology may take (1 to 64, default 64; 1: every stream "
                "sends every round)"},
    [RS_PARAM_SPREAD] = {.name = "RESHARD_SPREAD",
        .doc = "source-side spreading (copy sole-held data over NVLink to less busy ranks of its domain before "
                "it crosses the network): 1 (default) when the cost model predicts it faster, 0 never, 2 "
                "wherever a domain is imbalanced (sets options.flags)"},
    [RS_PARAM_UCX_PEER_ERRORS] = {.name = "RESHARD_UCX_PEER_ERRORS",
        .doc = "0 (default): the UCX transport's connections may use shared memory, and a dead peer costs its "
                "partners the deadline (TIMEOUT); 1: UCP peer-failure mode, a dead peer is BACKEND in "
                "milliseconds, but UCX 1.13 then moves data over TCP only (no shared memory)"},
};

static pthread_once_t rs_params_once = PTHREAD_ONCE_INIT;

/* A value that cannot be used is said on stderr whatever RESHARD_DEBUG
 * says (as NCCL does): a typo must not silently leave the default in
 * force. */
#define RS_PARAM_WARN(...) rs_log(RS_LOG_WARN, RS_SUBSYS_ALL, __VA_ARGS__)

static void rs_params_read(void) {
  for (int i = 0; i < RS_NUM_PARAMS; i++) {
    const char *s = getenv(rs_params[i].name);
    if (!s || !*s) continue;
    if (rs_params[i].is_string) {
      size_t n = strlen(s);
      if (n >= sizeof rs_params[i].string) {
        RS_PARAM_WARN("ignoring %s: longer than %zu characters", rs_params[i].name, sizeof rs_params[i].string - 1);
        continue;
      }
      memcpy(rs_params[i].string, s, n + 1);
      rs_params[i].set = 1;
      RS_LOG(RS_LOG_INFO, RS_SUBSYS_ALL, "%s set to %s", rs_params[i].name, s);
      continue;
    }
    char *end = NULL;
    errno = 0;
    long long v = strtoll(s, &end, 0);
    if (errno || !end || *end) {
      RS_PARAM_WARN("ignoring %s=%s: not an integer (the default stays in force)", rs_params[i].name, s);
      continue;
    }
    rs_params[i].set = 1;
    rs_params[i].value = v;
    RS_LOG(RS_LOG_INFO, RS_SUBSYS_ALL, "%s set to %lld", rs_params[i].name, v);
  }
}

int rs_param_get(rs_param_id id, int64_t *value) {
  pthread_once(&rs_params_once, rs_params_read);
  if (id < 0 || id >= RS_NUM_PARAMS || !rs_params[id].set || rs_params[id].is_string) return 0;
  *value = rs_params[id].value;
  return 1;
}

const char *rs_param_get_string(rs_param_id id) {
  pthread_once(&rs_params_once, rs_params_read);
  if (id < 0 || id >= RS_NUM_PARAMS || !rs_params[id].set || !rs_params[id].is_string) return NULL;
  return rs_params[id].string;
}

const char *rs_param_name(rs_param_id id) { return id < RS_NUM_PARAMS ? rs_params[id].name : "?"; }
const char *rs_param_doc(rs_param_id id) { return id < RS_NUM_PARAMS ? rs_params[id].doc : "?"; }
