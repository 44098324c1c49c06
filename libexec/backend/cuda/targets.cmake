# The CUDA backend's targets, included by libexec/CMakeLists.txt when
# SPINDLE_CUDA (cuda.cmake). The kernels and the error check they share with
# the backend (cuda_check: abort the job naming the rank) are one static
# library that depends on nothing else of libexec; the backend and the NCCL
# communicator are ordinary C++ sources of spindle_exec.
add_library(spindle_cuda_kernels STATIC ${CMAKE_CURRENT_LIST_DIR}/cuda_kernels.cu
                                        ${CMAKE_CURRENT_LIST_DIR}/cuda_check.cpp)
target_include_directories(spindle_cuda_kernels PRIVATE ${PROJECT_SOURCE_DIR})
target_link_libraries(spindle_cuda_kernels PRIVATE CUDA::cudart CUDA::cublas MPI::MPI_CXX)
set_target_properties(spindle_cuda_kernels PROPERTIES CUDA_RUNTIME_LIBRARY Shared POSITION_INDEPENDENT_CODE ON)
target_compile_options(spindle_cuda_kernels PRIVATE $<$<COMPILE_LANGUAGE:CUDA>:-Xcompiler=-Wall,-Wextra>
                       $<$<AND:$<COMPILE_LANGUAGE:CUDA>,$<BOOL:${SPINDLE_WERROR}>>:-Werror=all-warnings>)

target_sources(spindle_exec PRIVATE ${CMAKE_CURRENT_LIST_DIR}/cuda_backend.cpp)
target_link_libraries(spindle_exec PUBLIC CUDA::cudart CUDA::cublas PRIVATE spindle_cuda_kernels)
target_compile_definitions(spindle_exec PUBLIC SPINDLE_HAVE_CUDA=1)
if(SPINDLE_NCCL)
  target_sources(spindle_exec PRIVATE ${PROJECT_SOURCE_DIR}/libexec/comm/nccl_comm.cpp)
  target_include_directories(spindle_exec SYSTEM PUBLIC ${SPINDLE_NCCL_INCLUDE_DIR})
  target_link_libraries(spindle_exec PUBLIC ${SPINDLE_NCCL_LIBRARY})
  target_compile_definitions(spindle_exec PUBLIC SPINDLE_HAVE_NCCL=1)
endif()
