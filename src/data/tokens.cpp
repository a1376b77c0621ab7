// A text split's tokens in memory or mapped from files: include/cohort/data/tokens.hpp.
#include "cohort/data/tokens.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "cohort/core/error.hpp"

namespace cohort::data {

struct Tokens::Mapping {
  void* addr = nullptr;
  std::size_t length = 0;
  ~Mapping() {
    if (addr != nullptr) ::munmap(addr, length);
  }
};

namespace {

std::uint32_t load(const std::uint8_t* p, unsigned width) {
  std::uint32_t v = 0;
  for (unsigned b = 0; b < width; ++b) v |= std::uint32_t{p[b]} << (8 * b);
  return v;
}

}  // namespace

Tokens::Tokens(std::vector<std::uint32_t> owned) {
  auto keep = std::make_shared<const std::vector<std::uint32_t>>(std::move(owned));
  const auto* bytes = reinterpret_cast<const std::uint8_t*>(keep->data());
  const std::size_t n = keep->size();
  if (n != 0) segments_.push_back({std::move(keep), bytes, 0, n, 4, false});
  size_ = n;
}

std::shared_ptr<const Tokens::Mapping> Tokens::map_file(const std::filesystem::path& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw InputError(path.string() + ": cannot open (" + std::strerror(errno) + ")");
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_size == 0) {
    ::close(fd);
    throw InputError(path.string() + ": expected a non-empty regular file");
  }
  auto m = std::make_shared<Mapping>();
  m->length = static_cast<std::size_t>(st.st_size);
  m->addr = ::mmap(nullptr, m->length, PROT_READ, MAP_PRIVATE, fd, 0);
  const int error = errno;
  ::close(fd);
  if (m->addr == MAP_FAILED) {
    m->addr = nullptr;
    throw InputError(path.string() + ": cannot map (" + std::strerror(error) + ")");
  }
  return m;
}

std::span<const std::uint8_t> Tokens::bytes(const Mapping& m) {
  return {static_cast<const std::uint8_t*>(m.addr), m.length};
}

void Tokens::append(std::shared_ptr<const Mapping> m, const std::uint8_t* bytes, std::size_t count,
                    unsigned width) {
  COHORT_CHECK(width == 1 || width == 2 || width == 4, "token width 1, 2 or 4 bytes");
  const auto* begin = static_cast<const std::uint8_t*>(m->addr);
  COHORT_CHECK(bytes >= begin && bytes + count * width <= begin + m->length,
               "tokens inside their mapping");
  if (count == 0) return;
  segments_.push_back({std::move(m), bytes, size_, count, width, true});
  size_ += count;
}

void Tokens::append(const Tokens& other) {
  for (Segment s : other.segments_) {
    s.first += size_;
    segments_.push_back(std::move(s));
  }
  size_ += other.size_;
}

const Tokens::Segment& Tokens::segment_of(std::size_t i) const {
  COHORT_CHECK(i < size_, "a token position within the split");
  const auto it = std::upper_bound(segments_.begin(), segments_.end(), i,
                                   [](std::size_t v, const Segment& s) { return v < s.first; });
  return *(it - 1);
}

std::uint32_t Tokens::operator[](std::size_t i) const {
  const Segment& s = segment_of(i);
  return load(s.bytes + (i - s.first) * s.width, s.width);
}

void Tokens::copy_to(std::size_t first, std::size_t n, float* out) const {
  COHORT_CHECK(first + n <= size_, "a window within the split");
  while (n > 0) {
    const Segment& s = segment_of(first);
    const std::size_t at = first - s.first, take = std::min(n, s.count - at);
    const std::uint8_t* p = s.bytes + at * s.width;
    if (s.width == 4 && !s.mapped) {
      const auto* v = reinterpret_cast<const std::uint32_t*>(p);
      for (std::size_t j = 0; j < take; ++j) out[j] = static_cast<float>(v[j]);
    } else {
      for (std::size_t j = 0; j < take; ++j)
        out[j] = static_cast<float>(load(p + j * s.width, s.width));
    }
    out += take;
    first += take;
    n -= take;
  }
}

void Tokens::for_each_chunk(const std::function<void(std::span<const std::uint32_t>)>& visit,
                            bool release) const {
  constexpr std::size_t kChunk = std::size_t{1} << 20;  // tokens
  std::vector<std::uint32_t> buffer;
  const long page = ::sysconf(_SC_PAGESIZE);
  for (const Segment& s : segments_)
    for (std::size_t at = 0; at < s.count; at += kChunk) {
      const std::size_t n = std::min(kChunk, s.count - at);
      const std::uint8_t* p = s.bytes + at * s.width;
      buffer.resize(n);
      for (std::size_t j = 0; j < n; ++j) buffer[j] = load(p + j * s.width, s.width);
      visit(buffer);
      if (release && s.mapped && page > 0) {
        // Whole pages inside the chunk: a private read-only mapping's pages are the page cache's,
        // dropped from this process and read again if a step needs them.
        const auto begin = reinterpret_cast<std::uintptr_t>(p);
        const auto end = begin + n * s.width;
        const std::uintptr_t first = (begin + page - 1) / page * page, last = end / page * page;
        if (last > first) ::madvise(reinterpret_cast<void*>(first), last - first, MADV_DONTNEED);
      }
    }
}

std::vector<std::uint32_t> Tokens::to_vector() const {
  std::vector<std::uint32_t> out;
  out.reserve(size_);
  for_each_chunk(
      [&out](std::span<const std::uint32_t> c) { out.insert(out.end(), c.begin(), c.end()); });
  return out;
}

}  // namespace cohort::data
