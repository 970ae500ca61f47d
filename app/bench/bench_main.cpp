// ./bench: times every kernel of a config's network against cuDNN/cuBLAS on the same shapes and
// precision (after checking each against the CPU reference), and the whole training step.
#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <sstream>
#include <string>
#include <vector>

#include "app/bench/bench_common.h"
#include "app/bench/bench_depthwise.h"
#include "app/bench/bench_infer.h"
#include "app/bench/bench_ops.h"
#include "app/bench/bench_report.h"
#include "app/bench/bench_step.h"
#include "app/cli_common.h"
#include "app/config/config.h"
#include "runtime/device.h"
#include "runtime/error.h"

#ifdef CNN_HAVE_CUDA
#include <cuda_runtime_api.h>

#include <random>

#include "app/bench/bench_cudnn.h"
#include "app/bench/bench_timer.h"
#include "runtime/cuda_check.h"
#include "runtime/memory.h"
#include "runtime/side_stream.h"
#endif

namespace cnn::bench {
namespace {

// Said plainly, before the reason: users run ./bench expecting it to measure their machine.
constexpr const char* kNoGpu =
    "./bench times this project's CUDA kernels against cuDNN/cuBLAS and found no GPU; training "
    "and the tests run on the CPU without it (./train --device cpu)";

constexpr const char* kDefaultConfig = "configs/mnist.yaml";

std::vector<std::string> split_list(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ','))
    if (!item.empty()) out.push_back(item);
  return out;
}

