// Checkpoint encoding (little-endian): "COHORTCK" u32 version u32 section-count, then sections
// {u32 tag, u64 length, payload, u32 crc32(payload)}: META (text fields), PARM (weights), then
// the optimizer's state arrays ST00, ST01, ... in order, then (version 3 only) BNST, the bn layers'
// running statistics (version 1: META, PARM, MOMN). A file without running statistics is written
// as version 2, so builds before version 3 still read it. Every length is checked against the
// bytes left before it is used.
#include "cohort/checkpoint/checkpoint.hpp"

#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cstring>
#include <deque>
#include <fstream>
#include <functional>
#include <map>
#include <sstream>

#include "cohort/core/atomic_file.hpp"
#include "cohort/core/error.hpp"

namespace cohort::checkpoint {

namespace {

constexpr char kMagic[8] = {'C', 'O', 'H', 'O', 'R', 'T', 'C', 'K'};
constexpr std::uint32_t tag(const char (&t)[5]) {
  return std::uint32_t(std::uint8_t(t[0])) | std::uint32_t(std::uint8_t(t[1])) << 8 |
         std::uint32_t(std::uint8_t(t[2])) << 16 | std::uint32_t(std::uint8_t(t[3])) << 24;
}
constexpr std::uint32_t kMeta = tag("META"), kParams = tag("PARM"), kMomentumV1 = tag("MOMN");
constexpr std::uint32_t kRunningStats = tag("BNST");
constexpr std::uint32_t state_tag(std::size_t i) {
  return tag("ST00") + ((std::uint32_t(i / 10) << 16) | (std::uint32_t(i % 10) << 24));
}
std::string tag_text(std::uint32_t t) {
  std::string s(4, ' ');
  for (int i = 0; i < 4; ++i) {
    const char c = static_cast<char>((t >> (8 * i)) & 0xff);
    s[i] = (c >= 0x20 && c < 0x7f) ? c : '?';
  }
  return s;
}
constexpr std::uint64_t kMaxFloats = std::uint64_t{1} << 32;  // 16 GiB of parameters

// The file as pieces: the small headers and checksums it owns, and the arrays' bytes where
// they are (a checkpoint is written without a second copy of its arrays in memory).
class Pieces {
 public:
  void bytes(const void* p, std::size_t n) {
    if (n != 0) pieces_.emplace_back(static_cast<const char*>(p), n);
  }
  // A string that lives as long as the pieces (not itself one of them).
  std::string_view keep(std::string s) { return owned_.emplace_back(std::move(s)); }
  template <typename T>
  void put(T v) {
    std::string b(sizeof(T), '\0');
    for (std::size_t i = 0; i < sizeof(T); ++i)
      b[i] = static_cast<char>(std::uint8_t(std::uint64_t(v) >> (8 * i)));
    const std::string_view kept = keep(std::move(b));
    bytes(kept.data(), kept.size());
  }
  std::span<const std::string_view> all() const { return pieces_; }

