/* reshard_plan_execute_args, the one execute entry point (issue 43 item
 * 5), and the older forms that are thin wrappers over it:
 *   - execute_args_bad: args that cannot be read as a call (NULL, a
 *     struct_size or version this library does not know, unknown flag
 *     bits, buffers in the fields the flags do not read) are refused with
 *     RESHARD_ERROR_INVALID_ARGUMENT naming the rank and the field, and
 *     change nothing: no byte written, no call number used (the partners'
 *     next call pairs with this rank's next valid one), the plan not
 *     failed;
 *   - execute_args_equivalent: each older form (reshard_plan_execute,
 *     _execute_version, _execute_sized with and without a version) and
 *     the execute_args call it stands for move the same bytes (every
 *     destination element checked against its global coordinates, every
 *     byte outside the fragments left alone, and the two destinations
 *     compared byte for byte) and give the plan the same versions.
 * Ranks run as threads over the in-process transport. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "reshard.h"
#include "support/harness.h"

#define NR 4
#define MSG_LEN 1024

#define RCHECK(problems, rank, cond, ...)                              \
  do {                                                                 \
    if (!(cond)) {                                                     \
      fprintf(stderr, "%s:%d: rank %d: ", __FILE__, __LINE__, rank);   \
      fprintf(stderr, __VA_ARGS__);                                    \
      fprintf(stderr, "\n");                                           \
      (problems)[rank]++;                                              \
    }                                                                  \
  } while (0)

/* Two tensors, two buffers a side, 4 ranks: "a" f32 [8, 4] row-sharded on
 * ranks 0-3 into 2 replicas column-sharded on (0, 1) and (2, 3); "b" bf16
 * [6, 10] replicated on ranks 0-1 (ranks 2-3 hold no source buffer 1)
 * into row shards on ranks 0-3. */
static void layouts(reshard_layout_t **src, reshard_layout_t **dst) {
  int64_t sa[2] = {8, 4}, sb[2] = {6, 10};
  int t, m, b, n4[1] = {4}, n2[1] = {2}, n22[2] = {2, 2};
  assert_int_equal(reshard_layout_create(src), RESHARD_SUCCESS);
  assert_int_equal(reshard_layout_create(dst), RESHARD_SUCCESS);
  assert_int_equal(reshard_layout_add_tensor(*src, "a", RESHARD_FP32, 2, sa, &t), RESHARD_SUCCESS);
  assert_int_equal(reshard_layout_add_mesh_strided(*src, 1, n4, 0, 1, &m), RESHARD_SUCCESS);
  assert_int_equal(reshard_layout_place(*src, t, m, (reshard_placement_t[]){reshard_shard(0)}, &b), RESHARD_SUCCESS);
  assert_int_equal(b, 0);
  assert_int_equal(reshard_layout_add_tensor(*src, "b", RESHARD_BF16, 2, sb, &t), RESHARD_SUCCESS);
  assert_int_equal(reshard_layout_add_mesh_strided(*src, 1, n2, 0, 1, &m), RESHARD_SUCCESS);
  assert_int_equal(reshard_layout_place(*src, t, m, (reshard_placement_t[]){reshard_replicate()}, &b),
                   RESHARD_SUCCESS);
  assert_int_equal(b, 1);
  assert_int_equal(reshard_layout_add_tensor(*dst, "a", RESHARD_FP32, 2, sa, &t), RESHARD_SUCCESS);
  assert_int_equal(reshard_layout_add_mesh_strided(*dst, 2, n22, 0, 1, &m), RESHARD_SUCCESS);
  assert_int_equal(
      reshard_layout_place(*dst, t, m, (reshard_placement_t[]){reshard_replicate(), reshard_shard(1)}, &b),
      RESHARD_SUCCESS);
  assert_int_equal(b, 0);
  assert_int_equal(reshard_layout_add_tensor(*dst, "b", RESHARD_BF16, 2, sb, &t), RESHARD_SUCCESS);
  assert_int_equal(reshard_layout_add_mesh_strided(*dst, 1, n4, 0, 1, &m), RESHARD_SUCCESS);
  assert_int_equal(reshard_layout_place(*dst, t, m, (reshard_placement_t[]){reshard_shard(0)}, &b), RESHARD_SUCCESS);
  assert_int_equal(b, 1);
}

