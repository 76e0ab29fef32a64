/*
 * reshard over UCX: host buffers, processes launched any way (Ray actors,
 * plain subprocesses), no MPI.
 *
 * Copyright (c) 2026, the reshard authors. BSD-3-Clause (see LICENSE).
 *
 * Available when the library was built with RESHARD_WITH_UCX (the default
 * where UCX's pkg-config file `ucx` is found; Debian: libucx-dev).
 */
#ifndef RESHARD_UCX_H
#define RESHARD_UCX_H

#include "reshard.h"

#ifdef __cplusplus
extern "C" {
#endif

/* A communicator of `size` processes over UCX (UCP tagged messages), with
 * no MPI. Every process calls it with the same rendezvous address
 * "host:port" (an IPv4 address or a host name) and its own rank in
 * [0, size): rank 0 listens there, the others connect to it and send
 * their UCX worker addresses; rank 0 hands the table to everyone, every
 * rank connects to every other, and a first agreement checks that all
 * arrived. Collective; every wait ends timeout_ms after the call (< 1:
 * RESHARD_TIMEOUT_MS, else 60000) with RESHARD_ERROR_TIMEOUT, and a
 * failure on one rank makes the others time out (nothing of the
 * communicator is left behind). UCX's own environment (UCX_TLS, UCX_NET_
 * DEVICES, ...) picks the wires: shared memory between processes of a
 * node, TCP or RDMA across nodes; the rendezvous itself is a TCP
 * connection, so UCX_TLS must keep tcp (sm,self alone times out). The
 * port is free again once rank 0's communicator exists (reshard sets
 * UCX_CM_REUSEADDR unless you did). Destroy with reshard_comm_destroy. */
reshard_result_t reshard_comm_create_ucx(const char *rendezvous, int rank, int size, int timeout_ms,
                                         reshard_comm_t **out);

#ifdef __cplusplus
}
#endif

#endif /* RESHARD_UCX_H */
