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
