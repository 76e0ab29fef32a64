/* libFuzzer target: layouts and options decoded from the input, every
 * rank planned, the plans' invariants checked (plan_input.h). Built with
 * -DRESHARD_FUZZ=ON -DCMAKE_C_COMPILER=clang; run from the committed seeds:
 *
 *   build-fuzz/tests/fuzz_plan -max_total_time=60 tests/fuzz/corpus
 */
#include <stddef.h>
#include <stdint.h>

#include "plan_input.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  fz_plan_input(data, size);
  return 0;
}
