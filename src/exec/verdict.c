/* The messages of the verdicts both executors reach: a partner's header
 * that differs from this rank's (the agreement, kernels/rs_agree.h), and
 * a box whose checksum differs (verify, exec/verify.c). One function per
 * verdict, so that a rank out of step or a corrupted box reads the same
 * whichever executor found it; each executor adds what the verdict meant
 * for its writes (`then`), and the device executor, which learns of it
 * after the fact, which call it was (`when`). */
#include <stdio.h>

#include "common/error.h"
#include "exec/exec_state.h"

reshard_result_t rs_verdict_header(const reshard_plan_t *p, int peer, const rs_dev_hdr *got, const rs_dev_hdr *want,
                                   const char *then) {
  if (rs_hdr_compare(got, want) == RS_HDR_OTHER_PLAN)
    return rs_error(RESHARD_ERROR_MISMATCH,
                    "execute rank %d: partner rank %d runs another plan or protocol (header magic %016llx digest %016llx, "
                    "expected %016llx %016llx)%s",
                    p->rank, peer, (unsigned long long)got->magic, (unsigned long long)got->digest,
                    (unsigned long long)want->magic, (unsigned long long)want->digest, then);
  return rs_error(RESHARD_ERROR_MISMATCH,
                  "execute rank %d: partner rank %d is at another execute of this plan: expected call %llu version %llu, "
                  "received call %llu version %llu from rank %d (a rank skipped or repeated a step?)%s",
                  p->rank, peer, (unsigned long long)want->call, (unsigned long long)want->version,
                  (unsigned long long)got->call, (unsigned long long)got->version, peer, then);
}

reshard_result_t rs_verdict_verify(const reshard_plan_t *p, const char *when, const rs_vbox *v, int received, int peer,
                                   uint64_t here, uint64_t there, const char *then) {
  char box[256] = "?";
  if (v) rs_vbox_format(v, box, sizeof box);
  const char *tensor = v && v->tensor >= 0 && v->tensor < p->nvtensors ? p->vtensors[v->tensor].name : "?";
  return rs_error(RESHARD_ERROR_MISMATCH,
                  "execute rank %d: %sverify: tensor '%s' box %s %s rank %d: checksum %016llx of the elements here, "
                  "%016llx at the source (corrupted or misplaced data)%s",
                  p->rank, when, tensor, box, received ? "received from" : "copied locally on", peer,
                  (unsigned long long)here, (unsigned long long)there, then);
}
