#include "common/alloc.h"

#include <stdlib.h>
#include <string.h>

static _Thread_local long rs_alloc_countdown = -1;
static _Thread_local int rs_alloc_fired;
static _Thread_local unsigned long rs_alloc_calls;

/* Counts the call and says whether it is the one to fail. */
static int rs_alloc_should_fail(void) {
  rs_alloc_calls++;
  if (rs_alloc_countdown < 0) return 0;
  if (rs_alloc_countdown-- > 0) return 0;
  rs_alloc_fired = 1; /* countdown is now -1: one fault per arming */
  return 1;
}

void *rs_malloc(size_t bytes) {
  return rs_alloc_should_fail() ? NULL : malloc(bytes);
}

void *rs_calloc(size_t n, size_t size) {
  return rs_alloc_should_fail() ? NULL : calloc(n, size);
}

void *rs_realloc(void *ptr, size_t bytes) {
  return rs_alloc_should_fail() ? NULL : realloc(ptr, bytes);
}

char *rs_strdup(const char *s) {
  size_t n = strlen(s) + 1;
  char *p = rs_malloc(n);
  if (p) memcpy(p, s, n);
  return p;
}

void rs_alloc_fail_after(long n) {
  rs_alloc_countdown = n < 0 ? -1 : n;
  rs_alloc_fired = 0;
}

int rs_alloc_fault_fired(void) { return rs_alloc_fired; }

unsigned long rs_alloc_count(void) { return rs_alloc_calls; }

static void *(*bulk_alloc)(size_t);
static void (*bulk_release)(void *);

void rs_alloc_set_bulk(void *(*alloc)(size_t bytes), void (*release)(void *ptr)) {
  bulk_alloc = alloc;
  bulk_release = release;
}

void *rs_bulk_malloc(size_t bytes) { return bulk_alloc ? bulk_alloc(bytes) : rs_malloc(bytes); }

void rs_bulk_free(void *ptr) {
  if (!ptr) return;
  if (bulk_release) bulk_release(ptr);
  else free(ptr);
}
