// Checkpoint files: exact round trips, every truncation and 1,000 bit flips refused whole,
// foreign and future files refused with reasons, rotation of kept copies, a link written through,
// and a failed save leaving the previous file.
#include "cohort/checkpoint/checkpoint.hpp"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>
#include <zlib.h>

#include <array>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <random>

#include "cohort/core/atomic_file.hpp"
#include "cohort/core/error.hpp"

#include "../common/scratch_dir.hpp"

namespace cohort::checkpoint {
namespace checkpoint_test {

namespace fs = std::filesystem;

Checkpoint small_checkpoint() {
  Checkpoint c;
  c.model = "mlp:4-3";
  c.step = 17;
  c.updates = 15;
  c.skipped = 2;
  c.optimizer = "adam";
  c.seed = 5;
  c.batch = 8;
  c.micro_batch = 4;
  c.train_count = 512;
  c.drop_last = false;  // not the default, so a field the encoding lost would show
  c.config_json = R"({"lr":0.05})";
  for (int i = 0; i < 16; ++i) c.weights.push_back(0.25f * float(i) - 1.0f);
  c.state.resize(2);
  for (int i = 0; i < 16; ++i) c.state[0].push_back(0.01f * float(i));
  for (int i = 0; i < 16; ++i) c.state[1].push_back(0.5f + 0.01f * float(i));
  return c;
}

class Checkpoints : public ::testing::Test {
 protected:
  void SetUp() override {
    scratch_.emplace("cohort_ckpt");
    dir_ = scratch_->path();
  }
  void TearDown() override {
    set_file_calls(system_file_calls());
    scratch_.reset();
  }
  static std::vector<std::uint8_t> read(const fs::path& p) {
    std::ifstream f(p, std::ios::binary);
    return {std::istreambuf_iterator<char>(f), {}};
  }
  std::optional<testing::ScratchDir> scratch_;
  fs::path dir_;
};

TEST_F(Checkpoints, RoundTripIsExact) {
  const Checkpoint c = small_checkpoint();
  const auto bytes = encode_checkpoint(c);
  const Checkpoint d = decode_checkpoint(bytes, "mem");
  EXPECT_EQ(d.model, c.model);
  EXPECT_EQ(d.step, 17u);
  EXPECT_EQ(d.weights, c.weights);
  EXPECT_EQ(d.updates, 15u);
  EXPECT_EQ(d.skipped, 2u);
  EXPECT_EQ(d.optimizer, "adam");
  // Fields a re-encoding alone cannot vouch for (a field lost both ways round-trips its loss).
  EXPECT_EQ(d.seed, 5u);
  EXPECT_EQ(d.batch, 8u);
  EXPECT_EQ(d.micro_batch, 4u);
  EXPECT_EQ(d.train_count, 512u);
  EXPECT_FALSE(d.drop_last);
  EXPECT_EQ(d.state, c.state);
  EXPECT_EQ(d.config_json, c.config_json);
  EXPECT_EQ(encode_checkpoint(d), bytes);
  // save, load, save: identical files
  save_checkpoint(dir_ / "a.ckpt", c);
  save_checkpoint(dir_ / "b.ckpt", load_checkpoint(dir_ / "a.ckpt"));
  EXPECT_EQ(read(dir_ / "a.ckpt"), read(dir_ / "b.ckpt"));
}

// bn running statistics: their own section, last, and only then version 3; without them the file
// stays version 2 (older builds read it), with every state-array count.
TEST_F(Checkpoints, RunningStatisticsRoundTripAndSetTheVersion) {
  Checkpoint c = small_checkpoint();
  auto version = [](const std::vector<std::uint8_t>& b) { return b[8]; };
  EXPECT_EQ(version(encode_checkpoint(c)), 2u);
  for (int i = 0; i < 6; ++i) c.running_stats.push_back(0.125f * float(i) + 1.0f);
  for (std::size_t states : {0u, 1u, 2u}) {
    c.state.resize(states, std::vector<float>(c.weights.size(), 0.5f));
    const auto bytes = encode_checkpoint(c);
    EXPECT_EQ(version(bytes), 3u);
    const Checkpoint d = decode_checkpoint(bytes, "mem");
    EXPECT_EQ(d.running_stats, c.running_stats) << states << " state arrays";
    EXPECT_EQ(d.state, c.state) << states << " state arrays";
    EXPECT_EQ(d.weights, c.weights);
    EXPECT_EQ(encode_checkpoint(d), bytes);
  }
  // A version-3 file whose last section is not BNST (a version-2 body relabelled) is refused,
  // naming the section it expected.
  auto relabelled = encode_checkpoint(small_checkpoint());
  relabelled[8] = 3;
  try {
    decode_checkpoint(relabelled, "f.ckpt");
    ADD_FAILURE() << "accepted";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("BNST"), std::string::npos) << e.what();
  }
}

TEST_F(Checkpoints, EveryTruncationIsRefused) {
  const auto bytes = encode_checkpoint(small_checkpoint());
  for (std::size_t n = 0; n < bytes.size(); ++n) {
    std::vector<std::uint8_t> cut(bytes.begin(), bytes.begin() + std::ptrdiff_t(n));
    EXPECT_THROW(decode_checkpoint(cut, "cut"), InputError) << "truncated to " << n << " bytes";
  }
  auto longer = bytes;
  longer.push_back(0);
  EXPECT_THROW(decode_checkpoint(longer, "long"), InputError);
}

TEST_F(Checkpoints, ThousandSingleBitFlipsAreRefused) {
  const auto bytes = encode_checkpoint(small_checkpoint());
  std::mt19937_64 rng(20261130);
  std::printf("seed 20261130, %zu bytes\n", bytes.size());
  for (int trial = 0; trial < 1000; ++trial) {
    auto bad = bytes;
    const std::size_t bit = rng() % (bad.size() * 8);
    bad[bit / 8] ^= std::uint8_t(1u << (bit % 8));
    EXPECT_THROW(decode_checkpoint(bad, "flip"), InputError) << "bit " << bit;
  }
}

TEST_F(Checkpoints, ForeignAndFutureFilesAreRefusedWithReasons) {
  auto bytes = encode_checkpoint(small_checkpoint());
  auto message = [](const std::vector<std::uint8_t>& b) {
    try {
      decode_checkpoint(b, "f.ckpt");
    } catch (const InputError& e) {
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  auto future = bytes;
  future[8] = kCheckpointVersion + 1;
  EXPECT_NE(message(future).find("newer cohort"), std::string::npos);
  auto foreign = bytes;
  foreign[0] = 'X';
  EXPECT_NE(message(foreign).find("magic"), std::string::npos);
  EXPECT_NE(message({}).find("magic"), std::string::npos);
  // A length that would overflow an offset: the last section's length set to 2^63.
  auto huge = bytes;
  const std::size_t last_len = bytes.size() - 4 - 16 * 4 - 8;
  huge[last_len + 7] = 0x80;
  EXPECT_NE(message(huge).find("ST01"), std::string::npos) << message(huge);
  // A state array of another size than the weights.
  Checkpoint odd = small_checkpoint();
  odd.state[1].pop_back();
  EXPECT_NE(message(encode_checkpoint(odd)).find("ST01: expected 16 floats"), std::string::npos)
      << message(encode_checkpoint(odd));
  // More updates than steps cannot come from a run.
  Checkpoint ahead = small_checkpoint();
  ahead.updates = 18;
  EXPECT_NE(message(encode_checkpoint(ahead)).find("updates and skipped <= step"),
            std::string::npos);
  EXPECT_THROW(load_checkpoint(dir_ / "absent.ckpt"), InputError);
  EXPECT_THROW(load_checkpoint(dir_), InputError);
}

// A checkpoint file built byte by byte: magic, version, section count, then each section as
// {tag, u64 length, payload, crc32}, as cohort writes them.
std::vector<std::uint8_t> file_of(
    std::uint32_t version, const std::string& meta,
    const std::vector<std::pair<const char*, std::vector<float>>>& arrays) {
  std::vector<std::uint8_t> out{'C', 'O', 'H', 'O', 'R', 'T', 'C', 'K'};
  auto put = [&](std::uint64_t v, int bytes) {
    for (int i = 0; i < bytes; ++i) out.push_back(std::uint8_t(v >> (8 * i)));
  };
  auto section = [&](const char* tag, const void* p, std::size_t n) {
    out.insert(out.end(), tag, tag + 4);
    put(n, 8);
    const auto* b = static_cast<const std::uint8_t*>(p);
    out.insert(out.end(), b, b + n);
    put(crc32(crc32(0L, Z_NULL, 0), b, static_cast<uInt>(n)), 4);
  };
  put(version, 4);
  put(1 + arrays.size(), 4);
  section("META", meta.data(), meta.size());
  for (const auto& [tag, v] : arrays) section(tag, v.data(), v.size() * 4);
  return out;
}

// Version 1 (before Adam): META without updates/skipped/optimizer, then PARM and MOMN, as
// cohort 0.1 wrote it; it loads as SGD with every step an update.
std::vector<std::uint8_t> version1_file(const std::vector<float>& weights,
                                        const std::vector<float>& momentum) {
  return file_of(1,
                 "model=mlp:2-2\nstep=3\nseed=1\nbatch=4\nmicro_batch=2\ntrain_count=8\n"
                 "drop_last=1\nconfig={}\n",
                 {{"PARM", weights}, {"MOMN", momentum}});
}

// The input shape (C, H, W) round-trips; a version-2 file written before the field loads as
// (1, 28, 28); a malformed one is refused naming the field.
TEST_F(Checkpoints, InputShapeRoundTripsDefaultsAndIsChecked) {
  Checkpoint c = small_checkpoint();
  c.input = {3, 32, 30};
  EXPECT_EQ(decode_checkpoint(encode_checkpoint(c), "mem").input, c.input);
  const std::string meta =
      "model=mlp:2-2\nstep=3\nupdates=3\nskipped=0\nseed=1\nbatch=4\nmicro_batch=2\n"
      "train_count=8\ndrop_last=1\noptimizer=sgd\nconfig={}\n";
  const std::vector<float> w{1, 2, 3, 4, 5, 6, 7, 8};
  const std::array<std::uint64_t, 3> fashion{1, 28, 28};
  EXPECT_EQ(decode_checkpoint(file_of(2, meta, {{"PARM", w}}), "old.ckpt").input, fashion);
  EXPECT_EQ(decode_checkpoint(file_of(2, meta + "input=1,1,784\n", {{"PARM", w}}), "t.ckpt").input,
            (std::array<std::uint64_t, 3>{1, 1, 784}));
  for (const char* bad :
       {"0,28,28", "1,28", "1,28,28,1", "a,b,c", "1,-2,3", "1,,3", "9999999,1,1"}) {
    SCOPED_TRACE(bad);
    try {
      decode_checkpoint(file_of(2, meta + "input=" + bad + "\n", {{"PARM", w}}), "bad.ckpt");
      ADD_FAILURE() << "accepted";
    } catch (const InputError& e) {
      EXPECT_NE(std::string(e.what()).find("bad.ckpt: section META, field input"),
                std::string::npos)
          << e.what();
    }
  }
}

TEST_F(Checkpoints, Version1FilesStillLoad) {
  const std::vector<float> w{1, 2, 3, 4, 5, 6, 7, 8}, v{8, 7, 6, 5, 4, 3, 2, 1};
  const Checkpoint c = decode_checkpoint(version1_file(w, v), "v1.ckpt");
  EXPECT_EQ(c.model, "mlp:2-2");
  EXPECT_EQ(c.step, 3u);
  EXPECT_EQ(c.updates, 3u);
  EXPECT_EQ(c.skipped, 0u);
  EXPECT_EQ(c.optimizer, "sgd");
  EXPECT_EQ(c.weights, w);
  ASSERT_EQ(c.state.size(), 1u);
  EXPECT_EQ(c.state[0], v);
  EXPECT_TRUE(decode_checkpoint(version1_file(w, {}), "v1.ckpt").state.empty());
  // Re-encoding writes the current version, which decodes to the same checkpoint.
  const Checkpoint again = decode_checkpoint(encode_checkpoint(c), "v2.ckpt");
  EXPECT_EQ(again.state, c.state);
  EXPECT_EQ(again.updates, 3u);
}

TEST_F(Checkpoints, KeepRotatesNewestFirst) {
  Checkpoint c = small_checkpoint();
  c.skipped = 0;
  for (std::uint64_t step = 1; step <= 4; ++step) {
    c.step = c.updates = step;
    save_checkpoint(dir_ / "run.ckpt", c, 3);
  }
  EXPECT_EQ(load_checkpoint(dir_ / "run.ckpt").step, 4u);
  EXPECT_EQ(load_checkpoint(dir_ / "run.ckpt.1").step, 3u);
  EXPECT_EQ(load_checkpoint(dir_ / "run.ckpt.2").step, 2u);
  EXPECT_FALSE(fs::exists(dir_ / "run.ckpt.3"));
  for (const auto& e : fs::directory_iterator(dir_))
    EXPECT_EQ(e.path().string().find(".tmp"), std::string::npos) << e.path();
}

// A link named as the checkpoint is written through: the link stays, its target is replaced and
// the kept copies go beside the target.
TEST_F(Checkpoints, ALinkIsWrittenThroughAndRotatedBesideItsTarget) {
  fs::create_directories(dir_ / "scratch");
  fs::create_symlink("scratch/run.ckpt", dir_ / "run.ckpt");
  Checkpoint c = small_checkpoint();
  c.skipped = 0;
  for (std::uint64_t step = 1; step <= 3; ++step) {
    c.step = c.updates = step;
    save_checkpoint(dir_ / "run.ckpt", c, 3);
  }
  EXPECT_TRUE(fs::is_symlink(dir_ / "run.ckpt"));
  EXPECT_EQ(load_checkpoint(dir_ / "run.ckpt").step, 3u);
  EXPECT_EQ(load_checkpoint(dir_ / "scratch" / "run.ckpt").step, 3u);
  EXPECT_EQ(load_checkpoint(dir_ / "scratch" / "run.ckpt.1").step, 2u);
  EXPECT_EQ(load_checkpoint(dir_ / "scratch" / "run.ckpt.2").step, 1u);
  EXPECT_FALSE(fs::exists(dir_ / "run.ckpt.1"));
}

// --resume auto's search: through a link to its target's rotation, newest first, past a damaged
// file and a gap in the rotation, naming what it passes over; nothing at all is a fresh start.
TEST_F(Checkpoints, NewestCheckpointFollowsTheRotationPastDamageAndGaps) {
  EXPECT_FALSE(newest_checkpoint(dir_ / "run.ckpt").checkpoint);
  EXPECT_TRUE(newest_checkpoint(dir_ / "run.ckpt").skipped.empty());
  fs::create_directories(dir_ / "scratch");
  fs::create_symlink("scratch/run.ckpt", dir_ / "run.ckpt");
  Checkpoint c = small_checkpoint();
  c.skipped = 0;
  for (std::uint64_t step = 1; step <= 4; ++step) {
    c.step = c.updates = step;
    save_checkpoint(dir_ / "run.ckpt", c, 4);
  }
  Newest n = newest_checkpoint(dir_ / "run.ckpt");
  ASSERT_TRUE(n.checkpoint);
  EXPECT_EQ(n.checkpoint->step, 4u);
  EXPECT_EQ(n.file, dir_ / "scratch" / "run.ckpt");
  const fs::path scratch = dir_ / "scratch";
  fs::resize_file(scratch / "run.ckpt", fs::file_size(scratch / "run.ckpt") - 3);  // truncated
  fs::remove(scratch / "run.ckpt.1");                                              // a gap
  std::ofstream(scratch / "run.ckpt.2.tmp.77") << "x";  // a rotation that died
  std::ofstream(scratch / "run.ckpt.tmp.x") << "x";     // not a pid: someone else's file
  n = newest_checkpoint(dir_ / "run.ckpt");
  ASSERT_TRUE(n.checkpoint);
  EXPECT_EQ(n.checkpoint->step, 2u);
  EXPECT_EQ(n.file, scratch / "run.ckpt.2");
  ASSERT_EQ(n.skipped.size(), 2u);
  EXPECT_EQ(n.skipped[0].rfind((scratch / "run.ckpt.2.tmp.77").string() + ": a save that did not "
                                                                          "finish",
                               0),
            0u)
      << n.skipped[0];
  EXPECT_EQ(n.skipped[1].rfind((scratch / "run.ckpt").string() + ": ", 0), 0u) << n.skipped[1];
  // A loader's other failures are not a reason to pass a file over.
  EXPECT_THROW(newest_checkpoint(dir_ / "run.ckpt",
                                 [](const fs::path&) -> Checkpoint { throw std::bad_alloc(); }),
               std::bad_alloc);
}

// A save that fails (the disk full, a failed rename, the rotation refused) throws OutputError
// naming the file and the reason, leaves the previous checkpoint loadable and no temporary file.
TEST_F(Checkpoints, AFailedSaveLeavesThePreviousCheckpointAndNoTemporaryFile) {
  const fs::path path = dir_ / "run.ckpt";
  Checkpoint c = small_checkpoint();
  c.skipped = 0;
  c.step = c.updates = 1;
  save_checkpoint(path, c, 2);
  c.step = c.updates = 2;
  auto no_temporary = [&] {
    for (const auto& e : fs::directory_iterator(dir_))
      EXPECT_EQ(e.path().string().find(".tmp"), std::string::npos) << e.path();
  };
  const int full = ::open("/dev/full", O_WRONLY | O_CLOEXEC);
  ASSERT_GE(full, 0);
  FileCalls calls = system_file_calls();
  calls.write = [full](int, const void* p, std::size_t n) { return ::write(full, p, n); };
  const FileCalls before = set_file_calls(calls);
  try {
    save_checkpoint(path, c, 2);
    ADD_FAILURE() << "no OutputError";
  } catch (const OutputError& e) {
    EXPECT_NE(std::string(e.what()).find(path.string()), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find(std::strerror(ENOSPC)), std::string::npos) << e.what();
  }
  calls = system_file_calls();
  calls.rename = [](const char*, const char*) {
    errno = EIO;
    return -1;
  };
  set_file_calls(calls);
  EXPECT_THROW(save_checkpoint(path, c, 2), OutputError);
  set_file_calls(before);
  ::close(full);
  EXPECT_EQ(load_checkpoint(path).step, 1u);
  no_temporary();
  // The rotation refused: run.ckpt.1 is a folder that is not empty.
  fs::remove(dir_ / "run.ckpt.1");
  fs::create_directories(dir_ / "run.ckpt.1" / "x");
  EXPECT_THROW(save_checkpoint(path, c, 2), OutputError);
  EXPECT_EQ(load_checkpoint(path).step, 1u);
  no_temporary();
}

}  // namespace checkpoint_test
}  // namespace cohort::checkpoint
