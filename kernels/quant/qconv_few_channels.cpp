// Few-channel int8 convolution: tiling, support check, and the dispatch of the fused input
// quantization (CPU twin or CUDA); qconv.cpp dispatches the kernel from int8 input.
#include "kernels/quant/qconv_few_channels.h"

#include <algorithm>
#include <vector>

#include "kernels/quant/qconv_few_channels_cuda.h"
#include "kernels/quant/quantize.h"
#include "runtime/dispatch.h"
#include "runtime/error.h"
#include "runtime/math_util.h"

namespace cnn {
namespace {

// About this many (pooled output, 8 channels) items per block: 256 threads with two each, and
// for LeNet's conv1 (14x14 pooled, 32 channels) two blocks per image.
constexpr int kItemsPerBlock = 512;

void sizes_of_tile(const QConvShape& s, QFewTiling& t) {
  const int conv_rows = (t.tph - 1) * s.pool_sh + s.pool_kh;
  const int conv_cols = (t.tpw - 1) * s.pool_sw + s.pool_kw;
  t.in_rows = (conv_rows - 1) * s.stride_h + s.kh;
  t.in_words = (conv_cols - 1) * s.stride_w + (t.kww - 1) * t.taps_per_word + 1;
  t.smem_bytes =
      4 * (int64_t(s.kh) * t.kww * t.ocb + 2 * t.ocb + int64_t(t.in_rows) * int64_t(t.in_words));
  // One channel: the pixels' bytes the words are assembled from, (in_rows, in_words + 3).
  if (s.c == 1) t.smem_bytes += int64_t(t.in_rows) * (t.in_words + 3);
}

}  // namespace

QFewTiling qconv_few_channels_tiling(const QConvShape& s) {
  QFewTiling t{};
  t.oh = s.oh(), t.ow = s.ow(), t.ph = s.ph(), t.pw = s.pw();
  t.taps_per_word = s.c == 1 ? 4 : 1;
  t.kww = ceil_div(s.kw, t.taps_per_word);
  t.ocb = std::min(64, (s.oc + 7) / 8 * 8);
  t.chunks = ceil_div(s.oc, t.ocb);
  t.tpw = std::min(t.pw, 16);
  const int groups8 = t.ocb / 8;
  t.tph = std::clamp(kItemsPerBlock / (t.tpw * groups8), 1, t.ph);
  t.tph = ceil_div(t.ph, ceil_div(t.ph, t.tph));  // equal tiles
  sizes_of_tile(s, t);
  while (t.smem_bytes > kQFewMaxSmem && (t.tph > 1 || t.tpw > 1)) {
    if (t.tph >= t.tpw)
      t.tph = (t.tph + 1) / 2;
    else
      t.tpw = (t.tpw + 1) / 2;
    sizes_of_tile(s, t);
  }
  t.tiles_h = ceil_div(t.ph, t.tph), t.tiles_w = ceil_div(t.pw, t.tpw);
  return t;
}

bool qconv_few_channels_supported(const QConvShape& s) {
  if (s.groups != 1 || s.c > 4 || s.dil_h != 1 || s.dil_w != 1 || s.kh > kQFewMaxKernel ||
      s.kw > kQFewMaxKernel || s.pool_kw > kQFewMaxPoolW)
    return false;
  const QFewTiling t = qconv_few_channels_tiling(s);
  // Blocks are indexed by (image, tile) in one 32-bit grid dimension.
  return t.smem_bytes <= kQFewMaxSmem &&
         int64_t(s.n) * t.tiles_h * t.tiles_w < (int64_t{1} << 31) && t.chunks <= 65535;
}

namespace {

// The tensor-core layout of m.few's tile (its tph, tpw, in_rows and in_words set).
void mma_sizes_of_tile(const QConvShape& s, QFewMmaTiling& m) {
  const QFewTiling& t = m.few;
  m.m_tiles = ceil_div(t.tph * t.tpw * m.slots, 16);
  // 2x2 windows: whole tile pairs (the int8 kernel takes two tiles at once, a window's 4 slots in
  // one lane's rows of both).
  if (m.slots == 4) m.m_tiles += m.m_tiles % 2;
  // A row stride of 9 words mod 32: a warp's A fragment load reads rows g and g + 8 of an mma
  // tile (neighbouring conv outputs of 8 pool window slots) at one kernel word each. For LeNet's
  // conv1 (2x2 windows, 4 taps a word) those are input rows 0..2 of the tile at even columns
  // 0..10: with a stride of 9 mod 32 the three rows fall on banks 0-10, 9-19 and 18-28, distinct,
  // where a multiple of 32 (in_words = 32 there) conflicts 3 ways.
  m.row_words = t.in_words + ((41 - t.in_words % 32) % 32);
  // One channel: a thread stages words 4q..4q+3 of a row (funnel shifts of its pixels 4q..4q+7).
  m.word_groups = s.c == 1 ? round_up4(t.in_words) / 4 : 0;
  // 8 bytes each: B fragments, word offsets, window slots (base word, pooled output), mult+add.
  m.smem_bytes = 8 * (int64_t(m.k_steps) * m.n_tiles * 32 + int64_t(m.k_steps) * 4 +
                      int64_t(m.m_tiles) * 16 + t.ocb) +
                 4 * int64_t(t.in_rows) * m.row_words;
}

}  // namespace

// The dp4a kernel's tiles, halved as its own are where the padded rows and k steps do not fit.
QFewMmaTiling qconv_few_channels_mma_tiling(const QConvShape& s) {
  QFewMmaTiling m{};
  m.few = qconv_few_channels_tiling(s);
  QFewTiling& t = m.few;
  m.n_tiles = t.ocb / 8;
  m.k_steps = ceil_div(s.kh * t.kww, 8);
  m.slots = 1, m.slot_shift = 0;
  while (m.slots < s.pool_kh * s.pool_kw) m.slots *= 2, ++m.slot_shift;
  mma_sizes_of_tile(s, m);
  while (m.smem_bytes > kQFewMaxSmem && (t.tph > 1 || t.tpw > 1)) {
    if (t.tph >= t.tpw)
      t.tph = (t.tph + 1) / 2;
    else
      t.tpw = (t.tpw + 1) / 2;
    sizes_of_tile(s, t);
    mma_sizes_of_tile(s, m);
  }
  t.tiles_h = ceil_div(t.ph, t.tph), t.tiles_w = ceil_div(t.pw, t.tpw);
  return m;
}

bool qconv_few_channels_mma_supported(const QConvShape& s) {
  if (!qconv_few_channels_supported(s) || s.pool_kh * s.pool_kw > kQFewMmaMaxWindow) return false;
  const QFewMmaTiling m = qconv_few_channels_mma_tiling(s);
  // The kernel's window slots hold 2 * (a pooled output's index in its image) + 1 in an int.
  return m.smem_bytes <= kQFewMaxSmem &&
         int64_t(s.n) * m.few.tiles_h * m.few.tiles_w < (int64_t{1} << 31) &&
         int64_t(m.few.ph) * m.few.pw < (int64_t{1} << 30);
}

void qconv_few_channels_forward_quantize(const QConvShape& s, const float* x, float inv_scale,
                                         const int8_t* w, const QEpilogue& ep, int8_t* y,
                                         const Exec& ex, QConvKernel kernel) {
  check_qconv_shape(s);
  CNN_CHECK(kernel == QConvKernel::Auto || kernel == QConvKernel::FewChannels ||
                kernel == QConvKernel::FewChannelsTensorCores,
            "qconv_few_channels_forward_quantize: kernel '{}' (expected auto or a few-channel one)",
            qconv_kernel_name(kernel));
  // Auto: the rule's few-channel kernel; refuses shapes neither few-channel kernel takes.
  const QConvKernel k = kernel == QConvKernel::Auto && qconv_few_channels_mma_supported(s)
                            ? QConvKernel::FewChannelsTensorCores
                            : (kernel == QConvKernel::Auto ? QConvKernel::FewChannels : kernel);
  qconv_resolve_kernel(s, QConvPath(nullptr, k));  // refuses a shape the kernel does not take
  CNN_CHECK(x && w && y && ep.mult && ep.add, "qconv_few_channels_forward_quantize: null pointer");
  if (ex.device == Device::CPU) {
    QuantizeShape qs;
    qs.n = s.n, qs.c = s.c, qs.h = s.h, qs.w = s.w, qs.cp = s.cp;
    std::vector<int8_t> xq(size_t(s.n) * s.h * s.w * s.cp);
    quantize_nchw_to_nhwc_cpu(qs, x, inv_scale, xq.data());
    return qconv_forward_cpu(s, xq.data(), w, ep, y);
  }
  CNN_CUDA_BRANCH("qconv_few_channels_forward_quantize", {
    if (k == QConvKernel::FewChannelsTensorCores)
      qconv_few_channels_mma_forward_quantize_cuda(s, x, inv_scale, w, ep, y, ex.stream);
    else
      qconv_few_channels_forward_quantize_cuda(s, x, inv_scale, w, ep, y, ex.stream);
  });
}

}  // namespace cnn
