// The CNN_* switches' parsing, one table row per switch: each value it accepts (unset: the
// default) sets its EnvSwitches field as listed, each bad value throws one line naming the
// variable, the value and the allowed ones, and the switch is in the --help table.
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "runtime/env_switches.h"
#include "runtime/error.h"
#include "tests/test_util.h"

using namespace cnn;

namespace {

// The field a switch sets, as an int: bools 0 / 1, enums their value, ints themselves.
template <auto kField>
int field(const EnvSwitches& e) {
  return static_cast<int>(e.*kField);
}

template <class Enum>
constexpr int as_int(Enum v) {
  return static_cast<int>(v);
}

struct SwitchCases {
  const char* var;
  int (*field)(const EnvSwitches&);
  std::vector<std::pair<const char*, int>> accepted;  // value (nullptr: unset) -> the field
  std::vector<const char*> rejected;
  const char* allowed;  // what the error says is expected; unused without rejected values
};

const std::vector<SwitchCases>& switch_cases() {
  using DK = DepthwiseKernelSwitch;
  using WB = WgmmaWgradBSwitch;
  static const std::vector<SwitchCases> cases = {
      {"CNN_GROUPED_DENSE",
       field<&EnvSwitches::grouped_dense>,
       {{nullptr, as_int(GroupedDenseSwitch::Auto)},
        {"auto", as_int(GroupedDenseSwitch::Auto)},
        {"groups", as_int(GroupedDenseSwitch::PerGroup)},
        {"diagonal", as_int(GroupedDenseSwitch::BlockDiagonal)},
        {"direct", as_int(GroupedDenseSwitch::Direct)}},
       {"blocks"},
       "groups, diagonal, direct or auto"},
      {"CNN_BF16_SMEM",
       field<&EnvSwitches::bf16_smem_packed>,
       {{nullptr, true}, {"f32", false}, {"bf16", true}},
       {"fp16"},
       "bf16 or f32"},
      {"CNN_DEPTHWISE_KERNEL",
       field<&EnvSwitches::depthwise_kernel>,
       {{nullptr, as_int(DK::Auto)},
        {"auto", as_int(DK::Auto)},
        {"tile", as_int(DK::Tile)},
        {"rows", as_int(DK::Rows)},
        {"stream", as_int(DK::Stream)},
        {"flat", as_int(DK::Flat)}},
       {"fast"},
       "tile, rows, stream, flat or auto"},
      // tma (the boxes of the copies of x) is accepted again.
      {"CNN_WGMMA_WGRAD_B",
       field<&EnvSwitches::wgmma_wgrad_b>,
       {{nullptr, as_int(WB::ByAlgo)},
        {"algo", as_int(WB::ByAlgo)},
        {"gather", as_int(WB::Gather)},
        {"tma", as_int(WB::Tma)}},
       {"boxes"},
       "algo, gather or tma"},
      // Blocks an SM of the wgmma-nhwc convolution; 0: auto.
      {"CNN_WGMMA_NHWC_PER_SM",
       field<&EnvSwitches::wgmma_nhwc_blocks_per_sm>,
       {{nullptr, 0}, {"auto", 0}, {"1", 1}, {"2", 2}},
       {"3"},
       "1, 2 or auto"},
      // The wgmma GEMM's k splits; 0: its pick.
      {"CNN_WGMMA_SPLITS",
       field<&EnvSwitches::wgmma_gemm_splits>,
       {{nullptr, 0}, {"auto", 0}, {"1", 1}, {"2", 2}, {"4", 4}, {"8", 8}, {"16", 16}},
       {"3", "32"},
       "auto, 1, 2, 4, 8 or 16"},
      // The wgmma GEMM's split groups (clusters a tile's k is split across); 1: one, 0: auto.
      {"CNN_WGMMA_GROUPS",
       field<&EnvSwitches::wgmma_gemm_groups>,
       {{nullptr, 0}, {"auto", 0}, {"1", 1}, {"2", 2}, {"4", 4}, {"8", 8}, {"16", 16}},
       {"0", "3", "32"},
       "auto, 1, 2, 4, 8 or 16"},
      // The wgmma-nhwc convolution's k splits; 0: its pick.
      {"CNN_WGMMA_NHWC_SPLITS",
       field<&EnvSwitches::wgmma_nhwc_splits>,
       {{nullptr, 0}, {"auto", 0}, {"1", 1}, {"2", 2}, {"4", 4}, {"8", 8}},
       {"0", "3", "16"},
       "1, 2, 4, 8 or auto"},
      // Tile rows of the wgmma-nhwc convolution; 0: auto.
      {"CNN_WGMMA_NHWC_BM",
       field<&EnvSwitches::wgmma_nhwc_block_m>,
       {{nullptr, 0}, {"auto", 0}, {"128", 128}, {"256", 256}},
       {"64", "512"},
       "128, 256 or auto"},
      // The direct tap class reads x itself unless set to copies.
      {"CNN_WGMMA_WGRAD_BOX_X",
       field<&EnvSwitches::wgmma_wgrad_box_direct>,
       {{nullptr, true}, {"direct", true}, {"copies", false}},
       {"x"},
       "direct or copies"},
      // The boxed weight gradient's multicast clusters: on unless set to 0.
      {"CNN_WGMMA_WGRAD_MULTICAST",
       field<&EnvSwitches::wgmma_wgrad_multicast>,
       {{nullptr, true}, {"0", false}, {"1", true}},
       {"yes", "2"},
       "0 or 1"},
      // The channels a piece of the boxed B holds; 0: auto.
      {"CNN_WGMMA_WGRAD_BOX_RUN",
       field<&EnvSwitches::wgmma_wgrad_box_run>,
       {{nullptr, 0}, {"auto", 0}, {"8", 8}, {"16", 16}, {"32", 32}, {"64", 64}, {"128", 128}},
       {"24", "256", "0", "eight"},
       "8, 16, 32, 64, 128 or auto"},
      {"CNN_CONV_DGRAD_PHASES",
       field<&EnvSwitches::conv_dgrad_phases>,
       {{nullptr, true}, {"0", false}, {"1", true}},
       {},
       nullptr},
      // The fused linear-head backward unless set to 0.
      {"CNN_LINEAR_HEAD",
       field<&EnvSwitches::linear_head>,
       {{nullptr, true}, {"0", false}, {"1", true}},
       {},
       nullptr},
      {"CNN_CONV_WGRAD_WINDOW",
       field<&EnvSwitches::conv_wgrad_window>,
       {{nullptr, false}, {"0", false}, {"1", true}},
       {},
       nullptr},
      {"CNN_CRP_TENSOR_CORES",
       field<&EnvSwitches::crp_tensor_cores>,
       {{nullptr, false}, {"0", false}, {"1", true}},
       {},
       nullptr},
      // The consumer width of the BF16 channels-last weight gradient; 0: auto.
      {"CNN_WGMMA_WGRAD_NHWC_N",
       field<&EnvSwitches::wgmma_wgrad_nhwc_n>,
       {{nullptr, 0}, {"auto", 0}, {"64", 64}, {"128", 128}},
       {"32"},
       "64, 128 or auto"},
      // The BF16 channels-last weight gradient's x load; -1: auto.
      {"CNN_WGMMA_WGRAD_NHWC_HALO",
       field<&EnvSwitches::wgmma_wgrad_nhwc_halo>,
       {{nullptr, -1}, {"auto", -1}, {"1", 1}, {"0", 0}},
       {"2", "yes"},
       "1, 0 or auto"},
      // The TF32 halo weight gradient under wgmma-nhwc unless set to 0.
      {"CNN_WGMMA_WGRAD_TF32_HALO",
       field<&EnvSwitches::wgmma_wgrad_tf32_halo>,
       {{nullptr, true}, {"1", true}, {"0", false}},
       {"yes"},
       "0 or 1"},
      // The wgmma-nhwc convolution's A load; -1: auto.
      {"CNN_WGMMA_NHWC_HALO",
       field<&EnvSwitches::wgmma_nhwc_halo>,
       {{nullptr, -1}, {"auto", -1}, {"1", 1}, {"0", 0}},
       {"2", "yes"},
       "1, 0 or auto"},
      {"CNN_WGMMA_NHWC_BN32",
       field<&EnvSwitches::wgmma_nhwc_bn32>,
       {{nullptr, true}, {"0", false}},
       {"yes"},
       "0 or 1"},
      {"CNN_WGMMA_NHWC_PHASES",
       field<&EnvSwitches::wgmma_nhwc_phases>,
       {{nullptr, true}, {"1", true}, {"0", false}},
       {"on"},
       "0 or 1"},
      // A strided input gradient's phases in one grid unless set to 0.
      {"CNN_WGMMA_NHWC_STACK",
       field<&EnvSwitches::wgmma_nhwc_stack>,
       {{nullptr, true}, {"1", true}, {"0", false}},
       {"yes"},
       "0 or 1"},
      // One channels-last dy copy for both BF16 wgmma-nhwc gradients unless set to 0.
      {"CNN_CONV_SHARED_DY",
       field<&EnvSwitches::conv_shared_dy>,
       {{nullptr, true}, {"1", true}, {"0", false}},
       {"yes", "2"},
       "0 or 1"},
      // Weight gradients beside backward: on unless set to 0.
      {"CNN_WGRAD_BESIDE",
       field<&EnvSwitches::wgrad_beside>,
       {{nullptr, true}, {"0", false}, {"1", true}},
       {"yes", "2"},
       "0 or 1"},
      // Backward picks checked in the whole backward pass: on unless set to 0.
      {"CNN_TUNE_BACKWARD",
       field<&EnvSwitches::tune_backward>,
       {{nullptr, true}, {"0", false}, {"1", true}},
       {"yes", "2"},
       "0 or 1"},
      // The optimizer's early updates: off unless set to 1.
      {"CNN_EARLY_UPDATE",
       field<&EnvSwitches::early_update>,
       {{nullptr, false}, {"0", false}, {"1", true}},
       {"yes", "2"},
       "0 or 1"},
      // The training step's backward writes the gradients it can unless set to 0.
      {"CNN_GRAD_OVERWRITE",
       field<&EnvSwitches::grad_overwrite>,
       {{nullptr, true}, {"1", true}, {"0", false}},
       {"yes", "2"},
       "0 or 1"},
      // The int8 classifier fused into the linear layer before it: off unless set (not "0").
      {"CNN_INT8_FUSE_CLASSIFIER",
       field<&EnvSwitches::int8_fuse_classifier>,
       {{nullptr, false}, {"0", false}, {"1", true}},
       {},
       nullptr},
      // The captured step's kernel edges made programmatic unless set to 0.
      {"CNN_GRAPH_OVERLAP",
       field<&EnvSwitches::graph_overlap>,
       {{nullptr, as_int(GraphOverlap::AtExit)},
        {"exit", as_int(GraphOverlap::AtExit)},
        {"start", as_int(GraphOverlap::AtStart)},
        {"0", as_int(GraphOverlap::Off)}},
       {"1", "yes"},
       "exit, start or 0"},
      // The BatchNorm one-launch cluster passes unless set to 0.
      {"CNN_BN_ONE_PASS",
       field<&EnvSwitches::bn_one_pass>,
       {{nullptr, true}, {"0", false}, {"1", true}, {"all", true}},
       {"yes", "2"},
       "0, 1 or all"},
      // Every cluster size only with all.
      {"CNN_BN_ONE_PASS",
       field<&EnvSwitches::bn_one_pass_any_cluster>,
       {{nullptr, false}, {"0", false}, {"1", false}, {"all", true}},
       {},
       nullptr},
  };
  return cases;
}

}  // namespace

