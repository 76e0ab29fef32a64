/* Bad input: every malformed call returns its specific result code, a
 * reshard_last_error() detail that names the tensor, rank and/or field at
 * fault, and changes nothing (layouts keep their contents, output ids and
 * destination bytes are not written, nothing leaks: run under ASan).
 * Collective calls run every rank as a thread and check that each rank
 * returns, with the code that rank should see. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/clock.h"
#include "layout/layout.h"
#include "reshard.h"
#include "reshard_inproc.h"
#include "support/harness.h"

#define MAXR 8
#define MSG_LEN 1024

#define IA RESHARD_ERROR_INVALID_ARGUMENT
#define IU RESHARD_ERROR_INVALID_USAGE

/* ------------------------------------------------------------------ */
/* Checking helpers                                                    */
/* ------------------------------------------------------------------ */

/* Code and substrings of a message; prints everything on a miss so that
 * the failure explains itself. */
static int check_result(const char *where, int line, const char *expr,
                        reshard_result_t got, const char *msg,
                        reshard_result_t want, const char *const *subs) {
  int ok = got == want;
  for (int i = 0; subs[i]; i++)
    if (!strstr(msg, subs[i])) ok = 0;
  if (!ok) {
    print_error("%s:%d: %s\n  returned %d (%s), expected %d (%s)\n  last error: \"%s\"\n  wanted substrings:", where,
                line, expr, (int)got, reshard_result_string(got), (int)want, reshard_result_string(want), msg);
    for (int i = 0; subs[i]; i++) print_error(" \"%s\"%s", subs[i], strstr(msg, subs[i]) ? "" : " (MISSING)");
    print_error("\n");
  }
  return ok;
}

/* Runs `call` once and checks its code and reshard_last_error(). */
#define EXPECT_ERR(want, call, ...)                                                              \
  do {                                                                                           \
    reshard_result_t r_ = (call);                                                                \
    if (!check_result(__FILE__, __LINE__, #call, r_, reshard_last_error(), (want),               \
                      (const char *const[]){__VA_ARGS__, NULL}))                                 \
      fail();                                                                                    \
  } while (0)

#define EXPECT_OK(call)                                                                          \
  do {                                                                                           \
    reshard_result_t r_ = (call);                                                                \
    if (r_ != RESHARD_SUCCESS) {                                                                 \
      print_error("%s:%d: %s failed: %s: %s\n", __FILE__, __LINE__, #call, reshard_result_string(r_), \
                  reshard_last_error());                                                         \
      fail();                                                                                    \
    }                                                                                            \
  } while (0)

/* Everything a failed builder call must leave as it was. */
typedef struct snap {
  int ntensors, nmeshes, nparts, nbuffers, nraws, public_buffers;
  int64_t tensor_parts, tensor_raws, buffer_raws;
  uint64_t digest;
} snap;

static snap take_snap(const reshard_layout_t *L) {
  snap s;
  memset(&s, 0, sizeof s);
  s.ntensors = L->ntensors;
  s.nmeshes = L->nmeshes;
  s.nparts = L->nparts;
  s.nbuffers = L->nbuffers;
  s.nraws = L->nraws;
  s.public_buffers = reshard_layout_num_buffers(L);
  for (int i = 0; i < L->ntensors; i++) {
    s.tensor_parts += L->tensors[i].nparts;
    s.tensor_raws += L->tensors[i].nraws;
  }
  for (int i = 0; i < L->nbuffers; i++) s.buffer_raws += L->buffers[i].nraws;
  s.digest = rs_layout_digest(L, 0);
  return s;
}

static void assert_unchanged(const reshard_layout_t *L, const snap *before) {
  snap now = take_snap(L);
  assert_int_equal(now.ntensors, before->ntensors);
  assert_int_equal(now.nmeshes, before->nmeshes);
  assert_int_equal(now.nparts, before->nparts);
  assert_int_equal(now.nbuffers, before->nbuffers);
  assert_int_equal(now.nraws, before->nraws);
  assert_int_equal(now.public_buffers, before->public_buffers);
  assert_int_equal(now.tensor_parts, before->tensor_parts);
  assert_int_equal(now.tensor_raws, before->tensor_raws);
  assert_int_equal(now.buffer_raws, before->buffer_raws);
  assert_true(now.digest == before->digest);
}

static reshard_layout_t *new_layout(void) {
  reshard_layout_t *L = NULL;
  assert_int_equal(reshard_layout_create(&L), RESHARD_SUCCESS);
  assert_non_null(L);
  return L;
}

static int add_t2(reshard_layout_t *L, const char *name, reshard_dtype_t dt,
                  int64_t d0, int64_t d1) {
  int64_t shape[2] = {d0, d1};
  int id = -1;
  EXPECT_OK(reshard_layout_add_tensor(L, name, dt, 2, shape, &id));
  return id;
}

static int add_t1(reshard_layout_t *L, const char *name, reshard_dtype_t dt,
                  int64_t d0) {
  int id = -1;
  EXPECT_OK(reshard_layout_add_tensor(L, name, dt, 1, &d0, &id));
  return id;
}

static int add_mesh1(reshard_layout_t *L, int n, int start) {
  int id = -1;
  EXPECT_OK(reshard_layout_add_mesh_strided(L, 1, &n, start, 1, &id));
  return id;
}

static int place1(reshard_layout_t *L, int t, int m, reshard_placement_t p) {
  int id = -1;
  EXPECT_OK(reshard_layout_place(L, t, m, &p, &id));
  return id;
}

/* ------------------------------------------------------------------ */
/* Layout calls                                                        */
/* ------------------------------------------------------------------ */

static void layout_tensor_errors(void **state) {
  (void)state;
  EXPECT_ERR(IA, reshard_layout_create(NULL), "layout is NULL");
  reshard_layout_t *L = new_layout();
  int64_t ok2[2] = {4, 4};
  int id = -7;
  EXPECT_OK(reshard_layout_add_tensor(L, "base", RESHARD_FP32, 2, ok2, &id));
  assert_int_equal(id, 0);
  assert_string_equal(reshard_last_error(), "");
  snap s = take_snap(L);

  id = -7;
  EXPECT_ERR(IA, reshard_layout_add_tensor(NULL, "x", RESHARD_FP32, 2, ok2, &id), "add_tensor", "layout is NULL");
  EXPECT_ERR(IA, reshard_layout_add_tensor(L, NULL, RESHARD_FP32, 2, ok2, &id), "add_tensor", "name");
  EXPECT_ERR(IA, reshard_layout_add_tensor(L, "", RESHARD_FP32, 2, ok2, &id), "add_tensor", "name");
  EXPECT_ERR(IA, reshard_layout_add_tensor(L, "x", RESHARD_FP32, 2, NULL, &id), "tensor 'x'", "shape is NULL");
  int64_t neg[2] = {4, -1};
  EXPECT_ERR(IA, reshard_layout_add_tensor(L, "x", RESHARD_FP32, 2, neg, &id), "tensor 'x'", "shape[1]", "-1",
             "negative");
  int64_t huge[2] = {INT64_MAX / 2, 4};
  EXPECT_ERR(IA, reshard_layout_add_tensor(L, "x", RESHARD_FP32, 2, huge, &id), "tensor 'x'", "byte size",
             "overflows");
  /* the overflow may only show at the last dim */
  int64_t huge2[3] = {1 << 20, 1 << 20, 1 << 22};
  EXPECT_ERR(IA, reshard_layout_add_tensor(L, "x", RESHARD_FP64, 3, huge2, &id), "tensor 'x'", "overflows",
             "shape[2]");
  int64_t nine[9] = {1, 1, 1, 1, 1, 1, 1, 1, 1};
  EXPECT_ERR(IA, reshard_layout_add_tensor(L, "x", RESHARD_FP32, 9, nine, &id), "tensor 'x'", "ndim 9");
  EXPECT_ERR(IA, reshard_layout_add_tensor(L, "x", RESHARD_FP32, -1, nine, &id), "tensor 'x'", "ndim -1");
  EXPECT_ERR(IA, reshard_layout_add_tensor(L, "x", (reshard_dtype_t)RESHARD_NUM_DTYPES, 2, ok2, &id), "tensor 'x'",
             "dtype 13");
  EXPECT_ERR(IA, reshard_layout_add_tensor(L, "x", (reshard_dtype_t)-1, 2, ok2, &id), "tensor 'x'", "dtype -1");
  EXPECT_ERR(IA, reshard_layout_add_tensor(L, "base", RESHARD_FP32, 2, ok2, &id), "tensor 'base'", "already");
  /* a duplicate with another dtype/shape is still a duplicate */
  EXPECT_ERR(IA, reshard_layout_add_tensor(L, "base", RESHARD_BF16, 1, ok2, &id), "tensor 'base'", "already");
  assert_int_equal(id, -7);
  assert_unchanged(L, &s);

  /* find_tensor */
  EXPECT_ERR(IA, reshard_layout_find_tensor(NULL, "base", &id), "find_tensor");
  EXPECT_ERR(IA, reshard_layout_find_tensor(L, NULL, &id), "find_tensor");
  EXPECT_ERR(IA, reshard_layout_find_tensor(L, "base", NULL), "find_tensor");
  EXPECT_ERR(IA, reshard_layout_find_tensor(L, "nope", &id), "find_tensor", "'nope'");
  EXPECT_ERR(IA, reshard_layout_find_tensor(L, "x", &id), "'x'"); /* the failed adds left no trace */
  assert_int_equal(id, -7);

  /* a later valid call still works and takes the next id */
  EXPECT_OK(reshard_layout_add_tensor(L, "x", RESHARD_FP32, 2, ok2, &id));
  assert_int_equal(id, 1);
  assert_string_equal(reshard_last_error(), "");
  EXPECT_OK(reshard_layout_add_tensor(L, "scalar", RESHARD_FP32, 0, NULL, &id));
  assert_int_equal(id, 2);
  int found = -1;
  EXPECT_OK(reshard_layout_find_tensor(L, "x", &found));
  assert_int_equal(found, 1);
  reshard_layout_destroy(L);
  reshard_layout_destroy(NULL);
}

static void layout_mesh_errors(void **state) {
  (void)state;
  reshard_layout_t *L = new_layout();
  snap s = take_snap(L);
  int sh1[1] = {4}, sh2[2] = {2, 2};
  int rk4[4] = {0, 1, 2, 3};
  int id = -7;
  EXPECT_ERR(IA, reshard_layout_add_mesh(NULL, 1, sh1, rk4, &id), "add_mesh", "layout is NULL");
  EXPECT_ERR(IA, reshard_layout_add_mesh_strided(NULL, 1, sh1, 0, 1, &id), "add_mesh", "layout is NULL");
  EXPECT_ERR(IA, reshard_layout_add_mesh(L, 0, sh1, rk4, &id), "mesh 0", "ndim 0");
  EXPECT_ERR(IA, reshard_layout_add_mesh_strided(L, 0, sh1, 0, 1, &id), "mesh 0", "ndim 0");
  EXPECT_ERR(IA, reshard_layout_add_mesh_strided(L, -1, sh1, 0, 1, &id), "mesh 0", "ndim -1");
  int sh9[9] = {1, 1, 1, 1, 1, 1, 1, 1, 1};
  EXPECT_ERR(IA, reshard_layout_add_mesh_strided(L, 9, sh9, 0, 1, &id), "mesh 0", "ndim 9");
  EXPECT_ERR(IA, reshard_layout_add_mesh(L, 1, NULL, rk4, &id), "mesh 0", "shape is NULL");
  EXPECT_ERR(IA, reshard_layout_add_mesh(L, 1, sh1, NULL, &id), "ranks is NULL");
  int zero[2] = {2, 0}, negsh[1] = {-3};
  EXPECT_ERR(IA, reshard_layout_add_mesh_strided(L, 2, zero, 0, 1, &id), "mesh 0", "shape[1] = 0");
  EXPECT_ERR(IA, reshard_layout_add_mesh_strided(L, 1, negsh, 0, 1, &id), "mesh 0", "shape[0] = -3");
  int big[2] = {65536, 65536};
  EXPECT_ERR(IA, reshard_layout_add_mesh_strided(L, 2, big, 0, 1, &id), "mesh 0", "2^31");
  int negrk[4] = {0, 1, -1, 3};
  EXPECT_ERR(IA, reshard_layout_add_mesh(L, 1, sh1, negrk, &id), "mesh 0", "rank -1", "position 2");
  EXPECT_ERR(IA, reshard_layout_add_mesh_strided(L, 1, sh1, -2, 1, &id), "mesh 0", "rank -2", "position 0");
  EXPECT_ERR(IA, reshard_layout_add_mesh_strided(L, 1, sh1, 1, -1, &id), "mesh 0", "rank -1", "position 2");
  EXPECT_ERR(IA, reshard_layout_add_mesh_strided(L, 1, sh1, INT32_MAX - 1, 1, &id), "mesh 0", "too large");
  int twice[4] = {0, 1, 2, 1};
  EXPECT_ERR(IA, reshard_layout_add_mesh(L, 2, sh2, twice, &id), "mesh 0", "rank 1 appears twice");
  EXPECT_ERR(IA, reshard_layout_add_mesh_strided(L, 1, sh1, 5, 0, &id), "mesh 0", "rank 5 appears twice");
  assert_int_equal(id, -7);
  assert_unchanged(L, &s);

  EXPECT_OK(reshard_layout_add_mesh(L, 2, sh2, rk4, &id));
  assert_int_equal(id, 0);
  EXPECT_OK(reshard_layout_add_mesh_strided(L, 1, sh1, 4, 1, &id));
  assert_int_equal(id, 1);
  /* the next failure names the next mesh */
  EXPECT_ERR(IA, reshard_layout_add_mesh(L, 2, sh2, twice, &id), "mesh 2", "appears twice");
  assert_int_equal(id, 1);
  reshard_layout_destroy(L);
}

