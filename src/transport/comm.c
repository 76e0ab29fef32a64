/* The transport-independent part of a communicator. Every transport
 * allocates its reshard_comm_t zeroed (calloc) and fills rank, size and ops;
 * ops->destroy releases only the transport's own state, and the struct
 * itself is freed here, so that no transport can forget to. */
#include <stdlib.h>

#include "transport/transport.h"

int reshard_comm_rank(const reshard_comm_t *comm) {
  return comm ? comm->rank : -1;
}

int reshard_comm_size(const reshard_comm_t *comm) {
  return comm ? comm->size : -1;
}

void reshard_comm_destroy(reshard_comm_t *comm) {
  if (!comm) return;
  if (comm->ops && comm->ops->destroy) comm->ops->destroy(comm);
  free(comm->replaced);
  free(comm);
}
