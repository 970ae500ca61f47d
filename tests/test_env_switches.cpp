// CNN_BF16_SMEM: parsed once into EnvSwitches::bf16_smem_packed (default: packed bf16 tiles), a
// bad value names the variable and the allowed ones, and the switch is in the --help table.
#include <gtest/gtest.h>

#include <cstring>
#include <string>

#include "runtime/env_switches.h"
#include "runtime/error.h"
#include "tests/test_util.h"

using namespace cnn;

TEST(EnvSwitches, Bf16SmemDefaultsToPacked) {
  test::ScopedEnv env("CNN_BF16_SMEM", nullptr);
  EXPECT_TRUE(read_env_switches().bf16_smem_packed);
}

TEST(EnvSwitches, Bf16SmemTakesBothTilings) {
  {
    test::ScopedEnv env("CNN_BF16_SMEM", "f32");
    EXPECT_FALSE(read_env_switches().bf16_smem_packed);
  }
  {
    test::ScopedEnv env("CNN_BF16_SMEM", "bf16");
    EXPECT_TRUE(read_env_switches().bf16_smem_packed);
  }
}

TEST(EnvSwitches, Bf16SmemRejectsOtherValues) {
  test::ScopedEnv env("CNN_BF16_SMEM", "fp16");
  try {
    read_env_switches();
    FAIL() << "CNN_BF16_SMEM=fp16 accepted";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("CNN_BF16_SMEM='fp16'"), std::string::npos) << msg;
    EXPECT_NE(msg.find("bf16 or f32"), std::string::npos) << msg;
  }
}

TEST(EnvSwitches, TableListsBf16Smem) {
  bool found = false;
  for (const EnvSwitchRow& r : env_switch_table())
    found = found || std::strcmp(r.name, "CNN_BF16_SMEM") == 0;
  EXPECT_TRUE(found);
}

// CNN_DEPTHWISE_KERNEL: the fast depthwise convolution's kernel, auto unless set.
TEST(EnvSwitches, DepthwiseKernelParsesEachValue) {
  {
    test::ScopedEnv env("CNN_DEPTHWISE_KERNEL", nullptr);
    EXPECT_EQ(read_env_switches().depthwise_kernel, DepthwiseKernelSwitch::Auto);
  }
  const struct {
    const char* value;
    DepthwiseKernelSwitch want;
  } values[] = {{"auto", DepthwiseKernelSwitch::Auto},
                {"tile", DepthwiseKernelSwitch::Tile},
                {"rows", DepthwiseKernelSwitch::Rows},
                {"stream", DepthwiseKernelSwitch::Stream}};
  for (const auto& v : values) {
    test::ScopedEnv env("CNN_DEPTHWISE_KERNEL", v.value);
    EXPECT_EQ(read_env_switches().depthwise_kernel, v.want) << v.value;
  }
}

TEST(EnvSwitches, DepthwiseKernelRejectsOtherValues) {
  test::ScopedEnv env("CNN_DEPTHWISE_KERNEL", "fast");
  try {
    read_env_switches();
    FAIL() << "CNN_DEPTHWISE_KERNEL=fast accepted";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("CNN_DEPTHWISE_KERNEL='fast'"), std::string::npos) << msg;
    EXPECT_NE(msg.find("tile, rows, stream or auto"), std::string::npos) << msg;
  }
  bool found = false;
  for (const EnvSwitchRow& r : env_switch_table())
    found = found || std::strcmp(r.name, "CNN_DEPTHWISE_KERNEL") == 0;
  EXPECT_TRUE(found);
}

