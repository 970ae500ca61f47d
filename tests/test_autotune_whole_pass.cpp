// check_in_whole_pass (layers/autotune.h) on the CPU with a made-up whole-pass time: which
// variants are tried (within 2x of the pick alone), which are kept (1% shorter than the best so
// far), the pick set back otherwise, the choices updated, and the log lines. Then
// check_switches_in_whole_pass the same way: each switch tried off, kept off only where the
// whole is 1% shorter.
#include <gtest/gtest.h>

#include <map>

#include "layers/autotune.h"
#include "tests/test_util.h"

using namespace cnn;

namespace {

// Two passes: conv6's input gradient (wgmma-nhwc picked alone at 100 us; fast 190, igemm 250)
// and conv5's weight gradient (wgmma-nhwc at 400; wgmma 500). The whole pass's time is made up
// from the variants set now.
struct Fixture {
  TuneChoice dx{"conv6",
                "input-grad",
                Algo::WgmmaNhwc,
                {{Algo::Fast, 190.0}, {Algo::WgmmaNhwc, 100.0}, {Algo::Igemm, 250.0}}};
  TuneChoice dw{
      "conv5", "weight-grad", Algo::WgmmaNhwc, {{Algo::WgmmaNhwc, 400.0}, {Algo::Wgmma, 500.0}}};
  Algo dx_now = Algo::WgmmaNhwc, dw_now = Algo::WgmmaNhwc;
  std::vector<std::pair<Algo, Algo>> timed;  // (dx, dw) of each time() call
  std::map<std::pair<Algo, Algo>, double> whole;

  std::vector<PassInWhole> passes() {
    return {{&dx, [this](Algo a) { dx_now = a; }}, {&dw, [this](Algo a) { dw_now = a; }}};
  }
  double time() {
    timed.emplace_back(dx_now, dw_now);
    const auto it = whole.find({dx_now, dw_now});
    return it == whole.end() ? 2000.0 : it->second;
  }
};

}  // namespace

TEST(CheckInWholePass, KeepsAVariantThatShortensTheWhole) {
  Fixture f;
  f.whole[{Algo::Fast, Algo::WgmmaNhwc}] = 1900.0;  // fast: 5% shorter in the whole
  f.whole[{Algo::Fast, Algo::Wgmma}] = 1890.0;      // only 0.5% below 1900: not kept
  std::vector<PassInWhole> p = f.passes();
  const std::vector<std::string> lines = check_in_whole_pass(
      p, [&] { return f.time(); }, "backward pass");
  // The pick's whole first, then fast (190 <= 2 x 100; igemm's 250 is not tried), then wgmma
  // for conv5's weight gradient with fast kept.
  EXPECT_EQ(f.timed, (std::vector<std::pair<Algo, Algo>>{{Algo::WgmmaNhwc, Algo::WgmmaNhwc},
                                                         {Algo::Fast, Algo::WgmmaNhwc},
                                                         {Algo::Fast, Algo::Wgmma}}));
  EXPECT_EQ(f.dx.chosen, Algo::Fast);
  EXPECT_EQ(f.dx_now, Algo::Fast);
  EXPECT_EQ(f.dw.chosen, Algo::WgmmaNhwc) << "0.5% is within the noise margin";
  EXPECT_EQ(f.dw_now, Algo::WgmmaNhwc) << "set back after the try";
  ASSERT_EQ(lines.size(), 3u);
  EXPECT_EQ(lines[0],
            "conv6 input-grad in the backward pass: fast (wgmma-nhwc 2000.0 us, fast 1900.0)");
  EXPECT_EQ(lines[1],
            "conv5 weight-grad in the backward pass: wgmma-nhwc (wgmma-nhwc 1900.0 us, wgmma "
            "1890.0)");
  EXPECT_EQ(lines[2], "backward pass: 2000.0 us with the picks alone, 1900.0 us with 1 changed");
}

