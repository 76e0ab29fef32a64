/* Result codes, the thread-local error detail and breadcrumb macros. */
#ifndef RS_COMMON_ERROR_H
#define RS_COMMON_ERROR_H

#include "reshard.h"

#if defined(__GNUC__)
#define RS_PRINTF(a, b) __attribute__((format(printf, a, b)))
#else
#define RS_PRINTF(a, b)
#endif

/* Records the detail for reshard_last_error() and returns code, so that
 * error paths read `return rs_error(CODE, "tensor '%s' rank %d: ...")`. */
reshard_result_t rs_error(reshard_result_t code, const char *fmt, ...)
    RS_PRINTF(2, 3);

/* Prefixes the current detail with context ("plan_create: ") once the error
 * travels up a frame that knows more. */
void rs_error_prefix(const char *fmt, ...) RS_PRINTF(1, 2);

void rs_error_clear(void);

/* Propagates a failure, leaving a breadcrumb at TRACE level. */
#define RS_CHECK(call)                                                     \
  do {                                                                     \
    reshard_result_t rs_check_r_ = (call);                                 \
    if (rs_check_r_ != RESHARD_SUCCESS) {                                  \
      rs_breadcrumb(__FILE__, __LINE__, #call, rs_check_r_);               \
      return rs_check_r_;                                                  \
    }                                                                      \
  } while (0)

/* Same, but jumps to a cleanup label after storing the result in `var`. */
#define RS_CHECK_GOTO(call, var, label)                                    \
  do {                                                                     \
    (var) = (call);                                                        \
    if ((var) != RESHARD_SUCCESS) {                                        \
      rs_breadcrumb(__FILE__, __LINE__, #call, (var));                     \
      goto label;                                                          \
    }                                                                      \
  } while (0)

void rs_breadcrumb(const char *file, int line, const char *expr,
                   reshard_result_t r);

#endif