typedef struct xcase {
  const reshard_layout_t *src, *dst;
  int64_t problems[NR];
} xcase;

static reshard_plan_t *make_plan(xcase *x, int rank, reshard_comm_t *comm) {
  reshard_options_t o = RESHARD_OPTIONS_INITIALIZER;
  o.timeout_ms = 20000;
  reshard_plan_t *plan = NULL;
  reshard_result_t r = reshard_plan_create(comm, x->src, x->dst, &o, &plan);
  RCHECK(x->problems, rank, r == RESHARD_SUCCESS, "plan_create: %s", reshard_last_error());
  return plan;
}

static int has(const char *msg, const char *sub) { return strstr(msg, sub) != NULL; }

static void sized(const th_side *s, reshard_buffer_t *out) {
  for (int b = 0; b < s->nbuf; b++) out[b] = (reshard_buffer_t){s->ptr[b], s->bytes[b]};
}

static reshard_plan_status_t status_of(const reshard_plan_t *plan) {
  reshard_plan_status_t st;
  memset(&st, 0, sizeof st);
  st.struct_size = sizeof st;
  if (reshard_plan_get_status(plan, &st) != RESHARD_SUCCESS) st.failed = -1;
  return st;
}

/* ------------------------------------------------------------------ */
/* Bad args: refused, naming rank and field; nothing changes           */
/* ------------------------------------------------------------------ */

/* Rank 1 alone makes every bad call, then every rank one valid call: had
 * any bad call taken its place, rank 1's partners would pair their call
 * with it and fail (REMOTE) instead of receiving. */
