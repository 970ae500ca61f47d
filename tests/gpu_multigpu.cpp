// Data-parallel training on one GPU: a 1-rank NCCL communicator sums buffers and bucketed
// gradients correctly (the identity for one rank, so bitwise), and a 1-rank data-parallel run
// trains exactly what the ordinary trainer trains in deterministic mode. NCCL is loaded at run
// time: set CNN_NCCL_LIBRARY (e.g. <python>/site-packages/nvidia/nccl/lib) where libnccl.so.2 is
// not on the loader's path; without it these tests skip, naming the error.
#include <gtest/gtest.h>

#include <filesystem>

#include "app/config/config.h"
#include "app/train/distributed.h"
#include "app/train/trainer.h"
#include "layers/checkpoint/safetensors.h"
#include "layers/gradcheck/gradcheck.h"
#include "layers/network.h"
#include "runtime/error.h"
#include "runtime/memory.h"
#include "tests/test_util.h"

using namespace cnn;
namespace fs = std::filesystem;

namespace {

std::string nccl_missing() {
  if (!multi_gpu_unsupported_reason().empty()) return multi_gpu_unsupported_reason();
  try {
    (void)open_nccl("");
    return "";
  } catch (const Error& e) {
    return e.what();
  }
}

#define CNN_REQUIRE_NCCL()                                                                        \
  do {                                                                                            \
    CNN_REQUIRE_GPU();                                                                            \
    if (const std::string why = nccl_missing(); !why.empty()) GTEST_SKIP() << "no NCCL: " << why; \
  } while (0)

RankInfo one_rank(const std::string& name) {
  RankInfo r;
  r.id_file = test::fresh_dir("multigpu", name).string() + "/nccl-id";
  r.id_token = "test";
  r.source = "test";
  return r;
}

}  // namespace

TEST(GpuDataParallel, OneRankAllReduceAndBucketedGradientsAreExact) {
  CNN_REQUIRE_NCCL();
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  DataParallel dp(one_rank("allreduce"), "", true, 60);

  Exec ex;
  ex.device = Device::CUDA;
  ex.deterministic = true;
  // A buffer of an awkward size summed in place: one rank's sum is the buffer itself.
  const std::vector<float> h = test::random_vector(1000003, seed);
  Buffer<float> buf(h.size(), Device::CUDA);
  buf.copy_from(h.data(), Device::CPU, h.size(), nullptr);
  GradcheckCase c = gradcheck_small_network_case();
  NetworkOptions o;
  o.max_batch = 7;
  o.seed = seed;
  Network ref(c.specs, c.input_chw, o, ex), net(c.specs, c.input_chw, o, ex);
  dp.attach(net, ex, 64);  // tiny buckets: several all-reduces launched during backward
  dp.all_reduce_sum(buf.data(), h.size());
  EXPECT_EQ(test::to_host(buf.data(), h.size()), h);
  EXPECT_GT(dp.num_buckets(), 1);

  const int n = 7;
  const auto x = test::random_vector(size_t(n) * size_t(shape_numel(c.input_chw)), seed + 1);
  const auto y = test::random_labels(size_t(n), ref.num_classes(), seed + 2);
  Buffer<float> dx(x.size(), Device::CUDA);
  Buffer<int32_t> dy(y.size(), Device::CUDA);
  dx.copy_from(x.data(), Device::CPU, x.size(), nullptr);
  dy.copy_from(y.data(), Device::CPU, y.size(), nullptr);
  for (int step = 0; step < 2; ++step) {  // twice: the buckets are launched afresh every step
    ref.forward_backward(n, dx.data(), dy.data(), 1.0f / n);
    net.forward_backward(n, dx.data(), dy.data(), 1.0f / n);
    dp.finish_step();
    dp.watch_step();
  }
  EXPECT_EQ(net.grads_to_host(), ref.grads_to_host());
  const CommTimes t = dp.last_times();
  EXPECT_GE(t.allreduce_ms, 0);
  EXPECT_GE(t.exposed_ms, 0);
}

TEST(GpuDataParallel, OneRankTrainingEqualsOrdinaryTrainingBitwise) {
  CNN_REQUIRE_NCCL();
  const fs::path dir = test::fresh_dir("multigpu", "train");
  const auto cfg_for = [&](const std::string& name, int gpus) {
    return load_config(
        std::string(CNN_SOURCE_DIR) + "/configs/tiny.yaml",
        {"training.device=cuda", "training.deterministic=true", "logging.progress=off",
         "logging.dir=" + dir.string(), "name=" + name, "training.gpus=" + std::to_string(gpus)});
  };
  const TrainConfig plain = cfg_for("plain", 1);
  ASSERT_EQ(run_training(plain, TrainArgs{}), 0);
  const TrainConfig ranked = cfg_for("ranked", 1);
  TrainArgs args;
  args.rank = one_rank("train-id");
  ASSERT_EQ(run_training(ranked, args), 0);
  const auto a = test::checkpoint_weights(dir / "plain" / "last.safetensors");
  const auto b = test::checkpoint_weights(dir / "ranked" / "last.safetensors");
  ASSERT_FALSE(a.empty());
  EXPECT_EQ(a, b) << "the 1-rank NCCL run trained other weights than the ordinary run";
  EXPECT_TRUE(
      test::contains(test::slurp(dir / "ranked" / "train.log"), "data-parallel: rank 0 of 1"));
  EXPECT_TRUE(test::contains(test::slurp(dir / "ranked" / "train.log"), "all-reduce"));
}