static void layout_place_errors(void **state) {
  (void)state;
  reshard_layout_t *L = new_layout();
  int w = add_t2(L, "w", RESHARD_FP32, 8, 6);
  int sc = -1;
  EXPECT_OK(reshard_layout_add_tensor(L, "sc", RESHARD_FP32, 0, NULL, &sc));
  int m1 = add_mesh1(L, 4, 0);
  int sh2[2] = {2, 2}, m2 = -1;
  EXPECT_OK(reshard_layout_add_mesh_strided(L, 2, sh2, 0, 1, &m2));
  snap s = take_snap(L);
  int id = -7;

  reshard_placement_t p1[1] = {reshard_shard(0)};
  EXPECT_ERR(IA, reshard_layout_place(NULL, w, m1, p1, &id), "layout is NULL");
  EXPECT_ERR(IA, reshard_layout_place(L, 5, m1, p1, &id), "tensor_id");
  EXPECT_ERR(IA, reshard_layout_place(L, -1, m1, p1, &id), "tensor_id");
  EXPECT_ERR(IA, reshard_layout_place(L, w, 7, p1, &id), "tensor 'w'", "mesh_id 7");
  EXPECT_ERR(IA, reshard_layout_place(L, w, -1, p1, &id), "tensor 'w'", "mesh_id -1");
  EXPECT_ERR(IA, reshard_layout_place(L, w, m1, NULL, &id), "tensor 'w'", "placements is NULL");
  reshard_placement_t badkind[1] = {{(reshard_placement_kind_t)5, 0, NULL}};
  EXPECT_ERR(IA, reshard_layout_place(L, w, m1, badkind, &id), "tensor 'w'", "mesh axis 0", "kind 5");
  reshard_placement_t baddim[1] = {reshard_shard(2)};
  EXPECT_ERR(IA, reshard_layout_place(L, w, m1, baddim, &id), "tensor 'w'", "mesh axis 0", "dim 2");
  reshard_placement_t negdim[1] = {reshard_shard(-1)};
  EXPECT_ERR(IA, reshard_layout_place(L, w, m1, negdim, &id), "tensor 'w'", "mesh axis 0", "dim -1");
  reshard_placement_t axis1[2] = {reshard_replicate(), reshard_shard(3)};
  EXPECT_ERR(IA, reshard_layout_place(L, w, m2, axis1, &id), "tensor 'w'", "mesh axis 1", "dim 3");
  reshard_placement_t axis1k[2] = {reshard_shard(0), {(reshard_placement_kind_t)-1, 0, NULL}};
  EXPECT_ERR(IA, reshard_layout_place(L, w, m2, axis1k, &id), "tensor 'w'", "mesh axis 1", "kind -1");
  int64_t negsplit[4] = {4, 5, -1, 0};
  reshard_placement_t ps[1] = {reshard_shard_sizes(0, negsplit)};
  EXPECT_ERR(IA, reshard_layout_place(L, w, m1, ps, &id), "tensor 'w'", "split_sizes[2]", "mesh axis 0", "negative");
  EXPECT_ERR(IA, reshard_layout_place(L, sc, m1, p1, &id), "tensor 'sc'", "dim 0");
  assert_int_equal(id, -7);
  assert_unchanged(L, &s);

  reshard_placement_t good[2] = {reshard_shard(0), reshard_shard(1)};
  EXPECT_OK(reshard_layout_place(L, w, m2, good, &id));
  assert_int_equal(id, 0);
  assert_int_equal(reshard_layout_num_buffers(L), 1);
  reshard_layout_destroy(L);
}

static void layout_fused_errors(void **state) {
  (void)state;
  reshard_layout_t *L = new_layout();
  int q = add_t2(L, "q", RESHARD_FP32, 8, 4);
  int k = add_t2(L, "k", RESHARD_FP32, 4, 4);
  int64_t s3[3] = {4, 4, 2};
  int v3 = -1;
  EXPECT_OK(reshard_layout_add_tensor(L, "v3", RESHARD_FP32, 3, s3, &v3));
  int h = add_t2(L, "h", RESHARD_BF16, 4, 4);
  int g = add_t2(L, "g", RESHARD_FP32, 6, 4);
  int m = add_mesh1(L, 2, 0);
  int m2 = add_mesh1(L, 2, 2);
  reshard_placement_t sh0[1] = {reshard_shard(0)};
  snap s = take_snap(L);
  int id = -7;

  reshard_part_t two_nd[2] = {{q, m, sh0, NULL}, {v3, m, sh0, NULL}};
  EXPECT_ERR(IA, reshard_layout_add_fused(L, "qkv", 0, 1, 2, two_nd, &id), "buffer 'qkv'", "'v3'", "3 dims",
             "'q'");
  reshard_part_t two_es[2] = {{q, m, sh0, NULL}, {h, m, sh0, NULL}};
  EXPECT_ERR(IA, reshard_layout_add_fused(L, "qkv", 0, 1, 2, two_es, &id), "buffer 'qkv'", "'h'", "element size");
  reshard_part_t grouped[2] = {{q, m, sh0, NULL}, {g, m, sh0, NULL}};
  EXPECT_ERR(IA, reshard_layout_add_fused(L, "qkv", 0, 4, 2, grouped, &id), "tensor 'g'", "dim 0", "not divisible",
             "4 groups");
  int64_t small[2] = {6, 4};
  reshard_part_t padded[2] = {{q, m, sh0, small}, {k, m, sh0, NULL}};
  EXPECT_ERR(IA, reshard_layout_add_fused(L, "qkv", 0, 1, 2, padded, &id), "tensor 'q'", "padded_shape[0]",
             "smaller");
  reshard_part_t ok2[2] = {{q, m, sh0, NULL}, {k, m, sh0, NULL}};
  EXPECT_ERR(IA, reshard_layout_add_fused(NULL, "qkv", 0, 1, 2, ok2, &id), "layout is NULL");
  EXPECT_ERR(IA, reshard_layout_add_fused(L, "qkv", 0, 1, 0, ok2, &id), "buffer 'qkv'", "at least one part");
  EXPECT_ERR(IA, reshard_layout_add_fused(L, "qkv", 0, 1, 2, NULL, &id), "buffer 'qkv'", "at least one part");
  EXPECT_ERR(IA, reshard_layout_add_fused(L, "qkv", 0, 0, 2, ok2, &id), "buffer 'qkv'", "num_groups 0");
  EXPECT_ERR(IA, reshard_layout_add_fused(L, "qkv", 2, 1, 2, ok2, &id), "buffer 'qkv'", "concat_dim 2");
  EXPECT_ERR(IA, reshard_layout_add_fused(L, "qkv", -1, 1, 2, ok2, &id), "buffer 'qkv'", "concat_dim -1");
  reshard_part_t dup[2] = {{q, m, sh0, NULL}, {q, m, sh0, NULL}};
  EXPECT_ERR(IA, reshard_layout_add_fused(L, "qkv", 0, 1, 2, dup, &id), "buffer 'qkv'", "'q'", "appears twice");
  reshard_part_t badt[2] = {{q, m, sh0, NULL}, {42, m, sh0, NULL}};
  EXPECT_ERR(IA, reshard_layout_add_fused(L, "qkv", 0, 1, 2, badt, &id), "buffer 'qkv'", "part 1", "tensor_id 42");
  reshard_part_t badm[2] = {{q, m, sh0, NULL}, {k, 9, sh0, NULL}};
  EXPECT_ERR(IA, reshard_layout_add_fused(L, "qkv", 0, 1, 2, badm, &id), "tensor 'k'", "mesh_id 9");
  reshard_part_t twomesh[2] = {{q, m, sh0, NULL}, {k, m2, sh0, NULL}};
  EXPECT_ERR(IA, reshard_layout_add_fused(L, "qkv", 0, 2, 2, twomesh, &id), "buffer 'qkv'", "share one mesh");
  /* a part error after a valid first part must not leave the first behind */
  reshard_placement_t bad1[1] = {reshard_shard(5)};
  reshard_part_t late[2] = {{q, m, sh0, NULL}, {k, m, bad1, NULL}};
  EXPECT_ERR(IA, reshard_layout_add_fused(L, "qkv", 0, 1, 2, late, &id), "tensor 'k'", "dim 5");
  assert_int_equal(id, -7);
  assert_unchanged(L, &s);

  EXPECT_OK(reshard_layout_add_fused(L, "qkv", 0, 1, 2, ok2, &id));
  assert_int_equal(id, 0);
  reshard_part_t grp_ok[2] = {{q, m, sh0, NULL}, {k, m, sh0, NULL}};
  EXPECT_OK(reshard_layout_add_fused(L, "qk_grouped", 0, 2, 2, grp_ok, &id));
  assert_int_equal(id, 1);
  reshard_layout_destroy(L);
}

static void layout_raw_errors(void **state) {
  (void)state;
  reshard_layout_t *L = new_layout();
  int w = add_t2(L, "w", RESHARD_FP32, 4, 4);
  int m = add_mesh1(L, 2, 0);
  int fused = place1(L, w, m, reshard_shard(0));
  int id = -7;
  snap s = take_snap(L);
  EXPECT_ERR(IA, reshard_layout_add_buffer(NULL, "r", 0, 64, &id), "layout is NULL");
  EXPECT_ERR(IA, reshard_layout_add_buffer(L, "r", -1, 64, &id), "buffer 'r'", "rank -1");
  EXPECT_ERR(IA, reshard_layout_add_buffer(L, "r", 0, (size_t)INT64_MAX + 1, &id), "buffer 'r'", "too large");
  assert_int_equal(id, -7);
  assert_unchanged(L, &s);

  int raw = -1;
  EXPECT_OK(reshard_layout_add_buffer(L, "r", 1, 64, &raw));
  assert_int_equal(raw, 1);
  s = take_snap(L);

  int64_t st[2] = {0, 0}, ex[2] = {2, 4};
  reshard_fragment_t f = {w, raw, st, ex, 0, NULL};
  EXPECT_ERR(IA, reshard_layout_add_fragment(NULL, &f), "add_fragment");
  EXPECT_ERR(IA, reshard_layout_add_fragment(L, NULL), "add_fragment");
  /* f with one field wrong: the rows vary which and how */
  int64_t st_out[2] = {3, 0}, st_neg[2] = {0, -1}, ex_neg[2] = {-1, 4}, st_ovf[2] = {0, 1}, ex_ovf[2] = {1, INT64_MAX};
  const struct {
    const char *name;
    reshard_fragment_t f;
    const char *subs[5];
  } bad[] = {
      {"tensor_id 9", {9, raw, st, ex, 0, NULL}, {"tensor_id 9"}},
      {"buffer_id 5", {w, 5, st, ex, 0, NULL}, {"tensor 'w'", "buffer_id 5"}},
      /* explicit fragments go into raw buffers only */
      {"fused buffer", {w, fused, st, ex, 0, NULL}, {"tensor 'w'", "buffer_id 0", "raw buffer"}},
      {"start NULL", {w, raw, NULL, ex, 0, NULL}, {"tensor 'w'", "rank 1", "start or extent is NULL"}},
      {"extent NULL", {w, raw, st, NULL, 0, NULL}, {"tensor 'w'", "rank 1", "start or extent is NULL"}},
      {"rows [3, 5) of 4", {w, raw, st_out, ex, 0, NULL}, {"tensor 'w'", "rank 1", "dim 0", "outside"}},
      {"start -1", {w, raw, st_neg, ex, 0, NULL}, {"tensor 'w'", "rank 1", "dim 1", "outside"}},
      {"extent -1", {w, raw, st, ex_neg, 0, NULL}, {"tensor 'w'", "rank 1", "dim 0", "outside"}},
      {"end overflows", {w, raw, st_ovf, ex_ovf, 0, NULL}, {"tensor 'w'", "rank 1", "dim 1", "outside"}},
      {"byte_offset", {w, raw, st, ex, (size_t)INT64_MAX + 1, NULL}, {"tensor 'w'", "rank 1", "byte_offset"}},
  };
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
    reshard_result_t r = reshard_layout_add_fragment(L, &bad[i].f);
    if (!check_result(__FILE__, __LINE__, bad[i].name, r, reshard_last_error(), IA, bad[i].subs)) fail();
  }
  assert_unchanged(L, &s);

  EXPECT_OK(reshard_layout_add_fragment(L, &f));
  snap after = take_snap(L);
  assert_int_equal(after.nraws, s.nraws + 1);
  reshard_layout_destroy(L);
}

