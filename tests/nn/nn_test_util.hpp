// Shared by the nn tests: seeded parameters, inputs and labels for a model, a bitwise
// comparison of float arrays that names the first difference, and the bf16 tests' rounded
// copies and tolerance check (net_bf16_test.cpp states the bound). Plain functions, no fixtures.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "cohort/core/rng.hpp"
#include "cohort/nn/model.hpp"
#include "cohort/tensor/bf16.hpp"
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

// The model's longest forward dot product K: the largest IC * KH * KW of its linear and conv
// layers, also those inside residual blocks.
inline std::int64_t longest_dot_product(const Model& m) {
  std::int64_t K = 1;
  auto visit = [&K](const std::vector<LayerSpec>& layers, auto& self) -> void {
    for (const auto& l : layers) {
      if (l.kind == LayerSpec::Kind::kLinear) K = std::max(K, l.in.C);
      if (l.kind == LayerSpec::Kind::kConv) K = std::max(K, l.in.C * l.kernel * l.kernel);
      self(l.body, self);
      self(l.shortcut, self);
    }
  };
  visit(m.layers(), visit);
  return K;
}

// The bf16 copies of a model's parameters and inputs, and those values in float64.
struct Rounded {
  AlignedBuffer<bf16> params, x;
  std::vector<double> params64, x64;
};

inline Rounded round_to_bf16(const Inputs& in) {
  Rounded r{AlignedBuffer<bf16>(in.params.size()), AlignedBuffer<bf16>(in.x.size()), {}, {}};
  to_bf16(in.params.data(), r.params.data(), in.params.size());
  to_bf16(in.x.data(), r.x.data(), in.x.size());
  for (std::size_t i = 0; i < r.params.size(); ++i) r.params64.push_back(to_float(r.params[i]));
  for (std::size_t i = 0; i < r.x.size(); ++i) r.x64.push_back(to_float(r.x[i]));
  return r;
}

// Checks max_i |got_i - ref_i| <= kC * 2^-8 * K * max_i |ref_i| (the bf16 bound of
// net_bf16_test.cpp); returns the worst observed c.
inline double expect_within(std::span<const float> got, std::span<const double> ref, std::int64_t K,
                            double kC, const std::string& what) {
  double scale = 1e-30, err = 0;
  std::size_t worst = 0;
  for (double v : ref) scale = std::max(scale, std::abs(v));
  for (std::size_t i = 0; i < ref.size(); ++i)
    if (const double e = std::abs(double(got[i]) - ref[i]); e > err) err = e, worst = i;
  const double c = err / (std::ldexp(1.0, -8) * double(K) * scale);
  EXPECT_LE(c, kC) << what << ": element " << worst << " is " << got[worst] << ", reference "
                   << ref[worst] << " (largest |reference| " << scale << ", K " << K << ")";
  return c;
}

}  // namespace cohort::nn::testing
