// libFuzzer target: the text reader (UTF-8, vocabulary, split) on arbitrary bytes, the same
// bytes as a val.txt against a fixed input.txt, and as an llm.c token shard's header and tokens.
// Any outcome but consistent splits (or a shard's count) or an InputError naming a file is a
// finding.
#include <cstdint>
#include <cstdlib>
#include <span>
#include <string>

#include "cohort/core/error.hpp"
#include "cohort/data/text.hpp"

namespace {
void check(const cohort::data::TextData& d) {
  if (d.vocab_size == 0 || d.train.size() < 5 || d.val.size() < 5) std::abort();
  for (const auto* split : {&d.train, &d.val})
    for (std::uint32_t t : split->to_vector())
      if (t >= d.vocab_size) std::abort();
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::span<const std::uint8_t> bytes(data, size);
  try {
    check(cohort::data::read_text(bytes, "in.txt", nullptr, {}, 4));
  } catch (const cohort::InputError& e) {
    if (std::string(e.what()).rfind("in.txt", 0) != 0) std::abort();
  }
  static const std::string input = "First Citizen:\nBefore we proceed any further, hear me speak.";
  const std::span<const std::uint8_t> in(reinterpret_cast<const std::uint8_t*>(input.data()),
                                         input.size());
  try {
    check(cohort::data::read_text(in, "input.txt", &bytes, "val.txt", 4));
  } catch (const cohort::InputError& e) {
    if (std::string(e.what()).rfind("val.txt", 0) != 0) std::abort();
  }
  try {  // the same bytes as an llm.c shard
    const std::size_t n = cohort::data::shard_tokens(bytes, "shard.bin");
    if (size != cohort::data::kShardHeaderBytes + 2 * n) std::abort();
  } catch (const cohort::InputError& e) {
    if (std::string(e.what()).rfind("shard.bin", 0) != 0) std::abort();
  }
  return 0;
}
