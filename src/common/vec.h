/* Growable arrays: one growth policy for every vector in the library. */
#ifndef RS_COMMON_VEC_H
#define RS_COMMON_VEC_H

#include <stddef.h>

/* Makes *ptr (capacity *cap elements of elem bytes) hold at least need
 * elements, doubling; returns 0, or -1 (nothing changed) when out of
 * memory or the size would overflow. */
int rs_vec_reserve(void **ptr, size_t *cap, size_t need, size_t elem);

/* For `T *v; size_t n, cap;` triples: room for one more element. */
#define RS_VEC_GROW(v, n, cap) rs_vec_reserve((void **)&(v), &(cap), (n) + 1, sizeof *(v))

#endif
