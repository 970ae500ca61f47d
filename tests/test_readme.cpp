// The README is for users: its config excerpt is the real configs/mnist.yaml (every line of the
// excerpt is a line of that file, in the same order), and it carries no development history.
#include <gtest/gtest.h>

#include <filesystem>
#include <sstream>
#include <string>
#include <vector>

#include "tests/test_util.h"

namespace {

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> out;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) out.push_back(line);
  return out;
}

}  // namespace

TEST(Readme, ConfigExcerptIsTheRealMnistConfig) {
  const std::vector<std::string> readme = lines_of(cnn::test::slurp(std::filesystem::path(cnn::test::source_dir()) / "README.md"));
  const std::vector<std::string> config =
      lines_of(cnn::test::slurp(std::filesystem::path(cnn::test::source_dir()) / "configs" / "mnist.yaml"));
  size_t i = 0;
  while (i < readme.size() && readme[i] != "```yaml") ++i;
  ASSERT_LT(i, readme.size()) << "README.md has no ```yaml block";
  size_t at = 0, shown = 0;
  for (++i; i < readme.size() && readme[i] != "```"; ++i, ++shown) {
    while (at < config.size() && config[at] != readme[i]) ++at;
    ASSERT_LT(at, config.size()) << "README line not in configs/mnist.yaml (in order): "
                                 << readme[i];
    ++at;
  }
  EXPECT_GE(shown, 10u);
}

TEST(Readme, NoDevelopmentHistory) {
  for (const char* doc : {"README.md", "docs/performance.md", "docs/correctness.md"}) {
    const std::string text = cnn::test::slurp(std::filesystem::path(cnn::test::source_dir()) / doc);
    for (const char* word : {"session", "Session"})
      EXPECT_EQ(text.find(word), std::string::npos) << doc << " mentions '" << word << "'";
  }
}
