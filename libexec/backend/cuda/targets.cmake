# The CUDA backend's targets, included by libexec/CMakeLists.txt when
# SPINDLE_CUDA (cuda.cmake). The kernels and the error check they share with
# the backend (cuda_check: abort the job naming the rank) are one static
# library that depends on nothing else of libexec; the backend, its lazy
# cuBLAS entry points and the NCCL communicator are ordinary C++ sources of
# spindle_exec.
add_library(spindle_cuda_kernels STATIC ${CMAKE_CURRENT_LIST_DIR}/cuda_kernels.cu
                                        ${CMAKE_CURRENT_LIST_DIR}/cuda_check.cpp)
target_include_directories(spindle_cuda_kernels PRIVATE ${PROJECT_SOURCE_DIR})
target_link_libraries(spindle_cuda_kernels PRIVATE CUDA::cudart MPI::MPI_CXX)
set_target_properties(spindle_cuda_kernels PROPERTIES CUDA_RUNTIME_LIBRARY Shared POSITION_INDEPENDENT_CODE ON)
target_compile_options(spindle_cuda_kernels PRIVATE $<$<COMPILE_LANGUAGE:CUDA>:-Xcompiler=-Wall,-Wextra>
                       $<$<AND:$<COMPILE_LANGUAGE:CUDA>,$<BOOL:${SPINDLE_WERROR}>>:-Werror=all-warnings>)

# cuBLAS is not linked: cublas_lazy.cpp opens it on the first call (a
# process that makes no CUDA backend never maps it: 0.33 s of CPU at every
# start otherwise). Its SONAME follows the toolkit's major version
# (libcublas.so.12, .13); the path is the fallback where the build found it.
set(SPINDLE_CUBLAS_SONAME "libcublas.so.${CUDAToolkit_VERSION_MAJOR}")
if(NOT EXISTS "${CUDAToolkit_LIBRARY_DIR}/${SPINDLE_CUBLAS_SONAME}")
  message(FATAL_ERROR "CUDA toolkit ${CUDAToolkit_VERSION}: no ${SPINDLE_CUBLAS_SONAME} in ${CUDAToolkit_LIBRARY_DIR}")
endif()
target_sources(spindle_exec PRIVATE ${CMAKE_CURRENT_LIST_DIR}/cuda_backend.cpp ${CMAKE_CURRENT_LIST_DIR}/cublas_lazy.cpp)
set_source_files_properties(${CMAKE_CURRENT_LIST_DIR}/cublas_lazy.cpp PROPERTIES COMPILE_DEFINITIONS
  "SPINDLE_CUBLAS_SONAME=\"${SPINDLE_CUBLAS_SONAME}\";SPINDLE_CUBLAS_PATH=\"${CUDAToolkit_LIBRARY_DIR}/${SPINDLE_CUBLAS_SONAME}\"")
target_link_libraries(spindle_exec PUBLIC CUDA::cudart ${CMAKE_DL_LIBS} PRIVATE spindle_cuda_kernels)
target_compile_definitions(spindle_exec PUBLIC SPINDLE_HAVE_CUDA=1)
if(SPINDLE_NCCL)
  target_sources(spindle_exec PRIVATE ${PROJECT_SOURCE_DIR}/libexec/comm/nccl_comm.cpp)
  target_include_directories(spindle_exec SYSTEM PUBLIC ${SPINDLE_NCCL_INCLUDE_DIR})
  target_link_libraries(spindle_exec PUBLIC ${SPINDLE_NCCL_LIBRARY})
  target_compile_definitions(spindle_exec PUBLIC SPINDLE_HAVE_NCCL=1)
endif()
