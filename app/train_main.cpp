// ./train: trains a network as a YAML config says (see configs/), or checks the config and data.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "app/cli_common.h"
#include "app/config/config.h"
#include "app/config/dry_run.h"
#include "app/train/distributed.h"
#include "app/train/launcher.h"
#include "app/train/resume_plan.h"
#include "app/train/run_folder.h"
#include "app/train/trainer.h"
#include "runtime/error.h"

int main(int argc, char** argv) {
  return cnn::run_main("train", [&] {
    CLI::App app{
        "Train a CNN as a YAML config says (see configs/). Errors in the config are "
        "reported, with their line, before anything runs."};
    app.set_version_flag("--version", cnn::version_string("train"), "Print the version and exit");
    cnn::TrainArgs args;
    args.program = argc > 0 ? argv[0] : "train";
    std::string config_path;
    std::vector<std::string> sets;
    std::string device;
    bool dry_run = false, check_data = false, skip_bad = false;
    int gpus = 0;
    app.add_option("-c,--config", config_path,
                   "The run config, e.g. configs/mnist.yaml (optional with --resume: "
                   "the checkpoint's own config is used, --set still applies)")
        ->type_name("FILE");
    app.add_option("--set", sets,
                   "Override one config key, e.g. --set optimizer.lr=0.01 or "
                   "--set model.layers[7].linear.out_features=512 (repeatable)")
        ->type_name("KEY=VALUE")
        ->allow_extra_args(false);
    auto* resume =
        app.add_option("--resume", args.resume,
                       "Continue a run in its own folder from a checkpoint (weights, optimizer, "
                       "step); a run folder stands for its last.safetensors")
            ->type_name("CKPT|RUN_DIR");
    app.add_option("--init-weights", args.init_weights,
                   "Start from a checkpoint's weights with a fresh optimizer and schedule")
        ->type_name("CKPT")
        ->excludes(resume);
    app.add_option("--device", device,
                   "Where to train: cpu, cuda or auto (overrides training.device)")
        ->check(CLI::IsMember({"cpu", "cuda", "auto"}));
    app.add_option("--log-dir", args.log_dir,
                   "Folder for this run's logs and checkpoints (instead of <logging.dir>/<name>, "
                   "or <name>-2, -3, ... when that holds a run); refused when it holds a run")
        ->type_name("DIR");
    app.add_flag("--overwrite", args.overwrite,
                 "Start afresh in <logging.dir>/<name> (or --log-dir), deleting the run there")
        ->excludes(resume);
    auto* dry = app.add_flag("--dry-run", dry_run,
                             "Validate the config, print the network table and FLOPs, and exit");
    app.add_flag("--check-data", check_data,
                 "Read every image of the configured dataset and report")
        ->excludes(dry);
    app.add_option("--gpus", gpus,
                   "Data-parallel training on N GPUs of this machine: N rank processes, each at "
                   "training.batch_size, gradients summed over NCCL (sets training.gpus; --gpus 1 "
                   "also runs the NCCL path)")
        ->type_name("N")
        ->check(CLI::Range(1, 1024));
    app.add_flag("--skip-bad-images", skip_bad,
                 "Skip images that cannot be decoded (overrides data.skip_bad_images)");
    if (!cnn::parse_command_line(app, argc, argv, "train")) return 0;

    // Command-line switches go through the same path as --set, so they are validated the same
    // way and show up in the resolved config the run saves.
    if (!device.empty()) sets.push_back("training.device=" + device);
    if (skip_bad) sets.push_back("data.skip_bad_images=true");
    if (gpus > 0) sets.push_back("training.gpus=" + std::to_string(gpus));
    args.rank =
        cnn::rank_info_from_env([](const char* n) -> const char* { return std::getenv(n); });
    // Under mpirun the number of ranks is mpirun's -np.
    if (args.rank.distributed()) sets.push_back("training.gpus=" + std::to_string(args.rank.world));
    CNN_CHECK(!config_path.empty() || !args.resume.empty(),
              "--config FILE is required (except with --resume, which reads the checkpoint's "
              "config) (see train --help)");
    if (!args.resume.empty()) args.resume = cnn::resolve_resume_path(args.resume);
    const cnn::TrainConfig cfg = config_path.empty()
                                     ? cnn::config_from_checkpoint(args.resume, sets)
                                     : cnn::load_config(config_path, sets);

    if (dry_run) {
      std::fputs(cnn::format_dry_run(cfg).c_str(), stdout);
      return 0;
    }
    if (check_data) return cnn::run_check_data(cfg);
    if (!args.rank.distributed() && (cfg.training.gpus > 1 || gpus > 0)) {
      // The launcher: the ranks are this program again, told which rank they are. What would
      // fail in every rank fails here first, once.
      const std::string unsupported = cnn::multi_gpu_unsupported_reason();
      CNN_CHECK(unsupported.empty(), "training.gpus {}: {}", cfg.training.gpus, unsupported);
      const auto nccl = cnn::open_nccl(cfg.training.nccl_library);
      cnn::LaunchRequest req;
      req.exe = "/proc/self/exe";
      req.argv.assign(argv, argv + argc);
      req.world = cfg.training.gpus;
      std::printf("starting %d rank processes (one per GPU; NCCL %s from %s)\n", req.world,
                  nccl->version_string().c_str(), nccl->path().c_str());
      std::fflush(stdout);
      const cnn::LaunchResult r = cnn::launch_ranks(req);
      if (!r.message.empty()) std::fprintf(stderr, "train: error: %s\n", r.message.c_str());
      return r.exit_code;
    }
    return cnn::run_training(cfg, args);
  });
}
