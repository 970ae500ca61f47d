// Config parsing and validation: every shipped config loads, and every kind of mistake is reported
// as one line naming the file, the key path, its line and what was expected.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "app/config/config.h"
#include "app/config/did_you_mean.h"
#include "runtime/error.h"
#include "tests/test_util.h"

namespace cnn {
namespace {

using test::source_dir;

// A small valid config; the tests break one thing at a time. Line numbers matter below.
const char* kBase = R"(name: t
model:
  input: {channels: 1, height: 8, width: 8}
  layers:
    - conv2d: {out_channels: 4, kernel: 3, padding: 1}
    - relu
    - maxpool2d: {kernel: 2}
    - flatten
    - linear: {out_features: 3}
    - softmax_cross_entropy
data:
  format: synthetic
  classes: [a, b, c]
  synthetic: {train: 10, test: 5, classes: 3}
  normalize: {mean: [0.5], std: [0.25]}
optimizer:
  lr: 0.1
training:
  epochs: 2
  batch_size: 4
)";

std::string replaced(std::string text, const std::string& from, const std::string& to) {
  const size_t at = text.find(from);
  EXPECT_NE(at, std::string::npos) << "test bug: '" << from << "' not in the config";
  if (at != std::string::npos) text.replace(at, from.size(), to);
  return text;
}

// The one-line message parse_config throws, or "" (and a failure) when it accepts the text.
std::string error_of(const std::string& text, const std::vector<std::string>& sets = {}) {
  try {
    parse_config(text, "t.yaml", sets);
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_EQ(msg.find('\n'), std::string::npos) << "not one line: " << msg;
    return msg;
  }
  ADD_FAILURE() << "the config was accepted";
  return "";
}

#define EXPECT_HAS(msg, part) \
  EXPECT_NE((msg).find(part), std::string::npos) << "'" << (part) << "' not in: " << (msg)

TEST(Config, BaseParsesWithDefaults) {
  const TrainConfig c = parse_config(kBase, "t.yaml");
  EXPECT_EQ(c.name, "t");
  EXPECT_EQ(c.model.input_chw, (Shape{1, 8, 8}));
  ASSERT_EQ(c.model.layers.size(), 6u);
  EXPECT_EQ(c.model.layers[0].kind, LayerKind::Conv2d);
  EXPECT_EQ(c.model.layers[0].name, "conv1");
  EXPECT_EQ(c.model.layers[0].kernel_h, 3);
  EXPECT_EQ(c.model.layers[0].kernel_w, 3);
  EXPECT_EQ(c.model.layers[0].pad_h, 1);
  EXPECT_EQ(c.model.layers[0].stride_w, 1);
  EXPECT_EQ(c.model.layers[0].line, 5);
  EXPECT_EQ(c.model.layers[2].kind, LayerKind::MaxPool2d);
  EXPECT_EQ(c.model.layers[2].stride_h, 2);  // defaults to the window
  EXPECT_EQ(c.model.layers[4].out_features, 3);
  EXPECT_EQ(c.model.layers[5].kind, LayerKind::SoftmaxCrossEntropy);
  EXPECT_EQ(c.data.format, DataFormat::Synthetic);
  EXPECT_EQ(c.data.classes, (std::vector<std::string>{"a", "b", "c"}));
  EXPECT_EQ(c.data.channels, 1);
  EXPECT_EQ(c.data.height, 8);
  EXPECT_EQ(c.data.mean, (std::vector<float>{0.5f}));
  EXPECT_EQ(c.data.std, (std::vector<float>{0.25f}));
  EXPECT_EQ(c.known_class_count(), 3);
  EXPECT_EQ(c.optimizer.type, OptimizerType::Sgd);
  EXPECT_DOUBLE_EQ(c.optimizer.lr, 0.1);
  EXPECT_EQ(c.schedule.type, ScheduleType::Constant);
  EXPECT_EQ(c.training.epochs, 2);
  EXPECT_EQ(c.training.batch_size, 4);
  EXPECT_EQ(c.training.device, "auto");
  EXPECT_EQ(c.training.max_steps, 0);
  EXPECT_EQ(c.logging.dir, "logs");
  EXPECT_EQ(c.run_dir(), "logs/t");
  EXPECT_EQ(c.checkpoint.dir, "logs/t");
  EXPECT_EQ(c.source_path, "t.yaml");
  EXPECT_FALSE(c.resolved_yaml.empty());
}

TEST(Config, NameDefaultsToTheFileStem) {
  const TrainConfig c = parse_config(replaced(kBase, "name: t\n", ""), "dir/my_run.yaml");
  EXPECT_EQ(c.name, "my_run");
}

TEST(Config, EveryShippedConfigParsesAndRoundTrips) {
  const std::filesystem::path dir = std::filesystem::path(source_dir()) / "configs";
  int count = 0;
  // configs/probes/ too: the benchmark nets outside the zoo.
  for (const auto& entry : std::filesystem::recursive_directory_iterator(dir)) {
    if (entry.path().extension() != ".yaml") continue;
    SCOPED_TRACE(entry.path().string());
    ++count;
    // out_features: auto counts the class folders of data.train, which is the user's and not
    // here: the classes are given instead (the folder counting is test_own_images' part).
    std::ifstream in(entry.path());
    const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    std::vector<std::string> sets;
    if (text.find("out_features: auto") != std::string::npos) sets = {"data.classes=[a, b]"};
    TrainConfig c;
    ASSERT_NO_THROW(c = load_config(entry.path().string(), sets));
    // The resolved text reads back to the same configuration.
    TrainConfig again;
    ASSERT_NO_THROW(again = parse_config(c.resolved_yaml, "resolved.yaml"));
    EXPECT_EQ(again.resolved_yaml, c.resolved_yaml);
  }
  EXPECT_GE(count, 3);
}

TEST(Config, ShippedConfigsSayWhatTheyShould) {
  const TrainConfig m = load_config(source_dir() + "/configs/mnist.yaml");
  EXPECT_EQ(m.name, "mnist");
  EXPECT_EQ(m.data.format, DataFormat::Idx);
  EXPECT_EQ(m.data.dir, "datasets/mnist");
  EXPECT_EQ(m.model.layers.size(), 11u);
  EXPECT_EQ(m.optimizer.type, OptimizerType::Sgd);
  EXPECT_DOUBLE_EQ(m.optimizer.lr, 0.05);
  EXPECT_DOUBLE_EQ(m.optimizer.momentum, 0.9);
  EXPECT_EQ(m.training.batch_size, 128);
  ASSERT_EQ(m.data.mean.size(), 1u);
  EXPECT_FLOAT_EQ(m.data.mean[0], 0.1307f);
  EXPECT_FLOAT_EQ(m.data.std[0], 0.3081f);

  const TrainConfig f = load_config(source_dir() + "/configs/fashion_mnist.yaml");
  EXPECT_EQ(f.data.dir, "datasets/fashion-mnist");
  ASSERT_EQ(f.data.classes.size(), 10u);
  EXPECT_EQ(f.data.classes[0], "T-shirt/top");
  EXPECT_EQ(f.data.classes[9], "Ankle boot");
  EXPECT_EQ(f.schedule.type, ScheduleType::Cosine);

  const TrainConfig t = load_config(source_dir() + "/configs/tiny.yaml");
  EXPECT_EQ(t.name, "tiny");
  EXPECT_EQ(t.data.format, DataFormat::Synthetic);
  EXPECT_GE(t.known_class_count(), 2);
}

TEST(Config, UnknownKeySuggestsTheClosestOne) {
  const std::string msg = error_of(replaced(kBase, "out_channels: 4", "out_chanels: 4"));
  EXPECT_HAS(msg, "t.yaml:5:");
  EXPECT_HAS(msg, "model.layers[0].conv2d.out_chanels");
  EXPECT_HAS(msg, "unknown key");
  EXPECT_HAS(msg, "did you mean 'out_channels'?");

  const std::string top = error_of(replaced(kBase, "optimizer:", "optimiser:"));
  EXPECT_HAS(top, "t.yaml:16: optimiser: unknown key");
  EXPECT_HAS(top, "did you mean 'optimizer'?");

  const std::string kind = error_of(replaced(kBase, "    - relu\n", "    - rleu\n"));
  EXPECT_HAS(kind, "t.yaml:6: model.layers[1]");
  EXPECT_HAS(kind, "did you mean 'relu'?");

  const std::string kind_map = error_of(replaced(kBase, "- conv2d: {", "- conv2: {"));
  EXPECT_HAS(kind_map, "t.yaml:5: model.layers[0].conv2: unknown layer kind");
  EXPECT_HAS(kind_map, "did you mean 'conv2d'?");

  const std::string choice = error_of(replaced(kBase, "  lr: 0.1", "  type: sdg\n  lr: 0.1"));
  EXPECT_HAS(choice, "t.yaml:17: optimizer.type: expected one of sgd, adam, adamw, got 'sdg'");
  EXPECT_HAS(choice, "did you mean 'sgd'?");
}

TEST(Config, WrongTypes) {
  const std::string msg = error_of(replaced(kBase, "batch_size: 4", "batch_size: abc"));
  EXPECT_HAS(msg, "t.yaml:20: training.batch_size: expected an integer");
  EXPECT_HAS(msg, "got 'abc'");

  EXPECT_HAS(error_of(replaced(kBase, "epochs: 2", "epochs: 2.5")), "t.yaml:19: training.epochs");
  EXPECT_HAS(error_of(replaced(kBase, "lr: 0.1", "lr: fast")),
             "t.yaml:17: optimizer.lr: expected a number > 0, got 'fast'");
  EXPECT_HAS(error_of(replaced(kBase, "lr: 0.1", "lr: [0.1]")),
             "t.yaml:17: optimizer.lr: expected a number > 0, got a list");
  EXPECT_HAS(error_of(replaced(kBase, "batch_size: 4", "batch_size: 4\n  deterministic: maybe")),
             "t.yaml:21: training.deterministic: expected true or false, got 'maybe'");
  EXPECT_HAS(
      error_of(replaced(kBase, "kernel: 3,", "kernel: [3, 3, 3],")),
      "t.yaml:5: model.layers[0].conv2d.kernel: expected an integer or a list [height, width]");
  EXPECT_HAS(error_of(replaced(kBase, "optimizer:\n  lr: 0.1\n", "optimizer: 0.1\n")),
             "t.yaml:16: optimizer: expected a map with keys type, lr,");
  EXPECT_HAS(error_of(replaced(kBase, "{out_features: 3}", "{out_features: 99999999999}")),
             "model.layers[4].linear.out_features: expected an integer in [1, 2147483647]");
}

TEST(Config, MissingRequiredKeys) {
  const std::string lr = error_of(replaced(kBase, "  lr: 0.1\n", "  momentum: 0.5\n"));
  EXPECT_HAS(lr, "t.yaml:16: optimizer.lr: missing required key");
  EXPECT_HAS(error_of(replaced(kBase, "height: 8, ", "")),
             "t.yaml:3: model.input.height: missing required key");
  EXPECT_HAS(error_of(replaced(kBase, "  format: synthetic\n", "")),
             "t.yaml:11: data.format: missing required key");
  EXPECT_HAS(error_of(replaced(kBase, "format: synthetic", "format: idx")),
             "t.yaml:11: data.dir: missing required key");
  EXPECT_HAS(error_of(replaced(kBase, "{out_features: 3}", "{bias: false}")),
             "t.yaml:9: model.layers[4].linear.out_features: missing required key");
  EXPECT_HAS(
      error_of(replaced(kBase, "- conv2d: {out_channels: 4, kernel: 3, padding: 1}", "- conv2d")),
      "t.yaml:5: model.layers[0]: a conv2d layer needs its parameters");
  EXPECT_HAS(error_of(""), "training: missing required key");
}

TEST(Config, OutOfRangeValues) {
  EXPECT_HAS(error_of(replaced(kBase, "kernel: 3,", "kernel: 0,")),
             "t.yaml:5: model.layers[0].conv2d.kernel: expected an integer >= 1, got 0");
  EXPECT_HAS(error_of(replaced(kBase, "kernel: 3,", "kernel: [3, 0],")),
             "t.yaml:5: model.layers[0].conv2d.kernel[1]: expected an integer >= 1, got 0");
  EXPECT_HAS(error_of(replaced(kBase, "lr: 0.1", "lr: -0.1")),
             "t.yaml:17: optimizer.lr: expected a number > 0, got -0.1");
  EXPECT_HAS(error_of(replaced(kBase, "batch_size: 4", "batch_size: 0")),
             "t.yaml:20: training.batch_size: expected an integer in [1, 1048576], got 0");
  EXPECT_HAS(error_of(replaced(kBase, "epochs: 2", "epochs: 0")), "t.yaml:19: training.epochs");
  EXPECT_HAS(
      error_of(replaced(kBase, "format: synthetic", "format: synthetic\n  validation_split: 1")),
      "t.yaml:13: data.validation_split: expected a number in [0, 1), got 1");
  EXPECT_HAS(error_of(replaced(kBase, "mean: [0.5]", "mean: [0.5, 0.5]")),
             "t.yaml:15: data.normalize.mean: expected 1 value (one per channel");
  EXPECT_HAS(error_of(replaced(kBase, "std: [0.25]", "std: [0]")),
             "t.yaml:15: data.normalize.std[0]: expected a number > 0, got 0");
  EXPECT_HAS(error_of(replaced(kBase, "std: [0.25]", "std: [-1]")), "data.normalize.std[0]");
  EXPECT_HAS(error_of(replaced(kBase, "{out_features: 3}", "{out_features: -3}")),
             "t.yaml:9: model.layers[4].linear.out_features: expected an integer >= 1, got -3");
  EXPECT_HAS(error_of(replaced(kBase, "format: synthetic", "format: synthetic\n  channels: 3")),
             "t.yaml:13: data.channels: expected 1 to match model.input.channels (line 3), got 3");
}

TEST(Config, LayersThatDoNotChain) {
  // Without flatten, the linear layer gets an image.
  const std::string text = replaced(kBase, "    - flatten\n", "");
  const std::string msg = error_of(text);
  EXPECT_HAS(msg, "t.yaml:8: model.layers[3].linear");
  EXPECT_HAS(msg, "flatten");

  // A window larger than its input.
  EXPECT_HAS(error_of(replaced(kBase, "{kernel: 2}", "{kernel: 9}")),
             "t.yaml:7: model.layers[2].maxpool2d");
  EXPECT_HAS(error_of(replaced(kBase, "    - softmax_cross_entropy\n", "")),
             "t.yaml:9: model.layers[4].linear: the last layer must be softmax_cross_entropy");
  EXPECT_HAS(error_of(replaced(kBase, "    - relu\n", "    - softmax_cross_entropy\n")),
             "t.yaml:6: model.layers[1]: softmax_cross_entropy must be the last layer");
  EXPECT_HAS(
      error_of(replaced(replaced(kBase, "padding: 1}", "padding: 1, name: a}"), "{out_features: 3}",
                        "{out_features: 3, name: a}")),
      "t.yaml:9: model.layers[4].linear.name: the name 'a' is already used by model.layers[0]");
}

// Sizes in range one by one whose products do not fit: refused with the layer, never overflowed
// (UBSan found the signed overflows in the shape and FLOP arithmetic).
TEST(Config, NetworksTooLargeToIndexAreRefused) {
  const std::string big_input = replaced(kBase, "{channels: 1, height: 8, width: 8}",
                                         "{channels: 1, height: 65536, width: 65536}");
  EXPECT_HAS(
      error_of(big_input),
      "t.yaml:5: model.layers[0].conv2d: layer 'conv1' (conv2d) at config line 5: the input of "
      "one image has more than 2^31-1 values");
  EXPECT_HAS(error_of(replaced(kBase, "out_channels: 4,", "out_channels: 33554432,")),
             "model.layers[0].conv2d: layer 'conv1' (conv2d) at config line 5: the output of one "
             "image has more than 2^31-1 values");
  EXPECT_HAS(error_of(replaced(kBase, "out_channels: 4,", "out_channels: 2147483647,")),
             "layer 'conv1' (conv2d) at config line 5: the weight tensor has more than 2^31-1 "
             "values");
  EXPECT_HAS(error_of(replaced(kBase, "padding: 1}", "padding: 2147483647}")),
             "the output of one image has more than 2^31-1 values");
  EXPECT_HAS(
      error_of(replaced(kBase, "{kernel: 2}", "{kernel: 2147483647, padding: 1073741823}")),
      "model.layers[2].maxpool2d: layer 'pool1' (maxpool2d) at config line 7: the window has "
      "more than 2^31-1 values");
  EXPECT_HAS(error_of(replaced(kBase, "{out_features: 3}", "{out_features: 2147483647}")),
             "model.layers[4].linear: layer 'fc1' (linear) at config line 9: the weight tensor has "
             "more than 2^31-1 values");
  // A leading flatten sees the model input itself.
  EXPECT_HAS(error_of(replaced(big_input,
                               "    - conv2d: {out_channels: 4, kernel: 3, padding: 1}\n"
                               "    - relu\n    - maxpool2d: {kernel: 2}\n",
                               "")),
             "model.layers[0]: layer 'flatten1' (flatten) at config line 5: the input of one image "
             "has more than 2^31-1 values");
}

TEST(Config, ClassCountMustMatchTheLastLayer) {
  const std::string msg = error_of(replaced(kBase, "{out_features: 3}", "{out_features: 4}"));
  EXPECT_HAS(msg, "t.yaml:9: model.layers[4].linear.out_features");
  EXPECT_HAS(msg, "4 class scores but data.classes (line 13) lists 3 classes; expected 3");

  // The synthetic class count counts when no names are given.
  const std::string syn = error_of(
      replaced(replaced(kBase, "  classes: [a, b, c]\n", ""), "classes: 3}", "classes: 5}"));
  EXPECT_HAS(syn, "model.layers[4].linear.out_features");
  EXPECT_HAS(syn, "data.synthetic.classes (line 13) gives 5 classes");

  EXPECT_HAS(error_of(replaced(kBase, "classes: [a, b, c]", "classes: [a, b, a]")),
             "t.yaml:13: data.classes[2]: the class name 'a' is listed twice");
}

TEST(Config, DuplicateKeysAreRefused) {
  EXPECT_HAS(error_of(replaced(kBase, "  lr: 0.1\n", "  lr: 0.1\n  lr: 0.2\n")),
             "t.yaml:18: optimizer.lr: duplicate key (first given at line 17)");
}

TEST(Config, MalformedYaml) {
  const std::string msg = error_of("name: t\nmodel:\n  input: {channels: 1\n  layers: [relu\n");
  EXPECT_HAS(msg, "t.yaml:");
  EXPECT_HAS(msg, "malformed YAML");
  const std::string indent = error_of("name: t\nmodel:\n  input: 1\n layers: 2\n");
  EXPECT_HAS(indent, "t.yaml:4:");
  EXPECT_HAS(indent, "malformed YAML");
}

TEST(Config, UnreadableFile) {
  try {
    load_config("/nonexistent/dir/none.yaml");
    ADD_FAILURE() << "no error for a missing file";
  } catch (const Error& e) {
    EXPECT_HAS(std::string(e.what()), "/nonexistent/dir/none.yaml");
  }
}

TEST(ConfigSet, OverridesScalarsAndListItems) {
  const TrainConfig c =
      parse_config(kBase, "t.yaml",
                   {"optimizer.lr=0.01", "training.max_steps=7",
                    "model.layers[0].conv2d.out_channels=6", "data.augment.shift=2", "name=other"});
  EXPECT_DOUBLE_EQ(c.optimizer.lr, 0.01);
  EXPECT_EQ(c.training.max_steps, 7);
  EXPECT_EQ(c.model.layers[0].out_channels, 6);
  EXPECT_EQ(c.data.augment.shift, 2);
  EXPECT_EQ(c.name, "other");
  EXPECT_EQ(c.checkpoint.dir, "logs/other");
  EXPECT_NE(c.resolved_yaml.find("lr: 0.01"), std::string::npos);

  const TrainConfig m = load_config(source_dir() + "/configs/mnist.yaml",
                                    {"model.layers[7].linear.out_features=512"});
  EXPECT_EQ(m.model.layers[7].out_features, 512);
  // Later overrides win; a quoted value stays a string.
  const TrainConfig q = parse_config(
      kBase, "t.yaml", {"logging.dir=a", "logging.dir=\"x: y\"", "optimizer.betas=[0.8, 0.9]"});
  EXPECT_EQ(q.logging.dir, "x: y");
  EXPECT_DOUBLE_EQ(q.optimizer.beta1, 0.8);
  // A bare-name layer can be swapped for another.
  const TrainConfig r = parse_config(kBase, "t.yaml", {"model.layers[1]=relu"});
  EXPECT_EQ(r.model.layers[1].kind, LayerKind::Relu);
}

TEST(ConfigSet, PrecisionTakesBf16) {
  EXPECT_EQ(parse_config(kBase, "t.yaml", {"training.precision=bf16"}).training.precision,
            Precision::BF16);
  const TrainConfig c = parse_config(kBase, "t.yaml", {"training.precision=bf16"});
  EXPECT_NE(c.resolved_yaml.find("precision: bf16"), std::string::npos) << c.resolved_yaml;
  EXPECT_EQ(parse_config(c.resolved_yaml, "resolved.yaml").training.precision, Precision::BF16);
  const std::string bad = error_of(kBase, {"training.precision=fp16"});
  EXPECT_HAS(bad, "fp16");
  EXPECT_HAS(bad, "bf16");
}

TEST(ConfigSet, BadOverridesNameTheSetArgument) {
  const std::string typo = error_of(kBase, {"model.layers[4].linear.out_featurs=3"});
  EXPECT_HAS(typo, "t.yaml: --set model.layers[4].linear.out_featurs=3");
  EXPECT_HAS(typo, "did you mean 'out_features'?");

  const std::string section = error_of(kBase, {"optimiser.lr=1"});
  EXPECT_HAS(section, "--set optimiser.lr=1");
  EXPECT_HAS(section, "did you mean 'optimizer'?");

  EXPECT_HAS(
      error_of(kBase, {"training.batch_size=abc"}),
      "t.yaml: --set training.batch_size=abc: expected an integer in [1, 1048576], got 'abc'");
  EXPECT_HAS(error_of(kBase, {"optimizer.lr=-1"}), "--set optimizer.lr=-1: expected a number > 0");
  EXPECT_HAS(error_of(kBase, {"model.layers[40].linear.out_features=2"}),
             "model.layers has 6 items, so there is no item [40]");
  EXPECT_HAS(error_of(kBase, {"optimizer.lr"}), "--set optimizer.lr: expected key.path=value");
  EXPECT_HAS(error_of(kBase, {"optimizer.lr.x=1"}), "optimizer.lr is a single value, not a map");
  EXPECT_HAS(error_of(kBase, {"model.layers.x=1"}), "model.layers is a list, not a map");
  EXPECT_HAS(error_of(kBase, {"model..x=1"}), "bad key path");
  EXPECT_HAS(error_of(kBase, {"optimizer.lr=[1,"}),
             "--set optimizer.lr=[1,: the value is not valid YAML");
  // A valid value that breaks a later check still names the override.
  EXPECT_HAS(error_of(kBase, {"model.layers[4].linear.out_features=4"}),
             "--set model.layers[4].linear.out_features=4: the network ends in 4 class scores");
}

TEST(DidYouMean, EditDistance) {
  EXPECT_EQ(edit_distance("", ""), 0);
  EXPECT_EQ(edit_distance("abc", ""), 3);
  EXPECT_EQ(edit_distance("out_chanels", "out_channels"), 1);
  EXPECT_EQ(edit_distance("lr", "rl"), 1);  // a swap counts once
  EXPECT_EQ(edit_distance("kitten", "sitting"), 3);
  EXPECT_EQ(closest_match("out_chanels", {"kernel", "out_channels", "stride"}), "out_channels");
  EXPECT_EQ(closest_match("Momentum", {"momentum", "lr"}), "momentum");
  EXPECT_EQ(closest_match("xyz", {"lr", "eps"}), "");
  EXPECT_EQ(did_you_mean("xyz", {"lr"}), "");
}

}  // namespace
}  // namespace cnn