TEST(CheckInWholePass, LeavesThePicksWhereNothingIsShorter) {
  Fixture f;
  f.whole[{Algo::Fast, Algo::WgmmaNhwc}] = 2100.0;
  f.whole[{Algo::WgmmaNhwc, Algo::Wgmma}] = 2001.0;
  std::vector<PassInWhole> p = f.passes();
  const std::vector<std::string> lines = check_in_whole_pass(
      p, [&] { return f.time(); }, "backward pass");
  EXPECT_EQ(f.dx.chosen, Algo::WgmmaNhwc);
  EXPECT_EQ(f.dw.chosen, Algo::WgmmaNhwc);
  EXPECT_EQ(f.dx_now, Algo::WgmmaNhwc);
  EXPECT_EQ(f.dw_now, Algo::WgmmaNhwc);
  ASSERT_FALSE(lines.empty());
  EXPECT_EQ(lines.back(),
            "backward pass: 2000.0 us with the picks alone, 2000.0 us with 0 changed");
}

TEST(CheckInWholePass, NothingCloseNothingTimed) {
  Fixture f;
  f.dx.timings = {{Algo::WgmmaNhwc, 100.0}, {Algo::Igemm, 250.0}};
  f.dw.timings = {};  // a cached choice may carry no timings
  std::vector<PassInWhole> p = f.passes();
  const std::vector<std::string> lines = check_in_whole_pass(
      p, [&] { return f.time(); }, "backward pass");
  EXPECT_TRUE(f.timed.empty());
  EXPECT_TRUE(lines.empty());
}

// Three weight gradients' cluster switches, all on at the start: conv5 off saves 3%, conv3 off
// then saves 0.5% more (noise: set back on), conv1 off costs time (set back on).
TEST(CheckSwitchesInWholePass, KeepsOffOnlyWhatShortensTheWhole) {
  std::map<std::string, bool> on = {{"conv5", true}, {"conv3", true}, {"conv1", true}};
  std::vector<std::map<std::string, bool>> timed;
  const auto time = [&] {
    timed.push_back(on);
    double us = 1000.0;
    if (!on["conv5"]) us -= 30.0;
    if (!on["conv3"]) us -= 5.0;
    if (!on["conv1"]) us += 20.0;
    return us;
  };
  std::vector<SwitchInWhole> s;
  for (const char* layer : {"conv5", "conv3", "conv1"})
    s.push_back({layer, "weight-grad", "clusters", [&on, layer](bool v) { on[layer] = v; }});
  const std::vector<std::string> lines = check_switches_in_whole_pass(s, time, "backward pass");
  ASSERT_EQ(timed.size(), 4u);  // all on, then each tried off in order
  EXPECT_TRUE(timed[0]["conv5"] && timed[0]["conv3"] && timed[0]["conv1"]);
  EXPECT_FALSE(timed[1]["conv5"]);
  EXPECT_FALSE(timed[2]["conv5"]) << "conv5 stays off while conv3 is tried";
  EXPECT_FALSE(timed[2]["conv3"]);
  EXPECT_TRUE(timed[3]["conv3"]) << "conv3 set back on";
  EXPECT_FALSE(on["conv5"]);
  EXPECT_TRUE(on["conv3"]);
  EXPECT_TRUE(on["conv1"]);
  ASSERT_EQ(lines.size(), 4u);
  EXPECT_EQ(lines[0],
            "conv5 weight-grad in the backward pass: clusters off (1000.0 us on, 970.0 off)");
  EXPECT_EQ(lines[1],
            "conv3 weight-grad in the backward pass: clusters on (970.0 us on, 965.0 off)");
  EXPECT_EQ(lines[2],
            "conv1 weight-grad in the backward pass: clusters on (970.0 us on, 990.0 off)");
  EXPECT_EQ(lines[3], "backward pass: 1000.0 us with every switch on, 970.0 us with 1 off");
}

TEST(CheckSwitchesInWholePass, NoSwitchesNothingTimed) {
  std::vector<SwitchInWhole> s;
  int calls = 0;
  const std::vector<std::string> lines = check_switches_in_whole_pass(
      s, [&] { return double(++calls); }, "backward pass");
  EXPECT_EQ(calls, 0);
  EXPECT_TRUE(lines.empty());
}
