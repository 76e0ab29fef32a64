# The GPU backend's tests on a real GPU (tests/gpu/), included from
# cmake/cuda.cmake (CUDA builds only). Exit code 77 means no device:
# ctest reports "skipped". scripts/gpu_check.sh runs them on a lent GPU.
set(RS_REAL_GPU_TEST_DIR ${PROJECT_SOURCE_DIR}/tests/gpu)
# On a GPU: the kernels against the host reference, and a one-rank NCCL
# plan end to end. Exit code 77 means no device: ctest reports "skipped".
add_executable(gpu_kernels ${RS_REAL_GPU_TEST_DIR}/gpu_kernels.cu)
add_executable(gpu_nccl_local ${RS_REAL_GPU_TEST_DIR}/gpu_nccl_local.c)
add_executable(gpu_bandwidth ${RS_REAL_GPU_TEST_DIR}/gpu_bandwidth.cu)
foreach(t gpu_kernels gpu_nccl_local gpu_bandwidth)
  target_include_directories(${t} PRIVATE ${PROJECT_SOURCE_DIR}/tests)
  target_link_libraries(${t} PRIVATE reshard_static CUDA::cudart_static)
  set_target_properties(${t} PROPERTIES
    CUDA_ARCHITECTURES "${RESHARD_CUDA_ARCHITECTURES}" CUDA_STANDARD 17)
endforeach()
target_compile_options(gpu_nccl_local PRIVATE ${RESHARD_WARNINGS})
target_link_libraries(gpu_nccl_local PRIVATE reshard_tools)
foreach(t gpu_kernels gpu_nccl_local)
  add_test(NAME ${t} COMMAND ${t})
  set_tests_properties(${t} PROPERTIES TIMEOUT 300 SKIP_RETURN_CODE 77)
endforeach()