std::vector<int> parse_int_list(const std::string& s, const char* what) {
  std::vector<int> out;
  for (const auto& item : split_list(s)) {
    size_t used = 0;
    int v = 0;
    try {
      v = std::stoi(item, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    CNN_CHECK(used == item.size() && v > 0, "{}: '{}' is not a positive integer", what, item);
    out.push_back(v);
  }
  CNN_CHECK(!out.empty(), "{}: expected a comma-separated list of positive integers, got '{}'",
            what, s);
  return out;
}

#ifdef CNN_HAVE_CUDA

// The network to measure: --config, else configs/mnist.yaml when it exists, else the same
// network built in code.
NetDesc load_net(const std::string& config) {
  std::string path = config;
  if (path.empty() && std::filesystem::exists(kDefaultConfig)) path = kDefaultConfig;
  if (path.empty()) return reference_net();
  const TrainConfig cfg = load_config(path);
  NetDesc n;
  n.source = path;
  n.specs = cfg.model.layers;
  n.input_chw = cfg.model.input_chw;
  n.optimizer = cfg.optimizer;
  return n;
}

std::string with_commas(int64_t v) {
  std::string s = std::to_string(v), out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (i && (s.size() - i) % 3 == 0) out += ',';
    out += s[i];
  }
  return out;
}

DeviceFacts query_device() {
  int dev = 0;
  CNN_CUDA_CHECK(cudaGetDevice(&dev));
  cudaDeviceProp prop{};
  CNN_CUDA_CHECK(cudaGetDeviceProperties(&prop, dev));
  DeviceFacts f;
  f.name = prop.name;
  f.sm_count = prop.multiProcessorCount;
  f.l2_bytes = prop.l2CacheSize;
  f.mem_gib = double(prop.totalGlobalMem) / double(1ull << 30);
  f.cc_major = prop.major;
  f.cc_minor = prop.minor;
  CNN_CUDA_CHECK(cudaDriverGetVersion(&f.driver_version));
  CNN_CUDA_CHECK(cudaRuntimeGetVersion(&f.runtime_version));
  return f;
}

// The two ceilings of this card, measured once: a large device-to-device copy (bytes read plus
// bytes written) and a large SGEMM through cuBLAS in both math modes.
MeasuredPeaks measure_peaks(cudaStream_t stream, Library* lib) {
  MeasuredPeaks m;
  TimerOptions to;
  to.launches = 1;
  to.repeats = 10;
  to.warmup = 2;
  to.use_graph = false;
  {
    const size_t bytes = size_t(1) << 30;
    Buffer<unsigned char> src(bytes, Device::CUDA), dst(bytes, Device::CUDA);
    CNN_CUDA_CHECK(cudaMemsetAsync(src.data(), 0x5A, bytes, stream));
    const Timing t = time_launches(
        stream,
        [&](int) {
          CNN_CUDA_CHECK(
              cudaMemcpyAsync(dst.data(), src.data(), bytes, cudaMemcpyDeviceToDevice, stream));
        },
        to);
    m.copy_GBps = 2.0 * double(bytes) / (t.median_us * 1e3);
  }
  if (lib && lib->cublas_ok()) {
    const int n = 4096;
    const size_t count = size_t(n) * n;
    std::vector<float> h(count);
    std::mt19937_64 rng(7);
    std::uniform_real_distribution<float> u(-1.f, 1.f);
    for (auto& v : h) v = u(rng);
    Buffer<float> a(count, Device::CUDA), b(count, Device::CUDA), c(count, Device::CUDA);
    a.copy_from(h.data(), Device::CPU, count);
    b.copy_from(h.data(), Device::CPU, count);
    for (Precision p : {Precision::FP32, Precision::TF32}) {
      const Timing t = time_launches(
          stream, [&](int) { lib->sgemm(n, n, n, a.data(), b.data(), c.data(), p); }, to);
      const double tflops = 2.0 * double(n) * n * n / (t.median_us * 1e6);
      (p == Precision::FP32 ? m.sgemm_fp32_tflops : m.sgemm_tf32_tflops) = tflops;
    }
  }
  return m;
}

class Stream {
 public:
  // The greatest priority, as the trainer's stream (the optimizer's early updates).
  Stream() {
    CNN_CUDA_CHECK(
        cudaStreamCreateWithPriority(&s_, cudaStreamNonBlocking, greatest_stream_priority()));
  }
  ~Stream() { cudaStreamDestroy(s_); }
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
  cudaStream_t get() const { return s_; }

 private:
  cudaStream_t s_ = nullptr;
};

std::string version_pair(int v) {
  return fmt::format("{}.{}", v / 1000, (v % 1000) / 10);
}

int run(const BenchOptions& opt, const std::string& command) {
  std::string why;
  CNN_CHECK(cuda_available(&why), "{} ({})", kNoGpu, why);
  const NetDesc net = load_net(opt.config);
  Stream stream;
  BenchContext ctx;
  ctx.opt = &opt;
  ctx.dev = query_device();
  ctx.stream = stream.get();
  std::unique_ptr<Library> lib;
  if (opt.use_library) {
    lib = std::make_unique<Library>(ctx.stream);
    ctx.lib = lib.get();
  }

  std::vector<std::string> header;
  const DeviceFacts& d = ctx.dev;
  header.push_back(version_string("bench"));
  header.push_back(fmt::format("command: {}", command));
  header.push_back(
      fmt::format("device: {} (sm_{}{}, {} SMs, {:.0f} MiB L2, {:.1f} GiB), driver {}, runtime {}",
                  d.name, d.cc_major, d.cc_minor, d.sm_count, d.l2_bytes / 1048576.0, d.mem_gib,
                  version_pair(d.driver_version), version_pair(d.runtime_version)));
  const NetworkSummary sum = summarize_network(net.specs, net.input_chw);
  const double fwd_flops = double(sum.total_flops);
  header.push_back(fmt::format(
      "network: {}; input {}; {} parameters; per image {:.2f} MFLOP forward (all layers) and "
      "{:.2f} MFLOP trained (conv/linear forward, input and weight gradients; multiply-add = 2)",
      net.source, shape_str(net.input_chw), with_commas(sum.total_params), fwd_flops / 1e6,
      trained_flops_per_image(net) / 1e6));
  if (lib) {
    header.push_back("library: " + lib->cudnn_status());
    header.push_back("library: " + lib->cublas_status());
  } else {
    header.push_back("library: not used (--no-lib)");
  }
  if (const char* o = std::getenv("NVIDIA_TF32_OVERRIDE"))
    header.push_back(
        fmt::format("WARNING: NVIDIA_TF32_OVERRIDE={} is set; it changes what the "
                    "libraries' FP32 modes do",
                    o));
  header.push_back(fmt::format(
      "peaks used for % peak: FP32 {:.0f} TFLOP/s, TF32 {:.0f} TFLOP/s, BF16 {:.0f} TFLOP/s "
      "(dense), HBM {:.0f} GB/s (H200 datasheet)",
      kPeakFp32Tflops, kPeakTf32Tflops, kPeakBf16Tflops, kPeakHbmGBps));
  for (const auto& h : header) std::fprintf(stderr, "%s\n", h.c_str());
  if (opt.measure_peaks) {
    std::fprintf(stderr, "bench: measuring the copy and SGEMM ceilings...\n");
    const MeasuredPeaks m = measure_peaks(ctx.stream, ctx.lib);
    std::string line =
        fmt::format("measured on this card: device copy {:.0f} GB/s (read + write)", m.copy_GBps);
    if (m.sgemm_fp32_tflops > 0)
      line += fmt::format(", cublasSgemm 4096^3 FP32 {:.1f} TFLOP/s, TF32 {:.1f} TFLOP/s",
                          m.sgemm_fp32_tflops, m.sgemm_tf32_tflops);
    header.push_back(line);
    std::fprintf(stderr, "%s\n", line.c_str());
  }
  header.push_back(fmt::format(
      "method: each variant checked against the CPU reference first (tolerance FP32 {:.0e}, "
      "TF32 {:.0e}, BF16 {:.0e}, element-wise {:.0e}; a wrong one is not timed); ops: {} "
      "launches captured in a CUDA graph, {} replays{}, median and P95 per launch, inputs rotated "
      "among copies {}; step: one step per graph replay, {} replays",
      kTolFp32, kTolTf32, kTolBf16, kTolElementwise, opt.launches, opt.repeats,
      opt.budget_s > 0 ? fmt::format(" (fewer launches and replays, at least 5, where they would "
                                     "take over {:g} s)",
                                     opt.budget_s)
                       : std::string(),
      opt.rotate < 0 ? std::string("filling 2x L2")
                     : fmt::format("({} sets)", std::max(opt.rotate, 1)),
      opt.step_repeats));
  header.push_back(
      "conv/linear op rows run without bias and fused ReLU, so ours and the library compute the "
      "same function; the step uses the network as configured");

  if (opt.infer) {
    std::fprintf(stderr, "bench: inference forward...\n");
    header.push_back(fmt::format(
        "method: one forward per CUDA-graph replay, {} replays, median; random images on the "
        "device; int8 quantized here (max calibration on {} random images: the speed does not "
        "depend on the values); eval mode, no loss",
        opt.step_repeats, 16));
    const std::vector<InferRow> rows = bench_infer(ctx, net, opt.infer_batches);
    const std::string md = format_infer_markdown(header, rows, opt.infer_batches);
    std::fputs(md.c_str(), stdout);
    std::fflush(stdout);
    if (!opt.markdown.empty()) write_text_file(opt.markdown, md);
    if (!opt.csv.empty()) write_text_file(opt.csv, format_infer_csv(rows));
    for (const InferRow& r : rows)
      if (r.note.rfind("WRONG", 0) == 0) {
        std::fprintf(stderr, "bench: %s gave WRONG results and was not timed\n", r.what.c_str());
        return 3;
      }
    return 0;
  }

  std::vector<BenchRow> rows;
  if (opt.depthwise) {
    std::fprintf(stderr, "bench: the depthwise-convolution table...\n");
    const auto start = std::chrono::steady_clock::now();
    rows = bench_depthwise(ctx);
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    std::fprintf(stderr, "bench: the depthwise table took %.1f s\n", seconds);
    std::fputs(format_text(header, rows).c_str(), stdout);
    std::fputs(format_depthwise(rows, opt, seconds, false).c_str(), stdout);
    std::fflush(stdout);
    if (!opt.markdown.empty())
      write_text_file(opt.markdown,
                      format_markdown(header, rows) + format_depthwise(rows, opt, seconds, true));
    if (!opt.csv.empty()) write_text_file(opt.csv, format_csv(rows));
  } else if (opt.run_ops) {
    std::fprintf(stderr, "bench: ops at batch %d...\n", opt.batch);
    rows = bench_ops(ctx, net);
  }
  if (opt.run_step && !opt.depthwise) {
    std::fprintf(stderr, "bench: whole steps...\n");
    std::vector<BenchRow> s = bench_steps(ctx, net);
    rows.insert(rows.end(), s.begin(), s.end());
  }

  if (!opt.depthwise) {
    std::fputs(format_text(header, rows).c_str(), stdout);
    std::fflush(stdout);
    if (!opt.markdown.empty()) write_text_file(opt.markdown, format_markdown(header, rows));
    if (!opt.csv.empty()) write_text_file(opt.csv, format_csv(rows));
  }

  int wrong = 0, errors = 0;
  for (const auto& r : rows) {
    wrong += r.status == "WRONG";
    errors += r.status == "error";
  }
  if (errors)
    std::fprintf(stderr, "bench: %d measurement(s) failed (status 'error' in the table)\n", errors);
  if (wrong) {
    std::fprintf(stderr, "bench: %d variant(s) gave WRONG results and were not timed\n", wrong);
    return 3;
  }
  return 0;
}

#else

int run(const BenchOptions&, const std::string&) {
  CNN_FAIL("{} (this build has no CUDA: nvcc was not found at configure time)", kNoGpu);
}

#endif

}  // namespace
}  // namespace cnn::bench

