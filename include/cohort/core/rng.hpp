// Keyed random streams: every stream is named by a key (seed, purpose, step, leaf, ...), never by
// a worker or a thread, so what a leaf draws does not depend on who computes it.
// SplitMix64 (Steele, Lea, Flood 2014): tiny, fast, statistically sound for initialisation,
// shuffling and dropout masks; not for cryptography.
#pragma once

#include <cstdint>
#include <initializer_list>

namespace cohort {

class Rng {
 public:
  // The state is a hash of every key word, so (seed, 1, 2) and (seed, 2, 1) are unrelated.
  Rng(std::initializer_list<std::uint64_t> key) {
    std::uint64_t h = 0x6a09e667f3bcc909ull;
    for (std::uint64_t k : key) h = mix(h ^ mix(k + 0x9e3779b97f4a7c15ull));
    state_ = h;
  }

  // The stream's increment: draw i (from 1) is mix(state() + i * kGamma).
  static constexpr std::uint64_t kGamma = 0x9e3779b97f4a7c15ull;
  std::uint64_t state() const { return state_; }

  std::uint64_t next_u64() {
    state_ += kGamma;
    return mix(state_);
  }
  // Uniform in [0, 1) with 24 random bits: every value is exactly representable. The bits go
  // to float through int32 (exact: they fit), which AVX2 converts in vectors and int64 it does
  // not, so a loop of draws (the dropout masks) vectorizes at the baseline too.
  float next_unit() { return unit_of(next_u64()); }
  static float unit_of(std::uint64_t draw) {
    return static_cast<float>(static_cast<std::int32_t>(draw >> 40)) * 0x1.0p-24f;
  }
  // Uniform in [lo, hi).
  float uniform(float lo, float hi) { return lo + (hi - lo) * next_unit(); }
  // Uniform integer in [0, n), n >= 1 (Lemire's multiply-shift; bias < n / 2^64).
  std::uint64_t below(std::uint64_t n) {
    __extension__ using u128 = unsigned __int128;
    return static_cast<std::uint64_t>((static_cast<u128>(next_u64()) * n) >> 64);
  }

  static std::uint64_t mix(std::uint64_t z) {
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }

 private:
  std::uint64_t state_;
};

}  // namespace cohort
