// The depthwise stream kernels' strip plans (kernels/conv/conv2d_grouped_cuda.h,
// DepthwiseStreamStrips): the rows per thread each plan gives the seed's shapes, the invariants
// the launchers rely on (Long's strips never shorter than Fill's, so the deterministic scratch
// sized for Fill holds either; Long never under kDepthwiseStreamMinRows; Long's one-wave grids),
// and CNN_DEPTHWISE_STREAM_STRIPS's parsing. Pure functions of the shape: no device needed.
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <string>

#include "kernels/conv/conv2d_grouped.h"
#include "kernels/conv/conv2d_grouped_cuda.h"
#include "runtime/env_switches.h"
#include "runtime/error.h"
#include "tests/test_util.h"

using namespace cnn;

namespace {

Conv2dGroupedShape depthwise(int n, int c, int h, int w, int k) {
  Conv2dGroupedShape s;
  s.n = n, s.c = c, s.h = h, s.w = w, s.oc = c, s.kh = s.kw = k;
  s.pad_h = s.pad_w = k / 2;
  s.groups = c;
  return s;
}

int64_t threads(const Conv2dGroupedShape& s, const DepthwiseStreamTiling& t) {
  // Thread rows that own at least one output row, times the threads across a plane.
  return int64_t(s.n) * s.oc * t.tiles_x * t.tx * ((s.h + t.rows - 1) / t.rows);
}

int64_t partials(const Conv2dGroupedShape& s, const DepthwiseStreamTiling& t) {
  return int64_t(s.n) * t.strips * t.tiles_x;
}

}  // namespace

TEST(DepthwiseStreamStrips, SeedShapes) {
  // 1x256x128x128: Fill shortens the strips to 4 rows for 2^18 threads (1024 blocks); Long
  // takes 16 rows, 256 blocks of 256 threads: one wave.
  const Conv2dGroupedShape big_c = depthwise(1, 256, 128, 128, 3);
  const DepthwiseStreamTiling fill = depthwise_stream_tiling(big_c, 0, DepthwiseStreamStrips::Fill);
  const DepthwiseStreamTiling lng = depthwise_stream_tiling(big_c, 0, DepthwiseStreamStrips::Long);
  EXPECT_EQ(fill.rows, 4);
  EXPECT_EQ(fill.strips * fill.tiles_x * 256, 1024);
  EXPECT_EQ(lng.rows, 16);
  EXPECT_EQ(lng.tx * lng.ty, 256);
  EXPECT_EQ(lng.strips * lng.tiles_x * 256, 256);
  EXPECT_EQ(threads(big_c, lng), kDepthwiseStreamWaveThreads);
  // 8x64x128x128: enough planes for several waves of 8-row strips; both plans agree.
  const Conv2dGroupedShape big_n = depthwise(8, 64, 128, 128, 3);
  for (DepthwiseStreamStrips plan : {DepthwiseStreamStrips::Fill, DepthwiseStreamStrips::Long})
    EXPECT_EQ(depthwise_stream_tiling(big_n, 0, plan).rows, 8) << depthwise_stream_strips_name(plan);
  // The default argument is Fill (the forward and input gradient's plan).
  EXPECT_EQ(depthwise_stream_tiling(big_c).rows, 4);
}