static void layout_query_errors(void **state) {
  (void)state;
  reshard_layout_t *L = new_layout();
  int w = add_t2(L, "w", RESHARD_FP32, 4, 4);
  int m = add_mesh1(L, 2, 0);
  int b = place1(L, w, m, reshard_shard(0));
  size_t bytes = 12345, count = 12345;
  EXPECT_ERR(IA, reshard_layout_buffer_bytes(NULL, b, 0, &bytes), "buffer_bytes");
  EXPECT_ERR(IA, reshard_layout_buffer_bytes(L, b, 0, NULL), "buffer_bytes");
  EXPECT_ERR(IA, reshard_layout_buffer_bytes(L, 3, 0, &bytes), "buffer_bytes", "buffer_id 3");
  EXPECT_ERR(IA, reshard_layout_buffer_bytes(L, -1, 0, &bytes), "buffer_bytes", "buffer_id -1");
  EXPECT_ERR(IA, reshard_layout_buffer_bytes(L, b, -2, &bytes), "buffer_bytes", "rank -2");
  assert_int_equal(bytes, 12345);
  reshard_fragment_info_t info[2];
  EXPECT_ERR(IA, reshard_layout_fragments(NULL, 0, info, 2, &count), "layout_fragments");
  EXPECT_ERR(IA, reshard_layout_fragments(L, 0, info, 2, NULL), "layout_fragments");
  EXPECT_ERR(IA, reshard_layout_fragments(L, 0, NULL, 2, &count), "layout_fragments");
  EXPECT_ERR(IA, reshard_layout_fragments(L, -1, info, 2, &count), "layout_fragments", "rank -1");
  assert_int_equal(count, 12345);
  assert_int_equal(reshard_layout_num_buffers(NULL), 0);
  EXPECT_OK(reshard_layout_buffer_bytes(L, b, 1, &bytes));
  assert_int_equal(bytes, 2 * 4 * 4);
  EXPECT_OK(reshard_layout_fragments(L, 1, NULL, 0, &count));
  assert_int_equal(count, 1);
  reshard_layout_destroy(L);
}

/* ------------------------------------------------------------------ */
/* Strings, dtypes, versions                                           */
/* ------------------------------------------------------------------ */

static void strings_and_versions(void **state) {
  (void)state;
  const char *seen[RESHARD_NUM_RESULTS];
  for (int r = 0; r < RESHARD_NUM_RESULTS; r++) {
    seen[r] = reshard_result_string((reshard_result_t)r);
    assert_non_null(seen[r]);
    assert_true(strlen(seen[r]) > 0);
    for (int j = 0; j < r; j++)
      if (!strcmp(seen[j], seen[r])) fail_msg("results %d and %d share the string \"%s\"", j, r, seen[r]);
  }
  assert_non_null(reshard_result_string(RESHARD_NUM_RESULTS));
  assert_non_null(reshard_result_string((reshard_result_t)-1));
  assert_non_null(reshard_result_string((reshard_result_t)1000));

  const int bad_dtypes[] = {-1, RESHARD_NUM_DTYPES, RESHARD_NUM_DTYPES + 1, 1000, INT32_MIN};
  for (size_t i = 0; i < sizeof bad_dtypes / sizeof *bad_dtypes; i++) {
    assert_int_equal(reshard_dtype_size((reshard_dtype_t)bad_dtypes[i]), 0);
    assert_string_equal(reshard_dtype_name((reshard_dtype_t)bad_dtypes[i]), "invalid");
  }
  for (int d = 0; d < RESHARD_NUM_DTYPES; d++) {
    assert_true(reshard_dtype_size((reshard_dtype_t)d) > 0);
    assert_string_not_equal(reshard_dtype_name((reshard_dtype_t)d), "invalid");
    for (int j = 0; j < d; j++)
      assert_string_not_equal(reshard_dtype_name((reshard_dtype_t)j), reshard_dtype_name((reshard_dtype_t)d));
  }
  assert_int_equal(reshard_version(), RESHARD_VERSION);
  assert_int_equal(RESHARD_VERSION,
                   RESHARD_VERSION_CODE(RESHARD_VERSION_MAJOR, RESHARD_VERSION_MINOR, RESHARD_VERSION_PATCH));

  /* the in-process world's own argument checks */
  reshard_inproc_world_t *w = (reshard_inproc_world_t *)&w;
  EXPECT_ERR(IA, reshard_inproc_world_create(0, &w), "nranks = 0");
  assert_null(w);
  EXPECT_ERR(IA, reshard_inproc_world_create(2, NULL), "world");
  EXPECT_OK(reshard_inproc_world_create(2, &w));
  reshard_comm_t *c = (reshard_comm_t *)&c;
  EXPECT_ERR(IA, reshard_comm_create_inproc(w, 2, &c), "rank 2", "out of range");
  assert_null(c);
  EXPECT_ERR(IA, reshard_comm_create_inproc(NULL, 0, &c), "world is NULL");
  EXPECT_ERR(IA, reshard_comm_create_inproc(w, 0, NULL), "comm");
  EXPECT_OK(reshard_comm_create_inproc(w, 0, &c));
  reshard_comm_t *c2 = NULL;
  EXPECT_ERR(IU, reshard_comm_create_inproc(w, 0, &c2), "rank 0", "already held");
  assert_null(c2);
  reshard_comm_destroy(c);
  reshard_comm_destroy(NULL);
  reshard_inproc_world_destroy(w);
  reshard_inproc_world_destroy(NULL);

  /* plan-level NULLs that need no collective */
  reshard_plan_t *plan = (reshard_plan_t *)&plan;
  reshard_layout_t *L = new_layout();
  EXPECT_ERR(IA, reshard_plan_create(NULL, L, L, NULL, &plan), "comm is NULL");
  reshard_plan_stats_t st;
  size_t n = 0;
  EXPECT_ERR(IA, reshard_plan_get_stats(NULL, &st), "get_stats");
  EXPECT_ERR(IA, reshard_plan_get_peer_stats(NULL, NULL, 0, &n), "get_peer_stats");
  EXPECT_ERR(IA, reshard_plan_dump(NULL, stderr, 0), "plan_dump");
  EXPECT_ERR(IA, reshard_plan_execute(NULL, NULL, 0, NULL, 0, NULL), "execute", "plan is NULL");
  reshard_plan_destroy(NULL);
  reshard_layout_destroy(L);
}

/* ------------------------------------------------------------------ */
/* plan_create: collective errors                                      */
/* ------------------------------------------------------------------ */

typedef struct pcase {
  int n;
  const reshard_layout_t *src[MAXR], *dst[MAXR];
  reshard_options_t opts[MAXR];
  int null_opts[MAXR], null_out[MAXR];
  reshard_result_t code[MAXR];
  char msg[MAXR][MSG_LEN];
  int plan_left[MAXR]; /* *plan not NULL after a failure */
  double secs[MAXR];
} pcase;

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int pcase_rank(int rank, reshard_comm_t *comm, void *arg) {
  pcase *c = arg;
  reshard_plan_t *plan = (reshard_plan_t *)&plan; /* must be reset */
  double t0 = now_s();
  c->code[rank] = reshard_plan_create(comm, c->src[rank], c->dst[rank], c->null_opts[rank] ? NULL : &c->opts[rank],
                                      c->null_out[rank] ? NULL : &plan);
  c->secs[rank] = now_s() - t0;
  snprintf(c->msg[rank], MSG_LEN, "%s", reshard_last_error());
  if (c->null_out[rank]) return 0;
  c->plan_left[rank] = c->code[rank] != RESHARD_SUCCESS && plan != NULL;
  if (c->code[rank] == RESHARD_SUCCESS) reshard_plan_destroy(plan);
  return 0;
}

static void pcase_init(pcase *c, int n, const reshard_layout_t *src,
                       const reshard_layout_t *dst) {
  memset(c, 0, sizeof *c);
  c->n = n;
  reshard_options_t o = RESHARD_OPTIONS_INITIALIZER;
  /* a rank left waiting shows up as a TIMEOUT, not as a hung test */
  o.timeout_ms = 20000;
  for (int r = 0; r < n; r++) {
    c->src[r] = src;
    c->dst[r] = dst;
    c->opts[r] = o;
  }
}

static void pcase_run(pcase *c) {
  assert_int_equal(th_run_ranks(c->n, pcase_rank, c), 0);
  for (int r = 0; r < c->n; r++) {
    if (c->plan_left[r]) fail_msg("rank %d: plan_create failed but left *plan non-NULL", r);
    /* agreement failures are immediate: no rank waited for a deadline */
    if (c->secs[r] > 10.0) fail_msg("rank %d: plan_create took %.1f s", r, c->secs[r]);
  }
}

#define EXPECT_RANK(c, r, want, ...)                                                            \
  do {                                                                                          \
    char where_[64];                                                                            \
    snprintf(where_, sizeof where_, "plan_create rank %d", (r));                                \
    if (!check_result(__FILE__, __LINE__, where_, (c)->code[(r)], (c)->msg[(r)], (want),       \
                      (const char *const[]){__VA_ARGS__, NULL}))                                \
      fail();                                                                                   \
  } while (0)

#define EXPECT_ALL(c, want, ...)                                                                \
  do {                                                                                          \
    for (int r_all_ = 0; r_all_ < (c)->n; r_all_++) EXPECT_RANK(c, r_all_, want, __VA_ARGS__);  \
  } while (0)

/* Every rank but `except` and `except2` (the failing ranks; -1: none)
 * learned of the failure, naming the highest failing rank and the start
 * of its own message (issue 42, item 4). */
static void expect_remote(const char *file, int line, const pcase *c,
                          int except, int except2) {
  const int culprit = except > except2 ? except : except2;
  assert_true(culprit >= 0);
  char blamed[64], reason[48];
  snprintf(blamed, sizeof blamed, "rank %d failed: ", culprit);
  /* the culprit's own message, as far as the blame words carry it */
  snprintf(reason, sizeof reason, "%.40s", c->msg[culprit]);
  for (int r = 0; r < c->n; r++) {
    if (r == except || r == except2) continue;
    char where[64];
    snprintf(where, sizeof where, "plan_create rank %d", r);
    char rk[32];
    snprintf(rk, sizeof rk, "plan_create rank %d:", r);
    if (!check_result(file, line, where, c->code[r], c->msg[r], RESHARD_ERROR_REMOTE,
                      (const char *const[]){rk, blamed, reason, NULL}))
      fail();
  }
}
#define EXPECT_REMOTE(c, except, except2) expect_remote(__FILE__, __LINE__, (c), (except), (except2))

/* w[8] f32 held only as [0, 4) by rank 0 (partial: allowed to be) ->
 * sharded over ranks 1, 2. */
static void half_source(int partial, reshard_layout_t **src, reshard_layout_t **dst) {
  *src = new_layout();
  *dst = new_layout();
  int ws = add_t1(*src, "w", RESHARD_FP32, 8), b0 = -1;
  if (partial) EXPECT_OK(reshard_layout_allow_partial(*src, ws));
  EXPECT_OK(reshard_layout_add_buffer(*src, "s0", 0, 16, &b0));
  int64_t st[1] = {0}, ex[1] = {4};
  reshard_fragment_t f = {ws, b0, st, ex, 0, NULL};
  EXPECT_OK(reshard_layout_add_fragment(*src, &f));
  place1(*dst, add_t1(*dst, "w", RESHARD_FP32, 8), add_mesh1(*dst, 2, 1), reshard_shard(0));
}

/* Every tensor a side declares must be held whole by that side, unless
 * reshard_layout_allow_partial says otherwise: w[8] f32 held only as
 * [0, 4) by rank 0 fails on every rank naming the box no source holds; a
 * destination tensor declared and placed nowhere (the silently undelivered
 * tensor a user meets as NaNs later) fails naming it. */
static void plan_tensor_not_covered(void **state) {
  (void)state;
  reshard_layout_t *src, *dst;
  half_source(0, &src, &dst);
  pcase c;
  pcase_init(&c, 4, src, dst);
  pcase_run(&c);
  EXPECT_ALL(&c, IA, "tensor 'w'", "source side holds none of box [4:8]", "reshard_layout_allow_partial");

  /* v declared on both sides, placed by the source only */
  reshard_layout_t *src2 = new_layout(), *dst2 = new_layout();
  int v = add_t1(src2, "v", RESHARD_FP32, 8);
  place1(src2, v, add_mesh1(src2, 1, 0), reshard_replicate());
  add_t1(dst2, "v", RESHARD_FP32, 8);
  int w2 = add_t1(src2, "w", RESHARD_FP32, 4), wd2 = add_t1(dst2, "w", RESHARD_FP32, 4);
  place1(src2, w2, add_mesh1(src2, 1, 0), reshard_replicate());
  place1(dst2, wd2, add_mesh1(dst2, 1, 1), reshard_replicate());
  pcase_init(&c, 2, src2, dst2);
  pcase_run(&c);
  EXPECT_ALL(&c, IA, "tensor 'v'", "destination side but placed nowhere", "reshard_layout_allow_partial");
  /* the opt-out: v is not delivered, w is */
  EXPECT_OK(reshard_layout_allow_partial(dst2, 0));
  pcase_init(&c, 2, src2, dst2);
  pcase_run(&c);
  for (int r = 0; r < 2; r++) assert_int_equal(c.code[r], RESHARD_SUCCESS);
  assert_int_equal(reshard_layout_allow_partial(dst2, 7), RESHARD_ERROR_INVALID_ARGUMENT);
  assert_int_equal(reshard_layout_allow_partial(NULL, 0), RESHARD_ERROR_INVALID_ARGUMENT);
  reshard_layout_destroy(src);
  reshard_layout_destroy(dst);
  reshard_layout_destroy(src2);
  reshard_layout_destroy(dst2);
}

