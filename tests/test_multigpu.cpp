// Data-parallel training without GPUs: the distributed sampler, the gradient sum of N simulated
// ranks against one process at batch N*B, the gradient buckets, the launcher's failure handling,
// the rank environment, the NCCL id file and the error for a missing libnccl.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <algorithm>
#include <cmath>
#include <csignal>
#include <cstdlib>
#include <map>
#include <set>

#include "app/train/distributed.h"
#include "app/train/launcher.h"
#include "data/batch_sampler.h"
#include "layers/gradcheck/gradcheck.h"
#include "layers/network.h"
#include "runtime/error.h"
#include "runtime/nccl_lib.h"
#include "tests/test_util.h"

using namespace cnn;

namespace {

// Every rank's batches of one epoch, concatenated per step in rank order.
std::vector<std::vector<int32_t>> shards_of_epoch(int64_t n, int batch, int world, bool drop_last,
                                                  uint64_t seed, int64_t epoch,
                                                  int64_t position = 0) {
  std::vector<std::vector<int32_t>> steps;
  for (int r = 0; r < world; ++r) {
    BatchSampler s(n, batch, true, drop_last, seed, r, world);
    s.start_epoch(epoch, position);
    const int32_t* idx = nullptr;
    int count = 0;
    size_t k = 0;
    while (s.next(&idx, &count)) {
      if (steps.size() <= k) steps.emplace_back();
      steps[k].insert(steps[k].end(), idx, idx + count);
      EXPECT_LE(count, batch);
      ++k;
    }
  }
  return steps;
}

}  // namespace

TEST(DistributedSampler, ShardsAreDisjointCoverTheEpochAndMatchOneProcessAtTheGlobalBatch) {
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  for (const bool drop_last : {false, true}) {
    for (const int world : {1, 2, 3, 4}) {
      const int64_t n = 103;  // no multiple of any global batch here
      const int batch = 7;
      const auto steps = shards_of_epoch(n, batch, world, drop_last, seed, 2);
      // One process at batch world * batch takes the same samples in each step.
      BatchSampler one(n, batch * world, true, drop_last, seed);
      one.start_epoch(2);
      const int32_t* idx = nullptr;
      int count = 0;
      size_t k = 0;
      std::multiset<int32_t> seen;
      while (one.next(&idx, &count)) {
        ASSERT_LT(k, steps.size());
        EXPECT_EQ(steps[k], std::vector<int32_t>(idx, idx + count))
            << "world " << world << " step " << k;
        seen.insert(steps[k].begin(), steps[k].end());
        ++k;
      }
      EXPECT_EQ(k, steps.size());
      // Disjoint and covering: every sample at most once, all of them without drop_last.
      EXPECT_EQ(std::set<int32_t>(seen.begin(), seen.end()).size(), seen.size());
      EXPECT_EQ(int64_t(seen.size()), drop_last ? n / (batch * world) * batch * world : n);
      BatchSampler probe(n, batch, true, drop_last, seed, 0, world);
      EXPECT_EQ(probe.batches_per_epoch(), int64_t(steps.size()));
    }
  }
}

TEST(DistributedSampler, ResumeWithAnotherNumberOfRanksContinuesTheSameOrder) {
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  // Two steps of 4 ranks x 6 = 48 samples, then the rest of the epoch on 2 ranks x 12 (the same
  // global batch, so the position carries over inside the epoch), and the next epoch on 3 ranks.
  const int64_t n = 200;
  const auto four = shards_of_epoch(n, 6, 4, false, seed, 0);
  const auto two = shards_of_epoch(n, 12, 2, false, seed, 0, 2);
  ASSERT_EQ(four.size(), two.size() + 2);
  for (size_t k = 0; k < two.size(); ++k) EXPECT_EQ(two[k], four[k + 2]) << "step " << k + 2;
  const auto three = shards_of_epoch(n, 5, 3, false, seed, 1);
  std::vector<int32_t> flat;
  for (const auto& s : three) flat.insert(flat.end(), s.begin(), s.end());
  EXPECT_EQ(flat, epoch_permutation(n, seed, 1));
}

