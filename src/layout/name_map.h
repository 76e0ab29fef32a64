/* Open-addressing index from names to ids (tensors, buffers): the slots
 * keep each name's hash, so growing never looks at the names again. */
#ifndef RS_LAYOUT_NAME_MAP_H
#define RS_LAYOUT_NAME_MAP_H

#include <stddef.h>
#include <stdint.h>

#include "reshard.h"

typedef struct rs_name_map {
  int32_t *ids;     /* -1: empty */
  uint64_t *hashes; /* the hash of each slot's name */
  size_t cap, n;
} rs_name_map;

/* The name of item `id`, for comparisons on a hash match. */
typedef const char *(*rs_name_of)(const void *ctx, int32_t id);

uint64_t rs_name_hash(const char *name);
/* The id whose name is `name` (hash h), or -1. */
int32_t rs_name_map_find(const rs_name_map *m, const char *name, uint64_t h, rs_name_of name_of, const void *ctx);
/* Room for n names in all, so that rs_name_map_put cannot fail. */
reshard_result_t rs_name_map_reserve(rs_name_map *m, size_t n);
/* Adds id under hash h (after rs_name_map_reserve(m, m->n + 1)). */
void rs_name_map_put(rs_name_map *m, int32_t id, uint64_t h);
void rs_name_map_free(rs_name_map *m);

#endif