/* Partial sources (allow_partial) whose holes a destination needs: w[8]
 * f32 held only as [0, 4) by rank 0; the destination splits it over ranks
 * 1 and 2, so rank 2's whole fragment [4, 8) has no source. Rank 3 takes
 * part in nothing. */
static void plan_coverage_hole(void **state) {
  (void)state;
  reshard_layout_t *src, *dst;
  half_source(1, &src, &dst);
  int b0 = -1;
  pcase c;
  pcase_init(&c, 4, src, dst);
  pcase_run(&c);
  EXPECT_RANK(&c, 2, IA, "tensor 'w'", "rank 2", "[4:8]", "held by no source");
  EXPECT_REMOTE(&c, 2, -1);

  /* A 2-D hole inside one destination fragment: columns [4, 6) of rank
   * 1's full copy. Rank 1 names it; rank 0, whose source overlaps that
   * fragment, assigns only the cells it holds (a sender's own pieces), so
   * it learns of the hole through the agreement like the others. */
  reshard_layout_t *src2 = new_layout(), *dst2 = new_layout();
  int w2 = add_t2(src2, "w2", RESHARD_FP32, 4, 6);
  EXPECT_OK(reshard_layout_allow_partial(src2, w2));
  EXPECT_OK(reshard_layout_add_buffer(src2, "s0", 0, 64, &b0));
  int64_t st2[2] = {0, 0}, ex2[2] = {4, 4};
  reshard_fragment_t f2 = {w2, b0, st2, ex2, 0, NULL};
  EXPECT_OK(reshard_layout_add_fragment(src2, &f2));
  int wd2 = add_t2(dst2, "w2", RESHARD_FP32, 4, 6);
  place1(dst2, wd2, add_mesh1(dst2, 1, 1), reshard_replicate());
  pcase_init(&c, 4, src2, dst2);
  pcase_run(&c);
  EXPECT_RANK(&c, 1, IA, "tensor 'w2'", "rank 1", "[0:4, 4:6]", "held by no source");
  EXPECT_REMOTE(&c, 1, -1);
  reshard_layout_destroy(src);
  reshard_layout_destroy(dst);
  reshard_layout_destroy(src2);
  reshard_layout_destroy(dst2);
}

/* w[n] f32 whole on `rank`. */
static reshard_layout_t *w_whole(int64_t n, int rank) {
  reshard_layout_t *L = new_layout();
  place1(L, add_t1(L, "w", RESHARD_FP32, n), add_mesh1(L, 1, rank), reshard_replicate());
  return L;
}

/* One row's check of a pcase: rank `rank` returned `want` with every
 * substring of subs (NULL-terminated); the row's name heads a miss. */
static void expect_rank_row(const char *row, int line, const pcase *c, int rank, reshard_result_t want,
                            const char *const *subs) {
  char where[160];
  snprintf(where, sizeof where, "%s: plan_create rank %d", row, rank);
  if (!check_result(__FILE__, line, where, c->code[rank], c->msg[rank], want, subs)) fail();
}

/* A fragment of w[8] f32 in a raw buffer: elements [start, start +
 * extent) at byte_offset, `stride` elements apart (DENSE: packed). */
#define DENSE INT64_MIN
typedef struct rawfrag {
  int64_t start, extent;
  size_t offset;
  int64_t stride;
} rawfrag;

/* Raw-buffer fragments that plan_create refuses on the rank holding them
 * (the others: REMOTE naming it). The rows vary the buffer (side, rank,
 * name, size) and its fragments (box, byte_offset, stride). The other
 * side: w whole on rank 0 (source), or sharded over ranks 2, 3
 * (destination, for a raw source). */
typedef struct raw_row {
  const char *name;
  int on_source, rank;
  const char *buf;
  size_t bytes;
  int nfrag;
  rawfrag frag[2];
  const char *subs[6];
} raw_row;

static raw_row raw_rows[] = {
    /* bytes [0,16) and [8,24) overlap in rank 2's buffer */
    {"plan_raw_overlap_and_outside/overlap", 0, 2, "d2", 64, 2, {{0, 4, 0, DENSE}, {4, 4, 8, DENSE}},
     {"rank 2", "destination", "overlap", "buffer 'd2'", "'w'"}},
    /* overlap through strides: [0,4) at stride 2 and [4,8) dense at byte 4
     * interleave inside one byte range; they do collide at byte 8 */
    {"plan_raw_overlap_and_outside/strided_overlap", 0, 2, "d2s", 64, 2, {{0, 4, 0, 2}, {4, 4, 4, DENSE}},
     {"rank 2", "overlap", "buffer 'd2s'"}},
    /* a fragment overlapping itself: stride 0 puts all 4 elements at byte 0 */
    {"plan_raw_overlap_and_outside/self_overlap", 0, 2, "self", 64, 2, {{0, 4, 0, 0}, {4, 4, 16, DENSE}},
     {"tensor 'w'", "rank 2", "overlaps itself", "buffer 'self'"}},
    /* a dense fragment of 32 bytes in a 16-byte buffer */
    {"plan_raw_overlap_and_outside/too_small", 0, 2, "small", 16, 1, {{0, 8, 0, DENSE}},
     {"tensor 'w'", "rank 2", "destination fragment 0", "outside buffer 'small'", "16 bytes"}},
    /* in range only without its byte_offset / strides */
    {"plan_raw_overlap_and_outside/offset_outside", 0, 3, "off", 32, 1, {{0, 8, 4, DENSE}},
     {"tensor 'w'", "rank 3", "outside buffer 'off'", "32 bytes"}},
    {"plan_raw_overlap_and_outside/stride_outside", 0, 1, "strided", 32, 1, {{0, 8, 0, 4}}, /* reaches byte 7*16+4 */
     {"tensor 'w'", "rank 1", "outside buffer 'strided'"}},
    /* the same on the source side: rank 0's raw buffer is too small */
    {"plan_raw_overlap_and_outside/source_too_small", 1, 0, "s0", 31, 1, {{0, 8, 0, DENSE}},
     {"tensor 'w'", "rank 0", "source fragment", "outside buffer 's0'", "31 bytes"}},
};

static void plan_raw_case(void **state) {
  const raw_row *row = *state;
  reshard_layout_t *raw = new_layout(), *other;
  int w = add_t1(raw, "w", RESHARD_FP32, 8), b = -1;
  EXPECT_OK(reshard_layout_add_buffer(raw, row->buf, row->rank, row->bytes, &b));
  for (int i = 0; i < row->nfrag; i++) {
    const rawfrag *g = &row->frag[i];
    reshard_fragment_t f = {w, b, &g->start, &g->extent, g->offset, g->stride == DENSE ? NULL : &g->stride};
    EXPECT_OK(reshard_layout_add_fragment(raw, &f));
  }
  if (row->on_source) {
    other = new_layout();
    place1(other, add_t1(other, "w", RESHARD_FP32, 8), add_mesh1(other, 2, 2), reshard_shard(0));
  } else {
    other = w_whole(8, 0);
  }
  pcase c;
  pcase_init(&c, 4, row->on_source ? raw : other, row->on_source ? other : raw);
  pcase_run(&c);
  expect_rank_row(row->name, __LINE__, &c, row->rank, IA, row->subs);
  EXPECT_REMOTE(&c, row->rank, -1);
  reshard_layout_destroy(raw);
  reshard_layout_destroy(other);
}

/* Source w[8, 4] f32, rows over ranks 0, 1; a destination over ranks 2,
 * 3 that disagrees about a tensor: every rank fails alike. The rows vary
 * the destination w's dtype and shape (sharded over its last dim), the
 * flags, a destination-only tensor and whether the sides are swapped. */
typedef struct tensor_row {
  const char *name;
  reshard_dtype_t dtype;
  int ndim;
  int64_t d0, d1;
  uint32_t flags;
  int only_dst, swap;
  reshard_result_t want;
  const char *subs[6];
} tensor_row;

static tensor_row tensor_rows[] = {
    {"plan_tensor_disagreements/dtype", RESHARD_INT32, 2, 8, 4, 0, 0, 0, IA,
     {"tensor 'w'", "dtype", "f32", "i32", "only f32, bf16, f16"}},
    /* f32 -> bf16 converts, but not under RESHARD_FLAG_VERIFY (yet) */
    {"plan_tensor_disagreements/convert_verify", RESHARD_BF16, 2, 8, 4, RESHARD_FLAG_VERIFY, 0, 0,
     RESHARD_ERROR_UNSUPPORTED, {"tensor 'w'", "f32", "bf16", "RESHARD_FLAG_VERIFY"}},
    {"plan_tensor_disagreements/shape", RESHARD_FP32, 2, 8, 5, 0, 0, 0, IA,
     {"tensor 'w'", "shape [8, 4] on the source side", "[8, 5] on the destination side"}},
    {"plan_tensor_disagreements/ndim", RESHARD_FP32, 1, 32, 0, 0, 0, 0, IA,
     {"tensor 'w'", "shape [8, 4] on the source side", "[32] on the destination side"}},
    /* a tensor on the destination side only */
    {"plan_tensor_disagreements/only_dst", RESHARD_FP32, 2, 8, 4, 0, 1, 0, IA,
     {"tensor 'only_dst'", "not in the source"}},
    /* and on the source side only (the same layouts, swapped) */
    {"plan_tensor_disagreements/only_src", RESHARD_FP32, 2, 8, 4, 0, 1, 1, IA,
     {"tensor 'only_dst'", "not in the destination"}},
};

static void plan_tensor_case(void **state) {
  const tensor_row *row = *state;
  reshard_layout_t *src = new_layout(), *dst = new_layout();
  place1(src, add_t2(src, "w", RESHARD_FP32, 8, 4), add_mesh1(src, 2, 0), reshard_shard(0));
  int md = add_mesh1(dst, 2, 2);
  int w = row->ndim == 2 ? add_t2(dst, "w", row->dtype, row->d0, row->d1) : add_t1(dst, "w", row->dtype, row->d0);
  place1(dst, w, md, reshard_shard(row->ndim - 1));
  if (row->only_dst) place1(dst, add_t1(dst, "only_dst", RESHARD_FP32, 4), md, reshard_replicate());
  pcase c;
  pcase_init(&c, 4, row->swap ? dst : src, row->swap ? src : dst);
  for (int r = 0; r < 4; r++) c.opts[r].flags |= row->flags;
  pcase_run(&c);
  for (int r = 0; r < 4; r++) expect_rank_row(row->name, __LINE__, &c, r, row->want, row->subs);
  reshard_layout_destroy(dst);
  reshard_layout_destroy(src);
}

static void plan_ranks_outside_comm(void **state) {
  (void)state;
  pcase c;
  reshard_layout_t *src = new_layout(), *dst = new_layout();
  place1(src, add_t1(src, "w", RESHARD_FP32, 8), add_mesh1(src, 4, 0), reshard_shard(0));
  place1(dst, add_t1(dst, "w", RESHARD_FP32, 8), add_mesh1(dst, 4, 2), reshard_shard(0));
  pcase_init(&c, 4, src, dst);
  pcase_run(&c);
  EXPECT_ALL(&c, IA, "destination layout", "rank 5", "4 ranks");
  /* in a world large enough the same layouts are fine */
  pcase_init(&c, 6, src, dst);
  pcase_run(&c);
  for (int r = 0; r < 6; r++) assert_int_equal(c.code[r], RESHARD_SUCCESS);
  reshard_layout_destroy(src);

  /* a raw source buffer on rank 4 of a 4-rank world */
  src = new_layout();
  int w = add_t1(src, "w", RESHARD_FP32, 8), b = -1;
  EXPECT_OK(reshard_layout_add_buffer(src, "far", 4, 32, &b));
  int64_t st[1] = {0}, ex[1] = {8};
  reshard_fragment_t f = {w, b, st, ex, 0, NULL};
  EXPECT_OK(reshard_layout_add_fragment(src, &f));
  reshard_layout_destroy(dst);
  dst = new_layout();
  place1(dst, add_t1(dst, "w", RESHARD_FP32, 8), add_mesh1(dst, 2, 0), reshard_shard(0));
  pcase_init(&c, 4, src, dst);
  pcase_run(&c);
  EXPECT_ALL(&c, IA, "source layout", "rank 4", "4 ranks");
  reshard_layout_destroy(src);
  reshard_layout_destroy(dst);
}

/* What an option row changes before plan_create, on one rank or all:
 * an options field (= value); the caller built against the version-1
 * header (its size, the defaults for the rest); a NULL layout, plan
 * output or options (the defaults); the row's `other` layout. */
typedef enum {
  SET_STRUCT_SIZE, SET_VERSION, SET_STAGING, SET_CHUNK, SET_TIMEOUT,
  SET_V1_HEADER,
  NULL_SRC, NULL_DST, NULL_OUT, NULL_OPTS,
  OTHER_SRC, OTHER_DST,
} opt_tweak;