TEST(DistributedSampler, LastRanksOfAPartialGlobalBatchMayBeEmpty) {
  // 10 samples, 4 ranks x 2: the second global batch holds 2 samples, all on rank 0.
  std::vector<int> counts;
  for (int r = 0; r < 4; ++r) {
    BatchSampler s(10, 2, false, false, 1, r, 4);
    s.start_epoch(0);
    const int32_t* idx = nullptr;
    int count = 0;
    ASSERT_TRUE(s.next(&idx, &count));
    ASSERT_TRUE(s.next(&idx, &count));
    counts.push_back(count);
    EXPECT_EQ(s.last_global_count(), 2);
    EXPECT_FALSE(s.next(&idx, &count));
  }
  EXPECT_EQ(counts, (std::vector<int>{2, 0, 0, 0}));
  EXPECT_THROW(BatchSampler(10, 2, true, false, 1, 4, 4), Error);
  EXPECT_THROW(BatchSampler(10, 3, true, true, 1, 0, 4), Error);  // drop_last: no batch of 12
}

// N ranks, each on its slice with the gradient scaled by 1 / (N * B), summed in code, against one
// process at batch N * B. The float sums differ only in order: the CPU kernels sum a weight's
// gradient over the batch, and splitting that sum in N parts changes its rounding by a few ulps
// of the largest partial sums, so the tolerance is 1e-5 of the gradient's largest magnitude.
TEST(DataParallelGradient, SumOfRankGradientsEqualsOneProcessAtTheGlobalBatch) {
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  GradcheckCase c = gradcheck_small_network_case();
  const int world = 3, batch = 5, global = world * batch;
  NetworkOptions o;
  o.max_batch = global;
  o.seed = seed;
  const int64_t chw = shape_numel(c.input_chw);
  const std::vector<float> x = test::random_vector(size_t(global * chw), seed + 1);
  Network one(c.specs, c.input_chw, o, Exec{});
  const std::vector<int32_t> y = test::random_labels(size_t(global), one.num_classes(), seed + 2);
  one.forward_backward(global, x.data(), y.data(), 1.0f / float(global));
  const std::vector<float> ref = one.grads_to_host();

  o.max_batch = batch;
  std::vector<float> sum(ref.size(), 0.f);
  for (int r = 0; r < world; ++r) {
    Network rank(c.specs, c.input_chw, o, Exec{});  // the same seed: the same initial weights
    ASSERT_EQ(rank.params_to_host(), one.params_to_host());
    rank.forward_backward(batch, x.data() + r * batch * chw, y.data() + r * batch,
                          1.0f / float(global));
    const std::vector<float> g = rank.grads_to_host();
    for (size_t i = 0; i < g.size(); ++i) sum[i] += g[i];
  }
  float scale = 0;
  for (float v : ref) scale = std::max(scale, std::fabs(v));
  ASSERT_GT(scale, 0.f);
  double worst = 0;
  for (size_t i = 0; i < ref.size(); ++i)
    worst = std::max(worst, double(std::fabs(sum[i] - ref[i])));
  EXPECT_LE(worst, 1e-5 * scale) << "largest difference " << worst << " at gradient scale "
                                 << scale;
}

TEST(GradBuckets, CoverTheGradientFromTheEndDownCutAtLayerBoundaries) {
  // Layers at offsets 0, 10, 10 (no parameters), 50, 400, 1000 of 1200 floats.
  const std::vector<int64_t> ready = {1000, 400, 50, 10, 10, 0};
  const auto b = plan_grad_buckets(ready, 1200, 300);
  ASSERT_EQ(b.size(), 3u);
  EXPECT_EQ(b[0].begin, 400);  // 1000..1200 is too small alone
  EXPECT_EQ(b[0].end, 1200);
  EXPECT_EQ(b[1].begin, 50);  // 400 - 50 >= 300
  EXPECT_EQ(b[1].end, 400);
  EXPECT_EQ(b[2].begin, 0);  // what is left, shorter than a bucket
  EXPECT_EQ(b[2].end, 50);
  const auto one = plan_grad_buckets(ready, 1200, 1 << 20);  // a small net: one bucket
  ASSERT_EQ(one.size(), 1u);
  EXPECT_EQ(one[0].begin, 0);
  EXPECT_EQ(one[0].end, 1200);
  EXPECT_THROW(plan_grad_buckets({10, 500}, 1200, 300), Error);  // offsets must fall
}

