// The --dry-run report on configs/mnist.yaml: the reference network's table, shapes and size.
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

#include "app/config/config.h"
#include "app/config/dry_run.h"
#include "tests/test_util.h"

namespace cnn {
namespace {

using test::source_dir;

TEST(DryRun, MnistReferenceNetworkTable) {
  const TrainConfig cfg = load_config(source_dir() + "/configs/mnist.yaml");
  const std::string out = format_dry_run(cfg);
  SCOPED_TRACE(out);

  // Rows in order: each layer's kind and output shape appear after the previous one's.
  const char* expected[] = {"conv2d",    "(32, 28, 28)", "relu",       "(32, 28, 28)",
                            "maxpool2d", "(32, 14, 14)", "conv2d",     "(64, 14, 14)",
                            "relu",      "maxpool2d",    "(64, 7, 7)", "flatten",
                            "(3136)",    "linear",       "(1024)",     "relu",
                            "(1024)",    "linear",       "(10)",       "softmax_cross_entropy",
                            "(10)"};
  size_t pos = 0;
  for (const char* e : expected) {
    const size_t at = out.find(e, pos);
    ASSERT_NE(at, std::string::npos) << "'" << e << "' missing after position " << pos;
    pos = at + 1;
  }
  EXPECT_NE(out.find("3,274,634"), std::string::npos) << "total parameter count";
  EXPECT_NE(out.find("batch size: 128"), std::string::npos);

  const NetworkSummary sum = summarize_network(cfg.model.layers, cfg.model.input_chw);
  EXPECT_EQ(sum.total_params, 3274634);
  const int64_t batch_flops = sum.total_flops * 128;
  std::string digits = std::to_string(batch_flops), commas;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i && (digits.size() - i) % 3 == 0) commas += ',';
    commas += digits[i];
  }
  EXPECT_NE(out.find("forward FLOPs per batch: " + commas), std::string::npos);
}

TEST(DryRun, EveryShippedConfigFormats) {
  for (const char* name : {"mnist", "fashion_mnist", "tiny"}) {
    SCOPED_TRACE(name);
    const TrainConfig cfg = load_config(source_dir() + "/configs/" + name + ".yaml");
    const std::string out = format_dry_run(cfg);
    EXPECT_NE(out.find("softmax_cross_entropy"), std::string::npos);
    EXPECT_NE(out.find("total"), std::string::npos);
  }
}

// A valid config whose FLOPs per batch pass 2^63 (1,024 channels of 1,025x1,025 from 1,024x1,024
// kernels, batch 2^20): the count was a signed overflow (UBSan); now the exact count is left out.
TEST(DryRun, FlopsBeyondInt64AreNotOverflowed) {
  const TrainConfig cfg = parse_config(R"(name: huge
model:
  input: {channels: 1, height: 1024, width: 1024}
  layers:
    - conv2d: {out_channels: 1024, kernel: 1024, padding: 512}
    - maxpool2d: {kernel: 1025}
    - flatten
    - softmax_cross_entropy
data: {format: synthetic, synthetic: {classes: 1024}}
optimizer: {lr: 0.1}
training: {epochs: 1, batch_size: 1048576}
)",
                                       "huge.yaml");
  const std::string out = format_dry_run(cfg);
  SCOPED_TRACE(out);
  EXPECT_NE(out.find("forward FLOPs per batch: more than 2^63 (2365798307358.4"),
            std::string::npos);
}

}  // namespace
}  // namespace cnn
