// A language model through the command line: `cohort train` on a folder with input.txt (the
// first 4,000 characters of Tiny Shakespeare), its checkpoint's vocabulary, and `cohort sample`:
// the same text for the same seed, another for another seed, the prompt first, greedy decoding
// at temperature 0, exit 2 for a prompt character outside the vocabulary, a temperature that is
// not a number or a checkpoint that is not a language model's, exit 74 when the text cannot be
// written; `cohort eval` of it: its validation loss in bits, and exit 2
// on data that is not text; --tokenizer on a model of token arrays.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <sstream>
#include <streambuf>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "../tokenizer/made_tokenizer.hpp"
#include "cohort/checkpoint/checkpoint.hpp"
#include "cohort/tokenizer/bpe.hpp"
#include "testing.hpp"

namespace cohort::cli {
namespace sample_test {

namespace fs = std::filesystem;
using testing::cohort;
using testing::Result;

class Sample : public testing::TempDirTest {
 protected:
  void SetUp() override {
    TempDirTest::SetUp();
    std::ifstream in(std::string(COHORT_FIXTURE_DIR) + "/../tinyshakespeare/input.txt");
    std::string text(4000, '\0');
    in.read(text.data(), static_cast<std::streamsize>(text.size()));
    fs::create_directories(dir_ / "text");
    std::ofstream(dir_ / "text" / "input.txt") << text;
    ckpt_ = (dir_ / "gpt.ckpt").string();
    Result r = cohort({"train", "--data", (dir_ / "text").string(), "--model", "gpt:1-2-16-8",
                       "--batch", "8", "--steps", "20", "--optimizer", "adamw", "--lr", "0.01",
                       "--quiet", "--save", ckpt_});
    ASSERT_EQ(r.code, 0) << r.err;
  }
  std::string ckpt_;
};

TEST_F(Sample, TheCheckpointRecordsTheVocabulary) {
  const checkpoint::Checkpoint c = checkpoint::load_checkpoint(ckpt_);
  EXPECT_EQ(c.model, "gpt:1-2-16-8");
  ASSERT_GT(c.vocab, 20u);
  ASSERT_EQ(c.characters.size(), c.vocab);
  EXPECT_EQ(c.characters.front(), std::uint32_t{'\n'});
  EXPECT_TRUE(std::is_sorted(c.characters.begin(), c.characters.end()));
}

TEST_F(Sample, TheSameSeedGivesTheSameText) {
  auto sample = [&](const std::string& seed, std::vector<std::string> extra = {}) {
    std::vector<std::string> args{"sample", "--checkpoint", ckpt_, "--tokens",
                                  "200",    "--seed",       seed,  "--quiet"};
    args.insert(args.end(), extra.begin(), extra.end());
    Result r = cohort(args);
    EXPECT_EQ(r.code, 0) << r.err;
    EXPECT_EQ(r.err, "");
    return r.out;
  };
  const std::string a = sample("5");
  EXPECT_EQ(sample("5"), a);
  EXPECT_NE(sample("6"), a);
  EXPECT_GE(a.size(), 201u);  // 200 characters (some several bytes) and a newline
  const std::string prompted = sample("5", {"--prompt", "First Citizen:"});
  EXPECT_EQ(prompted.rfind("First Citizen:", 0), 0u) << prompted;
  // Temperature 0 takes the most likely token: the seed does not matter.
  EXPECT_EQ(sample("1", {"--temperature", "0"}), sample("2", {"--temperature", "0"}));
  Result rate = cohort({"sample", "--checkpoint", ckpt_, "--tokens", "50"});
  EXPECT_NE(rate.err.find("tokens/s"), std::string::npos) << rate.err;
}

TEST_F(Sample, RefusesWhatItCannotSample) {
  Result r = cohort({"sample", "--checkpoint", ckpt_, "--prompt", "First {Citizen}"});
  EXPECT_EQ(r.code, kExitBadInput);
  EXPECT_NE(r.err.find("--prompt: character 7 '{'"), std::string::npos) << r.err;
  EXPECT_EQ(r.out, "");
  const std::string mlp = (dir_ / "mlp.ckpt").string();
  ASSERT_EQ(cohort({"train", "--data", COHORT_FIXTURE_DIR, "--model", "mlp:784-16-10", "--steps",
                    "2", "--batch", "64", "--quiet", "--save", mlp})
                .code,
            0);
  r = cohort({"sample", "--checkpoint", mlp});
  EXPECT_EQ(r.code, kExitBadInput);
  EXPECT_NE(r.err.find("expected a language model"), std::string::npos) << r.err;
  // A temperature that is not a number (CLI::Range alone lets NaN through).
  for (const char* t : {"nan", "-1", "inf"}) {
    r = cohort({"sample", "--checkpoint", ckpt_, "--temperature", t});
    EXPECT_EQ(r.code, kExitBadInput) << t;
    EXPECT_NE(r.err.find("--temperature"), std::string::npos) << r.err;
    EXPECT_EQ(r.out, "");
  }
  // A classifier's checkpoint on text: eval names its --data (it has no --model).
  r = cohort({"eval", "--checkpoint", mlp, "--data", (dir_ / "text").string()});
  EXPECT_EQ(r.code, kExitBadInput);
  EXPECT_NE(r.err.find("--data: expected images or tables for " + mlp), std::string::npos) << r.err;
  // A language model needs text, and text a language model.
  r = cohort({"train", "--data", (dir_ / "text").string(), "--steps", "2", "--quiet"});
  EXPECT_EQ(r.code, kExitBadInput);
  EXPECT_NE(r.err.find("gpt:"), std::string::npos) << r.err;
}

// Standard output that takes `room` bytes and then fails, as a full disk or a closed pipe.
class FailingAfter : public std::streambuf {
 public:
  explicit FailingAfter(std::size_t room) : room_(room) {}
  std::size_t taken = 0;