TEST(Launcher, AFailingRankStopsTheOthersAndIsNamed) {
  LaunchRequest req;
  req.exe = "/bin/sh";
  // Rank 1 fails at once; rank 0 would run for a minute unless it is stopped.
  req.argv = {"sh", "-c", "if [ \"$CNN_RANK\" = 1 ]; then exit 3; fi; exec sleep 60"};
  req.world = 3;
  const LaunchResult r = launch_ranks(req);
  EXPECT_EQ(r.exit_code, 3);
  EXPECT_TRUE(test::contains(r.message, "rank 1 ")) << r.message;
  EXPECT_TRUE(test::contains(r.message, "exited with status 3")) << r.message;
  ASSERT_EQ(r.ranks.size(), 3u);
  for (int k : {0, 2}) {
    EXPECT_FALSE(r.ranks[size_t(k)].exited) << r.message;
    EXPECT_EQ(r.ranks[size_t(k)].signal, SIGTERM) << r.message;
  }
}

TEST(Launcher, RanksSeeTheirEnvironmentAndSucceedTogether) {
  LaunchRequest req;
  req.exe = "/bin/sh";
  req.argv = {"sh", "-c",
              "[ \"$CNN_WORLD_SIZE\" = 4 ] && [ \"$CNN_LOCAL_RANK\" = \"$CNN_RANK\" ] && "
              "[ -d \"$(dirname \"$CNN_NCCL_ID_FILE\")\" ] && [ -n \"$CNN_NCCL_ID_TOKEN\" ]"};
  req.world = 4;
  const LaunchResult r = launch_ranks(req);
  EXPECT_EQ(r.exit_code, 0) << r.message;
  EXPECT_TRUE(r.message.empty()) << r.message;
  const LaunchResult killed = launch_ranks({"/bin/sh", {"sh", "-c", "kill -9 $$"}, 2, 10});
  EXPECT_EQ(killed.exit_code, 128 + 9);
  EXPECT_TRUE(test::contains(killed.message, "killed by signal 9")) << killed.message;
  const LaunchResult missing = launch_ranks({"/nonexistent/train", {"train"}, 1, 10});
  EXPECT_EQ(missing.exit_code, 127);
}

TEST(NcclLib, AMissingLibraryIsOneClearErrorNamingIt) {
  const std::string missing = test::fresh_dir("nccl", "missing").string() + "/libnccl.so.2";
  try {
    NcclLib lib(missing, "from CNN_NCCL_LIBRARY");
    FAIL() << "loaded " << missing;
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_TRUE(test::contains(m, missing)) << m;
    EXPECT_TRUE(test::contains(m, "CNN_NCCL_LIBRARY")) << m;
    EXPECT_EQ(m.find('\n'), std::string::npos) << m;
  }
  // The same through the environment, as a rank or the launcher reads it.
  setenv("CNN_NCCL_LIBRARY", missing.c_str(), 1);
  try {
    (void)open_nccl("");
    FAIL() << "loaded " << missing;
  } catch (const Error& e) {
    EXPECT_TRUE(test::contains(e.what(), missing)) << e.what();
    EXPECT_TRUE(test::contains(e.what(), "from CNN_NCCL_LIBRARY")) << e.what();
  }
  unsetenv("CNN_NCCL_LIBRARY");
  // A library that is not NCCL.
  EXPECT_THROW(NcclLib("libz.so.1", "test"), Error);
  // A folder stands for libnccl.so.2 in it; the environment wins over the config.
  const std::string dir = test::fresh_dir("nccl", "folder").string();
  EXPECT_EQ(nccl_library_path("", dir), dir + "/libnccl.so.2");
  EXPECT_EQ(nccl_library_path("/a/libnccl.so.2", "/b"), "/a/libnccl.so.2");
  EXPECT_EQ(nccl_library_path("", ""), "libnccl.so.2");
}

