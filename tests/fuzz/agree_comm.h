/* Planning every rank of a world in one thread, exactly.
 *
 * bench/fake_comm.h plans one rank as if every other rank agreed with it;
 * but plan creation agrees on values (the largest peer count of any rank,
 * which bounds the chunk size, and error flags), so ranks planned that way
 * may cut the same stream differently. This communicator replays the
 * agreement instead: in a first pass every rank's allreduce contributions
 * are recorded, call by call; in each later pass (fz_agree_replay) each
 * allreduce returns the maximum over all ranks' contributions to that
 * call in the pass before, and records the contributions anew. A rank's
 * contribution to a call depends on what the calls before it returned
 * (the chunk each rank sizes follows the agreed spread and phases), so
 * the passes go on until one records what it replayed
 * (fz_agree_settled): then every call returned what a real run computes.
 * Like the bench's fake communicator it cannot move data. */
#ifndef RS_FUZZ_AGREE_COMM_H
#define RS_FUZZ_AGREE_COMM_H

#include "reshard.h"

#define FZ_AGREE_MAX_RANKS 64
#define FZ_AGREE_MAX_CALLS 8
#define FZ_AGREE_MAX_VALS 160 /* RS_AGREE_MAX_WORDS (src/transport/transport.h) */

typedef struct fz_agree_world {
  int size;
  int replay; /* 0: first pass (recording only), 1: replaying */
  int calls[FZ_AGREE_MAX_RANKS];
  int nvals[FZ_AGREE_MAX_CALLS]; /* replayed: the pass before's */
  uint64_t max[FZ_AGREE_MAX_CALLS][FZ_AGREE_MAX_VALS];
  int rec_nvals[FZ_AGREE_MAX_CALLS]; /* recorded in this pass */
  uint64_t rec[FZ_AGREE_MAX_CALLS][FZ_AGREE_MAX_VALS];
} fz_agree_world;

void fz_agree_init(fz_agree_world *w, int size);
/* Starts a replaying pass (after every rank planned once more): the
 * maxima recorded in the pass that ended are replayed. */
void fz_agree_replay(fz_agree_world *w);
/* After a replaying pass: whether it recorded exactly what it replayed. */
int fz_agree_settled(const fz_agree_world *w);
/* A communicator of rank `rank` of the world (which must outlive it). */
reshard_result_t fz_agree_comm_create(fz_agree_world *w, int rank,
                                      reshard_comm_t **comm);

#endif
