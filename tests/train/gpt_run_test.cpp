// The Trainer on a language model (gpt:, nn/gpt/gpt.hpp) and text (Tiny Shakespeare's first 40,000
// characters): the same weights for every worker count, in f32 and bf16, with dropout; a resume
// equal to the uninterrupted run; a falling validation loss over the whole validation split,
// the same every time it is measured; and the refusals of a language model on images and of
// another model on text.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "cohort/checkpoint/checkpoint.hpp"
#include "cohort/core/error.hpp"
#include "cohort/data/text.hpp"
#include "cohort/nn/gpt/gpt.hpp"
#include "cohort/nn/gpt/gpt_attention.hpp"
#include "cohort/nn/version.hpp"
#include "cohort/train/trainer.hpp"
#include "defaults.hpp"
#include "train_test_util.hpp"

namespace cohort::train {
namespace gpt_run_test {

constexpr std::size_t kBlock = 16;

// The first 40,000 characters of datasets/tinyshakespeare/input.txt, split 90/10, as windows
// of `block` + 1 tokens.
data::Splits shakespeare(std::size_t block) {
  std::ifstream f(std::string(COHORT_FIXTURE_DIR) + "/../tinyshakespeare/input.txt",
                  std::ios::binary);
  std::vector<std::uint8_t> bytes(40000);
  f.read(reinterpret_cast<char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  EXPECT_TRUE(f) << "datasets/tinyshakespeare/input.txt";
  return data::text_splits(data::read_text(bytes, "input.txt", nullptr, {}, block), block);
}

const data::Splits& text() {
  static const data::Splits splits = shakespeare(kBlock);
  return splits;
}

// Heads of 32 in windows of 32, where bf16 attention runs as cohort's kernel on CPUs with AVX-512
// and BF16 (nn/gpt/gpt_attention.hpp: on AMX's tiles where the CPU has them), and its windows.
constexpr const char* kKernelSpec = "gpt:1-2-64-32-0.1";
const data::Splits& text_for(const TrainConfig& c) {
  static const data::Splits splits32 = shakespeare(32);
  return c.model == kKernelSpec ? splits32 : text();
}

// nanoGPT's recipe on a small model: AdamW (0.9, 0.99), weight decay 0.1, clipping at 1.0.
TrainConfig gpt_config(const char* spec = "gpt:2-2-16-16-0.1") {
  TrainConfig c;
  c.model = spec;
  c.batch = 8;
  c.micro_batch = 2;
  c.workers = 1;
  c.steps = 6;
  c.seed = 3;
  c.optimizer.kind = optim::Kind::kAdamW;
  c.optimizer.lr = 1e-3f;
  c.optimizer.beta2 = 0.99f;
  c.optimizer.weight_decay = 0.1f;
  c.schedule.warmup_steps = 2;
  c.clip_norm = 1.0f;
  c.eval_batch = 64;
  return c;
}

std::string digest_after(TrainConfig c) {
  Trainer t(c, text_for(c));
  testing::Recorder rec;
  return t.run(rec).weights_digest;
}

bool bf16_runs() { return nn::bf16_support() == nn::Bf16Support::kNative; }

// gpt_config(spec) in f32 and, where the CPU runs bf16, in bf16, for each of `specs`.
std::vector<TrainConfig> configs(std::initializer_list<const char*> specs) {
  std::vector<TrainConfig> out;
  for (const char* spec : specs)
    for (const nn::Precision p : {nn::Precision::kF32, nn::Precision::kBf16}) {
      if (p == nn::Precision::kBf16 && !bf16_runs()) continue;
      out.push_back(gpt_config(spec));
      out.back().precision = p;
    }
  return out;
}

// What a failure names: the model and the precision.
std::string run_name(const TrainConfig& c) {
  return c.model + ", " + (c.precision == nn::Precision::kBf16 ? "bf16" : "f32");
}

// Also with 256 embedding dimensions: the MLP's rows of 4 KB take the f32 weight gradients on
// dnnl_sgemm and skewed buffers (GptPlanBuilder::wide_rows); and kKernelSpec.

TEST(GptRun, SameWeightsForEveryWorkerCount) {
  for (TrainConfig c : configs({"gpt:2-2-16-16-0.1", "gpt:1-2-256-16-0.1", kKernelSpec})) {
    const std::string one = digest_after(c);
    TrainConfig other = c;
    other.seed = 4;
    EXPECT_NE(digest_after(other), one) << run_name(c);  // the digest tells runs apart
    for (const std::size_t w : {2u, 3u}) {
      c.workers = w;
      EXPECT_EQ(digest_after(c), one) << run_name(c) << ", " << w << " workers";
    }
  }
}

TEST(GptRun, AResumeIsTheUninterruptedRun) {
  for (TrainConfig c : configs({"gpt:2-2-16-16-0.1", kKernelSpec})) {
    const std::string whole = digest_after(c);
    TrainConfig first = c;
    first.steps = 3;
    Trainer a(first, text_for(c));
    testing::Recorder rec;
    a.run(rec);
    const auto bytes = checkpoint::encode_checkpoint(a.checkpoint("{}"));
    c.workers = 2;  // and on another worker count
    Trainer b(c, text_for(c));
    b.restore(checkpoint::decode_checkpoint(bytes, "mem"), "mem");
    EXPECT_EQ(b.run(rec).weights_digest, whole) << run_name(c);
  }
}

// The summary's memory: the weights and AdamW's two arrays of the layout, one gradient buffer a
// leaf (4 leaves, too small for a chain), and the training plan of 2 windows of each replica that
// trained a leaf (one or both: a replica claims leaves while there are any) holding its logits
// (2 x 16 rows of the text's tokens padded to a multiple of 64, f32, written over by their
// gradient; in bf16 also the gradient's bf16 copy) among the rest; the peak RSS above all of it.
TEST(GptRun, TheSummaryCountsWhatHoldsTheMemory) {
  for (const nn::Precision p : {nn::Precision::kF32, nn::Precision::kBf16}) {
    if (p == nn::Precision::kBf16 && nn::bf16_support() == nn::Bf16Support::kNone) continue;
    TrainConfig c = gpt_config("gpt:2-2-32-16,bias,gelu=tanh,pad=64");
    c.workers = 2;
    c.precision = p;
    c.steps = 2;
    Trainer t(c, text());
    testing::Recorder rec;
    const Summary s = t.run(rec);
    const auto vocab = static_cast<std::int64_t>(text().train.num_classes);
    const std::size_t total = nn::Model::parse(c.model, {}, vocab).layout().total();
    const auto padded = static_cast<std::size_t>((vocab + 63) / 64 * 64);
    const bool half = p == nn::Precision::kBf16;
    const train::MemoryBreakdown& m = s.memory;
    EXPECT_EQ(m.weights, total * (half ? 6 : 4));
    EXPECT_EQ(m.optimizer_state, 2 * total * 4);
    EXPECT_EQ(m.gradients, 4 * total * 4);
    const std::size_t plan_logits = 2 * 16 * padded * (half ? 6 : 4);
    EXPECT_EQ(m.logits % plan_logits, 0u) << m.logits;
    EXPECT_TRUE(m.logits / plan_logits == 1 || m.logits / plan_logits == 2) << m.logits;
    EXPECT_GT(m.plans, m.logits + m.weight_copies);
    EXPECT_GT(m.peak_rss, m.weights + m.optimizer_state + m.gradients + m.plans);
  }
}

TEST(GptRun, ValidationLossFallsAndIsTheSameEachTime) {
  TrainConfig c = gpt_config("gpt:2-2-32-16");
  c.workers = 2;
  Trainer t(c, text());
  const auto [before, acc_before] = t.evaluate_test();
  EXPECT_NEAR(before, std::log(double(text().train.num_classes)), 0.2);  // uniform at the start
  c.steps = 120;
  Trainer trained(c, text());
  testing::Recorder rec;
  const Summary s = trained.run(rec);
  EXPECT_LT(s.test_loss, before - 0.6) << "validation loss " << before << " -> " << s.test_loss;
  EXPECT_GT(s.test_accuracy, acc_before);
  const auto again = trained.evaluate_test();
  EXPECT_EQ(again.first, s.test_loss);
  EXPECT_EQ(again.second, s.test_accuracy);
  // The whole validation split in side-by-side windows.
  const data::Dataset& val = text().test;
  EXPECT_EQ(val.count, (val.tokens.size() - 1) / kBlock);
}

// Leaves hold at most 512 tokens: nanoGPT's full recipe (6-6-384-256) gets 2 windows a leaf in
// both precisions (its activations' cap: 4 in bf16, 2 in f32, plans near 250 MB a replica), the
// medium model 4 windows; the CPU recipe's cap is 8 windows (its batch of 12: two leaves of 6). A
// model of short, wide windows whose activations cap its leaves below the tokens' (16-16-1024-64: 6
// windows in bf16, 3 in f32, against 8).
TEST(GptRun, DefaultLeavesBoundALeafsActivationsAndTokens) {
  auto windows = [](const std::string& spec, nn::Precision p) {
    return nn::Model::parse(spec, {}, 65).kind().leaf_rule(p);
  };
  for (const nn::Precision p : {nn::Precision::kBf16, nn::Precision::kF32}) {
    EXPECT_EQ(windows("gpt:6-6-384-256", p).cap, 2u);
    EXPECT_EQ(windows("gpt:4-4-256-128", p).cap, 4u);
    EXPECT_FALSE(windows("gpt:4-4-256-128", p).exact);  // balanced over the batch
  }
  EXPECT_EQ(windows("gpt:4-4-128-64", nn::Precision::kF32).cap, 8u);
  EXPECT_EQ(windows("gpt:16-16-1024-64", nn::Precision::kBf16).cap, 6u);
  EXPECT_EQ(windows("gpt:16-16-1024-64", nn::Precision::kF32).cap, 3u);
  EXPECT_EQ(windows("gpt:48-16-1024-1024", nn::Precision::kBf16).cap, 1u);  // never 0
}

// The memory check's estimate of a leaf plan: with attention weights (T^2 a head and layer),
// 20 bytes a value in bf16 and 30 in f32; where this CPU runs attention as cohort's kernel (bf16),
// which keeps none, 64 bytes a token x layer x embd value. GPT-2's 350M at windows of 1024: 8.5 GB
// a window with attention weights, 1.6 GB without (it fits a 24 GB machine's half with 2 workers).
TEST(GptRun, TheLeafPlansEstimateKeepsNoAttentionWeightsWhereTheKernelRuns) {
  const nn::Model m = nn::Model::parse("gpt:24-16-1024-1024", {}, 65);
  const double tokens_layers = 1024.0 * 24;
  const double with_weights = tokens_layers * (1024 + 16 * 1024);
  EXPECT_EQ(m.kind().leaf_plan_bytes(2, nn::Precision::kF32), 2 * with_weights * 30);
  const double bf16 = m.kind().leaf_plan_bytes(2, nn::Precision::kBf16);
  const nn::GptModel gpt = nn::GptModel::parse("gpt:24-16-1024-1024", 65);
  if (nn::gpt_attention_kernel(gpt, nn::Precision::kBf16)) {
    EXPECT_EQ(bf16, 2 * tokens_layers * 1024 * 64);
  } else {
    EXPECT_EQ(bf16, 2 * with_weights * 20);
  }
}

// A model whose one-window leaf plans cannot fit (a window's attention weights grow with
// block^2) is refused by run(), naming --model, before its first step allocates them, and a
// --micro-batch that cannot fit names --micro-batch; 1.7 TB for one window here.
TEST(GptRun, ALeafPlanThatCannotFitIsRefused) {
  constexpr std::size_t block = 3000;
  const data::Splits long_windows = shakespeare(block);
  TrainConfig c = gpt_config("gpt:100-64-64-3000");
  c.micro_batch = 1;
  testing::Recorder rec;
  try {
    Trainer t(c, long_windows);  // evaluation alone builds no leaf plan: accepted
    t.run(rec);
    FAIL() << "a 1.7 TB leaf was accepted";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("--model: expected a model whose leaf plans"),
              std::string::npos)
        << e.what();
    EXPECT_NE(std::string(e.what()).find("MiB for 1 worker's leaf of 1 sample"), std::string::npos)
        << e.what();
  }
  c.model = "gpt:1-2-16-3000";  // 516 MiB a window in f32
  c.micro_batch = 8;
  c.workers = 1u << 10;
  const nn::Model small = nn::Model::parse(
      c.model, {1, 1, block + 1}, static_cast<std::int64_t>(long_windows.train.num_classes));
  try {
    check_training_memory(c, small);
    FAIL() << "1,024 workers' leaves of 8 windows of 3,000 were accepted";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("--micro-batch: expected leaf plans"), std::string::npos)
        << e.what();
  }
}

// A trace of a language model's run: each leaf's forward starts inside its step, its backward
// starts where the forward ends and ends inside the step (both spans carry real time).
TEST(GptRun, TraceSpansEachLeafsForwardAndBackwardInsideItsStep) {
  TrainConfig c = gpt_config();
  c.workers = 2;
  c.trace = true;
  Trainer t(c, text());
  testing::Recorder rec;
  t.run(rec);
  std::map<std::uint64_t, std::pair<double, double>> step_span;
  for (const TraceSpan& s : t.trace())
    if (std::string(s.name) == "step") step_span[s.step] = {s.begin_us, s.end_us};
  ASSERT_EQ(step_span.size(), c.steps);
  std::map<std::pair<std::uint64_t, std::size_t>, std::pair<double, double>> forward;
  int backwards = 0;
  for (const TraceSpan& s : t.trace())
    if (std::string(s.name) == "forward") forward[{s.step, s.index}] = {s.begin_us, s.end_us};
  ASSERT_EQ(forward.size(), c.steps * (c.batch / c.micro_batch));
  for (const TraceSpan& s : t.trace()) {
    if (std::string(s.name) != "backward") continue;
    ++backwards;
    const auto [step_begin, step_end] = step_span.at(s.step);
    const auto [fwd_begin, fwd_end] = forward.at({s.step, s.index});
    const std::string at = "step " + std::to_string(s.step) + " leaf " + std::to_string(s.index);
    EXPECT_GE(fwd_begin, step_begin) << at;
    EXPECT_GT(fwd_end, fwd_begin) << at << ": a forward of no time";
    EXPECT_EQ(s.begin_us, fwd_end) << at;
    EXPECT_GT(s.end_us, s.begin_us) << at << ": a backward of no time";
    EXPECT_LE(s.end_us, step_end) << at;
  }
  EXPECT_EQ(backwards, static_cast<int>(forward.size()));
}

TEST(GptRun, ALanguageModelNeedsTextAndTextALanguageModel) {
  TrainConfig c = gpt_config();
  try {
    Trainer t(c, testing::fixture());
    FAIL() << "a gpt on images was accepted";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("--model"), std::string::npos) << e.what();
  }
  c.model = "mlp:17-10";
  try {
    Trainer t(c, text());
    FAIL() << "an mlp on text was accepted";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("gpt:"), std::string::npos) << e.what();
  }
}

}  // namespace gpt_run_test
}  // namespace cohort::train
