// LeafChain (src/train/leaf_chain.hpp) on plain threads: leaves completed in any order sum to the
// left-to-right sum bit for bit, in no more buffers than the pool; a replica waiting for a buffer
// is woken by abort. Then the Trainer: a step that chains its leaves gets the weights of the
// tree's root, for a language model and a model with batch weight gradients, for 1-3 workers,
// and skips a non-finite step as the tree does.
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <limits>
#include <mutex>
#include <random>
#include <set>
#include <thread>
#include <vector>

#include "cohort/data/text.hpp"
#include "cohort/train/trainer.hpp"
#include "leaf_chain.hpp"
#include "train_test_util.hpp"

namespace cohort::train {
namespace leaf_chain_test {

// Leaf l's gradient: values of mixed magnitude, so that another order of the adds would round
// differently.
float leaf_value(std::size_t leaf, std::size_t i, std::uint32_t seed) {
  std::mt19937 rng(seed * 7919u + static_cast<std::uint32_t>(leaf * 131 + i));
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  return u(rng) * (i % 3 == 0 ? 1e4f : 1e-3f);
}

TEST(LeafChain, LeavesInAnyOrderSumLeftToRightInAFewBuffers) {
  constexpr std::size_t kN = 999, kLeaves = 9, kThreads = 3;
  for (std::uint32_t seed = 1; seed <= 12; ++seed) {
    SCOPED_TRACE("seed " + std::to_string(seed));
    // The values first, then the sum: computed together, the compiler may fuse a product into
    // the add (FMA contraction) and round differently from the adds it checks.
    std::vector<std::vector<float>> values(kLeaves, std::vector<float>(kN));
    for (std::size_t l = 0; l < kLeaves; ++l)
      for (std::size_t i = 0; i < kN; ++i) values[l][i] = leaf_value(l, i, seed);
    std::vector<float> expected = values[0];
    for (std::size_t l = 1; l < kLeaves; ++l)
      for (std::size_t i = 0; i < kN; ++i) expected[i] = expected[i] + values[l][i];
    LeafChain chain(kN, kThreads + 1);
    std::vector<float> got;
    for (int step = 0; step < 2; ++step) {  // a second step reuses the pool
      chain.begin_step(kLeaves);
      std::atomic<std::size_t> next{0};
      std::atomic<int> sums{0};
      std::vector<std::thread> threads;
      for (std::size_t t = 0; t < kThreads; ++t)
        threads.emplace_back([&, t] {
          std::mt19937 delay(seed * 31u + static_cast<std::uint32_t>(t + 10 * step));
          for (;;) {
            float* b = chain.acquire();
            ASSERT_NE(b, nullptr);
            const std::size_t leaf = next.fetch_add(1);
            if (leaf >= kLeaves) {
              chain.release(b);
              return;
            }
            std::memcpy(b, values[leaf].data(), kN * sizeof(float));
            std::this_thread::sleep_for(std::chrono::microseconds(delay() % 3000));
            if (const float* sum = chain.complete(leaf, b)) {
              ++sums;
              got.assign(sum, sum + kN);
            }
          }
        });
      for (auto& th : threads) th.join();
      EXPECT_EQ(sums.load(), 1) << "step " << step;
      ASSERT_EQ(got.size(), kN);
      EXPECT_EQ(std::memcmp(got.data(), expected.data(), kN * sizeof(float)), 0) << "step " << step;
    }
  }
}

TEST(LeafChain, AbortWakesAReplicaWaitingForABuffer) {
  LeafChain chain(16, 2);
  chain.begin_step(4);
  float* a = chain.acquire();
  float* b = chain.acquire();
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  EXPECT_EQ(chain.complete(1, b), nullptr);  // leaf 1 waits for leaf 0, which never comes
  std::atomic<bool> returned{false};
  float* got = a;
  std::thread waiter([&] {
    got = chain.acquire();  // both buffers are taken
    returned = true;
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_FALSE(returned.load());
  chain.abort();
  waiter.join();
  EXPECT_EQ(got, nullptr);
}

constexpr std::size_t kBlock = 16;

const data::Splits& text() {
  static const data::Splits splits = [] {
    std::vector<std::uint8_t> bytes(20000);
    for (std::size_t i = 0; i < bytes.size(); ++i)  // a text of 20 letters in a fixed pattern
      bytes[i] = static_cast<std::uint8_t>('a' + (i * i + 3 * i) % 20);
    return data::text_splits(data::read_text(bytes, "input.txt", nullptr, {}, kBlock), kBlock);
  }();
  return splits;
}

struct Outcome {
  std::string digest;
  std::size_t buffers = 0;  // distinct gradient arrays the leaves were computed into
};

Outcome run(TrainConfig c, const data::Splits& data) {
  std::set<const float*> seen;
  std::mutex m;
  c.gradient_hook = [&](std::uint64_t, std::size_t, float* g, std::size_t) {
    const std::lock_guard lock(m);
    seen.insert(g);
  };
  Trainer t(c, data);
  testing::Recorder rec;
  Outcome o;
  o.digest = t.run(rec).weights_digest;
  o.buffers = seen.size();
  return o;
}

void expect_chain_is_the_tree(TrainConfig c, const data::Splits& data, std::size_t leaves) {
  c.leaf_chain_bytes = std::size_t{1} << 40;  // every leaf keeps its buffer
  c.workers = 1;
  const Outcome tree = run(c, data);
  EXPECT_EQ(tree.buffers, leaves);
  c.leaf_chain_bytes = 0;  // chained whenever there are more leaves than workers + 1
  for (const std::size_t w : {1u, 2u, 3u}) {
    c.workers = w;
    const Outcome chained = run(c, data);
    EXPECT_EQ(chained.digest, tree.digest) << w << " workers";
    EXPECT_LE(chained.buffers, w + 1) << w << " workers";
  }
}

TEST(LeafChainRun, ALanguageModelGetsTheTreesWeights) {
  TrainConfig c;
  c.model = "gpt:2-2-16-16-0.1";
  c.batch = 8;
  c.micro_batch = 1;
  c.steps = 4;
  c.seed = 5;
  c.optimizer.kind = optim::Kind::kAdamW;
  c.optimizer.lr = 1e-3f;
  c.optimizer.weight_decay = 0.1f;
  c.clip_norm = 1.0f;
  c.eval_batch = 64;
  expect_chain_is_the_tree(c, text(), 8);
}

TEST(LeafChainRun, BatchWeightGradientsAndTheFusedRootGetTheTreesWeights) {
  TrainConfig c;
  c.model = "mlp:784-32-10";
  c.batch = 64;
  c.micro_batch = 8;
  c.steps = 3;
  c.seed = 6;
  expect_chain_is_the_tree(c, testing::fixture(), 8);
}

TEST(LeafChainRun, ANonFiniteLeafIsSkippedAsTheTreeSkipsIt) {
  TrainConfig c;
  c.model = "mlp:784-32-10";
  c.weight_grads = TrainConfig::WeightGrads::kLeaf;
  c.batch = 64;
  c.micro_batch = 8;
  c.steps = 4;
  c.seed = 7;
  c.on_nonfinite = TrainConfig::OnNonFinite::kSkip;
  c.workers = 2;
  auto digest = [&](std::size_t chain_bytes) {
    TrainConfig d = c;
    d.leaf_chain_bytes = chain_bytes;
    d.gradient_hook = [](std::uint64_t step, std::size_t leaf, float* g, std::size_t) {
      if (step == 2 && leaf == 5) g[3] = std::numeric_limits<float>::quiet_NaN();
    };
    Trainer t(d, testing::fixture());
    testing::Recorder rec;
    const Summary s = t.run(rec);
    EXPECT_EQ(s.skipped, 1u) << "leaf_chain_bytes " << chain_bytes;
    return s.weights_digest;
  };
  EXPECT_EQ(digest(0), digest(std::size_t{1} << 40));
}

// The input checks count the gradient buffers a step keeps: a LeafChain's workers + 1 where it
// sums the leaves (one process), a buffer a leaf otherwise (two ranks). GPT-2's 124M model at
// --batch 64 --micro-batch 1 and 2 workers: 3 buffers of 498 MB in one process, 64 (31.9 GB)
// in two, refused where that is more than half this machine's memory.
TEST(LeafChainRun, TheInputChecksCountTheChainsBuffers) {
  std::vector<std::uint16_t> tokens(2 * 1025);
  for (std::size_t i = 0; i < tokens.size(); ++i)
    tokens[i] = static_cast<std::uint16_t>(i * 7919 % 50257);
  tokens[0] = 50256;  // the vocabulary: 50,257
  data::ArrayView a;
  a.kind = 'u';
  a.item_size = 2;
  a.shape = {tokens.size()};
  a.payload = {reinterpret_cast<const std::uint8_t*>(tokens.data()), tokens.size() * 2};
  a.source = "tokens";
  const data::Splits splits = data::text_splits(data::token_arrays(a, a, 1024), 1024);
  TrainConfig c;
  c.model = "gpt:124M";
  c.batch = 64;
  c.micro_batch = 1;
  c.workers = 2;
  c.optimizer.kind = optim::Kind::kAdamW;
  const nn::Model model = nn::Model::parse(c.model, input_shape(splits.train),
                                           static_cast<std::int64_t>(splits.train.num_classes));
  EXPECT_TRUE(chains_leaves(c, model.layout().total(), 1));
  EXPECT_FALSE(chains_leaves(c, model.layout().total(), 2));
  EXPECT_NO_THROW(validate(c, model, splits, 1));
  const double pages =
      static_cast<double>(sysconf(_SC_PHYS_PAGES)) * static_cast<double>(sysconf(_SC_PAGE_SIZE));
  if (64.0 * static_cast<double>(model.layout().total()) * 4 <= pages / 2)
    GTEST_SKIP() << "this machine holds 64 buffers of 498 MB in half its memory";
  try {
    validate(c, model, splits, 2);
    ADD_FAILURE() << "64 buffers in two ranks were accepted";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("64 leaves of --batch 64 need"), std::string::npos)
        << e.what();
  }
}

}  // namespace leaf_chain_test
}  // namespace cohort::train
