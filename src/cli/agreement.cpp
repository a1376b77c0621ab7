// The ranks' agreement before work; see agreement.hpp.
#include "agreement.hpp"

#include <xxhash.h>

#include <cstdio>
#include <cstring>
#include <map>
#include <nlohmann/json.hpp>

namespace cohort::cli {

namespace {

// One rank's statement in the first collective: fixed size, so every rank knows every other's
// size before it is sent.
struct Record {
  std::uint64_t failed = 0;
  std::uint64_t text_bytes = 0;  // the problem and the facts' texts, sent only if needed
  std::uint64_t facts = 0;
  std::uint64_t known = 0;  // bit i: fact i is known
  std::uint64_t digests[kMaxFacts] = {};
};

// The problem, then each fact's text, each ended by '\0' (a '\0' within becomes a space).
std::string texts_of(const Stand& s) {
  std::string all;
  auto add = [&all](const std::string& text) {
    for (char ch : text) all += ch == '\0' ? ' ' : ch;
    all += '\0';
  };
  add(s.problem.value_or(""));
  for (const Fact& f : s.facts) add(f.known ? f.shown : "");
  return all;
}

std::vector<std::string> split_texts(const char* data, std::size_t bytes) {
  std::vector<std::string> texts;
  for (std::size_t at = 0; at < bytes;) {
    const std::size_t n = ::strnlen(data + at, bytes - at);
    texts.emplace_back(data + at, n);
    at += n + 1;
  }
  return texts;
}

// "rank 1", "ranks 0, 2".
std::string ranks_text(const std::vector<int>& ranks) {
  std::string s = ranks.size() == 1 ? "rank " : "ranks ";
  for (std::size_t i = 0; i < ranks.size(); ++i) s += (i ? ", " : "") + std::to_string(ranks[i]);
  return s;
}

// Ranks grouped by a key, groups in the order of their first rank.
template <class Key>
std::vector<std::pair<Key, std::vector<int>>> group(const std::vector<std::pair<int, Key>>& by) {
  std::vector<std::pair<Key, std::vector<int>>> groups;
  for (const auto& [rank, key] : by) {
    auto it = groups.begin();
    while (it != groups.end() && !(it->first == key)) ++it;
    if (it == groups.end())
      groups.push_back({key, {rank}});
    else
      it->second.push_back(rank);
  }
  return groups;
}

// "rank 0: a; ranks 1, 2: b", or nothing if every rank shows the same.
std::optional<std::string> who_has(const std::vector<std::pair<int, std::string>>& shown) {
  const auto groups = group(shown);
  if (groups.size() < 2) return std::nullopt;
  std::string s;
  for (std::size_t g = 0; g < groups.size(); ++g)
    s += (g ? "; " : "") + ranks_text(groups[g].second) + ": " + groups[g].first;
  return s;
}

// A JSON object's values by dotted path ("optimizer.kind"), inner objects flattened.
void flatten(const nlohmann::json& doc, const std::string& prefix,
             std::map<std::string, std::string>& out) {
  for (const auto& [key, value] : doc.items()) {
    const std::string path = prefix.empty() ? key : prefix + "." + key;
    if (value.is_object())
      flatten(value, path, out);
    else
      out[path] = value.dump();
  }
}

// "ranks differ in <what>: ..." if fact `i`'s digest differs between the ranks that know it: a
// JSON object by the paths whose values differ (the first few), other facts as a whole.
std::optional<std::string> fact_line(const Fact& fact, std::size_t i,
                                     const std::vector<Record>& records,
                                     const std::vector<std::vector<std::string>>& texts) {
  std::vector<std::pair<int, std::uint64_t>> digests;
  for (std::size_t r = 0; r < records.size(); ++r)
    if (i < records[r].facts && (records[r].known >> i & 1))
      digests.push_back({static_cast<int>(r), records[r].digests[i]});
  const auto groups = group(digests);
  if (groups.size() < 2) return std::nullopt;
  auto text = [&](int rank) {
    const auto& t = texts[static_cast<std::size_t>(rank)];
    return i + 1 < t.size() ? t[i + 1] : std::string();
  };
  const std::string head = "ranks differ in " + fact.what + ": ";
  if (fact.json_object) {
    std::vector<std::map<std::string, std::string>> values(groups.size());
    std::map<std::string, int> paths;
    bool objects = true;
    for (std::size_t g = 0; g < groups.size(); ++g) {
      const auto doc = nlohmann::json::parse(text(groups[g].second[0]), nullptr, false);
      objects = objects && doc.is_object();
      if (doc.is_object()) flatten(doc, "", values[g]);
      for (const auto& [path, value] : values[g]) paths[path];
    }
    constexpr int kShown = 4;
    std::string differ;
    int n = 0;
    for (const auto& [path, unused] : paths) {
      std::vector<std::pair<int, std::string>> shown;
      for (std::size_t g = 0; g < groups.size(); ++g) {
        const auto it = values[g].find(path);
        for (int r : groups[g].second)
          shown.push_back({r, it != values[g].end() ? it->second : std::string("absent")});
      }
      if (const auto who = who_has(shown); who && n++ < kShown)
        differ += (differ.empty() ? "" : ", ") + path + " (" + *who + ")";
    }
    if (n > kShown) differ += " and " + std::to_string(n - kShown) + " more";
    if (objects && n > 0) return head + differ;
  }
  // As a whole; where two groups show the same text, their digests tell them apart.
  std::vector<std::pair<int, std::string>> shown;
  std::map<std::string, int> seen;
  for (const auto& [digest, ranks] : groups) ++seen[text(ranks[0])];
  for (const auto& [digest, ranks] : groups) {
    std::string s = text(ranks[0]);
    if (seen[s] > 1) {
      char hex[32];
      std::snprintf(hex, sizeof hex, "digest %016llx", static_cast<unsigned long long>(digest));
      s += s.empty() ? hex : " (" + std::string(hex) + ")";
    }
    for (int r : ranks) shown.push_back({r, s});
  }
  return head + who_has(shown).value_or("");
}

}  // namespace

JobInputError::JobInputError(std::vector<std::string> lines)
    : InputError(lines.empty() ? std::string("the ranks refused the job") : lines.front()),
      lines_(std::move(lines)) {}

void agree(dist::Comm& comm, const Stand& mine) {
  COHORT_CHECK(mine.facts.size() <= kMaxFacts, "agree: at most kMaxFacts facts");
  const auto ranks = static_cast<std::size_t>(comm.size());
  const auto me = static_cast<std::size_t>(comm.rank());
  const std::string my_texts = texts_of(mine);
  std::vector<Record> records(ranks);
  Record& own = records[me];
  own.failed = mine.problem ? 1 : 0;
  own.text_bytes = my_texts.size();
  own.facts = mine.facts.size();
  for (std::size_t i = 0; i < mine.facts.size(); ++i) {
    own.known |= std::uint64_t{mine.facts[i].known} << i;
    own.digests[i] = mine.facts[i].digest;
  }
  comm.allgatherv(records.data(), std::vector<std::size_t>(ranks, sizeof(Record)));

  // Decided from the records alone, which every rank has alike: every rank takes the same branch.
  bool off = false;
  for (const Record& r : records) off = off || r.failed != 0 || r.facts != records[0].facts;
  for (std::size_t i = 0; i < kMaxFacts && !off; ++i) {
    std::optional<std::uint64_t> first;  // the digest of the first rank that knows fact i
    for (const Record& r : records)
      if (i < r.facts && (r.known >> i & 1)) {
        off = off || (first && *first != r.digests[i]);
        first = first.value_or(r.digests[i]);
      }
  }
  if (!off) return;

  // Something is wrong somewhere: every rank's texts, for the message.
  std::vector<std::size_t> bytes(ranks);
  std::size_t total = 0, at = 0;
  for (std::size_t r = 0; r < ranks; ++r) {
    bytes[r] = static_cast<std::size_t>(records[r].text_bytes);
    if (r < me) at += bytes[r];
    total += bytes[r];
  }
  std::string all(total, '\0');
  std::memcpy(all.data() + at, my_texts.data(), my_texts.size());
  comm.allgatherv(all.data(), bytes);
  std::vector<std::vector<std::string>> texts(ranks);
  at = 0;
  for (std::size_t r = 0; r < ranks; at += bytes[r++])
    texts[r] = split_texts(all.data() + at, bytes[r]);

  std::vector<std::string> lines;
  for (std::size_t i = 0; i < mine.facts.size(); ++i)
    if (auto line = fact_line(mine.facts[i], i, records, texts)) lines.push_back(std::move(*line));
  std::vector<std::pair<int, std::string>> problems;
  for (std::size_t r = 0; r < ranks; ++r)
    if (records[r].failed != 0)
      problems.push_back({static_cast<int>(r), texts[r].empty() ? std::string() : texts[r][0]});
  for (const auto& [problem, who] : group(problems))
    lines.push_back((who.size() == ranks ? std::string() : ranks_text(who) + ": ") + problem);
  if (lines.empty())  // records of another layout (another build of cohort)
    lines.push_back("ranks differ in what they check (is every rank the same build of cohort?)");
  throw JobInputError(std::move(lines));
}

std::string current_problem() {
  try {
    throw;
  } catch (const InputError& e) {
    return e.what();
  } catch (const std::exception& e) {
    return std::string("internal error: ") + e.what();
  } catch (...) {
    return "internal error: an exception that is not a std::exception";
  }
}

std::uint64_t digest_of(std::string_view bytes) { return XXH3_64bits(bytes.data(), bytes.size()); }

namespace {
class Digest {
 public:
  Digest() : state_(XXH3_createState()) {
    COHORT_CHECK(state_ != nullptr, "XXH3 state");
    XXH3_64bits_reset(state_);
  }
  ~Digest() { XXH3_freeState(state_); }
  Digest(const Digest&) = delete;
  Digest& operator=(const Digest&) = delete;
  void add(const void* data, std::size_t bytes) { XXH3_64bits_update(state_, data, bytes); }
  void add(std::uint64_t n) { add(&n, sizeof n); }
  template <class T>
  void add(const std::vector<T>& v) {  // its size, then its bytes
    add(v.size());
    add(v.data(), v.size() * sizeof(T));
  }
  void add(const std::string& s) {
    add(s.size());
    add(s.data(), s.size());
  }
  std::uint64_t value() const { return XXH3_64bits_digest(state_); }

