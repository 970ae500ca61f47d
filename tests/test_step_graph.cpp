// The host side of the trainer's CUDA-graph step (app/train/step_graph.h): the step counters and
// their advance, the gather that finds its batch from the counter, the optimizer reading lr and
// step from memory, and the switch. On the CPU the trainer runs these same counters eagerly, so the
// end-to-end tests cover them too.
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <vector>

#include "app/config/config.h"
#include "app/train/batch_source.h"
#include "app/train/step_graph.h"
#include "runtime/graph_overlap.h"
#include "app/train/trainer.h"
#include "data/gather.h"
#include "kernels/optimizer/optimizer.h"
#include "layers/checkpoint/safetensors.h"
#include "runtime/error.h"
#include "tests/test_util.h"

using namespace cnn;
namespace fs = std::filesystem;

namespace {

bool same_bits(float a, float b) {
  return std::memcmp(&a, &b, sizeof(float)) == 0;
}

}  // namespace

TEST(StepGraph, AdvanceStepsBatchUpdateAndLr) {
  const std::vector<float> table = {0.5f, 0.25f, 0.125f};
  StepCounters c;
  c.batch = 0;
  c.update = 7;
  c.lr = table[0];
  for (int64_t k = 1; k <= 3; ++k) {
    advance_step_counters(&c, table.data(), int64_t(table.size()), Exec{});
    EXPECT_EQ(c.batch, k);
    EXPECT_EQ(c.update, 7 + k);
    EXPECT_EQ(c.lr, table[size_t(std::min<int64_t>(k, 2))]);  // past the table: kept
  }
  EXPECT_THROW(advance_step_counters(nullptr, table.data(), 3, Exec{}), Error);
  EXPECT_THROW(advance_step_counters(&c, nullptr, 3, Exec{}), Error);
}

// StepState: the upload at an epoch start (also a resume inside it) and the advance, read back
// through its own pointers (host memory on the CPU).
TEST(StepGraph, StepStateFollowsTheEpoch) {
  Exec ex;
  StepState st(ex, 5);
  const std::vector<double> lrs = {0.1, 0.2, 0.30000000000000004, 0.4, 0.5};
  st.start_epoch(lrs, 2, 13);  // resumed at batch 2, update 13
  EXPECT_EQ(*st.batch(), 2);
  EXPECT_EQ(*st.update(), 13);
  EXPECT_TRUE(same_bits(*st.lr(), static_cast<float>(lrs[2])));
  EXPECT_EQ(st.lr_at(2), lrs[2]);
  for (int k = 3; k < 5; ++k) {
    st.advance();
    EXPECT_EQ(*st.batch(), k);
    EXPECT_EQ(*st.update(), 13 + k - 2);
    EXPECT_TRUE(same_bits(*st.lr(), static_cast<float>(lrs[size_t(k)])));
  }
  st.advance();  // after the last (partial) batch: nothing reads lr until the next epoch
  EXPECT_EQ(*st.batch(), 5);
  st.start_epoch(lrs, 0, 16);
  EXPECT_EQ(*st.batch(), 0);
  EXPECT_EQ(*st.update(), 16);
  EXPECT_THROW(st.start_epoch(std::vector<double>(6, 0.1), 0, 1), Error);  // longer than spe
  EXPECT_THROW(st.start_epoch(lrs, 0, 0), Error);                          // update is 1-based
}

