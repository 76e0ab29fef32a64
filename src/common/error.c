#include "common/error.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "common/debug.h"

#define RS_ERROR_LEN 1024

static _Thread_local char rs_last_error_buf[RS_ERROR_LEN];

int reshard_version(void) { return RESHARD_VERSION; }

const char *reshard_result_string(reshard_result_t r) {
  switch (r) {
    case RESHARD_SUCCESS:
      return "success";
    case RESHARD_ERROR_INVALID_ARGUMENT:
      return "invalid argument: fix the call described by reshard_last_error()";
    case RESHARD_ERROR_INVALID_USAGE:
      return "invalid usage: the call is not allowed in this state or with these buffers";
    case RESHARD_ERROR_OUT_OF_MEMORY:
      return "out of memory: lower options.staging_bytes or free memory";
    case RESHARD_ERROR_MISMATCH:
      return "mismatch between ranks: they disagree on layouts, options, executes or versions, or verified data "
             "differ from what was sent (see reshard_last_error())";
    case RESHARD_ERROR_BACKEND:
      return "backend failure: the transport (MPI, NCCL, CUDA) reported an error";
    case RESHARD_ERROR_REMOTE:
      return "remote failure: another rank failed; see its error";
    case RESHARD_ERROR_TIMEOUT:
      return "timeout: a peer did not answer before the deadline (options.timeout_ms, or RESHARD_TIMEOUT_MS when set)";
    case RESHARD_ERROR_UNSUPPORTED:
      return "unsupported: this build or version cannot serve the request";
    case RESHARD_ERROR_INTERNAL:
      return "internal error: please report it with reshard_last_error()";
    case RESHARD_ERROR_IN_DOUBT:
      return "in doubt: this rank voted to commit and did not learn before the deadline whether every rank did; "
             "reshard_plan_resolve settles it";
    default:
      return "unknown result code";
  }
}

const char *reshard_last_error(void) { return rs_last_error_buf; }

void rs_error_clear(void) { rs_last_error_buf[0] = '\0'; }

reshard_result_t rs_error(reshard_result_t code, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(rs_last_error_buf, sizeof rs_last_error_buf, fmt, ap);
  va_end(ap);
  RS_LOG(RS_LOG_WARN, RS_SUBSYS_ALL, "%s: %s", reshard_result_string(code),
         rs_last_error_buf);
  return code;
}

void rs_error_prefix(const char *fmt, ...) {
  char prefix[256];
  char old[RS_ERROR_LEN];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(prefix, sizeof prefix, fmt, ap);
  va_end(ap);
  memcpy(old, rs_last_error_buf, sizeof old);
  size_t n = strlen(prefix);
  size_t m = strnlen(old, sizeof old - 1);
  if (n + m >= sizeof rs_last_error_buf) m = sizeof rs_last_error_buf - 1 - n;
  memcpy(rs_last_error_buf, prefix, n);
  memcpy(rs_last_error_buf + n, old, m);
  rs_last_error_buf[n + m] = '\0';
}

void rs_breadcrumb(const char *file, int line, const char *expr,
                   reshard_result_t r) {
  RS_LOG(RS_LOG_TRACE, RS_SUBSYS_ALL, "%s:%d %s -> %d", file, line, expr,
         (int)r);
}
