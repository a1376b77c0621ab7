// Batch weight gradients make an MLP's weights independent of the micro-batch, for micro-batches
// of whole 16-row blocks: true of oneDNN's GEMM kernels on AVX-512, not a property of cohort's
// code, so this test is labelled isa_dependent (see CMakeLists.txt here). The worker-count
// equalities that hold on every ISA are trainer_test.cpp's.
#include <gtest/gtest.h>

#include <cstdio>
#include <string>

#include "cohort/nn/version.hpp"
#include "cohort/train/trainer.hpp"
#include "train_test_util.hpp"

namespace cohort::train {
namespace batch_weight_grads_test {

using testing::fixture;
using testing::Recorder;

// A 6-step run of `model` with batch weight gradients: its digest (printed with the seed).
std::string digest_of(const char* model, std::size_t micro_batch) {
  TrainConfig c;
  c.model = model;
  c.batch = 64;
  c.micro_batch = micro_batch;
  c.workers = 2;
  c.steps = 6;
  c.seed = 5;
  c.optimizer.lr = 0.05f;
  c.weight_grads = TrainConfig::WeightGrads::kBatch;
  Recorder r;
  const Summary s = Trainer(c, fixture()).run(r);
  std::printf("seed %llu, %s, micro-batch %zu: %s\n", static_cast<unsigned long long>(c.seed),
              model, micro_batch, s.weights_digest.c_str());
  EXPECT_EQ(s.steps, 6u);
  EXPECT_EQ(r.losses.size(), 6u);
  EXPECT_EQ(s.weights_digest.size(), 32u);
  return s.weights_digest;
}

// With batch weight gradients a model of linear layers sums every weight gradient over the whole
// batch inside one GEMM per chunk; what the micro-batch still changes is the M of each leaf's
// forward and backward-data GEMMs. Why the bits depend on the ISA: oneDNN chooses its GEMM kernel
// (and so its blocking and summation order) by instruction set; its AVX-512 kernels give each row
// the same bits whatever the number of rows, as long as that is a multiple of their 16-row
// blocking, so on AVX-512 micro-batches of 16, 32, 64, ... give the same weights, not only every
// worker count. Another ISA's kernels (AVX2: other blockings) need not. Leaves of 1, 7 or 8 rows
// take other kernels even here and differ in the last bits (the control below, ISA-dependent too);
// so do per-leaf gradients. At batch 256 the default micro-batch is such a size on 1, 2, 4, 8 or
// 16 cores.
TEST(Trainer, BatchWeightGradientsMakeAnMlpIndependentOfMicroBatchesOf16Rows) {
  // Measured on AVX2 (a Zen 4 VM without AVX-512): micro-batches 16 and 64 agreed, 32 did not.
  if (nn::onednn_isa().rfind("avx512_core", 0) != 0)
    GTEST_SKIP() << "a property of oneDNN's AVX-512 GEMM kernels; this CPU dispatches "
                 << nn::onednn_isa();
  for (const char* model : {"mlp:784-32-10", "mlp:784-512-256-10"}) {
    const std::string digest = digest_of(model, 16);
    for (std::size_t m : {32, 64})
      EXPECT_EQ(digest_of(model, m), digest) << model << ", micro-batch " << m;
    // The control: leaves of 8 rows take another kernel, so the micro-batch does reach the GEMMs
    // and the digest sees their last bits (an equality above is not one of a blind digest).
    EXPECT_NE(digest_of(model, 8), digest) << model << ", micro-batch 8";
  }
}

}  // namespace batch_weight_grads_test
}  // namespace cohort::train