 private:
  std::deque<std::string> owned_;  // stable addresses
  std::vector<std::string_view> pieces_;
};
std::uint32_t crc(const std::uint8_t* p, std::uint64_t n) {
  uLong c = crc32(0L, Z_NULL, 0);
  while (n > 0) {
    const uInt chunk = static_cast<uInt>(std::min<std::uint64_t>(n, 1u << 30));
    c = crc32(c, p, chunk);
    p += chunk;
    n -= chunk;
  }
  return static_cast<std::uint32_t>(c);
}

void add_section(Pieces& out, std::uint32_t t, const void* p, std::size_t n) {
  out.put<std::uint32_t>(t);
  out.put<std::uint64_t>(n);
  out.bytes(p, n);
  out.put<std::uint32_t>(crc(static_cast<const std::uint8_t*>(p), n));
}

std::string meta_text(const Checkpoint& c) {
  std::ostringstream s;
  s << "model=" << c.model << "\nstep=" << c.step << "\nupdates=" << c.updates
    << "\nskipped=" << c.skipped << "\nseed=" << c.seed << "\nbatch=" << c.batch
    << "\nmicro_batch=" << c.micro_batch << "\ntrain_count=" << c.train_count
    << "\ndrop_last=" << (c.drop_last ? 1 : 0) << "\noptimizer=" << c.optimizer
    << "\ninput=" << c.input[0] << "," << c.input[1] << "," << c.input[2];
  if (c.vocab != 0) {
    s << "\nvocab=" << c.vocab;
    if (!c.characters.empty()) {
      s << "\ncharacters=";
      for (std::size_t i = 0; i < c.characters.size(); ++i) s << (i ? "," : "") << c.characters[i];
    }
  }
  s << "\nconfig=" << c.config_json << "\n";
  return s.str();
}

class Reader {
 public:
  Reader(const std::vector<std::uint8_t>& b, const std::string& name) : b_(b), name_(name) {}
  template <typename T>
  T get(const std::string& field) {
    need(sizeof(T), field);
    std::uint64_t v = 0;
    for (std::size_t i = 0; i < sizeof(T); ++i) v |= std::uint64_t(b_[at_ + i]) << (8 * i);
    at_ += sizeof(T);
    return static_cast<T>(v);
  }
  const std::uint8_t* take(std::uint64_t n, const std::string& field) {
    need(n, field);
    const std::uint8_t* p = b_.data() + at_;
    at_ += n;
    return p;
  }
  std::uint64_t offset() const { return at_; }
  bool done() const { return at_ == b_.size(); }
  [[noreturn]] void fail(const std::string& field, const std::string& expected,
                         const std::string& found) const {
    throw InputError(name_ + ": " + field + ": expected " + expected + ", found " + found +
                     " (at byte " + std::to_string(at_) + ")");
  }

