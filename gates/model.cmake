# gates/model.cmake (issue 5): the Gemma 4 model gates of the real CUDA engine, included by
# gates/CMakeLists.txt before its manifest check. The HF fixtures are made on the runner by the
# gates themselves (gates/hf/make_refs.py into <build>/hf_refs, on first use).
twinstep_add_gate(model_gates SOURCES model_gates.cc)
target_link_libraries(model_gates PRIVATE twinstep_sim nlohmann_json::nlohmann_json)
target_compile_definitions(model_gates PRIVATE
  TWINSTEP_SOURCE_DIR="${PROJECT_SOURCE_DIR}" TWINSTEP_BINARY_DIR="${CMAKE_BINARY_DIR}")
# The CLI gate runs twinstep-generate from the build tree.
add_dependencies(model_gates twinstep-generate)
# Issue 15: a prefix-cache hit gives the cold run's greedy tokens and logits on the device.
twinstep_add_gate(prefix_cache_gates SOURCES prefix_cache_gates.cc)
target_link_libraries(prefix_cache_gates PRIVATE nlohmann_json::nlohmann_json)
target_compile_definitions(prefix_cache_gates PRIVATE
  TWINSTEP_SOURCE_DIR="${PROJECT_SOURCE_DIR}" TWINSTEP_BINARY_DIR="${CMAKE_BINARY_DIR}")
# Issue 17: the tensor-parallel forward on one GPU (the loopback clique) against the unsplit one.
twinstep_add_gate(tp_gates SOURCES tp_gates.cc)
target_link_libraries(tp_gates PRIVATE twinstep_sim nlohmann_json::nlohmann_json)
target_compile_definitions(tp_gates PRIVATE
  TWINSTEP_SOURCE_DIR="${PROJECT_SOURCE_DIR}" TWINSTEP_BINARY_DIR="${CMAKE_BINARY_DIR}")
# ... and across two GPUs over NCCL (label multi, manifests/gpu-multi-gates.json).
twinstep_add_multi_gate(tp_multi_gates SOURCES tp_multi_gates.cc)
target_link_libraries(tp_multi_gates PRIVATE nlohmann_json::nlohmann_json)
target_compile_definitions(tp_multi_gates PRIVATE
  TWINSTEP_SOURCE_DIR="${PROJECT_SOURCE_DIR}" TWINSTEP_BINARY_DIR="${CMAKE_BINARY_DIR}")
# Not a test: TP=N against TP=1 on the 12B geometry (NCCL on N GPUs, or --loopback on one).
add_executable(tp_throughput_bench tp_throughput_bench.cc)
target_link_libraries(tp_throughput_bench PRIVATE twinstep_kernels)
