// Shared by the export tests: a model's canonical weights and made-up running statistics
// (Exported), the safetensors header parsed back and the check of a file's layout and bytes
// against the weights, and the layer list with bn, residual blocks and gap that the safetensors,
// module-name and ONNX tests export. Plain functions, no fixtures.
#pragma once

#include <gtest/gtest.h>
#include <onnx/onnx_pb.h>
#include <nlohmann/json.hpp>

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "cohort/export/export.hpp"
#include "cohort/nn/model.hpp"

namespace cohort::exporting::testing {

// Canonical weights of `spec` from the default initialisation, seed 7.
inline std::vector<float> canonical_weights(const nn::Model& m) {
  std::vector<float> stored(m.layout().total()), canonical(m.layout().total());
  m.init(stored.data(), 7);
  m.to_canonical(stored.data(), canonical.data());
  return canonical;
}

// Running statistics unlike PyTorch's initial ones, so that a mix-up with the weights or between
// means and variances shows: element k of the array is 0.5 + k / 1000 (padding included).
inline std::vector<float> some_stats(const nn::Model& m) {
  std::vector<float> stats(m.stats_layout().total());
  for (std::size_t k = 0; k < stats.size(); ++k) stats[k] = 0.5f + static_cast<float>(k) / 1000;
  return stats;
}

// A model with its weights and running statistics, as a checkpoint holds them.
struct Exported {
  explicit Exported(const std::string& spec, nn::SampleShape input = {1, 28, 28},
                    std::int64_t vocab = 0)
      : model(nn::Model::parse(spec, input, vocab)),
        params(canonical_weights(model)),
        stats(some_stats(model)) {}
  Weights weights(std::int64_t batches = 0) const {
    return {.params = params.data(),
            .stats = stats.empty() ? nullptr : stats.data(),
            .batches_tracked = batches};
  }
  std::vector<std::uint8_t> safetensors(std::int64_t batches = 0) const {
    return encode_safetensors(model, weights(batches), {.model = model.spec()});
  }
  onnx::ModelProto onnx() const {
    onnx::ModelProto proto;
    EXPECT_TRUE(proto.ParseFromString(encode_onnx(model, weights(), {.model = model.spec()})));
    return proto;
  }
  nn::Model model;
  std::vector<float> params, stats;
};

struct Parsed {
  nlohmann::json header;
  std::size_t data_begin = 0;
};

inline Parsed parse_safetensors(const std::vector<std::uint8_t>& file) {
  EXPECT_GE(file.size(), 8u);
  std::uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | file[static_cast<std::size_t>(i)];
  EXPECT_LE(8 + n, file.size());
  EXPECT_EQ((8 + n) % 8, 0u) << "the data section starts 8-byte aligned";
  const std::string text(file.begin() + 8, file.begin() + 8 + static_cast<std::ptrdiff_t>(n));
  return {nlohmann::json::parse(text), 8 + n};
}

// Every tensor's offsets follow the previous one's, the last ends at the file's end, each holds
// its shape's bytes of its dtype (F32, or I64 for num_batches_tracked), and the bytes are the
// canonical weights or running statistics at that tensor's offset, or `batches`.
inline void check_layout(const std::vector<std::uint8_t>& file, const nn::Model& m,
                         const Weights& w) {
  const Parsed p = parse_safetensors(file);
  const std::vector<Tensor> tensors = torch_tensors(m);
  ASSERT_EQ(p.header.size(), tensors.size() + 1);  // + __metadata__
  std::uint64_t expected_begin = 0;
  // nlohmann's json sorts keys; the offsets define the order, so walk the tensors in ours.
  for (const Tensor& t : tensors) {
    SCOPED_TRACE(t.name);
    ASSERT_TRUE(p.header.contains(t.name));
    const nlohmann::json& e = p.header[t.name];
    const bool count = t.source == Tensor::Source::kBatchesTracked;
    EXPECT_EQ(e["dtype"], count ? "I64" : "F32");
    EXPECT_EQ(e["shape"].get<std::vector<std::int64_t>>(), t.shape);
    const auto offsets = e["data_offsets"].get<std::vector<std::uint64_t>>();
    ASSERT_EQ(offsets.size(), 2u);
    EXPECT_EQ(offsets[0], expected_begin);
    EXPECT_EQ(offsets[1] - offsets[0], t.numel() * (count ? 8 : 4));
    expected_begin = offsets[1];
    ASSERT_LE(p.data_begin + offsets[1], file.size());
    const void* want = static_cast<const void*>(&w.batches_tracked);
    if (t.source == Tensor::Source::kParams) want = w.params + t.offset;
    if (t.source == Tensor::Source::kStats) want = w.stats + t.offset;
    EXPECT_EQ(std::memcmp(file.data() + p.data_begin + offsets[0], want, offsets[1] - offsets[0]),
              0);
  }
  EXPECT_EQ(p.data_begin + expected_begin, file.size()) << "no bytes after the last tensor";
}

// A layer list with bn (after a conv, after a linear layer), residual blocks (identity and
// projection shortcut), a nobias conv and gap: module i of the nn.Sequential; a block's members
// are BasicBlock's (i.c1, i.b1, i.c2, i.b2, i.short.0, i.short.1).
inline constexpr const char* kBnList =
    "conv(4,3,1,1)-bn-relu-res(4)-res(8,2)-conv(8,3,1,1,nobias)-gap-linear(6)-bn-relu-"
    "dropout(0.5)-linear(10)";

}  // namespace cohort::exporting::testing
