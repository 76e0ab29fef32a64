# The GPU backend's tests on the emulated device (tests/device-emul/:
# mocked CUDA and NCCL, no GPU needed), included from cmake/cuda.cmake
# (CUDA builds only). They run on every machine.
enable_testing()
find_package(PkgConfig QUIET)
if(PkgConfig_FOUND)
  pkg_check_modules(RS_GPU_CMOCKA QUIET IMPORTED_TARGET cmocka)
endif()
set(RS_GPU_TEST_DIR ${PROJECT_SOURCE_DIR}/tests/device-emul)
if(NOT RS_GPU_CMOCKA_FOUND)
  message(STATUS "  GPU tests: CMocka not found, the emulated-device tests not built")
endif()

if(RS_GPU_CMOCKA_FOUND)
# The tile body of the kernels, emulated on the CPU against rs_copy_run.
add_executable(test_gpu_tiles_emul ${RS_GPU_TEST_DIR}/test_tiles_emul.c)
target_compile_options(test_gpu_tiles_emul PRIVATE ${RESHARD_WARNINGS})
target_include_directories(test_gpu_tiles_emul PRIVATE ${PROJECT_SOURCE_DIR}/tests)
target_link_libraries(test_gpu_tiles_emul PRIVATE reshard_static PkgConfig::RS_GPU_CMOCKA)
add_test(NAME test_gpu_tiles_emul COMMAND test_gpu_tiles_emul)
set_tests_properties(test_gpu_tiles_emul PROPERTIES TIMEOUT 300)

# The NCCL transport and device executor against mocked CUDA and NCCL
# (-Wl,--wrap): call sequences and error paths, no GPU or driver needed.
set(RS_GPU_WRAPPED
  ncclSend ncclRecv ncclGroupStart ncclGroupEnd ncclCommGetAsyncError
  ncclGetLastError ncclCommAbort ncclMemAlloc ncclMemFree ncclAllReduce
  ncclCommCount ncclCommUserRank ncclCommDestroy ncclCommSplit ncclCommFinalize
  ncclCommCuDevice ncclGroupSimulateEnd cudaGetDevice cudaSetDevice
  cudaMemcpyAsync cudaMallocAsync cudaMalloc cudaMallocHost cudaFree
  cudaFreeAsync cudaFreeHost cudaStreamCreateWithFlags cudaStreamDestroy
  cudaStreamSynchronize cudaStreamQuery cudaStreamWaitEvent
  cudaEventCreateWithFlags cudaEventDestroy cudaEventRecord cudaEventQuery
  cudaEventSynchronize cudaDeviceSynchronize rs_cuda_launch_copies_gated
  rs_cuda_agree_stamp rs_cuda_agree_check rs_cuda_agree_export rs_cuda_agree_import
  cudaIpcGetMemHandle cudaIpcOpenMemHandle cudaIpcCloseMemHandle cudaMemset cudaMemcpy getpid
  rs_cuda_ipc_post rs_cuda_ipc_pull rs_cuda_ipc_ack rs_cuda_ipc_acked rs_cuda_ipc_max
  rs_cuda_commit_select rs_cuda_commit_vote rs_cuda_commit_flip rs_cuda_mem_range rs_cuda_verify_sums
  rs_cuda_verify_compare cudaMemsetAsync rs_cuda_quantize rs_cuda_agree_absorb
  cudaEventRecordWithFlags cudaLaunchHostFunc cudaStreamBeginCapture cudaStreamEndCapture
  cudaStreamIsCapturing cudaGraphInstantiate cudaGraphLaunch cudaGraphExecDestroy cudaGraphDestroy
  cudaThreadExchangeStreamCaptureMode)
# An executable over the emulated device (mock_device.c, every symbol of
# RS_GPU_WRAPPED wrapped), with the random layouts of tests/support.
function(rs_gpu_emulated_exe name src)
  add_executable(${name} ${RS_GPU_TEST_DIR}/${src} ${RS_GPU_TEST_DIR}/mock_device.c
    ${RS_GPU_TEST_DIR}/mock_world.c ${PROJECT_SOURCE_DIR}/tests/support/random_layout.c)
  target_compile_options(${name} PRIVATE ${RESHARD_WARNINGS})
  target_include_directories(${name} PRIVATE ${PROJECT_SOURCE_DIR}/tests)
  target_link_libraries(${name} PRIVATE reshard_tools reshard_static PkgConfig::RS_GPU_CMOCKA)
  foreach(fn ${RS_GPU_WRAPPED})
    target_link_options(${name} PRIVATE "LINKER:--wrap=${fn}")
  endforeach()
