#pragma once
// Numerical gradient checks: central differences of the double-precision RefNetwork's loss
// against (a) its own analytic backward in double on the CPU and (b) the float Network's
// backward on any device (the GPU included).
#include <memory>
#include <string>
#include <vector>

#include "layers/layer_spec.h"
#include "runtime/exec.h"

namespace cnn {

struct GradcheckRow {
  std::string what;  // "conv1.weight", "input", ...
  int64_t checked = 0;
  double rel_error = 0;  // ||analytic - numerical|| / max(||analytic||, ||numerical||)
};

struct GradcheckResult {
  std::string title;
  std::vector<GradcheckRow> rows;
  double worst = 0, tolerance = 0;
  bool passed() const { return worst < tolerance; }
};

struct GradcheckOptions {
  int batch = 2;
  uint64_t seed = 1;
  int samples_per_tensor = 24;  // coordinates checked per parameter tensor (all when fewer)
  double step = 1e-6;           // central-difference step (double precision)
  double label_smoothing = 0;   // of the loss, as NetworkOptions::label_smoothing
  // Each tensor's error is relative to the larger of its analytic and numerical gradients' norms;
  // a floor > 0 raises that denominator to at least floor x (the largest per-coordinate RMS
  // numerical gradient of any parameter tensor) x sqrt(coordinates checked). BF16 rounds each
  // term of a gradient sum by ~2^-8, so a tensor whose gradient cancels to far below its terms
  // (a bias feeding a softmax head, whose gradient sums to zero over the classes) carries an
  // error far above its own size but not above the network's; 0 (FP32, TF32) keeps the plain
  // relative error.
  double denominator_floor = 0;
};

// One case's sampled coordinates and their central differences. Each difference costs two double
// forward passes of the whole network, which is the whole cost of a check, so they are computed
// once (in parallel over the coordinates, on cpu_thread_count() threads) and shared by every
// check of the case: the double reference, the float network, its deterministic run.
class Gradchecker {
 public:
  Gradchecker(const std::vector<LayerSpec>& specs, const Shape& input_chw,
              const GradcheckOptions& opt);
  ~Gradchecker();
  Gradchecker(const Gradchecker&) = delete;
  Gradchecker& operator=(const Gradchecker&) = delete;

  int batch() const;  // opt.batch, raised to 6 for batchnorm1d
  // Analytic double backward vs numerical, on the CPU. Tolerance 1e-6.
  GradcheckResult reference();
  // Float Network on ex.device at ex.precision vs numerical, within
  // gradcheck_network_tolerance(ex.precision).
  GradcheckResult network(const Exec& ex, bool fuse_relu);
  // Any analytic parameter gradient (flat, in the network's layout) vs numerical: what the two
  // above do, open to tests that hand in a wrong gradient.
  GradcheckResult parameters(const std::string& title, const std::vector<double>& analytic,
                             double tolerance);
  // The reference's analytic parameter gradient, to start such a test from.
  std::vector<double> reference_parameter_gradient() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Analytic double backward vs numerical, on the CPU. Tolerance 1e-6.
GradcheckResult gradcheck_reference(const std::vector<LayerSpec>& specs, const Shape& input_chw,
                                    const GradcheckOptions& opt);
// Float Network on ex.device (fused ReLU as configured) at ex.precision vs the double
// numerical gradient, within gradcheck_network_tolerance(ex.precision).
GradcheckResult gradcheck_network(const std::vector<LayerSpec>& specs, const Shape& input_chw,
                                  const GradcheckOptions& opt, const Exec& ex, bool fuse_relu);

// One small network per layer kind and configuration (stride, padding, rectangular kernels,
// overlapping pools), each wrapped so that its input and parameter gradients both matter:
// [conv 1x1 prefix] + layer + [flatten] + linear(5) + softmax_cross_entropy.
struct GradcheckCase {
  std::string title;
  std::vector<LayerSpec> specs;
  Shape input_chw;
};
std::vector<GradcheckCase> gradcheck_layer_cases();
// 1e-2 for FP32 and TF32, 1e-1 for BF16 (the derivation is at the definition).
double gradcheck_network_tolerance(Precision p);
// The whole small network of the issue: conv-relu-pool-conv-relu-pool-linear-relu-linear-softmax.
GradcheckCase gradcheck_small_network_case();

std::string format_gradcheck(const GradcheckResult& r);

}  // namespace cnn
