# cmake/python_package_dir.cmake: the folder of a Python package of the runner's PyTorch
# environment (nvidia.cudnn, nvidia.nccl: include/ and lib/ inside), for the find_*.cmake
# lookups. twinstep_python_package_dir(nvidia.nccl out_var) sets out_var to the folder `import
# nvidia.nccl` names, or "" where there is no python3 or no such package.
find_program(TWINSTEP_PYTHON3 NAMES python3)
function(twinstep_python_package_dir package out_var)
  set(dir "")
  if(TWINSTEP_PYTHON3)
    execute_process(
      COMMAND ${TWINSTEP_PYTHON3} -c "import ${package} as m; print(m.__path__[0])"
      OUTPUT_VARIABLE py_dir OUTPUT_STRIP_TRAILING_WHITESPACE
      RESULT_VARIABLE py_rc ERROR_QUIET TIMEOUT 60)
    if(py_rc EQUAL 0 AND IS_DIRECTORY "${py_dir}")
      set(dir "${py_dir}")
    endif()
  endif()
  set(${out_var} "${dir}" PARENT_SCOPE)
endfunction()
