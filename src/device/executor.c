/* The device executor's table (plan/executor.h): the one object the rest
 * of the library sees of src/device/'s executor. Its entries live in the
 * files named beside them. */
#include <cuda_runtime.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/clock.h"
#include "common/debug.h"
#include "common/error.h"
#include "transport/dev_comm.h"
#include "device/device.h"
#include "device/device_internal.h"
#include "exec/direct.h"
#include "kernels/rs_kernels.h"
#include "exec/exec_state.h"
#include "exec/schedule.h"
#include "plan/quant.h"
#include "transport/stream.h"

const rs_executor rs_device_executor = {
    .name = "device",
    .stream_ordered = 1,
    .prepare_local = device_prepare_local,
    .prepare_peers = device_prepare_peers,
    .free = device_free,
    .execute = device_execute,
    .refuse = device_refuse,
    .poll = device_poll,
    .register_buffers = rs_device_register,
    .quant_prepare = rs_device_quant_prepare,
    .spread_prepare = rs_device_spread_prepare,
};
