/* What the MPI fault drivers share (test_mpi_faults.c, test_mpi_attack.c):
 * the world, a clock, a barrier with a deadline, the test transfer's
 * layout, the plan status, and main's start and end. Each driver is one
 * translation unit that includes this once. */
#ifndef RS_TESTS_MPI_FAULT_WORLD_H
#define RS_TESTS_MPI_FAULT_WORLD_H

#include <mpi.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "reshard.h"
#include "reshard_mpi.h"

#define TILE 64 /* rows (columns) per rank of the test transfer */

static int world_rank, world_size;

static double now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

/* A barrier with a deadline: after a fault nothing may block forever.
 * While waiting, SIGCONT goes to wake_pid (when > 0) every 100 ms, in case
 * the first one arrived before that rank had stopped itself. */
static int guarded_barrier(double timeout_ms, int wake_pid) {
  MPI_Request req;
  if (MPI_Ibarrier(MPI_COMM_WORLD, &req) != MPI_SUCCESS) return -1;
  double until = now_ms() + timeout_ms, wake = 0;
  for (;;) {
    if (wake_pid > 0 && now_ms() >= wake) {
      kill((pid_t)wake_pid, SIGCONT);
      wake = now_ms() + 100;
    }
    int flag = 0;
    if (MPI_Test(&req, &flag, MPI_STATUS_IGNORE) != MPI_SUCCESS) return -1;
    if (flag) return 0;
    if (now_ms() > until) return -1;
    struct timespec ts = {0, 1000000};
    nanosleep(&ts, NULL);
  }
}

/* The test transfer: one tensor "w" of [TILE*n, TILE*n] fp32 over all n
 * ranks, sharded along dim (rows to columns: every rank a partner of
 * every other); `uneven` gives the last rank one tile less and the first
 * one more. */
static reshard_layout_t *grid_layout(int dim, int uneven) {
  reshard_layout_t *L = NULL;
  int n = world_size, tid, mid, bid;
  int64_t shape[2] = {(int64_t)TILE * n, (int64_t)TILE * n};
  int64_t sizes[64];
  for (int i = 0; i < n && i < 64; i++) sizes[i] = TILE;
  if (uneven) {
    sizes[0] += TILE / 2;
    sizes[n - 1] -= TILE / 2;
  }
  reshard_placement_t pl = reshard_shard_sizes(dim, sizes);
  if (reshard_layout_create(&L) || reshard_layout_add_tensor(L, "w", RESHARD_FP32, 2, shape, &tid) ||
      reshard_layout_add_mesh_strided(L, 1, &n, 0, 1, &mid) || reshard_layout_place(L, tid, mid, &pl, &bid)) {
    fprintf(stderr, "rank %d: layout: %s\n", world_rank, reshard_last_error());
    MPI_Abort(MPI_COMM_WORLD, 2);
  }
  return L;
}

/* (get_status clears the last error: callers copy it first) */
static reshard_plan_status_t status_of(const reshard_plan_t *plan) {
  reshard_plan_status_t st;
  memset(&st, 0, sizeof st);
  st.struct_size = sizeof st;
  reshard_plan_get_status(plan, &st);
  return st;
}

/* main's start: MPI, the world (3 to 64 ranks, else exit 2), the mode. */
static const char *fault_init(int *argc, char ***argv, const char *name) {
  MPI_Init(argc, argv);
  MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world_size);
  if (world_size < 3 || world_size > 64) {
    if (world_rank == 0) fprintf(stderr, "%s: run with 3 to 64 ranks\n", name);
    MPI_Finalize();
    exit(2);
  }
  return *argc > 1 ? (*argv)[1] : "";
}

/* reshard's communicator over the world. */
static reshard_comm_t *fault_comm(void) {
  reshard_comm_t *comm = NULL;
  if (reshard_comm_create_mpi(MPI_COMM_WORLD, &comm)) {
    fprintf(stderr, "rank %d: comm_create_mpi: %s\n", world_rank, reshard_last_error());
    MPI_Abort(MPI_COMM_WORLD, 2);
  }
  return comm;
}

/* main's end after a mode that leaves every rank alive: destroy, a clean
 * MPI_Finalize, exit 1 if any rank saw a failure. */
static int fault_finish(reshard_comm_t *comm, int bad) {
  reshard_comm_destroy(comm);
  int any = 0;
  MPI_Allreduce(&bad, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  MPI_Finalize();
  return any != 0;
}

#endif