namespace {
std::map<std::string, std::string> g_env;
const char* fake_getenv(const char* name) {
  const auto it = g_env.find(name);
  return it == g_env.end() ? nullptr : it->second.c_str();
}
}  // namespace

TEST(RankInfo, FromTheLauncherOrMpirunOrNone) {
  g_env = {};
  EXPECT_FALSE(rank_info_from_env(fake_getenv).distributed());
  g_env = {{"CNN_RANK", "2"},
           {"CNN_WORLD_SIZE", "4"},
           {"CNN_LOCAL_RANK", "2"},
           {"CNN_NCCL_ID_FILE", "/tmp/x/nccl-id"},
           {"CNN_NCCL_ID_TOKEN", "77"}};
  RankInfo r = rank_info_from_env(fake_getenv);
  EXPECT_TRUE(r.distributed());
  EXPECT_EQ(r.rank, 2);
  EXPECT_EQ(r.world, 4);
  EXPECT_EQ(r.id_file, "/tmp/x/nccl-id");
  EXPECT_EQ(r.id_token, "77");
  g_env = {{"OMPI_COMM_WORLD_RANK", "5"},
           {"OMPI_COMM_WORLD_SIZE", "8"},
           {"OMPI_COMM_WORLD_LOCAL_RANK", "1"},
           {"OMPI_MCA_ess_base_jobid", "1234"}};
  r = rank_info_from_env(fake_getenv);
  EXPECT_EQ(r.rank, 5);
  EXPECT_EQ(r.world, 8);
  EXPECT_EQ(r.local_rank, 1);
  EXPECT_EQ(r.id_token, "1234");
  EXPECT_TRUE(r.id_file.empty());  // the trainer puts it in the logs folder
  g_env = {{"PMI_RANK", "1"}, {"PMI_SIZE", "2"}};
  EXPECT_EQ(rank_info_from_env(fake_getenv).local_rank, 1);
  for (const auto& bad : std::vector<std::map<std::string, std::string>>{
           {{"CNN_RANK", "4"}, {"CNN_WORLD_SIZE", "4"}, {"CNN_NCCL_ID_FILE", "f"}},
           {{"CNN_RANK", "x"}, {"CNN_WORLD_SIZE", "4"}, {"CNN_NCCL_ID_FILE", "f"}},
           {{"CNN_RANK", "0"}, {"CNN_NCCL_ID_FILE", "f"}},
           {{"CNN_RANK", "0"}, {"CNN_WORLD_SIZE", "2"}}}) {
    g_env = bad;
    EXPECT_THROW(rank_info_from_env(fake_getenv), Error);
  }
  g_env = {};
}

TEST(NcclIdFile, RoundTripsPrivatelyAndRefusesAnotherJobsFile) {
  const uint64_t seed = test::fresh_seed();
  const std::string path = test::fresh_dir("nccl", "id").string() + "/nccl-id";
  NcclUniqueId id{};
  const auto bytes = test::random_vector(sizeof(id.internal), seed, 0, 255);
  for (size_t i = 0; i < sizeof(id.internal); ++i) id.internal[i] = char(int(bytes[i]));
  write_nccl_id_file(path, id, "job-1");
  struct stat st {};
  ASSERT_EQ(stat(path.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  const NcclUniqueId back = wait_nccl_id_file(path, "job-1", 5);
  EXPECT_EQ(std::string(back.internal, sizeof(back.internal)),
            std::string(id.internal, sizeof(id.internal)));
  try {
    (void)wait_nccl_id_file(path, "job-2", 0.1);
    FAIL() << "read another job's id";
  } catch (const Error& e) {
    EXPECT_TRUE(test::contains(e.what(), "another job")) << e.what();
  }
  EXPECT_THROW(wait_nccl_id_file(path + ".absent", "job-1", 0.1), Error);
}