 private:
  void need(std::uint64_t n, const std::string& field) {
    if (n > b_.size() - at_)  // no overflow: at_ <= size
      fail(field, std::to_string(n) + " more bytes",
           std::to_string(b_.size() - at_) + " (file truncated or length corrupt)");
  }
  const std::vector<std::uint8_t>& b_;
  const std::string& name_;
  std::uint64_t at_ = 0;
};

std::uint64_t parse_u64(const std::string& name, const std::string& key, const std::string& v) {
  std::uint64_t out = 0;
  std::size_t used = 0;
  try {
    out = std::stoull(v, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used == 0 || used != v.size())
    throw InputError(name + ": section META, field " + key + ": expected an integer, found '" + v +
                     "'");
  return out;
}

// "C,H,W": three integers in [1, 2^20].
std::array<std::uint64_t, 3> parse_shape(const std::string& name, const std::string& v) {
  std::array<std::uint64_t, 3> shape{};
  std::size_t at = 0;
  for (std::size_t i = 0; i < 3; ++i) {
    const std::size_t end = i < 2 ? v.find(',', at) : v.size();
    const std::string part = end == std::string::npos ? "" : v.substr(at, end - at);
    const bool digits = !part.empty() && part.size() <= 7 &&
                        part.find_first_not_of("0123456789") == std::string::npos;
    shape[i] = digits ? std::stoull(part) : 0;
    if (shape[i] == 0 || shape[i] > (std::uint64_t{1} << 20))
      throw InputError(name +
                       ": section META, field input: expected C,H,W (three integers in 1 .. " +
                       std::to_string(std::uint64_t{1} << 20) + "), found '" + v + "'");
    at = end == std::string::npos ? v.size() : end + 1;
  }
  return shape;
}

}  // namespace

namespace {
Pieces encode_pieces(const Checkpoint& c) {
  Pieces out;
  out.bytes(kMagic, sizeof kMagic);
  const bool stats = !c.running_stats.empty();
  out.put<std::uint32_t>(stats ? kCheckpointVersion : 2);
  out.put<std::uint32_t>(static_cast<std::uint32_t>(2 + c.state.size() + (stats ? 1 : 0)));
  const std::string_view meta = out.keep(meta_text(c));
  add_section(out, kMeta, meta.data(), meta.size());
  add_section(out, kParams, c.weights.data(), c.weights.size() * sizeof(float));
  for (std::size_t i = 0; i < c.state.size(); ++i)
    add_section(out, state_tag(i), c.state[i].data(), c.state[i].size() * sizeof(float));
  if (stats)
    add_section(out, kRunningStats, c.running_stats.data(), c.running_stats.size() * sizeof(float));
  return out;
}
}  // namespace

std::vector<std::uint8_t> encode_checkpoint(const Checkpoint& c) {
  const Pieces pieces = encode_pieces(c);
  std::size_t size = 0;
  for (const std::string_view p : pieces.all()) size += p.size();
  std::vector<std::uint8_t> out;
  out.reserve(size);
  for (const std::string_view p : pieces.all()) out.insert(out.end(), p.begin(), p.end());
  return out;
}

Checkpoint decode_checkpoint(const std::vector<std::uint8_t>& bytes, const std::string& name) {
  Reader r(bytes, name);
  const std::uint8_t* magic = r.take(sizeof kMagic, "magic");
  if (std::memcmp(magic, kMagic, sizeof kMagic) != 0)
    r.fail("magic", "'COHORTCK' (a cohort checkpoint)", "other bytes");
  const auto version = r.get<std::uint32_t>("version");
  if (version == 0 || version > kCheckpointVersion)
    r.fail("version",
           "1 .. " + std::to_string(kCheckpointVersion) +
               (version > kCheckpointVersion ? " (the file was written by a newer cohort)" : ""),
           std::to_string(version));
  const auto sections = r.get<std::uint32_t>("section count");
  // Version 1: META, PARM, MOMN. Version 2: META, PARM, then the state arrays in order. Version 3:
  // as 2, then BNST.
  const std::uint32_t fixed = version == 3 ? 3 : 2;  // sections besides the state arrays
  if (version == 1 ? sections != 3 : (sections < fixed || sections > fixed + kMaxStateArrays))
    r.fail("section count",
           version == 1 ? "3"
                        : std::to_string(fixed) + " .. " + std::to_string(fixed + kMaxStateArrays),
           std::to_string(sections));
  std::vector<std::pair<const std::uint8_t*, std::uint64_t>> payload(sections);
  for (std::uint32_t i = 0; i < sections; ++i) {
    const std::uint32_t expected = i == 0                              ? kMeta
                                   : i == 1                            ? kParams
                                   : version == 1                      ? kMomentumV1
                                   : version == 3 && i + 1 == sections ? kRunningStats
                                                                       : state_tag(i - 2);
    const auto t = r.get<std::uint32_t>("section tag");
    if (t != expected)
      r.fail("section " + std::to_string(i) + " tag", tag_text(expected), "'" + tag_text(t) + "'");
    const std::string tag_name = tag_text(t);
    const auto len = r.get<std::uint64_t>("section " + tag_name + " length");
    const std::uint8_t* p = r.take(len, "section " + tag_name + " payload");
    const auto want = r.get<std::uint32_t>("section " + tag_name + " crc32");
    if (crc(p, len) != want)
      r.fail("section " + tag_name + " crc32", "a matching checksum",
             "a mismatch (the file is corrupt)");
    if (i > 0 && (len % sizeof(float) != 0 || len / sizeof(float) > kMaxFloats))
      r.fail("section " + tag_name + " length", "a multiple of 4 up to 2^34", std::to_string(len));
    payload[i] = {p, len};
  }
  if (!r.done()) r.fail("file length", "the end of the last section", "trailing bytes");

  Checkpoint c;
  std::map<std::string, std::string> kv;
  std::istringstream meta(
      std::string(reinterpret_cast<const char*>(payload[0].first), payload[0].second));
  for (std::string line; std::getline(meta, line);) {
    auto eq = line.find('=');
    if (eq == std::string::npos) continue;
    kv[line.substr(0, eq)] = line.substr(eq + 1);
  }
  std::vector<const char*> required = {"model",       "step",        "seed",      "batch",
                                       "micro_batch", "train_count", "drop_last", "config"};
  if (version >= 2) required.insert(required.end(), {"updates", "skipped", "optimizer"});
  for (const char* key : required)
    if (!kv.count(key))
      throw InputError(name + ": section META: expected field " + key + ", found none");
  c.model = kv["model"];
  c.step = parse_u64(name, "step", kv["step"]);
  c.seed = parse_u64(name, "seed", kv["seed"]);
  c.batch = parse_u64(name, "batch", kv["batch"]);
  c.micro_batch = parse_u64(name, "micro_batch", kv["micro_batch"]);
  c.train_count = parse_u64(name, "train_count", kv["train_count"]);
  c.drop_last = parse_u64(name, "drop_last", kv["drop_last"]) != 0;
  c.config_json = kv["config"];
  if (kv.count("input")) c.input = parse_shape(name, kv["input"]);
  if (kv.count("vocab")) {
    c.vocab = parse_u64(name, "vocab", kv["vocab"]);
    if (c.vocab == 0 || c.vocab > (std::uint64_t{1} << 20))
      throw InputError(name + ": section META, field vocab: expected 1 .. 1048576 tokens, found " +
                       kv["vocab"]);
  }
  if (kv.count("characters")) {
    std::istringstream list(kv["characters"]);
    for (std::string cp; std::getline(list, cp, ',');) {
      const std::uint64_t v = parse_u64(name, "characters", cp);
      if (v > 0x10FFFF || (!c.characters.empty() && v <= c.characters.back()))
        throw InputError(name +
                         ": section META, field characters: expected increasing code "
                         "points up to 1114111, found " +
                         cp + " after " +
                         (c.characters.empty() ? "none" : std::to_string(c.characters.back())));
      c.characters.push_back(static_cast<std::uint32_t>(v));
    }
    if (c.characters.size() != c.vocab)
      throw InputError(name + ": section META, field characters: expected " +
                       std::to_string(c.vocab) + " (vocab), found " +
                       std::to_string(c.characters.size()));
  }
  if (version >= 2) {
    c.updates = parse_u64(name, "updates", kv["updates"]);
    c.skipped = parse_u64(name, "skipped", kv["skipped"]);
    c.optimizer = kv["optimizer"];
    if (c.updates > c.step || c.skipped > c.step)
      throw InputError(name + ": section META: expected updates and skipped <= step (" +
                       std::to_string(c.step) + "), found " + std::to_string(c.updates) + " and " +
                       std::to_string(c.skipped));
  } else {
    c.updates = c.step;  // version 1 never skipped a step
  }
  auto floats = [&](std::size_t i) {
    std::vector<float> v(payload[i].second / sizeof(float));
    if (!v.empty()) std::memcpy(v.data(), payload[i].first, payload[i].second);
    return v;
  };
  c.weights = floats(1);
  if (c.weights.empty()) throw InputError(name + ": section PARM: expected parameters, found none");
  const std::size_t state_end = version == 3 ? sections - 1 : sections;
  if (version == 3) {
    c.running_stats = floats(state_end);
    if (c.running_stats.empty())
      throw InputError(name + ": section BNST: expected running statistics, found none");
  }
  for (std::size_t i = 2; i < state_end; ++i) {
    std::vector<float> s = floats(i);
    if (version == 1 && s.empty()) break;  // version 1: an empty MOMN meant no momentum
    if (s.size() != c.weights.size())
      throw InputError(name + ": section " +
                       tag_text(version == 1 ? kMomentumV1 : state_tag(i - 2)) + ": expected " +
                       std::to_string(c.weights.size()) + " floats (as PARM), found " +
                       std::to_string(s.size()));
    c.state.push_back(std::move(s));
  }
  return c;
}

void save_checkpoint(const std::filesystem::path& path, const Checkpoint& c, std::size_t keep) {
  namespace fs = std::filesystem;
  const Pieces pieces = encode_pieces(c);
  // Once the new file is whole and on disk, rotate older checkpoints beside the file written
  // (a link's target): target.(keep-2) -> target.(keep-1), ..., and target -> target.1 as a hard
  // link (a copy where the filesystem has none), then renamed into place, so the target itself
  // never disappears: at every instant it is the previous checkpoint or the new one.
  auto rotate = [keep](const fs::path& target) {
    auto fail = [&target](const std::string& what, const std::error_code& ec) {
      throw OutputError(target.string() + ": cannot keep the previous checkpoints (--keep): " +
                        what + ": " + ec.message() + " (" + target.string() + " is as it was)");
    };
    std::error_code ec;
    for (std::size_t k = keep; k-- > 1;) {
      const fs::path to = target.string() + "." + std::to_string(k);
      if (k > 1) {
        const fs::path from = target.string() + "." + std::to_string(k - 1);
        if (fs::exists(fs::symlink_status(from, ec))) {
          fs::rename(from, to, ec);
          if (ec) fail("rename " + from.string() + " to " + to.string(), ec);
        }
      } else if (fs::exists(target, ec)) {
        const fs::path link = to.string() + ".tmp." + std::to_string(::getpid());
        fs::remove(link, ec);
        fs::create_hard_link(target, link, ec);
        if (ec) {
          ec.clear();
          fs::copy_file(target, link, fs::copy_options::overwrite_existing, ec);
        }
        if (!ec) fs::rename(link, to, ec);
        if (ec) {
          std::error_code ignored;
          fs::remove(link, ignored);
          fail("link " + target.string() + " as " + to.string(), ec);
        }
      }
    }
  };
  write_file_atomically(path, pieces.all(),
                        keep > 1 ? std::function<void(const fs::path&)>(rotate) : nullptr);
}

Checkpoint load_checkpoint(const std::filesystem::path& path) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec))
    throw InputError(path.string() + ": checkpoint: expected a regular file, found " +
                     (std::filesystem::exists(path, ec) ? "something else" : "nothing"));
  std::ifstream f(path, std::ios::binary);
  std::vector<std::uint8_t> bytes((std::istreambuf_iterator<char>(f)), {});
  if (!f.good() && !f.eof()) throw InputError(path.string() + ": checkpoint: read failed");
  return decode_checkpoint(bytes, path.string());
}

