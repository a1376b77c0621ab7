// A 64-byte-aligned (2 MiB from kHugePageArrayBytes on), zero-initialised (unless asked not to
// be), fixed-size array of floats (or any trivial type). The one allocation behind the master
// weights, every gradient buffer and every activation. Not a tensor library: no shape, no views,
// no growth. Not thread-safe beyond what std::vector is.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <new>
#include <span>
#include <type_traits>
#include <utility>
#include <vector>

namespace cohort {

// Cache line on the machines cohort targets; used for alignment and false-sharing padding.
inline constexpr std::size_t kCacheLine = 64;
// An array of at least this many bytes starts on a 2 MiB boundary and asks the kernel for
// transparent huge pages (madvise MADV_HUGEPAGE, which Debian's default "madvise" mode honours):
// a step streams the weights, the optimizer's state and whole-model gradients, 4 KiB pages at a
// time otherwise (docs/decisions.md, "Large arrays on huge pages").
inline constexpr std::size_t kHugePageArrayBytes = std::size_t{8} << 20;

namespace detail {
// `bytes` (a multiple of kCacheLine) aligned to kCacheLine, or to 2 MiB with huge pages asked for
// from kHugePageArrayBytes on; free_bytes takes the same count back.
void* allocate_bytes(std::size_t bytes);
void free_bytes(void* p, std::size_t bytes) noexcept;
}  // namespace detail

template <typename T>
class AlignedBuffer {
  static_assert(std::is_trivially_copyable_v<T>);

 public:
  AlignedBuffer() = default;
  explicit AlignedBuffer(std::size_t n) : data_(allocate(n)), size_(n) {
    if (n != 0) std::memset(data_.get(), 0, n * sizeof(T));
  }
  // Not zeroed, so a large array's pages take memory only once written: for an array whose
  // every element is written before it is read, and which may never be written at all.
  struct Uninitialized {};
  AlignedBuffer(std::size_t n, Uninitialized) : data_(allocate(n)), size_(n) {}
  AlignedBuffer(AlignedBuffer&&) noexcept = default;
  AlignedBuffer& operator=(AlignedBuffer&&) noexcept = default;

  T* data() { return data_.get(); }
  const T* data() const { return data_.get(); }
  std::size_t size() const { return size_; }
  std::size_t bytes() const { return size_ * sizeof(T); }
  T& operator[](std::size_t i) { return data_.get()[i]; }
  const T& operator[](std::size_t i) const { return data_.get()[i]; }
  std::span<T> span() { return {data(), size_}; }
  std::span<const T> span() const { return {data(), size_}; }
  void fill_zero() {
    if (size_ != 0) std::memset(data_.get(), 0, bytes());
  }

 private:
  struct Free {
    std::size_t bytes = 0;
    void operator()(T* p) const { detail::free_bytes(p, bytes); }
  };
  static std::unique_ptr<T, Free> allocate(std::size_t n) {
    if (n == 0) return {nullptr, Free{}};
    if (n > SIZE_MAX / sizeof(T)) throw std::bad_array_new_length();
    // Round the byte count up to whole cache lines so vector loops may read a full last line.
    const std::size_t bytes = (n * sizeof(T) + kCacheLine - 1) / kCacheLine * kCacheLine;
    return {static_cast<T*>(detail::allocate_bytes(bytes)), Free{bytes}};
  }
  std::unique_ptr<T, Free> data_;
  std::size_t size_ = 0;
};

// Zeroed arrays carved in order out of reserved address space on transparent huge pages, for the
// many mid-sized arrays that one owner creates together and frees together (a plan's activations,
// gradients and masks). A fresh anonymous page is zero and takes memory only once touched, so
// nothing is written up front; where each of those arrays was its own allocation, touching them
// faulted in 4 KiB pages one at a time (docs/decisions.md, "A plan's arrays on huge pages"). An
// array starts on a cache line, or on a 2 MiB boundary from kHugePageArrayBytes on, as
// AlignedBuffer places it; its address never moves. Not thread-safe.
class ArrayArena {
 public:
  ArrayArena() = default;
  ArrayArena(ArrayArena&& o) noexcept { *this = std::move(o); }
  ArrayArena& operator=(ArrayArena&& o) noexcept;
  ArrayArena(const ArrayArena&) = delete;
  ArrayArena& operator=(const ArrayArena&) = delete;
  ~ArrayArena() { release(); }

  // `bytes` zeroed bytes (0: a valid, unique, empty array), aligned as above.
  void* allocate(std::size_t bytes);
  template <typename T>
  T* allocate_array(std::size_t n) {
    static_assert(std::is_trivially_copyable_v<T>);
    if (n > SIZE_MAX / sizeof(T)) throw std::bad_array_new_length();
    return static_cast<T*>(allocate(n * sizeof(T)));
  }
  // The arrays' bytes, as asked (what the owner's memory accounts count).
  std::size_t bytes() const { return bytes_; }

 private:
  struct Region {
    void* map = nullptr;  // the whole mapping, given back with munmap
    std::size_t map_bytes = 0;
  };
  void release() noexcept;
  void reserve(std::size_t at_least);
  std::vector<Region> regions_;
  std::uintptr_t next_ = 0, end_ = 0;  // the current region's unused part
  std::size_t bytes_ = 0, reserved_ = 0;
};

}  // namespace cohort
