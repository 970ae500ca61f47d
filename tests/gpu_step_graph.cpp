// The trainer's step as a CUDA graph (app/step_graph.h): the kernels read the step's values from
// device memory (batch counter, learning rate, Adam's step) as their by-value twins would, and in
// deterministic mode a run replaying the graph writes bitwise the weights and optimizer state of
// a run without it: partial last batches, epoch boundaries, checkpoints and a resume inside an
// epoch included; so does the step with every gradient added to (CNN_GRAD_OVERWRITE=0). Runs
// configs/tiny.yaml in-process.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "app/config/config.h"
#include "app/train/trainer.h"
#include "data/gather.h"
#include "kernels/optimizer/optimizer.h"
#include "layers/checkpoint/safetensors.h"
#include "runtime/memory.h"
#include "tests/test_util.h"

using namespace cnn;
namespace fs = std::filesystem;

namespace {

using test::contains;
using test::slurp;
using test::source_dir;

fs::path fresh_dir(const std::string& name) {
  return test::fresh_dir("gpu_graph", name);
}

// 1024 training images at batch 48: 21 full batches and a partial one of 16 per epoch, so 50
// steps cross two epoch boundaries and two partial batches. Deterministic reductions, a warm-up
// and cosine schedule (the learning rate changes every step), a checkpoint every 10 steps.
std::vector<std::string> base_sets() {
  return {"training.device=cuda",      "logging.progress=off", "training.deterministic=true",
          "training.batch_size=48",    "schedule.type=cosine", "schedule.warmup_epochs=0.5",
          "checkpoint.every_steps=10", "logging.every_steps=7"};
}

int train(const fs::path& dir, std::vector<std::string> sets, const std::vector<std::string>& more,
          const std::string& resume = "") {
  sets.insert(sets.end(), more.begin(), more.end());
  TrainConfig cfg = load_config(source_dir() + "/configs/tiny.yaml", sets);
  TrainArgs args;
  args.log_dir = dir.string();
  args.resume = resume;
  return run_training(cfg, args);
}

// Every tensor of two checkpoints (weights and optimizer state) bitwise equal. (The files
// themselves differ: the resolved config in their metadata names the switch.)
void expect_same_tensors(const fs::path& a, const fs::path& b) {
  SafetensorsFile fa = read_safetensors(a.string()), fb = read_safetensors(b.string());
  ASSERT_EQ(fa.entries().size(), fb.entries().size());
  for (const auto& e : fa.entries()) {
    const std::vector<float> x = fa.tensor_f32(e.name).data, y = fb.tensor_f32(e.name).data;
    ASSERT_EQ(x.size(), y.size()) << e.name;
    size_t differing = 0;
    for (size_t i = 0; i < x.size(); ++i) differing += std::memcmp(&x[i], &y[i], 4) != 0;
    EXPECT_EQ(differing, 0u) << e.name << ": " << a << " vs " << b;
  }
}

}  // namespace

TEST(GpuStepGraph, GraphAndEagerTrainingAreBitwiseIdentical) {
  CNN_REQUIRE_GPU();
  fs::path g = fresh_dir("sgd_graph"), e = fresh_dir("sgd_eager");
  ASSERT_EQ(train(g, base_sets(), {"training.max_steps=50"}), 0);
  ASSERT_EQ(train(e, base_sets(), {"training.max_steps=50", "training.cuda_graph=false"}), 0);
  expect_same_tensors(g / "last.safetensors", e / "last.safetensors");
  const std::string log_g = slurp(g / "train.log"), log_e = slurp(e / "train.log");
  EXPECT_TRUE(contains(log_g, "CUDA graph: on")) << log_g;
  EXPECT_TRUE(contains(log_g, "step 2: CUDA graph: captured the training step")) << log_g;
  EXPECT_FALSE(contains(log_g, "capturing the training step failed")) << log_g;
  // The replayed kernels overlap (runtime/graph_overlap.h) and still give the eager bits.
  EXPECT_TRUE(contains(log_g, "kernels launch while the one before them ends")) << log_g;
  EXPECT_TRUE(contains(log_e, "CUDA graph: off (training.cuda_graph is false)")) << log_e;
  // The logging points read the same device totals.
  EXPECT_FALSE(slurp(g / "metrics.csv").empty());
  fs::remove_all(g);
  fs::remove_all(e);
}

