// gates/prefill_tc_gates.cc: the tensor-core prefill attention (kernels/attention_prefill_tc.h)
// against the CUDA-core reference attention_prefill and an fp64 host computation, on mixed
// steps (prefill chunks continuing a prompt, fresh prompts, decode rows), shuffled page tables
// whose unlisted pages (the padding page, spares) hold NaN sentinels, released local pages,
// every head dim, windows below and above a tile, GQA ratios 1, 2, 8, 16. Inside listed pages
// the slots no row attends (before the first seq key a row can see, past the last row) hold the
// NaN sentinel too: a kernel that copies whole pages must zero or mask them, V x 0 being NaN.
//
// Tolerance: not a constant. Per case the gate measures the bf16 noise floor (the fp64 result
// rounded to bf16 against itself) and the reference kernel's own error; the tensor-core kernel
// also rounds the softmax weights P to bf16 before P.V: one more rounding of the same size as
// the output's. So its error may exceed the reference's by at most that one rounding: in
// quadrature over the whole output, linearly on its worst (row, head). (First H200 run: the
// reference sits at the rounding floor, the tensor-core kernel 3-8% above it over the whole
// output, 25-35% above it on the worst row.)
#include <cstdio>

#include "gates/kernel_gate_util.h"
#include "kernels/attention_prefill_tc.h"

