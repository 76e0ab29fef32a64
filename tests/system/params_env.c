/* The RESHARD_* environment knobs that override a plan's options
 * (src/common/params.c, read once per process; src/plan/options.c
 * applies them at plan creation): each takes effect, seen in the plan's
 * statistics against the options the program passes, and the plan still
 * moves every element right. The knobs are read once per process, so
 * ctest runs this program once per case with the case's variable set
 * (tests/CMakeLists.txt), and once with none: the control, which shows
 * that without the variable the options give another plan (so a case
 * cannot pass by accident).
 *
 *   params_env CASE           CASE: control, staging, chunk, max_phases,
 *                             topology, topology_none
 *
 * The plan: 8 sources (ranks 0-7, one h100-8x400g node) each send 128 KiB
 * to each of 8 destinations (ranks 8-15, the next node): a 512 x 4096 f32
 * tensor, rows split over the sources and columns over the destinations.
 * Its 8 equal streams per NIC fill 8 phases (test_phases:
 * test_all_to_all_takes_eight is the same shape). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "reshard.h"
#include "support/harness.h"

enum { NSRC = 8, NRANKS = 16, ROWS = 512, COLS = 4096 };

typedef struct env_case {
  const char *name;
  const char *topology; /* the options' topology (NULL: none) */
  reshard_plan_stats_t st[NRANKS];
  int64_t wrong;
  int failures;
} env_case;

static void layouts(reshard_layout_t **src, reshard_layout_t **dst) {
  const int64_t shape[2] = {ROWS, COLS};
  const int n[1] = {NSRC};
  int t, mesh, buf;
  reshard_layout_create(src);
  reshard_layout_add_tensor(*src, "w", RESHARD_FP32, 2, shape, &t);
  reshard_layout_add_mesh_strided(*src, 1, n, 0, 1, &mesh);
  reshard_layout_place(*src, t, mesh, (reshard_placement_t[]){reshard_shard(0)}, &buf);
  reshard_layout_create(dst);
  reshard_layout_add_tensor(*dst, "w", RESHARD_FP32, 2, shape, &t);
  reshard_layout_add_mesh_strided(*dst, 1, n, NSRC, 1, &mesh);
  reshard_layout_place(*dst, t, mesh, (reshard_placement_t[]){reshard_shard(1)}, &buf);
}

typedef struct world {
  const reshard_layout_t *src, *dst;
  env_case *c;
} world;

/* Every rank: the plan under the options below and whatever the
 * environment says, its statistics, and one execute checked element by
 * element (values from global coordinates, bytes outside untouched). */
static int env_rank(int rank, reshard_comm_t *comm, void *arg) {
  world *w = arg;
  reshard_options_t o = RESHARD_OPTIONS_INITIALIZER;
  o.staging_bytes = (size_t)1 << 20;
  o.topology = w->c->topology;
  reshard_plan_t *plan = NULL;
  th_side s, d;
  memset(&s, 0, sizeof s);
  memset(&d, 0, sizeof d);
  int bad = reshard_plan_create(comm, w->src, w->dst, &o, &plan) != RESHARD_SUCCESS;
  bad = bad || reshard_plan_get_stats(plan, &w->c->st[rank]) != RESHARD_SUCCESS;
  bad = bad || th_side_alloc(&s, w->src, rank, 1) || th_side_alloc(&d, w->dst, rank, -1);
  bad = bad || reshard_plan_execute(plan, (void *const *)s.ptr, (size_t)s.nbuf, (void *const *)d.ptr,
                                    (size_t)d.nbuf, NULL) != RESHARD_SUCCESS;
  if (bad) fprintf(stderr, "rank %d: %s\n", rank, reshard_last_error());
  else __atomic_fetch_add(&w->c->wrong, th_side_check(&d, w->dst, rank, 1, w->c->name), __ATOMIC_RELAXED);
  th_side_free(&s);
  th_side_free(&d);
  reshard_plan_destroy(plan);
  return bad;
}

static int run(env_case *c) {
  reshard_layout_t *src, *dst;
  layouts(&src, &dst);
  world w = {src, dst, c};
  c->failures = th_run_ranks(NRANKS, env_rank, &w);
  reshard_layout_destroy(src);
  reshard_layout_destroy(dst);
  return c->failures == 0 && c->wrong == 0;
}

/* Whether every rank's statistics satisfy `ok`, else a line saying so. */
#define EXPECT(c, what, cond)                                                                      \
  do {                                                                                             \
    for (int r_ = 0; r_ < NRANKS; r_++) {                                                          \
      const reshard_plan_stats_t *s = &(c)->st[r_];                                                \
      if (!(cond)) {                                                                               \
        fprintf(stderr, "%s: rank %d: expected %s (staging %zu, chunk %zu, phases %d, pace %d)\n", \
                (c)->name, r_, what, s->staging_bytes, s->chunk_bytes, s->phases, s->pace_rounds); \
        fails++;                                                                                   \
        break;                                                                                     \
      }                                                                                            \
    }                                                                                              \
  } while (0)

int main(int argc, char **argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: params_env control|staging|chunk|max_phases|topology|topology_none\n");
    return 2;
  }
  const char *k = argv[1];
  int fails = 0;
  env_case c = {.name = k, .topology = "h100-8x400g"};
  if (!strcmp(k, "topology")) c.topology = NULL; /* the environment gives it */
  if (!run(&c)) {
    fprintf(stderr, "%s: %d ranks failed, %lld wrong elements\n", k, c.failures, (long long)c.wrong);
    return 1;
  }
  if (!strcmp(k, "control")) {
    /* no variable set: the options' plan, which every case below changes */
    EXPECT(&c, "staging over 64 KiB", s->staging_bytes > 65536);
    EXPECT(&c, "chunks over 8 KiB", s->chunk_bytes > 8192);
    EXPECT(&c, "more than one phase", s->phases > 1);
    EXPECT(&c, "pacing (a topology)", s->pace_rounds > 0);
    env_case none = {.name = "control without a topology", .topology = NULL};
    if (!run(&none)) return 1;
    EXPECT(&none, "no pacing", s->pace_rounds == 0);
  } else if (!strcmp(k, "staging")) { /* RESHARD_STAGING_BYTES=65536 */
    EXPECT(&c, "staging of at most 64 KiB", s->staging_bytes <= 65536);
  } else if (!strcmp(k, "chunk")) { /* RESHARD_CHUNK_BYTES=8192 */
    EXPECT(&c, "chunks of at most 8 KiB", s->chunk_bytes <= 8192);
  } else if (!strcmp(k, "max_phases")) { /* RESHARD_MAX_PHASES=1 */
    EXPECT(&c, "one phase", s->phases == 1);
  } else if (!strcmp(k, "topology")) { /* RESHARD_TOPOLOGY=h100-8x400g, options none */
    EXPECT(&c, "pacing (the variable's topology)", s->pace_rounds > 0);
    EXPECT(&c, "the preset's phases", s->phases > 1);
  } else if (!strcmp(k, "topology_none")) { /* RESHARD_TOPOLOGY=none, options h100 */
    EXPECT(&c, "no pacing", s->pace_rounds == 0);
    EXPECT(&c, "one phase", s->phases == 1);
  } else {
    fprintf(stderr, "params_env: unknown case '%s'\n", k);
    return 2;
  }
  if (!fails) printf("params_env %s: OK\n", k);
  return fails ? 1 : 0;
}