// AdamW (the step number and the learning rate in the decoupled decay come from the device): a
// graph run stopped at step 30 (inside the second epoch) and resumed to 50 equals an uninterrupted
// eager run.
TEST(GpuStepGraph, ResumedAdamGraphRunEqualsUninterruptedEager) {
  CNN_REQUIRE_GPU();
  const std::vector<std::string> adam = {"optimizer.type=adamw", "optimizer.lr=0.002",
                                         "optimizer.weight_decay=0.01"};
  fs::path g = fresh_dir("adam_graph"), e = fresh_dir("adam_eager");
  std::vector<std::string> sets = base_sets();
  sets.insert(sets.end(), adam.begin(), adam.end());
  ASSERT_EQ(train(e, sets, {"training.max_steps=50", "training.cuda_graph=false"}), 0);
  ASSERT_EQ(train(g, sets, {"training.max_steps=30"}), 0);
  ASSERT_EQ(train(g, sets, {"training.max_steps=50"}, (g / "last.safetensors").string()), 0);
  expect_same_tensors(g / "last.safetensors", e / "last.safetensors");
  EXPECT_TRUE(contains(slurp(g / "train.log"), "resuming from")) << slurp(g / "train.log");
  fs::remove_all(g);
  fs::remove_all(e);
}

// CNN_CUDA_GRAPH=0 and gradient clipping (a host sync per step) run the same steps eagerly.
TEST(GpuStepGraph, EnvSwitchAndClippingRunEagerly) {
  CNN_REQUIRE_GPU();
  fs::path g = fresh_dir("env_graph"), e = fresh_dir("env_off"), c = fresh_dir("clip");
  ASSERT_EQ(train(g, base_sets(), {"training.max_steps=25"}), 0);
  ::setenv("CNN_CUDA_GRAPH", "0", 1);
  const int rc = train(e, base_sets(), {"training.max_steps=25"});
  ::unsetenv("CNN_CUDA_GRAPH");
  ASSERT_EQ(rc, 0);
  expect_same_tensors(g / "last.safetensors", e / "last.safetensors");
  EXPECT_TRUE(contains(slurp(e / "train.log"), "CUDA graph: off (CNN_CUDA_GRAPH=0)"));
  ASSERT_EQ(train(c, base_sets(), {"training.max_steps=25", "optimizer.clip_grad_norm=1"}), 0);
  EXPECT_TRUE(contains(slurp(c / "train.log"), "CUDA graph: off (optimizer.clip_grad_norm"));
  fs::remove_all(g);
  fs::remove_all(e);
  fs::remove_all(c);
}

// CNN_GRAPH_OVERLAP: kernels launched once the one before has begun (start), or only after it
// has completed (0), give the bits of the default (launched once its blocks have exited).
TEST(GpuStepGraph, OverlapSwitchKeepsTheBits) {
  CNN_REQUIRE_GPU();
  fs::path o = fresh_dir("overlap_exit");
  ASSERT_EQ(train(o, base_sets(), {"training.max_steps=25"}), 0);
  EXPECT_TRUE(contains(slurp(o / "train.log"), "kernels launch while")) << slurp(o / "train.log");
  for (const char* mode : {"start", "0"}) {
    SCOPED_TRACE(mode);
    fs::path p = fresh_dir(std::string("overlap_") + mode);
    ::setenv("CNN_GRAPH_OVERLAP", mode, 1);
    const int rc = train(p, base_sets(), {"training.max_steps=25"});
    ::unsetenv("CNN_GRAPH_OVERLAP");
    ASSERT_EQ(rc, 0);
    expect_same_tensors(o / "last.safetensors", p / "last.safetensors");
    const std::string log = slurp(p / "train.log");
    EXPECT_EQ(contains(log, "kernels launch while"), std::string(mode) != "0") << log;
    EXPECT_TRUE(contains(log, "step 2: CUDA graph: captured the training step")) << log;
    fs::remove_all(p);
  }
  fs::remove_all(o);
}

