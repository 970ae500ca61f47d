#pragma once
// Helpers shared by the tests: seeded random data, NaN poisoning, error measures, GPU skips.
#include <gtest/gtest.h>

#include <cstdint>
#include <filesystem>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "data/dataset.h"
#include "kernels/conv/conv2d.h"
#include "layers/layer_spec.h"
#include "layers/network.h"
#include "layers/optim_options.h"
#include "runtime/device.h"
#include "runtime/exec.h"
#include "runtime/memory.h"
#include "runtime/tensor.h"

namespace cnn::test {

// Whether this build has the CUDA code (the answers of host predicates that need it).
#ifdef CNN_HAVE_CUDA
constexpr bool kCudaBuild = true;
#else
constexpr bool kCudaBuild = false;
#endif

// A fresh seed per call (time-based, printed by the test on failure through SCOPED_TRACE) unless
// CNN_TEST_SEED is set, so a failure can be replayed.
uint64_t fresh_seed();
// The batch of the reference-network shape cases: 128, or CNN_TEST_NETWORK_BATCH. The
// compute-sanitizer runs (scripts/gpu_check.sh --sanitize) set a small one, so that those cases
// finish under racecheck's ~40x slowdown; every kernel path still runs.
int network_batch();
// n random uint8 images (N, C, H, W) with labels in [0, classes) and class names "0".."classes-1".
Dataset random_dataset(int n, int c, int h, int w, int classes, uint64_t seed);
// True when CNN_TEST_NETWORK_BATCH is set (the sanitizer runs): the long shape sweeps then run a
// smaller sample of their shapes, each code path still covered.
bool light_sweeps();

std::vector<float> random_vector(size_t n, uint64_t seed, float lo = -1.f, float hi = 1.f);
// n values from `seed`: uniform in [-1, 1) (Random) or integers in [-2, 2] (SmallInt: exact in
// TF32 and BF16 products, so a mismatch is an addressing error, not rounding).
enum class Fill { Random, SmallInt };
std::vector<float> make_values(size_t n, Fill fill, uint64_t seed);
std::vector<int32_t> random_labels(size_t n, int classes, uint64_t seed);

// Device buffers filled from / read back to host vectors.
Tensor to_device(const std::vector<float>& v);
std::vector<float> to_host(const float* d_ptr, size_t n);
void poison_device(float* d_ptr, size_t n);  // fills with NaN

// max_i |a-b| / (atol_scale + |b|): relative error with a floor so near-zero values do not explode.
double max_rel_error(const std::vector<float>& got, const std::vector<float>& ref,
                     double floor = 1e-3);
bool any_nan(const std::vector<float>& v);

// The repository root: CNN_SOURCE_DIR from the environment when set (the GPU machine runs
// binaries built elsewhere), else the source tree they were built from.
std::string source_dir();
// An empty folder <tmp>/cnn_<prefix>_<name>_<pid>, removed first if it exists.
std::filesystem::path fresh_dir(const std::string& prefix, const std::string& name);

// Every FP32 tensor of a safetensors checkpoint, concatenated in file order (for comparing two
// runs' weights bitwise).
std::vector<float> checkpoint_weights(const std::filesystem::path& ckpt);
// A whole file as bytes ("" when it cannot be read).
std::string slurp(const std::filesystem::path& p);
inline bool contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

// A one-input-channel conv shape: N images of H x W, OC square K x K filters, stride 1, padding
// pad on every side (the first layer's case, as the fused conv-relu-pool takes it).
// conv-bn-relu-avgpool-conv(no bias)-bn-relu-global_avgpool-flatten-linear-bn1d-relu-dropout-
// linear-loss: every normalization-era layer kind, and both BatchNorm fold cases (conv with and
// without bias, linear); three classes.
std::vector<LayerSpec> norm_net();

// One conv layer checked through a small net: a prefix conv of prefix_channels (prefix_kernel
// square, "same" padding; so that the layer's input gradient is needed), the layer, relu,
// flatten, a 5-class linear head and the loss.
std::vector<LayerSpec> conv_in_small_net(const LayerSpec& conv, int prefix_channels,
                                         int prefix_kernel = 1);

// The net with its kinks taken out: no ReLU, average instead of max pooling, inside blocks too.
// At reduced precision (TF32, BF16) a layer's outputs move by the rounding, and wherever a ReLU
// input or a max-pool runner-up lies that close to its kink two computations take different
// linear pieces, a difference no tolerance bounds (tests/gpu_bf16.cpp measured it); the smooth
// nets run the same convolution, linear, normalization and residual passes and leave only the
// rounding.
std::vector<LayerSpec> smooth_specs(const std::vector<LayerSpec>& specs);

// A k x k convolution of x (n, c, h, w) to oc channels with one stride and padding for both axes.
Conv2dShape square_conv(int n, int c, int h, int w, int oc, int k, int stride, int pad);
Conv2dShape one_channel_conv(int n, int oc, int h, int w, int k, int pad);

// Sets (value null: unsets) an environment variable for one scope, then restores what was there.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value);
  ~ScopedEnv();
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  std::string name_, old_;
  bool had_ = false;
};

