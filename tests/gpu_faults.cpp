// GPU faults and reproducibility: an allocation that cannot succeed is one clear error (size,
// free/total memory, the batch-size hint) and leaves the device usable; a training run too big
// for the device stops with that error; two deterministic runs give bitwise-identical weights and
// two atomicAdd runs agree within a small tolerance. Runs configs/tiny.yaml in-process.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "app/config/config.h"
#include "app/train/trainer.h"
#include "runtime/error.h"
#include "runtime/memory.h"
#include "layers/checkpoint/safetensors.h"
#include "tests/test_util.h"

using namespace cnn;
namespace fs = std::filesystem;

namespace {

using test::contains;
using test::slurp;
using test::source_dir;

fs::path fresh_dir(const std::string& name) {
  return test::fresh_dir("gpu_faults", name);
}

// CNN_TRAIN_BINARY from the environment wins over the built-in path, so the
// binaries also run on a machine where the repository sits elsewhere (scripts/gpu_check.sh).
std::string train_binary() {
  if (const char* env = std::getenv("CNN_TRAIN_BINARY"); env && *env) return env;
#ifdef CNN_TRAIN_BINARY
  return CNN_TRAIN_BINARY;
#else
  return "";
#endif
}

std::string tiny_config() {
  return source_dir() + "/configs/tiny.yaml";
}

// A tiny run on the GPU writing to `dir`; returns the exit code.
int train_tiny_cuda(const fs::path& dir, std::vector<std::string> sets) {
  sets.insert(sets.begin(), {"training.device=cuda", "logging.progress=off"});
  TrainConfig cfg = load_config(tiny_config(), sets);
  TrainArgs args;
  args.log_dir = dir.string();
  return run_training(cfg, args);
}

// The device still allocates, copies and frees after a failure.
void expect_device_usable() {
  std::vector<float> h(1000, 1.5f), back(1000, 0.f);
  Buffer<float> d(h.size(), Device::CUDA);
  d.copy_from(h.data(), Device::CPU, h.size());
  raw_copy(back.data(), Device::CPU, d.data(), Device::CUDA, h.size() * sizeof(float));
  EXPECT_EQ(back, h);
}

}  // namespace

TEST(GpuFaults, AbsurdAllocationNamesSizeFreeMemoryAndHint) {
  CNN_REQUIRE_GPU();
  try {
    Buffer<uint8_t> b(size_t(1) << 50, Device::CUDA);  // 1 PiB
    FAIL() << "a 1 PiB device allocation succeeded";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_EQ(m.find('\n'), std::string::npos) << m;
    EXPECT_TRUE(contains(m, "out of GPU memory")) << m;
    EXPECT_TRUE(contains(m, "1073741824.0 MiB")) << m;  // the request
    EXPECT_TRUE(contains(m, " MiB free of ")) << m;     // cudaMemGetInfo
    EXPECT_TRUE(contains(m, "training.batch_size")) << m;
  }
  expect_device_usable();
}

// 4096 conv channels at batch 2^16: the first activation alone wants 256 GiB. (An 8x8 pool keeps
// the linear layer's matrices under 2^31 elements, which its shape check would refuse first.)
TEST(GpuFaults, TooLargeBatchStopsTrainingWithTheAllocationError) {
  CNN_REQUIRE_GPU();
  fs::path dir = fresh_dir("oom");
  try {
    train_tiny_cuda(dir, {"training.batch_size=65536", "model.layers[0].conv2d.out_channels=4096",
                          "model.layers[2].maxpool2d.kernel=8"});
    FAIL() << "training at batch 2^16 with 4096 channels did not run out of memory";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_EQ(m.find('\n'), std::string::npos) << m;
    EXPECT_TRUE(contains(m, "cannot set up the network for batch 65536 on cuda")) << m;
    EXPECT_TRUE(contains(m, "out of GPU memory")) << m;
    EXPECT_TRUE(contains(m, "training.batch_size")) << m;
  }
  expect_device_usable();
  // A run that fits still trains in the same process.
  EXPECT_EQ(train_tiny_cuda(dir, {"training.max_steps=5"}), 0);
  fs::remove_all(dir);
}