endfunction()

rs_gpu_emulated_exe(test_gpu_nccl_mock test_nccl_mock.c)
add_test(NAME test_gpu_nccl_mock COMMAND test_gpu_nccl_mock)
set_tests_properties(test_gpu_nccl_mock PROPERTIES TIMEOUT 300)

# The multi-rank hazards of the NCCL path (issue 23) on the emulated device.
rs_gpu_emulated_exe(test_gpu_nccl_hazards test_nccl_hazards.c)
add_test(NAME test_gpu_nccl_hazards COMMAND test_gpu_nccl_hazards)
set_tests_properties(test_gpu_nccl_hazards PROPERTIES TIMEOUT 300)

# The CUDA IPC transport (issue 16) on the emulated device, over the
# in-process host communicator.
rs_gpu_emulated_exe(test_gpu_cuda_ipc test_cuda_ipc.c)
add_test(NAME test_gpu_cuda_ipc COMMAND test_gpu_cuda_ipc)
set_tests_properties(test_gpu_cuda_ipc PROPERTIES TIMEOUT 300)

# Source-side spreading on device transports (issue 44): the pre-plan's
# device scratch, over NCCL and CUDA IPC, with block quantization too.
rs_gpu_emulated_exe(test_gpu_spread test_spread_device.c)
add_test(NAME test_gpu_spread COMMAND test_gpu_spread)
set_tests_properties(test_gpu_spread PROPERTIES TIMEOUT 300)

# GPU memory over UCX (issue 46): real UCX communicators between the rank
# threads under the UCX (CUDA) transport, its capability query wrapped
# (the emulated device's memory is host memory).
if(RESHARD_WITH_UCX)
  rs_gpu_emulated_exe(test_gpu_ucx_cuda test_ucx_cuda.c)
  # the capability query, the end of a failed call's transfers, and UCX's
  # registrations and tagged messages (every pool registered once and
  # released; messages name live ones)
  target_link_options(test_gpu_ucx_cuda PRIVATE "LINKER:--wrap=rs_ux_device_memtype,--wrap=rs_ux_settle"
                      "LINKER:--wrap=ucp_mem_map,--wrap=ucp_mem_unmap"
                      "LINKER:--wrap=ucp_tag_send_nbx,--wrap=ucp_tag_recv_nbx")
  add_test(NAME test_gpu_ucx_cuda COMMAND test_gpu_ucx_cuda)
  set_tests_properties(test_gpu_ucx_cuda PROPERTIES TIMEOUT 300)
endif()

# CUDA graphs (issue 17, item 6): executes captured and launched on the
# emulated device, whose captures keep CUDA's rules.
rs_gpu_emulated_exe(test_gpu_graphs test_graphs.c)
add_test(NAME test_gpu_graphs COMMAND test_gpu_graphs)
set_tests_properties(test_gpu_graphs PROPERTIES TIMEOUT 300)

# The same mock with real MPI: reshard_comm_create_nccl_with_mpi, whose
# plan agreement runs over MPI, one mocked NCCL rank per MPI process (only
# those tests run in this build of the file).
if(RESHARD_WITH_MPI)
  rs_gpu_emulated_exe(test_gpu_nccl_mpi_mock test_nccl_mock.c)
  target_compile_definitions(test_gpu_nccl_mpi_mock PRIVATE RS_MOCK_MPI=1)
  # the single-process tests are compiled but not run here
  target_compile_options(test_gpu_nccl_mpi_mock PRIVATE -Wno-unused-function)
  target_link_libraries(test_gpu_nccl_mpi_mock PRIVATE MPI::MPI_C)
  foreach(np 1 2)
    add_test(NAME test_gpu_nccl_mpi_mock_np${np}
             COMMAND ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} ${np} --oversubscribe
                     ${MPIEXEC_PREFLAGS} $<TARGET_FILE:test_gpu_nccl_mpi_mock> ${MPIEXEC_POSTFLAGS})
    set_tests_properties(test_gpu_nccl_mpi_mock_np${np} PROPERTIES TIMEOUT 300 PROCESSORS ${np}
      ENVIRONMENT "OMPI_ALLOW_RUN_AS_ROOT=1;OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1;OMPI_MCA_rmaps_base_oversubscribe=1")
    if(RESHARD_SANITIZE)
      # Open MPI itself leaks at exit; memory errors are still caught.
      set_property(TEST test_gpu_nccl_mpi_mock_np${np} APPEND PROPERTY
                   ENVIRONMENT "ASAN_OPTIONS=detect_leaks=0")
    endif()
  endforeach()
endif()
endif()
