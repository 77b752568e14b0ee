# cmake/find_cudnn.cmake: locate cuDNN >= 9.10 (the paged SDPA forward at head_dim 256) for
# kernels/attention_prefill_cudnn.cc. Two homes are searched, in order:
#   1. the CUDA toolkit (CI's machines): cudnn.h beside the toolkit headers, libcudnn_graph next
#      to the toolkit libraries;
#   2. PyTorch's Python environment (the GPU runner): the folder `import nvidia.cudnn` names,
#      with include/ and lib/; lib/ has only versioned files (libcudnn_graph.so.9, no
#      unversioned link), so the library is linked by its full path.
# Only libcudnn_graph is linked: it holds the backend (graph) API and the handle; it loads its
# engine sub-libraries itself, from its own folder ($ORIGIN).
# Sets TWINSTEP_HAVE_CUDNN (ON/OFF), TWINSTEP_CUDNN_VERSION, and on success the imported target
# twinstep::cudnn_graph (include dir + library). Not finding it is not a configure error: the
# kernels build without it and the cuDNN gate fails on the runner, naming what was missing.

set(TWINSTEP_HAVE_CUDNN OFF)
set(TWINSTEP_CUDNN_VERSION "")
set(TWINSTEP_CUDNN_WHY "")

# Reads CUDNN_MAJOR/MINOR/PATCHLEVEL from <dir>/cudnn_version.h into out_var ("" if absent).
function(twinstep_cudnn_header_version dir out_var)
  set(version "")
  if(EXISTS ${dir}/cudnn_version.h)
    file(STRINGS ${dir}/cudnn_version.h lines REGEX "^#define CUDNN_(MAJOR|MINOR|PATCHLEVEL) ")
    foreach(part MAJOR MINOR PATCHLEVEL)
      string(REGEX MATCH "CUDNN_${part} +([0-9]+)" m "${lines}")
      set(${part} ${CMAKE_MATCH_1})
    endforeach()
    if(NOT "${MAJOR}" STREQUAL "" AND NOT "${MINOR}" STREQUAL "")
      set(version "${MAJOR}.${MINOR}.${PATCHLEVEL}")
    endif()
  endif()
  set(${out_var} "${version}" PARENT_SCOPE)
endfunction()

# Candidate (include dir, lib dir) pairs.
include(${CMAKE_CURRENT_LIST_DIR}/library_homes.cmake)
twinstep_library_homes(nvidia.cudnn twinstep_cudnn_candidates)

foreach(pair IN LISTS twinstep_cudnn_candidates)
  string(REPLACE "|" ";" pair_list "${pair}")
  list(GET pair_list 0 inc)
  list(GET pair_list 1 lib)
  if(NOT EXISTS ${inc}/cudnn_graph.h)
    continue()
  endif()
  set(lib_file "")
  foreach(name libcudnn_graph.so.9 libcudnn_graph.so)
    if(EXISTS ${lib}/${name})
      set(lib_file ${lib}/${name})
      break()
    endif()
  endforeach()
  if(lib_file STREQUAL "")
    string(APPEND TWINSTEP_CUDNN_WHY " ${inc}/cudnn_graph.h has no libcudnn_graph.so.9 in ${lib};")
    continue()
  endif()
  twinstep_cudnn_header_version(${inc} version)
  if(version VERSION_LESS 9.10)
    string(APPEND TWINSTEP_CUDNN_WHY " ${inc}: version '${version}' < 9.10;")
    continue()
  endif()
  set(TWINSTEP_HAVE_CUDNN ON)
  set(TWINSTEP_CUDNN_VERSION ${version})
  if(NOT TARGET twinstep::cudnn_graph)
    add_library(twinstep::cudnn_graph SHARED IMPORTED)
    set_target_properties(twinstep::cudnn_graph PROPERTIES
      IMPORTED_LOCATION ${lib_file}
      IMPORTED_NO_SONAME OFF
      INTERFACE_INCLUDE_DIRECTORIES ${inc})
  endif()
  message(STATUS "twinstep: cuDNN ${version}: ${inc}, ${lib_file}")
  break()
endforeach()
if(NOT TWINSTEP_HAVE_CUDNN)
  message(STATUS "twinstep: cuDNN not found (toolkit, python nvidia.cudnn):${TWINSTEP_CUDNN_WHY}"
                 " kernels/attention_prefill_cudnn builds as a stub that reports it")
endif()
