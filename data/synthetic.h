#pragma once
// A procedurally generated dataset that needs no download (configs/tiny.yaml, CI): grayscale
// images of simple shapes, one shape per class, at a random position, size, thickness and
// brightness, with noise. Deterministic from the seed: sample i of a split is drawn from
// hash(seed, split, i) alone, so it does not depend on how many samples are made.
#include <cstdint>
#include <string>
#include <vector>

#include "data/dataset.h"

namespace cnn {

constexpr int kSyntheticMaxClasses = 10;

enum class SyntheticSplit { Train = 1, Test = 2 };

// The class names, in label order: hbar, vbar, diagonal, antidiagonal, ring, plus, x, square,
// triangle, equals (the first `classes` of them).
std::vector<std::string> synthetic_class_names(int classes);

// n images of (c, h, w); c = 3 replicates the gray image. Labels cycle 0, 1, ..., classes-1.
Dataset make_synthetic(int n, int classes, uint64_t seed, SyntheticSplit split, int c = 1,
                       int h = 28, int w = 28);

}  // namespace cnn
