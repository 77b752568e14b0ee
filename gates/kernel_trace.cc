// gates/kernel_trace.cc: see kernel_trace.h.
#include "gates/kernel_trace.h"

#include <cuda_runtime.h>
#include <cxxabi.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <mutex>

#if TWINSTEP_HAVE_CUPTI
#include <cupti.h>
#endif

namespace twinstep::gates {
namespace {

std::string fmt(const char* f, double a, double b = 0, double c = 0, double d = 0) {
  char buf[256];
  std::snprintf(buf, sizeof buf, f, a, b, c, d);
  return buf;
}

#if TWINSTEP_HAVE_CUPTI
std::string demangle(const char* mangled) {
  if (mangled == nullptr) return "?";
  int status = 0;
  std::unique_ptr<char, void (*)(void*)> d(abi::__cxa_demangle(mangled, nullptr, nullptr, &status),
                                           std::free);
  std::string s = status == 0 && d ? d.get() : mangled;
  for (const std::string anon : {"(anonymous namespace)::", "twinstep::kernels::"}) {
    for (size_t at = s.find(anon); at != std::string::npos; at = s.find(anon)) {
      s.erase(at, anon.size());
    }
  }
  if (s.rfind("void ", 0) == 0) s.erase(0, 5);
  // Drop the parameter list (the last top-level '(' ... ')'), keep the template arguments.
  int depth = 0;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '<') ++depth;
    if (s[i] == '>') --depth;
    if (s[i] == '(' && depth == 0) return s.substr(0, i);
  }
  return s;
}

std::mutex g_mu;
std::vector<KernelRecord> g_records;

void CUPTIAPI buffer_requested(uint8_t** buffer, size_t* size, size_t* max_records) {
  constexpr size_t kBytes = 8u << 20;
  *buffer = static_cast<uint8_t*>(std::aligned_alloc(8, kBytes));
  *size = *buffer != nullptr ? kBytes : 0;
  *max_records = 0;
}

void CUPTIAPI buffer_completed(CUcontext, uint32_t, uint8_t* buffer, size_t, size_t valid) {
  CUpti_Activity* rec = nullptr;
  std::lock_guard<std::mutex> lock(g_mu);
  while (cuptiActivityGetNextRecord(buffer, valid, &rec) == CUPTI_SUCCESS) {
    if (rec->kind == CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL) {
      const auto* k = reinterpret_cast<const CUpti_ActivityKernel10*>(rec);
      g_records.push_back({demangle(k->name), k->start, k->end, k->graphId});
    } else if (rec->kind == CUPTI_ACTIVITY_KIND_MEMSET) {
      const auto* m = reinterpret_cast<const CUpti_ActivityMemset4*>(rec);
      g_records.push_back(
          {"[memset " + std::to_string(m->bytes) + " B]", m->start, m->end, m->graphId});
    } else if (rec->kind == CUPTI_ACTIVITY_KIND_MEMCPY) {
      const auto* m = reinterpret_cast<const CUpti_ActivityMemcpy6*>(rec);
      g_records.push_back(
          {"[memcpy kind " + std::to_string(m->copyKind) + ", " + std::to_string(m->bytes) + " B]",
           m->start, m->end, m->graphId});
    }
  }
  std::free(buffer);
}

std::string cupti_error(const char* call, CUptiResult r) {
  const char* s = nullptr;
  cuptiGetResultString(r, &s);
  return std::string(call) + ": " + (s != nullptr ? s : "unknown CUPTI error");
}
#endif

}  // namespace

std::string KernelTrace::start() {
#if TWINSTEP_HAVE_CUPTI
  static const CUptiResult registered =
      cuptiActivityRegisterCallbacks(buffer_requested, buffer_completed);
  if (registered != CUPTI_SUCCESS) return cupti_error("cuptiActivityRegisterCallbacks", registered);
  {
    std::lock_guard<std::mutex> lock(g_mu);
    g_records.clear();
  }
  if (cudaError_t e = cudaDeviceSynchronize(); e != cudaSuccess) {
    return std::string("cudaDeviceSynchronize: ") + cudaGetErrorString(e);
  }
  for (const CUpti_ActivityKind kind : {CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL,
                                        CUPTI_ACTIVITY_KIND_MEMSET, CUPTI_ACTIVITY_KIND_MEMCPY}) {
    if (CUptiResult r = cuptiActivityEnable(kind); r != CUPTI_SUCCESS) {
      return cupti_error("cuptiActivityEnable", r);
    }
  }
  return "";
#else
  return "built without CUPTI (no CUDA::cupti and no libcupti in the Python environment at "
         "configure time)";
#endif
}

