// kernels/tp_device.cc: the ranks of a tensor-parallel device, each call on every rank's worker.
#include "kernels/tp_device.h"

#include <algorithm>
#include <atomic>
#include <climits>
#include <optional>
#include <utility>

#include "kernels/nccl_comm.h"

namespace twinstep::kernels {
namespace {

using engine::DeviceError;
using engine::DeviceErrorCode;

Unexpected<DeviceError> tp_error(DeviceErrorCode code, std::string message) {
  return unexpected(DeviceError{code, "tensor parallelism: " + std::move(message)});
}

DeviceError named(const DeviceError& e, int32_t rank, int32_t ranks) {
  DeviceError out = e;
  out.message = "rank " + std::to_string(rank) + " of " + std::to_string(ranks) + ": " + e.message;
  return out;
}

}  // namespace

int TensorParallelDevice::rank_ordinal(int32_t r) const {
  return options_.transport == TpTransport::kNccl ? r : options_.rank_options.device_ordinal;
}

engine::Status<DeviceError> TensorParallelDevice::make_comms() {
  const int32_t n = plan_.ranks;
  std::vector<std::unique_ptr<TpComm>> comms(n);
  if (options_.transport == TpTransport::kLoopback) {
    auto clique = LoopbackClique::create(n);
    if (!clique) return tp_error(DeviceErrorCode::kCuda, clique.error().message);
    for (int32_t r = 0; r < n; ++r) comms[r] = std::make_unique<LoopbackComm>(clique.value(), r);
  } else {
    auto id = nccl_make_id();
    if (!id) return tp_error(DeviceErrorCode::kCuda, id.error().message);
    std::vector<std::string> errors(n);
    // NCCL's ranks of one clique join concurrently (each blocks until all have).
    on_ranks([&](int32_t r) {
      auto c = NcclComm::create(id.value(), n, r, r);
      if (c) {
        comms[r] = std::move(c.value());
      } else {
        errors[r] = c.error().message;
      }
    });
    for (int32_t r = 0; r < n; ++r) {
      if (!errors[r].empty()) {
        return tp_error(DeviceErrorCode::kCuda, "rank " + std::to_string(r) + ": " + errors[r]);
      }
    }
  }
  for (int32_t r = 0; r < n && r < ranks(); ++r) ranks_[r]->set_tp_comm(comms[r].get());
  // The old ones go only once no device points at them, each on its rank's worker, all at once
  // (a clique's communicators are destroyed together, never one rank after the other).
  std::vector<std::unique_ptr<TpComm>> old = std::move(comms_);
  comms_ = std::move(comms);
  on_ranks([&](int32_t r) {
    if (r < static_cast<int32_t>(old.size())) old[r].reset();
  });
  return Ok{};
}

Result<std::unique_ptr<TensorParallelDevice>, DeviceError> TensorParallelDevice::create(
    const engine::ModelConfig& config, const engine::ModelWeights* weights,
    TpDeviceOptions options) {
  auto split = engine::tensor_parallel_plan(config, options.ranks);
  if (!split) return tp_error(DeviceErrorCode::kBadLayout, split.error().message);
  if (options.transport == TpTransport::kNccl) {
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess || count < options.ranks) {
      return tp_error(DeviceErrorCode::kCuda, "NCCL transport: " + std::to_string(options.ranks) +
                                                  " ranks need " + std::to_string(options.ranks) +
                                                  " CUDA devices, " + std::to_string(count) +
                                                  " visible");
    }
    if (!nccl_available()) {
      return tp_error(DeviceErrorCode::kCuda, "NCCL transport: this build has no NCCL");
    }
  }
  std::unique_ptr<TensorParallelDevice> d(new TensorParallelDevice());
  d->plan_ = split.value();
  d->options_ = options;
  // A worker a rank for the device's life, its CUDA device set once (a failure shows in the
  // rank's own first CUDA call).
  d->workers_ = std::make_unique<RankWorkers>(
      options.ranks, [dev = d.get()](int32_t r) { (void)cudaSetDevice(dev->rank_ordinal(r)); });
  if (auto s = d->make_comms(); !s.ok()) return unexpected(s.error());
  const int32_t n = options.ranks;
  std::vector<std::unique_ptr<CudaDevice>> devices(n);
  std::vector<std::optional<DeviceError>> errors(n);
  // Each rank uploads its share while the others do.
  d->on_ranks([&](int32_t r) {
    CudaDeviceOptions o = options.rank_options;
    o.device_ordinal = d->rank_ordinal(r);
    o.tp_comm = d->comms_[r].get();
    if (r != 0) o.faults = nullptr;
    auto dev = CudaDevice::create(config, weights, o);
    if (dev) {
      devices[r] = std::move(dev.value());
    } else {
      errors[r] = dev.error();
    }
  });
  d->ranks_ = std::move(devices);  // the ones made: freed by ~TensorParallelDevice on failure
  for (int32_t r = 0; r < n; ++r) {
    if (errors[r]) return unexpected(named(*errors[r], r, n));
  }
  return d;
}

