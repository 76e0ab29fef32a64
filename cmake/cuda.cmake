# The GPU backend: CUDA copy kernels, the device executor and the NCCL
# transport, plus their tests. Included from the top-level CMakeLists.txt
# after the core targets; does nothing unless RESHARD_WITH_CUDA is ON, so
# the CPU-only build is unchanged.
if(NOT RESHARD_WITH_CUDA)
  return()
endif()

find_package(CUDAToolkit REQUIRED)

# enable_language(CUDA) fills CMAKE_CUDA_ARCHITECTURES with the compiler's
# default, so reshard keeps its own list: the datacenter GPUs it targets,
# few enough to compile quickly on a CI machine.
if(CMAKE_CUDA_COMPILER_VERSION VERSION_GREATER_EQUAL 12.8)
  set(RESHARD_CUDA_ARCHS_DEFAULT "80;90;100")
else()
  set(RESHARD_CUDA_ARCHS_DEFAULT "80;90")
endif()
set(RESHARD_CUDA_ARCHITECTURES "${RESHARD_CUDA_ARCHS_DEFAULT}" CACHE STRING
    "GPU architectures of the reshard kernels (e.g. 90 for an H100/H200 only)")

# NCCL ships with the CUDA installation here; NCCL_HOME / NCCL_ROOT point
# elsewhere.
find_path(RESHARD_NCCL_INCLUDE_DIR nccl.h
  HINTS ${CUDAToolkit_INCLUDE_DIRS} ${CUDAToolkit_ROOT}/include
        $ENV{NCCL_HOME}/include $ENV{NCCL_ROOT}/include)
find_library(RESHARD_NCCL_LIBRARY nccl
  HINTS ${CUDAToolkit_LIBRARY_DIR} ${CUDAToolkit_ROOT}/lib64
        $ENV{NCCL_HOME}/lib $ENV{NCCL_ROOT}/lib)
if(NOT RESHARD_NCCL_INCLUDE_DIR OR NOT RESHARD_NCCL_LIBRARY)
  message(FATAL_ERROR
    "RESHARD_WITH_CUDA=ON but NCCL was not found (nccl.h, libnccl) under "
    "the CUDA installation, CUDAToolkit_ROOT, NCCL_HOME or NCCL_ROOT. "
    "Install NCCL or configure with -DRESHARD_WITH_CUDA=OFF.")
endif()
message(STATUS "  NCCL                ${RESHARD_NCCL_LIBRARY}")

add_library(reshard_cuda_obj OBJECT
  ${PROJECT_SOURCE_DIR}/kernels/copy_kernels.cu
  ${PROJECT_SOURCE_DIR}/kernels/ipc_kernels.cu
  ${PROJECT_SOURCE_DIR}/kernels/verify_kernels.cu
  ${PROJECT_SOURCE_DIR}/kernels/quant_kernels.cu
  ${PROJECT_SOURCE_DIR}/src/device/quant_device.c
  ${PROJECT_SOURCE_DIR}/src/device/spread_device.c
  ${PROJECT_SOURCE_DIR}/src/transport/dev_comm.c
  ${PROJECT_SOURCE_DIR}/src/cuda/cuda_util.c
  ${PROJECT_SOURCE_DIR}/src/cuda/mem_range.c
  ${PROJECT_SOURCE_DIR}/src/device/setup.c
  ${PROJECT_SOURCE_DIR}/src/device/execute.c
  ${PROJECT_SOURCE_DIR}/src/device/table.c
  ${PROJECT_SOURCE_DIR}/src/device/verdict.c
  ${PROJECT_SOURCE_DIR}/src/device/poll.c
  ${PROJECT_SOURCE_DIR}/src/device/capture.c
  ${PROJECT_SOURCE_DIR}/src/device/peers.c
  ${PROJECT_SOURCE_DIR}/src/device/register.c
  ${PROJECT_SOURCE_DIR}/src/device/executor.c
  ${PROJECT_SOURCE_DIR}/src/device/tiles.c
  ${PROJECT_SOURCE_DIR}/src/transport/nccl.c
  ${PROJECT_SOURCE_DIR}/src/transport/cuda_ipc.c)
target_include_directories(reshard_cuda_obj PUBLIC
  $<BUILD_INTERFACE:${PROJECT_SOURCE_DIR}/include>
  $<BUILD_INTERFACE:${PROJECT_SOURCE_DIR}/src>
  $<BUILD_INTERFACE:${PROJECT_SOURCE_DIR}>
  ${RESHARD_NCCL_INCLUDE_DIR})
target_compile_definitions(reshard_cuda_obj PUBLIC
  ${RESHARD_FEATURE_DEFINITIONS})
target_compile_options(reshard_cuda_obj PRIVATE
  $<$<COMPILE_LANGUAGE:C>:${RESHARD_WARNINGS}>
  $<$<COMPILE_LANGUAGE:CUDA>:-Xcompiler=-Wall,-Wextra>)
set_target_properties(reshard_cuda_obj PROPERTIES
  CUDA_ARCHITECTURES "${RESHARD_CUDA_ARCHITECTURES}"
  CUDA_STANDARD 17 CUDA_STANDARD_REQUIRED ON)
target_link_libraries(reshard_cuda_obj PUBLIC CUDA::cudart_static Threads::Threads)
if(RESHARD_WITH_UCX)
  # GPU memory over UCX (a stream transport over a UCX host communicator)
  target_sources(reshard_cuda_obj PRIVATE ${PROJECT_SOURCE_DIR}/src/transport/ucx_cuda.c)
  target_link_libraries(reshard_cuda_obj PUBLIC PkgConfig::UCX)
endif()
if(RESHARD_WITH_MPI)
  target_link_libraries(reshard_cuda_obj PUBLIC MPI::MPI_C)
endif()

# The static runtime: binaries linking reshard run (and skip their GPU
# parts) on machines without a GPU driver.
target_sources(reshard_static PRIVATE $<TARGET_OBJECTS:reshard_cuda_obj>)
target_include_directories(reshard_static PUBLIC
  $<BUILD_INTERFACE:${PROJECT_SOURCE_DIR}> ${RESHARD_NCCL_INCLUDE_DIR})
target_link_libraries(reshard_static PUBLIC CUDA::cudart_static
                      ${RESHARD_NCCL_LIBRARY})
target_sources(reshard PRIVATE $<TARGET_OBJECTS:reshard_cuda_obj>)
target_link_libraries(reshard PRIVATE CUDA::cudart_static
                      ${RESHARD_NCCL_LIBRARY})
install(FILES ${PROJECT_SOURCE_DIR}/include/reshard_nccl.h ${PROJECT_SOURCE_DIR}/include/reshard_cuda_ipc.h
        DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})

# The GPU tests can be built without the CPU suite (scripts/gpu_check.sh
# on a machine without CMocka).
option(RESHARD_BUILD_GPU_TESTS "Build the GPU backend's tests"
       ${RESHARD_BUILD_TESTS})
if(RESHARD_BUILD_GPU_TESTS)
  include(${PROJECT_SOURCE_DIR}/tests/device-emul/tests.cmake)
  include(${PROJECT_SOURCE_DIR}/tests/gpu/tests.cmake)
endif()
