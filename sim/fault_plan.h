// A seeded fault plan: per-site firing rates plus one-shot forced faults.
#pragma once

#include <array>
#include <cstdint>

#include "engine/fault.h"
#include "sim/rng.h"

namespace twinstep::sim {

class FaultPlan final : public engine::FaultInjector {
 public:
  explicit FaultPlan(uint64_t seed) : rng_(seed) {}

  void set_rate_ppm(engine::FaultSite site, uint32_t ppm) { rate_ppm_[index(site)] = ppm; }
  void set_all_rates_ppm(uint32_t ppm) { rate_ppm_.fill(ppm); }
  // The next consultation of `site` fires, whatever its rate.
  void force_once(engine::FaultSite site) { forced_[index(site)] += 1; }
  // The next consultation of `site` on behalf of `request` fires (engine allocation sites).
  void force_once_for(engine::FaultSite site, engine::RequestId request) {
    targeted_[index(site)] = request;
  }
  void clear() {
    rate_ppm_.fill(0);
    forced_.fill(0);
    targeted_.fill(engine::RequestId{});
  }

  bool fire(engine::FaultSite site, engine::RequestId request = engine::RequestId{}) override {
    const int i = index(site);
    consulted_[i] += 1;
    bool fired = false;
    if (targeted_[i].value != 0 && targeted_[i] == request) {
      targeted_[i] = engine::RequestId{};
      fired = true;
    } else if (forced_[i] > 0) {
      forced_[i] -= 1;
      fired = true;
    } else if (rate_ppm_[i] > 0) {
      fired = rng_.chance_ppm(rate_ppm_[i]);
    }
    fired_[i] += fired ? 1 : 0;
    return fired;
  }

  uint64_t fired(engine::FaultSite site) const { return fired_[index(site)]; }
  // Faults fired at the device's sites (everything but the engine's allocation sites): the
  // only thing that may fail a step.
  uint64_t device_fired() const {
    uint64_t n = 0;
    for (int i = index(engine::FaultSite::kUpload); i < engine::kFaultSiteCount; ++i)
      n += fired_[i];
    return n;
  }
  // Whether a device site can fire at its next consultation (a rate or a forced fault).
  bool device_armed() const {
    for (int i = index(engine::FaultSite::kUpload); i < engine::kFaultSiteCount; ++i) {
      if (rate_ppm_[i] > 0 || forced_[i] > 0) return true;
    }
    return false;
  }
  uint64_t consulted(engine::FaultSite site) const { return consulted_[index(site)]; }

 private:
  static int index(engine::FaultSite site) { return static_cast<int>(site); }
  Rng rng_;
  std::array<uint32_t, engine::kFaultSiteCount> rate_ppm_{};
  std::array<uint32_t, engine::kFaultSiteCount> forced_{};
  std::array<engine::RequestId, engine::kFaultSiteCount> targeted_{};
  std::array<uint64_t, engine::kFaultSiteCount> fired_{};
  std::array<uint64_t, engine::kFaultSiteCount> consulted_{};
};

}  // namespace twinstep::sim
