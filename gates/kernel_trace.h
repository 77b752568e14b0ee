// gates/kernel_trace.h: a kernel timeline from CUPTI's activity API, for the benches (not a
// gate). Records the GPU start and end of every kernel, memset and copy between start() and
// stop(), graph nodes included, without serialising them (CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL),
// so a replayed decode graph shows what ncu cannot: the idle time between its kernels and how much
// the programmatic launches overlap. The runner has no Nsight Systems (device/KINDS.md).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace twinstep::gates {

struct KernelRecord {
  std::string name;  // demangled, without the parameter list
  uint64_t start_ns = 0;
  uint64_t end_ns = 0;
  uint32_t graph_id = 0;  // 0: launched outside a graph
};

// One trace at a time, per process. Without CUPTI at configure time (TWINSTEP_HAVE_CUPTI off)
// start() returns the reason and stop() returns nothing.
class KernelTrace {
 public:
  // "" on success, else what failed (a CUPTI call and its result).
  static std::string start();
  // Synchronises the device, flushes CUPTI's buffers, stops recording; the kernels since start()
  // in start order.
  static std::vector<KernelRecord> stop();
};

// The timeline in figures: kernels, span (first start to last end), busy (the union of the
// kernels' intervals), idle (span - busy), overlap (sum of durations - busy: what programmatic
// launches ran side by side), the kernels grouped by name (sorted by exclusive time: how far
// each moved the timeline's end), and the longest
// idle gaps with the kernels on either side. `step_ms`: the host's wall time of the step.
std::string trace_summary(const std::string& title, const std::vector<KernelRecord>& kernels,
                          double step_ms, int top_names = 24, int top_gaps = 8);

}  // namespace twinstep::gates
