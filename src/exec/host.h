/* The host executor (execute.c): plans on host transports (in-process,
 * MPI, UCX), run by the calling thread with a host agreement per call
 * (agree.c), double-buffered commit (doubt.c) and verify (verify.c). */
#ifndef RS_EXEC_HOST_H
#define RS_EXEC_HOST_H

#include "plan/executor.h"

extern const rs_executor rs_host_executor;

#endif
