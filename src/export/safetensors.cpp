// The safetensors encoder: a JSON header (nlohmann-json) and the raw little-endian bytes.
// Not a reader: the tests parse the header, and PyTorch users read the file with their tools.
#include <nlohmann/json.hpp>

#include <bit>
#include <cstring>

#include "cohort/core/error.hpp"
#include "cohort/export/export.hpp"

namespace cohort::exporting {

static_assert(std::endian::native == std::endian::little,
              "safetensors stores little-endian bytes; this encoder copies values as they are");

std::vector<std::uint8_t> encode_safetensors(const nn::Model& model, const Weights& w,
                                             const Metadata& m) {
  using Source = Tensor::Source;
  const std::vector<Tensor> tensors = torch_tensors(model);
  // ordered_json keeps the tensors in state_dict order, the order of their bytes.
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  std::uint64_t offset = 0;  // bytes into the data section
  for (const Tensor& t : tensors) {
    header[t.name] = {{"dtype", t.source == Source::kBatchesTracked ? "I64" : "F32"},
                      {"shape", t.shape},
                      {"data_offsets", {offset, offset + t.bytes()}}};
    offset += t.bytes();
  }
  header["__metadata__"] = metadata_strings(m);
  std::string text = header.dump();
  // Pad the header with spaces so the data section starts 8-byte aligned (allowed by the spec).
  text.append((8 - text.size() % 8) % 8, ' ');

  std::vector<std::uint8_t> file(8 + text.size() + offset);
  const std::uint64_t length = text.size();
  for (int i = 0; i < 8; ++i) file[i] = static_cast<std::uint8_t>(length >> (8 * i));
  std::memcpy(file.data() + 8, text.data(), text.size());
  std::uint8_t* data = file.data() + 8 + text.size();
  for (const Tensor& t : tensors) {
    switch (t.source) {
      case Source::kParams:
        COHORT_CHECK(t.offset + t.numel() <= model.layout().total(), t.name);
        std::memcpy(data, w.params + t.offset, t.bytes());
        break;
      case Source::kStats:
        COHORT_CHECK(w.stats != nullptr && t.offset + t.numel() <= model.stats_layout().total(),
                     t.name);
        std::memcpy(data, w.stats + t.offset, t.bytes());
        break;
      case Source::kBatchesTracked:
        std::memcpy(data, &w.batches_tracked, sizeof w.batches_tracked);
        break;
    }
    data += t.bytes();
  }
  return file;
}

}  // namespace cohort::exporting
