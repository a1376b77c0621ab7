// --augment end to end: the flag and the job-config key reach the run, the effective config
// records the canonical spec, `cohort eval` of the checkpoint normalizes the test rows as the run
// did (the same loss, accuracy and logits), and a bad spec exits 2 naming the flag.
#include <gtest/gtest.h>

#include <cstring>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "cohort/cli/cli.hpp"
#include "cohort/data/dataset.hpp"
#include "testing.hpp"

namespace cohort::cli {
namespace augment_cli_test {

using testing::cohort;
using testing::Result;

class AugmentCli : public testing::TempDirTest {
 protected:
  std::vector<std::string> quick(std::vector<std::string> extra) {
    std::vector<std::string> a{"train",   "--data", COHORT_FIXTURE_DIR, "--model", "mlp:784-32-10",
                               "--batch", "64",     "--steps",          "12",      "--workers",
                               "2",       "--quiet"};
    a.insert(a.end(), extra.begin(), extra.end());
    return a;
  }
};

nlohmann::json read_json(const std::string& path) {
  std::ifstream in(path);
  return nlohmann::json::parse(in);
}

// The fraction of rows of a (N, classes) float32 .npy file whose largest logit is the label.
double logits_accuracy(const std::string& path, const std::vector<std::uint32_t>& labels) {
  std::ifstream in(path, std::ios::binary);
  const std::string file((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const std::size_t header = static_cast<unsigned char>(file[8]) |
                             static_cast<std::size_t>(static_cast<unsigned char>(file[9])) << 8;
  const std::size_t data = 10 + header;
  const std::size_t classes = (file.size() - data) / sizeof(float) / labels.size();
  EXPECT_EQ(data + labels.size() * classes * sizeof(float), file.size());
  std::size_t correct = 0;
  for (std::size_t r = 0; r < labels.size(); ++r) {
    std::vector<float> row(classes);
    std::memcpy(row.data(), file.data() + data + r * classes * sizeof(float),
                classes * sizeof(float));
    std::size_t best = 0;
    for (std::size_t c = 1; c < classes; ++c)
      if (row[c] > row[best]) best = c;
    correct += best == labels[r];
  }
  return static_cast<double>(correct) / static_cast<double>(labels.size());
}

TEST_F(AugmentCli, EvalOfTheCheckpointNormalizesAsTheRunDid) {
  const std::string summary = (dir_ / "s.json").string(), ckpt = (dir_ / "a.ckpt").string();
  Result r =
      cohort(quick({"--augment", "normalize, flip,crop:2", "--summary", summary, "--save", ckpt}));
  ASSERT_EQ(r.code, 0) << r.err;
  const nlohmann::json s = read_json(summary);
  EXPECT_EQ(s["config"]["augment"], "crop:2,flip,normalize");  // canonical
  const std::string eval = (dir_ / "e.json").string(), logits = (dir_ / "l.npy").string();
  Result e = cohort({"eval", "--checkpoint", ckpt, "--data", COHORT_FIXTURE_DIR, "--summary", eval,
                     "--logits", logits, "--quiet"});
  ASSERT_EQ(e.code, 0) << e.err;
  const nlohmann::json j = read_json(eval);
  EXPECT_EQ(j["weights_digest"], s["weights_digest"]);
  EXPECT_EQ(j["test_loss"], s["test_loss"]);  // the same normalized rows, bit for bit
  EXPECT_EQ(j["test_accuracy"], s["test_accuracy"]);
  const data::Splits fixture = data::load_image_folder(COHORT_FIXTURE_DIR);
  EXPECT_EQ(logits_accuracy(logits, fixture.test.labels), s["test_accuracy"].get<double>());

  // Without augmentation the key is absent and the weights differ.
  const std::string plain = (dir_ / "p.json").string();
  ASSERT_EQ(cohort(quick({"--summary", plain})).code, 0);
  const nlohmann::json p = read_json(plain);
  EXPECT_FALSE(p["config"].contains("augment"));
  EXPECT_NE(p["weights_digest"], s["weights_digest"]);
}

// A resume continues the augmented run bit for bit; one with other augmentation is refused.
TEST_F(AugmentCli, ResumeNeedsTheCheckpointsAugmentation) {
  const std::string full = (dir_ / "full.json").string(),
                    resumed = (dir_ / "resumed.json").string(), ckpt = (dir_ / "a.ckpt").string();
  ASSERT_EQ(cohort(quick({"--augment", "crop:4,flip,erase:0.5", "--summary", full})).code, 0);
  auto half = quick({"--augment", "crop:4,flip,erase:0.5", "--save", ckpt});
  half[8] = "5";  // --steps 5 of 12
  ASSERT_EQ(cohort(half).code, 0);
  for (const std::vector<std::string>& other :
       {std::vector<std::string>{}, std::vector<std::string>{"--augment", "crop:4,flip"}}) {
    std::vector<std::string> args{"--resume", ckpt};
    args.insert(args.end(), other.begin(), other.end());
    Result r = cohort(quick(args));
    EXPECT_EQ(r.code, kExitBadInput);
    EXPECT_NE(r.err.find(ckpt + ": --augment: this run has " +
                         (other.empty() ? "none" : "'crop:4,flip'") +
                         ", the checkpoint 'crop:4,flip,erase:0.5'"),
              std::string::npos)
        << r.err;
  }
  Result r =
      cohort(quick({"--augment", "erase:0.5,flip,crop:4", "--resume", ckpt, "--summary", resumed}));
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(read_json(resumed)["weights_digest"], read_json(full)["weights_digest"]);
}

TEST_F(AugmentCli, TheJobConfigKeyEqualsTheFlag) {
  const std::string toml = (dir_ / "job.toml").string(), a = (dir_ / "a.json").string(),
                    b = (dir_ / "b.json").string();
  std::ofstream(toml) << "[data]\naugment = \"crop:4,erase:0.5\"\n";
  ASSERT_EQ(cohort(quick({"--config", toml, "--summary", a})).code, 0);
  ASSERT_EQ(cohort(quick({"--augment", "erase:0.5,crop:4", "--summary", b})).code, 0);
  EXPECT_EQ(read_json(a)["weights_digest"], read_json(b)["weights_digest"]);
  EXPECT_EQ(read_json(a)["config"]["augment"], "crop:4,erase:0.5");
}

TEST_F(AugmentCli, ABadSpecExitsTwoNamingTheFlag) {
  Result r = cohort(quick({"--augment", "crop:x", "--dry-run"}));
  EXPECT_EQ(r.code, kExitBadInput);
  EXPECT_NE(r.err.find("--augment: expected crop:P (P in 1..16), flip, erase:P (P in (0,1]) or "
                       "normalize, comma-separated, each at most once; found 'crop:x'"),
            std::string::npos)
      << r.err;
  Result ok = cohort(quick({"--augment", "crop:4,flip", "--dry-run"}));
  EXPECT_EQ(ok.code, 0) << ok.err;
  EXPECT_NE(ok.out.find("augment=crop:4,flip"), std::string::npos) << ok.out;
}

}  // namespace augment_cli_test
}  // namespace cohort::cli