// The gather with a batch counter takes indices + counter * stride, bitwise as the plain one,
// and refuses a batch past the order.
TEST(StepGraph, GatherReadsItsBatchFromTheCounter) {
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  Dataset d = test::random_dataset(23, 2, 5, 7, 3, seed);
  Normalization norm{{0.2f, 0.4f}, {0.3f, 0.25f}};
  AugmentOptions aug;
  aug.shift = 2;
  aug.flip = true;
  GatherParams p = make_gather_params(2, 5, 7, norm, &aug, seed, 3);
  std::vector<int32_t> order(23);
  for (int i = 0; i < 23; ++i) order[size_t(i)] = (i * 7 + 3) % 23;
  const int batch = 5;
  const size_t sz = d.image_size();
  for (int64_t k = 0; k < 5; ++k) {
    const int n = int(std::min<int64_t>(batch, 23 - k * batch));
    std::vector<float> x0(size_t(n) * sz, NAN), x1(size_t(n) * sz, NAN);
    std::vector<int32_t> y0(size_t(n), -7), y1(size_t(n), -7);
    gather_batch_cpu(p, d.images.data(), d.labels.data(), d.n, order.data() + k * batch, n,
                     x0.data(), y0.data());
    GatherParams q = p;
    q.batch_ptr = &k;
    q.batch_stride = batch;
    gather_batch_cpu(q, d.images.data(), d.labels.data(), d.n, order.data(), n, x1.data(),
                     y1.data());
    EXPECT_EQ(std::memcmp(x0.data(), x1.data(), x0.size() * sizeof(float)), 0) << "batch " << k;
    EXPECT_EQ(y0, y1) << "batch " << k;
  }
  GatherParams q = p;
  int64_t past = 4;  // entries 20..24 of 23
  q.batch_ptr = &past;
  q.batch_stride = batch;
  std::vector<float> x(batch * sz);
  std::vector<int32_t> y(batch);
  EXPECT_THROW(gather_batch_cpu(q, d.images.data(), d.labels.data(), d.n, order.data(), batch,
                                x.data(), y.data()),
               Error);
}

// A BatchSource driven by the step counters gives the batches of a plain one: shuffled epochs,
// a partial last batch, a start inside an epoch.
TEST(StepGraph, CountedBatchSourceEqualsPlain) {
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  Dataset d = test::random_dataset(53, 1, 6, 6, 4, seed);
  Normalization norm{{0.5f}, {0.25f}};
  AugmentOptions aug;
  aug.shift = 1;
  Exec ex;
  const int batch = 8;
  BatchSource plain(d, norm, &aug, seed, batch, true, false, ex);
  BatchSource counted(d, norm, &aug, seed, batch, true, false, ex);
  StepState st(ex, counted.batches_per_epoch());
  counted.use_batch_counter(st.batch());
  const std::vector<double> lrs(size_t(counted.batches_per_epoch()), 0.1);
  const size_t sz = d.image_size();
  for (int64_t epoch = 0; epoch < 3; ++epoch) {
    const int64_t start = epoch == 1 ? 3 : 0;
    plain.start_epoch(epoch, start);
    counted.start_epoch(epoch, start);
    st.start_epoch(lrs, counted.position(), 1);
    int n0 = 0, n1 = 0, batches = 0;
    while (plain.next(&n0)) {
      ASSERT_TRUE(counted.take(&n1));
      ASSERT_EQ(n0, n1);
      counted.gather(n1);
      st.advance();
      EXPECT_EQ(std::memcmp(plain.x(), counted.x(), size_t(n0) * sz * sizeof(float)), 0)
          << "epoch " << epoch << " batch " << batches;
      EXPECT_EQ(std::memcmp(plain.labels(), counted.labels(), size_t(n0) * sizeof(int32_t)), 0);
      ++batches;
    }
    EXPECT_FALSE(counted.take(&n1));
    EXPECT_EQ(batches, 7 - start);  // 53 = 6 * 8 + 5
  }
}

