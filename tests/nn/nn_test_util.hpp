// Shared by the nn tests: seeded parameters, inputs and labels for a model, and a bitwise
// comparison of float arrays that names the first difference. Plain functions, no fixtures.
#pragma once

#include <gtest/gtest.h>

#include <cctype>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "cohort/core/rng.hpp"
#include "cohort/nn/model.hpp"
#include "cohort/tensor/buffer.hpp"

namespace cohort::nn::testing {

// The name of a case with a model `spec` and a row count `N`: the spec's letters and numbers
// joined by '_', then N ("conv(4,3)-relu-flatten-linear(10)" on 3 rows:
// conv_4_3_relu_flatten_linear_10_N3).
template <typename Case>
std::string spec_case_name(const ::testing::TestParamInfo<Case>& info) {
  std::string name;
  for (const char c : std::string_view(info.param.spec)) {
    if (std::isalnum(static_cast<unsigned char>(c)))
      name += c;
    else if (!name.empty() && name.back() != '_')
      name += '_';
  }
  if (name.back() != '_') name += '_';
  return name + "N" + std::to_string(info.param.N);
}

struct Inputs {
  AlignedBuffer<float> params, x;    // (layout().total()), (N, input_features)
  std::vector<std::int32_t> labels;  // (N)
};

// The model's initial weights for `seed`, inputs uniform in [0, 1) and uniform labels, all from
// streams keyed by `seed`.
inline Inputs make_inputs(const Model& m, std::int64_t N, std::uint64_t seed) {
  Inputs in{AlignedBuffer<float>(m.layout().total()),
            AlignedBuffer<float>(static_cast<std::size_t>(N * m.input_features())),
            {}};
  m.init(in.params.data(), seed);
  Rng rng({seed, 99});
  for (std::size_t i = 0; i < in.x.size(); ++i) in.x[i] = rng.uniform(0.0f, 1.0f);
  for (std::int64_t r = 0; r < N; ++r)
    in.labels.push_back(static_cast<std::int32_t>(rng.below(m.num_classes())));
  return in;
}

// Bitwise equality (so -0 differs from 0, and a NaN equals the same NaN), sizes first.
inline ::testing::AssertionResult same_bits(std::span<const float> a, std::span<const float> b) {
  if (a.size() != b.size())
    return ::testing::AssertionFailure() << "sizes " << a.size() << " and " << b.size();
  for (std::size_t i = 0; i < a.size(); ++i)
    if (std::memcmp(&a[i], &b[i], sizeof(float)) != 0)
      return ::testing::AssertionFailure() << "first difference at element " << i << " of "
                                           << a.size() << ": " << a[i] << " vs " << b[i];
  return ::testing::AssertionSuccess();
}

}  // namespace cohort::nn::testing