static int bad_rank(int rank, reshard_comm_t *comm, void *arg) {
  xcase *x = arg;
  th_side s, ref, d;
  RCHECK(x->problems, rank,
         !th_side_alloc(&s, x->src, rank, 3) && !th_side_alloc(&ref, x->src, rank, 3) &&
             !th_side_alloc(&d, x->dst, rank, -1),
         "th_side_alloc");
  reshard_buffer_t sb[2], db[2];
  sized(&s, sb);
  sized(&d, db);
  reshard_plan_t *plan = make_plan(x, rank, comm);
  if (!plan) return 1;
  reshard_execute_args_t good = RESHARD_EXECUTE_ARGS_INITIALIZER;
  good.flags = RESHARD_EXECUTE_FLAG_EXPLICIT_VERSION;
  good.weight_version = 5;
  good.src = sb, good.num_src = 2, good.dst = db, good.num_dst = 2;
  if (rank == 1) {
    char rk[32];
    snprintf(rk, sizeof rk, "rank %d", rank);
    /* a NULL plan is refused before the args are read */
    reshard_result_t r = reshard_plan_execute_args(NULL, &good);
    RCHECK(x->problems, rank, r == RESHARD_ERROR_INVALID_ARGUMENT && has(reshard_last_error(), "plan is NULL"),
           "NULL plan: %d %s", (int)r, reshard_last_error());
    reshard_execute_args_t bad[10];
    const char *want[10][2] = {
        {"args is NULL", NULL},
        {"args->struct_size 0", "RESHARD_EXECUTE_ARGS_INITIALIZER"},
        {"args->struct_size", "does not match args->version 1"},
        {"args->version 0", "unknown"},
        {"args->version 2", "unknown"},
        {"args->flags 0x5", "(0x4;"},
        {"args->flags 0x80000000", "RESHARD_EXECUTE_FLAG_"},
        {"args->src is set with RESHARD_EXECUTE_FLAG_UNSIZED", NULL},
        {"args->dst is set with RESHARD_EXECUTE_FLAG_UNSIZED", NULL},
        {"args->dst_ptrs is set without RESHARD_EXECUTE_FLAG_UNSIZED", NULL},
    };
    for (int i = 0; i < 10; i++) bad[i] = good;
    bad[1].struct_size = 0;
    bad[2].struct_size = (uint32_t)(sizeof good - sizeof(void *));
    bad[3].version = 0;
    bad[4].version = RESHARD_EXECUTE_ARGS_VERSION + 1;
    bad[5].flags = RESHARD_EXECUTE_FLAG_EXPLICIT_VERSION | 0x4u;
    bad[6].flags = 0x80000000u;
    bad[7].flags = RESHARD_EXECUTE_FLAG_UNSIZED; /* src still set */
    bad[8].flags = RESHARD_EXECUTE_FLAG_UNSIZED, bad[8].src = NULL, bad[8].num_src = 0;
    void *dp[2] = {d.ptr[0], d.ptr[1]};
    bad[9].dst_ptrs = dp; /* sized, and pointers too */
    for (int i = 0; i < 10; i++) {
      r = reshard_plan_execute_args(plan, i == 0 ? NULL : &bad[i]);
      const char *m = reshard_last_error();
      RCHECK(x->problems, rank, r == RESHARD_ERROR_INVALID_ARGUMENT, "bad args %d returned %d (%s)", i, (int)r, m);
      RCHECK(x->problems, rank, has(m, rk), "bad args %d: \"%s\" does not name %s", i, m, rk);
      RCHECK(x->problems, rank, has(m, "nothing done"), "bad args %d: \"nothing done\" not in \"%s\"", i, m);
      for (int k = 0; k < 2 && want[i][k]; k++)
        RCHECK(x->problems, rank, has(m, want[i][k]), "bad args %d: \"%s\" not in \"%s\"", i, want[i][k], m);
      RCHECK(x->problems, rank, th_side_written(&d) == 0, "bad args %d wrote destination bytes", i);
      RCHECK(x->problems, rank, th_sides_equal(&s, &ref), "bad args %d changed source bytes", i);
      reshard_plan_status_t st = status_of(plan);
      RCHECK(x->problems, rank, st.failed == 0 && st.executes_completed == 0 && st.committed_version == 0,
             "bad args %d changed the plan: failed %d, completed %llu, committed %llu", i, st.failed,
             (unsigned long long)st.executes_completed, (unsigned long long)st.committed_version);
    }
  }
  /* every rank: the valid call pairs with every partner's and delivers */
  reshard_result_t r = reshard_plan_execute_args(plan, &good);
  RCHECK(x->problems, rank, r == RESHARD_SUCCESS, "valid call after the bad ones: %d %s", (int)r,
         reshard_last_error());
  RCHECK(x->problems, rank, th_side_check(&d, x->dst, rank, 3, "execute_args_bad") == 0, "data wrong");
  reshard_plan_status_t st = status_of(plan);
  RCHECK(x->problems, rank, st.failed == 0 && st.executes_completed == 1 && st.committed_version == 5,
         "after the valid call: failed %d, completed %llu, committed %llu", st.failed,
         (unsigned long long)st.executes_completed, (unsigned long long)st.committed_version);
  reshard_plan_destroy(plan);
  th_side_free(&s);
  th_side_free(&ref);
  th_side_free(&d);
  return 0;
}

/* Runs fn on NR ranks over the file's layouts; every rank's problems 0. */
static void run_case(th_rank_fn fn) {
  reshard_layout_t *src, *dst;
  layouts(&src, &dst);
  xcase x;
  memset(&x, 0, sizeof x);
  x.src = src;
  x.dst = dst;
  assert_int_equal(th_run_ranks(NR, fn, &x), 0);
  for (int r = 0; r < NR; r++) assert_int_equal(x.problems[r], 0);
  reshard_layout_destroy(src);
  reshard_layout_destroy(dst);
}

static void execute_args_bad(void **state) {
  (void)state;
  run_case(bad_rank);
}

/* ------------------------------------------------------------------ */
/* Equivalence: each older form and its execute_args call              */
/* ------------------------------------------------------------------ */

