// The safetensors reader and the checkpoint loader, as ./infer and ./train --resume use them.
// The API reads a path (it checks the file's size with fstat), so the input goes to a temporary
// file first. Three passes: the raw reader (every F32 tensor fetched); ./infer's sequence (the
// metadata, the embedded config, the network it describes, the weights); and the weights against
// a fixed small network, as --resume / --init-weights load them for the configured model.
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>

#include "app/config/config.h"
#include "data/normalize.h"
#include "fuzz/fuzz_util.h"
#include "fuzz/seed_network.h"
#include "layers/checkpoint/checkpoint.h"
#include "layers/checkpoint/safetensors.h"
#include "layers/network.h"

namespace {

// The seed checkpoint's network, so that mutated seeds are checked tensor by tensor against a
// network that matches them.
cnn::Network& fixed_network() {
  static std::unique_ptr<cnn::Network> net = [] {
    const cnn::TrainConfig cfg = cnn::parse_config(cnn::fuzz::kSeedConfig, "seed.yaml");
    cnn::NetworkOptions opt;
    opt.max_batch = 1;
    return std::make_unique<cnn::Network>(cfg.model.layers, cfg.model.input_chw, opt, cnn::Exec{});
  }();
  return *net;
}

const std::string& temp_path() {
  static const std::string path = [] {
    const char* dir = std::getenv("TMPDIR");
    return std::string(dir && *dir ? dir : "/tmp") + "/cnn_fuzz_safetensors_" +
           std::to_string(::getpid()) + ".safetensors";
  }();
  static const bool cleanup = std::atexit([] { std::remove(path.c_str()); }) == 0;
  (void)cleanup;
  return path;
}

void write_input(const std::string& path, const uint8_t* data, size_t size) {
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (!f) cnn::fuzz::bug("cannot create " + path);
  const bool ok = (size == 0 || std::fwrite(data, 1, size, f) == size) && std::fclose(f) == 0;
  if (!ok) cnn::fuzz::bug("cannot write " + path);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  cnn::Network& fixed = fixed_network();
  const std::string& path = temp_path();
  write_input(path, data, size);

  cnn::fuzz::refused([&] {
    const cnn::SafetensorsFile f = cnn::read_safetensors(path);
    for (const auto& e : f.entries()) {
      if (e.dtype != "F32") continue;
      const cnn::NamedTensor t = f.tensor_f32(e.name);
      if (t.data.size() * sizeof(float) != e.end - e.begin)
        cnn::fuzz::bug("tensor '" + e.name + "' size differs from its data_offsets");
    }
  });

  cnn::fuzz::refused([&] {  // ./infer (app/infer_main.cpp)
    const cnn::CheckpointMeta meta = cnn::read_checkpoint_meta(path);
    const cnn::TrainConfig cfg = cnn::parse_config(meta.config_yaml, path + " (embedded config)");
    CNN_CHECK(meta.input_chw == cfg.model.input_chw, "input_chw differs from model.input");
    const int c = int(meta.input_chw[0]);
    cnn::validate_normalization(cnn::Normalization{meta.mean, meta.std}, c);
    cnn::check_checkpoint_can_hold(path, meta, cfg.model.layers, meta.input_chw);
    cnn::NetworkOptions opt;
    opt.max_batch = 1;
    cnn::Network net(cfg.model.layers, meta.input_chw, opt, cnn::Exec{});
    net.params_from_host(cnn::load_checkpoint_for(path, net).params);
  });

  cnn::fuzz::refused([&] {  // ./train --resume / --init-weights (app/trainer.cpp)
    cnn::read_checkpoint_meta(path);
    const cnn::Checkpoint ck = cnn::load_checkpoint_for(path, fixed);
    if (int64_t(ck.params.size()) != fixed.num_params()) cnn::fuzz::bug("wrong parameter count");
  });
  return 0;
}