Newest newest_checkpoint(const std::filesystem::path& path,
                         const std::function<Checkpoint(const std::filesystem::path&)>& load) {
  namespace fs = std::filesystem;
  const fs::path target = output_target(path);
  std::error_code ec;
  std::vector<fs::path> candidates;
  if (fs::exists(fs::symlink_status(target, ec))) candidates.push_back(target);
  // Rotated copies up to --keep's largest value (1000), each looked for: a gap (a copy the user
  // removed) does not hide the older ones.
  for (std::size_t k = 1; k < 1000; ++k) {
    const fs::path copy = target.string() + "." + std::to_string(k);
    if (fs::exists(fs::symlink_status(copy, ec))) candidates.push_back(copy);
  }
  Newest found;
  // Temporary files of saves that never reached their rename: "<target>[.k].tmp.<pid>".
  const fs::path folder = target.has_parent_path() ? target.parent_path() : fs::path(".");
  const std::string stem = target.filename().string();
  std::vector<std::string> unfinished;
  for (const fs::directory_entry& e : fs::directory_iterator(folder, ec)) {
    const std::string name = e.path().filename().string();
    const std::size_t tmp = name.rfind(".tmp.");
    if (name.rfind(stem, 0) != 0 || tmp == std::string::npos) continue;
    const std::string rest = name.substr(stem.size(), tmp - stem.size());  // "" or ".k"
    const std::string pid = name.substr(tmp + 5);
    const bool digits = !pid.empty() && pid.find_first_not_of("0123456789") == std::string::npos;
    const bool rotated = rest.size() > 1 && rest[0] == '.' &&
                         rest.find_first_not_of("0123456789", 1) == std::string::npos;
    if (digits && (rest.empty() || rotated))
      unfinished.push_back(target.has_parent_path() ? (folder / name).string() : name);
  }
  std::sort(unfinished.begin(), unfinished.end());
  for (const std::string& f : unfinished)
    found.skipped.push_back(f +
                            ": a save that did not finish (its process ended before the "
                            "rename; left in place)");
  for (const fs::path& file : candidates) {
    try {
      found.checkpoint = load(file);
      found.file = file;
      return found;
    } catch (const InputError& e) {
      found.skipped.push_back(e.what());
    }
  }
  return found;
}

}  // namespace cohort::checkpoint