TEST(EnvSwitches, EachAcceptedValueSetsItsField) {
  for (const SwitchCases& sw : switch_cases()) {
    for (const auto& [value, want] : sw.accepted) {
      test::ScopedEnv env(sw.var, value);
      EXPECT_EQ(sw.field(read_env_switches()), want) << sw.var << "=" << (value ? value : "unset");
    }
  }
}

TEST(EnvSwitches, EachBadValueThrowsOneLineNamingIt) {
  for (const SwitchCases& sw : switch_cases()) {
    for (const char* bad : sw.rejected) {
      test::ScopedEnv env(sw.var, bad);
      try {
        read_env_switches();
        ADD_FAILURE() << sw.var << "=" << bad << " accepted";
      } catch (const Error& e) {
        const std::string msg = e.what();
        const std::string want = std::string(sw.var) + "='" + bad + "': expected " + sw.allowed;
        EXPECT_NE(msg.find(want), std::string::npos) << msg;
        EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
      }
    }
  }
}

TEST(EnvSwitches, TableListsEachSwitch) {
  for (const SwitchCases& sw : switch_cases()) {
    bool found = false;
    for (const EnvSwitchRow& r : env_switch_table())
      found = found || std::strcmp(r.name, sw.var) == 0;
    EXPECT_TRUE(found) << sw.var;
  }
}