/* Call k of the plan (k = 0..7): even k an older form, k + 1 the
 * execute_args call it stands for, both with the sources of step k / 2
 * and fresh sentinel destinations. */
static reshard_result_t call_form(const reshard_plan_t *plan, int k, const th_side *s, const th_side *d) {
  void *sp[2] = {s->ptr[0], s->ptr[1]}, *dp[2] = {d->ptr[0], d->ptr[1]};
  reshard_buffer_t sb[2], db[2];
  sized(s, sb);
  sized(d, db);
  reshard_execute_args_t a = RESHARD_EXECUTE_ARGS_INITIALIZER;
  switch (k) {
    case 0: return reshard_plan_execute(plan, sp, 2, dp, 2, NULL);
    case 1: a.flags = RESHARD_EXECUTE_FLAG_UNSIZED, a.src_ptrs = sp, a.dst_ptrs = dp; break;
    case 2: return reshard_plan_execute_version(plan, 10, sp, 2, dp, 2, NULL);
    case 3:
      a.flags = RESHARD_EXECUTE_FLAG_UNSIZED | RESHARD_EXECUTE_FLAG_EXPLICIT_VERSION, a.weight_version = 11;
      a.src_ptrs = sp, a.dst_ptrs = dp;
      break;
    case 4: return reshard_plan_execute_sized(plan, 0, sb, 2, db, 2, NULL);
    case 5: a.src = sb, a.dst = db; break;
    case 6: return reshard_plan_execute_sized(plan, 20, sb, 2, db, 2, NULL);
    case 7:
      a.flags = RESHARD_EXECUTE_FLAG_EXPLICIT_VERSION, a.weight_version = 21;
      a.src = sb, a.dst = db;
      break;
    default: return RESHARD_ERROR_INTERNAL;
  }
  a.num_src = 2, a.num_dst = 2;
  return reshard_plan_execute_args(plan, &a);
}

/* the committed version after call k: plain calls count on from the last */
static const uint64_t committed_after[8] = {1, 2, 10, 11, 12, 13, 20, 21};

static int equivalent_rank(int rank, reshard_comm_t *comm, void *arg) {
  xcase *x = arg;
  reshard_plan_t *plan = make_plan(x, rank, comm);
  if (!plan) return 1;
  th_side old_d;
  memset(&old_d, 0, sizeof old_d);
  for (int k = 0; k < 8; k++) {
    const uint64_t step = (uint64_t)k / 2;
    th_side s, d;
    RCHECK(x->problems, rank, !th_side_alloc(&s, x->src, rank, (int64_t)step) && !th_side_alloc(&d, x->dst, rank, -1),
           "th_side_alloc");
    reshard_result_t r = call_form(plan, k, &s, &d);
    RCHECK(x->problems, rank, r == RESHARD_SUCCESS, "form %d: %d %s", k, (int)r, reshard_last_error());
    char label[32];
    snprintf(label, sizeof label, "form %d", k);
    RCHECK(x->problems, rank, th_side_check(&d, x->dst, rank, step, label) == 0, "form %d: data wrong", k);
    reshard_plan_status_t st = status_of(plan);
    RCHECK(x->problems, rank,
           st.failed == 0 && st.executes_completed == (uint64_t)k + 1 && st.committed_version == committed_after[k],
           "form %d: failed %d, completed %llu, committed %llu (expected %llu)", k, st.failed,
           (unsigned long long)st.executes_completed, (unsigned long long)st.committed_version,
           (unsigned long long)committed_after[k]);
    th_side_free(&s);
    if (k % 2 == 0) {
      old_d = d;
    } else {
      RCHECK(x->problems, rank, th_sides_equal(&old_d, &d), "form %d and form %d wrote different bytes", k - 1, k);
      th_side_free(&old_d);
      th_side_free(&d);
      memset(&old_d, 0, sizeof old_d);
    }
  }
  reshard_plan_destroy(plan);
  return 0;
}

static void execute_args_equivalent(void **state) {
  (void)state;
  run_case(equivalent_rank);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(execute_args_bad),
      cmocka_unit_test(execute_args_equivalent),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