// lr (and Adam's step) read from memory give the by-value update bitwise.
TEST(StepGraph, OptimizerReadsLrAndStepFromMemory) {
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  const size_t n = 37;
  const std::vector<float> w0 = test::random_vector(n, seed), g0 = test::random_vector(n, seed + 1);
  const std::vector<float> m0 = test::random_vector(n, seed + 2);
  const std::vector<float> v0 = test::random_vector(n, seed + 3, 0.f, 1.f);
  const float lr = 0.0371f;
  const int64_t step = 9;
  {
    SgdParams p;
    p.lr = lr;
    p.momentum = 0.9f;
    p.weight_decay = 1e-3f;
    std::vector<float> wa = w0, ga = g0, ma = m0, wb = w0, gb = g0, mb = m0;
    sgd_update(int64_t(n), wa.data(), ga.data(), ma.data(), nullptr, p, 0.5f, Exec{});
    SgdParams q = p;
    q.lr = 123.f;  // ignored: lr comes from memory
    sgd_update(int64_t(n), wb.data(), gb.data(), mb.data(), nullptr, q, 0.5f, Exec{}, &lr);
    EXPECT_EQ(std::memcmp(wa.data(), wb.data(), n * 4), 0);
    EXPECT_EQ(std::memcmp(ma.data(), mb.data(), n * 4), 0);
  }
  for (bool decoupled : {false, true}) {
    AdamParams p;
    p.lr = lr;
    p.step = step;
    p.weight_decay = 0.01f;
    p.decoupled = decoupled;
    std::vector<float> wa = w0, ga = g0, ma = m0, va = v0, wb = w0, gb = g0, mb = m0, vb = v0;
    adam_update(int64_t(n), wa.data(), ga.data(), ma.data(), va.data(), nullptr, p, 1.f, Exec{});
    AdamParams q = p;
    q.lr = 5.f;
    q.step = 0;  // ignored: the step comes from memory
    adam_update(int64_t(n), wb.data(), gb.data(), mb.data(), vb.data(), nullptr, q, 1.f, Exec{},
                &lr, &step);
    EXPECT_EQ(std::memcmp(wa.data(), wb.data(), n * 4), 0) << "decoupled " << decoupled;
    EXPECT_EQ(std::memcmp(ma.data(), mb.data(), n * 4), 0);
    EXPECT_EQ(std::memcmp(va.data(), vb.data(), n * 4), 0);
  }
  const float negative = -1.f;
  const int64_t zero = 0;
  std::vector<float> w = w0, g = g0, m = m0, v = v0;
  EXPECT_THROW(sgd_update(int64_t(n), w.data(), g.data(), m.data(), nullptr, SgdParams{}, 1.f,
                          Exec{}, &negative),
               Error);
  EXPECT_THROW(adam_update(int64_t(n), w.data(), g.data(), m.data(), v.data(), nullptr,
                           AdamParams{}, 1.f, Exec{}, &lr, &zero),
               Error);
}

TEST(StepGraph, SwitchAndReasons) {
  EXPECT_NE(cuda_graph_off_reason(Device::CPU, true, false), "");
  EXPECT_EQ(cuda_graph_off_reason(Device::CUDA, false, false), "training.cuda_graph is false");
  EXPECT_NE(cuda_graph_off_reason(Device::CUDA, true, true).find("clip_grad_norm"),
            std::string::npos);
  ::setenv("CNN_CUDA_GRAPH", "0", 1);
  EXPECT_EQ(cuda_graph_off_reason(Device::CUDA, true, false), "CNN_CUDA_GRAPH=0");
  ::unsetenv("CNN_CUDA_GRAPH");

  // Disabled (the CPU): every step runs its launches directly.
  StepGraph g(Exec{}, false);
  int runs = 0;
  for (int i = 0; i < 3; ++i) g.run([&] { ++runs; }, true);
  EXPECT_EQ(runs, 3);
  EXPECT_FALSE(g.replaying());
  bool warning = true;
  EXPECT_EQ(g.take_news(&warning), "");
  EXPECT_THROW(StepGraph(Exec{}, true), Error);  // a graph needs CUDA
}

