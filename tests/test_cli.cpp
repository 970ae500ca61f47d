// Every program reports mistakes in one format: "prog: error: <one line>" on stderr, exit code 1
// (CLI misuse included: CLI11's own messages span two lines and exit with 105/106/109).
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <CLI/CLI.hpp>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "app/cli_common.h"
#include "runtime/device.h"
#include "runtime/error.h"

namespace {

namespace fs = std::filesystem;

std::string parse_error(std::vector<std::string> args) {
  CLI::App app{"test"};
  std::string ckpt;
  int topk = 1;
  std::vector<std::string> paths;
  app.add_option("--checkpoint", ckpt)->required();
  app.add_option("--topk", topk)->check(CLI::Range(1, 10));
  app.add_option("paths", paths);
  args.insert(args.begin(), "prog");
  std::vector<const char*> argv;
  for (const auto& a : args) argv.push_back(a.c_str());
  try {
    cnn::parse_command_line(app, int(argv.size()), argv.data(), "prog");
  } catch (const cnn::Error& e) {
    return e.what();
  }
  return "";
}

TEST(Cli, UnknownOptionIsNamedBeforeAMissingRequiredOne) {
  const std::string e = parse_error({"--bogus", "x.png"});
  EXPECT_NE(e.find("unknown option --bogus"), std::string::npos) << e;
  EXPECT_NE(e.find("(see prog --help)"), std::string::npos) << e;
}

TEST(Cli, MistakesAreOneLine) {
  for (const auto& args : std::vector<std::vector<std::string>>{
           {"x.png"}, {"--checkpoint", "c", "--topk", "0"}, {"--checkpoint"}}) {
    const std::string e = parse_error(args);
    EXPECT_FALSE(e.empty());
    EXPECT_EQ(e.find('\n'), std::string::npos) << e;
  }
  EXPECT_NE(parse_error({"x.png"}).find("--checkpoint is required"), std::string::npos);
  EXPECT_EQ(parse_error({"--checkpoint", "c", "x.png"}), "");
}

TEST(Cli, RunMainPrintsOneLineAndExits1) {
  testing::internal::CaptureStderr();
  const int rc = cnn::run_main("prog", []() -> int { CNN_FAIL("first\nsecond"); });
  const std::string err = testing::internal::GetCapturedStderr();
  EXPECT_EQ(rc, 1);
  EXPECT_EQ(err, "prog: error: first; second\n");
}

struct ChildResult {
  int rc = -1;
  std::string out, err;
};

ChildResult run(const std::string& cmd) {
  const fs::path dir = fs::temp_directory_path() / ("cnn_cli_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const std::string o = (dir / "out").string(), e = (dir / "err").string();
  const int st = std::system((cmd + " >" + o + " 2>" + e).c_str());
  ChildResult r;
  r.rc = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  std::stringstream so, se;
  so << std::ifstream(o).rdbuf();
  se << std::ifstream(e).rdbuf();
  r.out = so.str();
  r.err = se.str();
  fs::remove_all(dir);
  return r;
}

void expect_one_error_line(const ChildResult& r, const std::string& prog,
                           const std::string& needle) {
  EXPECT_EQ(r.rc, 1) << r.err;
  EXPECT_EQ(r.err.rfind(prog + ": error: ", 0), 0u) << r.err;
  EXPECT_EQ(r.err.find('\n'), r.err.size() - 1) << "more than one line:\n" << r.err;
  EXPECT_NE(r.err.find(needle), std::string::npos) << r.err;
}

TEST(Cli, EveryProgramReportsMisuseInOneFormat) {
  const std::string bins[] = {CNN_TRAIN_BINARY, CNN_INFER_BINARY, CNN_GRADCHECK_BINARY,
                              CNN_BENCH_BINARY, CNN_QUANTIZE_BINARY};
  const char* names[] = {"train", "infer", "gradcheck", "bench", "quantize"};
  for (int i = 0; i < 5; ++i) {
    SCOPED_TRACE(names[i]);
    expect_one_error_line(run(bins[i] + " --bogus"), names[i], "--bogus");
    const ChildResult help = run(bins[i] + " --help");
    EXPECT_EQ(help.rc, 0);
    EXPECT_NE(help.out.find("--help"), std::string::npos);
  }
  expect_one_error_line(run(std::string(CNN_INFER_BINARY) + " --checkpoint c.safetensors"), "infer",
                        "paths is required");
  expect_one_error_line(run(std::string(CNN_QUANTIZE_BINARY) + " --checkpoint c.safetensors"),
                        "quantize", "c.safetensors");
  expect_one_error_line(
      run(std::string(CNN_INFER_BINARY) + " --checkpoint c.safetensors --precision int4 x.png"),
      "infer", "--precision");
  expect_one_error_line(run(std::string(CNN_GRADCHECK_BINARY) + " --batch 0"), "gradcheck",
                        "--batch");
}

TEST(Cli, BenchWithoutAGpuSaysSoPlainly) {
  if (cnn::cuda_available()) GTEST_SKIP() << "a GPU is present: ./bench would benchmark it";
  expect_one_error_line(run(std::string(CNN_BENCH_BINARY) + " --no-lib"), "bench",
                        "times this project's CUDA kernels against cuDNN/cuBLAS and found no GPU");
}

}  // namespace
