# A short libFuzzer run over the checked-in corpus: a crash (any violation aborts) fails it.
# Run by ctest as cmake -DFUZZER=... -DCORPUS=... -DWORK=... -P fuzz_smoke.cmake.
cmake_minimum_required(VERSION 3.25)
if(NOT EXISTS "${FUZZER}")
  message(FATAL_ERROR "no fuzzer binary at ${FUZZER}")
endif()
# New inputs go to WORK (the first corpus directory); the checked-in corpus is only read.
file(REMOVE_RECURSE "${WORK}")
file(MAKE_DIRECTORY "${WORK}")
execute_process(
  COMMAND "${FUZZER}" -seed=1 -runs=4000 -max_total_time=60 -max_len=1024 -timeout=30
          -print_final_stats=1 "${WORK}" "${CORPUS}"
  OUTPUT_VARIABLE out ERROR_VARIABLE err RESULT_VARIABLE rc)
string(LENGTH "${err}" len)
if(len GREATER 6000)
  math(EXPR from "${len} - 6000")
  string(SUBSTRING "${err}" ${from} -1 err)
endif()
message("${out}${err}")
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "the fuzzer exited ${rc}")
endif()
string(FIND "${err}" "Done " done)
if(done EQUAL -1)
  message(FATAL_ERROR "the fuzzer did not report finishing its runs")
endif()
