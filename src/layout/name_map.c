/* Name index of layouts (see name_map.h). */
#include "layout/name_map.h"

#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"
#include "common/error.h"
#include "layout/layout.h"

uint64_t rs_name_hash(const char *name) { return rs_hash_bytes(name, strlen(name), 0); }

int32_t rs_name_map_find(const rs_name_map *m, const char *name, uint64_t h, rs_name_of name_of, const void *ctx) {
  if (!m->cap) return -1;
  for (size_t j = h & (m->cap - 1); m->ids[j] >= 0; j = (j + 1) & (m->cap - 1))
    if (m->hashes[j] == h && !strcmp(name_of(ctx, m->ids[j]), name)) return m->ids[j];
  return -1;
}

static void put(int32_t *ids, uint64_t *hashes, size_t cap, int32_t id, uint64_t h) {
  size_t j = h & (cap - 1);
  while (ids[j] >= 0) j = (j + 1) & (cap - 1);
  ids[j] = id;
  hashes[j] = h;
}

reshard_result_t rs_name_map_reserve(rs_name_map *m, size_t n) {
  if (n * 2 <= m->cap) return RESHARD_SUCCESS;
  size_t cap = m->cap ? m->cap : 64;
  while (n * 2 > cap) cap *= 2;
  int32_t *ids = rs_malloc(cap * sizeof *ids);
  uint64_t *hashes = rs_malloc(cap * sizeof *hashes);
  if (!ids || !hashes) {
    free(ids);
    free(hashes);
    return rs_error(RESHARD_ERROR_OUT_OF_MEMORY, "layout: out of memory (name index of %zu)", n);
  }
  for (size_t i = 0; i < cap; i++) ids[i] = -1;
  for (size_t i = 0; i < m->cap; i++)
    if (m->ids[i] >= 0) put(ids, hashes, cap, m->ids[i], m->hashes[i]);
  free(m->ids);
  free(m->hashes);
  m->ids = ids;
  m->hashes = hashes;
  m->cap = cap;
  return RESHARD_SUCCESS;
}

void rs_name_map_put(rs_name_map *m, int32_t id, uint64_t h) {
  put(m->ids, m->hashes, m->cap, id, h);
  m->n++;
}

void rs_name_map_free(rs_name_map *m) {
  free(m->ids);
  free(m->hashes);
  memset(m, 0, sizeof *m);
}