int main(int argc, char** argv) {
  return cnn::run_main("bench", [&] {
    using namespace cnn;
    bench::BenchOptions opt;
    std::string precision = "both", ops, algos, rotate = "auto", batches = "64,128,512";
    std::string step_algo;
    bool step_only = false, no_step = false, no_lib = false, no_peaks = false;

    CLI::App app{
        "Times every kernel of a network against cuDNN/cuBLAS on the same shapes (after "
        "checking each against the CPU reference) and the whole training step."};
    app.set_version_flag("--version", version_string("bench"));
    app.add_option("--config", opt.config,
                   "config whose model is measured (default: configs/mnist.yaml, or the same "
                   "network built in when that file is missing)");
    app.add_option("--batch", opt.batch, "batch size of the per-op measurements")
        ->check(CLI::PositiveNumber)
        ->capture_default_str();
    app.add_option("--precision", precision,
                   "fp32 | tf32 | bf16 | both (fp32 and tf32) | all (fp32, tf32, bf16)")
        ->check(CLI::IsMember({"fp32", "tf32", "bf16", "both", "all"}))
        ->capture_default_str();
    app.add_option("--ops", ops,
                   "comma-separated filters; an op runs when one is part of its name "
                   "(conv1.fwd, conv2.wgrad, fc1.dgrad, relu1.bwd, pool2.fwd, loss.xent, "
                   "optimizer.sgd, bn1 (batchnorm, a following relu folded in), "
                   "conv2.fwd.to_nhwc: the wgmma-nhwc copy alone, conv2.fwd.prepass: its "
                   "weights and copy, fused and separate; layers inside residual blocks "
                   "and their shortcuts too, named as in ./train --dry-run; "
                   "e.g. --ops conv2,fc1.wgrad)");
    app.add_option("--algos", algos,
                   "our variants to measure (default "
                   "naive,tiled,igemm,fast,wgmma,wgmma-nhwc,auto)");
    app.add_option("--repeats", opt.repeats, "graph replays (timing samples) per op")
        ->check(CLI::PositiveNumber)
        ->capture_default_str();
    app.add_option("--launches", opt.launches, "launches captured in one graph")
        ->check(CLI::PositiveNumber)
        ->capture_default_str();
    app.add_option("--time-budget", opt.budget_s,
                   "seconds the timed samples of one op row may take: slow variants get fewer "
                   "launches and replays (at least 5 replays); 0 = always --repeats x --launches "
                   "(--depthwise: 0.05 unless given)")
        ->check(CLI::NonNegativeNumber)
        ->capture_default_str();
    app.add_option("--lib-retime-within", opt.lib_retime_within,
                   "check and time only the cuDNN convolution algorithms that cudnnFind timed "
                   "within this factor of its fastest (the others are listed); 0 = all "
                   "(default 0; --depthwise: 4)")
        ->check(CLI::NonNegativeNumber);
    app.add_option("--warmup", opt.warmup, "plain rounds of launches before capture")
        ->check(CLI::NonNegativeNumber)
        ->capture_default_str();
    app.add_option("--rotate", rotate,
                   "input copies to rotate among: auto (enough to exceed 2x L2) or a count (1: "
                   "always the same buffers, i.e. warm L2)")
        ->capture_default_str();
    app.add_flag("--step", step_only, "whole-step mode only (no per-op measurements)");
    app.add_flag("--no-step", no_step, "per-op measurements only");
    app.add_option("--step-batches", batches, "batch sizes of the whole-step mode")
        ->capture_default_str();
    app.add_option("--step-repeats", opt.step_repeats, "timed steps per batch size and mode")
        ->check(CLI::PositiveNumber)
        ->capture_default_str();
    app.add_option("--step-algo", step_algo,
                   "whole-step mode: run every conv/linear layer with this variant instead of "
                   "the config's");
    app.add_flag("--depthwise", opt.depthwise,
                 "only the seed article's depthwise-convolution table (naive, tiled, fast and "
                 "cuDNN on its shapes; --ops filters it, e.g. --ops dw3x3_8x64)");
    std::string infer_batches = "1,32,256";
    app.add_flag("--infer", opt.infer,
                 "inference mode only: the forward in FP32, TF32, BF16 and int8 (quantized here) "
                 "at each --infer-batches size, and each int8 stage alone; one Markdown table");
    app.add_option("--infer-batches", infer_batches, "batch sizes of the inference mode")
        ->capture_default_str();
    app.add_flag("--no-lib", no_lib, "skip cuDNN/cuBLAS");
    app.add_flag("--no-peaks", no_peaks, "skip measuring the copy and SGEMM ceilings");
    app.add_flag("--deterministic", opt.deterministic,
                 "run our kernels with fixed-order reductions (Exec::deterministic)");
    app.add_flag("--compare-deterministic", opt.compare_deterministic,
                 "whole-step mode: time each batch size with atomicAdd and with deterministic "
                 "reductions, and note the cost of deterministic mode");
    app.add_option("--seed", opt.seed, "seed of the random inputs")->capture_default_str();
    app.add_option("--markdown", opt.markdown, "also write the results as Markdown to FILE");
    app.add_option("--csv", opt.csv,
                   "also write every row as CSV to FILE (scripts/plot_bench.py "
                   "reads it)");
    if (!parse_command_line(app, argc, argv, "bench")) return 0;

    CNN_CHECK(!(step_only && no_step), "--step and --no-step exclude each other");
    CNN_CHECK(opt.lib_retime_within == 0 || opt.lib_retime_within >= 1,
              "--lib-retime-within {}: expected 0 (time every algorithm) or a factor >= 1",
              opt.lib_retime_within);
    if (opt.depthwise) {
      // The table's own defaults (bench_depthwise.h): it has ~200 rows.
      if (app.count("--time-budget") == 0) opt.budget_s = bench::kDepthwiseRowBudgetS;
      if (app.count("--lib-retime-within") == 0)
        opt.lib_retime_within = bench::kDepthwiseLibRetimeWithin;
    }
    opt.run_ops = !step_only;
    opt.run_step = !no_step;
    opt.use_library = !no_lib;
    opt.measure_peaks = !no_peaks;
    if (precision == "fp32") opt.precisions = {Precision::FP32};
    if (precision == "tf32") opt.precisions = {Precision::TF32};
    if (precision == "bf16") opt.precisions = {Precision::BF16};
    if (precision == "all") opt.precisions = {Precision::FP32, Precision::TF32, Precision::BF16};
    opt.ops = bench::split_list(ops);
    if (!algos.empty()) {
      opt.algos.clear();
      for (const auto& a : bench::split_list(algos)) opt.algos.push_back(parse_algo(a));
      CNN_CHECK(!opt.algos.empty(), "--algos: expected a list such as naive,tiled,auto");
    }
    if (rotate != "auto") opt.rotate = bench::parse_int_list(rotate, "--rotate").at(0);
    opt.step_batches = bench::parse_int_list(batches, "--step-batches");
    opt.infer_batches = bench::parse_int_list(infer_batches, "--infer-batches");
    if (opt.infer) opt.measure_peaks = false;  // the inference table does not use them
    if (!step_algo.empty()) {
      opt.algo_override = true;
      opt.step_algo = parse_algo(step_algo);
    }
    std::string command = "./bench";
    for (int i = 1; i < argc; ++i) command += std::string(" ") + argv[i];
    return bench::run(opt, command);
  });
}
