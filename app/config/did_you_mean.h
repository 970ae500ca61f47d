#pragma once
// Suggestions for misspelled names (config keys, layer kinds, option values).
#include <string>
#include <vector>

namespace cnn {

// Optimal-string-alignment distance: insertions, deletions, substitutions and swaps of two
// neighbouring characters each cost 1, so "out_chanels" is 1 away from "out_channels".
int edit_distance(const std::string& a, const std::string& b);

// The candidate closest to `word` when it is close enough to be a plausible typo (at most a third
// of the word's length, at least 1, ignoring case); empty when none is.
// Words longer than this get no suggestion.
constexpr size_t kMaxSuggestedWord = 64;
std::string closest_match(const std::string& word, const std::vector<std::string>& candidates);

// "; did you mean 'x'?" for the closest match, or "" when there is none.
std::string did_you_mean(const std::string& word, const std::vector<std::string>& candidates);

}  // namespace cnn