/* One plan_create whose options, layouts or output one rank (rank >= 0)
 * or every rank (rank -1) gets wrong. With `blame`, `rank` returns want
 * naming subs and the others REMOTE (and, if others_say is set, say it
 * too); without, every rank returns want naming subs. */
typedef struct opt_row {
  const char *name;
  opt_tweak what;
  int rank;
  int64_t value;
  reshard_result_t want;
  int blame;
  const char *subs[4];
  const char *others_say;
} opt_row;

static void opt_row_run(const opt_row *row, const reshard_layout_t *src, const reshard_layout_t *dst,
                        const reshard_layout_t *other) {
  pcase c;
  pcase_init(&c, 4, src, dst);
  for (int r = 0; r < 4; r++) {
    if (row->rank >= 0 && r != row->rank) continue;
    reshard_options_t *o = &c.opts[r];
    switch (row->what) {
    case SET_STRUCT_SIZE: o->struct_size = (uint32_t)row->value; break;
    case SET_VERSION: o->version = (uint32_t)row->value; break;
    case SET_V1_HEADER:
      o->struct_size = (uint32_t)(offsetof(reshard_options_t, timeout_ms) + sizeof(int64_t));
      o->version = 1;
      break;
    case SET_STAGING: o->staging_bytes = (size_t)row->value; break;
    case SET_CHUNK: o->chunk_bytes = (size_t)row->value; break;
    case SET_TIMEOUT: o->timeout_ms = row->value; break;
    case NULL_SRC: c.src[r] = NULL; break;
    case NULL_DST: c.dst[r] = NULL; break;
    case NULL_OUT: c.null_out[r] = 1; break;
    case NULL_OPTS: c.null_opts[r] = 1; break;
    case OTHER_SRC: c.src[r] = other; break;
    case OTHER_DST: c.dst[r] = other; break;
    }
  }
  pcase_run(&c);
  if (row->blame) {
    expect_rank_row(row->name, __LINE__, &c, row->rank, row->want, row->subs);
    EXPECT_REMOTE(&c, row->rank, -1);
    for (int r = 0; r < 4 && row->others_say; r++)
      if (r != row->rank && !strstr(c.msg[r], row->others_say))
        fail_msg("%s: rank %d does not say why: \"%s\"", row->name, r, c.msg[r]);
  } else {
    for (int r = 0; r < 4; r++) expect_rank_row(row->name, __LINE__, &c, r, row->want, row->subs);
  }
}

/* Bad options and NULL pointers, w[8] f32 sharded over ranks 0, 1 ->
 * ranks 2, 3: the rows vary the field, its value and which ranks get it
 * wrong. */
static opt_row option_rows[] = {
    {"plan_bad_options_and_pointers/struct_size_0", SET_STRUCT_SIZE, -1, 0, IA, 0, {"options", "struct_size"}, NULL},
    {"plan_bad_options_and_pointers/struct_size_short", SET_STRUCT_SIZE, -1, (int64_t)sizeof(reshard_options_t) - 8, IA,
     0, {"options", "struct_size"}, NULL},
    {"plan_bad_options_and_pointers/struct_size_long", SET_STRUCT_SIZE, -1, (int64_t)sizeof(reshard_options_t) + 8, IA,
     0, {"options", "struct_size"}, NULL},
    {"plan_bad_options_and_pointers/version_0", SET_VERSION, -1, 0, IA, 0, {"options", "version"}, NULL},
    {"plan_bad_options_and_pointers/version_next", SET_VERSION, -1, RESHARD_OPTIONS_VERSION + 1, IA, 0,
     {"options", "version"}, NULL},
    {"plan_bad_options_and_pointers/v1_header", SET_V1_HEADER, -1, 0, RESHARD_SUCCESS, 0, {NULL}, NULL},
    {"plan_bad_options_and_pointers/staging_100", SET_STAGING, -1, 100, IA, 0, {"options", "staging_bytes 100"}, NULL},
    {"plan_bad_options_and_pointers/staging_0", SET_STAGING, -1, 0, IA, 0, {"options", "staging_bytes 0"}, NULL},
    /* no "wait forever": 0 and negative deadlines hung a test until it was
     * killed (issue 42, item 7) */
    {"plan_bad_options_and_pointers/timeout_0", SET_TIMEOUT, -1, 0, IA, 0, {"options: timeout_ms", "at least 1 ms"}, NULL},
    {"plan_bad_options_and_pointers/timeout_neg", SET_TIMEOUT, -1, -5, IA, 0, {"options: timeout_ms", "at least 1 ms"}, NULL},
    /* one rank alone with a bad version: it says why, the others REMOTE */
    {"plan_bad_options_and_pointers/version_one_rank", SET_VERSION, 3, 99, IA, 1, {"options", "version 99"}, NULL},
    /* NULL layouts / output on every rank */
    {"plan_bad_options_and_pointers/null_src", NULL_SRC, -1, 0, IA, 0, {"src is NULL"}, NULL},
    {"plan_bad_options_and_pointers/null_dst", NULL_DST, -1, 0, IA, 0, {"dst is NULL"}, NULL},
    {"plan_bad_options_and_pointers/null_out", NULL_OUT, -1, 0, IA, 0, {"plan is NULL"}, NULL},
    /* NULL output on one rank only */
    {"plan_bad_options_and_pointers/null_out_one_rank", NULL_OUT, 1, 0, IA, 1, {"plan is NULL"}, NULL},
    /* a NULL layout on one rank only: that rank has no digest, which is a
     * failure (REMOTE on the others), not a disagreement (MISMATCH) */
    {"plan_bad_options_and_pointers/null_src_one_rank", NULL_SRC, 2, 0, IA, 1, {"src is NULL"}, NULL},
    /* NULL options mean the defaults, on every rank */
    {"plan_bad_options_and_pointers/null_options", NULL_OPTS, -1, 0, RESHARD_SUCCESS, 0, {NULL}, NULL},
};

static void plan_option_case(void **state) {
  reshard_layout_t *src = new_layout(), *dst = new_layout();
  place1(src, add_t1(src, "w", RESHARD_FP32, 8), add_mesh1(src, 2, 0), reshard_shard(0));
  place1(dst, add_t1(dst, "w", RESHARD_FP32, 8), add_mesh1(dst, 2, 2), reshard_shard(0));
  opt_row_run(*state, src, dst, NULL);
  reshard_layout_destroy(src);
  reshard_layout_destroy(dst);
}

/* Ranks that disagree, w[8, 4] f32 rows over ranks 0, 1 -> columns over
 * ranks 2, 3; `other` places w over ranks 0, 1 by columns (valid on its
 * own). Every rank names the first rank that differs from rank 0 and
 * what differs: the buffer, the tensor, the option or the count. The
 * rows vary what differs and on which rank. */
static opt_row disagree_rows[] = {
    {"plan_rank_disagreement/source_rank2", OTHER_SRC, 2, 0, RESHARD_ERROR_MISMATCH, 0,
     {"different layouts", "ranks 0 and 2 describe source buffer 0 differently", "'w'"}, NULL},
    /* a source rank disagreeing */
    {"plan_rank_disagreement/source_rank0", OTHER_SRC, 0, 0, RESHARD_ERROR_MISMATCH, 0,
     {"different layouts", "ranks 0 and 1 describe source buffer 0"}, NULL},
    /* the destination description differs on one rank */
    {"plan_rank_disagreement/destination_rank3", OTHER_DST, 3, 0, RESHARD_ERROR_MISMATCH, 0,
     {"different layouts", "ranks 0 and 3 describe destination buffer 0"}, NULL},
    /* options that enter the digest */
    {"plan_rank_disagreement/staging_bytes", SET_STAGING, 1, (int64_t)1 << 20, RESHARD_ERROR_MISMATCH, 0,
     {"options", "ranks 0 and 1 differ in options.staging_bytes"}, NULL},
    {"plan_rank_disagreement/chunk_bytes", SET_CHUNK, 0, 4096, RESHARD_ERROR_MISMATCH, 0,
     {"options", "ranks 0 and 1 differ in options.chunk_bytes (4096 and 0)"}, NULL},
    /* an option one rank alone refuses (issue 42, item 4: the others said
     * only "another rank failed with 'invalid argument'"): they name rank 2
     * and its reason */
    {"plan_rank_disagreement/refused_one_rank", SET_STAGING, 2, 1, IA, 1, {"staging_bytes"}, "staging_bytes"},
};

static void disagree_layouts(reshard_layout_t **src, reshard_layout_t **dst, reshard_layout_t **other) {
  *src = new_layout();
  *dst = new_layout();
  place1(*src, add_t2(*src, "w", RESHARD_FP32, 8, 4), add_mesh1(*src, 2, 0), reshard_shard(0));
  place1(*dst, add_t2(*dst, "w", RESHARD_FP32, 8, 4), add_mesh1(*dst, 2, 2), reshard_shard(1));
  if (!other) return;
  *other = new_layout();
  place1(*other, add_t2(*other, "w", RESHARD_FP32, 8, 4), add_mesh1(*other, 2, 0), reshard_shard(1));
}

static void plan_disagree_case(void **state) {
  reshard_layout_t *src, *dst, *other;
  disagree_layouts(&src, &dst, &other);
  opt_row_run(*state, src, dst, other);
  reshard_layout_destroy(src);
  reshard_layout_destroy(dst);
  reshard_layout_destroy(other);
}

/* A tensor of another shape on both sides of rank 1; a tensor more on
 * rank 3's destination. */
static void plan_rank_disagreement(void **state) {
  (void)state;
  pcase c;
  reshard_layout_t *src, *dst;
  disagree_layouts(&src, &dst, NULL);
  reshard_layout_t *src5 = new_layout(), *dst5 = new_layout(), *dst_more = new_layout();
  place1(src5, add_t2(src5, "w", RESHARD_FP32, 8, 5), add_mesh1(src5, 2, 0), reshard_shard(0));
  place1(dst5, add_t2(dst5, "w", RESHARD_FP32, 8, 5), add_mesh1(dst5, 2, 2), reshard_shard(1));
  place1(dst_more, add_t2(dst_more, "w", RESHARD_FP32, 8, 4), add_mesh1(dst_more, 2, 2), reshard_shard(1));
  EXPECT_OK(reshard_layout_allow_partial(dst_more, add_t1(dst_more, "x", RESHARD_FP32, 2)));
  pcase_init(&c, 4, src, dst);
  c.src[1] = src5;
  c.dst[1] = dst5;
  pcase_run(&c);
  EXPECT_ALL(&c, RESHARD_ERROR_MISMATCH, "ranks 0 and 1 describe source tensor 0 differently");
  pcase_init(&c, 4, src, dst);
  c.dst[3] = dst_more;
  c.src[3] = src;
  pcase_run(&c);
  EXPECT_RANK(&c, 3, IA, "tensor 'x'", "not in the source layout");
  reshard_layout_destroy(src);
  reshard_layout_destroy(dst);
  reshard_layout_destroy(src5);
  reshard_layout_destroy(dst5);
  reshard_layout_destroy(dst_more);
}

/* split_sizes {3, 4} for a dim of 8: caught where the pieces are computed,
 * on the holders (validation) and on the receivers (holder search). */
static void plan_split_sizes_sum(void **state) {
  (void)state;
  pcase c;
  reshard_layout_t *src = new_layout(), *dst = new_layout();
  int64_t sizes[2] = {3, 4};
  place1(src, add_t1(src, "w", RESHARD_FP32, 8), add_mesh1(src, 2, 0), reshard_shard_sizes(0, sizes));
  place1(dst, add_t1(dst, "w", RESHARD_FP32, 8), add_mesh1(dst, 2, 2), reshard_replicate());
  pcase_init(&c, 5, src, dst);
  pcase_run(&c);
  for (int r = 0; r < 4; r++) {
    EXPECT_RANK(&c, r, IA, "tensor 'w'", "split_sizes", "mesh axis 0", "extent 8");
    /* a rank that is not there is no help to whoever reads the message */
    if (strstr(c.msg[r], "rank -")) fail_msg("rank %d names a negative rank: \"%s\"", r, c.msg[r]);
  }
  EXPECT_RANK(&c, 0, IA, "rank 0");
  EXPECT_RANK(&c, 1, IA, "rank 1");
  EXPECT_RANK(&c, 4, RESHARD_ERROR_REMOTE, "rank 4", "rank 3 failed: ", "split_sizes");
  reshard_layout_destroy(src);
  reshard_layout_destroy(dst);
}

/* ------------------------------------------------------------------ */
/* execute                                                             */
/* ------------------------------------------------------------------ */

/* Two tensors, rows over ranks 0..3 on the source side, columns over the
 * same ranks on the destination side: every rank sends to and receives
 * from every other one, and copies its own diagonal block locally. */
static void exec_layouts(reshard_layout_t **src, reshard_layout_t **dst) {
  *src = new_layout();
  *dst = new_layout();
  int ms = add_mesh1(*src, 4, 0), md = add_mesh1(*dst, 4, 0);
  const char *names[2] = {"a", "b"};
  for (int i = 0; i < 2; i++) {
    assert_int_equal(place1(*src, add_t2(*src, names[i], RESHARD_FP32, 8, 4), ms, reshard_shard(0)), i);
    assert_int_equal(place1(*dst, add_t2(*dst, names[i], RESHARD_FP32, 8, 4), md, reshard_shard(1)), i);
  }
}

