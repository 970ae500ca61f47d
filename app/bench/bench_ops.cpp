#include "app/bench/bench_ops.h"

namespace cnn::bench {

bool op_selected(const BenchOptions& opt, const std::string& op) {
  if (opt.ops.empty()) return true;
  for (const auto& f : opt.ops)
    if (op.find(f) != std::string::npos) return true;
  return false;
}

}  // namespace cnn::bench

#ifdef CNN_HAVE_CUDA

#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <limits>
#include <random>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "app/bench/bench_cudnn.h"
#include "app/bench/bench_depthwise.h"
#include "app/bench/bench_op_layers.h"
#include "app/bench/bench_timer.h"
#include "kernels/conv/conv2d.h"
#include "kernels/conv/conv2d_grouped.h"
#include "kernels/conv/conv2d_grouped_cuda.h"
#include "kernels/conv/conv2d_grouped_dense.h"
#include "kernels/conv/conv2d_grouped_narrow.h"
#include "kernels/conv/conv2d_halo_layout.h"
#include "kernels/conv/conv2d_nhwc_layout.h"
#include "kernels/conv/conv2d_nhwc_prepass.h"
#include "kernels/conv/conv2d_wgmma.h"
#include "kernels/conv/conv2d_wgmma_nhwc.h"
#include "kernels/conv/conv2d_wgmma_wgrad.h"
#include "kernels/conv/conv2d_wgmma_wgrad_nhwc.h"
#include "kernels/conv/conv2d_wgrad_box.h"
#include "kernels/conv/conv2d_wgrad_halo_layout.h"
#include "kernels/conv/conv_relu_pool.h"
#include "kernels/gemm/gemm_cuda.h"
#include "kernels/gemm/gemm_wgmma.h"
#include "kernels/gemm/linear.h"
#include "kernels/loss/softmax_xent.h"
#include "kernels/norm/batchnorm.h"
#include "kernels/norm/batchnorm_cuda.h"
#include "kernels/norm/batchnorm_one_pass_cuda.h"
#include "kernels/optimizer/optimizer.h"
#include "kernels/pointwise/relu.h"
#include "kernels/pool/maxpool.h"
#include "runtime/cuda_check.h"
#include "runtime/env_switches.h"
#include "runtime/error.h"
#include "runtime/memory.h"

namespace cnn::bench {

namespace {

// ---- random inputs and parallel references -------------------------------------------------

std::vector<float> random_floats(size_t n, std::mt19937_64& rng, float lo = -1.f, float hi = 1.f) {
  std::uniform_real_distribution<float> u(lo, hi);
  std::vector<float> v(n);
  for (auto& x : v) x = u(rng);
  return v;
}

std::vector<int32_t> random_labels(size_t n, int classes, std::mt19937_64& rng) {
  std::uniform_int_distribution<int32_t> u(0, classes - 1);
  std::vector<int32_t> v(n);
  for (auto& x : v) x = u(rng);
  return v;
}

uint64_t op_seed(uint64_t seed, const std::string& op) {
  return seed ^ (std::hash<std::string>{}(op)*0x9E3779B97F4A7C15ull);
}

struct Range {
  int64_t begin, count;
};

// Contiguous chunks of [0, n), one per core: the CPU references are plain loops, and the
// batch-128 convolutions would take seconds each on one core.
std::vector<Range> split(int64_t n) {
  const int64_t parts = std::min<int64_t>(std::max(1u, std::thread::hardware_concurrency()), n);
  std::vector<Range> out;
  for (int64_t i = 0; i < parts; ++i) {
    const int64_t b = n * i / parts, e = n * (i + 1) / parts;
    if (e > b) out.push_back({b, e - b});
  }
  return out;
}

void parallel(const std::vector<Range>& ranges, const std::function<void(size_t, Range)>& fn) {
  std::vector<std::thread> threads;
  for (size_t i = 0; i < ranges.size(); ++i) threads.emplace_back(fn, i, ranges[i]);
  for (auto& t : threads) t.join();
}

// ref = init + sum of per-chunk partial gradients (summed in double).
std::vector<float> add_partials(const std::vector<float>& init,
                                const std::vector<std::vector<float>>& parts) {
  std::vector<float> out(init.size());
  for (size_t i = 0; i < init.size(); ++i) {
    double acc = init[i];
    for (const auto& p : parts) acc += p[i];
    out[i] = static_cast<float>(acc);
  }
  return out;
}

// ---- device buffers in rotating sets, validation -------------------------------------------

struct Check {
  double err = 0;
  bool ok = true;
  std::string note;
};

// The buffers of one op, in `sets` identical copies at different addresses: timing rotates among
// them so that the working set exceeds L2 and the inputs come from device memory.
class OpData {
 public:
  int input(const std::string& name, std::vector<float> v) {
    Role r(name, v.size(), false, false);
    r.init_f = std::move(v);
    return add(std::move(r));
  }
  int input_i32(const std::string& name, std::vector<int32_t> v) {
    Role r(name, v.size(), true, false);
    r.init_i = std::move(v);
    return add(std::move(r));
  }
  // An output compared with `ref`. With `init` empty it is poisoned (all bits set: NaN, or -1 for
  // int32) before validation, so an element the op never writes shows; otherwise it starts from
  // init (accumulating and in-place ops).
  int output(const std::string& name, std::vector<float> ref, std::vector<float> init = {}) {
    Role r(name, ref.size(), false, true);
    r.ref_f = std::move(ref);
    r.init_f = std::move(init);
    return add(std::move(r));
  }
  int output_i32(const std::string& name, std::vector<int32_t> ref) {
    Role r(name, ref.size(), true, true);
    r.ref_i = std::move(ref);
    return add(std::move(r));
  }

  size_t set_bytes() const {
    size_t b = 0;
    for (const auto& r : roles_) b += r.count * 4;
    return b;
  }
  int sets() const { return sets_; }

  // Replaces an output's reference after allocate(): for large shapes the reference is a device
  // kernel's result (itself checked against the CPU twin in the GPU tests).
  void set_reference(int role, std::vector<float> ref) {
    Role& r = roles_.at(size_t(role));
    CNN_CHECK(r.output && !r.is_int && ref.size() == r.count,
              "bench: set_reference needs a float output of {} values", r.count);
    r.ref_f = std::move(ref);
  }
  // Runs launch(0) on set 0 from the outputs' initial state and returns one output.
  std::vector<float> run_and_read(const std::function<void(int)>& launch, int role,
                                  cudaStream_t stream) {
    for (size_t i = 0; i < roles_.size(); ++i)
      if (roles_[i].output) upload_init(roles_[i], slot(0, int(i)), stream);
    launch(0);
    CNN_CUDA_CHECK(cudaStreamSynchronize(stream));
    std::vector<float> got(roles_.at(size_t(role)).count);
    raw_copy(got.data(), Device::CPU, slot(0, role).data(), Device::CUDA, got.size() * 4);
    return got;
  }

  void allocate(int sets, cudaStream_t stream) {
    mem_.clear();
    sets_ = sets;
    for (int s = 0; s < sets; ++s)
      for (const auto& r : roles_) {
        mem_.emplace_back(r.count * 4, Device::CUDA);
        upload_init(r, mem_.back(), stream);
      }
    CNN_CUDA_CHECK(cudaStreamSynchronize(stream));
  }

  float* f(int set, int role) { return reinterpret_cast<float*>(slot(set, role).data()); }
  int32_t* i32(int set, int role) { return reinterpret_cast<int32_t*>(slot(set, role).data()); }

  // Resets set 0's outputs, runs launch(0) once and compares the outputs listed in `only` (all
  // when empty) with the reference.
  Check validate(const std::function<void(int)>& launch, cudaStream_t stream, double tol,
                 const std::vector<int>& only) {
    for (size_t i = 0; i < roles_.size(); ++i)
      if (roles_[i].output) upload_init(roles_[i], slot(0, int(i)), stream);
    launch(0);
    CNN_CUDA_CHECK(cudaStreamSynchronize(stream));
    Check c;
    for (size_t i = 0; i < roles_.size(); ++i) {
      const Role& r = roles_[i];
      if (!r.output) continue;
      if (!only.empty() && std::find(only.begin(), only.end(), int(i)) == only.end()) continue;
      if (r.is_int) {
        compare_ints(r, slot(0, int(i)), c);
      } else {
        compare_floats(r, slot(0, int(i)), c);
      }
    }
    if (c.err > tol) c.ok = false;
    if (!c.ok && c.note.empty())
      c.note = fmt::format("error {:.2e} exceeds the tolerance {:.0e}", c.err, tol);
    return c;
  }

 private:
  struct Role {
    Role(std::string n, size_t c, bool i, bool o)
        : name(std::move(n)), count(c), is_int(i), output(o) {}
    std::string name;
    size_t count = 0;
    bool is_int = false, output = false;
    std::vector<float> init_f, ref_f;
    std::vector<int32_t> init_i, ref_i;
  };

  int add(Role r) {
    CNN_CHECK(mem_.empty(), "bench: buffer roles must be declared before allocate()");
    roles_.push_back(std::move(r));
    return static_cast<int>(roles_.size()) - 1;
  }
  Buffer<unsigned char>& slot(int set, int role) {
    return mem_.at(static_cast<size_t>(set) * roles_.size() + static_cast<size_t>(role));
  }
  static void upload_init(const Role& r, Buffer<unsigned char>& b, cudaStream_t stream) {
    if (!r.init_f.empty()) {
      raw_copy(b.data(), Device::CUDA, r.init_f.data(), Device::CPU, b.bytes(), stream);
    } else if (!r.init_i.empty()) {
      raw_copy(b.data(), Device::CUDA, r.init_i.data(), Device::CPU, b.bytes(), stream);
    } else {
      CNN_CUDA_CHECK(cudaMemsetAsync(b.data(), 0xFF, b.bytes(), stream));
    }
  }
  static void compare_floats(const Role& r, const Buffer<unsigned char>& b, Check& c) {
    std::vector<float> got(r.count);
    raw_copy(got.data(), Device::CPU, b.data(), Device::CUDA, b.bytes());
    double max_ref = 0, max_diff = 0;
    size_t nonfinite = 0;
    for (size_t i = 0; i < r.count; ++i) {
      max_ref = std::max(max_ref, std::fabs(double(r.ref_f[i])));
      if (!std::isfinite(got[i])) {
        ++nonfinite;
        continue;
      }
      max_diff = std::max(max_diff, std::fabs(double(got[i]) - double(r.ref_f[i])));
    }
    const double err = nonfinite ? std::numeric_limits<double>::infinity()
                                 : max_diff / (max_ref > 0 ? max_ref : 1.0);
    c.err = std::max(c.err, err);
    if (nonfinite) {
      c.ok = false;
      c.note += fmt::format("{}: {} of {} values NaN/Inf (unwritten or overflow); ", r.name,
                            nonfinite, r.count);
    }
  }
  static void compare_ints(const Role& r, const Buffer<unsigned char>& b, Check& c) {
    std::vector<int32_t> got(r.count);
    raw_copy(got.data(), Device::CPU, b.data(), Device::CUDA, b.bytes());
    size_t diff = 0;
    for (size_t i = 0; i < r.count; ++i) diff += got[i] != r.ref_i[i];
    if (diff) {
      c.ok = false;
      c.note += fmt::format("{}: {} of {} differ; ", r.name, diff, r.count);
    }
  }

