# cmake/library_homes.cmake: where the find_*.cmake lookups (cuDNN, NCCL) search, in order.
# twinstep_library_homes(<python package> <out_var>) sets out_var to "include|lib" pairs:
#   1. the CUDA toolkit's include dirs with its library dir (CI's machines);
#   2. the folder `import <python package>` names in the runner's PyTorch environment
#      (nvidia.cudnn, nvidia.nccl), with its include/ and lib/, where python3 has it.
find_program(TWINSTEP_PYTHON3 NAMES python3)
function(twinstep_library_homes package out_var)
  set(homes "")
  foreach(inc IN LISTS CUDAToolkit_INCLUDE_DIRS)
    list(APPEND homes "${inc}|${CUDAToolkit_LIBRARY_DIR}")
  endforeach()
  if(TWINSTEP_PYTHON3)
    execute_process(
      COMMAND ${TWINSTEP_PYTHON3} -c "import ${package} as m; print(m.__path__[0])"
      OUTPUT_VARIABLE py_dir OUTPUT_STRIP_TRAILING_WHITESPACE
      RESULT_VARIABLE py_rc ERROR_QUIET TIMEOUT 60)
    if(py_rc EQUAL 0 AND IS_DIRECTORY "${py_dir}")
      list(APPEND homes "${py_dir}/include|${py_dir}/lib")
    endif()
  endif()
  set(${out_var} "${homes}" PARENT_SCOPE)
endfunction()