typedef struct xcase {
  const reshard_layout_t *src, *dst;
  int64_t timeout_ms;
  int bad_rank; /* passes NULL for its destination buffer 1 */
  int retry;    /* then every rank runs a valid step 1 */
  pthread_barrier_t barrier;
  reshard_result_t code[MAXR], retry_code[MAXR];
  char msg[MAXR][MSG_LEN];
  double secs[MAXR];
  int64_t problems[MAXR];
  int64_t dst_written[MAXR]; /* destination bytes the failed call changed */
  int64_t retry_bad[MAXR];
  char retry_msg[MAXR][MSG_LEN];
  reshard_result_t fresh_code[MAXR]; /* with a new plan */
} xcase;

#define TCHECK(x, rank, cond, ...)                                  \
  do {                                                              \
    if (!(cond)) {                                                  \
      fprintf(stderr, "%s:%d: rank %d: ", __FILE__, __LINE__, rank); \
      fprintf(stderr, __VA_ARGS__);                                 \
      fprintf(stderr, "\n");                                        \
      (x)->problems[rank]++;                                        \
    }                                                               \
  } while (0)

static int has(const char *msg, const char *sub) { return strstr(msg, sub) != NULL; }

static reshard_plan_t *xcase_plan(xcase *x, int rank, reshard_comm_t *comm) {
  reshard_options_t o = RESHARD_OPTIONS_INITIALIZER;
  o.timeout_ms = x->timeout_ms;
  reshard_plan_t *plan = NULL;
  reshard_result_t r = reshard_plan_create(comm, x->src, x->dst, &o, &plan);
  TCHECK(x, rank, r == RESHARD_SUCCESS, "plan_create: %s", reshard_last_error());
  return plan;
}

/* Bad execute arguments passed by every rank alike: each call is refused
 * before any data moves, naming the argument; it takes its place in the
 * agreement (telling its partners) and fails the plan, which then refuses
 * at once; a new plan works. */
static int exec_bad_args_rank(int rank, reshard_comm_t *comm, void *arg) {
  xcase *x = arg;
  th_side s, ref, d;
  TCHECK(x, rank, !th_side_alloc(&s, x->src, rank, 0) && !th_side_alloc(&ref, x->src, rank, 0) &&
                      !th_side_alloc(&d, x->dst, rank, -1),
         "th_side_alloc");
  void *sp[3] = {s.ptr[0], s.ptr[1], NULL}, *dp[3] = {d.ptr[0], d.ptr[1], NULL};
  char rk[32];
  snprintf(rk, sizeof rk, "rank %d", rank);
  struct {
    void *const *src;
    size_t ns;
    void *const *dst;
    size_t nd;
    void *stream;
    reshard_result_t want;
    const char *sub[3];
  } bad[] = {
      {sp, 2, dp, 2, &d, IA, {"stream", "inproc", NULL}},
      {sp, 3, dp, 2, NULL, IU, {"source buffers", "3 given", "has 2"}},
      {sp, 1, dp, 2, NULL, IU, {"source buffers", "1 given", "has 2"}},
      {sp, 2, dp, 1, NULL, IU, {"destination buffers", "1 given", "has 2"}},
      {sp, 2, dp, 0, NULL, IU, {"destination buffers", "0 given", "has 2"}},
      {NULL, 2, dp, 2, NULL, IU, {"source buffers", "NULL", "has 2"}},
      {sp, 2, NULL, 2, NULL, IU, {"destination buffers", "NULL", "has 2"}},
      {(void *const[]){s.ptr[0], NULL}, 2, dp, 2, NULL, IA, {"source buffer 1 'b'", "is NULL", NULL}},
      {(void *const[]){NULL, s.ptr[1]}, 2, dp, 2, NULL, IA, {"source buffer 0 'a'", "is NULL", NULL}},
      {sp, 2, (void *const[]){d.ptr[0], NULL}, 2, NULL, IA, {"destination buffer 1 'b'", "is NULL", NULL}},
  };
  reshard_plan_t *plan = NULL;
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
    plan = xcase_plan(x, rank, comm);
    if (!plan) return 1;
    reshard_result_t r = reshard_plan_execute(plan, bad[i].src, bad[i].ns, bad[i].dst, bad[i].nd, bad[i].stream);
    const char *m = reshard_last_error();
    TCHECK(x, rank, r == bad[i].want, "bad call %zu returned %d, expected %d (%s)", i, (int)r, (int)bad[i].want, m);
    TCHECK(x, rank, has(m, rk), "bad call %zu: message does not name %s: \"%s\"", i, rk, m);
    TCHECK(x, rank, has(m, "partners were told"), "bad call %zu: \"partners were told\" not in \"%s\"", i, m);
    for (int k = 0; k < 3 && bad[i].sub[k]; k++)
      TCHECK(x, rank, has(m, bad[i].sub[k]), "bad call %zu: \"%s\" not in \"%s\"", i, bad[i].sub[k], m);
    TCHECK(x, rank, th_side_written(&d) == 0, "bad call %zu wrote destination bytes", i);
    TCHECK(x, rank, th_sides_equal(&s, &ref), "bad call %zu changed source bytes", i);
    /* the plan failed with the call: refused at once, saying why */
    r = reshard_plan_execute(plan, (void *const *)s.ptr, 2, (void *const *)d.ptr, 2, NULL);
    TCHECK(x, rank, r == IU && has(reshard_last_error(), "failed earlier, at execute call 0"),
           "after bad call %zu: %d %s", i, (int)r, reshard_last_error());
    reshard_plan_destroy(plan);
  }
  /* a new plan: two valid steps deliver exactly their data */
  plan = xcase_plan(x, rank, comm);
  if (!plan) return 1;
  for (int step = 0; step < 2; step++) {
    if (step) {
      th_side_free(&s);
      TCHECK(x, rank, !th_side_alloc(&s, x->src, rank, step), "th_side_alloc");
    }
    reshard_result_t r = reshard_plan_execute(plan, (void *const *)s.ptr, 2, (void *const *)d.ptr, 2, NULL);
    TCHECK(x, rank, r == RESHARD_SUCCESS, "valid execute step %d: %s", step, reshard_last_error());
    TCHECK(x, rank, th_side_check(&d, x->dst, rank, (uint64_t)step, "bad_args") == 0, "step %d data wrong", step);
  }
  th_side_free(&s);
  th_side_free(&ref);
  th_side_free(&d);
  reshard_plan_destroy(plan);
  return 0;
}

static void exec_bad_args(void **state) {
  (void)state;
  reshard_layout_t *src, *dst;
  exec_layouts(&src, &dst);
  xcase x;
  memset(&x, 0, sizeof x);
  x.src = src;
  x.dst = dst;
  x.timeout_ms = 20000;
  assert_int_equal(th_run_ranks(4, exec_bad_args_rank, &x), 0);
  for (int r = 0; r < 4; r++) assert_int_equal(x.problems[r], 0);
  reshard_layout_destroy(src);
  reshard_layout_destroy(dst);
}

/* One rank passes NULL for a destination buffer it holds; the others run
 * normally and must give up at their deadline instead of hanging. */
static int exec_one_null_rank(int rank, reshard_comm_t *comm, void *arg) {
  xcase *x = arg;
  reshard_plan_t *plan = xcase_plan(x, rank, comm);
  if (!plan) {
    if (x->retry) pthread_barrier_wait(&x->barrier);
    return 1;
  }
  th_side s, ref, d;
  TCHECK(x, rank, !th_side_alloc(&s, x->src, rank, 0) && !th_side_alloc(&ref, x->src, rank, 0) &&
                      !th_side_alloc(&d, x->dst, rank, -1),
         "th_side_alloc");
  void *dp[2] = {d.ptr[0], rank == x->bad_rank ? NULL : d.ptr[1]};
  double t0 = now_s();
  x->code[rank] = reshard_plan_execute(plan, (void *const *)s.ptr, 2, dp, 2, NULL);
  x->secs[rank] = now_s() - t0;
  snprintf(x->msg[rank], MSG_LEN, "%s", reshard_last_error());
  x->dst_written[rank] = th_side_written(&d);
  TCHECK(x, rank, th_sides_equal(&s, &ref), "the failed execute changed source bytes");
  if (x->retry) {
    /* everyone has seen the failure before anyone retries: the failed
     * plan refuses at once, a new one delivers the step's data (not
     * messages left over from the failed call) */
    pthread_barrier_wait(&x->barrier);
    th_side_free(&s);
    TCHECK(x, rank, !th_side_alloc(&s, x->src, rank, 1), "th_side_alloc");
    x->retry_code[rank] = reshard_plan_execute(plan, (void *const *)s.ptr, 2, (void *const *)d.ptr, 2, NULL);
    snprintf(x->retry_msg[rank], MSG_LEN, "%s", reshard_last_error());
    pthread_barrier_wait(&x->barrier);
    reshard_plan_destroy(plan);
    plan = xcase_plan(x, rank, comm);
    if (!plan) return 1;
    x->fresh_code[rank] = reshard_plan_execute(plan, (void *const *)s.ptr, 2, (void *const *)d.ptr, 2, NULL);
    if (x->fresh_code[rank] != RESHARD_SUCCESS)
      fprintf(stderr, "rank %d: new plan: %s: %s\n", rank, reshard_result_string(x->fresh_code[rank]),
              reshard_last_error());
    else
      x->retry_bad[rank] = th_side_check(&d, x->dst, rank, 1, "retry");
  }
  th_side_free(&s);
  th_side_free(&ref);
  th_side_free(&d);
  reshard_plan_destroy(plan);
  return 0;
}

static void run_one_null(xcase *x, int retry) {
  reshard_layout_t *src, *dst;
  exec_layouts(&src, &dst);
  memset(x, 0, sizeof *x);
  x->src = src;
  x->dst = dst;
  x->timeout_ms = 2000;
  x->bad_rank = 1;
  x->retry = retry;
  if (retry) assert_int_equal(pthread_barrier_init(&x->barrier, NULL, 4), 0);
  assert_int_equal(th_run_ranks(4, exec_one_null_rank, x), 0);
  if (retry) pthread_barrier_destroy(&x->barrier);
  reshard_layout_destroy(src);
  reshard_layout_destroy(dst);
  for (int r = 0; r < 4; r++) assert_int_equal(x->problems[r], 0);

  /* the failing rank: at once, naming the buffer, nothing written */
  EXPECT_RANK(x, 1, IA, "rank 1", "destination buffer 1 'b'", "is NULL");
  if (x->secs[1] > 1.0) fail_msg("rank 1 took %.2f s to reject its arguments", x->secs[1]);
  assert_int_equal(x->dst_written[1], 0);
  EXPECT_RANK(x, 1, IA, "partners were told");
  /* its partners hear of it in the agreement, at once: REMOTE naming rank
   * 1 and why, well before their deadline; a rank that exchanges nothing
   * with rank 1 learns of it from its own partners' statuses */
  for (int r = 0; r < 4; r++) {
    if (r == 1) continue;
    char rk[32];
    snprintf(rk, sizeof rk, "execute rank %d", r);
    EXPECT_RANK(x, r, RESHARD_ERROR_REMOTE, rk);
    if (x->secs[r] > 1.0) fail_msg("rank %d took %.2f s to learn of rank 1's rejected call", r, x->secs[r]);
  }
  if (!has(x->msg[0], "rank 1 rejected execute call 0") || !has(x->msg[0], "destination buffer 1 'b'"))
    fail_msg("rank 0 does not name rank 1 and its buffer: %s", x->msg[0]);
}

static void exec_null_buffer_one_rank(void **state) {
  (void)state;
  xcase x;
  run_one_null(&x, 0);
}

/* After such a failure every rank retries the step with valid buffers.
 * Every plan failed with the call (rank 1's with its rejection, the
 * others' with REMOTE): each refuses at once saying why. With new plans
 * the step delivers its own data. */
static void exec_retry_after_failed_execute(void **state) {
  (void)state;
  xcase x;
  run_one_null(&x, 1);
  for (int r = 0; r < 4; r++) {
    if (x.retry_code[r] != RESHARD_ERROR_INVALID_USAGE)
      fail_msg("rank %d: retry on the failed plan returned %d: %s", r, (int)x.retry_code[r], x.retry_msg[r]);
    const char *want[] = {"failed earlier, at execute call 0", r == 1 ? "is NULL" : "remote", "destroy the plan"};
    for (int k = 0; k < 3; k++)
      if (!has(x.retry_msg[r], want[k])) fail_msg("rank %d: \"%s\" not in \"%s\"", r, want[k], x.retry_msg[r]);
    if (x.fresh_code[r] != RESHARD_SUCCESS) fail_msg("rank %d: the new plan returned %d", r, (int)x.fresh_code[r]);
    if (x.retry_bad[r]) fail_msg("rank %d: retry left %lld wrong destination elements", r, (long long)x.retry_bad[r]);
  }
}