namespace twinstep::gates {
namespace {

using kernels::PrefillTile;

class PrefillTcGates : public GpuGate {};

struct TcCase {
  const char* name;
  int32_t head_dim, q_heads, kv_heads, window, page_size;
  std::vector<SeqSpec> seqs;  // the first is the filler of the row-offset differential
};

struct Errors {
  double whole = 0.0;      // ||out - ref|| / ||ref|| over every (row, head)
  double worst_row = 0.0;  // the same, worst (row, head)
};

std::vector<PrefillTile> tiles_of(const PagedScenario& sc, int32_t row_offset, int32_t group) {
  std::vector<int32_t> seqs(sc.row_seq.begin() + row_offset, sc.row_seq.end());
  return kernels::plan_prefill_tiles(seqs, group);
}

// fp64 attention of (row r, head h) of the scenario; scale 1.0.
std::vector<double> reference_head(const PagedScenario& sc, const std::vector<float>& qf,
                                   const std::vector<float>& pf, int32_t layer, int32_t r,
                                   int32_t h, int32_t q_heads) {
  const int32_t hd = sc.head_dim, group = q_heads / sc.kv_heads;
  const int32_t s = sc.row_seq[r], p = sc.positions[r];
  const float* qv = &qf[(size_t(r) * q_heads + h) * hd];
  std::vector<double> scores;
  double mx = -INFINITY;
  for (int32_t j = sc.first_key(p); j <= p; ++j) {
    const float* kv = &pf[sc.elem(layer, s, j, 0, h / group)];
    double dot = 0.0;
    for (int32_t d = 0; d < hd; ++d) dot += static_cast<double>(qv[d]) * kv[d];
    scores.push_back(dot);
    mx = std::max(mx, dot);
  }
  double sum = 0.0;
  for (double& x : scores) sum += (x = std::exp(x - mx));
  std::vector<double> o(hd, 0.0);
  for (int32_t j = sc.first_key(p), i = 0; j <= p; ++j, ++i) {
    const float* vv = &pf[sc.elem(layer, s, j, 1, h / group)];
    for (int32_t d = 0; d < hd; ++d) o[d] += scores[i] / sum * vv[d];
  }
  return o;
}

// Errors of `out` (rows 1.. of the scenario, the filler excluded) against the fp64 result.
Errors errors_of(const std::vector<std::vector<double>>& ref, const std::vector<bf16>& out,
                 int32_t hd) {
  Errors e;
  std::vector<double> all_ref;
  std::vector<float> all_out;
  for (size_t i = 0; i < ref.size(); ++i) {
    std::vector<float> got(hd);
    for (int32_t d = 0; d < hd; ++d) got[d] = to_f(out[i * hd + d]);
    e.worst_row = std::max(e.worst_row, rel_error(got, ref[i]));
    all_ref.insert(all_ref.end(), ref[i].begin(), ref[i].end());
    all_out.insert(all_out.end(), got.begin(), got.end());
  }
  e.whole = rel_error(all_out, all_ref);
  return e;
}

Errors rounding_floor(const std::vector<std::vector<double>>& ref, int32_t hd) {
  std::vector<bf16> rounded;
  for (const auto& v : ref)
    for (double x : v) rounded.push_back(to_bf(static_cast<float>(x)));
  return errors_of(ref, rounded, hd);
}

// The sentinel into every slot of a listed page that no row of its seq attends, in all layers.
void poison_unattended(const PagedScenario& sc, std::vector<bf16>& pool) {
  const int64_t te = sc.token_elems();
  for (size_t s = 0; s < sc.seqs.size(); ++s) {
    const int32_t lo = sc.first_key(sc.seqs[s].kv_len_before);
    const int32_t hi = sc.seqs[s].kv_len_before + sc.seqs[s].row_count;  // one past the last key
    for (int32_t idx = sc.seq_page_begin[s]; idx < sc.seq_page_begin[s + 1]; ++idx) {
      const int32_t lp = sc.seq_first_page[s] + (idx - sc.seq_page_begin[s]);
      for (int32_t t = 0; t < sc.page_size; ++t) {
        const int32_t j = lp * sc.page_size + t;
        if (j >= lo && j < hi) continue;
        for (int32_t l = 0; l < sc.layers; ++l) {
          for (int kind = 0; kind < 2; ++kind) {
            const int64_t at = l * sc.layer_elems() +
                               ((int64_t{sc.page_indices[idx]} * 2 + kind) * sc.page_size + t) * te;
            std::fill(pool.begin() + at, pool.begin() + at + te, sentinel_bf16());
          }
        }
      }
    }
  }
}

// One tile per row (each row a run of its own): the tiles a decode row gets, here for every row.
std::vector<PrefillTile> row_tiles_of(const PagedScenario& sc, int32_t group) {
  std::vector<PrefillTile> tiles;
  for (int32_t r = 0; r < sc.rows(); ++r) {
    for (int32_t m = 0; m < group; m += kernels::kPrefillTileM) {
      tiles.push_back({r, 1, m, sc.row_seq[r]});
    }
  }
  return tiles;
}

// Fixed key chunks (the batch-invariant mode): for each variant the chunks are built for, and
// chunks of 64 and 192 keys (so these short seqs split into up to 16), the output is
//   - bitwise the same whether a tile's chunks run in one block (slots 1), one block per chunk
//     (slots 32: every span here fits), or mixed (slots 3: longer spans run in one block), and
//     whether each row has a tile of its own or shares its run's tiles;
//   - bitwise the unsplit kernel's on every (row, head) whose keys lie in one chunk;
//   - within the unsplit kernel's error bound against fp64 (the fold's fp32 rounding is far
//     below the bf16 output's).
// The fold and partial buffers start as NaN: a read of a slot no block wrote shows.
void run_chunk_checks(const TcCase& tc, const PagedScenario& sc, const bf16* q,
                      const kernels::KvPoolView& pool, DevicePlan& plan,
                      const std::vector<PrefillTile>& run_tiles,
                      const std::vector<std::vector<double>>& ref, const Errors& e_ref,
                      const Errors& e_round, cudaStream_t stream) {
  using V = kernels::PrefillVariant;
  const int32_t hd = tc.head_dim, group = tc.q_heads / tc.kv_heads, layer = 1;
  const int64_t q_stride = int64_t{tc.q_heads} * hd;
  const size_t body = size_t(sc.rows()) * q_stride;
  std::vector<V> variants;
  if (hd == 256) {
    variants = {V::kWgmma, V::kMma};
  } else if (hd == 512) {
    variants = {V::kWgmmaSplitDims};
  } else {
    variants = {V::kMma};
  }
  DeviceBuffer<PrefillTile> d_run(run_tiles), d_rows(row_tiles_of(sc, group));
  const kernels::PrefillTilesView tv_run{d_run.get(), static_cast<int32_t>(d_run.size()), group};
  const kernels::PrefillTilesView tv_rows{d_rows.get(), static_cast<int32_t>(d_rows.size()), group};
  constexpr int32_t kSlotsMax = 32;
  const std::vector<float> nan_fold(body, std::nanf("")),
      nan_part(body * kSlotsMax * (hd + 2) / hd, std::nanf(""));
  const std::vector<bf16> sentinel(body + q_stride, sentinel_bf16());
  for (const V variant : variants) {
    DeviceBuffer<bf16> unsplit(sentinel);
    KERNEL_OK(kernels::attention_prefill_tc(q, q_stride, unsplit.get(), tc.q_heads, pool, layer,
                                            plan.rows_view(), plan.paging_view(), tv_run, tc.window,
                                            1.0f, stream, variant));
    const auto plain = unsplit.download();
    for (const int32_t chunk : {64, 192}) {
      std::vector<bf16> first;
      for (const int32_t slots : {1, 3, kSlotsMax}) {
        for (const bool per_row : {false, true}) {
          DeviceBuffer<float> fold(nan_fold), part(nan_part);
          kernels::PrefillKeyChunks ch;
          ch.key_chunk = chunk;
          ch.slots = slots;
          ch.fold = fold.get();
          ch.part_o = part.get();
          ch.part_ml = part.get() + body * kSlotsMax;
          DeviceBuffer<bf16> out(sentinel);
          KERNEL_OK(kernels::attention_prefill_tc(
              q, q_stride, out.get(), tc.q_heads, pool, layer, plan.rows_view(), plan.paging_view(),
              per_row ? tv_rows : tv_run, tc.window, 1.0f, stream, variant, ch));
          const auto got = out.download();
          SCOPED_TRACE(std::to_string(static_cast<int>(variant)) + ", chunk " +
                       std::to_string(chunk) + ", slots " + std::to_string(slots) +
                       (per_row ? ", a tile per row" : ", run tiles"));
          EXPECT_EQ(count_not_sentinel(got, 0, body), body) << "outputs left unwritten";
          EXPECT_EQ(count_not_sentinel(got, body, q_stride), 0u) << "wrote past the rows";
          if (first.empty()) {
            first = got;
            // (row, head)s of one chunk: the unsplit kernel's bits.
            size_t one_chunk = 0, one_chunk_differ = 0;
            for (int32_t r = 0; r < sc.rows(); ++r) {
              const int32_t p = sc.positions[r];
              if (sc.first_key(p) / chunk != p / chunk) continue;
              one_chunk += 1;
              one_chunk_differ +=
                  bitwise_diffs(got, size_t(r) * q_stride, plain, size_t(r) * q_stride, q_stride);
            }
            EXPECT_EQ(one_chunk_differ, 0u) << "of " << one_chunk << " rows of one chunk";
            const Errors e = errors_of(ref, std::vector<bf16>(got.begin(), got.begin() + body), hd);
            std::printf(
                "[gate]   key chunks of %3d (variant %d): rows of one chunk %zu (bitwise the "
                "unsplit kernel's: %s); rel err whole %.2e, worst %.2e\n",
                chunk, static_cast<int>(variant), one_chunk, one_chunk_differ == 0 ? "yes" : "NO",
                e.whole, e.worst_row);
            EXPECT_LE(e.whole, std::hypot(e_ref.whole, e_round.whole));
            EXPECT_LE(e.worst_row, e_ref.worst_row + e_round.worst_row);
          } else {
            EXPECT_EQ(bitwise_diffs(got, 0, first, 0, body), 0u)
                << "the chunks' spread over blocks or the tiles changed the bits";
          }
        }
      }
    }
  }
}

void run_tc_case(const TcCase& tc, cudaStream_t stream) {
  SCOPED_TRACE(tc.name);
  sim::Rng rng(0x7c + tc.head_dim * 7 + tc.window * 3 + tc.q_heads);
  const int32_t hd = tc.head_dim, layers = 2, layer = 1;
  const int32_t group = tc.q_heads / tc.kv_heads;
  const PagedScenario a =
      make_scenario(rng, tc.seqs, tc.page_size, tc.kv_heads, hd, layers, tc.window, 3);
  const PagedScenario b = drop_first_seq(a);
  std::vector<bf16> pool(a.pool_elems(), sentinel_bf16());
  for (int32_t l = 0; l < layers; ++l) {
    for (uint32_t pg : a.page_indices) {
      const int64_t base = l * a.layer_elems() + int64_t{pg} * 2 * tc.page_size * a.token_elems();
      const auto vals = random_bf16(rng, size_t(2) * tc.page_size * a.token_elems(), -2.0f, 2.0f);
      std::copy(vals.begin(), vals.end(), pool.begin() + base);
    }
  }
  poison_unattended(a, pool);
  const int64_t q_stride = int64_t{tc.q_heads} * hd;
  const auto q = random_bf16(rng, size_t(a.rows()) * q_stride, -0.5f, 0.5f);
  DeviceBuffer<bf16> d_pool(pool), d_q(q);
  const std::vector<bf16> sentinel(size_t(a.rows() + 1) * q_stride, sentinel_bf16());
  DeviceBuffer<bf16> out_ref(sentinel), out_off(sentinel), out_alone(sentinel), out_again(sentinel);
  DevicePlan pa(a), pb(b);
  DeviceBuffer<PrefillTile> tiles_off(tiles_of(a, 1, group)), tiles_alone(tiles_of(b, 0, group));
  const kernels::PrefillTilesView tv_off{tiles_off.get(), static_cast<int32_t>(tiles_off.size()),
                                         group};
  const kernels::PrefillTilesView tv_alone{tiles_alone.get(),
                                           static_cast<int32_t>(tiles_alone.size()), group};
  const kernels::KvPoolView pool_a = pool_view(a, d_pool.get()),
                            pool_b = pool_view(b, d_pool.get());
  KERNEL_OK(kernels::attention_prefill(d_q.get() + q_stride, q_stride, out_ref.get() + q_stride,
                                       tc.q_heads, pool_a, layer, pa.rows_view(1),
                                       pa.paging_view(1), tc.window, 1.0f, stream));
  KERNEL_OK(kernels::attention_prefill_tc(d_q.get() + q_stride, q_stride, out_off.get() + q_stride,
                                          tc.q_heads, pool_a, layer, pa.rows_view(1),
                                          pa.paging_view(1), tv_off, tc.window, 1.0f, stream));
  KERNEL_OK(kernels::attention_prefill_tc(d_q.get() + q_stride, q_stride, out_alone.get(),
                                          tc.q_heads, pool_b, layer, pb.rows_view(),
                                          pb.paging_view(), tv_alone, tc.window, 1.0f, stream));
  KERNEL_OK(kernels::attention_prefill_tc(d_q.get() + q_stride, q_stride, out_again.get(),
                                          tc.q_heads, pool_b, layer, pb.rows_view(),
                                          pb.paging_view(), tv_alone, tc.window, 1.0f, stream));
  const auto ref_k = out_ref.download(), off = out_off.download();
  const auto alone = out_alone.download(), again = out_again.download();
  const size_t body = size_t(a.rows() - 1) * q_stride;
  EXPECT_EQ(count_not_sentinel(off, 0, q_stride), 0u) << "filler row written";
  EXPECT_EQ(bitwise_diffs(off, q_stride, alone, 0, body), 0u) << "row offset changed the result";
  EXPECT_EQ(bitwise_diffs(alone, 0, again, 0, body), 0u) << "two runs differ";
  EXPECT_EQ(count_not_sentinel(alone, body, q_stride), 0u) << "wrote past the rows";
  EXPECT_EQ(bitwise_diffs(d_pool.download(), 0, pool, 0, pool.size()), 0u) << "pool modified";

  const auto qf = to_float(q), pf = to_float(pool);
  std::vector<std::vector<double>> ref;
  for (int32_t r = 1; r < a.rows(); ++r) {
    for (int32_t h = 0; h < tc.q_heads; ++h) {
      ref.push_back(reference_head(a, qf, pf, layer, r, h, tc.q_heads));
    }
  }
  const std::vector<bf16> got_tc(off.begin() + q_stride, off.begin() + q_stride + body);
  const std::vector<bf16> got_ref(ref_k.begin() + q_stride, ref_k.begin() + q_stride + body);
  const Errors e_tc = errors_of(ref, got_tc, hd), e_ref = errors_of(ref, got_ref, hd);
  const Errors e_round = rounding_floor(ref, hd);
  std::printf(
      "[gate] %-52s rows %4d tiles %4zu | rel err whole: tc %.2e ref %.2e bf16 %.2e | worst "
      "(row,head): tc %.2e ref %.2e bf16 %.2e\n",
      tc.name, a.rows() - 1, tiles_off.size(), e_tc.whole, e_ref.whole, e_round.whole,
      e_tc.worst_row, e_ref.worst_row, e_round.worst_row);
  // Over the whole output the extra rounding is independent of the others: errors add in
  // quadrature. On one (row, head) they may align: they add linearly.
  EXPECT_LE(e_tc.whole, std::hypot(e_ref.whole, e_round.whole));
  EXPECT_LE(e_tc.worst_row, e_ref.worst_row + e_round.worst_row);
  // Every other kernel built for this head dim must meet the same bound (kDefault is one of
  // them, run above with the row-offset, determinism and overrun checks).
  using V = kernels::PrefillVariant;
  std::vector<std::pair<V, const char*>> variants;
  if (hd == 256) {
    variants = {{V::kMma, "mma.sync, key tile 32"},
                {V::kMmaKeyTile64, "mma.sync, key tile 64"},
                {V::kWgmma, "wgmma, one warpgroup"},
                {V::kWgmmaPairKeyTile32, "wgmma, two warpgroups, key tile 32"},
                {V::kWgmmaPairKeyTile64, "wgmma, two warpgroups, key tile 64"},
                {V::kWgmmaPairPipelined, "wgmma, two warpgroups, pipelined, key tile 64"},
                {V::kWgmmaPairPipelinedKeyTile32, "wgmma, two warpgroups, pipelined, key tile 32"},
                {V::kTmaPairKeyTile64, "TMA-fed wgmma, two warpgroups, key tile 64"},
                {V::kTmaPairKeyTile32, "TMA-fed wgmma, two warpgroups, key tile 32"},
                {V::kTmaPingPongKeyTile64, "TMA-fed wgmma, ping-pong, key tile 64"},
                {V::kTmaPingPongKeyTile32, "TMA-fed wgmma, ping-pong, key tile 32"},
                {V::kTmaPingPongLean, "TMA-fed wgmma, ping-pong, lean softmax"},
                {V::kTmaPingPongSplitKv, "TMA-fed wgmma, ping-pong, lean, K/V apart"}};
  } else if (hd == 512) {
    variants = {{V::kMma, "mma.sync, pair exchange"},
                {V::kWgmmaSplitDims, "wgmma, two warpgroups splitting the dims"},
                {V::kWgmmaSplitDimsPipelined, "wgmma, split dims, pipelined"},
                {V::kTmaSplitDims, "TMA-fed wgmma, split dims"},
                {V::kTmaSplitDimsLean, "TMA-fed wgmma, split dims, lean softmax"},
                {V::kWgmmaSplitDimsClusterKeyTile48,
                 "wgmma, clusters of 2 splitting the dims, key tile 48"},
                {V::kWgmmaSplitDimsClusterKeyTile64,
                 "wgmma, clusters of 2 splitting the dims, key tile 64"}};
  }
  for (const auto& [variant, label] : variants) {
    DeviceBuffer<bf16> alt(sentinel);
    KERNEL_OK(kernels::attention_prefill_tc(d_q.get() + q_stride, q_stride, alt.get(), tc.q_heads,
                                            pool_b, layer, pb.rows_view(), pb.paging_view(),
                                            tv_alone, tc.window, 1.0f, stream, variant));
    const auto got = alt.download();
    EXPECT_EQ(count_not_sentinel(got, 0, body), body) << label << " left outputs unwritten";
    EXPECT_EQ(count_not_sentinel(got, body, q_stride), 0u) << label << " wrote past the rows";
    const Errors e = errors_of(ref, std::vector<bf16>(got.begin(), got.begin() + body), hd);
    std::printf("[gate]   %s: rel err whole %.2e, worst %.2e\n", label, e.whole, e.worst_row);
    EXPECT_LE(e.whole, std::hypot(e_ref.whole, e_round.whole)) << label;
    EXPECT_LE(e.worst_row, e_ref.worst_row + e_round.worst_row) << label;
  }
  run_chunk_checks(tc, b, d_q.get() + q_stride, pool_b, pb, tiles_of(b, 0, group), ref, e_ref,
                   e_round, stream);
}

// Seqs: {kv_len_before, rows}. Each case mixes a chunk that continues a prompt, a fresh prompt
// longer than a tile, and decode rows (one row, long context).
const TcCase kCases[] = {
    {"12B global: hd 512, GQA 16 (16q/1kv), page 16",
     512,
     16,
     1,
     0,
     16,
     {{9, 1}, {0, 150}, {37, 70}, {300, 1}, {3, 1}}},
    {"12B local: hd 256, GQA 2 (16q/8kv), window 100, page 16",
     256,
     16,
     8,
     100,
     16,
     {{9, 1}, {0, 200}, {250, 90}, {700, 1}, {5, 1}}},
    {"hd 256, GQA 8 (16q/2kv), window 7 (< a key tile), page 7",
     256,
     16,
     2,
     7,
     7,
     {{9, 1}, {0, 70}, {40, 33}, {90, 1}}},
    {"hd 256, GQA 8 (16q/2kv), window 40, page 8 (TMA boxes of 8)",
     256,
     16,
     2,
     40,
     8,
     {{3, 1}, {0, 90}, {70, 37}, {150, 1}}},
    {"hd 256, GQA 2 (8q/4kv), no window, page 128 (> a key tile)",
     256,
     8,
     4,
     0,
     128,
     {{9, 1}, {0, 140}, {200, 30}, {300, 1}}},
    {"hd 512, GQA 16 (16q/1kv), window 50, page 64 (> a key tile)",
     512,
     16,
     1,
     50,
     64,
     {{9, 1}, {0, 100}, {130, 20}, {260, 1}}},
    {"hd 128, GQA 1 (4q/4kv), window 24, page 4",
     128,
     4,
     4,
     24,
     4,
     {{2, 1}, {0, 130}, {61, 40}, {200, 1}, {0, 1}}},
    {"hd 128, GQA 16 (32q/2kv), no window, page 16",
     128,
     32,
     2,
     0,
     16,
     {{9, 1}, {0, 100}, {129, 17}, {64, 1}}},
    {"hd 64, GQA 2 (4q/2kv), no window, page 1",
     64,
     4,
     2,
     0,
     1,
     {{5, 1}, {0, 160}, {33, 65}, {400, 1}}},
    {"hd 512, GQA 8 (8q/1kv), window 200 (> the step), page 32",
     512,
     8,
     1,
     200,
     32,
     {{9, 1}, {0, 260}, {500, 40}, {1000, 1}}},
};

TEST_F(PrefillTcGates, MatchesReferenceAndFp64) {
  for (const TcCase& tc : kCases) run_tc_case(tc, stream_);
}

// A tile list that does not match the launcher's group is refused before any launch.
TEST_F(PrefillTcGates, RefusesTilesOfAnotherGroup) {
  sim::Rng rng(3);
  const PagedScenario sc = make_scenario(rng, {{0, 4}}, 16, 2, 128, 1, 0, 1);
  DeviceBuffer<bf16> d_pool(random_bf16(rng, sc.pool_elems()));
  DeviceBuffer<bf16> d_q(size_t(4) * 8 * 128), d_out(size_t(4) * 8 * 128);
  DevicePlan plan(sc);
  DeviceBuffer<PrefillTile> tiles(tiles_of(sc, 0, 2));
  const kernels::PrefillTilesView wrong{tiles.get(), static_cast<int32_t>(tiles.size()), 2};
  auto st = kernels::attention_prefill_tc(d_q.get(), 8 * 128, d_out.get(), 8,
                                          pool_view(sc, d_pool.get()), 0, plan.rows_view(),
                                          plan.paging_view(), wrong, 0, 1.0f, stream_);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.error().message.find("group 2, expected q_heads / kv_heads = 4"), std::string::npos)
      << st.error().message;
}

}  // namespace
}  // namespace twinstep::gates
