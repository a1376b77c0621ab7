// AlignedBuffer's allocation (cache-line aligned, and large arrays on transparent huge pages) and
// ArrayArena's regions (buffer.hpp).
#include "cohort/tensor/buffer.hpp"

#include <sys/mman.h>

#include <algorithm>
#include <cstdlib>
#include <new>

// Under AddressSanitizer an arena keeps its unused space poisoned and a cache line of it after
// each array's last line, so an access past that line is reported as it was when each array was
// its own allocation.
#if defined(__SANITIZE_ADDRESS__)
#define COHORT_ARENA_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define COHORT_ARENA_ASAN 1
#endif
#endif
#ifdef COHORT_ARENA_ASAN
#include <sanitizer/asan_interface.h>
#endif

namespace cohort {
namespace {
constexpr std::size_t kHugePage = std::size_t{2} << 20;
// A region reserves at least this much address space (doubling with each region after, up to
// kMaxRegion), so a plan takes a few mappings, not one an array. Address space only: the pages
// take memory when touched.
constexpr std::size_t kFirstRegion = std::size_t{32} << 20;
constexpr std::size_t kMaxRegion = std::size_t{1} << 30;

std::uintptr_t round_up(std::uintptr_t v, std::size_t to) { return (v + to - 1) / to * to; }
}  // namespace

namespace detail {

void* allocate_bytes(std::size_t bytes) {
  if (bytes < kHugePageArrayBytes) return ::operator new[](bytes, std::align_val_t{kCacheLine});
  const std::size_t whole = round_up(bytes, kHugePage);
  void* p = std::aligned_alloc(kHugePage, whole);
  if (p == nullptr) throw std::bad_alloc();
  // Advice only: a kernel without transparent huge pages keeps 4 KiB pages.
  (void)::madvise(p, whole, MADV_HUGEPAGE);
  return p;
}

void free_bytes(void* p, std::size_t bytes) noexcept {
  if (p == nullptr) return;
  if (bytes < kHugePageArrayBytes)
    ::operator delete[](p, std::align_val_t{kCacheLine});
  else
    std::free(p);
}

}  // namespace detail

ArrayArena& ArrayArena::operator=(ArrayArena&& o) noexcept {
  if (this == &o) return *this;
  release();
  regions_ = std::exchange(o.regions_, {});
  next_ = std::exchange(o.next_, 0);
  end_ = std::exchange(o.end_, 0);
  bytes_ = std::exchange(o.bytes_, 0);
  reserved_ = std::exchange(o.reserved_, 0);
  return *this;
}

void ArrayArena::release() noexcept {
  for (const Region& r : regions_) {
#ifdef COHORT_ARENA_ASAN
    ASAN_UNPOISON_MEMORY_REGION(r.map, r.map_bytes);
#endif
    ::munmap(r.map, r.map_bytes);
  }
  regions_.clear();
  next_ = end_ = 0;
  bytes_ = reserved_ = 0;
}

void ArrayArena::reserve(std::size_t at_least) {
  const std::size_t grow = std::min(kMaxRegion, std::max(kFirstRegion, reserved_));
  const std::size_t usable = round_up(std::max(grow, at_least + kHugePage), kHugePage);
  // One huge page more than used, so the usable part can start on a 2 MiB boundary.
  const std::size_t map_bytes = usable + kHugePage;
  void* map = ::mmap(nullptr, map_bytes, PROT_READ | PROT_WRITE,
                     MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (map == MAP_FAILED) throw std::bad_alloc();
  regions_.push_back({map, map_bytes});
  next_ = round_up(reinterpret_cast<std::uintptr_t>(map), kHugePage);
  end_ = next_ + usable;
  reserved_ += usable;
  // Advice only: a kernel without transparent huge pages keeps 4 KiB pages.
  (void)::madvise(reinterpret_cast<void*>(next_), usable, MADV_HUGEPAGE);
#ifdef COHORT_ARENA_ASAN
  ASAN_POISON_MEMORY_REGION(map, map_bytes);
#endif
}

void* ArrayArena::allocate(std::size_t bytes) {
  const std::size_t align = bytes >= kHugePageArrayBytes ? kHugePage : kCacheLine;
  // Whole cache lines, as AlignedBuffer's, and at least one so every array has its own address.
  std::size_t size = round_up(std::max<std::size_t>(bytes, 1), kCacheLine);
#ifdef COHORT_ARENA_ASAN
  size += kCacheLine;  // stays poisoned
#endif
  std::uintptr_t at = round_up(next_, align);
  if (regions_.empty() || at > end_ || end_ - at < size) {
    reserve(size);
    at = round_up(next_, align);
  }
  next_ = at + size;
  bytes_ += bytes;
#ifdef COHORT_ARENA_ASAN
  // The whole last line, as AlignedBuffer's: vector loops may read it.
  ASAN_UNPOISON_MEMORY_REGION(reinterpret_cast<void*>(at), round_up(bytes, kCacheLine));
#endif
  return reinterpret_cast<void*>(at);
}

}  // namespace cohort
