// ./gradcheck: numerical gradient checks. Without --config: every layer kind in several
// configurations plus a small whole network, in double on the CPU (< 1e-6) and with the float
// kernels on the chosen device (< 1e-2). With --config: the same two checks on that config's
// network, on a small batch, at a seeded sample of coordinates per tensor (their central
// differences computed once, in parallel, and shared by the checks). Prints each tensor's relative
// error; exits 1 if any check fails.
#include <CLI/CLI.hpp>
#include <cstdio>

#include "app/cli_common.h"
#include "app/config/config.h"
#include "layers/gradcheck/gradcheck.h"
#include "runtime/error.h"

namespace {

bool report(const std::string& title, const cnn::GradcheckResult& r) {
  std::printf("%s [%s]\n%s", title.c_str(), r.title.c_str(), cnn::format_gradcheck(r).c_str());
  std::fflush(stdout);
  return r.passed();
}

}  // namespace

int main(int argc, char** argv) {
  return cnn::run_main("gradcheck", [&] {
    CLI::App app{"Numerical gradient checks of every layer's backward pass (central differences)"};
    app.set_version_flag("--version", cnn::version_string("gradcheck"));
    std::string config, device = "auto", precision = "fp32";
    std::vector<std::string> overrides;
    cnn::GradcheckOptions opt;
    int samples = 0;
    app.add_option("--config", config, "check this config's network instead of the built-in cases");
    app.add_option("--set", overrides, "override a config key (key.path=value), repeatable");
    app.add_option("--device", device, "where the float kernels run: cpu, cuda or auto")
        ->check(CLI::IsMember({"cpu", "cuda", "auto"}));
    app.add_option("--precision", precision,
                   "multiply precision of the conv / linear passes: fp32, tf32 or bf16 (GPU)")
        ->check(CLI::IsMember({"fp32", "tf32", "bf16"}));
    app.add_option("--batch", opt.batch, "images per check")->check(CLI::Range(1, 64));
    app.add_option("--seed", opt.seed, "random seed for inputs, weights and sampled coordinates");
    app.add_option("--samples", samples,
                   "coordinates checked per tensor, all of a smaller one (default 24, config 16)")
        ->check(CLI::Range(1, 100000));
    app.add_option("--step", opt.step, "central-difference step (double precision)")
        ->check(CLI::Range(1e-9, 1e-2))
        ->capture_default_str();
    if (!cnn::parse_command_line(app, argc, argv, "gradcheck")) return 0;

    cnn::Exec ex;
    ex.device = cnn::resolve_device(device);
    ex.precision = cnn::parse_precision(precision);
    std::vector<cnn::GradcheckCase> cases;
    if (config.empty()) {
      cases = cnn::gradcheck_layer_cases();
      cases.push_back(cnn::gradcheck_small_network_case());
      opt.samples_per_tensor = samples ? samples : 24;
    } else {
      cnn::TrainConfig cfg = cnn::load_config(config, overrides);
      cases.push_back({config, cfg.model.layers, cfg.model.input_chw});
      opt.samples_per_tensor = samples ? samples : 16;
      opt.label_smoothing = cfg.training.label_smoothing;  // the loss the config trains
    }
    bool ok = true;
    int failed = 0;
    for (const auto& c : cases) {
      cnn::Gradchecker check(c.specs, c.input_chw, opt);
      std::printf(
          "%s: batch %d, %d sampled coordinates per tensor (all of smaller ones), seed %llu\n",
          c.title.c_str(), check.batch(), opt.samples_per_tensor,
          static_cast<unsigned long long>(opt.seed));
      bool pass = report(c.title, check.reference());
      for (bool det : {false, true}) {
        if (det && ex.device == cnn::Device::CPU) continue;  // the CPU is always deterministic
        ex.deterministic = det;
        pass &= report(c.title, check.network(ex, true));
      }
      failed += !pass;
      ok &= pass;
    }
    std::printf("gradcheck: %zu cases, %d failed (device %s)\n", cases.size(), failed,
                cnn::device_name(ex.device));
    return ok ? 0 : 1;
  });
}
