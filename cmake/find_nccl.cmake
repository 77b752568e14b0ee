# cmake/find_nccl.cmake: locate NCCL >= 2.18 for tensor parallelism (kernels/nccl_comm.cc,
# issue 17). Two homes are searched, in order:
#   1. the CUDA toolkit (CI's machines): nccl.h beside the toolkit headers, libnccl next to its
#      libraries;
#   2. PyTorch's Python environment (the GPU runner): the folder `import nvidia.nccl` names, with
#      include/ and lib/; lib/ has only the versioned libnccl.so.2.
# Sets TWINSTEP_HAVE_NCCL (ON/OFF), TWINSTEP_NCCL_VERSION, and on success the imported target
# twinstep::nccl. Not finding it is not a configure error: nccl_comm.cc then builds as a stub
# whose every call fails naming what was missing, and so do the gates that need it.
set(TWINSTEP_HAVE_NCCL OFF)
set(TWINSTEP_NCCL_VERSION "")
set(twinstep_nccl_why "")

include(${CMAKE_CURRENT_LIST_DIR}/library_homes.cmake)
twinstep_library_homes(nvidia.nccl twinstep_nccl_candidates)

foreach(pair IN LISTS twinstep_nccl_candidates)
  string(REPLACE "|" ";" pair_list "${pair}")
  list(GET pair_list 0 inc)
  list(GET pair_list 1 lib)
  if(NOT EXISTS ${inc}/nccl.h)
    continue()
  endif()
  set(lib_file "")
  foreach(name libnccl.so.2 libnccl.so)
    if(EXISTS ${lib}/${name})
      set(lib_file ${lib}/${name})
      break()
    endif()
  endforeach()
  if(lib_file STREQUAL "")
    string(APPEND twinstep_nccl_why " ${inc}/nccl.h has no libnccl.so.2 in ${lib};")
    continue()
  endif()
  file(STRINGS ${inc}/nccl.h lines REGEX "^#define NCCL_(MAJOR|MINOR|PATCH) ")
  set(version "")
  foreach(part MAJOR MINOR PATCH)
    string(REGEX MATCH "NCCL_${part} +([0-9]+)" m "${lines}")
    if(version STREQUAL "")
      set(version "${CMAKE_MATCH_1}")
    else()
      set(version "${version}.${CMAKE_MATCH_1}")
    endif()
  endforeach()
  if(version VERSION_LESS 2.18)
    string(APPEND twinstep_nccl_why " ${inc}: version '${version}' < 2.18;")
    continue()
  endif()
  set(TWINSTEP_HAVE_NCCL ON)
  set(TWINSTEP_NCCL_VERSION ${version})
  if(NOT TARGET twinstep::nccl)
    add_library(twinstep::nccl SHARED IMPORTED)
    set_target_properties(twinstep::nccl PROPERTIES
      IMPORTED_LOCATION ${lib_file}
      IMPORTED_NO_SONAME OFF
      INTERFACE_INCLUDE_DIRECTORIES ${inc})
  endif()
  message(STATUS "twinstep: NCCL ${version}: ${inc}, ${lib_file}")
  break()
endforeach()
if(NOT TWINSTEP_HAVE_NCCL)
  message(STATUS "twinstep: NCCL not found (toolkit, python nvidia.nccl):${twinstep_nccl_why}"
                 " kernels/nccl_comm builds as a stub that reports it")
endif()
