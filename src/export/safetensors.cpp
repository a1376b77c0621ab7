// The safetensors encoder: a JSON header (nlohmann-json) and the raw float32 bytes.
// Not a reader: the tests parse the header, and PyTorch users read the file with their tools.
#include <nlohmann/json.hpp>

#include <bit>
#include <cstring>

#include "cohort/core/error.hpp"
#include "cohort/export/export.hpp"

namespace cohort::exporting {

static_assert(std::endian::native == std::endian::little,
              "safetensors stores little-endian bytes; this encoder copies floats as they are");

std::vector<std::uint8_t> encode_safetensors(const nn::Model& model, const float* canonical,
                                             const Metadata& m) {
  const std::vector<Tensor> tensors = torch_tensors(model);
  // ordered_json keeps the tensors in layer order, the order of their bytes.
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  std::uint64_t offset = 0;  // bytes into the data section
  for (const Tensor& t : tensors) {
    const std::uint64_t bytes = t.numel() * sizeof(float);
    header[t.name] = {
        {"dtype", "F32"}, {"shape", t.shape}, {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
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
    COHORT_CHECK(t.offset + t.numel() <= model.layout().total(), t.name);
    std::memcpy(data, canonical + t.offset, t.numel() * sizeof(float));
    data += t.numel() * sizeof(float);
  }
  return file;
}

}  // namespace cohort::exporting