/* reshard_plan_execute_sized: w[8] f32 from rank 0 to rank 1. A short
 * buffer on either side is refused before anything moves (its bytes and
 * the partner's untouched) and the partner learns of it at once (REMOTE
 * naming the buffer); then, on a new plan, both ranks execute with the
 * right sizes and every element arrives. */
typedef struct sized_case {
  const reshard_layout_t *src, *dst;
  pthread_barrier_t bar;
  reshard_result_t short_code[2], partner_code[2], null_code[2];
  char short_msg[2][MSG_LEN], partner_msg[2][MSG_LEN], null_msg[2][MSG_LEN];
  int untouched[2], delivered;
} sized_case;

static int sized_rank(int rank, reshard_comm_t *comm, void *arg) {
  sized_case *c = arg;
  reshard_options_t o = RESHARD_OPTIONS_INITIALIZER;
  o.timeout_ms = 20000;
  reshard_plan_t *plan = NULL;
  float w[8], got[8];
  for (int i = 0; i < 8; i++) w[i] = (float)i + 0.5f, got[i] = -1;
  reshard_buffer_t sb = {w, sizeof w}, db = {got, sizeof got};
  reshard_buffer_t short_b = rank == 0 ? (reshard_buffer_t){w, 16} : (reshard_buffer_t){got, 31};
  /* in turn, one rank passes a short buffer while the other is right */
  for (int turn = 0; turn < 2; turn++) {
    if (reshard_plan_create(comm, c->src, c->dst, &o, &plan)) return 1;
    const reshard_buffer_t *mine = turn == rank ? &short_b : rank == 0 ? &sb : &db;
    reshard_result_t r = rank == 0 ? reshard_plan_execute_sized(plan, 0, mine, 1, NULL, 0, NULL)
                                   : reshard_plan_execute_sized(plan, 0, NULL, 0, mine, 1, NULL);
    if (turn == rank) {
      c->short_code[rank] = r;
      snprintf(c->short_msg[rank], MSG_LEN, "%s", reshard_last_error());
    } else {
      c->partner_code[rank] = r;
      snprintf(c->partner_msg[rank], MSG_LEN, "%s", reshard_last_error());
    }
    c->untouched[rank] += rank == 0 ? w[3] == 3.5f : got[0] == -1 && got[7] == -1;
    reshard_plan_destroy(plan);
    pthread_barrier_wait(&c->bar);
  }
  /* rank 1 passes a NULL array with a count of 1: refused like a short
   * buffer, and rank 0 told (not left to its 20 s deadline) */
  if (reshard_plan_create(comm, c->src, c->dst, &o, &plan)) return 1;
  c->null_code[rank] = rank == 0 ? reshard_plan_execute_sized(plan, 0, &sb, 1, NULL, 0, NULL)
                                 : reshard_plan_execute_sized(plan, 0, NULL, 0, NULL, 1, NULL);
  snprintf(c->null_msg[rank], MSG_LEN, "%s", reshard_last_error());
  reshard_plan_destroy(plan);
  pthread_barrier_wait(&c->bar);
  if (reshard_plan_create(comm, c->src, c->dst, &o, &plan)) return 1;
  reshard_result_t r = rank == 0 ? reshard_plan_execute_sized(plan, 7, &sb, 1, NULL, 0, NULL)
                                 : reshard_plan_execute_sized(plan, 7, NULL, 0, &db, 1, NULL);
  if (rank == 1 && r == RESHARD_SUCCESS) {
    c->delivered = 1;
    for (int i = 0; i < 8; i++) c->delivered &= got[i] == (float)i + 0.5f;
  }
  reshard_plan_status_t st = {.struct_size = sizeof st};
  reshard_plan_get_status(plan, &st);
  reshard_plan_destroy(plan);
  return r != RESHARD_SUCCESS || st.committed_version != 7;
}

static void exec_sized_buffers(void **state) {
  (void)state;
  reshard_layout_t *src = w_whole(8, 0), *dst = w_whole(8, 1);
  sized_case c = {.src = src, .dst = dst};
  pthread_barrier_init(&c.bar, NULL, 2);
  assert_int_equal(th_run_ranks(2, sized_rank, &c), 0);
  pthread_barrier_destroy(&c.bar);
  const char *want[2][2] = {{"source buffer 0 'w' is 16 bytes", "needs 32"},
                            {"destination buffer 0 'w' is 31 bytes", "needs 32"}};
  for (int r = 0; r < 2; r++) {
    assert_int_equal(c.short_code[r], RESHARD_ERROR_INVALID_ARGUMENT);
    for (int k = 0; k < 2; k++)
      if (!has(c.short_msg[r], want[r][k])) fail_msg("rank %d: \"%s\" not in \"%s\"", r, want[r][k], c.short_msg[r]);
    assert_int_equal(c.untouched[r], 2);
    /* the partner of the short one: REMOTE, naming it and the buffer */
    assert_int_equal(c.partner_code[1 - r], RESHARD_ERROR_REMOTE);
    char who[64];
    snprintf(who, sizeof who, "rank %d rejected execute call 0", r);
    if (!has(c.partner_msg[1 - r], who) || !has(c.partner_msg[1 - r], want[r][0]))
      fail_msg("rank %d: \"%s\" / \"%s\" not in \"%s\"", 1 - r, who, want[r][0], c.partner_msg[1 - r]);
  }
  assert_int_equal(c.null_code[1], RESHARD_ERROR_INVALID_USAGE);
  if (!has(c.null_msg[1], "destination buffers: 1 given (NULL)")) fail_msg("rank 1: %s", c.null_msg[1]);
  assert_int_equal(c.null_code[0], RESHARD_ERROR_REMOTE);
  if (!has(c.null_msg[0], "rank 1 rejected execute call 0")) fail_msg("rank 0: %s", c.null_msg[0]);
  assert_true(c.delivered);
  reshard_layout_destroy(src);
  reshard_layout_destroy(dst);
}

/* Three calls that must be refused, then a valid one (one rank). */
typedef struct calls_case {
  const reshard_layout_t *src, *dst;
  reshard_result_t code[3], ok;
  char msg[3][MSG_LEN];
  int untouched, delivered;
} calls_case;

/* Records call k's code and message. */
#define RECORD(c, k, call)                                                \
  do {                                                                    \
    (c)->code[k] = (call);                                                \
    snprintf((c)->msg[k], MSG_LEN, "%s", reshard_last_error());           \
  } while (0)

/* Calls 0..2 were refused with `code`, naming rank 0 and want[k]; the
 * destination stayed untouched; the valid call then delivered. */
static void expect_calls(const calls_case *c, reshard_result_t code, const char *const want[3]) {
  for (int k = 0; k < 3; k++) {
    assert_int_equal(c->code[k], code);
    if (!has(c->msg[k], want[k]) || !has(c->msg[k], "rank 0")) fail_msg("call %d: \"%s\" not in \"%s\"", k, want[k], c->msg[k]);
  }
  assert_true(c->untouched);
  assert_int_equal(c->ok, RESHARD_SUCCESS);
  assert_true(c->delivered);
}

/* reshard_plan_execute_sized reads its arrays only up to counts the
 * layout can have (issue 42, defect 3): a count of 2 with a 1-entry array
 * was read past (ASan: stack-buffer-overflow), 2^61 - 1 wrapped the size
 * of its copies (release build: segfault). Each is refused with
 * INVALID_USAGE naming both counts, the destination untouched; then the
 * right counts move every element. One rank, a local copy. */
static int counts_rank(int rank, reshard_comm_t *comm, void *arg) {
  (void)rank;
  calls_case *c = arg;
  reshard_plan_t *plan = NULL;
  if (reshard_plan_create(comm, c->src, c->dst, NULL, &plan)) return 1;
  float w[8], got[8];
  for (int i = 0; i < 8; i++) w[i] = (float)i + 0.25f, got[i] = -1;
  reshard_buffer_t sb[1] = {{w, sizeof w}}, db[1] = {{got, sizeof got}};
  RECORD(c, 0, reshard_plan_execute_sized(plan, 0, sb, 2, db, 1, NULL));
  RECORD(c, 1, reshard_plan_execute_sized(plan, 0, sb, ((size_t)1 << 61) - 1, db, 1, NULL));
  RECORD(c, 2, reshard_plan_execute_sized(plan, 0, sb, 1, db, SIZE_MAX, NULL));
  c->untouched = 1;
  for (int i = 0; i < 8; i++) c->untouched &= got[i] == -1;
  c->ok = reshard_plan_execute_sized(plan, 0, sb, 1, db, 1, NULL);
  c->delivered = 1;
  for (int i = 0; i < 8; i++) c->delivered &= got[i] == (float)i + 0.25f;
  reshard_plan_destroy(plan);
  return 0;
}

static void exec_sized_counts(void **state) {
  (void)state;
  reshard_layout_t *src = w_whole(8, 0), *dst = w_whole(8, 0);
  calls_case c = {.src = src, .dst = dst};
  assert_int_equal(th_run_ranks(1, counts_rank, &c), 0);
  const char *want[3] = {"2 source and 1 destination buffers given, the layout has 1 and 1",
                         "2305843009213693951 source and 1 destination buffers given",
                         "1 source and 18446744073709551615 destination buffers given"};
  expect_calls(&c, RESHARD_ERROR_INVALID_USAGE, want);
  reshard_layout_destroy(src);
  reshard_layout_destroy(dst);
}

/* Destination buffers sharing memory (issue 42, item 6): two buffers on
 * one array, overlapping views, and a double-buffered plan's two copies
 * at one address were accepted and silently took each other's bytes.
 * Each is refused naming both buffers, nothing written; disjoint views of
 * one array then receive every element. One rank, local copies. */
static int overlap_rank(int rank, reshard_comm_t *comm, void *arg) {
  (void)rank;
  calls_case *c = arg;
  reshard_plan_t *plan = NULL, *db = NULL;
  reshard_options_t o = RESHARD_OPTIONS_INITIALIZER;
  if (reshard_plan_create(comm, c->src, c->dst, NULL, &plan)) return 1;
  o.flags = RESHARD_FLAG_DOUBLE_BUFFER;
  if (reshard_plan_create(comm, c->src, c->dst, &o, &db)) return 1;
  float a[8], b[8], d[24];
  for (int i = 0; i < 8; i++) a[i] = (float)i, b[i] = (float)i + 100;
  for (int i = 0; i < 24; i++) d[i] = -1;
  void *src[2] = {a, b};
  void *same[2] = {d, d}, *views[2] = {d + 4, d}, *copies[4] = {d, d + 8, d, d + 16};
  RECORD(c, 0, reshard_plan_execute(plan, src, 2, same, 2, NULL));
  RECORD(c, 1, reshard_plan_execute(plan, src, 2, views, 2, NULL));
  RECORD(c, 2, reshard_plan_execute(db, src, 2, copies, 4, NULL));
  c->untouched = 1;
  for (int i = 0; i < 24; i++) c->untouched &= d[i] == -1;
  void *apart[2] = {d, d + 8};
  c->ok = reshard_plan_execute(plan, src, 2, apart, 2, NULL);
  c->delivered = 1;
  for (int i = 0; i < 8; i++) c->delivered &= d[i] == a[i] && d[8 + i] == b[i] && d[16 + i] == -1;
  reshard_plan_destroy(plan);
  reshard_plan_destroy(db);
  return 0;
}

static void exec_dst_overlap(void **state) {
  (void)state;
  reshard_layout_t *src = new_layout(), *dst = new_layout();
  int ms = add_mesh1(src, 1, 0), md = add_mesh1(dst, 1, 0);
  place1(src, add_t1(src, "a", RESHARD_FP32, 8), ms, reshard_replicate());
  place1(src, add_t1(src, "b", RESHARD_FP32, 8), ms, reshard_replicate());
  place1(dst, add_t1(dst, "a", RESHARD_FP32, 8), md, reshard_replicate());
  place1(dst, add_t1(dst, "b", RESHARD_FP32, 8), md, reshard_replicate());
  calls_case c = {.src = src, .dst = dst};
  assert_int_equal(th_run_ranks(1, overlap_rank, &c), 0);
  const char *want[3] = {"destination buffers 0 'a' and 1 'b' share memory (bytes 0 .. 32",
                         "destination buffers 1 'b' and 0 'a' share memory (bytes 16 .. 32",
                         "destination buffers 0 'a' copy 0 and 0 'a' copy 1 share memory"};
  expect_calls(&c, RESHARD_ERROR_INVALID_ARGUMENT, want);
  reshard_layout_destroy(src);
  reshard_layout_destroy(dst);
}

/* reshard_plan_destroy while another thread of the rank is inside an
 * execute of the plan (issue 42, item 7: a use-after-free): destroy waits
 * for the execute to return (here at its 400 ms deadline: the partner
 * never executes), then frees. ASan (CI) reports the use-after-free
 * without the wait. */
typedef struct race_case {
  const reshard_layout_t *src, *dst;
  reshard_plan_t *plan;
  reshard_result_t code;
  int64_t returned_ns, destroyed_ns;
} race_case;

static void *race_execute(void *arg) {
  race_case *c = arg;
  float w[8] = {0};
  void *src[1] = {w};
  c->code = reshard_plan_execute(c->plan, src, 1, NULL, 0, NULL);
  c->returned_ns = rs_now_ns();
  return NULL;
}