TEST(StepGraph, ConfigKey) {
  const std::string yaml =
      "model:\n  input: {channels: 1, height: 8, width: 8}\n  layers:\n"
      "    - conv2d: {out_channels: 4, kernel: 3, padding: 1}\n    - relu\n"
      "    - maxpool2d: {kernel: 2}\n    - flatten\n    - linear: {out_features: 3}\n"
      "    - softmax_cross_entropy\n"
      "data:\n  format: synthetic\n  classes: [a, b, c]\n"
      "  synthetic: {train: 10, test: 5, classes: 3}\n"
      "  normalize: {mean: [0.5], std: [0.25]}\n"
      "optimizer:\n  lr: 0.1\ntraining:\n  epochs: 2\n  batch_size: 4\n";
  TrainConfig c = parse_config(yaml, "g.yaml");
  EXPECT_TRUE(c.training.cuda_graph);
  EXPECT_FALSE(parse_config(yaml, "g.yaml", {"training.cuda_graph=false"}).training.cuda_graph);
  // The resolved YAML carries it and reads back.
  EXPECT_NE(c.resolved_yaml.find("cuda_graph: true"), std::string::npos);
  TrainConfig back = parse_config(
      config_to_yaml(parse_config(yaml, "g.yaml", {"training.cuda_graph=false"})), "g.yaml");
  EXPECT_FALSE(back.training.cuda_graph);
  try {
    parse_config(yaml, "g.yaml", {"training.cuda_graph=sometimes"});
    FAIL() << "a non-boolean cuda_graph was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("cuda_graph"), std::string::npos) << e.what();
  }
}

// On the CPU the switch changes nothing: both runs are the same eager steps, bitwise (a partial
// last batch included: 1024 = 21 * 48 + 16), and the log says why there is no graph.
TEST(StepGraph, CpuTrainingLogsTheGraphOff) {
  const fs::path dir = fs::temp_directory_path() / ("cnn_step_graph_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  std::vector<std::string> sets = {"training.device=cpu", "logging.progress=off",
                                   "training.batch_size=48", "training.max_steps=25"};
  TrainConfig on = load_config(std::string(CNN_SOURCE_DIR) + "/configs/tiny.yaml", sets);
  sets.push_back("training.cuda_graph=false");
  TrainConfig off = load_config(std::string(CNN_SOURCE_DIR) + "/configs/tiny.yaml", sets);
  TrainArgs a, b;
  a.log_dir = (dir / "on").string();
  b.log_dir = (dir / "off").string();
  ASSERT_EQ(run_training(on, a), 0);
  ASSERT_EQ(run_training(off, b), 0);
  SafetensorsFile fa = read_safetensors((dir / "on" / "last.safetensors").string());
  SafetensorsFile fb = read_safetensors((dir / "off" / "last.safetensors").string());
  ASSERT_EQ(fa.entries().size(), fb.entries().size());
  for (const auto& e : fa.entries()) {
    const std::vector<float> x = fa.tensor_f32(e.name).data, y = fb.tensor_f32(e.name).data;
    ASSERT_EQ(x.size(), y.size()) << e.name;
    EXPECT_EQ(std::memcmp(x.data(), y.data(), x.size() * 4), 0) << e.name;
  }
  std::ifstream in(dir / "on" / "train.log");
  std::stringstream ss;
  ss << in.rdbuf();
  EXPECT_NE(ss.str().find("CUDA graph: off (the CPU runs each step directly)"), std::string::npos)
      << ss.str();
  fs::remove_all(dir);
}

// Only the project's kernels (namespace cnn, each starting with ptx::griddep_enter) get
// programmatic in-edges; a library kernel (cuDNN's, CUB's) keeps its full dependency.
TEST(GraphOverlap, ProjectKernelNames) {
  EXPECT_TRUE(cnn::is_project_kernel_name("_ZN3cnn12_GLOBAL__N_113relu_backwardEPKfS2_Pfl"));
  EXPECT_TRUE(cnn::is_project_kernel_name("_ZN3cnn16wgrad_ktile_kernelILi1EEEvNS_8WgParamsE"));
  EXPECT_TRUE(cnn::is_project_kernel_name("void cnn::(anonymous namespace)::k<1>(int)"));
  EXPECT_TRUE(cnn::is_project_kernel_name("cnn::k(int)"));
  EXPECT_FALSE(cnn::is_project_kernel_name("_ZN3cub6detail6reduce6kernelEv"));
  EXPECT_FALSE(cnn::is_project_kernel_name("sm90_xmma_fprop_implicit_gemm_tf32f32"));
  EXPECT_FALSE(cnn::is_project_kernel_name("_ZN4cnnx1kEv"));
  EXPECT_FALSE(cnn::is_project_kernel_name(""));
}