// Over shapes the stream kernels take and some they do not: Long's strips are never shorter
// than Fill's (so never more partials: the scratch sized for Fill holds both), never under
// kDepthwiseStreamMinRows, equal to Fill's where Fill keeps that many, and where they differ
// the grid fits kDepthwiseStreamWaveThreads unless the strips are at the 32-row cap. Forced rows
// win over either plan.
TEST(DepthwiseStreamStrips, LongNeverShorterThanFill) {
  int differ = 0;
  for (int n : {1, 2, 3, 8, 32})
    for (int c : {1, 3, 64, 130, 256, 1000})
      for (int h : {1, 7, 33, 128, 131, 500})
        for (int w : {1, 5, 32, 61, 126, 128, 130, 1030})
          for (int k : {3, 5, 7}) {
            const Conv2dGroupedShape s = depthwise(n, c, h, w, k);
            const DepthwiseStreamTiling f =
                depthwise_stream_tiling(s, 0, DepthwiseStreamStrips::Fill);
            const DepthwiseStreamTiling l =
                depthwise_stream_tiling(s, 0, DepthwiseStreamStrips::Long);
            const std::string what = "N" + std::to_string(n) + " C" + std::to_string(c) + " " +
                                     std::to_string(h) + "x" + std::to_string(w) + " k" +
                                     std::to_string(k);
            ASSERT_GE(l.rows, f.rows) << what;
            ASSERT_GE(l.rows, kDepthwiseStreamMinRows) << what;
            ASSERT_LE(partials(s, l), partials(s, f)) << what;
            ASSERT_EQ(l.tx, f.tx) << what;
            ASSERT_GE(l.tx * l.ty, 32) << what;  // whole warps: the reduction shuffles
            ASSERT_LE(l.tx * l.ty, kDepthwiseStreamThreads) << what;
            ASSERT_GE(int64_t(l.strips) * l.tile_h(), s.h) << what;
            if (f.rows >= kDepthwiseStreamMinRows) {
              ASSERT_EQ(l.rows, f.rows) << what;
            } else if (l.rows < 32) {
              ASSERT_LE(threads(s, l), kDepthwiseStreamWaveThreads) << what;
            }
            differ += l.rows != f.rows;
            for (int forced : {4, 13, 32}) {
              ASSERT_EQ(depthwise_stream_tiling(s, forced, DepthwiseStreamStrips::Long).rows,
                        forced)
                  << what;
            }
          }
  EXPECT_GT(differ, 0);
}

TEST(DepthwiseStreamStrips, SwitchParsesEachValue) {
  {
    test::ScopedEnv env("CNN_DEPTHWISE_STREAM_STRIPS", nullptr);
    EXPECT_EQ(read_env_switches().depthwise_stream_strips, DepthwiseStreamStripsSwitch::Auto);
  }
  const struct {
    const char* value;
    DepthwiseStreamStripsSwitch want;
  } values[] = {{"auto", DepthwiseStreamStripsSwitch::Auto},
                {"fill", DepthwiseStreamStripsSwitch::Fill},
                {"long", DepthwiseStreamStripsSwitch::Long}};
  for (const auto& v : values) {
    test::ScopedEnv env("CNN_DEPTHWISE_STREAM_STRIPS", v.value);
    EXPECT_EQ(read_env_switches().depthwise_stream_strips, v.want) << v.value;
  }
  test::ScopedEnv env("CNN_DEPTHWISE_STREAM_STRIPS", "short");
  try {
    read_env_switches();
    FAIL() << "CNN_DEPTHWISE_STREAM_STRIPS=short accepted";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("CNN_DEPTHWISE_STREAM_STRIPS='short'"), std::string::npos) << msg;
    EXPECT_NE(msg.find("fill, long or auto"), std::string::npos) << msg;
  }
  bool found = false;
  for (const EnvSwitchRow& r : env_switch_table())
    found = found || std::strcmp(r.name, "CNN_DEPTHWISE_STREAM_STRIPS") == 0;
  EXPECT_TRUE(found);
}

// Unset (as in this test's process), the weight gradient runs Long and the others Fill.
TEST(DepthwiseStreamStrips, AutoPicksLongForTheWeightGradient) {
  if (std::getenv("CNN_DEPTHWISE_STREAM_STRIPS")) GTEST_SKIP() << "the switch is set";
  EXPECT_EQ(depthwise_stream_strips(true), DepthwiseStreamStrips::Long);
  EXPECT_EQ(depthwise_stream_strips(false), DepthwiseStreamStrips::Fill);
}
