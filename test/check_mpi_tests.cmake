# Every ctest test that starts mpiexec gets its own Open MPI session folder
# (spindle_mpi_test in test/CMakeLists.txt): without one, two tests that
# ctest -j starts at once race to create <tmp>/ompi.<host>.<uid> and one
# fails. Reads the test list of the build folder BUILD (ctest
# --show-only=json-v1) and fails when
#   - a test's command names mpiexec (MPIEXEC) but its environment lacks
#     SPINDLE_MPI_TEST_ENV (OMPI_MCA_pml=ob1) or a session folder
#     (OMPI_MCA_orte_tmpdir_base);
#   - two tests share a session folder;
#   - fewer than MIN tests start mpiexec (the check checked nothing).
# Usage: cmake -DBUILD=dir -DMPIEXEC=path -DCTEST=path -DMIN=n -DSELF=this-test's-name
#              -P check_mpi_tests.cmake
cmake_minimum_required(VERSION 3.25)   # string(JSON), IN_LIST
foreach(var BUILD MPIEXEC CTEST MIN SELF)
  if(NOT DEFINED ${var})
    message(FATAL_ERROR "check_mpi_tests: -D${var}=... is required")
  endif()
endforeach()
execute_process(COMMAND ${CTEST} --show-only=json-v1 WORKING_DIRECTORY ${BUILD}
                OUTPUT_VARIABLE json RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "check_mpi_tests: ctest --show-only=json-v1 in ${BUILD} failed (${rc})")
endif()
get_filename_component(mpiexec_name "${MPIEXEC}" NAME)
string(JSON count LENGTH "${json}" tests)
set(mpi_tests 0)
set(folders "")
set(failures "")
math(EXPR last "${count} - 1")
foreach(i RANGE ${last})
  string(JSON name GET "${json}" tests ${i} name)
  # The command: a JSON array of strings (absent for a test with none).
  string(JSON command ERROR_VARIABLE no_command GET "${json}" tests ${i} command)
  if(name STREQUAL SELF OR no_command OR NOT command MATCHES "${mpiexec_name}")
    continue()
  endif()
  math(EXPR mpi_tests "${mpi_tests} + 1")
  set(env "")
  string(JSON nprops ERROR_VARIABLE no_props LENGTH "${json}" tests ${i} properties)
  if(NOT no_props AND nprops GREATER 0)
    math(EXPR plast "${nprops} - 1")
    foreach(p RANGE ${plast})
      string(JSON pname GET "${json}" tests ${i} properties ${p} name)
      if(pname STREQUAL "ENVIRONMENT")
        string(JSON env GET "${json}" tests ${i} properties ${p} value)
      endif()
    endforeach()
  endif()
  if(NOT env MATCHES "OMPI_MCA_pml=ob1")
    list(APPEND failures "${name}: starts ${mpiexec_name} without SPINDLE_MPI_TEST_ENV")
  endif()
  if(NOT env MATCHES "OMPI_MCA_orte_tmpdir_base=([^\";]+)")
    list(APPEND failures "${name}: starts ${mpiexec_name} without a session folder of its own (spindle_mpi_test)")
    continue()
  endif()
  set(folder "${CMAKE_MATCH_1}")
  if(folder IN_LIST folders)
    list(APPEND failures "${name}: shares its session folder ${folder} with another test")
  endif()
  list(APPEND folders "${folder}")
endforeach()
if(mpi_tests LESS MIN)
  list(APPEND failures "only ${mpi_tests} tests start ${mpiexec_name}, expected at least ${MIN}")
endif()
if(failures)
  list(JOIN failures "\n  " text)
  message(FATAL_ERROR "check_mpi_tests:\n  ${text}")
endif()
message(STATUS "check_mpi_tests: ${mpi_tests} tests start ${mpiexec_name}, each with its own session folder")
