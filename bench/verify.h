/* Seeded weights and byte-exact verification for tools, examples and
 * tests: every element's value is a function of (tensor name, step, global
 * row-major index), independent of any layout, so a destination can be
 * checked without knowing where its bytes came from. Bytes outside
 * fragments (padding, gaps) are filled with a sentinel and must stay so. */
#ifndef RESHARD_BENCH_VERIFY_H
#define RESHARD_BENCH_VERIFY_H

#include <stddef.h>
#include <stdint.h>

#include "reshard.h"

#define VF_SENTINEL 0xA5

/* The bytes of element `linear` of tensor `name` at `step`. */
void vf_expected(const char *name, uint64_t step, int64_t linear,
                 size_t esize, unsigned char *out);

/* One rank's buffers for one side of a layout. */
typedef struct vf_side {
  int nbuf;
  unsigned char **ptr;  /* NULL where the rank holds nothing */
  size_t *bytes;
  unsigned char **mask; /* 1 where a fragment element lives */
  reshard_fragment_info_t *frags;
  size_t nfrags;
} vf_side;

/* Allocates this rank's buffers (sentinel-filled) and masks; when
 * fill_step >= 0 also writes that step's values into every fragment. */
int vf_side_alloc(vf_side *s, const reshard_layout_t *L, int rank,
                  int64_t fill_step);
/* Writes step's values into every fragment (the "training" update). */
void vf_side_fill(vf_side *s, const reshard_layout_t *L, uint64_t step);
/* Wrong fragment elements plus modified bytes outside fragments; prints
 * the first few with the tensor name, prefixed by label. */
int64_t vf_side_check(const vf_side *s, const reshard_layout_t *L, int rank,
                      uint64_t step, const char *label);
void vf_side_free(vf_side *s);

#endif
