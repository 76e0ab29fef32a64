/* RESHARD_DEBUG=WARN|INFO|TRACE and RESHARD_DEBUG_SUBSYS=PLAN,EXEC,...,
 * in the manner of NCCL_DEBUG. Messages go to stderr prefixed with the
 * process id. */
#ifndef RS_COMMON_DEBUG_H
#define RS_COMMON_DEBUG_H

enum { RS_LOG_NONE = 0, RS_LOG_WARN = 1, RS_LOG_INFO = 2, RS_LOG_TRACE = 3 };

enum {
  RS_SUBSYS_LAYOUT = 1u << 0,
  RS_SUBSYS_PLAN = 1u << 1,
  RS_SUBSYS_EXEC = 1u << 2,
  RS_SUBSYS_TRANSPORT = 1u << 3,
  RS_SUBSYS_ALL = 0xffffu
};

extern int rs_log_level; /* -1 until the environment is read */
void rs_log_init(void);
int rs_log_enabled(int level, unsigned subsys);
void rs_log(int level, unsigned subsys, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

#define RS_LOG(level, subsys, ...)                  \
  do {                                              \
    if (rs_log_enabled((level), (subsys)))          \
      rs_log((level), (subsys), __VA_ARGS__);       \
  } while (0)

#endif