  std::vector<Role> roles_;
  std::vector<Buffer<unsigned char>> mem_;  // (sets, roles)
  int sets_ = 0;
};

// ---- measuring one candidate ----------------------------------------------------------------

struct OpInfo {
  std::string op, shape;
  double flops = 0, bytes = 0;
  bool compute_bound = true;
  std::string note;  // shown on every row of the op
};

struct Candidate {
  std::string variant;
  bool is_lib = false;
  std::function<void(int)> launch;  // one launch on input set i
  std::vector<int> check;           // outputs compared (empty: all)
  std::string note;
};

// After an exception: a sticky error (illegal address, ...) leaves the context unusable, and
// every later number would be garbage, so stop there; anything else was local to the call.
void ensure_device_usable(const std::string& what) {
  cudaGetLastError();
  const cudaError_t e = cudaDeviceSynchronize();
  if (e != cudaSuccess)
    CNN_FAIL("the GPU context is unusable after {}: {}; stopping the benchmark", what,
             cudaGetErrorString(e));
}

BenchRow base_row(const OpInfo& info, Precision p, const std::string& variant) {
  BenchRow r;
  r.section = "op";
  r.op = info.op;
  r.shape = info.shape;
  r.variant = variant;
  r.precision = precision_name(p);
  r.flops = info.flops;
  r.bytes = info.bytes;
  r.compute_bound = info.compute_bound;
  r.note = info.note;
  return r;
}

void append_note(BenchRow& r, const std::string& n) {
  if (n.empty()) return;
  r.note = r.note.empty() ? n : r.note + "; " + n;
}

int choose_sets(const BenchContext& ctx, size_t set_bytes) {
  const BenchOptions& opt = *ctx.opt;
  if (opt.rotate > 0) return opt.rotate;
  if (opt.rotate == 0 || set_bytes == 0) return 1;
  constexpr double kMaxFootprint = 4.0 * (1ull << 30);
  const double target = 2.0 * std::max(ctx.dev.l2_bytes, 1 << 20);
  double sets = std::ceil(target / double(set_bytes));
  sets = std::min({sets, 64.0, std::floor(kMaxFootprint / double(set_bytes))});
  return std::max(1, static_cast<int>(sets));
}

BenchRow measure(const BenchContext& ctx, OpData& d, const OpInfo& info, Precision p, double tol,
                 const Candidate& c, double lib_us) {
  BenchRow r = base_row(info, p, c.variant);
  append_note(r, c.note);
  const std::string what = info.op + " " + c.variant + " " + precision_name(p);
  try {
    const Check chk = d.validate(c.launch, ctx.stream, tol, c.check);
    r.err = chk.err;
    if (!chk.ok) {
      r.status = "WRONG";
      append_note(r, "not timed: " + chk.note);
      return r;
    }
  } catch (const std::exception& e) {
    ensure_device_usable(what);
    // A variant an op does not have is refused by its API ("n/a"); a failed launch is an error.
    const std::string msg = e.what();
    r.status = msg.find("CUDA error") != std::string::npos ? "error" : "n/a";
    append_note(r, msg);
    return r;
  }
  try {
    TimerOptions to;
    to.launches = std::max(ctx.opt->launches, d.sets());
    to.repeats = ctx.opt->repeats;
    to.warmup = ctx.opt->warmup;
    to.budget_s = ctx.opt->budget_s;
    const int sets = d.sets();
    const Timing t = time_launches(
        ctx.stream, [&](int i) { c.launch(i % sets); }, to);
    r.median_us = t.median_us;
    r.p95_us = t.p95_us;
    r.graph = t.graph;
    append_note(r, t.note);
    if (t.samples < to.repeats || t.launches < to.launches)
      append_note(r, fmt::format("time budget: {} samples of {} launch{}", t.samples, t.launches,
                                 t.launches == 1 ? "" : "es"));
  } catch (const std::exception& e) {
    ensure_device_usable(what);
    r.status = "error";
    append_note(r, e.what());
    return r;
  }
  r.status = "ok";
  fill_rate(r, p);
  if (!c.is_lib && std::isfinite(lib_us) && r.median_us > 0) {
    r.lib_us = lib_us;
    r.lib_over_ours = lib_us / r.median_us;
  }
  return r;
}

// "cudnn FFT_TILING (fma math); ..." -> "FFT_TILING": the algorithm's name in a description.
std::string algo_label(const std::string& desc) {
  const size_t start = desc.find(' ');
  const std::string rest = start == std::string::npos ? desc : desc.substr(start + 1);
  return rest.substr(0, rest.find(" ("));
}

// Prepares and measures the library call (a row either way); returns its median or NaN.
double measure_lib(const BenchContext& ctx, std::vector<BenchRow>& rows, OpData& d,
                   const OpInfo& info, Precision p, double tol, const char* lib_name,
                   bool available, const std::function<std::unique_ptr<LibOp>()>& make,
                   const std::function<LibArgs(int)>& args, const std::vector<int>& check = {}) {
  if (!ctx.lib || !available) return kNaN;
  std::unique_ptr<LibOp> op;
  try {
    op = make();
  } catch (const std::exception& e) {
    ensure_device_usable(info.op + " " + lib_name + " set-up");
    BenchRow r = base_row(info, p, lib_name);
    r.status = "error";
    append_note(r, e.what());
    rows.push_back(r);
    return kNaN;
  }
  // Every algorithm the call offers is checked and timed like our variants; the row is the
  // fastest correct one, its note listing the others ("also timed: FFT 80.1 us, ALGO_1 WRONG").
  // With lib_retime_within > 0, algorithms the library's own search timed at more than that
  // many times its fastest are only listed, unless none of the others is correct.
  LibOp* raw = op.get();
  std::vector<BenchRow> tried;
  std::vector<std::string> labels;
  const auto time_algo = [&](int a) {
    raw->use_algo(a);
    const std::string desc = raw->describe();
    Candidate c{lib_name, true, [raw, &args](int i) { raw->run(args(i)); }, check, desc};
    tried.push_back(measure(ctx, d, info, p, tol, c, kNaN));
    labels.push_back(algo_label(desc));
  };
  double fastest_find = kNaN;
  for (int a = 0; a < raw->algo_count(); ++a) {
    const double f = raw->find_us(a);
    if (std::isfinite(f) && (!std::isfinite(fastest_find) || f < fastest_find)) fastest_find = f;
  }
  const double within = ctx.opt->lib_retime_within;
  const auto far_behind = [&](int a) {
    return within > 0 && std::isfinite(raw->find_us(a)) && raw->find_us(a) > within * fastest_find;
  };
  std::vector<int> listed;
  for (int a = 0; a < raw->algo_count(); ++a) {
    if (far_behind(a))
      listed.push_back(a);
    else
      time_algo(a);
  }
  const bool any_ok =
      std::any_of(tried.begin(), tried.end(), [](const BenchRow& t) { return t.status == "ok"; });
  std::string not_retimed;
  for (int a : listed) {
    if (!any_ok) {
      time_algo(a);
      continue;
    }
    raw->use_algo(a);
    not_retimed += fmt::format("{}{} {:.1f} us", not_retimed.empty() ? "" : ", ",
                               algo_label(raw->describe()), raw->find_us(a));
  }
  size_t best = 0;
  for (size_t i = 1; i < tried.size(); ++i) {
    if (tried[i].status == "ok" &&
        (tried[best].status != "ok" || tried[i].median_us < tried[best].median_us))
      best = i;
  }
  std::string others;
  for (size_t i = 0; i < tried.size(); ++i) {
    if (i == best) continue;
    const std::string t =
        tried[i].status == "ok" ? fmt::format("{:.1f} us", tried[i].median_us) : tried[i].status;
    others += fmt::format("{}{} {}", others.empty() ? "" : ", ", labels[i], t);
  }
  BenchRow r = tried.at(best);
  if (!others.empty()) append_note(r, "also timed: " + others);
  if (!not_retimed.empty())
    append_note(
        r, fmt::format("not re-timed, by Find over {:g}x its fastest: {}", within, not_retimed));
  rows.push_back(r);
  return r.status == "ok" ? r.median_us : kNaN;
}

double matmul_tol(Precision p) {
  return p == Precision::FP32 ? kTolFp32 : p == Precision::TF32 ? kTolTf32 : kTolBf16;
}

Exec exec_for(const BenchContext& ctx, Precision p) {
  Exec ex;
  ex.device = Device::CUDA;
  ex.stream = ctx.stream;
  ex.precision = p;
  ex.deterministic = ctx.opt->deterministic;
  return ex;
}

// The three passes of a layer that maps x (N, x_per) through nw weights to y (N, y_per): conv,
// grouped conv and linear.
struct PassTensors {
  int a = 0, b = 0,
      out = 0;  // OpData indices: forward x, w -> y; data dy, w -> dx; weight x, dy -> dw
};

// Random inputs for `pass` and their CPU reference, computed in batch chunks on every core:
// forward(r, x, w, y), backward_data(r, dy, w, dx), backward_weight(r, x, dy, dw) compute the
// images of r, their pointers already offset to r. The weight gradient adds the chunks' partial
// sums to random initial values. Sets info.bytes; the random draws come in a fixed order, so a
// seed gives the same data every time. cpu_reference = false skips the reference (large shapes,
// checked against a device kernel instead): the output holds zeros (the weight gradient: its
// initial values).
template <class Forward, class BackwardData, class BackwardWeight>
PassTensors layer_pass_data(Pass pass, std::mt19937_64& rng, int64_t n, int64_t x_per,
                            int64_t y_per, size_t nw, OpData& d, OpInfo& info, Forward forward,
                            BackwardData backward_data, BackwardWeight backward_weight,
                            bool cpu_reference = true) {
  const size_t nx = size_t(n * x_per), ny = size_t(n * y_per);
  const std::vector<Range> chunks = split(n);
  PassTensors t;
  if (pass == Pass::Forward) {
    std::vector<float> x = random_floats(nx, rng), w = random_floats(nw, rng), y(ny);
    if (cpu_reference)
      parallel(chunks, [&](size_t, Range r) {
        forward(r, x.data() + r.begin * x_per, w.data(), y.data() + r.begin * y_per);
      });
    t.a = d.input("x", std::move(x));
    t.b = d.input("w", std::move(w));
    t.out = d.output("y", std::move(y));
    info.bytes = 4.0 * double(nx + nw + ny);
  } else if (pass == Pass::BackwardData) {
    std::vector<float> dy = random_floats(ny, rng), w = random_floats(nw, rng), dx(nx);
    if (cpu_reference)
      parallel(chunks, [&](size_t, Range r) {
        backward_data(r, dy.data() + r.begin * y_per, w.data(), dx.data() + r.begin * x_per);
      });
    t.a = d.input("dy", std::move(dy));
    t.b = d.input("w", std::move(w));
    t.out = d.output("dx", std::move(dx));
    info.bytes = 4.0 * double(ny + nw + nx);
  } else {
    std::vector<float> x = random_floats(nx, rng), dy = random_floats(ny, rng);
    std::vector<float> init = random_floats(nw, rng);
    std::vector<std::vector<float>> parts(cpu_reference ? chunks.size() : 0,
                                          std::vector<float>(nw, 0.f));
    if (cpu_reference)
      parallel(chunks, [&](size_t i, Range r) {
        backward_weight(r, x.data() + r.begin * x_per, dy.data() + r.begin * y_per,
                        parts[i].data());
      });
    std::vector<float> ref = add_partials(init, parts);
    t.a = d.input("x", std::move(x));
    t.b = d.input("dy", std::move(dy));
    t.out = d.output("dw", std::move(ref), std::move(init));
    info.bytes = 4.0 * double(nx + ny + 2 * nw);
  }
  return t;
}

// ---- convolution ------------------------------------------------------------------------------

std::string conv_shape_str(const Conv2dShape& s) {
  std::string out = fmt::format("{}x{}x{}x{} -> {} k{}x{}", s.n, s.c, s.h, s.w, s.oc, s.kh, s.kw);
  if (s.stride_h != 1 || s.stride_w != 1)
    out += s.stride_h == s.stride_w ? fmt::format(" s{}", s.stride_h)
                                    : fmt::format(" s{}x{}", s.stride_h, s.stride_w);
  if (s.pad_h || s.pad_w)
    out += s.pad_h == s.pad_w ? fmt::format(" p{}", s.pad_h)
                              : fmt::format(" p{}x{}", s.pad_h, s.pad_w);
  return out;
}

// What the boxed weight gradient's B reads: x itself (1x1), or the copies of x the pre-pass
// writes, one fewer where the direct class reads x (the bench's x is 16-byte aligned).
std::string copies_note(const WgradBoxGeometry& g, bool direct) {
  if (g.reads_x) return "x itself";
  const int written = g.copies - (direct && g.direct_copy >= 0 ? 1 : 0);
  return fmt::format("{} of {} copies of x written{}, {:.1f} MB", written, g.copies,
                     written < g.copies ? " (one class reads x)" : "",
                     double(g.copy_floats) / g.copies * written * 4 / 1e6);
}

void bench_conv(const BenchContext& ctx, std::vector<BenchRow>& rows, const std::string& name,
                const Conv2dShape& s, bool first_layer) {
  const BenchOptions& opt = *ctx.opt;
  const int64_t chw = int64_t(s.c) * s.h * s.w, ohw = int64_t(s.oh()) * s.ow();
  const size_t nw = size_t(int64_t(s.oc) * s.c * s.kh * s.kw);
  const double flops = 2.0 * double(s.n) * s.oc * double(ohw) * s.c * s.kh * s.kw;
  auto sub = [&](Range r) {
    Conv2dShape t = s;
    t.n = static_cast<int>(r.count);
    return t;
  };

  for (Pass pass : {Pass::Forward, Pass::BackwardData, Pass::BackwardWeight}) {
    OpInfo info;
    info.op = name + "." + pass_name(pass);
    if (!op_selected(opt, info.op)) continue;
    info.shape = conv_shape_str(s);
    info.flops = flops;
    std::mt19937_64 rng(op_seed(opt.seed, info.op));
    OpData d;
    const PassTensors t = layer_pass_data(
        pass, rng, s.n, chw, s.oc * ohw, nw, d, info,
        [&](Range r, const float* x, const float* w, float* y) {
          conv2d_forward_cpu(sub(r), x, w, nullptr, y, false);
        },
        [&](Range r, const float* dy, const float* w, float* dx) {
          conv2d_backward_data_cpu(sub(r), dy, w, dx);
        },
        [&](Range r, const float* x, const float* dy, float* dw) {
          conv2d_backward_weight_cpu(sub(r), x, dy, dw, nullptr);
        });
    const int a = t.a, b = t.b, out = t.out;
    if (pass == Pass::BackwardData && first_layer)
      info.note = "not needed in training (first layer)";
    d.allocate(choose_sets(ctx, d.set_bytes()), ctx.stream);

    for (Precision p : opt.precisions) {
      const Exec ex = exec_for(ctx, p);
      const double tol = matmul_tol(p);
      auto args = [&](int i) { return LibArgs{d.f(i, a), d.f(i, b), nullptr, d.f(i, out)}; };
      // cuDNN's legacy API has no BF16 math on FP32 tensors (its BF16 kernels want BF16
      // tensors, a different problem: half the traffic, BF16 outputs), so BF16 rows have no
      // cuDNN yardstick.
      const double lib_us = measure_lib(
          ctx, rows, d, info, p, tol, "cudnn",
          ctx.lib && ctx.lib->cudnn_ok() && p != Precision::BF16,
          [&] { return ctx.lib->conv(s, pass, p, args(0)); }, args);
      // One scratch for the pass, the most any timed variant needs, allocated before timing as
      // the Network allocates its own: no variant allocates inside the timed calls.
      size_t scratch_floats = 0;
      if (pass == Pass::BackwardWeight)
        scratch_floats = conv2d_backward_weight_scratch_floats(s, ex);
      for (Algo algo : opt.algos)
        scratch_floats =
            std::max(scratch_floats,
                     pass == Pass::Forward        ? conv2d_forward_scratch_floats(s, algo, ex)
                     : pass == Pass::BackwardData ? conv2d_backward_data_scratch_floats(s, algo, ex)
                                                  : size_t(0));
      Buffer<float> scratch(scratch_floats, Device::CUDA);
      for (Algo algo : opt.algos) {
        Candidate c;
        c.variant = algo_name(algo);
        c.launch = [&, algo](int i) {
          if (pass == Pass::Forward)
            conv2d_forward(s, d.f(i, a), d.f(i, b), nullptr, d.f(i, out), false,
                           scratch.empty() ? nullptr : scratch.data(), algo, ex);
          else if (pass == Pass::BackwardData)
            conv2d_backward_data(s, d.f(i, a), d.f(i, b), d.f(i, out),
                                 scratch.empty() ? nullptr : scratch.data(), algo, ex);
          else
            conv2d_backward_weight(s, d.f(i, a), d.f(i, b), d.f(i, out), nullptr,
                                   scratch.empty() ? nullptr : scratch.data(), algo, ex);
        };
        rows.push_back(measure(ctx, d, info, p, tol, c, lib_us));
      }
      // The Hopper wgmma kernels' forward and stride-1 input gradient with each block tile
      // width (the `wgmma` row takes the picked one), and with the synchronous im2col gather
      // (loads, then st.shared, one stage at a time) for comparison with the asynchronous one.
      const bool wgmma_pass = pass == Pass::Forward ||
                              (pass == Pass::BackwardData && s.stride_h == 1 && s.stride_w == 1);
      if (wgmma_pass && p == Precision::TF32 && conv2d_wgmma_available()) {
        struct WgmmaRow {
          const char* variant;
          WgmmaConvOptions opt;
        };
        WgmmaConvOptions bn64, bn128, sync;
        bn64.block_n = 64;
        bn128.block_n = 128;
        sync.gather = WgmmaConvGather::Sync;
        for (const WgmmaRow& w :
             {WgmmaRow{"conv:wgmma-bn64", bn64}, WgmmaRow{"conv:wgmma-bn128", bn128},
              WgmmaRow{"conv:wgmma-sync", sync}}) {
          Candidate c;
          c.variant = w.variant;
          const WgmmaConvOptions o = w.opt;
          c.launch = [&, o](int i) {
            if (pass == Pass::Forward)
              conv2d_forward_wgmma(s, d.f(i, a), d.f(i, b), nullptr, d.f(i, out), false, ctx.stream,
                                   o);
            else
              conv2d_backward_data_wgmma(s, d.f(i, a), d.f(i, b), d.f(i, out), ctx.stream, o);
          };
          rows.push_back(measure(ctx, d, info, p, tol, c, lib_us));
        }
      }
      // The TMA-im2col kernel (wgmma-nhwc) with 64-column tiles at one and at two resident
      // blocks an SM, and with 32-column tiles at the picked residency (the `wgmma-nhwc` row
      // takes the picked tile, residency and A load), TF32 and BF16, and where the GEMM is wider
      // than 64 columns the 128-column tile at 128 and at 256 rows; at FP32 (3xTF32) each tile
      // width at one block an SM and 32 and 64 columns at two. Then the halo tile.
      if (wgmma_pass && conv2d_wgmma_nhwc_available()) {
        const size_t nhwc_floats =
            pass == Pass::Forward ? conv2d_forward_scratch_floats(s, Algo::WgmmaNhwc, ex)
                                  : conv2d_backward_data_scratch_floats(s, Algo::WgmmaNhwc, ex);
        Buffer<float> nhwc_scratch(nhwc_floats, Device::CUDA);
        struct NhwcRow {
          const char* variant;
          int block_n, blocks_per_sm;  // 0: picked (conv2d_wgmma_nhwc_pick_blocks_per_sm)
          int block_m = 0;             // 0: picked (conv2d_wgmma_nhwc_pick_block_m)
          NhwcALoad a_load = NhwcALoad::Im2col;
        };
        std::vector<NhwcRow> nhwc_rows = {{"conv:nhwc-bn64-1/sm", 64, 1},
                                          {"conv:nhwc-bn64-2/sm", 64, 2},
                                          {"conv:nhwc-bn32", 32, 0}};
        if (p == Precision::FP32)
          nhwc_rows = {{"conv:nhwc-3xtf32-bn32", 32, 1},
                       {"conv:nhwc-3xtf32-bn32-2/sm", 32, 2},
                       {"conv:nhwc-3xtf32-bn64", 64, 1},
                       {"conv:nhwc-3xtf32-bn64-2/sm", 64, 2},
                       {"conv:nhwc-3xtf32-bn128", 128, 1}};
        // Where 32 columns are the whole GEMM (N = OC forward, C input gradient), each
        // residency of the 32-column tile, to weigh the picker's choice.
        else if ((pass == Pass::Forward ? s.oc : s.c) <= 32) {
          nhwc_rows.push_back({"conv:nhwc-bn32-2/sm", 32, 2});
          nhwc_rows.push_back({"conv:nhwc-bn32-3/sm", 32, 3});
        } else if ((pass == Pass::Forward ? s.oc : s.c) > 64) {
          nhwc_rows.push_back({"conv:nhwc-128x128", 128, 1, 128});
          nhwc_rows.push_back({"conv:nhwc-256x128", 128, 1, 256});
        }
        // The halo tile (one TMA box of a tile's rows per channel chunk) at the picked width and
        // rows, at 128 rows, at 64 columns where the pick is wider, and at 256 rows of 32 or 64
        // columns, where the shape allows it.
        const Conv2dShape view = pass == Pass::Forward ? s : backward_data_as_forward(s);
        if (p != Precision::FP32 && halo_refusal(view).empty()) {
          nhwc_rows.push_back({"conv:nhwc-halo", 0, 0, 0, NhwcALoad::Halo});
          nhwc_rows.push_back({"conv:nhwc-halo-128rows", 0, 0, 128, NhwcALoad::Halo});
          if (view.oc > 64)
            nhwc_rows.push_back({"conv:nhwc-halo-bn64", 64, 0, 128, NhwcALoad::Halo});
          if (halo_refusal(view, 256).empty())
            nhwc_rows.push_back(
                {"conv:nhwc-halo-bn64-256rows", view.oc <= 32 ? 32 : 64, 0, 256, NhwcALoad::Halo});
        }
        for (const NhwcRow& r : nhwc_rows) {
          WgmmaNhwcOptions o;
          o.block_n = r.block_n;
          o.blocks_per_sm = r.blocks_per_sm;
          o.block_m = r.block_m;
          o.a_load = r.a_load;
          o.precision = p;
          Candidate c;
          c.variant = r.variant;
          c.launch = [&, o](int i) {  // measure() runs it before nhwc_scratch goes
            if (pass == Pass::Forward)
              conv2d_forward_wgmma_nhwc(s, d.f(i, a), d.f(i, b), nullptr, d.f(i, out), false,
                                        nhwc_scratch.data(), ctx.stream, o);
            else
              conv2d_backward_data_wgmma_nhwc(s, d.f(i, a), d.f(i, b), d.f(i, out),
                                              nhwc_scratch.data(), ctx.stream, o);
          };
          rows.push_back(measure(ctx, d, info, p, tol, c, lib_us));
        }
      }
      // The weight gradient on the Hopper wgmma kernel (split-K, dy by TMA, im2col by cp.async);
      // through the conv2d API, so the same scratch and the same refusals.
      if (pass == Pass::BackwardWeight && (p == Precision::TF32 || p == Precision::FP32) &&
          conv2d_wgrad_wgmma_available()) {
        Candidate c;
        c.variant = "conv:wgmma";
        c.launch = [&](int i) {
          conv2d_backward_weight(s, d.f(i, a), d.f(i, b), d.f(i, out), nullptr,
                                 scratch.empty() ? nullptr : scratch.data(), Algo::Wgmma, ex);
        };
        rows.push_back(measure(ctx, d, info, p, tol, c, lib_us));
        // The same kernel with each B loader whatever CNN_WGMMA_WGRAD_B says: the cp.async
        // gather, and TMA boxes of the tap-class copies of x (conv2d_wgrad_box.h; the pre-pass
        // that writes the copies is inside the timed launch) where the shape allows them.
        // Each row has scratch sized for its loader.
        using BLoad = WgmmaWgradOptions::BLoad;
        struct LoaderRow {
          const char* variant;
          BLoad b;
        };
        for (const LoaderRow& l : {LoaderRow{"conv:wgmma-gather", BLoad::Gather},
                                   LoaderRow{"conv:wgmma-tmab", BLoad::Tma}}) {
          if (l.b == BLoad::Tma && !conv2d_wgrad_wgmma_box_refusal(s, nullptr).empty()) continue;
          Buffer<float> row_scratch(conv2d_wgrad_wgmma_scratch_floats(s, ex, l.b), Device::CUDA);
          Candidate r;
          r.variant = l.variant;
          WgmmaWgradOptions o;
          o.b = l.b;
          if (l.b == BLoad::Tma) {
            // The run CNN_WGMMA_WGRAD_BOX_RUN gives (auto unless set), and the boxes of B a
            // full tile's stage issues with it (plus A's one box where dy comes by TMA).
            const int run = wgmma_wgrad_box_run(o);
            const WgradBoxGeometry g = wgrad_box_geometry(s, run);
            r.note = fmt::format(
                "boxes {}x{} px, run {}{} ({} B boxes a stage), {}, {} splits{}", g.br, g.bw, g.run,
                run == 0 ? " auto" : "", g.b_boxes, copies_note(g, wgmma_wgrad_box_direct(o)),
                conv2d_wgrad_wgmma_splits(s, true, run, false), s.ow() % 4 ? ", dy gathered" : "");
          }
          // The cluster the launches ran in (after the launch's placement check), for the note.
          WgradCluster ran{0, 0};
          o.ran_cluster = &ran;
          r.launch = [&, o](int i) {  // measure() runs it before row_scratch goes
            conv2d_backward_weight_wgmma(s, d.f(i, a), d.f(i, b), d.f(i, out), nullptr,
                                         row_scratch.empty() ? nullptr : row_scratch.data(), ex, o);
          };
          rows.push_back(measure(ctx, d, info, p, tol, r, lib_us));
          if (l.b == BLoad::Tma && ran.x > 0)
            append_note(rows.back(), ran.x * ran.z > 1
                                         ? fmt::format("multicast cluster {}x{}", ran.x, ran.z)
                                         : std::string("no multicast cluster"));
        }
      }
      // The BF16 channels-last weight gradient with each x load whatever the pick: TMA im2col
      // copies per tap, and halo boxes that every tap reads (stride 1; the `wgmma-nhwc` row
      // takes the pick, conv2d_wgrad_wgmma_nhwc_pick_halo).
      if (pass == Pass::BackwardWeight && p == Precision::BF16 &&
          conv2d_wgrad_wgmma_nhwc_refusal(s, ex).empty() && !scratch.empty()) {
        struct LoadRow {
          const char* variant;
          WgradNhwcLoad load;
        };
        for (const LoadRow& l : {LoadRow{"conv:nhwc-wgrad-im2col", WgradNhwcLoad::Im2col},
                                 LoadRow{"conv:nhwc-wgrad-halo", WgradNhwcLoad::Halo}}) {
          if (l.load == WgradNhwcLoad::Halo && !wgrad_halo_refusal(s).empty()) continue;
          Candidate r;
          r.variant = l.variant;
          WgmmaWgradNhwcOptions o;
          o.b_load = l.load;
          if (l.load == WgradNhwcLoad::Halo) {
            const WgradHaloGeometry g = wgrad_halo_geometry(s, "bench");
            r.note = fmt::format(
                "{} image(s) x {} rows a k-tile, {} k rows ({:.0f}% pixels), {} stages, {} tap "
                "groups, {} splits",
                g.images, g.rows_dy, g.k_rows, 100 * wgrad_halo_useful_fraction(s, g), g.stages,
                wgrad_halo_taps(s.kh * s.kw).groups, conv2d_wgrad_wgmma_nhwc_halo_splits(s));
          }
          r.launch = [&, o](int i) {
            conv2d_backward_weight_wgmma_nhwc(s, d.f(i, a), d.f(i, b), d.f(i, out), nullptr,
                                              scratch.data(), ex, o);
          };
          rows.push_back(measure(ctx, d, info, p, tol, r, lib_us));
        }
      }
    }
  }
}

// The wgmma-nhwc convolution's pre-pass alone (nchw_to_nhwc_*_cuda): the channels-last copy of
// the NCHW operand (x forward, dy for the stride-1 input gradient), channels padded to the
// operand's 128-byte block and rounded to TF32 or BF16, that precedes every such convolution
// (its time is inside the conv:nhwc rows). A transpose: judged in GB/s, NCHW read + copy written.
void bench_nhwc_copy(const BenchContext& ctx, std::vector<BenchRow>& rows, const std::string& name,
                     const Conv2dShape& s, bool first_layer) {
  const BenchOptions& opt = *ctx.opt;
  if (!conv2d_wgmma_nhwc_available()) return;
  for (Pass pass : {Pass::Forward, Pass::BackwardData}) {
    if (pass == Pass::BackwardData && (s.stride_h != 1 || s.stride_w != 1)) continue;
    const std::string op = name + "." + pass_name(pass) + ".to_nhwc";
    if (!op_selected(opt, op)) continue;
    const bool fwd = pass == Pass::Forward;
    const int c = fwd ? s.c : s.oc, h = fwd ? s.h : s.oh(), w = fwd ? s.w : s.ow();
    const int64_t hw = int64_t(h) * w;
    std::mt19937_64 rng(op_seed(opt.seed, op));
    const std::vector<float> x = random_floats(size_t(s.n) * c * size_t(hw), rng);
    for (Precision p : opt.precisions) {
      if (p != Precision::TF32 && p != Precision::BF16) continue;
      const bool bf16 = p == Precision::BF16;
      const int block = bf16 ? kNhwcChannelBlockBf16 : kNhwcChannelBlock;
      const int c_pad = (c + block - 1) / block * block;
      const size_t copy = size_t(s.n) * size_t(hw) * c_pad;
      OpInfo info;
      info.op = op;
      info.shape = fmt::format("{}x{}x{}x{} -> NHWC, C padded to {}", s.n, c, h, w, c_pad);
      info.compute_bound = false;
      info.bytes = 4.0 * double(x.size()) + (bf16 ? 2.0 : 4.0) * double(copy);
      info.note = "the conv:nhwc pre-pass alone";
      if (!fwd && first_layer) info.note += "; not needed in training (first layer)";
      OpData d;
      const int ix = d.input("x", x);
      int iout;
      if (bf16) {  // the bf16 copy's bit patterns, two to an int32, compared exactly
        std::vector<uint16_t> ref(copy);
        nchw_to_nhwc_bf16_cpu(x.data(), s.n, c, hw, c_pad, ref.data());
        std::vector<int32_t> packed(copy / 2);  // c_pad is even
        std::memcpy(packed.data(), ref.data(), copy * 2);
        iout = d.output_i32("nhwc", std::move(packed));
      } else {
        std::vector<float> ref(copy);
        nchw_to_nhwc_tf32_cpu(x.data(), s.n, c, hw, c_pad, ref.data());
        iout = d.output("nhwc", std::move(ref));
      }
      d.allocate(choose_sets(ctx, d.set_bytes()), ctx.stream);
      Candidate cand{
          "default",
          false,
          [&](int i) {
            if (bf16)
              nchw_to_nhwc_bf16_cuda(d.f(i, ix), s.n, c, hw, c_pad,
                                     reinterpret_cast<uint16_t*>(d.i32(i, iout)), ctx.stream);
            else
              nchw_to_nhwc_tf32_cuda(d.f(i, ix), s.n, c, hw, c_pad, d.f(i, iout), ctx.stream);
          },
          {},
          ""};
      rows.push_back(measure(ctx, d, info, p, kTolElementwise, cand, kNaN));
    }
  }
}

// The wgmma-nhwc convolution's whole pre-pass, the weights packed and the channels-last copy, two
// ways: "fused", the one launch the convolution runs (conv_nhwc_prepass_cuda), and "separate",
// the two kernels apart (pack_weights_*_cuda, then nchw_to_nhwc_*_cuda), so that the row pair
// shows what one launch saves (each kernel alone is about a launch's latency for little work). At
// FP32 the 3xTF32 form of one block an SM: two weight packs, the copy unrounded. Outputs compared
// exactly (bf16 as bit patterns).
void bench_nhwc_prepass(const BenchContext& ctx, std::vector<BenchRow>& rows,
                        const std::string& name, const Conv2dShape& s, bool first_layer) {
  const BenchOptions& opt = *ctx.opt;
  if (!conv2d_wgmma_nhwc_available()) return;
  for (Pass pass : {Pass::Forward, Pass::BackwardData}) {
    if (pass == Pass::BackwardData && (s.stride_h != 1 || s.stride_w != 1)) continue;
    const std::string op = name + "." + pass_name(pass) + ".prepass";
    if (!op_selected(opt, op)) continue;
    const bool fwd = pass == Pass::Forward;
    const int c = fwd ? s.c : s.oc, h = fwd ? s.h : s.oh(), w = fwd ? s.w : s.ow();
    const int64_t hw = int64_t(h) * w;
    std::mt19937_64 rng(op_seed(opt.seed, op));
    const std::vector<float> x = random_floats(size_t(s.n) * c * size_t(hw), rng);
    const std::vector<float> wts = random_floats(size_t(s.oc) * s.c * s.kh * s.kw, rng);
    for (Precision p : opt.precisions) {
      const bool bf16 = p == Precision::BF16, fp32 = p == Precision::FP32;
      const int block = bf16 ? kNhwcChannelBlockBf16 : kNhwcChannelBlock;
      const int c_pad = (c + block - 1) / block * block;
      const WeightPack wp =
          fwd ? forward_weight_pack(s, block) : backward_data_weight_pack(s, block);
      const size_t npack = size_t(wp.rows) * wp.taps * wp.k_pad;
      const size_t copy = size_t(s.n) * size_t(hw) * c_pad;
      OpInfo info;
      info.op = op;
      info.shape = fmt::format("{}x{}x{}x{} -> NHWC, C padded to {}; weights ({}, {}, {}) packed",
                               s.n, c, h, w, c_pad, wp.rows, wp.taps, wp.k_pad);
      info.compute_bound = false;
      info.bytes = 4.0 * double(x.size() + wts.size()) +
                   (bf16 ? 2.0 : 4.0) * double(copy + (fp32 ? 2 : 1) * npack);
      info.note = "the conv:nhwc pre-pass, weights and copy";
      if (!fwd && first_layer) info.note += "; not needed in training (first layer)";
      OpData d;
      const int ix = d.input("x", x), iw = d.input("w", wts);
      int ipack, ismall = -1, icopy;
      if (bf16) {  // bit patterns, two to an int32 (k_pad and c_pad are even)
        std::vector<uint16_t> pack(npack), nhwc(copy);
        pack_weights_bf16_cpu(wp, wts.data(), pack.data());
        nchw_to_nhwc_bf16_cpu(x.data(), s.n, c, hw, c_pad, nhwc.data());
        std::vector<int32_t> pack32(npack / 2), nhwc32(copy / 2);
        std::memcpy(pack32.data(), pack.data(), npack * 2);
        std::memcpy(nhwc32.data(), nhwc.data(), copy * 2);
        ipack = d.output_i32("pack", std::move(pack32));
        icopy = d.output_i32("nhwc", std::move(nhwc32));
      } else {
        std::vector<float> pack(npack), small(npack), nhwc(copy);
        if (fp32) {
          pack_weights_tf32_split_cpu(wp, wts.data(), pack.data(), small.data());
          nchw_to_nhwc_fp32_cpu(x.data(), s.n, c, hw, c_pad, nhwc.data());
          ismall = d.output("pack_small", std::move(small));
        } else {
          pack_weights_tf32_cpu(wp, wts.data(), pack.data());
          nchw_to_nhwc_tf32_cpu(x.data(), s.n, c, hw, c_pad, nhwc.data());
        }
        ipack = d.output("pack", std::move(pack));
        icopy = d.output("nhwc", std::move(nhwc));
      }
      d.allocate(choose_sets(ctx, d.set_bytes()), ctx.stream);
      const auto separate = [&](int i) {
        if (bf16) {
          pack_weights_bf16_cuda(wp, d.f(i, iw), reinterpret_cast<uint16_t*>(d.i32(i, ipack)),
                                 ctx.stream);
          nchw_to_nhwc_bf16_cuda(d.f(i, ix), s.n, c, hw, c_pad,
                                 reinterpret_cast<uint16_t*>(d.i32(i, icopy)), ctx.stream);
        } else if (fp32) {
          pack_weights_tf32_split_cuda(wp, d.f(i, iw), d.f(i, ipack), d.f(i, ismall), ctx.stream);
          nchw_to_nhwc_fp32_cuda(d.f(i, ix), s.n, c, hw, c_pad, d.f(i, icopy), ctx.stream);
        } else {
          pack_weights_tf32_cuda(wp, d.f(i, iw), d.f(i, ipack), ctx.stream);
          nchw_to_nhwc_tf32_cuda(d.f(i, ix), s.n, c, hw, c_pad, d.f(i, icopy), ctx.stream);
        }
      };
      const auto fused = [&](int i) {
        NhwcWeightJob wj;
        wj.wp = wp;
        wj.d_w = d.f(i, iw);
        wj.d_out = d.f(i, ipack);
        wj.d_small = fp32 ? d.f(i, ismall) : nullptr;
        NhwcCopyJob cj;
        cj.d_x = d.f(i, ix);
        cj.n = s.n;
        cj.c = c;
        cj.hw = hw;
        cj.c_pad = c_pad;
        cj.d_out = d.f(i, icopy);
        conv_nhwc_prepass_cuda(p, wj, cj, ctx.stream);
      };
      rows.push_back(measure(ctx, d, info, p, kTolElementwise,
                             Candidate{"separate", false, separate, {}, "two launches"}, kNaN));
      rows.push_back(measure(ctx, d, info, p, kTolElementwise,
                             Candidate{"fused", false, fused, {}, "one launch"}, kNaN));
    }
  }
}

// ---- linear -------------------------------------------------------------------------------------

void bench_linear(const BenchContext& ctx, std::vector<BenchRow>& rows, const std::string& name,
                  const LinearShape& s) {
  const BenchOptions& opt = *ctx.opt;
  const size_t nw = size_t(s.in) * s.out;
  auto sub = [&](Range r) { return LinearShape{static_cast<int>(r.count), s.in, s.out}; };

  for (Pass pass : {Pass::Forward, Pass::BackwardData, Pass::BackwardWeight}) {
    OpInfo info;
    info.op = name + "." + pass_name(pass);
    if (!op_selected(opt, info.op)) continue;
    info.shape = fmt::format("{}x{} -> {}", s.n, s.in, s.out);
    info.flops = 2.0 * double(s.n) * s.in * s.out;
    std::mt19937_64 rng(op_seed(opt.seed, info.op));
    OpData d;
    const PassTensors t = layer_pass_data(
        pass, rng, s.n, s.in, s.out, nw, d, info,
        [&](Range r, const float* x, const float* w, float* y) {
          linear_forward_cpu(sub(r), x, w, nullptr, y, false);
        },
        [&](Range r, const float* dy, const float* w, float* dx) {
          linear_backward_data_cpu(sub(r), dy, w, dx);
        },
        [&](Range r, const float* x, const float* dy, float* dw) {
          linear_backward_weight_cpu(sub(r), x, dy, dw, nullptr);
        });
    const int a = t.a, b = t.b, out = t.out;
    d.allocate(choose_sets(ctx, d.set_bytes()), ctx.stream);

    for (Precision p : opt.precisions) {
      const Exec ex = exec_for(ctx, p);
      const double tol = matmul_tol(p);
      auto args = [&](int i) { return LibArgs{d.f(i, a), d.f(i, b), nullptr, d.f(i, out)}; };
      const double lib_us = measure_lib(
          ctx, rows, d, info, p, tol, "cublas", ctx.lib && ctx.lib->cublas_ok(),
          [&] { return ctx.lib->gemm(s, pass, p); }, args);
      // Each pass's scratch as the layer gives it: the weight gradient's deterministic sums and
      // the GEMM workspace of split groups (CNN_WGMMA_GROUPS).
      const std::size_t scratch_n = pass == Pass::Forward ? linear_forward_scratch_floats(s, ex)
                                    : pass == Pass::BackwardData
                                        ? linear_backward_data_scratch_floats(s, ex)
                                        : linear_backward_weight_scratch_floats(s, ex);
      Buffer<float> scratch;
      if (scratch_n > 0) scratch = Buffer<float>(scratch_n, Device::CUDA);
      float* const d_scratch = scratch.empty() ? nullptr : scratch.data();
      for (Algo algo : opt.algos) {
        if (algo == Algo::Wgmma || algo == Algo::WgmmaNhwc) continue;  // convolution variants
        Candidate c;
        c.variant = algo_name(algo);
        c.launch = [&, algo](int i) {
          if (pass == Pass::Forward)
            linear_forward(s, d.f(i, a), d.f(i, b), nullptr, d.f(i, out), false, algo, ex,
                           d_scratch, scratch_n);
          else if (pass == Pass::BackwardData)
            linear_backward_data(s, d.f(i, a), d.f(i, b), d.f(i, out), algo, ex, d_scratch,
                                 scratch_n);
          else
            linear_backward_weight(s, d.f(i, a), d.f(i, b), d.f(i, out), nullptr, d_scratch, algo,
                                   ex, false, scratch_n);
        };
        rows.push_back(measure(ctx, d, info, p, tol, c, lib_us));
      }
      // The tensor-core GEMM paths side by side, called as linear.cpp calls gemm_cuda: the
      // mma.sync 16-byte tile path in 64 x 64 and 128 x 128 tiles and, on a compute capability
      // 9.0 GPU, the wgmma + TMA one (TF32 and BF16 alike).
      if (p != Precision::FP32) {
        std::vector<std::pair<const char*, GemmPath>> paths = {
            {"gemm:vec", GemmPath::VecTile}, {"gemm:vec-wide", GemmPath::VecTileWide}};
        if (gemm_wgmma_available()) paths.push_back({"gemm:wgmma", GemmPath::Wgmma});
        for (const auto& [label, path] : paths) {
          Candidate c;
          c.variant = label;
          c.launch = [&, path = path](int i) {
            if (pass == Pass::Forward)
              gemm_cuda_path(path, false, true, s.n, s.out, s.in, 1.f, d.f(i, a), s.in, d.f(i, b),
                             s.in, 0.f, d.f(i, out), s.out, nullptr, false, p, ctx.stream);
            else if (pass == Pass::BackwardData)
              gemm_cuda_path(path, false, false, s.n, s.in, s.out, 1.f, d.f(i, a), s.out, d.f(i, b),
                             s.in, 0.f, d.f(i, out), s.in, nullptr, false, p, ctx.stream);
            else
              gemm_cuda_path(path, true, false, s.out, s.in, s.n, 1.f, d.f(i, b), s.out, d.f(i, a),
                             s.in, 1.f, d.f(i, out), s.in, nullptr, false, p, ctx.stream);
          };
          rows.push_back(measure(ctx, d, info, p, tol, c, lib_us));
        }
        // The transposed passes once more with their M/N-contiguous operands staged by TMA and
        // transposed in shared memory (whatever CNN_WGMMA_MN says), beside the gather above.
        // TF32 only: BF16's gemm:wgmma row is already staged unless CNN_WGMMA_MN=gather.
        if (p == Precision::TF32 && gemm_wgmma_available() && pass != Pass::Forward) {
          Candidate c;
          c.variant = "gemm:wgmma-staged";
          c.launch = [&](int i) {
            WgmmaOptions opt;
            opt.mn_load = WgmmaMnLoad::Tma;
            if (pass == Pass::BackwardData)
              gemm_wgmma(false, false, s.n, s.in, s.out, 1.f, d.f(i, a), s.out, d.f(i, b), s.in,
                         0.f, d.f(i, out), s.in, nullptr, false, ctx.stream, opt);
            else
              gemm_wgmma(true, false, s.out, s.in, s.n, 1.f, d.f(i, b), s.out, d.f(i, a), s.in, 1.f,
                         d.f(i, out), s.in, nullptr, false, ctx.stream, opt);
          };
          rows.push_back(measure(ctx, d, info, p, tol, c, lib_us));
        }
        // The wgmma GEMM with k split across `groups` clusters of `splits` blocks (sN gM), the
        // clusters' sums added in order by split_k_reduce (whatever CNN_WGMMA_SPLITS and
        // CNN_WGMMA_GROUPS say): the same 4 to 32 k splits a tile as one cluster's DSMEM sum and
        // as the workspace's.
        if (gemm_wgmma_available()) {
          const int gm = pass == Pass::BackwardWeight ? s.out : s.n;
          const int gn = pass == Pass::Forward ? s.out : s.in;
          Buffer<float> work(gemm_wgmma_work_floats(gm, gn, 16), Device::CUDA);
          const int plans[][2] = {{2, 2}, {1, 4}, {4, 2}, {2, 4},  {1, 8},
                                  {8, 2}, {4, 4}, {2, 8}, {1, 16}, {8, 4}};
          for (const auto& plan : plans) {
            const int splits = plan[0], groups = plan[1];
            Candidate c;
            c.variant = fmt::format("gemm:wgmma-s{}g{}", splits, groups);
            c.launch = [&, splits, groups](int i) {
              WgmmaOptions opt;
              opt.precision = p;
              opt.splits = splits;
              opt.groups = groups;
              opt.work = work.data();
              opt.work_floats = work.size();
              if (pass == Pass::Forward)
                gemm_wgmma(false, true, s.n, s.out, s.in, 1.f, d.f(i, a), s.in, d.f(i, b), s.in,
                           0.f, d.f(i, out), s.out, nullptr, false, ctx.stream, opt);
              else if (pass == Pass::BackwardData)
                gemm_wgmma(false, false, s.n, s.in, s.out, 1.f, d.f(i, a), s.out, d.f(i, b), s.in,
                           0.f, d.f(i, out), s.in, nullptr, false, ctx.stream, opt);
              else
                gemm_wgmma(true, false, s.out, s.in, s.n, 1.f, d.f(i, b), s.out, d.f(i, a), s.in,
                           1.f, d.f(i, out), s.in, nullptr, false, ctx.stream, opt);
            };
            rows.push_back(measure(ctx, d, info, p, tol, c, lib_us));
          }
        }
      }
    }
  }
}

// ---- element-wise and small ops (one precision: they do no matrix arithmetic) ------------------

// (N, C, H, W) of an activation; flat ones (N, F) become (N, F, 1, 1) for cuDNN.
std::array<int, 4> dims4(const Shape& s) {
  std::array<int, 4> d = {1, 1, 1, 1};
  d[0] = static_cast<int>(s.at(0));
  if (s.size() == 4) {
    for (int i = 1; i < 4; ++i) d[size_t(i)] = static_cast<int>(s[size_t(i)]);
  } else {
    d[1] = static_cast<int>(shape_numel(s) / s.at(0));
  }
  return d;
}

void bench_relu(const BenchContext& ctx, std::vector<BenchRow>& rows, const std::string& name,
                const Shape& shape) {
  const BenchOptions& opt = *ctx.opt;
  const Precision p = opt.precisions.front();
  const Exec ex = exec_for(ctx, p);
  const int64_t count = shape_numel(shape);
  const auto dd = dims4(shape);
  for (bool backward : {false, true}) {
    OpInfo info;
    info.op = name + (backward ? ".bwd" : ".fwd");
    if (!op_selected(opt, info.op)) continue;
    info.shape = shape_str(shape);
    info.compute_bound = false;
    info.bytes = 4.0 * double(count) * (backward ? 3 : 2);
    std::mt19937_64 rng(op_seed(opt.seed, info.op));
    std::vector<float> x = random_floats(size_t(count), rng), y(static_cast<size_t>(count));
    relu_forward_cpu(count, x.data(), y.data());
    OpData d;
    if (!backward) {
      const int ix = d.input("x", x), iy = d.output("y", y);
      d.allocate(choose_sets(ctx, d.set_bytes()), ctx.stream);
      auto args = [&](int i) { return LibArgs{d.f(i, ix), nullptr, nullptr, d.f(i, iy)}; };
      const double lib_us = measure_lib(
          ctx, rows, d, info, p, kTolElementwise, "cudnn", ctx.lib && ctx.lib->cudnn_ok(),
          [&] { return ctx.lib->relu(dd[0], dd[1], dd[2], dd[3], false); }, args);
      Candidate c{"default",
                  false,
                  [&](int i) { relu_forward(count, d.f(i, ix), d.f(i, iy), ex); },
                  {},
                  ""};
      rows.push_back(measure(ctx, d, info, p, kTolElementwise, c, lib_us));
    } else {
      std::vector<float> dy = random_floats(size_t(count), rng), dx(static_cast<size_t>(count));
      relu_backward_cpu(count, y.data(), dy.data(), dx.data());
      const int iy = d.input("y", std::move(y)), idy = d.input("dy", std::move(dy));
      const int ix = d.input("x", std::move(x)), idx = d.output("dx", std::move(dx));
      d.allocate(choose_sets(ctx, d.set_bytes()), ctx.stream);
      auto args = [&](int i) { return LibArgs{d.f(i, iy), d.f(i, idy), d.f(i, ix), d.f(i, idx)}; };
      const double lib_us = measure_lib(
          ctx, rows, d, info, p, kTolElementwise, "cudnn", ctx.lib && ctx.lib->cudnn_ok(),
          [&] { return ctx.lib->relu(dd[0], dd[1], dd[2], dd[3], true); }, args);
      Candidate c{"default",
                  false,
                  [&](int i) { relu_backward(count, d.f(i, iy), d.f(i, idy), d.f(i, idx), ex); },
                  {},
                  ""};
      rows.push_back(measure(ctx, d, info, p, kTolElementwise, c, lib_us));
    }
  }
}

// A batchnorm layer's training passes as the Network runs them on CUDA (kernels/norm/batchnorm.h),
// the following relu folded in when there is one: the forward (batch and running statistics,
// then the normalize) and the backward (dgamma, dbeta and dx; dy masked by the relu's output when
// folded). Bytes: what the passes move, each value read or written once per pass: the forward
// reads x for the sums and again for the normalize and writes y; the backward reads x and dy
// (and y, with a folded relu) for the sums and again for dx, and writes dx. Where the shape runs
// in one launch (kernels/norm/batchnorm_one_pass_cuda.h; CNN_BN_ONE_PASS) x and dy are read once.
// No cuDNN row.
void bench_batchnorm(const BenchContext& ctx, std::vector<BenchRow>& rows, const std::string& name,
                     const Shape& shape, bool relu) {
  const BenchOptions& opt = *ctx.opt;
  const Precision p = opt.precisions.front();
  const Exec ex = exec_for(ctx, p);
  BatchNormShape s;
  s.n = static_cast<int>(shape.at(0));
  s.c = static_cast<int>(shape.at(1));
  s.hw = shape.size() == 4 ? shape[2] * shape[3] : 1;
  const size_t count = size_t(s.count()) * size_t(s.c), nc = size_t(s.c);
  Buffer<double> scratch(size_t(batchnorm_scratch_doubles(s, Device::CUDA)), Device::CUDA);
  for (bool backward : {false, true}) {
    OpInfo info;
    info.op = name + (backward ? ".bwd" : ".fwd");
    if (!op_selected(opt, info.op)) continue;
    info.shape = shape_str(shape) + (relu ? " + relu" : "");
    info.compute_bound = false;
    // The backward recomputes the fused ReLU's mask from x (as the Network runs it): relu y is
    // not read.
    const bool one_pass = batchnorm_one_pass_wanted(s, batchnorm_launch_from_env()) &&
                          batchnorm_one_pass_available(s);
    const int reads = one_pass ? 1 : 2;
    const int tensors_moved = backward ? 2 * reads + 1 : reads + 1;
    info.bytes = 4.0 * double(count) * tensors_moved;
    info.note = fmt::format("{} read {}, {} written ({})",
                            backward ? (relu ? "x, dy (relu mask from x)" : "x, dy") : "x",
                            one_pass ? "once" : "twice", backward ? "dx" : "y",
                            one_pass   ? "one launch, clusters"
                            : backward ? "sums, finish, dx"
                                       : "sums, finish, normalize");
    std::mt19937_64 rng(op_seed(opt.seed, info.op));
    // x off zero, as a conv's output is: the sums must not rely on a zero mean.
    std::vector<float> x = random_floats(count, rng, -1.f, 3.f);
    std::vector<float> gamma = random_floats(nc, rng, 0.5f, 1.5f), beta = random_floats(nc, rng);
    std::vector<float> rm = random_floats(nc, rng), rv = random_floats(nc, rng, 0.5f, 2.f);
    std::vector<float> y(count), mean(nc), invstd(nc), rm_ref = rm, rv_ref = rv, batches = {0.f};
    BatchNormTrainArgs a;
    a.running_mean = rm_ref.data();
    a.running_var = rv_ref.data();
    a.num_batches = batches.data();
    batchnorm_forward_train_cpu(s, x.data(), gamma.data(), beta.data(), y.data(), mean.data(),
                                invstd.data(), a, relu);
    OpData d;
    const int ix = d.input("x", x), ig = d.input("gamma", gamma), ib = d.input("beta", beta);
    // The one row of a pass, once its buffer roles are declared: the default variant (what the
    // Network runs), checked against the CPU reference, no library to compare with.
    auto measure_pass = [&](std::function<void(int)> launch) {
      d.allocate(choose_sets(ctx, d.set_bytes()), ctx.stream);
      const Candidate c{"default", false, std::move(launch), {}, ""};
      rows.push_back(measure(ctx, d, info, p, kTolElementwise, c, kNaN));
    };
    if (!backward) {
      const int iy = d.output("y", std::move(y)), imean = d.output("mean", std::move(mean));
      const int iinv = d.output("invstd", std::move(invstd));
      const int irm = d.output("running_mean", std::move(rm_ref), std::move(rm));
      const int irv = d.output("running_var", std::move(rv_ref), std::move(rv));
      const int icount = d.output("num_batches", std::move(batches), {0.f});
      measure_pass([&](int i) {
        BatchNormTrainArgs t;
        t.running_mean = d.f(i, irm);
        t.running_var = d.f(i, irv);
        t.num_batches = d.f(i, icount);
        batchnorm_forward_train(s, d.f(i, ix), d.f(i, ig), d.f(i, ib), d.f(i, iy), d.f(i, imean),
                                d.f(i, iinv), t, scratch.data(), ex, relu);
      });
    } else {
      std::vector<float> dy = random_floats(count, rng), dx(count);
      std::vector<float> dgamma = random_floats(nc, rng), dbeta = random_floats(nc, rng);
      std::vector<float> dgamma_ref = dgamma, dbeta_ref = dbeta;
      // The mask's reference: the pre-ReLU value as the CUDA passes compute it from these
      // saved statistics, (x - mean) * (invstd * gamma) + beta in float with one rounding (the
      // CPU forward's y, from double statistics, could differ in sign within a rounding of 0).
      for (size_t k = 0; relu && k < count; ++k) {
        const size_t c = (k / size_t(s.hw)) % size_t(nc);
        const float v = std::fma(x[k] - mean[c], invstd[c] * gamma[c], beta[c]);
        y[k] = v > 0.f ? v : 0.f;
      }
      batchnorm_backward_cpu(s, x.data(), dy.data(), gamma.data(), mean.data(), invstd.data(),
                             dx.data(), dgamma_ref.data(), dbeta_ref.data(),
                             relu ? y.data() : nullptr);
      const int idy = d.input("dy", std::move(dy)), imean = d.input("mean", std::move(mean));
      const int iinv = d.input("invstd", std::move(invstd));
      const int iry = relu ? d.input("relu_y", std::move(y)) : -1;
      const int idx = d.output("dx", std::move(dx));
      const int idg = d.output("dgamma", std::move(dgamma_ref), std::move(dgamma));
      const int idb = d.output("dbeta", std::move(dbeta_ref), std::move(dbeta));
      measure_pass([&](int i) {
        batchnorm_backward(s, d.f(i, ix), d.f(i, idy), d.f(i, ig), d.f(i, imean), d.f(i, iinv),
                           d.f(i, idx), d.f(i, idg), d.f(i, idb), scratch.data(), ex,
                           relu ? d.f(i, iry) : nullptr, relu ? d.f(i, ib) : nullptr);
      });
    }
  }
}

// The first conv fused with its ReLU and 2x2 max-pool (kernels/conv_relu_pool.h), as the Network
// runs it on CUDA: forward (writes only the pooled y and argmax) and the weight gradient from
// the pooled dy. Compare with conv1.fwd + pool1.fwd and pool1.bwd + conv1.wgrad. Inputs on
// binary grids so that every sum is exact: the argmax (near-ties) must match the CPU exactly.
void bench_conv_relu_pool(const BenchContext& ctx, std::vector<BenchRow>& rows,
                          const std::string& name, const Conv2dShape& s) {
  const BenchOptions& opt = *ctx.opt;
  const Precision p = opt.precisions.front();
  const Exec ex = exec_for(ctx, p);
  const MaxPoolShape ps = conv_relu_pool_pool_shape(s);
  const int64_t hw = int64_t(s.h) * s.w, php = int64_t(ps.oh()) * ps.ow();
  const size_t nx = size_t(s.n * hw), nw = size_t(s.oc) * s.kh * s.kw;
  const size_t np = size_t(int64_t(s.n) * s.oc * php);
  const std::vector<Range> chunks = split(s.n);
  auto sub = [&](Range r) {
    Conv2dShape t = s;
    t.n = static_cast<int>(r.count);
    return t;
  };
  auto grid = [](size_t n, std::mt19937_64& rng, int m, float step) {
    std::uniform_int_distribution<int> u(-m, m);
    std::vector<float> v(n);
    for (auto& x : v) x = float(u(rng)) * step;
    return v;
  };
  std::mt19937_64 rng(op_seed(opt.seed, name + ".fused"));
  std::vector<float> x = grid(nx, rng, 2, 0.25f), w = grid(nw, rng, 4, 0.125f);
  std::vector<float> b = grid(size_t(s.oc), rng, 8, 1.f / 32), y(np);
  std::vector<int32_t> argmax(np);
  parallel(chunks, [&](size_t, Range r) {
    conv_relu_pool_forward_cpu(sub(r), x.data() + r.begin * hw, w.data(), b.data(),
                               y.data() + r.begin * s.oc * php,
                               argmax.data() + r.begin * s.oc * php);
  });
  const std::string shape = conv_shape_str(s) + " + relu + pool 2x2";
  for (bool backward : {false, true}) {
    OpInfo info;
    info.op = name + (backward ? ".wgrad" : ".fwd");
    if (!op_selected(opt, info.op)) continue;
    info.shape = shape;
    info.compute_bound = false;
    OpData d;
    if (!backward) {
      info.flops = 2.0 * double(s.n) * s.oc * s.oh() * s.ow() * s.kh * s.kw;
      info.bytes = 4.0 * double(nx + nw + 2 * np);  // x, w in; pooled y and argmax out
      info.note = "replaces conv.fwd + pool.fwd (no full-size conv output)";
      const int ix = d.input("x", x), iw = d.input("w", w), ib = d.input("b", b);
      const int iy = d.output("y", y), iarg = d.output_i32("argmax", argmax);
      d.allocate(choose_sets(ctx, d.set_bytes()), ctx.stream);
      Candidate c{"fused",
                  false,
                  [&](int i) {
                    conv_relu_pool_forward(s, d.f(i, ix), d.f(i, iw), d.f(i, ib), d.f(i, iy),
                                           d.i32(i, iarg), ex);
                  },
                  {},
                  ""};
      rows.push_back(measure(ctx, d, info, p, kTolElementwise, c, kNaN));
    } else {
      info.flops = 2.0 * double(s.n) * s.oc * double(php) * s.kh * s.kw;  // one window per output
      info.bytes = 4.0 * double(nx + 3 * np + 2 * nw);  // x, y, dy, argmax in; dw read + written
      info.note = "replaces pool.bwd + conv.wgrad (no full-size conv gradient)";
      std::vector<float> dy = grid(np, rng, 16, 1.f / 16), init = grid(nw, rng, 64, 1.f / 64);
      std::vector<std::vector<float>> parts(chunks.size(), std::vector<float>(nw, 0.f));
      parallel(chunks, [&](size_t i, Range r) {
        conv_relu_pool_backward_weight_cpu(
            sub(r), x.data() + r.begin * hw, y.data() + r.begin * s.oc * php,
            dy.data() + r.begin * s.oc * php, argmax.data() + r.begin * s.oc * php, parts[i].data(),
            nullptr);
      });
      std::vector<float> ref = add_partials(init, parts);
      const int ix = d.input("x", x), iy = d.input("y", y), idy = d.input("dy", std::move(dy));
      const int iarg = d.input_i32("argmax", argmax);
      const int idw = d.output("dw", std::move(ref), std::move(init));
      d.allocate(choose_sets(ctx, d.set_bytes()), ctx.stream);
      Buffer<float> scratch(conv_relu_pool_backward_weight_scratch_floats(s, ex), Device::CUDA);
      Candidate c{"fused",
                  false,
                  [&](int i) {
                    conv_relu_pool_backward_weight(s, d.f(i, ix), d.f(i, iy), d.f(i, idy),
                                                   d.i32(i, iarg), d.f(i, idw), nullptr,
                                                   scratch.empty() ? nullptr : scratch.data(), ex);
                  },
                  {},
                  ""};
      rows.push_back(measure(ctx, d, info, p, kTolElementwise, c, kNaN));
    }
  }
}

void bench_maxpool(const BenchContext& ctx, std::vector<BenchRow>& rows, const std::string& name,
                   const MaxPoolShape& s) {
  const BenchOptions& opt = *ctx.opt;
  const Precision p = opt.precisions.front();
  const Exec ex = exec_for(ctx, p);
  const size_t nx = size_t(s.n) * s.c * s.h * s.w, ny = size_t(s.n) * s.c * s.oh() * s.ow();
  const std::string shape = fmt::format("{}x{}x{}x{} k{}x{} s{}x{} p{}x{}", s.n, s.c, s.h, s.w,
                                        s.kh, s.kw, s.stride_h, s.stride_w, s.pad_h, s.pad_w);
  for (bool backward : {false, true}) {
    OpInfo info;
    info.op = name + (backward ? ".bwd" : ".fwd");
    if (!op_selected(opt, info.op)) continue;
    info.shape = shape;
    info.compute_bound = false;
    // fwd: read x, write y and argmax; bwd: read dy and argmax, write dx.
    info.bytes = 4.0 * double(backward ? 2 * ny + nx : nx + 2 * ny);
    std::mt19937_64 rng(op_seed(opt.seed, info.op));
    std::vector<float> x = random_floats(nx, rng), y(ny);
    std::vector<int32_t> argmax(ny);
    maxpool_forward_cpu(s, x.data(), y.data(), argmax.data());
    OpData d;
    if (!backward) {
      const int ix = d.input("x", std::move(x)), iy = d.output("y", std::move(y));
      const int iarg = d.output_i32("argmax", std::move(argmax));
      d.allocate(choose_sets(ctx, d.set_bytes()), ctx.stream);
      auto args = [&](int i) { return LibArgs{d.f(i, ix), nullptr, nullptr, d.f(i, iy)}; };
      // cuDNN keeps no argmax: only y is compared for it.
      const double lib_us = measure_lib(ctx, rows, d, info, p, kTolElementwise, "cudnn",
                                        ctx.lib && ctx.lib->cudnn_ok(),
                                        [&] { return ctx.lib->maxpool(s, false); }, args, {iy});
      Candidate c{"default",
                  false,
                  [&](int i) { maxpool_forward(s, d.f(i, ix), d.f(i, iy), d.i32(i, iarg), ex); },
                  {},
                  ""};
      rows.push_back(measure(ctx, d, info, p, kTolElementwise, c, lib_us));
    } else {
      std::vector<float> dy = random_floats(ny, rng), dx(nx), dx_masked(nx);
      maxpool_backward_cpu(s, dy.data(), argmax.data(), dx.data());
      maxpool_backward_cpu(s, dy.data(), argmax.data(), dx_masked.data(), y.data());
      const int idy = d.input("dy", std::move(dy)), iarg = d.input_i32("argmax", argmax);
      const int iy = d.input("y", std::move(y)), ix = d.input("x", std::move(x));
      const int idx = d.output("dx", std::move(dx));
      const int idxm = d.output("dx_masked", std::move(dx_masked));
      d.allocate(choose_sets(ctx, d.set_bytes()), ctx.stream);
      auto args = [&](int i) { return LibArgs{d.f(i, iy), d.f(i, idy), d.f(i, ix), d.f(i, idx)}; };
      const double lib_us = measure_lib(ctx, rows, d, info, p, kTolElementwise, "cudnn",
                                        ctx.lib && ctx.lib->cudnn_ok(),
                                        [&] { return ctx.lib->maxpool(s, true); }, args, {idx});
      Candidate c{"default",
                  false,
                  [&](int i) { maxpool_backward(s, d.f(i, idy), d.i32(i, iarg), d.f(i, idx), ex); },
                  {idx},
                  "cuDNN reads x and y instead of an argmax"};
      rows.push_back(measure(ctx, d, info, p, kTolElementwise, c, lib_us));
      // With the ReLU before the pool fused (its mask: the pool's own y > 0), as the Network
      // runs a conv (+ BN) + ReLU + pool: reads y as well.
      OpInfo masked = info;
      masked.bytes += 4.0 * double(ny);
      Candidate m{"relu-mask",
                  false,
                  [&](int i) {
                    maxpool_backward(s, d.f(i, idy), d.i32(i, iarg), d.f(i, idxm), ex, d.f(i, iy));
                  },
                  {idxm},
                  "the fused ReLU backward: also reads y"};
      rows.push_back(measure(ctx, d, masked, p, kTolElementwise, m, kNaN));
    }
  }
}

void bench_xent(const BenchContext& ctx, std::vector<BenchRow>& rows, const std::string& name,
                const XentShape& s) {
  const BenchOptions& opt = *ctx.opt;
  const Precision p = opt.precisions.front();
  const Exec ex = exec_for(ctx, p);
  OpInfo info;
  info.op = name + ".xent";
  if (!op_selected(opt, info.op)) return;
  info.shape = fmt::format("{}x{}", s.n, s.classes);
  info.compute_bound = false;
  const size_t nl = size_t(s.n) * s.classes;
  info.bytes = 4.0 * double(2 * nl + 4 * size_t(s.n));  // logits, labels in; dlogits, loss, pred
  std::mt19937_64 rng(op_seed(opt.seed, info.op));
  std::vector<float> logits = random_floats(nl, rng, -4.f, 4.f);
  std::vector<int32_t> labels = random_labels(size_t(s.n), s.classes, rng);
  std::vector<float> loss(static_cast<size_t>(s.n)), dlogits(nl);
  std::vector<int32_t> pred(static_cast<size_t>(s.n));
  const float scale = 1.0f / float(s.n);
  softmax_xent_cpu(s, logits.data(), labels.data(), loss.data(), pred.data(), dlogits.data(),
                   scale);
  OpData d;
  const int il = d.input("logits", std::move(logits)), ilab = d.input_i32("labels", labels);
  const int iloss = d.output("loss", std::move(loss)), ipred = d.output_i32("pred", pred);
  const int idl = d.output("dlogits", std::move(dlogits));
  d.allocate(choose_sets(ctx, d.set_bytes()), ctx.stream);
  Candidate c{"default",
              false,
              [&](int i) {
                softmax_xent(s, d.f(i, il), d.i32(i, ilab), d.f(i, iloss), d.i32(i, ipred),
                             d.f(i, idl), scale, ex);
              },
              {},
              "fused forward + backward; no library counterpart"};
  rows.push_back(measure(ctx, d, info, p, kTolElementwise, c, kNaN));
}

void bench_optimizer(const BenchContext& ctx, std::vector<BenchRow>& rows,
                     const OptimizerOptions& oo, int64_t count) {
  const BenchOptions& opt = *ctx.opt;
  const Precision p = opt.precisions.front();
  const Exec ex = exec_for(ctx, p);
  const bool sgd = oo.type == OptimizerType::Sgd;
  OpInfo info;
  info.op = sgd ? "optimizer.sgd" : "optimizer.adam";
  if (!op_selected(opt, info.op)) return;
  info.shape = fmt::format("{} params", count);
  info.compute_bound = false;
  // Read and write w, g (zeroed) and each state buffer.
  info.bytes = 4.0 * double(count) * (sgd ? 6 : 8);
  std::mt19937_64 rng(op_seed(opt.seed, info.op));
  const size_t n = size_t(count);
  std::vector<float> w = random_floats(n, rng), g = random_floats(n, rng);
  std::vector<float> m = random_floats(n, rng), v = random_floats(n, rng, 0.f, 1.f);
  std::vector<float> rw = w, rg = g, rm = m, rv = v;
  OpData d;
  Candidate c;
  c.variant = "default";
  // After the first launch g is zero (the update zeroes it): the kernel does the same loads,
  // arithmetic and stores whatever the values, so later launches time the same work.
  if (sgd) {
    SgdParams sp;
    sp.lr = float(oo.lr);
    sp.momentum = float(oo.momentum);
    sp.weight_decay = float(oo.weight_decay);
    sp.nesterov = oo.nesterov;
    sgd_update_cpu(count, rw.data(), rg.data(), rm.data(), nullptr, sp, 1.0f);
    const int iw = d.output("w", std::move(rw), std::move(w));
    const int ig = d.output("g", std::move(rg), std::move(g));
    const int im = d.output("m", std::move(rm), std::move(m));
    c.launch = [&d, iw, ig, im, sp, count, ex](int i) {
      sgd_update(count, d.f(i, iw), d.f(i, ig), d.f(i, im), nullptr, sp, 1.0f, ex);
    };
  } else {
    AdamParams ap;
    ap.lr = float(oo.lr);
    ap.beta1 = float(oo.beta1);
    ap.beta2 = float(oo.beta2);
    ap.eps = float(oo.eps);
    ap.weight_decay = float(oo.weight_decay);
    ap.decoupled = oo.type == OptimizerType::AdamW;
    ap.step = 10;
    adam_update_cpu(count, rw.data(), rg.data(), rm.data(), rv.data(), nullptr, ap, 1.0f);
    const int iw = d.output("w", std::move(rw), std::move(w));
    const int ig = d.output("g", std::move(rg), std::move(g));
    const int im = d.output("m", std::move(rm), std::move(m));
    const int iv = d.output("v", std::move(rv), std::move(v));
    c.launch = [&d, iw, ig, im, iv, ap, count, ex](int i) {
      adam_update(count, d.f(i, iw), d.f(i, ig), d.f(i, im), d.f(i, iv), nullptr, ap, 1.0f, ex);
    };
  }
  c.note = "no library counterpart";
  d.allocate(choose_sets(ctx, d.set_bytes()), ctx.stream);
  rows.push_back(measure(ctx, d, info, p, kTolElementwise, c, kNaN));
}

// ---- grouped and depthwise convolution -------------------------------------------------------

// What the fast variant runs for one pass of a grouped shape.
std::string fast_note(const Conv2dGroupedShape& s, Pass pass) {
  const bool narrow = pass == Pass::Forward        ? grouped_narrow_forward_applicable(s)
                      : pass == Pass::BackwardData ? grouped_narrow_backward_data_applicable(s)
                                                   : grouped_narrow_backward_weight_applicable(s);
  if (conv2d_grouped_fast_applicable(s))
    return std::string("runs ") + depthwise_kernel_name(pass == Pass::BackwardWeight
                                                            ? conv2d_grouped_fast_wgrad_kernel(s)
                                                            : conv2d_grouped_fast_kernel(s));
  if (conv2d_grouped_strided_applicable(s))
    return pass == Pass::BackwardWeight ? "runs the tiled kernel (stride 2)"
                                        : "runs flat (stride 2)";
  if (narrow) return "runs the narrow-group kernels";
  return "fast does not apply to this pass: runs the tiled kernels";
}

std::string grouped_shape_str(const Conv2dGroupedShape& s) {
  std::string out = fmt::format("{}x{}x{}x{} -> {} k{}x{}", s.n, s.c, s.h, s.w, s.oc, s.kh, s.kw);
  if (s.stride_h != 1 || s.stride_w != 1) out += fmt::format(" s{}x{}", s.stride_h, s.stride_w);
  if (s.pad_h || s.pad_w) out += fmt::format(" p{}x{}", s.pad_h, s.pad_w);
  if (s.dil_h != 1 || s.dil_w != 1) out += fmt::format(" d{}x{}", s.dil_h, s.dil_w);
  out += s.groups == s.c ? " depthwise" : fmt::format(" g{}", s.groups);
  return out;
}

// In the depthwise table, one stderr line per op on scope exit: its rows and where its seconds
// went (inputs and reference, cuDNN's Find and algorithms, our variants), so a slow table says
// which part is slow.
class OpClock {
 public:
  OpClock(bool on, std::string op, const std::vector<BenchRow>& rows)
      : on_(on), op_(std::move(op)), rows_(rows), first_row_(rows.size()), start_(now()) {}
  ~OpClock() {
    if (!on_) return;
    const double total = now() - start_;
    std::fprintf(stderr,
                 "bench: %s: %zu rows in %.2f s (inputs and reference %.2f s, cuDNN %.2f s, "
                 "ours %.2f s)\n",
                 op_.c_str(), rows_.size() - first_row_, total, prep_s, lib_s,
                 total - prep_s - lib_s);
  }
  OpClock(const OpClock&) = delete;
  OpClock& operator=(const OpClock&) = delete;
  static double now() {
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch())
        .count();
  }
  double prep_s = 0, lib_s = 0;