 private:
  XXH3_state_t* state_;
};
}  // namespace

std::uint64_t digest_of(const data::Dataset& set) {
  Digest d;
  for (std::uint64_t n :
       {std::uint64_t{set.count}, std::uint64_t{set.channels}, std::uint64_t{set.rows},
        std::uint64_t{set.cols}, std::uint64_t{set.tabular}, std::uint64_t{set.num_classes}})
    d.add(n);
  d.add(set.images);
  d.add(set.float_features);
  d.add(set.labels);
  d.add(std::uint64_t{set.tokens.size()});  // text: its windows' tokens and stride
  set.tokens.for_each_chunk(
      [&d](std::span<const std::uint32_t> chunk) {
        d.add(chunk.data(), chunk.size() * sizeof(std::uint32_t));
      },
      /*release=*/true);
  d.add(std::uint64_t{set.window_stride});
  return d.value();
}

std::uint64_t digest_of(const checkpoint::Checkpoint& c) {
  Digest d;
  for (std::uint64_t n :
       {c.step, c.updates, c.skipped, c.seed, c.batch, c.micro_batch, c.train_count,
        std::uint64_t{c.drop_last}, c.input[0], c.input[1], c.input[2]})
    d.add(n);
  d.add(c.model);
  d.add(c.optimizer);
  d.add(c.config_json);
  d.add(c.weights);
  d.add(c.state.size());
  for (const auto& s : c.state) d.add(s);
  d.add(c.running_stats);
  d.add(c.vocab);
  d.add(c.characters);
  return d.value();
}

}  // namespace cohort::cli