 protected:
  int_type overflow(int_type c) override {
    if (taken == room_) return traits_type::eof();
    ++taken;
    return c;
  }

 private:
  std::size_t room_;
};

// The text is the product: a write that fails stops the sampling and exits 74 (kExitWriteFailed)
// saying how far it got, rather than drawing every token for nobody and exiting 0.
TEST_F(Sample, AnOutputThatFailsStopsTheSamplingWithExit74) {
  FailingAfter buffer(10);
  std::ostream out(&buffer);
  std::ostringstream err;
  std::vector<std::string> args{"cohort",        "sample",   "--checkpoint",
                                ckpt_,           "--tokens", "100000",
                                "--temperature", "0"};  // greedy: 1-byte characters here
  std::vector<const char*> argv;
  for (const auto& a : args) argv.push_back(a.c_str());
  EXPECT_EQ(run(static_cast<int>(argv.size()), argv.data(), out, err), kExitWriteFailed);
  EXPECT_NE(err.str().find("standard output: cannot write the sample"), std::string::npos)
      << err.str();
  EXPECT_NE(err.str().find("after 10 of 100000 tokens"), std::string::npos) << err.str();
  EXPECT_EQ(buffer.taken, 10u);
}

TEST_F(Sample, EvalGivesTheValidationLossInBitsOnTextOnly) {
  const std::string summary = (dir_ / "eval.json").string();
  Result r = cohort(
      {"eval", "--checkpoint", ckpt_, "--data", (dir_ / "text").string(), "--summary", summary});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("val loss "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find(" bits/token), next-token accuracy "), std::string::npos) << r.out;
  const auto j = nlohmann::json::parse(std::ifstream(summary));
  EXPECT_EQ(j["val_loss"], j["test_loss"]);
  EXPECT_NEAR(j["val_bpc"].get<double>(), j["val_loss"].get<double>() / std::log(2.0), 1e-12);
  // A folder with its own val.txt trains on all of input.txt: the training split's size is not
  // the run's, and evaluation does not depend on it.
  fs::create_directories(dir_ / "with_val");
  fs::copy_file(dir_ / "text" / "input.txt", dir_ / "with_val" / "input.txt");
  {
    std::ifstream in(dir_ / "text" / "input.txt");
    const std::string text((std::istreambuf_iterator<char>(in)), {});
    std::ofstream(dir_ / "with_val" / "val.txt") << text.substr(text.size() - 500);
  }
  r = cohort({"eval", "--checkpoint", ckpt_, "--data", (dir_ / "with_val").string()});
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("val loss "), std::string::npos) << r.out;
  // A training split smaller than the run's batch: evaluation draws no batch from it.
  {
    const std::string big = (dir_ / "b64.ckpt").string();
    ASSERT_EQ(cohort({"train", "--data", (dir_ / "text").string(), "--model", "gpt:1-2-16-8",
                      "--batch", "64", "--steps", "2", "--quiet", "--save", big})
                  .code,
              0);
    std::ifstream in(dir_ / "text" / "input.txt");
    std::string text((std::istreambuf_iterator<char>(in)), {}), distinct = text;
    std::sort(distinct.begin(), distinct.end());
    distinct.erase(std::unique(distinct.begin(), distinct.end()), distinct.end());
    fs::create_directories(dir_ / "few");
    std::ofstream(dir_ / "few" / "input.txt") << distinct << distinct.substr(0, 9);
    std::ofstream(dir_ / "few" / "val.txt") << text.substr(0, 500);
    ASSERT_LT(distinct.size() + 9 - 8, 64u);  // training windows: fewer than the batch
    r = cohort({"eval", "--checkpoint", big, "--data", (dir_ / "few").string()});
    EXPECT_EQ(r.code, 0) << r.err;
  }
  // Text of another vocabulary: refused naming the vocabulary (before the parameter count that
  // follows from it), one more character or the same count of others.
  for (const auto& [name, edit] : {std::pair{"one_more", "{"}, std::pair{"others", "@"}}) {
    fs::create_directories(dir_ / name);
    std::ifstream in(dir_ / "text" / "input.txt");
    std::string text((std::istreambuf_iterator<char>(in)), {});
    if (std::string(name) == "others")  // every 'a' becomes '@': as many characters, not the same
      std::replace(text.begin(), text.end(), 'a', '@');
    else
      text += edit;
    std::ofstream(dir_ / name / "input.txt") << text;
    r = cohort({"eval", "--checkpoint", ckpt_, "--data", (dir_ / name).string()});
    EXPECT_EQ(r.code, kExitBadInput) << name;
    EXPECT_NE(r.err.find(ckpt_ + ": vocabulary"), std::string::npos) << r.err;
  }
  // The images a classifier reads are no language model's data: exit 2, nothing evaluated.
  r = cohort({"eval", "--checkpoint", ckpt_, "--data", COHORT_FIXTURE_DIR});
  EXPECT_EQ(r.code, kExitBadInput);
  EXPECT_NE(r.err.find("--data: expected text"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("'gpt:1-2-16-8', found"), std::string::npos) << r.err;
  EXPECT_EQ(r.out, "");
}

// A .npy file of uint16 tokens (numpy.save's layout, version 1.0).
void write_tokens(const fs::path& path, const std::vector<std::uint16_t>& tokens) {
  std::string header = "{'descr': '<u2', 'fortran_order': False, 'shape': (" +
                       std::to_string(tokens.size()) + ",), }";
  header.append(63 - (10 + header.size()) % 64, ' ');
  header += '\n';
  std::ofstream f(path, std::ios::binary);
  f << std::string("\x93NUMPY\x01\x00", 8) << static_cast<char>(header.size() & 0xff)
    << static_cast<char>(header.size() >> 8) << header;
  f.write(reinterpret_cast<const char*>(tokens.data()),
          static_cast<std::streamsize>(tokens.size() * sizeof(std::uint16_t)));
}

// --tokenizer: a model of token arrays (ids of the tokenizer made in tests/tokenizer) samples the
// text of the same draws as its token ids without it.
TEST_F(Sample, ATokenizerEncodesThePromptAndDecodesTheDraws) {
  const fs::path tok = dir_ / "tokenizer", data = dir_ / "tokens";
  made_tokenizer::write_made_tokenizer(tok);
  const tokenizer::Bpe bpe = tokenizer::Bpe::load(tok);
  fs::create_directories(data);
  std::vector<std::uint16_t> train(3000), val(300);
  constexpr unsigned kSeed = 5;
  for (std::size_t i = 0; i < train.size(); ++i) train[i] = static_cast<std::uint16_t>(i * 7 % 263);
  for (std::size_t i = 0; i < val.size(); ++i) val[i] = static_cast<std::uint16_t>(i * kSeed % 263);
  write_tokens(data / "train_tokens.npy", train);
  write_tokens(data / "val_tokens.npy", val);
  const std::string ck = (dir_ / "tok.ckpt").string();
  Result r = cohort({"train", "--data", data.string(), "--model", "gpt:1-2-16-8", "--batch", "8",
                     "--steps", "10", "--quiet", "--save", ck});
  ASSERT_EQ(r.code, 0) << r.err;
  const std::string prompt = "hello the";
  ASSERT_EQ(bpe.encode(prompt), (std::vector<std::uint32_t>{256, 257, 'o', 259}));
  const std::vector<std::string> common{"sample", "--checkpoint", ck,  "--tokens",
                                        "30",     "--seed",       "3", "--quiet"};
  auto run = [&](std::vector<std::string> extra) {
    std::vector<std::string> args = common;
    args.insert(args.end(), extra.begin(), extra.end());
    return cohort(args);
  };
  const Result text = run({"--tokenizer", tok.string(), "--prompt", prompt});
  const Result ids = run({"--prompt", "256 257 111 259"});
  ASSERT_EQ(text.code, 0) << text.err;
  ASSERT_EQ(ids.code, 0) << ids.err;
  std::vector<std::uint32_t> drawn;
  std::istringstream in(ids.out);
  for (std::uint32_t id; in >> id;) drawn.push_back(id);
  ASSERT_EQ(drawn.size(), 4u + 30u) << ids.out;
  EXPECT_EQ(text.out, bpe.decode(drawn) + "\n");
  EXPECT_EQ(text.out.rfind(prompt, 0), 0u) << text.out;
  // A character model's checkpoint has its own vocabulary.
  r = cohort({"sample", "--checkpoint", ckpt_, "--tokenizer", tok.string()});
  EXPECT_EQ(r.code, kExitBadInput);
  EXPECT_NE(r.err.find("--tokenizer: expected a checkpoint trained on token arrays"),
            std::string::npos)
      << r.err;
  // A folder without the files.
  r = cohort({"sample", "--checkpoint", ck, "--tokenizer", data.string()});
  EXPECT_EQ(r.code, kExitBadInput);
  EXPECT_NE(r.err.find("vocab.json"), std::string::npos) << r.err;
}

}  // namespace sample_test
}  // namespace cohort::cli
