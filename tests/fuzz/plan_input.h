/* The plan fuzzer's input format and checks, shared by the libFuzzer
 * target (fuzz_plan.c) and the corpus replay that every build runs
 * (replay_corpus.c).
 *
 * fz_plan_input() decodes bytes into a source and a destination layout
 * through the public API (tensors, meshes, placements with split sizes,
 * fused buffers with padding and groups, raw buffers with strided
 * fragments) and options, plans every rank with a fake communicator, and
 * checks:
 *   - every failed call left a non-empty reshard_last_error() and changed
 *     nothing (tensor and buffer counts);
 *   - when every rank planned: the bytes each rank sends to a peer equal
 *     the bytes that peer receives from it (and the message counts), the
 *     totals equal the per-peer sums, and each rank receives or copies
 *     locally exactly the bytes of its destination fragments;
 *   - for small cases, executing over the in-process transport writes
 *     every destination element correctly and no byte outside fragments.
 * A violation prints what failed and abort()s (a crash for the fuzzer, a
 * failed test for the replay). Any input is accepted: bytes past the end
 * read as zero.
 *
 * Format (one byte each unless said otherwise):
 *   nranks-1 (mod 8), options, tensor count, per tensor: dtype, ndim,
 *   shape values; a destination tweak; then for each side an op count and
 *   ops: 0 mesh, 1 place, 2 fused buffer, 3 raw buffer, 4 fragment. See
 *   the decoder for the fields of each op. */
#ifndef RS_FUZZ_PLAN_INPUT_H
#define RS_FUZZ_PLAN_INPUT_H

#include <stddef.h>
#include <stdint.h>

typedef enum fz_outcome {
  FZ_REJECTED = 0, /* plan creation failed (with a message) */
  FZ_PLANNED = 1,  /* every rank planned; too large to execute */
  FZ_EXECUTED = 2, /* planned and executed, every byte checked */
  FZ_SKIPPED = 3   /* layouts built, too many messages to plan */
} fz_outcome;

/* Decodes and checks one input; abort()s on a violated invariant. */
fz_outcome fz_plan_input(const uint8_t *data, size_t size);

#endif
