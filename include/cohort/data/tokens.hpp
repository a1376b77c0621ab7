// A text split's token ids as one sequence: held in memory (input.txt's characters, arrays handed
// over by a program) or pages of files mapped read-only (token arrays and llm.c's shards), one
// file after another, never read whole: a corpus larger than memory costs the process its page
// cache, not its own memory. Element widths 1, 2 or 4 bytes (little-endian).
// Thread-safety: immutable after construction; any number of threads may read at once.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

namespace cohort::data {

class Tokens {
 public:
  Tokens() = default;
  explicit Tokens(std::vector<std::uint32_t> owned);

  // A file mapped read-only (whole), kept while any Tokens refers to it. Throws InputError naming
  // the file if it cannot be opened or mapped.
  struct Mapping;
  static std::shared_ptr<const Mapping> map_file(const std::filesystem::path& path);
  static std::span<const std::uint8_t> bytes(const Mapping& m);

  // Appends `count` tokens of `width` bytes at `bytes`, inside mapping `m`.
  void append(std::shared_ptr<const Mapping> m, const std::uint8_t* bytes, std::size_t count,
              unsigned width);
  // Appends `other`'s tokens (sharing what holds them).
  void append(const Tokens& other);

  std::size_t size() const { return size_; }
  std::uint32_t operator[](std::size_t i) const;
  // Tokens [first, first + n) as floats (token ids below 2^24 are exact).
  void copy_to(std::size_t first, std::size_t n, float* out) const;
  // Calls `visit` with the tokens in order, a chunk at a time (as uint32). `release`: a mapped
  // chunk's pages are handed back to the kernel once visited (one pass over a corpus larger than
  // memory keeps none of it resident).
  void for_each_chunk(const std::function<void(std::span<const std::uint32_t>)>& visit,
                      bool release = false) const;
  std::vector<std::uint32_t> to_vector() const;
  bool operator==(const std::vector<std::uint32_t>& v) const { return to_vector() == v; }

 private:
  struct Segment {
    std::shared_ptr<const void> keep;
    const std::uint8_t* bytes;
    std::size_t first, count;  // its tokens' positions in the sequence
    unsigned width;
    bool mapped;
  };
  const Segment& segment_of(std::size_t i) const;
  std::vector<Segment> segments_;
  std::size_t size_ = 0;
};

}  // namespace cohort::data