// CNN_GRAD_OVERWRITE=0 (every gradient added to, and zeroed by the update) gives the bits of the
// default, whose captured step writes the linear weight's gradient and leaves it unzeroed (algo
// igemm: with auto, tiny's 4-output layer would run the fused head, whose gradient accumulates).
TEST(GpuStepGraph, GradOverwriteSwitchKeepsTheBits) {
  CNN_REQUIRE_GPU();
  for (const char* type : {"sgd", "adamw"}) {
    SCOPED_TRACE(type);
    const std::vector<std::string> more = {"training.max_steps=50", "training.algo=igemm",
                                           std::string("optimizer.type=") + type,
                                           "optimizer.lr=0.002"};
    fs::path on = fresh_dir(std::string("overwrite_on_") + type);
    fs::path off = fresh_dir(std::string("overwrite_off_") + type);
    ASSERT_EQ(train(on, base_sets(), more), 0);
    ::setenv("CNN_GRAD_OVERWRITE", "0", 1);
    const int rc = train(off, base_sets(), more);
    ::unsetenv("CNN_GRAD_OVERWRITE");
    ASSERT_EQ(rc, 0);
    expect_same_tensors(on / "last.safetensors", off / "last.safetensors");
    const std::string log_on = slurp(on / "train.log"), log_off = slurp(off / "train.log");
    EXPECT_TRUE(contains(log_on, "gradients written by backward")) << log_on;
    EXPECT_TRUE(contains(log_on, "step 2: CUDA graph: captured the training step")) << log_on;
    EXPECT_FALSE(contains(log_off, "gradients written by backward")) << log_off;
    fs::remove_all(on);
    fs::remove_all(off);
  }
}

