// Every kernel of the project starts by waiting for the grid before it (ptx::griddep_enter, or
// ptx::griddep_wait where the kernel lets its dependents launch later itself): the captured
// training step turns its kernel -> kernel edges into programmatic dependencies
// (runtime/graph_overlap.h), which launch a kernel while the one before it still runs. A kernel
// that read or wrote memory before that wait would race with its predecessor, silently and only
// sometimes, so this test reads the sources and names any kernel that does not start so.
#include <gtest/gtest.h>

#include <cctype>
#include <filesystem>
#include <set>
#include <string>
#include <vector>

#include "tests/test_util.h"

namespace {

namespace fs = std::filesystem;

struct Kernel {
  std::string file, name, first_statement, body;
};

// The kernels defined in `text`: for each `__global__` outside a line comment that has a body,
// its name (the identifier before its parameter list) and the first statement of its body.
std::vector<Kernel> kernels_in(const std::string& file, const std::string& text) {
  std::vector<Kernel> out;
  for (size_t at = text.find("__global__"); at != std::string::npos;
       at = text.find("__global__", at + 1)) {
    const size_t line = text.rfind('\n', at) + 1;  // npos + 1 == 0 on the first line
    if (text.substr(line, at - line).find("//") != std::string::npos) continue;
    // The parameter list: the last parenthesized group before the body (a __launch_bounds__
    // group may come first).
    size_t i = at, params = std::string::npos;
    while (i < text.size() && text[i] != '{' && text[i] != ';') {
      if (text[i] == '(') {
        params = i;
        for (int depth = 0; i < text.size(); ++i) {
          if (text[i] == '(') ++depth;
          if (text[i] == ')' && --depth == 0) break;
        }
      }
      ++i;
    }
    if (i >= text.size() || text[i] == ';' || params == std::string::npos) continue;
    size_t name_end = params;
    while (name_end > at && std::isspace(static_cast<unsigned char>(text[name_end - 1])))
      --name_end;
    size_t name_begin = name_end;
    while (name_begin > at && (std::isalnum(static_cast<unsigned char>(text[name_begin - 1])) ||
                               text[name_begin - 1] == '_'))
      --name_begin;
    Kernel k{file, text.substr(name_begin, name_end - name_begin), "", ""};
    size_t end = i + 1;
    for (int depth = 1; end < text.size() && depth > 0; ++end) {
      if (text[end] == '{') ++depth;
      if (text[end] == '}') --depth;
    }
    k.body = text.substr(i + 1, end - i - 2);
    size_t s = 0;
    while (s < k.body.size()) {  // skip blank space and whole-line comments
      if (std::isspace(static_cast<unsigned char>(k.body[s]))) {
        ++s;
      } else if (k.body.compare(s, 2, "//") == 0) {
        s = k.body.find('\n', s);
      } else {
        break;
      }
    }
    if (s < k.body.size()) k.first_statement = k.body.substr(s, k.body.find(';', s) + 1 - s);
    out.push_back(k);
  }
  return out;
}

std::vector<Kernel> project_kernels() {
  std::vector<Kernel> all;
  const fs::path root(cnn::test::source_dir());
  for (const char* dir : {"kernels", "data", "layers", "runtime", "app"}) {
    if (!fs::exists(root / dir)) continue;
    for (const auto& e : fs::recursive_directory_iterator(root / dir)) {
      const std::string ext = e.path().extension().string();
      if (!e.is_regular_file() || (ext != ".cu" && ext != ".cuh")) continue;
      const std::vector<Kernel> ks =
          kernels_in(fs::relative(e.path(), root).string(), cnn::test::slurp(e.path().string()));
      all.insert(all.end(), ks.begin(), ks.end());
    }
  }
  return all;
}

}  // namespace

TEST(KernelEntry, ParserFindsNamesAndFirstStatements) {
  const std::string text =
      "// __global__ void commented(int) {}\n"
      "__global__ void declared(int a);\n"
      "template <int N>\n"
      "__global__ void __launch_bounds__(256, 2)\n"
      "    bounded(const float* (x), int n) {\n"
      "  // why\n"
      "  ptx::griddep_enter();\n"
      "  if (n) { x += 1; }\n"
      "}\n"
      "__global__ void plain(int n) { int i = n; }\n";
  const std::vector<Kernel> ks = kernels_in("f.cu", text);
  ASSERT_EQ(ks.size(), 2u);
  EXPECT_EQ(ks[0].name, "bounded");
  EXPECT_EQ(ks[0].first_statement, "ptx::griddep_enter();");
  EXPECT_EQ(ks[1].name, "plain");
  EXPECT_EQ(ks[1].first_statement, "int i = n;");
}

TEST(KernelEntry, EveryKernelWaitsForTheGridBeforeIt) {
  // The int8 classifier kernels read their weights before the wait (QConvPath::overlap_launch:
  // weights are not written by the kernel before them) and wait before their first read of x.
  const std::set<std::string> waits_later = {"qconv_linear_cols_regs", "qconv_linear_cols"};
  const std::vector<Kernel> ks = project_kernels();
  EXPECT_GE(ks.size(), 80u) << "the scan found too few kernels: is CNN_SOURCE_DIR right?";
  for (const Kernel& k : ks) {
    if (waits_later.count(k.name)) {
      EXPECT_NE(k.body.find("ptx::griddep_wait();"), std::string::npos)
          << k.file << ": kernel " << k.name << " must call ptx::griddep_wait()";
      continue;
    }
    EXPECT_TRUE(k.first_statement == "ptx::griddep_enter();" ||
                k.first_statement == "ptx::griddep_wait();")
        << k.file << ": kernel " << k.name
        << " must start with ptx::griddep_enter(); (kernels/common/ptx.cuh), starts with: "
        << k.first_statement;
  }
}