// What one Network built from specs with options o on ex's device gives after `steps` training
// steps on n random images and labels drawn from o.seed (the same batch each step; o.max_batch
// above n makes it a partial one), then an eval forward of the same batch: logits, per-row losses,
// gradients, buffers and the eval logits on the host, the fusion notes, and whether it fused a
// conv-relu-pool; for comparing two option sets bit for bit. inspect (may be empty) sees the
// network last.
struct NetworkRun {
  std::vector<float> logits, loss, grads, buffers, eval_logits;
  std::vector<std::string> notes;
  bool fused = false;
};
NetworkRun run_network(const std::vector<LayerSpec>& specs, const Shape& chw, const Exec& ex,
                       const NetworkOptions& o, int n, int steps,
                       const std::function<void(const Network&)>& inspect = {});
// One step with max_batch n + 2, the seed and the given conv-relu-pool fusion.
NetworkRun run_network_once(const std::vector<LayerSpec>& specs, const Shape& chw, const Exec& ex,
                            PoolFusion fusion, int n, uint64_t seed);

// What a Network built from specs with options o on ex's device gives over `steps` training steps
// as the trainer takes them (one forward_backward, then one ParamOptimizer update with opt.lr),
// on random batches from o.seed, every third one partial (o.max_batch - 3 images, at least 1):
// the parameters after each update, the gradients before and after the last update, and the
// parameters whose gradients backward writes (Network::overwritten_grad_ranges(), by name).
struct TrainRun {
  std::vector<std::vector<float>> params;
  std::vector<float> grads_before_update, grads_after_update;
  std::vector<std::pair<int64_t, int64_t>> overwritten;
  std::vector<std::string> overwritten_names;
};
TrainRun train_steps(const std::vector<LayerSpec>& specs, const Shape& chw, const Exec& ex,
                     const NetworkOptions& o, const OptimizerOptions& opt, int steps);
// Step s's batch as train_steps takes it, on `dev`: n images (N, C, H, W) and labels.
struct StepBatch {
  int n = 0;
  Buffer<float> x;
  Buffer<int32_t> labels;
};
StepBatch step_batch(const Shape& chw, int classes, const NetworkOptions& o, int s, Device dev);

// True when a config's parse error is only about a layer kind or key that lands from another
// branch (BatchNorm, grouped/dilated conv, pooling, dropout, label smoothing): the model zoo's
// configs use them, and their tests skip instead of failing until the build knows them.
bool pending_layer_error(const std::string& parse_error);

// True when a CUDA device is present. With CNN_REQUIRE_GPU=1 (set by scripts/gpu_check.sh on the
// GPU machine) a missing device is a failure instead of a skip.
bool gpu_present();

}  // namespace cnn::test

#define CNN_REQUIRE_GPU()                                              \
  do {                                                                 \
    if (!::cnn::test::gpu_present()) GTEST_SKIP() << "no CUDA device"; \
  } while (0)
