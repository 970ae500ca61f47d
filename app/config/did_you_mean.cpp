#include "app/config/did_you_mean.h"

#include <algorithm>
#include <cctype>

namespace cnn {

int edit_distance(const std::string& a, const std::string& b) {
  const size_t n = a.size(), m = b.size();
  // d[i][j]: distance between the first i characters of a and the first j of b.
  std::vector<std::vector<int>> d(n + 1, std::vector<int>(m + 1, 0));
  for (size_t i = 0; i <= n; ++i) d[i][0] = static_cast<int>(i);
  for (size_t j = 0; j <= m; ++j) d[0][j] = static_cast<int>(j);
  for (size_t i = 1; i <= n; ++i) {
    for (size_t j = 1; j <= m; ++j) {
      const int cost = a[i - 1] == b[j - 1] ? 0 : 1;
      d[i][j] = std::min({d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + cost});
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1])
        d[i][j] = std::min(d[i][j], d[i - 2][j - 2] + 1);
    }
  }
  return d[n][m];
}

namespace {
std::string lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}
}  // namespace

std::string closest_match(const std::string& word, const std::vector<std::string>& candidates) {
  // The distance costs time and memory of len(word) x len(candidate); no typo of a known name is
  // this long, and a 48 MB key must not cost gigabytes to refuse.
  if (word.size() > kMaxSuggestedWord) return "";
  const std::string w = lower(word);
  const int limit = std::max<int>(1, static_cast<int>(w.size()) / 3);
  std::string best;
  int best_d = limit + 1;
  for (const auto& c : candidates) {
    const int d = edit_distance(w, lower(c));
    if (d < best_d) {
      best_d = d;
      best = c;
    }
  }
  return best;
}

std::string did_you_mean(const std::string& word, const std::vector<std::string>& candidates) {
  const std::string m = closest_match(word, candidates);
  return m.empty() ? std::string() : "; did you mean '" + m + "'?";
}

}  // namespace cnn