TensorParallelDevice::~TensorParallelDevice() {
  if (workers_ == nullptr) return;
  // Each rank's device, then its communicator (the device points at it), freed on the rank's
  // worker (its CUDA device current), all ranks at once.
  on_ranks([&](int32_t r) {
    if (r < static_cast<int32_t>(ranks_.size())) ranks_[r].reset();
  });
  on_ranks([&](int32_t r) {
    if (r < static_cast<int32_t>(comms_.size())) comms_[r].reset();
  });
}

std::string TensorParallelDevice::name() const {
  return std::string("cuda-tp") + std::to_string(plan_.ranks) +
         (options_.transport == TpTransport::kLoopback ? "-loopback" : "-nccl");
}

engine::PoolLayout TensorParallelDevice::rank_layout(const engine::PoolLayout& layout) const {
  engine::PoolLayout l = layout;
  l.kv_heads = plan_.family(layout.family).kv_heads;
  return l;
}

engine::Status<DeviceError> TensorParallelDevice::bind(const engine::PoolLayout& global,
                                                       const engine::PoolLayout& local) {
  const int32_t n = ranks();
  std::vector<std::optional<DeviceError>> errors(n);
  const engine::PoolLayout g = rank_layout(global), l = rank_layout(local);
  on_ranks([&](int32_t r) {
    if (auto s = ranks_[r]->bind(g, l); !s.ok()) errors[r] = s.error();
  });
  for (int32_t r = 0; r < n; ++r) {
    if (errors[r]) return unexpected(named(*errors[r], r, n));
  }
  return Ok{};
}

engine::Result<engine::DeviceOutput, DeviceError> TensorParallelDevice::execute(
    const engine::StepPlan& plan) {
  const int32_t n = ranks();
  std::vector<std::optional<engine::Result<engine::DeviceOutput, DeviceError>>> outs(n);
  std::atomic<int32_t> first_failed{-1};
  on_ranks([&](int32_t r) {
    outs[r] = ranks_[r]->execute(plan);
    if (!outs[r]->ok()) {
      int32_t none = -1;
      first_failed.compare_exchange_strong(none, r);
      // The others must not wait in a collective for this rank. Loopback: this rank leaves the
      // clique's barrier (only its own thread may). NCCL: a peer's collective kernel would wait
      // on the GPU for this rank forever, so every rank's communicator is aborted, from here
      // (ncclCommAbort ends the operations pending on it; not yet run on two GPUs).
      if (options_.transport == TpTransport::kLoopback) {
        comms_[r]->abort();
      } else {
        for (auto& c : comms_) c->abort();
      }
    }
  });
  const int32_t failed = first_failed.load();
  if (failed >= 0) {
    const DeviceError cause = named(outs[failed]->error(), failed, n);
    // Every rank has returned: the aborted clique is replaced before the next step.
    if (auto s = make_comms(); !s.ok()) {
      return unexpected(DeviceError{cause.code,
                                    cause.message +
                                        "; and the communicators could "
                                        "not be made anew: " +
                                        s.error().message,
                                    cause.site});
    }
    comm_rebuilds_ += 1;
    return unexpected(cause);
  }
  for (int32_t r = 1; r < n; ++r) {
    if (outs[r]->value().sampled != outs[0]->value().sampled) {
      return tp_error(DeviceErrorCode::kCuda,
                      "rank " + std::to_string(r) +
                          " sampled other tokens than rank 0 from the same gathered logits");
    }
  }
  return std::move(outs[0]->value());
}

Result<int64_t, DeviceError> TensorParallelDevice::rank_free_memory_bytes() const {
  if (options_.transport == TpTransport::kLoopback) {
    auto free_bytes = ranks_[0]->free_memory_bytes();
    if (!free_bytes) return unexpected(free_bytes.error());
    return free_bytes.value() / ranks();
  }
  int64_t least = INT64_MAX;
  for (int32_t r = 0; r < ranks(); ++r) {
    auto free_bytes = ranks_[r]->free_memory_bytes();
    if (!free_bytes) return unexpected(named(free_bytes.error(), r, ranks()));
    least = std::min(least, free_bytes.value());
  }
  return least;
}

engine::DeviceStats TensorParallelDevice::stats() const {
  engine::DeviceStats d = ranks_[0]->stats();
  d.tensor_parallel_ranks = ranks();
  d.tensor_parallel_rebuilds = comm_rebuilds_;
  return d;
}

}  // namespace twinstep::kernels