 private:
  bool on_;
  std::string op_;
  const std::vector<BenchRow>& rows_;
  size_t first_row_;
  double start_;
};

// bench_conv for the grouped op: forward, input gradient and weight gradient, each of our
// variants (naive, tiled, fast; auto is fast and igemm does not exist here) and cuDNN's grouped
// convolution (groups = G, fastest correct algorithm) where the dilation is 1.
void bench_grouped_conv(const BenchContext& ctx, std::vector<BenchRow>& rows,
                        const std::string& name, const Conv2dGroupedShape& s, bool first_layer) {
  const BenchOptions& opt = *ctx.opt;
  const int64_t chw = int64_t(s.c) * s.h * s.w, ohw = int64_t(s.oh()) * s.ow();
  const size_t nw = size_t(int64_t(s.oc) * s.cg() * s.kh * s.kw);
  const double flops = 2.0 * double(s.n) * s.oc * double(ohw) * s.cg() * s.kh * s.kw;
  auto sub = [&](Range r) {
    Conv2dGroupedShape t = s;
    t.n = static_cast<int>(r.count);
    return t;
  };
  // The cuDNN descriptor of the same convolution (its conv call takes no dilation).
  Conv2dShape lib_shape;
  lib_shape.n = s.n, lib_shape.c = s.c, lib_shape.h = s.h, lib_shape.w = s.w;
  lib_shape.oc = s.oc, lib_shape.kh = s.kh, lib_shape.kw = s.kw;
  lib_shape.stride_h = s.stride_h, lib_shape.stride_w = s.stride_w;
  lib_shape.pad_h = s.pad_h, lib_shape.pad_w = s.pad_w;
  const bool lib_ok = ctx.lib && ctx.lib->cudnn_ok() && s.dil_h == 1 && s.dil_w == 1;
  // Above 2M values per tensor the reference is our naive kernel's result on the device: the CPU
  // twin would cost seconds per large shape (one thread per image; the seed's 1x256x128x128 has
  // one), and it is the GPU tests' job (tests/gpu_conv2d_grouped.cpp checks naive against it).
  const size_t nx = size_t(s.n * chw), ny = size_t(s.n * s.oc * ohw);
  const bool device_ref = std::max(nx, ny) > (size_t(1) << 21);

  for (Pass pass : {Pass::Forward, Pass::BackwardData, Pass::BackwardWeight}) {
    OpInfo info;
    info.op = name + "." + pass_name(pass);
    if (!op_selected(opt, info.op)) continue;
    OpClock clock(opt.depthwise, info.op, rows);
    const double clock_start = OpClock::now();
    info.shape = grouped_shape_str(s);
    info.flops = flops;
    // Depthwise convolutions do ~2*K*K FLOPs per value moved: bandwidth-bound, judged in GB/s.
    info.compute_bound = s.cg() * s.kh * s.kw >= 64;
    std::mt19937_64 rng(op_seed(opt.seed, info.op));
    OpData d;
    const PassTensors t = layer_pass_data(
        pass, rng, s.n, chw, s.oc * ohw, nw, d, info,
        [&](Range r, const float* x, const float* w, float* y) {
          conv2d_grouped_forward_cpu(sub(r), x, w, nullptr, y, false);
        },
        [&](Range r, const float* dy, const float* w, float* dx) {
          conv2d_grouped_backward_data_cpu(sub(r), dy, w, dx);
        },
        [&](Range r, const float* x, const float* dy, float* dw) {
          conv2d_grouped_backward_weight_cpu(sub(r), x, dy, dw, nullptr);
        },
        !device_ref);
    const int a = t.a, b = t.b, out = t.out;
    if (pass == Pass::BackwardData && first_layer)
      info.note = "not needed in training (first layer)";
    d.allocate(choose_sets(ctx, d.set_bytes()), ctx.stream);

    // The grouped kernels multiply in FP32 at every precision: measured once, as FP32, whichever
    // --precision was asked for, so that a TF32 or BF16 run of a depthwise net still lists its
    // depthwise passes. The dense variants (which a TF32 or BF16 layer runs at its precision)
    // are measured at FP32 too, against cuDNN's FP32; the step mode times them at --precision.
    const Precision p = Precision::FP32;
    const Exec ex = exec_for(ctx, p);
    const double tol = matmul_tol(p);
    const auto runs_here = [&](Algo algo) {
      return !conv2d_grouped_dense_variant(algo) || conv2d_grouped_takes_dense(s);
    };
    std::size_t scratch_floats = 0;
    for (Algo algo : opt.algos) {
      if (!runs_here(algo)) continue;
      scratch_floats = std::max(
          scratch_floats, pass == Pass::Forward ? conv2d_grouped_forward_scratch_floats(s, algo, ex)
                          : pass == Pass::BackwardData
                              ? conv2d_grouped_backward_data_scratch_floats(s, algo, ex)
                              : conv2d_grouped_backward_weight_scratch_floats(s, algo, ex));
    }
    scratch_floats = std::max(scratch_floats,
                              pass == Pass::BackwardWeight
                                  ? conv2d_grouped_backward_weight_scratch_floats(s, Algo::Fast, ex)
                                  : std::size_t(0));
    Buffer<float> scratch;
    if (scratch_floats > 0) scratch = Buffer<float>(scratch_floats, Device::CUDA);
    float* const scratch_ptr = scratch.empty() ? nullptr : scratch.data();
    auto launch = [&](Algo algo, int i) {
      if (pass == Pass::Forward)
        conv2d_grouped_forward(s, d.f(i, a), d.f(i, b), nullptr, d.f(i, out), false, scratch_ptr,
                               algo, ex);
      else if (pass == Pass::BackwardData)
        conv2d_grouped_backward_data(s, d.f(i, a), d.f(i, b), d.f(i, out), scratch_ptr, algo, ex);
      else
        conv2d_grouped_backward_weight(s, d.f(i, a), d.f(i, b), d.f(i, out), nullptr,
                                       scratch.empty() ? nullptr : scratch.data(), algo, ex);
    };
    if (device_ref) {
      d.set_reference(out, d.run_and_read([&](int i) { launch(Algo::Naive, i); }, out, ctx.stream));
      if (!info.note.empty()) info.note += "; ";
      info.note += "reference: the naive kernel (the GPU tests check it against the CPU twin)";
    }
    clock.prep_s = OpClock::now() - clock_start;
    auto args = [&](int i) { return LibArgs{d.f(i, a), d.f(i, b), nullptr, d.f(i, out)}; };
    const double lib_start = OpClock::now();
    const double lib_us = measure_lib(
        ctx, rows, d, info, p, tol, "cudnn", lib_ok,
        [&] { return ctx.lib->conv(lib_shape, pass, p, args(0), s.groups); }, args);
    clock.lib_s = OpClock::now() - lib_start;
    for (Algo algo : opt.algos) {
      if (!runs_here(algo)) continue;
      Candidate c;
      c.variant = algo_name(algo);
      if (conv2d_grouped_runs_dense(s, algo, ex)) {
        const GroupedPass gp = pass == Pass::Forward        ? GroupedPass::Forward
                               : pass == Pass::BackwardData ? GroupedPass::BackwardData
                                                            : GroupedPass::BackwardWeight;
        const Algo dense = conv2d_grouped_dense_variant(algo) ? algo : Algo::Auto;
        c.note = conv2d_grouped_dense_applicable(s)
                     ? fmt::format(
                           "the dense kernels, {} form ({} groups)",
                           grouped_dense_form_name(conv2d_grouped_dense_form_for(s, gp, dense, ex)),
                           s.groups)
                 : conv2d_grouped_pass_runs_directly(s, gp, dense, ex)
                     ? std::string("wgmma-nhwc reading the dilated taps")
                     : std::string("the dense kernels on the dilation phases");
      }
      if (algo == Algo::Fast) c.note = fast_note(s, pass);
      c.launch = [&launch, algo](int i) { launch(algo, i); };
      rows.push_back(measure(ctx, d, info, p, tol, c, lib_us));
    }
    // The fast variant's kernels one by one (fast:tile, fast:rows, fast:stream, fast:flat), old
    // next to new on the same shape whatever the pick rule (and CNN_DEPTHWISE_KERNEL) would run.
    const bool fast_listed =
        std::find(opt.algos.begin(), opt.algos.end(), Algo::Fast) != opt.algos.end();
    if (!fast_listed || !conv2d_grouped_fast_applicable(s)) continue;
    const auto fast_candidate = [&](DepthwiseKernel kernel, int stream_rows) {
      Candidate c;
      c.launch = [&, kernel, stream_rows](int i) {
        if (pass == Pass::Forward)
          conv2d_grouped_forward_cuda(s, d.f(i, a), d.f(i, b), nullptr, d.f(i, out), false,
                                      Algo::Fast, ex.stream, kernel, stream_rows);
        else if (pass == Pass::BackwardData)
          conv2d_grouped_backward_data_cuda(s, d.f(i, a), d.f(i, b), d.f(i, out), Algo::Fast,
                                            ex.stream, kernel, stream_rows);
        else
          conv2d_grouped_backward_weight_cuda(s, d.f(i, a), d.f(i, b), d.f(i, out), nullptr,
                                              scratch.empty() ? nullptr : scratch.data(),
                                              Algo::Fast, ex.deterministic, ex.stream, kernel,
                                              stream_rows);
      };
      return c;
    };
    for (DepthwiseKernel kernel : {DepthwiseKernel::Tile, DepthwiseKernel::Rows,
                                   DepthwiseKernel::Stream, DepthwiseKernel::Flat}) {
      if (kernel == DepthwiseKernel::Rows &&
          (pass == Pass::BackwardWeight || !depthwise_rows_fits(s)))
        continue;
      if (kernel == DepthwiseKernel::Flat && pass == Pass::BackwardWeight) continue;
      Candidate c = fast_candidate(kernel, 0);
      c.variant = std::string("fast:") + depthwise_kernel_name(kernel);
      if (kernel == DepthwiseKernel::Stream) {
        const bool wgrad = pass == Pass::BackwardWeight;
        const DepthwiseStreamStrips plan = depthwise_stream_strips(wgrad);
        c.note = fmt::format("{} strips, {} rows per thread", depthwise_stream_strips_name(plan),
                             depthwise_stream_tiling(s, 0, plan).rows);
      }
      rows.push_back(measure(ctx, d, info, p, tol, c, lib_us));
    }
    // Where the stream kernel is the pick, its strip plans side by side: the rows per thread of
    // each (fill's and long's among them), forced, so one run compares them.
    if (!ctx.opt->depthwise || conv2d_grouped_fast_wgrad_kernel(s) != DepthwiseKernel::Stream)
      continue;
    for (int stream_rows : {4, 8, 16, 32}) {
      Candidate c = fast_candidate(DepthwiseKernel::Stream, stream_rows);
      c.variant = fmt::format("fast:stream r{}", stream_rows);
      for (DepthwiseStreamStrips plan : {DepthwiseStreamStrips::Fill, DepthwiseStreamStrips::Long})
        if (depthwise_stream_tiling(s, 0, plan).rows == stream_rows)
          c.note += fmt::format("{}{} plan's rows", c.note.empty() ? "" : "; ",
                                depthwise_stream_strips_name(plan));
      if (ex.deterministic && pass == Pass::BackwardWeight &&
          stream_rows < depthwise_stream_tiling(s, 0, DepthwiseStreamStrips::Fill).rows)
        continue;  // more partials than the scratch holds: the launcher would run its plan
      rows.push_back(measure(ctx, d, info, p, tol, c, lib_us));
    }
  }
}

}  // namespace

