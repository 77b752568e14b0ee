# Fuzz runs for ctest, as cmake -DFUZZER=... -DCORPUS=... -DWORK=... [-DMODE=...] -P this.
#   MODE=smoke (default): a short libFuzzer run over the checked-in corpus; a crash (every
#     violation aborts) fails it.
#   MODE=mutants: with each mutant (-DSIM=twinstep-sim lists them) the fuzz target must crash,
#     so its checks are proven to bite. -DREPLAY=ON drives the g++ replay driver instead of
#     libFuzzer (over the corpus and seeded random inputs).
cmake_minimum_required(VERSION 3.25)
if(NOT EXISTS "${FUZZER}")
  message(FATAL_ERROR "no fuzzer binary at ${FUZZER}")
endif()
file(REMOVE_RECURSE "${WORK}")
file(MAKE_DIRECTORY "${WORK}/corpus")

function(tail text out_var)
  string(LENGTH "${text}" len)
  if(len GREATER 4000)
    math(EXPR from "${len} - 4000")
    string(SUBSTRING "${text}" ${from} -1 text)
  endif()
  set(${out_var} "${text}" PARENT_SCOPE)
endfunction()

if(NOT MODE OR MODE STREQUAL "smoke")
  # New inputs go to WORK (the first corpus directory); the checked-in corpus is only read.
  execute_process(
    COMMAND "${FUZZER}" -seed=1 -runs=4000 -max_total_time=60 -max_len=1024 -timeout=30
            -print_final_stats=1 -artifact_prefix=${WORK}/ "${WORK}/corpus" "${CORPUS}"
    OUTPUT_VARIABLE out ERROR_VARIABLE err RESULT_VARIABLE rc)
  tail("${err}" err)
  message("${out}${err}")
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "the fuzzer exited ${rc}")
  endif()
  string(FIND "${err}" "Done " done)
  if(done EQUAL -1)
    message(FATAL_ERROR "the fuzzer did not report finishing its runs")
  endif()
elseif(MODE STREQUAL "mutants")
  execute_process(COMMAND "${SIM}" --list-mutants OUTPUT_VARIABLE list RESULT_VARIABLE rc)
  string(REGEX MATCHALL "[a-z_]+" mutants "${list}")
  if(NOT rc EQUAL 0 OR NOT mutants)
    message(FATAL_ERROR "no mutants listed by ${SIM} (a build without TWINSTEP_MUTANTS?)")
  endif()
  if(REPLAY)
    set(args "${CORPUS}" --random 3000 1)
  else()
    set(args -seed=1 -runs=200000 -max_total_time=120 -max_len=1024 -artifact_prefix=${WORK}/
             "${WORK}/corpus" "${CORPUS}")
  endif()
  foreach(mutant IN LISTS mutants)
    execute_process(COMMAND ${CMAKE_COMMAND} -E env TWINSTEP_MUTANT=${mutant} "${FUZZER}" ${args}
                    OUTPUT_VARIABLE out ERROR_VARIABLE err RESULT_VARIABLE rc)
    string(REGEX MATCH "(twinstep-fuzz: [^\n]*|check failed: [^\n]*)" caught "${err}")
    message("mutant ${mutant}: exit ${rc}: ${caught}")
    if(rc EQUAL 0 OR caught STREQUAL "")
      tail("${out}${err}" shown)
      message(FATAL_ERROR "mutant ${mutant} survived the fuzz target\n${shown}")
    endif()
  endforeach()
else()
  message(FATAL_ERROR "MODE must be smoke or mutants (got '${MODE}')")
endif()