std::vector<KernelRecord> KernelTrace::stop() {
#if TWINSTEP_HAVE_CUPTI
  cudaDeviceSynchronize();
  cuptiActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
  for (const CUpti_ActivityKind kind : {CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL,
                                        CUPTI_ACTIVITY_KIND_MEMSET, CUPTI_ACTIVITY_KIND_MEMCPY}) {
    cuptiActivityDisable(kind);
  }
  std::vector<KernelRecord> out;
  {
    std::lock_guard<std::mutex> lock(g_mu);
    out.swap(g_records);
  }
  std::sort(out.begin(), out.end(),
            [](const KernelRecord& a, const KernelRecord& b) { return a.start_ns < b.start_ns; });
  return out;
#else
  return {};
#endif
}

std::string trace_summary(const std::string& title, const std::vector<KernelRecord>& k,
                          double step_ms, int top_names, int top_gaps) {
  std::string s = "-- trace: " + title + " --\n";
  if (k.empty()) return s + "  no kernels recorded\n";
  const uint64_t t0 = k.front().start_ns;
  uint64_t last_end = 0, busy = 0, sum = 0, covered_to = t0;
  struct Gap {
    uint64_t ns;
    size_t after;  // index of the kernel after the gap
  };
  std::vector<Gap> gaps;
  size_t in_graph = 0;
  for (size_t i = 0; i < k.size(); ++i) {
    const uint64_t b = k[i].start_ns, e = std::max(k[i].end_ns, k[i].start_ns);
    sum += e - b;
    in_graph += k[i].graph_id != 0;
    if (b > covered_to) {
      if (i > 0) gaps.push_back({b - covered_to, i});
      busy += e - b;
      covered_to = e;
    } else if (e > covered_to) {
      busy += e - covered_to;
      covered_to = e;
    }
    last_end = std::max(last_end, e);
  }
  const double span_us = (last_end - t0) / 1e3, busy_us = busy / 1e3, sum_us = sum / 1e3;
  s += fmt("  %.0f kernels (%.0f in graphs); span %.1f us, busy %.1f us,", k.size(), in_graph,
           span_us, busy_us) +
       fmt(" idle %.1f us (%.1f%%), overlap %.1f us; host step %.3f ms\n", span_us - busy_us,
           100.0 * (span_us - busy_us) / span_us, sum_us - busy_us, step_ms);
  struct Agg {
    int n = 0;
    double total = 0, min = 1e30, max = 0, gap_before = 0, exclusive = 0;
  };
  std::map<std::string, Agg> by_name;
  std::vector<double> gap_before(k.size(), 0.0);
  for (const Gap& g : gaps) gap_before[g.after] = g.ns / 1e3;
  // Exclusive time: how far a kernel moves the timeline's end (its end past every earlier
  // kernel's); with programmatic launches a kernel's own duration includes its wait for the
  // kernel in front. The exclusive times and the idle time add up to the span.
  uint64_t frontier = t0;
  for (size_t i = 0; i < k.size(); ++i) {
    const double us = (std::max(k[i].end_ns, k[i].start_ns) - k[i].start_ns) / 1e3;
    const uint64_t e = std::max(k[i].end_ns, k[i].start_ns);
    const uint64_t from = std::max(frontier, k[i].start_ns);
    const double excl = e > from ? (e - from) / 1e3 : 0.0;
    frontier = std::max(frontier, e);
    Agg& a = by_name[k[i].name];
    a.exclusive += excl;
    ++a.n;
    a.total += us;
    a.min = std::min(a.min, us);
    a.max = std::max(a.max, us);
    a.gap_before += gap_before[i];
  }
  std::vector<std::pair<std::string, Agg>> rows(by_name.begin(), by_name.end());
  std::sort(rows.begin(), rows.end(),
            [](const auto& a, const auto& b) { return a.second.exclusive > b.second.exclusive; });
  s += "  count    excl us   total us   mean us    min us    max us  idle before us  kernel\n";
  for (int i = 0; i < static_cast<int>(rows.size()) && i < top_names; ++i) {
    const Agg& a = rows[i].second;
    s += fmt("  %5.0f %10.1f %10.1f %9.2f", a.n, a.exclusive, a.total, a.total / a.n) +
         fmt(" %9.2f", a.min) + fmt(" %9.2f %15.1f  ", a.max, a.gap_before) +
         rows[i].first.substr(0, 150) + "\n";
  }
  std::sort(gaps.begin(), gaps.end(), [](const Gap& a, const Gap& b) { return a.ns > b.ns; });
  for (int i = 0; i < static_cast<int>(gaps.size()) && i < top_gaps; ++i) {
    const size_t j = gaps[i].after;
    s += fmt("  gap %.2f us at +%.1f us: ", gaps[i].ns / 1e3, (k[j].start_ns - t0) / 1e3) +
         k[j - 1].name.substr(0, 60) + " -> " + k[j].name.substr(0, 60) + "\n";
  }
  return s;
}

}  // namespace twinstep::gates
