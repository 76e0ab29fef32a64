/* The state line of the MPI fault tests (test_mpi_attack.c, and the
 * stop, late and split modes of test_mpi_faults.c), which
 * tests/mpi/run_fault_test.sh compares across ranks:
 *
 *   STATE <label> rank R committed V active C doubt D whole W
 *
 * V, C and D are this rank's reshard_plan_get_status: committed_version,
 * active_copy and in_doubt_version. W is 1 when the copy that holds the
 * committed version (copies[C], copies[0] when C is -1) holds exactly that
 * version's values (0 wrong bytes), or, with nothing committed, was never
 * written (all sentinel). Each rank computes W from its own memory: the
 * line is what the judge believes, so it must never be taken from what the
 * test expected. */
#ifndef RS_TESTS_MPI_STATE_LINE_H
#define RS_TESTS_MPI_STATE_LINE_H

#include <stdio.h>
#include <string.h>

#include "reshard.h"
#include "reshard_selftest.h"

/* Whether every byte of s is still the allocation's sentinel. */
static inline int state_untouched(const reshard_selftest_t *s) {
  for (int b = 0; b < s->nbuf; b++)
    for (size_t i = 0; s->ptr[b] && i < s->bytes[b]; i++)
      if (s->ptr[b][i] != RESHARD_SELFTEST_SENTINEL) return 0;
  return 1;
}

/* Prints this rank's STATE line; returns W. */
static inline int state_print(const char *label, int rank, const reshard_plan_t *plan,
                              const reshard_selftest_t *copies, const reshard_layout_t *dst) {
  reshard_plan_status_t st;
  memset(&st, 0, sizeof st);
  st.struct_size = sizeof st;
  reshard_plan_get_status(plan, &st);
  const reshard_selftest_t *held = &copies[st.active_copy > 0 ? st.active_copy : 0];
  int whole = st.committed_version ? reshard_selftest_check(held, dst, rank, st.committed_version, label) == 0
                                   : state_untouched(held);
  printf("STATE %s rank %d committed %llu active %d doubt %llu whole %d\n", label, rank,
         (unsigned long long)st.committed_version, st.active_copy, (unsigned long long)st.in_doubt_version, whole);
  fflush(stdout);
  return whole;
}

#endif
