// ./quantize: post-training int8 quantization of a float checkpoint. Folds BatchNorm, quantizes
// weights per output channel, calibrates one activation scale per layer input on training
// images, and writes a safetensors file that ./infer --precision int8 runs.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "app/cli_common.h"
#include "app/quant_cli.h"
#include "layers/network.h"
#include "layers/quant/int8_network.h"
#include "layers/quant/quant_file.h"
#include "runtime/device.h"
#include "runtime/env_switches.h"
#include "runtime/error.h"

namespace cnn {
namespace {

std::string default_output(const std::string& ckpt) {
  std::filesystem::path p(ckpt);
  return (p.parent_path() / (p.stem().string() + ".int8.safetensors")).string();
}

int quantize(const std::string& ckpt_arg, int calibrate, const std::string& method_name,
             std::string output, const std::string& data_dir, bool evaluate,
             const std::string& device) {
  const CalibrationMethod method = parse_calibration_method(method_name);
  const std::string ckpt = resolve_checkpoint(ckpt_arg);
  if (output.empty()) output = default_output(ckpt);
  const Fp32Model fp = load_fp32_model(ckpt);
  int count = 0;
  const std::vector<float> calib = calibration_images(fp.cfg, fp.meta, calibrate, data_dir, &count);
  // Calibration's float forward runs where --evaluate runs: the training network on the GPU when
  // there is one, the CPU loops otherwise.
  Exec ex;
  ex.device = resolve_device(device);
  const QuantizedModel qm =
      quantize_network(fp.folded, fp.meta.input_chw, calib.data(), count, method, ex);
  for (const std::string& f : fp.folded.folded) std::printf("folded %s\n", f.c_str());
  int64_t int8_bytes = 0, float_bytes = 0;
  for (const QuantStage& q : qm.stages) {
    std::string fused;
    for (const auto& f : q.fused) fused += " + " + f;
    if (q.add) {
      std::printf(
          "%-8s%s: int8 add, input scales %.4g (layers) and %.4g (shortcut), output scale "
          "%.4g\n",
          q.name.c_str(), fused.c_str(), double(q.input_scale), double(q.shortcut_scale),
          double(q.output_scale));
      int8_bytes += 3 * 4;
      continue;
    }
    if (q.avgpool) {
      std::printf("%-8s%s: int8 avgpool %dx%d, input scale %.4g, output scale %.4g\n",
                  q.name.c_str(), fused.c_str(), q.pool_kh, q.pool_kw, double(q.input_scale),
                  double(q.output_scale));
      int8_bytes += 2 * 4;
      continue;
    }
    const auto [lo, hi] = std::minmax_element(q.weight_scale.begin(), q.weight_scale.end());
    std::printf("%-8s%s: int8 weights %s, weight scales %.3g..%.3g, input scale %.4g\n",
                q.name.c_str(), fused.c_str(), shape_str(q.weight_shape()).c_str(), double(*lo),
                double(*hi), double(q.input_scale));
    int8_bytes += q.weight_numel() + 4 * (2 * q.oc + 1);
    float_bytes += 4 * (q.weight_numel() + q.oc);
  }
  save_quantized(output, qm, fp.meta, fp.folded.folded);
  std::printf(
      "wrote %s: %lld bytes of tensors (float: %lld), %s calibration on %d training images "
      "(%s)\n",
      output.c_str(), (long long)int8_bytes, (long long)float_bytes, qm.method.c_str(), count,
      device_name(ex.device));
  if (evaluate) {
    constexpr int kBatch = 256;
    NetworkOptions nopt;
    nopt.max_batch = kBatch;
    nopt = with_env_switches(nopt, process_env_switches());
    Network net(fp.folded.specs, fp.meta.input_chw, nopt, ex);
    net.params_from_host(fp.folded.params);
    net.buffers_from_host(fp.folded.buffers);
    Int8Network qnet(qm, kBatch, ex, !process_env_switches().int8_direct,
                     process_env_switches().int8_fuse_classifier);
    const int64_t image = shape_numel(fp.meta.input_chw);
    Buffer<float> d_x(size_t(kBatch) * size_t(image), ex.device);
    auto run = [&](auto& model) {
      return test_set_accuracy(fp.cfg, fp.meta, kBatch, data_dir, [&](int n, const float* h_x) {
        d_x.copy_from(h_x, Device::CPU, size_t(n) * size_t(image));
        const float* d_y = model.forward(n, d_x.data());
        std::vector<float> y(size_t(n) * size_t(model.num_classes()));
        raw_copy(y.data(), Device::CPU, d_y, ex.device, y.size() * sizeof(float));
        return y;
      });
    };
    const TestAccuracy a32 = run(net), a8 = run(qnet);
    std::printf("test accuracy: fp32 %.2f%%, int8 %.2f%% (%+.2f points) on %lld images (%s)\n",
                100 * a32.accuracy, 100 * a8.accuracy, 100 * (a8.accuracy - a32.accuracy),
                (long long)a8.count, device_name(ex.device));
  }
  return 0;
}

}  // namespace
}  // namespace cnn

int main(int argc, char** argv) {
  return cnn::run_main("quantize", [&] {
    CLI::App app{"Quantize a float checkpoint to int8 (per-channel weights) for ./infer"};
    app.set_version_flag("--version", cnn::version_string("quantize"));
    std::string ckpt, method = cnn::calibration_method_name(cnn::kDefaultCalibration), output,
                      data_dir, device = "auto";
    int calibrate = 512;
    bool evaluate = false;
    app.add_option("--checkpoint", ckpt, "float checkpoint written by ./train, or its run folder")
        ->required();
    app.add_option("--calibrate", calibrate, "training images that calibrate the activation scales")
        ->check(CLI::Range(1, 1 << 20));
    app.add_option("--method", method, "activation calibration: max, percentile (99.99%) or mse")
        ->check(CLI::IsMember({"max", "percentile", "mse"}));
    app.add_option("--output", output,
                   "the quantized safetensors file (default: CKPT's stem + .int8.safetensors)");
    app.add_option("--data", data_dir, "dataset folder instead of the config's data.dir (IDX)");
    app.add_flag("--evaluate", evaluate,
                 "also print the test-set accuracy of the float and the int8 model");
    app.add_option("--device", device, "cpu, cuda or auto: where calibration and --evaluate run")
        ->check(CLI::IsMember({"cpu", "cuda", "auto"}));
    if (!cnn::parse_command_line(app, argc, argv, "quantize")) return 0;
    return cnn::quantize(ckpt, calibrate, method, output, data_dir, evaluate, device);
  });
}
