/* A fault-injecting wrapper of the in-process transport for tests: it
 * swaps a communicator's operations table for a copy whose isend, on one
 * chosen rank, corrupts or fails one chosen data message. Everything else
 * goes to the in-process transport unchanged. */
#ifndef RS_TEST_FAULT_COMM_H
#define RS_TEST_FAULT_COMM_H

#include <stddef.h>

#include "reshard.h"

typedef enum tf_kind {
  TF_NONE = 0,
  TF_FLIP_BYTE,      /* one byte of the payload (in the middle) flipped */
  TF_SWAP_ELEMENTS,  /* the first two 4-byte elements swapped */
  TF_FAIL_SEND       /* isend returns RESHARD_ERROR_BACKEND */
} tf_kind;

/* One fault: the `nth` (0-based) data send (control messages of the
 * per-execute agreement are not counted) of at least min_bytes bytes from
 * rank `rank`. fired is set once it acted. */
typedef struct tf_fault {
  tf_kind kind;
  int rank;
  size_t min_bytes;
  int nth;
  int seen;  /* qualifying sends so far (touched by `rank` only) */
  int fired;
} tf_fault;

/* Routes comm's sends through the wrapper with fault f (which must
 * outlive comm; one fault per process at a time). */
void tf_install(reshard_comm_t *comm, tf_fault *f);


#endif