// CNN_WGMMA_WGRAD_B: the wgmma weight gradient's B loader, by algo unless set; tma (the boxes of
// the copies of x) is accepted again.
TEST(EnvSwitches, WgmmaWgradBParsesEachValue) {
  {
    test::ScopedEnv env("CNN_WGMMA_WGRAD_B", nullptr);
    EXPECT_EQ(read_env_switches().wgmma_wgrad_b, WgmmaWgradBSwitch::ByAlgo);
  }
  const struct {
    const char* value;
    WgmmaWgradBSwitch want;
  } values[] = {{"algo", WgmmaWgradBSwitch::ByAlgo},
                {"gather", WgmmaWgradBSwitch::Gather},
                {"tma", WgmmaWgradBSwitch::Tma}};
  for (const auto& v : values) {
    test::ScopedEnv env("CNN_WGMMA_WGRAD_B", v.value);
    EXPECT_EQ(read_env_switches().wgmma_wgrad_b, v.want) << v.value;
  }
  test::ScopedEnv env("CNN_WGMMA_WGRAD_B", "boxes");
  try {
    read_env_switches();
    FAIL() << "CNN_WGMMA_WGRAD_B=boxes accepted";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("CNN_WGMMA_WGRAD_B='boxes'"), std::string::npos) << msg;
    EXPECT_NE(msg.find("algo, gather or tma"), std::string::npos) << msg;
  }
}

// CNN_WGMMA_NHWC_PER_SM: the wgmma-nhwc convolution's blocks an SM, auto (0) unless set.
TEST(EnvSwitches, WgmmaNhwcPerSmParsesEachValue) {
  const struct {
    const char* value;
    int want;
  } values[] = {{nullptr, 0}, {"auto", 0}, {"1", 1}, {"2", 2}};
  for (const auto& v : values) {
    test::ScopedEnv env("CNN_WGMMA_NHWC_PER_SM", v.value);
    EXPECT_EQ(read_env_switches().wgmma_nhwc_blocks_per_sm, v.want)
        << (v.value ? v.value : "unset");
  }
  test::ScopedEnv env("CNN_WGMMA_NHWC_PER_SM", "3");
  try {
    read_env_switches();
    FAIL() << "CNN_WGMMA_NHWC_PER_SM=3 accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("expected 1, 2 or auto"), std::string::npos) << e.what();
  }
}

TEST(EnvSwitches, TableListsWgmmaWgradBoxSwitches) {
  for (const char* name : {"CNN_WGMMA_WGRAD_BOX_RUN", "CNN_WGMMA_WGRAD_BOX_X"}) {
    bool found = false;
    for (const EnvSwitchRow& r : env_switch_table())
      found = found || std::strcmp(r.name, name) == 0;
    EXPECT_TRUE(found) << name;
  }
}

// CNN_WGMMA_WGRAD_BOX_X: the direct tap class reads x itself unless set to copies.
TEST(EnvSwitches, WgmmaWgradBoxXParsesEachValue) {
  {
    test::ScopedEnv env("CNN_WGMMA_WGRAD_BOX_X", nullptr);
    EXPECT_TRUE(read_env_switches().wgmma_wgrad_box_direct);
  }
  {
    test::ScopedEnv env("CNN_WGMMA_WGRAD_BOX_X", "direct");
    EXPECT_TRUE(read_env_switches().wgmma_wgrad_box_direct);
  }
  {
    test::ScopedEnv env("CNN_WGMMA_WGRAD_BOX_X", "copies");
    EXPECT_FALSE(read_env_switches().wgmma_wgrad_box_direct);
  }
  test::ScopedEnv env("CNN_WGMMA_WGRAD_BOX_X", "x");
  try {
    read_env_switches();
    FAIL() << "CNN_WGMMA_WGRAD_BOX_X=x accepted";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("CNN_WGMMA_WGRAD_BOX_X='x': expected direct or copies"), std::string::npos)
        << msg;
  }
}

// CNN_WGMMA_WGRAD_BOX_RUN: the channels a piece of the boxed B holds, auto (0) unless set.
TEST(EnvSwitches, WgmmaWgradBoxRunParsesEachValue) {
  {
    test::ScopedEnv env("CNN_WGMMA_WGRAD_BOX_RUN", nullptr);
    EXPECT_EQ(read_env_switches().wgmma_wgrad_box_run, 0);
  }
  const struct {
    const char* value;
    int want;
  } values[] = {{"auto", 0}, {"8", 8}, {"16", 16}, {"32", 32}, {"64", 64}, {"128", 128}};
  for (const auto& v : values) {
    test::ScopedEnv env("CNN_WGMMA_WGRAD_BOX_RUN", v.value);
    EXPECT_EQ(read_env_switches().wgmma_wgrad_box_run, v.want) << v.value;
  }
  for (const char* bad : {"24", "256", "0", "eight"}) {
    test::ScopedEnv env("CNN_WGMMA_WGRAD_BOX_RUN", bad);
    try {
      read_env_switches();
      ADD_FAILURE() << "CNN_WGMMA_WGRAD_BOX_RUN=" << bad << " accepted";
    } catch (const Error& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find(std::string("CNN_WGMMA_WGRAD_BOX_RUN='") + bad + "'"), std::string::npos)
          << msg;
      EXPECT_NE(msg.find("8, 16, 32, 64, 128 or auto"), std::string::npos) << msg;
      EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
    }
  }
}

