// Batch assembly on its own: 256 rows of Fashion-MNIST's training set (or the fixture when the
// Debian package is absent) at random ids, as a training step draws them, converted to float by
// data::assemble_batch (augment 0, the baseline) and by data::Augmenter with crop:4,flip
// (augment 1) and crop:4,flip,normalize,erase:0.5 (augment 2). The ratio of 1 or 2 to 0 is the
// price of augmentation fused into the conversion. BM_Data_Assemble256Bf16: the same rows for a
// bf16 run, straight into bf16 (path 0) or as f32 8 rows at a time, then rounded (path 1, the
// way augmented bf16 rows are staged). One thread; the ids change every iteration.
#include <benchmark/benchmark.h>

#include <cstdint>
#include <filesystem>
#include <optional>
#include <vector>

#include "cohort/core/rng.hpp"
#include "cohort/data/augment.hpp"
#include "cohort/data/dataset.hpp"

namespace {

const cohort::data::Dataset& train_set() {
  static const cohort::data::Splits splits = cohort::data::load_image_folder(
      std::filesystem::exists(cohort::data::kDefaultDataDir) ? cohort::data::kDefaultDataDir
                                                             : COHORT_FIXTURE_DIR);
  return splits.train;
}

void BM_Data_Assemble256(benchmark::State& state) {
  constexpr std::size_t kRows = 256;
  const cohort::data::Dataset& set = train_set();
  const char* specs[] = {"", "crop:4,flip", "crop:4,flip,normalize,erase:0.5"};
  const auto which = static_cast<std::size_t>(state.range(0));
  std::optional<cohort::data::Augmenter> augmenter;
  if (which > 0) augmenter.emplace(cohort::data::parse_augment(specs[which]), set, 1);
  std::vector<float> x(kRows * set.features());  // (256, 1, 28, 28)
  std::vector<std::int32_t> y(kRows);
  std::vector<std::uint32_t> ids(kRows);
  cohort::Rng rng({1, 2});
  std::uint64_t epoch = 0;
  for (auto _ : state) {
    state.PauseTiming();
    for (auto& id : ids) id = static_cast<std::uint32_t>(rng.below(set.count));
    state.ResumeTiming();
    if (augmenter)
      augmenter->assemble(set, ids, epoch++, /*train=*/true, x.data(), y.data());
    else
      cohort::data::assemble_batch(set, ids, x.data(), y.data());
    benchmark::DoNotOptimize(x.data());
    benchmark::ClobberMemory();
  }
  state.SetItemsProcessed(static_cast<std::int64_t>(state.iterations() * kRows));
  state.SetBytesProcessed(
      static_cast<std::int64_t>(state.iterations() * kRows * set.features() * (1 + sizeof(float))));
}
BENCHMARK(BM_Data_Assemble256)->ArgNames({"augment"})->DenseRange(0, 2);

void BM_Data_Assemble256Bf16(benchmark::State& state) {
  constexpr std::size_t kRows = 256, kBlockRows = 8;
  const cohort::data::Dataset& set = train_set();
  const std::size_t f = set.features();
  const bool via_f32 = state.range(0) == 1;
  std::vector<cohort::bf16> x(kRows * f);
  std::vector<float> block(kBlockRows * f);
  std::vector<std::int32_t> y(kRows);
  std::vector<std::uint32_t> ids(kRows);
  cohort::Rng rng({1, 2});
  for (auto _ : state) {
    state.PauseTiming();
    for (auto& id : ids) id = static_cast<std::uint32_t>(rng.below(set.count));
    state.ResumeTiming();
    if (via_f32) {
      for (std::size_t r = 0; r < kRows; r += kBlockRows) {
        cohort::data::assemble_batch(set, std::span(ids).subspan(r, kBlockRows), block.data(),
                                     y.data() + r);
        cohort::to_bf16(block.data(), x.data() + r * f, kBlockRows * f);
      }
    } else {
      cohort::data::assemble_batch(set, ids, x.data(), y.data());
    }
    benchmark::DoNotOptimize(x.data());
    benchmark::ClobberMemory();
  }
  state.SetItemsProcessed(static_cast<std::int64_t>(state.iterations() * kRows));
}
BENCHMARK(BM_Data_Assemble256Bf16)->ArgNames({"via_f32"})->DenseRange(0, 1);

}  // namespace

BENCHMARK_MAIN();
