// Weights from a safetensors file for a model (`cohort train --init-from`): export.hpp's
// read_weights. The header is JSON (nlohmann-json); the tensors are F32, BF16 or F16.
#include <nlohmann/json.hpp>

#include <bit>
#include <cmath>
#include <cstring>
#include <map>
#include <optional>

#include "cohort/core/error.hpp"
#include "cohort/data/dataset.hpp"
#include "cohort/export/export.hpp"
#include "cohort/tensor/bf16.hpp"

namespace cohort::exporting {

// llmc_read.cpp: an llm.c checkpoint's bytes as `model`'s weights.
InitialWeights read_llmc_weights(const std::vector<std::uint8_t>& file, const std::string& name,
                                 const nn::Model& model);

namespace {

[[noreturn]] void refuse(const std::string& where, const std::string& expected,
                         const std::string& found) {
  throw InputError(where + ": expected " + expected + ", found " + found);
}

std::string shape_text(const std::vector<std::int64_t>& shape) {
  std::string s = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

struct Stored {
  std::string dtype;
  std::vector<std::int64_t> shape;
  const std::uint8_t* bytes = nullptr;
  std::size_t numel = 0;
};

float half_to_float(std::uint16_t h) {
  const std::uint32_t sign = std::uint32_t{h & 0x8000u} << 16;
  const int exponent = (h >> 10) & 0x1f;
  const std::uint32_t mantissa = h & 0x3ffu;
  if (exponent == 0) {  // zero or subnormal: mantissa * 2^-24
    const float v = std::ldexp(static_cast<float>(mantissa), -24);
    return sign ? -v : v;
  }
  if (exponent == 31) return std::bit_cast<float>(sign | 0x7f800000u | (mantissa << 13));
  return std::bit_cast<float>(sign | (std::uint32_t(exponent - 15 + 127) << 23) | (mantissa << 13));
}

float value_at(const Stored& t, std::size_t i) {
  const std::uint8_t* p = t.bytes;
  if (t.dtype == "F32") {
    std::uint32_t v;
    std::memcpy(&v, p + 4 * i, 4);
    return std::bit_cast<float>(v);
  }
  std::uint16_t v;
  std::memcpy(&v, p + 2 * i, 2);
  return t.dtype == "BF16" ? to_float(bf16{v}) : half_to_float(v);
}

// The header's tensors, each checked against the file: a known dtype, a shape whose elements
// fill its data_offsets exactly, offsets within the data section.
std::map<std::string, Stored> parse(const std::vector<std::uint8_t>& file,
                                    const std::string& name) {
  if (file.size() < 8) refuse(name + ": header length", "8 bytes", std::to_string(file.size()));
  std::uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= std::uint64_t{file[i]} << (8 * i);
  if (n > file.size() - 8)
    refuse(name + ": header length", "at most " + std::to_string(file.size() - 8) + " bytes",
           std::to_string(n) + " (file truncated)");
  nlohmann::json header;
  try {
    header = nlohmann::json::parse(file.begin() + 8, file.begin() + 8 + static_cast<long>(n));
  } catch (const nlohmann::json::parse_error& e) {
    refuse(name + ": header", "a JSON object", std::string("a syntax error (") + e.what() + ")");
  }
  if (!header.is_object()) refuse(name + ": header", "a JSON object", header.dump().substr(0, 40));
  const std::size_t data = 8 + static_cast<std::size_t>(n), data_bytes = file.size() - data;
  std::map<std::string, Stored> out;
  for (const auto& [key, t] : header.items()) {
    if (key == "__metadata__") continue;
    const std::string where = name + ": tensor '" + key + "'";
    if (!t.is_object() || !t.contains("dtype") || !t.contains("shape") ||
        !t.contains("data_offsets"))
      refuse(where, "an object with dtype, shape and data_offsets", t.dump().substr(0, 60));
    Stored s;
    s.dtype = t["dtype"].is_string() ? t["dtype"].get<std::string>() : t["dtype"].dump();
    const std::size_t item = s.dtype == "F32"                          ? 4
                             : (s.dtype == "BF16" || s.dtype == "F16") ? 2
                             : s.dtype == "I64"                        ? 8
                                                                       : 0;
    if (item == 0) refuse(where + ": dtype", "F32, BF16 or F16 (I64 for counters)", s.dtype);
    s.numel = 1;
    for (const auto& d : t["shape"]) {
      if (!d.is_number_unsigned() || d.get<std::uint64_t>() > (std::uint64_t{1} << 40))
        refuse(where + ": shape", "sizes >= 0", t["shape"].dump());
      s.shape.push_back(d.get<std::int64_t>());
      s.numel *= static_cast<std::size_t>(d.get<std::uint64_t>());
    }
    const auto& o = t["data_offsets"];
    if (!o.is_array() || o.size() != 2 || !o[0].is_number_unsigned() ||
        !o[1].is_number_unsigned() || o[0].get<std::uint64_t>() > o[1].get<std::uint64_t>() ||
        o[1].get<std::uint64_t>() > data_bytes)
      refuse(where + ": data_offsets",
             "[begin, end] within the " + std::to_string(data_bytes) + "-byte data section",
             o.dump());
    const std::uint64_t begin = o[0].get<std::uint64_t>(), end = o[1].get<std::uint64_t>();
    if (end - begin != s.numel * item)
      refuse(where + ": data_offsets",
             std::to_string(s.numel * item) + " bytes (shape " + shape_text(s.shape) + " of " +
                 s.dtype + ")",
             std::to_string(end - begin));
    s.bytes = file.data() + data + begin;
    out.emplace(key, std::move(s));
  }
  return out;
}

}  // namespace

InitialWeights read_weights(const std::filesystem::path& path, const nn::Model& model) {
  const std::string name = weights_file(path).string();
  const std::vector<std::uint8_t> file =
      data::read_file_bytes(name, std::uint64_t{1} << 36);  // 64 GiB: GPT-2's largest is 6
  if (is_llmc_checkpoint(name)) return read_llmc_weights(file, name, model);
  std::map<std::string, Stored> stored = parse(file, name);
  const bool language = model.kind().window() > 0;
  // A language model: Hugging Face's names lack "transformer." (its buffers attn.bias and
  // attn.masked_bias are not weights), and its Conv1D weights are (in, out).
  bool hugging_face = false;
  if (language) {
    std::map<std::string, Stored> renamed;
    for (auto& [key, t] : stored) {
      if (key.ends_with(".attn.bias") || key.ends_with(".attn.masked_bias")) continue;
      const bool bare = key.rfind("transformer.", 0) != 0 && key != "lm_head.weight";
      hugging_face = hugging_face || bare;
      renamed.emplace(bare ? "transformer." + key : key, std::move(t));
    }
    stored = std::move(renamed);
  }
  InitialWeights w;
  w.params.assign(model.layout().total(), 0.0f);
  w.stats.assign(model.stats_layout().total(), 0.0f);
  std::map<std::string, bool> used;
  for (const nn::StateTensor& t : model.state_dict()) {
    if (t.source == nn::StateTensor::Source::kBatchesTracked) {  // a counter, not a weight
      used[t.name] = true;
      continue;
    }
    const auto it = stored.find(t.name);
    const std::string where = name + ": tensor '" + t.name + "'";
    if (it == stored.end()) {
      if (t.name == "lm_head.weight") continue;  // tied: the token embedding
      refuse(where,
             "shape " + shape_text(t.shape) + " (a tensor of --model '" + model.spec() + "')",
             "none");
    }
    const Stored& s = it->second;
    used[t.name] = true;
    std::vector<std::int64_t> want = t.shape;
    const bool transposed = hugging_face && hugging_face_conv1d(t.name) && want.size() == 2;
    if (transposed) std::swap(want[0], want[1]);
    if (s.shape != want)
      refuse(where,
             "shape " + shape_text(want) + (transposed ? " (Hugging Face's Conv1D)" : "") +
                 " for --model '" + model.spec() + "'",
             shape_text(s.shape));
    if (s.dtype == "I64") refuse(where + ": dtype", "F32, BF16 or F16", "I64");
    float* to = (t.source == nn::StateTensor::Source::kParams ? w.params.data() : w.stats.data()) +
                t.offset;
    if (t.name == "lm_head.weight") {  // must be the token embedding (a tied head)
      for (std::size_t i = 0; i < s.numel; ++i)
        if (value_at(s, i) != to[i])
          refuse(where, "the values of transformer.wte.weight (cohort's head is tied to it)",
                 "another value at element " + std::to_string(i));
      continue;
    }
    if (transposed) {
      const auto rows = static_cast<std::size_t>(t.shape[0]),
                 cols = static_cast<std::size_t>(t.shape[1]);
      for (std::size_t r = 0; r < rows; ++r)
        for (std::size_t c = 0; c < cols; ++c) to[r * cols + c] = value_at(s, c * rows + r);
    } else {
      for (std::size_t i = 0; i < s.numel; ++i) to[i] = value_at(s, i);
    }
    for (std::size_t i = 0; i < s.numel; ++i)
      if (!std::isfinite(to[i]))
        refuse(where + ": element " + std::to_string(i), "a finite value",
               std::isnan(to[i]) ? "NaN" : "infinity");
  }
  for (const auto& [key, t] : stored)
    if (!used.contains(key))
      refuse(name + ": tensor '" + key + "'", "only tensors of --model '" + model.spec() + "'",
             "one it does not have (shape " + shape_text(t.shape) + ")");
  return w;
}

}  // namespace cohort::exporting
