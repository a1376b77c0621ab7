// AlignedBuffer's allocation: cache-line aligned, and large arrays on transparent huge pages
// (buffer.hpp).
#include "cohort/tensor/buffer.hpp"

#include <sys/mman.h>

#include <cstdlib>
#include <new>

namespace cohort::detail {

namespace {
constexpr std::size_t kHugePage = std::size_t{2} << 20;
}

void* allocate_bytes(std::size_t bytes) {
  if (bytes < kHugePageArrayBytes) return ::operator new[](bytes, std::align_val_t{kCacheLine});
  const std::size_t whole = (bytes + kHugePage - 1) / kHugePage * kHugePage;
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

}  // namespace cohort::detail
