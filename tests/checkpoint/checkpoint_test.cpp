// Checkpoint files: exact round trips, every truncation and 1,000 bit flips refused whole,
// foreign and future files refused with reasons, rotation of kept copies.
#include "cohort/checkpoint/checkpoint.hpp"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <random>

#include "cohort/core/error.hpp"

namespace cohort::checkpoint {
namespace {

namespace fs = std::filesystem;

Checkpoint small_checkpoint() {
  Checkpoint c;
  c.model = "mlp:4-3";
  c.step = 17;
  c.seed = 5;
  c.batch = 8;
  c.micro_batch = 4;
  c.train_count = 512;
  c.config_json = R"({"lr":0.05})";
  for (int i = 0; i < 16; ++i) c.weights.push_back(0.25f * float(i) - 1.0f);
  for (int i = 0; i < 16; ++i) c.velocity.push_back(0.01f * float(i));
  return c;
}

class Checkpoints : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("cohort_ckpt_" +
            std::string(::testing::UnitTest::GetInstance()->current_test_info()->name()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  static std::vector<std::uint8_t> read(const fs::path& p) {
    std::ifstream f(p, std::ios::binary);
    return {std::istreambuf_iterator<char>(f), {}};
  }
  fs::path dir_;
};

TEST_F(Checkpoints, RoundTripIsExact) {
  const Checkpoint c = small_checkpoint();
  const auto bytes = encode_checkpoint(c);
  const Checkpoint d = decode_checkpoint(bytes, "mem");
  EXPECT_EQ(d.model, c.model);
  EXPECT_EQ(d.step, 17u);
  EXPECT_EQ(d.weights, c.weights);
  EXPECT_EQ(d.velocity, c.velocity);
  EXPECT_EQ(d.config_json, c.config_json);
  EXPECT_EQ(encode_checkpoint(d), bytes);
  // save, load, save: identical files
  save_checkpoint(dir_ / "a.ckpt", c);
  save_checkpoint(dir_ / "b.ckpt", load_checkpoint(dir_ / "a.ckpt"));
  EXPECT_EQ(read(dir_ / "a.ckpt"), read(dir_ / "b.ckpt"));
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
  future[8] = 2;  // version 2
  EXPECT_NE(message(future).find("newer cohort"), std::string::npos);
  auto foreign = bytes;
  foreign[0] = 'X';
  EXPECT_NE(message(foreign).find("magic"), std::string::npos);
  EXPECT_NE(message({}).find("magic"), std::string::npos);
  // A length that would overflow an offset: the last section's length set to 2^63.
  auto huge = bytes;
  const std::size_t momn_len = bytes.size() - 4 - 16 * 4 - 8;
  huge[momn_len + 7] = 0x80;
  EXPECT_NE(message(huge).find("MOMN"), std::string::npos);
  EXPECT_THROW(load_checkpoint(dir_ / "absent.ckpt"), InputError);
  EXPECT_THROW(load_checkpoint(dir_), InputError);
}

TEST_F(Checkpoints, KeepRotatesNewestFirst) {
  Checkpoint c = small_checkpoint();
  for (std::uint64_t step = 1; step <= 4; ++step) {
    c.step = step;
    save_checkpoint(dir_ / "run.ckpt", c, 3);
  }
  EXPECT_EQ(load_checkpoint(dir_ / "run.ckpt").step, 4u);
  EXPECT_EQ(load_checkpoint(dir_ / "run.ckpt.1").step, 3u);
  EXPECT_EQ(load_checkpoint(dir_ / "run.ckpt.2").step, 2u);
  EXPECT_FALSE(fs::exists(dir_ / "run.ckpt.3"));
  for (const auto& e : fs::directory_iterator(dir_))
    EXPECT_EQ(e.path().string().find(".tmp"), std::string::npos) << e.path();
}

}  // namespace
}  // namespace cohort::checkpoint
