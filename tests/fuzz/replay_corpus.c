/* Replays fuzzer inputs through the plan fuzzer's checks without libFuzzer,
 * so that every build runs the committed corpus (and any reproducer):
 *
 *   replay_corpus FILE_OR_DIR...
 *
 * A violated invariant abort()s with a message naming it; the file being
 * replayed is printed first. RESHARD_TEST_SCALE=f < 1 (slow runs such as
 * valgrind) replays an evenly spaced fraction f of each directory's files
 * (in name order), and every file named on the command line. */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "plan_input.h"
#include "reshard.h"
#include "support/test_scale.h"

static int outcomes[4];

static int replay_file(const char *path) {
  FILE *f = fopen(path, "rb");
  if (!f) {
    fprintf(stderr, "replay_corpus: cannot open %s\n", path);
    return -1;
  }
  uint8_t buf[1 << 16];
  size_t n = fread(buf, 1, sizeof buf, f);
  fclose(f);
  static const char *const said[4] = {"rejected", "planned", "planned, executed and checked", "not planned (too many messages)"};
  fz_outcome o = fz_plan_input(buf, n);
  outcomes[o]++;
  fprintf(stderr, "replay_corpus: %s (%zu bytes): %s%s%s\n", path, n, said[o], o == FZ_REJECTED ? ": " : "",
          o == FZ_REJECTED ? reshard_last_error() : "");
  return 0;
}

static int cmp_names(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

static int replay_path(const char *path, int *count) {
  struct stat st;
  if (stat(path, &st) != 0) {
    fprintf(stderr, "replay_corpus: no such file or directory: %s\n", path);
    return -1;
  }
  if (!S_ISDIR(st.st_mode)) {
    ++*count;
    return replay_file(path);
  }
  DIR *d = opendir(path);
  if (!d) return -1;
  char **names = NULL;
  size_t n = 0, cap = 0;
  struct dirent *e;
  while ((e = readdir(d))) {
    if (e->d_name[0] == '.') continue;
    if (n == cap) {
      cap = cap ? 2 * cap : 64;
      names = realloc(names, cap * sizeof *names);
      if (!names) return -1;
    }
    names[n++] = strdup(e->d_name);
  }
  closedir(d);
  qsort(names, n, sizeof *names, cmp_names);
  int rc = 0;
  double f = rs_test_scale();
  for (size_t i = 0; i < n; i++) {
    if (f < 1 && (long)((double)(i + 1) * f) == (long)((double)i * f)) {
      free(names[i]);
      continue;
    }
    char full[4096];
    snprintf(full, sizeof full, "%s/%s", path, names[i]);
    if (replay_path(full, count)) rc = -1;
    free(names[i]);
  }
  free(names);
  return rc;
}

int main(int argc, char **argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: replay_corpus FILE_OR_DIR...\n");
    return 2;
  }
  int count = 0, rc = 0;
  for (int i = 1; i < argc; i++)
    if (replay_path(argv[i], &count)) rc = 1;
  if (count == 0) {
    fprintf(stderr, "replay_corpus: no inputs found\n");
    return 1;
  }
  /* a corpus where nothing plans checks no invariant: something in
   * the harness (its fake communicator's limits) broke */
  if (count >= 16 && outcomes[1] + outcomes[2] == 0) {
    fprintf(stderr, "replay_corpus: none of %d inputs planned\n", count);
    rc = 1;
  }
  printf("replay_corpus: %d inputs replayed (%d rejected, %d planned, %d also executed, %d too large to plan)%s\n", count,
         outcomes[0], outcomes[1], outcomes[2], outcomes[3], rc ? ", some unreadable" : ", all invariants held");
  return rc;
}
