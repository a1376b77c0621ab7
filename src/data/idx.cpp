// IDX reader over zlib's gz stream (which also reads uncompressed files unchanged).
// The header is read and checked first, then the size it claims against what the file can hold
// (its own size uncompressed, deflate's 1032:1 limit compressed) before anything is allocated.
// An uncompressed payload is read into a buffer of exactly the announced size; a compressed one
// into a buffer grown as the data arrives (16 MiB, then doubling), so a claim the stream does not
// back costs about twice the bytes that are there. Then one more byte is attempted to prove
// there is no trailing data.
#include "cohort/data/idx.hpp"

#include <zlib.h>

#include <algorithm>
#include <limits>
#include <memory>
#include <sstream>
#include <string>
#include <system_error>

#include "cohort/core/error.hpp"

namespace cohort::data {

namespace {

// Deflate's largest ratio: a length-258 match coded in 2 bits, 1032 bytes out per byte in. No
// gzip file (concatenated members included) decompresses to more than this times its size.
constexpr std::uint64_t kDeflateMaxRatio = 1032;
// The first piece of a compressed payload's buffer; each later one doubles it.
constexpr std::uint64_t kFirstChunk = std::uint64_t{1} << 24;

class Reader {
 public:
  explicit Reader(const std::filesystem::path& path) : path_(path) {
    std::error_code ec;
    auto status = std::filesystem::status(path, ec);
    if (!std::filesystem::exists(status))
      fail("file", "an existing file",
           ec && ec != std::errc::no_such_file_or_directory ? ec.message() : "no such file");
    if (std::filesystem::is_directory(status)) fail("file", "a regular file", "a directory");
    if (!std::filesystem::is_regular_file(status)) fail("file", "a regular file", "a special file");
    file_bytes_ = std::filesystem::file_size(path, ec);
    if (file_bytes_ == 0 || ec) fail("file", "a non-empty file", "0 bytes");
    file_.reset(gzopen(path.c_str(), "rb"));
    if (!file_) fail("file", "a readable file", "open failed");
    gzbuffer(file_.get(), 1 << 17);
  }

  // Reads exactly n bytes or reports how many were there; `wanted` (n when 0) is the byte count
  // the message says was expected from here.
  void read_exact(void* dst, std::size_t n, const char* field, std::uint64_t wanted = 0) {
    auto* out = static_cast<unsigned char*>(dst);
    std::size_t got = 0;
    while (got < n) {
      unsigned chunk = static_cast<unsigned>(std::min<std::size_t>(n - got, 1u << 30));
      int r = gzread(file_.get(), out + got, chunk);
      if (r < 0) {
        int errnum = 0;
        const char* msg = gzerror(file_.get(), &errnum);
        fail(field, "readable (gzip) data", std::string("a decompression error: ") + msg);
      }
      if (r == 0) break;
      got += static_cast<std::size_t>(r);
    }
    offset_ += got;
    if (got != n) {
      std::ostringstream found;
      found << "end of data at byte " << offset_ << " (file truncated)";
      fail(field, std::to_string(wanted != 0 ? wanted : n) + " more bytes", found.str());
    }
  }

  std::uint32_t read_be32(const char* field) {
    unsigned char b[4];
    read_exact(b, 4, field);
    return (std::uint32_t{b[0]} << 24) | (std::uint32_t{b[1]} << 16) | (std::uint32_t{b[2]} << 8) |
           std::uint32_t{b[3]};
  }

  bool at_end() {
    unsigned char extra;
    int r = gzread(file_.get(), &extra, 1);
    return r == 0;
  }

  std::uint64_t offset() const { return offset_; }
  std::uint64_t file_bytes() const { return file_bytes_; }
  // Whether zlib reads the file as it is (not gzip); known once something has been read.
  bool direct() { return gzdirect(file_.get()) == 1; }

  [[noreturn]] void fail(const std::string& field, const std::string& expected,
                         const std::string& found) const {
    throw InputError(path_.string() + ": " + field + ": expected " + expected + ", found " + found);
  }

 private:
  struct Close {
    void operator()(gzFile f) const { gzclose(f); }
  };
  std::filesystem::path path_;
  std::unique_ptr<gzFile_s, Close> file_;
  std::uint64_t offset_ = 0;
  std::uint64_t file_bytes_ = 0;
};

std::string hex(unsigned v) {
  std::ostringstream s;
  s << "0x" << std::hex << v;
  return s.str();
}

}  // namespace

IdxArray read_idx(const std::filesystem::path& path, std::size_t expected_ndim,
                  const IdxLimits& limits) {
  Reader in(path);
  unsigned char magic[4];
  in.read_exact(magic, 4, "magic");
  if (magic[0] != 0 || magic[1] != 0)
    in.fail("magic", "bytes 0x00 0x00 at offset 0",
            hex(magic[0]) + " " + hex(magic[1]) + " (not an IDX file)");
  if (magic[2] != 0x08) in.fail("type code", "0x8 (unsigned byte)", hex(magic[2]));
  if (magic[3] != expected_ndim)
    in.fail("number of dimensions", std::to_string(expected_ndim), std::to_string(magic[3]));

  IdxArray out;
  std::uint64_t payload = 1;
  for (std::size_t i = 0; i < expected_ndim; ++i) {
    std::string field = "dimension " + std::to_string(i);
    std::uint32_t d = in.read_be32(field.c_str());
    if (d == 0) in.fail(field, "a size >= 1", "0");
    if (d > limits.max_dim)
      in.fail(field, "a size <= " + std::to_string(limits.max_dim), std::to_string(d));
    // payload * d <= max_payload, checked without overflowing.
    if (payload > limits.max_payload / d)
      in.fail("payload size",
              "product of dimensions <= " + std::to_string(limits.max_payload) + " bytes",
              "a larger product at dimension " + std::to_string(i));
    payload *= d;
    out.dims.push_back(d);
  }
  // The claim against what the file can hold, before allocating: its size after the header when
  // uncompressed; deflate's limit times its size when gzip.
  const std::uint64_t header = in.offset();
  const bool direct = in.direct();
  const std::uint64_t file = in.file_bytes();
  const std::uint64_t max_total =
      direct ? file
             : (file > std::numeric_limits<std::uint64_t>::max() / kDeflateMaxRatio
                    ? std::numeric_limits<std::uint64_t>::max()
                    : file * kDeflateMaxRatio);
  const std::uint64_t max_payload = max_total - std::min(max_total, header);
  if (payload > max_payload)
    in.fail("payload size",
            "at most " + std::to_string(max_payload) + " bytes (what a " + std::to_string(file) +
                "-byte " + (direct ? "file" : "gzip file") + " can hold after its " +
                std::to_string(header) + "-byte header" +
                (direct ? "" : ", deflate expanding at most 1032:1") + ")",
            std::to_string(payload) + " bytes claimed by the dimensions (a truncated file or a " +
                "corrupt header)");
  // Read in pieces when compressed: the buffer grows only as far as the data goes.
  std::uint64_t have = 0;
  std::uint64_t chunk = direct ? payload : std::min(payload, kFirstChunk);
  while (have < payload) {
    const std::uint64_t next = std::min(payload, have + chunk);
    out.values.resize(static_cast<std::size_t>(next));
    in.read_exact(out.values.data() + have, static_cast<std::size_t>(next - have), "payload",
                  payload - have);
    have = next;
    chunk = have;  // doubling the buffer
  }
  if (!in.at_end())
    in.fail("file length", std::to_string(in.offset()) + " bytes (header + payload)",
            "trailing data after byte " + std::to_string(in.offset()));
  return out;
}

}  // namespace cohort::data
