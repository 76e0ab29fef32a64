#include "reshard.h"

static const struct {
  const char *name;
  size_t size;
} rs_dtypes[RESHARD_NUM_DTYPES] = {
    [RESHARD_BF16] = {"bf16", 2},        [RESHARD_FP16] = {"f16", 2},
    [RESHARD_FP32] = {"f32", 4},         [RESHARD_FP64] = {"f64", 8},
    [RESHARD_FP8_E4M3] = {"fp8e4m3", 1}, [RESHARD_FP8_E5M2] = {"fp8e5m2", 1},
    [RESHARD_INT8] = {"i8", 1},          [RESHARD_UINT8] = {"u8", 1},
    [RESHARD_INT32] = {"i32", 4},        [RESHARD_UINT32] = {"u32", 4},
    [RESHARD_INT64] = {"i64", 8},        [RESHARD_UINT64] = {"u64", 8},
    [RESHARD_BOOL] = {"bool", 1},
};

size_t reshard_dtype_size(reshard_dtype_t dtype) {
  if ((int)dtype < 0 || dtype >= RESHARD_NUM_DTYPES) return 0;
  return rs_dtypes[dtype].size;
}

const char *reshard_dtype_name(reshard_dtype_t dtype) {
  if ((int)dtype < 0 || dtype >= RESHARD_NUM_DTYPES) return "invalid";
  return rs_dtypes[dtype].name;
}