std::vector<BenchRow> bench_ops(const BenchContext& ctx, const NetDesc& net) {
  const BenchOptions& opt = *ctx.opt;
  CNN_CHECK(!opt.precisions.empty(), "bench: no precision selected");
  std::vector<BenchRow> rows;
  // Residual blocks opened up: their layers and their shortcut's get rows of their own (the add
  // is timed in the step only).
  for (const OpLayer& l : op_layers(net.specs, net.input_chw, opt.batch)) {
    const LayerSpec& spec = l.spec;
    const Shape& cur = l.in;
    const bool first_layer = !l.input_grad_needed;
    switch (spec.kind) {
      case LayerKind::Conv2d: {
        if (spec.groups != 1 || spec.dil_h != 1 || spec.dil_w != 1) {
          Conv2dGroupedShape g;
          g.n = int(cur.at(0)), g.c = int(cur.at(1)), g.h = int(cur.at(2)), g.w = int(cur.at(3));
          g.oc = spec.out_channels, g.kh = spec.kernel_h, g.kw = spec.kernel_w;
          g.stride_h = spec.stride_h, g.stride_w = spec.stride_w;
          g.pad_h = spec.pad_h, g.pad_w = spec.pad_w;
          g.dil_h = spec.dil_h, g.dil_w = spec.dil_w, g.groups = spec.groups;
          bench_grouped_conv(ctx, rows, l.name, g, first_layer);
          break;
        }
        Conv2dShape s;
        s.n = int(cur.at(0));
        s.c = int(cur.at(1));
        s.h = int(cur.at(2));
        s.w = int(cur.at(3));
        s.oc = spec.out_channels;
        s.kh = spec.kernel_h;
        s.kw = spec.kernel_w;
        s.stride_h = spec.stride_h;
        s.stride_w = spec.stride_w;
        s.pad_h = spec.pad_h;
        s.pad_w = spec.pad_w;
        bench_conv(ctx, rows, l.name, s, first_layer);
        bench_nhwc_copy(ctx, rows, l.name, s, first_layer);
        bench_nhwc_prepass(ctx, rows, l.name, s, first_layer);
        // The fusion the Network runs on CUDA: first layer, then relu and a 2x2 / stride-2 pool.
        if (!l.relu_pool.empty() && conv_relu_pool_applicable(s))
          bench_conv_relu_pool(ctx, rows, l.relu_pool, s);
        break;
      }
      case LayerKind::Linear:
        bench_linear(
            ctx, rows, l.name,
            LinearShape{int(cur.at(0)), int(shape_numel(cur) / cur.at(0)), spec.out_features});
        break;
      case LayerKind::Relu:
        bench_relu(ctx, rows, l.name, cur);
        break;
      case LayerKind::MaxPool2d: {
        MaxPoolShape s;
        s.n = int(cur.at(0));
        s.c = int(cur.at(1));
        s.h = int(cur.at(2));
        s.w = int(cur.at(3));
        s.kh = spec.kernel_h;
        s.kw = spec.kernel_w;
        s.stride_h = spec.stride_h;
        s.stride_w = spec.stride_w;
        s.pad_h = spec.pad_h;
        s.pad_w = spec.pad_w;
        bench_maxpool(ctx, rows, l.name, s);
        break;
      }
      case LayerKind::BatchNorm2d:
      case LayerKind::BatchNorm1d:
        // The Network folds the relu reading it into the batchnorm (CNN_FUSE_BN_RELU=0 aside);
        // l.name is then "bn<i>+relu<j>".
        bench_batchnorm(ctx, rows, l.name, cur, l.folds_relu);
        break;
      case LayerKind::SoftmaxCrossEntropy:
        bench_xent(ctx, rows, l.name, XentShape{int(cur.at(0)), int(cur.at(1))});
        break;
      case LayerKind::Flatten:
        break;
      default:  // avgpool, dropout: no per-op rows yet (the step bench runs them)
        break;
    }
  }
  const int64_t params = summarize_network(net.specs, net.input_chw).total_params;
  bench_optimizer(ctx, rows, net.optimizer, params);
  return rows;
}

std::vector<BenchRow> bench_depthwise(const BenchContext& ctx) {
  std::vector<BenchRow> rows;
  for (const DepthwiseCase& k : depthwise_cases()) {
    Conv2dGroupedShape s;
    s.n = k.n, s.c = k.c, s.h = k.h, s.w = k.w, s.oc = k.c, s.kh = s.kw = k.k;
    s.pad_h = s.pad_w = k.k / 2;
    s.groups = k.c;
    bench_grouped_conv(ctx, rows, k.name, s, false);
  }
  return rows;
}

}  // namespace cnn::bench

#endif  // CNN_HAVE_CUDA