// The kernels with device-resident step values: SGD's lr bitwise as by value; Adam's bias
// corrections computed on the device within float rounding of the host's (in practice equal);
// the counters' advance; the gather finding its batch from the counter, and poisoning a batch
// past the order.
TEST(GpuStepGraph, KernelsReadStepValuesFromDevice) {
  CNN_REQUIRE_GPU();
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  Exec ex;
  ex.device = Device::CUDA;
  const size_t n = 100003;
  const std::vector<float> w0 = test::random_vector(n, seed), g0 = test::random_vector(n, seed + 1);
  const std::vector<float> m0 = test::random_vector(n, seed + 2);
  const std::vector<float> v0 = test::random_vector(n, seed + 3, 0.f, 1.f);
  auto up = [](const std::vector<float>& h) {
    Buffer<float> b(h.size(), Device::CUDA);
    b.copy_from(h.data(), Device::CPU, h.size());
    return b;
  };
  auto down = [](const Buffer<float>& b) {
    std::vector<float> h(b.size());
    raw_copy(h.data(), Device::CPU, b.data(), Device::CUDA, b.bytes());
    return h;
  };
  const float lr = 0.0371f;
  const int64_t step = 9;
  Buffer<float> d_lr(1, Device::CUDA);
  d_lr.copy_from(&lr, Device::CPU, 1);
  Buffer<int64_t> d_step(1, Device::CUDA);
  d_step.copy_from(&step, Device::CPU, 1);
  {
    SgdParams p;
    p.lr = lr;
    p.momentum = 0.9f;
    p.weight_decay = 1e-3f;
    Buffer<float> wa = up(w0), ga = up(g0), ma = up(m0), wb = up(w0), gb = up(g0), mb = up(m0);
    sgd_update(int64_t(n), wa.data(), ga.data(), ma.data(), nullptr, p, 0.5f, ex);
    SgdParams q = p;
    q.lr = 123.f;
    sgd_update(int64_t(n), wb.data(), gb.data(), mb.data(), nullptr, q, 0.5f, ex, d_lr.data());
    EXPECT_EQ(down(wa), down(wb));
    EXPECT_EQ(down(ma), down(mb));
  }
  for (bool decoupled : {false, true}) {
    AdamParams p;
    p.lr = lr;
    p.step = step;
    p.weight_decay = 0.01f;
    p.decoupled = decoupled;
    Buffer<float> wa = up(w0), ga = up(g0), ma = up(m0), va = up(v0);
    Buffer<float> wb = up(w0), gb = up(g0), mb = up(m0), vb = up(v0);
    adam_update(int64_t(n), wa.data(), ga.data(), ma.data(), va.data(), nullptr, p, 1.f, ex);
    AdamParams q = p;
    q.lr = 5.f;
    q.step = 1;
    adam_update(int64_t(n), wb.data(), gb.data(), mb.data(), vb.data(), nullptr, q, 1.f, ex,
                d_lr.data(), d_step.data());
    const std::vector<float> a = down(wa), b = down(wb);
    size_t differing = 0;
    for (size_t i = 0; i < n; ++i) differing += a[i] != b[i];
    EXPECT_LE(test::max_rel_error(b, a), 1e-6) << "decoupled " << decoupled;
    EXPECT_EQ(down(ma), down(mb));  // the moments do not depend on the step
    std::printf("[ adam     ] decoupled %d: %zu of %zu weights differ from the host-step path\n",
                int(decoupled), differing, n);
  }

  // Counters: batch and update advance, lr follows the table and stays past it.
  const std::vector<float> table = {0.5f, 0.25f, 0.125f};
  Buffer<float> d_table(table.size(), Device::CUDA);
  d_table.copy_from(table.data(), Device::CPU, table.size());
  StepCounters c;
  c.batch = 0;
  c.update = 4;
  c.lr = table[0];
  Buffer<StepCounters> d_c(1, Device::CUDA);
  d_c.copy_from(&c, Device::CPU, 1);
  for (int64_t k = 1; k <= 3; ++k) {
    advance_step_counters(d_c.data(), d_table.data(), int64_t(table.size()), ex);
    StepCounters h;
    raw_copy(&h, Device::CPU, d_c.data(), Device::CUDA, sizeof(h));
    EXPECT_EQ(h.batch, k);
    EXPECT_EQ(h.update, 4 + k);
    EXPECT_EQ(h.lr, table[size_t(std::min<int64_t>(k, 2))]);
  }

  // Gather: the counted GPU gather equals the CPU twin over a shuffled order, batch by batch.
  Dataset d = test::random_dataset(45, 3, 9, 11, 5, seed + 4);
  Normalization norm{{0.2f, 0.4f, 0.5f}, {0.3f, 0.25f, 0.2f}};
  AugmentOptions aug;
  aug.shift = 2;
  aug.flip = true;
  GatherParams p = make_gather_params(3, 9, 11, norm, &aug, seed, 0);
  std::vector<int32_t> order(45);
  for (int i = 0; i < 45; ++i) order[size_t(i)] = (i * 17 + 5) % 45;
  DeviceDataset dd(d, Device::CUDA);
  Buffer<int32_t> d_order(order.size(), Device::CUDA);
  d_order.copy_from(order.data(), Device::CPU, order.size());
  const int64_t epoch = 3;
  Buffer<int64_t> d_counter(1, Device::CUDA), d_epoch(1, Device::CUDA);
  d_epoch.copy_from(&epoch, Device::CPU, 1);
  GatherParams q = p;
  q.epoch_ptr = d_epoch.data();
  q.batch_ptr = d_counter.data();
  q.batch_stride = 8;
  p.epoch = epoch;
  const size_t sz = d.image_size();
  for (int64_t k = 0; k < 7; ++k) {  // 45 = 5 * 8 + 5; k = 6 reaches past the order
    const int nb = k < 5 ? 8 : 5;
    d_counter.copy_from(&k, Device::CPU, 1);
    Buffer<float> x(size_t(nb) * sz, Device::CUDA);
    Buffer<int32_t> y(size_t(nb), Device::CUDA);
    dd.gather(q, d_order.data(), nb, x.data(), y.data());
    std::vector<float> got = down(x);
    std::vector<int32_t> got_y(static_cast<size_t>(nb));
    raw_copy(got_y.data(), Device::CPU, y.data(), Device::CUDA, got_y.size() * 4);
    if (k == 6) {
      EXPECT_TRUE(std::isnan(got[0]));
      EXPECT_EQ(got_y[0], -1);
      continue;
    }
    std::vector<float> ref(static_cast<size_t>(nb) * sz);
    std::vector<int32_t> ref_y(static_cast<size_t>(nb));
    gather_batch_cpu(p, d.images.data(), d.labels.data(), d.n, order.data() + k * 8, nb, ref.data(),
                     ref_y.data());
    EXPECT_EQ(std::memcmp(got.data(), ref.data(), ref.size() * 4), 0) << "batch " << k;
    EXPECT_EQ(got_y, ref_y) << "batch " << k;
  }
}