static int race_rank(int rank, reshard_comm_t *comm, void *arg) {
  race_case *c = arg;
  reshard_options_t o = RESHARD_OPTIONS_INITIALIZER;
  o.timeout_ms = 400;
  reshard_plan_t *plan = NULL;
  if (reshard_plan_create(comm, c->src, c->dst, &o, &plan)) return 1;
  if (rank == 1) { /* the partner never executes */
    struct timespec ts = {1, 0};
    nanosleep(&ts, NULL);
    reshard_plan_destroy(plan);
    return 0;
  }
  c->plan = plan;
  pthread_t th;
  pthread_create(&th, NULL, race_execute, c);
  struct timespec ts = {0, 50 * 1000 * 1000};
  nanosleep(&ts, NULL);
  reshard_plan_destroy(plan); /* the execute is inside: destroy waits */
  c->destroyed_ns = rs_now_ns();
  pthread_join(th, NULL);
  return 0;
}

static void destroy_waits_for_execute(void **state) {
  (void)state;
  reshard_layout_t *src = w_whole(8, 0), *dst = w_whole(8, 1);
  race_case c = {.src = src, .dst = dst};
  assert_int_equal(th_run_ranks(2, race_rank, &c), 0);
  assert_int_equal(c.code, RESHARD_ERROR_TIMEOUT);
  assert_true(c.destroyed_ns >= c.returned_ns);
  reshard_layout_destroy(src);
  reshard_layout_destroy(dst);
}

/* reshard_plan_execute_refused: a binding's own refusal takes the call's
 * turn; the partner fails at once with REMOTE naming the rank and the
 * reason, nothing written, both plans failed. */
typedef struct refused_case {
  const reshard_layout_t *src, *dst;
  reshard_result_t code[2];
  char msg[2][MSG_LEN];
  int untouched, failed[2];
} refused_case;

static int refused_rank(int rank, reshard_comm_t *comm, void *arg) {
  refused_case *c = arg;
  reshard_options_t o = RESHARD_OPTIONS_INITIALIZER;
  o.timeout_ms = 20000;
  reshard_plan_t *plan = NULL;
  if (reshard_plan_create(comm, c->src, c->dst, &o, &plan)) return 1;
  float w[8] = {1, 2, 3, 4, 5, 6, 7, 8}, got[8];
  for (int i = 0; i < 8; i++) got[i] = -1;
  void *src[1] = {w};
  c->code[rank] = rank == 1 ? reshard_plan_execute_refused(plan, 3, RESHARD_ERROR_INVALID_ARGUMENT,
                                                           "binding: dst buffer 'w' is read-only")
                            : reshard_plan_execute_version(plan, 3, src, 1, NULL, 0, NULL);
  snprintf(c->msg[rank], MSG_LEN, "%s", reshard_last_error());
  if (rank == 1) {
    c->untouched = 1;
    for (int i = 0; i < 8; i++) c->untouched &= got[i] == -1;
  }
  reshard_plan_status_t st = {.struct_size = sizeof st};
  reshard_plan_get_status(plan, &st);
  c->failed[rank] = st.failed;
  reshard_plan_destroy(plan);
  return 0;
}

static void exec_refused_by_caller(void **state) {
  (void)state;
  reshard_layout_t *src = w_whole(8, 0), *dst = w_whole(8, 1);
  refused_case c = {.src = src, .dst = dst};
  assert_int_equal(th_run_ranks(2, refused_rank, &c), 0);
  assert_int_equal(c.code[1], RESHARD_ERROR_INVALID_ARGUMENT);
  if (!has(c.msg[1], "read-only")) fail_msg("rank 1: %s", c.msg[1]);
  assert_int_equal(c.code[0], RESHARD_ERROR_REMOTE);
  if (!has(c.msg[0], "rank 1 rejected execute call 0") || !has(c.msg[0], "dst buffer 'w' is read-only"))
    fail_msg("rank 0: %s", c.msg[0]);
  assert_true(c.untouched);
  assert_true(c.failed[0] && c.failed[1]);
  reshard_layout_destroy(src);
  reshard_layout_destroy(dst);
}

/* Regressions from review (each failed before its fix). */

/* Fragments of different dtypes share element strides but not byte
 * strides: f32 [2,2] at byte 0 and f16 [2,2] at byte 8 overlap at bytes
 * 16-20 and must be rejected, not silently corrupt each other. */
static void review_overlap_mixed_dtypes(void **state) {
  (void)state;
  reshard_layout_t *src = new_layout(), *dst = new_layout();
  int a = add_t2(src, "a", RESHARD_FP32, 2, 2), bt = add_t2(src, "b", RESHARD_FP16, 2, 2);
  int m = add_mesh1(src, 1, 0);
  place1(src, a, m, reshard_replicate());
  place1(src, bt, m, reshard_replicate());
  a = add_t2(dst, "a", RESHARD_FP32, 2, 2);
  bt = add_t2(dst, "b", RESHARD_FP16, 2, 2);
  int buf = -1;
  EXPECT_OK(reshard_layout_add_buffer(dst, "mixed", 1, 64, &buf));
  int64_t st[2] = {0, 0}, ex[2] = {2, 2}, strides[2] = {4, 1};
  reshard_fragment_t fa = {a, buf, st, ex, 0, strides}, fb = {bt, buf, st, ex, 8, strides};
  EXPECT_OK(reshard_layout_add_fragment(dst, &fa));
  EXPECT_OK(reshard_layout_add_fragment(dst, &fb));
  pcase c;
  pcase_init(&c, 2, src, dst);
  pcase_run(&c);
  EXPECT_RANK(&c, 1, IA, "rank 1", "overlap", "buffer 'mixed'");
  EXPECT_REMOTE(&c, 1, -1);
  reshard_layout_destroy(src);
  reshard_layout_destroy(dst);
}

/* A grouped buffer needs a real dim to group; a scalar part was accepted
 * and lowered with uninitialised strides. */
static void review_grouped_scalar(void **state) {
  (void)state;
  reshard_layout_t *L = new_layout();
  int t = -1, m = add_mesh1(L, 2, 0);
  EXPECT_OK(reshard_layout_add_tensor(L, "s", RESHARD_FP32, 0, NULL, &t));
  reshard_placement_t rep[1] = {reshard_replicate()};
  reshard_part_t part = {t, m, rep, NULL};
  int b = -1;
  assert_int_equal(reshard_layout_add_fused(L, "fused", -1, 2, 1, &part, &b), IA);
  assert_non_null(strstr(reshard_last_error(), "buffer 'fused'"));
  assert_int_equal(reshard_layout_num_buffers(L), 0);
  reshard_layout_destroy(L);
}

/* The per-group block sum of a grouped buffer must not overflow. */
static void review_grouped_overflow(void **state) {
  (void)state;
  reshard_layout_t *L = new_layout();
  int m = add_mesh1(L, 1, 0);
  int64_t big = (int64_t)1 << 62;
  reshard_placement_t rep[1] = {reshard_replicate()};
  reshard_part_t parts[4];
  for (int i = 0; i < 4; i++) {
    char name[8];
    snprintf(name, sizeof name, "t%d", i);
    parts[i] = (reshard_part_t){add_t1(L, name, RESHARD_UINT8, big), m, rep, NULL};
  }
  int b = -1;
  EXPECT_OK(reshard_layout_add_fused(L, "g", 0, 2, 4, parts, &b));
  size_t bytes = 0;
  assert_int_equal(reshard_layout_buffer_bytes(L, b, 0, &bytes), IA);
  assert_non_null(strstr(reshard_last_error(), "overflow"));
  reshard_layout_destroy(L);
}

/* A huge timeout means no deadline, not an overflowed one. */
static void review_huge_timeout(void **state) {
  (void)state;
  reshard_layout_t *src = w_whole(8, 0), *dst = w_whole(8, 1);
  th_sync_args a = {.src = src, .dst = dst, .opts = RESHARD_OPTIONS_INITIALIZER, .steps = 1};
  a.opts.timeout_ms = INT64_MAX;
  assert_int_equal(th_sync(2, &a), 0);
  a.opts.timeout_ms = 10000000000000LL;
  assert_int_equal(th_sync(2, &a), 0);
  reshard_layout_destroy(src);
  reshard_layout_destroy(dst);
}

/* Two plans of identical layouts on one communicator, executed in
 * opposite orders by sender and receiver: each must get its own data
 * (plans are told apart in message tags), not the other's. An execute
 * returns only once its partner entered it (the agreement), so the
 * receiver runs its two executes on two threads. */
typedef struct two_plans {
  const reshard_layout_t *src, *dst;
  int bad;
} two_plans;

typedef struct exec_job {
  const reshard_plan_t *plan;
  void **dst;
  reshard_result_t r;
} exec_job;

static void *exec_job_run(void *p) {
  exec_job *j = p;
  j->r = reshard_plan_execute(j->plan, NULL, 0, j->dst, 1, NULL);
  return NULL;
}

static int two_plans_rank(int rank, reshard_comm_t *comm, void *p) {
  two_plans *x = p;
  reshard_plan_t *p1 = NULL, *p2 = NULL;
  reshard_options_t o = RESHARD_OPTIONS_INITIALIZER;
  o.timeout_ms = 5000;
  if (reshard_plan_create(comm, x->src, x->dst, &o, &p1) || reshard_plan_create(comm, x->src, x->dst, &o, &p2)) return 1;
  float s1[4] = {1, 1, 1, 1}, s2[4] = {2, 2, 2, 2}, d1[4] = {0}, d2[4] = {0};
  void *S1[1] = {s1}, *S2[1] = {s2}, *D1[1] = {d1}, *D2[1] = {d2};
  int rc = 0;
  if (rank == 0) { /* the sender: plan 2 first */
    rc |= reshard_plan_execute(p2, S2, 1, NULL, 0, NULL) != 0;
    rc |= reshard_plan_execute(p1, S1, 1, NULL, 0, NULL) != 0;
  } else {
    exec_job j2 = {p2, D2, RESHARD_ERROR_INTERNAL};
    pthread_t th;
    if (pthread_create(&th, NULL, exec_job_run, &j2)) return 1;
    rc |= reshard_plan_execute(p1, NULL, 0, D1, 1, NULL) != 0;
    pthread_join(th, NULL);
    rc |= j2.r != 0;
    for (int i = 0; i < 4; i++) x->bad += (d1[i] != 1) + (d2[i] != 2);
  }
  reshard_plan_destroy(p1);
  reshard_plan_destroy(p2);
  return rc;
}

static void review_two_plans_same_layouts(void **state) {
  (void)state;
  reshard_layout_t *src = w_whole(4, 0), *dst = w_whole(4, 1);
  two_plans x = {src, dst, 0};
  assert_int_equal(th_run_ranks(2, two_plans_rank, &x), 0);
  assert_int_equal(x.bad, 0);
  reshard_layout_destroy(src);
  reshard_layout_destroy(dst);
}

/* One CMocka test per row of a case table, named by the row, run by fn
 * with the row as its state. */
#define ADD_ROWS(tests, n, rows, fn)                                                    \
  for (size_t i_ = 0; i_ < sizeof rows / sizeof *rows; i_++)                            \
  (tests)[(n)++] = (struct CMUnitTest) { (rows)[i_].name, (fn), NULL, NULL, &(rows)[i_] }

int main(void) {
  struct CMUnitTest tests[128] = {
      cmocka_unit_test(layout_tensor_errors),
      cmocka_unit_test(layout_mesh_errors),
      cmocka_unit_test(layout_place_errors),
      cmocka_unit_test(layout_fused_errors),
      cmocka_unit_test(layout_raw_errors),
      cmocka_unit_test(layout_query_errors),
      cmocka_unit_test(strings_and_versions),
      cmocka_unit_test(plan_tensor_not_covered),
      cmocka_unit_test(plan_coverage_hole),
      cmocka_unit_test(review_overlap_mixed_dtypes),
      cmocka_unit_test(review_grouped_scalar),
      cmocka_unit_test(review_grouped_overflow),
      cmocka_unit_test(review_huge_timeout),
      cmocka_unit_test(review_two_plans_same_layouts),
      cmocka_unit_test(plan_ranks_outside_comm),
      cmocka_unit_test(plan_rank_disagreement),
      cmocka_unit_test(plan_split_sizes_sum),
      cmocka_unit_test(exec_bad_args),
      cmocka_unit_test(exec_null_buffer_one_rank),
      cmocka_unit_test(exec_retry_after_failed_execute),
      cmocka_unit_test(exec_sized_buffers),
      cmocka_unit_test(exec_sized_counts),
      cmocka_unit_test(exec_dst_overlap),
      cmocka_unit_test(destroy_waits_for_execute),
      cmocka_unit_test(exec_refused_by_caller),
  };
  size_t n = 0;
  while (tests[n].name) n++;
  ADD_ROWS(tests, n, raw_rows, plan_raw_case);
  ADD_ROWS(tests, n, tensor_rows, plan_tensor_case);
  ADD_ROWS(tests, n, option_rows, plan_option_case);
  ADD_ROWS(tests, n, disagree_rows, plan_disagree_case);
  assert_true(n <= sizeof tests / sizeof *tests);
  return _cmocka_run_group_tests("test_bad_input", tests, n, NULL, NULL);
}