// The same through ./train: exit code 1 and the one error line, no crash. The per-file test
// binary knows where train is; the all-in-one cnn_gpu_tests is told by CNN_TRAIN_BINARY.
TEST(GpuFaults, TrainBinaryExitsNonZeroOnOutOfMemory) {
  CNN_REQUIRE_GPU();
  const std::string train = train_binary();
  if (train.empty()) GTEST_SKIP() << "no path of ./train (set CNN_TRAIN_BINARY)";
  if (!fs::exists(train)) GTEST_SKIP() << train << " is not here";
  fs::path dir = fresh_dir("oom_binary");
  const std::string cmd = train + " --config " + tiny_config() + " --device cuda --log-dir " +
                          (dir / "run").string() +
                          " --set logging.progress=off --set training.batch_size=65536"
                          " --set 'model.layers[0].conv2d.out_channels=4096'"
                          " --set 'model.layers[2].maxpool2d.kernel=8' > " +
                          (dir / "out.txt").string() + " 2> " + (dir / "err.txt").string();
  const int status = std::system(cmd.c_str());
  ASSERT_TRUE(WIFEXITED(status)) << "train died by a signal: " << status;
  EXPECT_EQ(WEXITSTATUS(status), 1);
  std::string err = slurp(dir / "err.txt");
  while (!err.empty() && err.back() == '\n') err.pop_back();
  EXPECT_EQ(err.find('\n'), std::string::npos) << err;
  EXPECT_EQ(err.rfind("train: error: cannot set up the network for batch 65536 on cuda", 0), 0u)
      << err;
  EXPECT_TRUE(contains(err, "out of GPU memory")) << err;
  fs::remove_all(dir);
}

// training.deterministic: true: two runs write byte-identical checkpoints.
TEST(GpuFaults, DeterministicRunsAreBitwiseIdentical) {
  CNN_REQUIRE_GPU();
  fs::path a = fresh_dir("det_a"), b = fresh_dir("det_b");
  const std::vector<std::string> sets = {"training.deterministic=true", "training.max_steps=40"};
  ASSERT_EQ(train_tiny_cuda(a, sets), 0);
  ASSERT_EQ(train_tiny_cuda(b, sets), 0);
  const std::string wa = slurp(a / "last.safetensors"), wb = slurp(b / "last.safetensors");
  EXPECT_FALSE(wa.empty());
  EXPECT_TRUE(wa == wb) << "two deterministic GPU runs wrote different checkpoints";
  fs::remove_all(a);
  fs::remove_all(b);
}

// The atomicAdd default: the order of the additions varies, so the weights may differ in the
// last bits, but after 40 steps by no more than 1e-3 of each tensor's largest value; the same
// bound holds against a deterministic run.
TEST(GpuFaults, AtomicRunsAgreeWithinTolerance) {
  CNN_REQUIRE_GPU();
  fs::path a = fresh_dir("atomic_a"), b = fresh_dir("atomic_b"), d = fresh_dir("atomic_det");
  ASSERT_EQ(train_tiny_cuda(a, {"training.max_steps=40"}), 0);
  ASSERT_EQ(train_tiny_cuda(b, {"training.max_steps=40"}), 0);
  ASSERT_EQ(train_tiny_cuda(d, {"training.max_steps=40", "training.deterministic=true"}), 0);
  SafetensorsFile fa = read_safetensors((a / "last.safetensors").string());
  for (const fs::path& other : {b, d}) {
    SafetensorsFile fo = read_safetensors((other / "last.safetensors").string());
    int differing = 0;
    for (const auto& e : fa.entries()) {
      const std::vector<float> x = fa.tensor_f32(e.name).data, y = fo.tensor_f32(e.name).data;
      ASSERT_EQ(x.size(), y.size()) << e.name;
      double scale = 0, diff = 0;
      for (size_t i = 0; i < x.size(); ++i) {
        scale = std::max(scale, double(std::fabs(x[i])));
        diff = std::max(diff, double(std::fabs(x[i] - y[i])));
        differing += x[i] != y[i];
      }
      EXPECT_LE(diff, 1e-3 * std::max(scale, 1e-3)) << e.name << " vs " << other;
      std::printf("[ diff     ] %s vs %s: max |diff| %.3g (max |w| %.3g)\n", e.name.c_str(),
                  other.filename().c_str(), diff, scale);
    }
    std::printf("[ diff     ] %d values differ from %s\n", differing, other.filename().c_str());
  }
  fs::remove_all(a);
  fs::remove_all(b);
  fs::remove_all(d);
}
