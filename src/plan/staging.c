/* The layout of a call's staging (plan.h: rs_staging_bytes,
 * rs_staging_split), apart so that the host executor, the device
 * executor and the plan's statistics read one definition of it. */
#include "plan/plan.h"

size_t rs_staging_bytes(const reshard_plan_t *p) { return (size_t)(2 * (p->send_half + p->recv_half)); }

unsigned char *rs_staging_split(const reshard_plan_t *p, unsigned char *base, unsigned char *send[2],
                                unsigned char *recv[2]) {
  if (!base) {
    send[0] = send[1] = recv[0] = recv[1] = NULL;
    return NULL;
  }
  send[0] = base;
  send[1] = base + p->send_half;
  recv[0] = base + 2 * p->send_half;
  recv[1] = recv[0] + p->recv_half;
  return base + rs_staging_bytes(p);
}
