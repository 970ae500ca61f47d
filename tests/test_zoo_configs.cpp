// The model zoo (configs/resnet_fashion.yaml, mobilenet_fashion.yaml, vgg_cifar.yaml and its
// vgg_fashion_rgb.yaml twin): each
// parses and --dry-runs to its network table. They use layer kinds and keys (batchnorm2d,
// conv2d groups, global_avgpool, dropout, training.label_smoothing) that land from other branches;
// where this build does not know one yet the test skips, naming it, instead of failing.
#include <gtest/gtest.h>

#include <string>

#include "app/config/config.h"
#include "app/config/dry_run.h"
#include "runtime/error.h"
#include "tests/test_util.h"

using namespace cnn;

namespace {

// Loads configs/<name>.yaml and formats its dry run; "" with *pending set when the parse error
// is only about a layer kind or key this build does not have yet.
std::string dry_run_of(const std::string& name, std::string* pending) {
  try {
    return format_dry_run(load_config(test::source_dir() + "/configs/" + name + ".yaml"));
  } catch (const Error& e) {
    const std::string msg = e.what();
    if (!test::pending_layer_error(msg)) throw;
    *pending = msg;
    return "";
  }
}

#define SKIP_IF_PENDING(name, pending)                                                     \
  if (!(pending).empty())                                                                  \
  GTEST_SKIP() << "configs/" << (name)                                                     \
               << ".yaml needs a layer kind or key this build does "                       \
                  "not have yet (BatchNorm, groups, pooling, dropout and label smoothing " \
                  "come from other branches): "                                            \
               << (pending)

TEST(ZooConfigs, ResnetFashionDryRunShowsItsBlocks) {
  std::string pending;
  const std::string out = dry_run_of("resnet_fashion", &pending);
  SKIP_IF_PENDING("resnet_fashion", pending);
  SCOPED_TRACE(out);
  // Six blocks, two with a projection shortcut; the stages' shapes; ten scores.
  size_t blocks = 0, projections = 0;
  for (size_t at = out.find(" residual "); at != std::string::npos;
       at = out.find(" residual ", at + 1))
    ++blocks;
  for (size_t at = out.find("conv2d (shortcut)"); at != std::string::npos;
       at = out.find("conv2d (shortcut)", at + 1))
    ++projections;
  EXPECT_EQ(blocks, 6u);
  EXPECT_EQ(projections, 2u);
  for (const char* shape : {"(32, 28, 28)", "(64, 14, 14)", "(128, 7, 7)", "(128, 1, 1)", "(10)"})
    EXPECT_TRUE(test::contains(out, shape)) << shape;
}

TEST(ZooConfigs, MobilenetFashionDryRuns) {
  std::string pending;
  const std::string out = dry_run_of("mobilenet_fashion", &pending);
  SKIP_IF_PENDING("mobilenet_fashion", pending);
  SCOPED_TRACE(out);
  for (const char* shape : {"(64, 28, 28)", "(128, 14, 14)", "(256, 7, 7)", "(256, 1, 1)", "(10)"})
    EXPECT_TRUE(test::contains(out, shape)) << shape;
}

TEST(ZooConfigs, VggCifarDryRuns) {
  std::string pending;
  const std::string out = dry_run_of("vgg_cifar", &pending);
  SKIP_IF_PENDING("vgg_cifar", pending);
  SCOPED_TRACE(out);
  for (const char* shape : {"(64, 32, 32)", "(128, 8, 8)", "(256, 4, 4)", "(4096)", "(512)"})
    EXPECT_TRUE(test::contains(out, shape)) << shape;
}

// configs/vgg_fashion_rgb.yaml measures vgg_cifar's network on Fashion-MNIST rendered as RGB
// folders: everything but the name line of the dry run (network, training) is the same.
TEST(ZooConfigs, VggFashionRgbIsVggCifarOnOtherData) {
  std::string pending;
  const std::string cifar = dry_run_of("vgg_cifar", &pending);
  SKIP_IF_PENDING("vgg_cifar", pending);
  const std::string rgb = dry_run_of("vgg_fashion_rgb", &pending);
  const auto body = [](const std::string& s) { return s.substr(s.find('\n')); };
  EXPECT_EQ(body(cifar), body(rgb));
  const TrainConfig c = load_config(test::source_dir() + "/configs/vgg_fashion_rgb.yaml");
  EXPECT_EQ(c.data.classes.size(), 10u);
}

}  // namespace
