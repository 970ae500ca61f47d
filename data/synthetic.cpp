#include "data/synthetic.h"

#include <algorithm>
#include <cmath>

#include "runtime/hash_rng.h"
#include "runtime/error.h"

namespace cnn {

namespace {

const char* const kShapeNames[kSyntheticMaxClasses] = {
    "hbar", "vbar", "diagonal", "antidiagonal", "ring",
    "plus", "x",    "square",   "triangle",     "equals"};

struct Segment {
  float x0, y0, x1, y1;
};

float segment_distance(float px, float py, const Segment& s) {
  const float dx = s.x1 - s.x0, dy = s.y1 - s.y0;
  const float len2 = dx * dx + dy * dy;
  float t = len2 > 0 ? ((px - s.x0) * dx + (py - s.y0) * dy) / len2 : 0.f;
  t = std::clamp(t, 0.f, 1.f);
  const float ex = s.x0 + t * dx - px, ey = s.y0 + t * dy - py;
  return std::sqrt(ex * ex + ey * ey);
}

// Coverage of a pixel by a stroke of half-width `half` at distance d, with a one-pixel soft edge
// so that thin strokes stay visible at any position.
float stroke(float d, float half) {
  return std::clamp(half + 0.5f - d, 0.f, 1.f);
}

// Renders shape `cls` into an (h, w) canvas of [0, 1] values.
void render(int cls, SplitMix64& rng, int h, int w, std::vector<float>& canvas) {
  const float s = std::min(h, w) / 28.f;  // shapes are designed on a 28x28 canvas
  const float cx = w / 2.f - 0.5f + rng.range(-4, 4) * s;
  const float cy = h / 2.f - 0.5f + rng.range(-4, 4) * s;
  const float half = (1.0f + 0.5f * rng.range(0, 2)) * s;  // stroke half-width 1..2 px
  const float len = (14 + rng.range(0, 6)) * s;            // bar length
  const float r = len / 2;
  // At most three strokes per shape (a fixed array: no allocation per image).
  Segment segs[3];
  int nsegs = 0;
  auto add = [&](float x0, float y0, float x1, float y1) { segs[nsegs++] = {x0, y0, x1, y1}; };
  const float q = r * 0.75f;  // diagonals: the same length as the bars
  switch (cls) {
    case 0:
      add(cx - r, cy, cx + r, cy);
      break;
    case 1:
      add(cx, cy - r, cx, cy + r);
      break;
    case 2:
      add(cx - q, cy - q, cx + q, cy + q);
      break;
    case 3:
      add(cx - q, cy + q, cx + q, cy - q);
      break;
    case 5:
      add(cx - r, cy, cx + r, cy);
      add(cx, cy - r, cx, cy + r);
      break;
    case 6:
      add(cx - q, cy - q, cx + q, cy + q);
      add(cx - q, cy + q, cx + q, cy - q);
      break;
    case 8:  // triangle outline, apex up
      add(cx, cy - r, cx - r, cy + r * 0.8f);
      add(cx - r, cy + r * 0.8f, cx + r, cy + r * 0.8f);
      add(cx + r, cy + r * 0.8f, cx, cy - r);
      break;
    case 9: {
      const float gap = (3 + rng.range(0, 2)) * s;
      add(cx - r, cy - gap, cx + r, cy - gap);
      add(cx - r, cy + gap, cx + r, cy + gap);
      break;
    }
    default:
      break;  // ring (4) and square (7) are drawn from their distance functions
  }
  const float ring_r = (6 + rng.range(0, 3)) * s;
  const float square_half = (4 + rng.range(0, 3)) * s;
  for (int y = 0; y < h; ++y) {
    for (int x = 0; x < w; ++x) {
      float v = 0;
      if (cls == 4) {
        const float d = std::sqrt((x - cx) * (x - cx) + (y - cy) * (y - cy));
        v = stroke(std::fabs(d - ring_r), half);
      } else if (cls == 7) {  // filled square
        const float d = std::max(std::fabs(x - cx), std::fabs(y - cy));
        v = std::clamp(square_half + 0.5f - d, 0.f, 1.f);
      } else {
        for (int k = 0; k < nsegs; ++k)
          v = std::max(v, stroke(segment_distance(x, y, segs[k]), half));
      }
      canvas[size_t(y) * w + x] = v;
    }
  }
}

}  // namespace

std::vector<std::string> synthetic_class_names(int classes) {
  CNN_CHECK(classes >= 2 && classes <= kSyntheticMaxClasses,
            "data.synthetic.classes is {}, expected 2..{}", classes, kSyntheticMaxClasses);
  return std::vector<std::string>(kShapeNames, kShapeNames + classes);
}

Dataset make_synthetic(int n, int classes, uint64_t seed, SyntheticSplit split, int c, int h,
                       int w) {
  CNN_CHECK(n > 0, "synthetic dataset size is {}, expected > 0", n);
  CNN_CHECK(c == 1 || c == 3, "synthetic images have 1 or 3 channels, not {}", c);
  CNN_CHECK(h >= 16 && w >= 16 && h <= 1024 && w <= 1024,
            "synthetic images are {}x{}, expected sides in 16..1024", h, w);
  Dataset d;
  d.class_names = synthetic_class_names(classes);
  d.n = n;
  d.c = c;
  d.h = h;
  d.w = w;
  d.images.resize(size_t(n) * c * h * w);  // (N, C, H, W)
  d.labels.resize(n);
  d.source = fmt::format("synthetic shapes ({} classes, seed {}, {})", classes, seed,
                         split == SyntheticSplit::Train ? "train" : "test");
  std::vector<float> canvas(size_t(h) * w);  // (H, W)
  const size_t plane = size_t(h) * w;
  for (int i = 0; i < n; ++i) {
    SplitMix64 rng(hash3(seed, uint64_t(split), uint64_t(i)));
    const int cls = i % classes;
    render(cls, rng, h, w, canvas);
    const float brightness = 0.6f + 0.4f * float(rng.uniform());
    uint8_t* img = d.images.data() + size_t(i) * c * plane;
    for (size_t p = 0; p < plane; ++p) {
      // Noise: a sum of three uniforms (roughly normal, sigma ~0.06), clipped like a real sensor.
      const float noise = 0.12f * float(rng.uniform() + rng.uniform() + rng.uniform() - 1.5);
      const float v = std::clamp(canvas[p] * brightness + noise, 0.f, 1.f);
      img[p] = uint8_t(std::lround(v * 255.f));
    }
    for (int k = 1; k < c; ++k) std::copy_n(img, plane, img + k * plane);
    d.labels[i] = cls;
  }
  return d;
}

}  // namespace cnn
