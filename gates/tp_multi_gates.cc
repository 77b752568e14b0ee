// gates/tp_multi_gates.cc: tensor parallelism's forward across GPUs over NCCL (issue 17; label
// `multi`, manifests/gpu-multi-gates.json): the HF reference checkpoints split over 2 ranks,
// rank r on CUDA device r, in lockstep with the unsplit engine on device 0 (the comparison of
// tp_gates.cc, whose loopback transport this replaces). Fails on a machine of one GPU (the
// device refuses 2 NCCL ranks there), never skips.
#include <string>

#include "gates/tp_gate_util.h"

namespace twinstep::gates {
namespace {

class TpMultiGates : public ModelGate {};

TEST_F(TpMultiGates, TwoRanksOverNcclMatchTheUnsplitForward) {
  int count = 0;
  ASSERT_EQ(cudaGetDeviceCount(&count), cudaSuccess);
  ASSERT_GE(count, 2) << "this gate needs two GPUs";
  for (const char* geometry : kGeometries) {
    HfRefs r = refs(geometry);
    auto w = load(r);
    ASSERT_NE(w, nullptr);
    kernels::CudaDeviceOptions o;
    o.capture_logits = true;
    const std::string label = std::string(geometry) + " TP=2 NCCL";
    SCOPED_TRACE(label);
    auto one = device(w->config(), w.get(), o);
    auto tp = make_tp_device(*w, 2, kernels::TpTransport::kNccl, o);
    ASSERT_NE(one, nullptr);
    ASSERT_NE(tp, nullptr);
    expect_split_matches_unsplit(r, w->config(), *one, *tp, label);
  }
}

}  // namespace
}  // namespace twinstep::gates
