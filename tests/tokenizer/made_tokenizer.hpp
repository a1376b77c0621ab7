// A small GPT-2-style vocabulary and merges, made for the tests: the 256 byte tokens with ids equal
// to their bytes, then the merges below (ids 256 onwards in this order), with GPT-2's characters
// for bytes ('Ġ' for a space). Written as vocab.json and merges.txt by write_made_tokenizer.
#pragma once

#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

#include "cohort/data/text.hpp"
#include "cohort/tokenizer/bpe.hpp"

namespace made_tokenizer {

// The merges in rank order, as their bytes (a space is GPT-2's 'Ġ' in the files).
inline const std::vector<std::pair<std::string, std::string>> kMerges = {
    {"h", "e"}, {"l", "l"}, {" ", "t"}, {" t", "he"}, {"'", "t"}, {"1", "2"}, {" ", "w"},
};

// Bytes as vocab.json's characters.
inline std::string chars(const std::string& bytes) {
  std::string out;
  for (const char c : bytes)
    out +=
        cohort::data::encode_utf8(cohort::tokenizer::byte_character(static_cast<std::uint8_t>(c)));
  return out;
}

inline std::string vocab_json() {
  nlohmann::json v = nlohmann::json::object();
  for (int b = 0; b < 256; ++b) v[chars(std::string(1, static_cast<char>(b)))] = b;
  int id = 256;
  for (const auto& [a, b] : kMerges) v[chars(a + b)] = id++;
  return v.dump();
}

inline std::string merges_txt() {
  std::string out = "#version: 0.2\n";
  for (const auto& [a, b] : kMerges) out += chars(a) + " " + chars(b) + "\n";
  return out;
}

inline void write_made_tokenizer(const std::filesystem::path& dir) {
  std::filesystem::create_directories(dir);
  std::ofstream(dir / "vocab.json") << vocab_json();
  std::ofstream(dir / "merges.txt") << merges_txt();
}

}  // namespace made_tokenizer