// CNN_CONV_DGRAD_PHASES: strided implicit-GEMM input gradients by phases unless set to 0.
TEST(EnvSwitches, ConvDgradPhasesOnUnlessZero) {
  {
    test::ScopedEnv env("CNN_CONV_DGRAD_PHASES", nullptr);
    EXPECT_TRUE(read_env_switches().conv_dgrad_phases);
  }
  {
    test::ScopedEnv env("CNN_CONV_DGRAD_PHASES", "0");
    EXPECT_FALSE(read_env_switches().conv_dgrad_phases);
  }
  {
    test::ScopedEnv env("CNN_CONV_DGRAD_PHASES", "1");
    EXPECT_TRUE(read_env_switches().conv_dgrad_phases);
  }
  bool found = false;
  for (const EnvSwitchRow& r : env_switch_table())
    found = found || std::strcmp(r.name, "CNN_CONV_DGRAD_PHASES") == 0;
  EXPECT_TRUE(found);
}

// CNN_WGMMA_NHWC_BN32: on unless set to 0.
TEST(EnvSwitches, WgmmaNhwcBn32ParsesEachValue) {
  {
    test::ScopedEnv env("CNN_WGMMA_NHWC_BN32", nullptr);
    EXPECT_TRUE(read_env_switches().wgmma_nhwc_bn32);
  }
  {
    test::ScopedEnv env("CNN_WGMMA_NHWC_BN32", "0");
    EXPECT_FALSE(read_env_switches().wgmma_nhwc_bn32);
  }
  test::ScopedEnv env("CNN_WGMMA_NHWC_BN32", "yes");
  EXPECT_THROW(read_env_switches(), Error);
}

// CNN_INT8_FUSE_CLASSIFIER: the int8 classifier fused into the linear layer before it when set
// (not "0"); off by default.
TEST(EnvSwitches, Int8FuseClassifierOffUnlessSet) {
  {
    test::ScopedEnv env("CNN_INT8_FUSE_CLASSIFIER", nullptr);
    EXPECT_FALSE(read_env_switches().int8_fuse_classifier);
  }
  {
    test::ScopedEnv env("CNN_INT8_FUSE_CLASSIFIER", "0");
    EXPECT_FALSE(read_env_switches().int8_fuse_classifier);
  }
  {
    test::ScopedEnv env("CNN_INT8_FUSE_CLASSIFIER", "1");
    EXPECT_TRUE(read_env_switches().int8_fuse_classifier);
  }
}

TEST(EnvSwitches, TableListsInt8FuseClassifier) {
  bool found = false;
  for (const EnvSwitchRow& r : env_switch_table())
    found = found || std::strcmp(r.name, "CNN_INT8_FUSE_CLASSIFIER") == 0;
  EXPECT_TRUE(found);
}

// CNN_BN_FOLD_FINISH: the BatchNorm finish folded into the elementwise pass unless set to 0.
TEST(EnvSwitches, BnFoldFinishOnUnlessZero) {
  {
    test::ScopedEnv env("CNN_BN_FOLD_FINISH", nullptr);
    EXPECT_TRUE(read_env_switches().bn_fold_finish);
  }
  {
    test::ScopedEnv env("CNN_BN_FOLD_FINISH", "0");
    EXPECT_FALSE(read_env_switches().bn_fold_finish);
  }
  {
    test::ScopedEnv env("CNN_BN_FOLD_FINISH", "1");
    EXPECT_TRUE(read_env_switches().bn_fold_finish);
  }
  bool found = false;
  for (const EnvSwitchRow& r : env_switch_table())
    found = found || std::strcmp(r.name, "CNN_BN_FOLD_FINISH") == 0;
  EXPECT_TRUE(found);
}
