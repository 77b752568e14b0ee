# Fails when a C++/CUDA source differs from clang-format (Google base, 100 columns; .clang-format).
# Run as: cmake -DSOURCE_DIR=... -DCLANG_FORMAT=... -P format_check.cmake
file(GLOB_RECURSE sources
  ${SOURCE_DIR}/engine/*.cc ${SOURCE_DIR}/engine/*.h
  ${SOURCE_DIR}/sim/*.cc ${SOURCE_DIR}/sim/*.h
  ${SOURCE_DIR}/text/*.cc ${SOURCE_DIR}/text/*.h
  ${SOURCE_DIR}/kernels/*.cc ${SOURCE_DIR}/kernels/*.h ${SOURCE_DIR}/kernels/*.cu ${SOURCE_DIR}/kernels/*.cuh
  ${SOURCE_DIR}/properties/*.cc ${SOURCE_DIR}/properties/*.h
  ${SOURCE_DIR}/gates/*.cc ${SOURCE_DIR}/gates/*.h
  ${SOURCE_DIR}/apps/*.cc ${SOURCE_DIR}/server/*.cc ${SOURCE_DIR}/server/*.h
  ${SOURCE_DIR}/bench/*.cc ${SOURCE_DIR}/fuzz/*.cc ${SOURCE_DIR}/fuzz/*.h)
set(bad "")
foreach(f IN LISTS sources)
  execute_process(COMMAND ${CLANG_FORMAT} --dry-run --Werror ${f}
                  RESULT_VARIABLE rc OUTPUT_QUIET ERROR_QUIET)
  if(NOT rc EQUAL 0)
    list(APPEND bad ${f})
  endif()
endforeach()
list(LENGTH sources checked)
if(bad)
  list(JOIN bad "\n  " listing)
  message(FATAL_ERROR "clang-format differs on:\n  ${listing}\nRun: clang-format -i <file>")
endif()
message(STATUS "clang-format: ${checked} files conform")
