/* reshard_plan --replay-out (plan_replay.h): the schedule's fields of
 * every rank's plan, as text. Records go to a temporary file as the ranks
 * come (a full-size world has millions of messages), and are copied
 * behind the header at rp_write. */
#include "plan_replay.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "reshard_internal.h"

struct rp_writer {
  int world, next; /* ranks 0 .. next-1 written */
  FILE *tmp;
  int io_failed;
};

rp_writer *rp_create(int world) {
  rp_writer *w = calloc(1, sizeof *w);
  if (!w) return NULL;
  w->world = world;
  w->tmp = tmpfile();
  if (!w->tmp) {
    free(w);
    return NULL;
  }
  return w;
}

void rp_free(rp_writer *w) {
  if (!w) return;
  if (w->tmp) fclose(w->tmp);
  free(w);
}

/* The round starts a direction's messages imply, against the plan's own
 * array (schedule.c reads that one): the file leaves it out, so it must
 * be what the reader rebuilds. */
static reshard_result_t check_rounds(int rank, const rs_msg *m, size_t n, const size_t *start, const char *dir) {
  if (!n) return RESHARD_SUCCESS;
  size_t i = 0;
  for (int k = 0; k <= m[n - 1].round + 1; k++) {
    while (i < n && m[i].round < k) i++;
    if (start[k] != i)
      return rs_error(RESHARD_ERROR_INTERNAL, "--replay-out: rank %d: %s round %d starts at %zu, messages say %zu",
                      rank, dir, k, start[k], i);
    if (i < n && i > 0 && m[i].round < m[i - 1].round)
      return rs_error(RESHARD_ERROR_INTERNAL, "--replay-out: rank %d: %s not sorted by round", rank, dir);
  }
  return RESHARD_SUCCESS;
}

static void put_msgs(FILE *f, char dir, const rs_msg *m, size_t n) {
  for (size_t i = 0; i < n; i++)
    fprintf(f, "%c %d %d %llu %u %u %u\n", dir, m[i].peer, m[i].round, (unsigned long long)m[i].bytes, m[i].fwd,
            m[i].ncopies, m[i].direct);
}

reshard_result_t rp_add(rp_writer *w, int rank, const reshard_plan_t *p) {
  if (rank != w->next) return RESHARD_SUCCESS; /* a second walk, or out of order (rp_write says so) */
  RS_CHECK(check_rounds(rank, p->sends, p->nsends, p->send_round, "sends"));
  RS_CHECK(check_rounds(rank, p->recvs, p->nrecvs, p->recv_round, "receives"));
  FILE *f = w->tmp;
  fprintf(f, "rank %d nrounds %d nsends %zu nrecvs %zu npeers %zu nlocal %zu flags %u max_round_msgs %zu\n", rank,
          p->nrounds, p->nsends, p->nrecvs, p->npeers, p->nlocal_copies, p->opts.flags, p->max_round_msgs);
  fputc('p', f);
  for (size_t i = 0; i < p->npeers; i++) fprintf(f, " %d", p->peers[i].peer);
  fputc('\n', f);
  put_msgs(f, 's', p->sends, p->nsends);
  put_msgs(f, 'r', p->recvs, p->nrecvs);
  if (ferror(f)) w->io_failed = 1;
  w->next++;
  return RESHARD_SUCCESS;
}

static int complete(const rp_writer *w) {
  if (w->next == w->world && !w->io_failed) return 1;
  fprintf(stderr, "reshard_plan: error: --replay-out: %s\n",
          w->io_failed ? "writing the temporary file failed" : "not every rank's plan was seen");
  return 0;
}

/* One stage: its line, then its ranks' records. */
static void copy_stage(rp_writer *w, int i, FILE *out) {
  fprintf(out, "stage %d\n", i);
  rewind(w->tmp);
  char buf[1 << 16];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, w->tmp)) > 0) fwrite(buf, 1, n, out);
  if (ferror(w->tmp)) w->io_failed = 1;
}

int rp_write(rp_writer *const *stages, int n, const char *path) {
  if (n < 1 || n > RP_MAX_STAGES) {
    fprintf(stderr, "reshard_plan: error: --replay-out: %d stages (1 to %d)\n", n, RP_MAX_STAGES);
    return -1;
  }
  for (int i = 0; i < n; i++)
    if (!complete(stages[i])) return -1;
  FILE *out = fopen(path, "w");
  if (!out) {
    fprintf(stderr, "reshard_plan: error: --replay-out %s: %s\n", path, strerror(errno));
    return -1;
  }
  fprintf(out, "reshard-replay 3 world %d stages %d\n", stages[n - 1]->world, n);
  int bad = 0;
  for (int i = 0; i < n; i++) {
    copy_stage(stages[i], i, out);
    bad |= stages[i]->io_failed;
  }
  fprintf(out, "end\n");
  bad |= ferror(out);
  if (fclose(out) || bad) {
    fprintf(stderr, "reshard_plan: error: --replay-out %s: write failed\n", path);
    return -1;
  }
  return 0;
}
