/*
 * internal: for reshard's own tools, benchmarks and tests; not installed,
 * no stability promise.
 *
 * Copyright (c) 2026, the reshard authors. BSD-3-Clause (see LICENSE).
 *
 * The one header through which tools/ and bench/ reach the library's
 * internals (they link reshard_static, which keeps every symbol;
 * libreshard.so exports the public reshard_* API only, src/reshard.map).
 * Everything else they use is in include/. scripts/check_layers.py checks
 * that tools/ and bench/ include nothing else of src/.
 */
#ifndef RESHARD_INTERNAL_H
#define RESHARD_INTERNAL_H

#include "reshard.h"

#include "common/alloc.h"      /* rs_alloc_set_bulk: folded simulation runs */
#include "common/error.h"      /* rs_result_t, error detail */
#include "common/params.h"     /* the RESHARD_* parameters */
#include "exec/schedule.h"     /* the schedule of an execute: reshard_replay walks it */
#include "layout/layout.h"     /* layouts' internals, rs_hash_bytes */
#include "pack/copy.h"         /* rs_copy_skip: folded simulation runs */
#include "pack/quantize.h"     /* the host's fp8 block quantizer */
#include "plan/cost.h"         /* the cost model */
#include "plan/lower_bound.h"  /* T_lower */
#include "plan/plan.h"         /* plans' internals, planning stages */
#include "plan/quant.h"        /* the layout rewrite of fp8 quantization */
#include "plan/spread.h"       /* source-side spreading */
#include "plan/topology.h"     /* machine presets, rank map */
#include "transport/transport.h" /* the transport seam (fake communicator) */

#endif /* RESHARD_INTERNAL_H */
