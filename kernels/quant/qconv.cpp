// Int8 convolution dispatch: checks the shape once, then runs the CPU twin or the CUDA kernels.
#include "kernels/quant/qconv.h"

#include <algorithm>
#include <type_traits>

#include "kernels/quant/qconv_cuda.h"
#include "kernels/quant/qconv_few_channels.h"
#include "kernels/quant/qconv_few_channels_cuda.h"
#include "runtime/dispatch.h"
#include "runtime/error.h"

namespace cnn {

int qconv_weight_inner(int c, int groups) {
  return groups == 1 ? round_up4(c) : c / groups;
}

void check_qconv_shape(const QConvShape& s) {
  CNN_CHECK(s.n >= 1 && s.h >= 1 && s.w >= 1 && s.c >= 1,
            "qconv: bad input shape n={} h={} w={} c={}", s.n, s.h, s.w, s.c);
  CNN_CHECK(s.cp >= s.c && s.cp % 4 == 0,
            "qconv: channel stride {} must be >= {} and a multiple of 4", s.cp, s.c);
  CNN_CHECK(s.groups >= 1 && s.c % s.groups == 0 && s.oc % s.groups == 0,
            "qconv: groups {} must divide channels {} and output channels {}", s.groups, s.c, s.oc);
  CNN_CHECK(s.oc >= 1 && s.ocp >= s.oc && s.ocp % 4 == 0,
            "qconv: output channel stride {} must be >= {} and a multiple of 4", s.ocp, s.oc);
  CNN_CHECK(s.cgp == qconv_weight_inner(s.c, s.groups),
            "qconv: weight inner extent {} for {} channels in {} groups, expected {}", s.cgp, s.c,
            s.groups, qconv_weight_inner(s.c, s.groups));
  CNN_CHECK(s.kh >= 1 && s.kw >= 1 && s.stride_h >= 1 && s.stride_w >= 1 && s.pad_h >= 0 &&
                s.pad_w >= 0 && s.dil_h >= 1 && s.dil_w >= 1,
            "qconv: bad kernel/stride/padding/dilation");
  CNN_CHECK(s.oh() >= 1 && s.ow() >= 1, "qconv: the kernel does not fit the input");
  CNN_CHECK(s.pool_kh >= 1 && s.pool_kw >= 1 && s.pool_sh >= 1 && s.pool_sw >= 1 &&
                s.pool_ph >= 0 && s.pool_pw >= 0 && 2 * s.pool_ph <= s.pool_kh &&
                2 * s.pool_pw <= s.pool_kw && s.ph() >= 1 && s.pw() >= 1,
            "qconv: bad pool window");
}

bool qconv_igemm_supported(const QConvShape& s) {
  // The gather addresses activations with 32-bit offsets.
  const int64_t x_size = int64_t(s.n) * s.h * s.w * s.cp;
  const int64_t k = int64_t(s.kh) * s.kw * s.cgp;
  return s.groups == 1 && s.pool_kh * s.pool_kw <= kQIgemmTileM && x_size < (int64_t{1} << 31) &&
         k < (int64_t{1} << 30);
}

int64_t qconv_igemm_weight_size(const QConvShape& s) {
  const int64_t k = int64_t(s.kh) * s.kw * s.cgp;
  const int64_t kp = (k + kQIgemmTileK - 1) / kQIgemmTileK * kQIgemmTileK;
  const int64_t oct = (int64_t(s.ocp) + kQIgemmTileN - 1) / kQIgemmTileN * kQIgemmTileN;
  return oct * kp;
}

void qconv_pack_igemm_weights(const QConvShape& s, const int8_t* w, int8_t* packed) {
  CNN_CHECK(qconv_igemm_supported(s), "qconv: the tensor-core path does not take this shape");
  const int64_t k = int64_t(s.kh) * s.kw * s.cgp;
  const int64_t kp = (k + kQIgemmTileK - 1) / kQIgemmTileK * kQIgemmTileK;
  const int64_t size = qconv_igemm_weight_size(s);
  std::fill(packed, packed + size, int8_t(0));
  for (int64_t o = 0; o < s.oc; ++o) std::copy(w + o * k, w + (o + 1) * k, packed + o * kp);
}

int qconv_igemm_pick_splits(const QConvShape& s, int sm_count) {
  const int64_t npp = int64_t(s.n) * s.ph() * s.pw();
  const int64_t ppb = kQIgemmTileM / (s.pool_kh * s.pool_kw);
  const int64_t tiles = (npp + ppb - 1) / ppb * ((s.ocp + kQIgemmTileN - 1) / kQIgemmTileN);
  const int64_t ktiles = (int64_t(s.kh) * s.kw * s.cgp + kQIgemmTileK - 1) / kQIgemmTileK;
  const int64_t resident = sm_count;  // one block an SM (qconv.h says why)
  int splits = 1;
  while (splits * 2 <= kQIgemmMaxSplits && tiles * splits * 2 <= resident &&
         ktiles / (splits * 2) >= kQIgemmMinKTilesPerSplit)
    splits *= 2;
  return splits;
}

const char* qigemm_tile_name(QIgemmTile t) {
  switch (t) {
    case QIgemmTile::Auto:
      return "auto";
    case QIgemmTile::Conv128x64:
      return "128x64";
    case QIgemmTile::Linear64x64:
      return "linear 64x64";
    case QIgemmTile::Linear64x128:
      return "linear 64x128";
    case QIgemmTile::Linear128x128:
      return "linear 128x128";
  }
  return "?";
}

namespace {

// Estimated cycles of a linear layer on a linear tile of bm x bn with `splits`, from figures of
// an H100/H200 SM (guesses, to be replaced by the rule the device measures): a block streams
// its k-tiles' A and B bytes from L2 at ~64 B/clk while mma.sync s8 retires ~2048 MAC/clk (the
// larger of the two, they overlap), pays ~1000 clk to fill its pipeline, and with splits > 1 a
// cluster barrier (~1000 clk) and the read of its bm x bn int32 band sum over DSMEM (~32 B/clk);
// blocks beyond the resident ones (one an SM) run in further waves.
double linear_tile_cost(const QConvShape& s, int bm, int bn, int splits, int sm_count) {
  const int64_t k = int64_t(s.kh) * s.kw * s.cgp;
  const int64_t ktiles = (k + kQIgemmTileK - 1) / kQIgemmTileK;
  const int64_t kt = (ktiles + splits - 1) / splits;
  const int64_t blocks = (int64_t(s.n) + bm - 1) / bm * ((s.ocp + bn - 1) / bn) * splits;
  const int64_t waves = (blocks + sm_count - 1) / std::max(sm_count, 1);
  const double load = double(kt) * (bm + bn) * kQIgemmTileK / 64.0;
  const double mma = double(kt) * bm * bn * kQIgemmTileK / 2048.0;
  const double sum = splits > 1 ? 1000.0 + double(bm) * bn * 4 / 32.0 : 0.0;
  return double(waves) * (std::max(load, mma) + 1000.0 + sum);
}

int tile_rows(QIgemmTile t) {
  return t == QIgemmTile::Linear128x128 || t == QIgemmTile::Conv128x64 ? 128 : 64;
}
int tile_cols(QIgemmTile t) {
  return t == QIgemmTile::Linear64x128 || t == QIgemmTile::Linear128x128 ? 128 : 64;
}

}  // namespace

QIgemmPlan qconv_igemm_plan(const QConvShape& s, int sm_count, QIgemmTile tile, int splits) {
  QIgemmPlan plan;
  if (tile == QIgemmTile::Auto && !qconv_is_linear(s)) tile = QIgemmTile::Conv128x64;
  if (tile == QIgemmTile::Conv128x64) {
    plan.tile = tile;
    plan.splits = splits ? splits : qconv_igemm_pick_splits(s, sm_count);
    return plan;
  }
  constexpr QIgemmTile kLinearTiles[] = {QIgemmTile::Linear64x64, QIgemmTile::Linear64x128,
                                         QIgemmTile::Linear128x128};
  // Ties go to the smaller tile and the fewer splits (listed first).
  double best = 0;
  bool found = false;
  for (QIgemmTile t : kLinearTiles)
    for (int sp = 1; sp <= kQIgemmMaxSplits; sp *= 2) {
      if ((tile != QIgemmTile::Auto && t != tile) || (splits && sp != splits)) continue;
      const double cost = linear_tile_cost(s, tile_rows(t), tile_cols(t), sp, sm_count);
      if (!found || cost < best) best = cost, plan.tile = t, plan.splits = sp, found = true;
    }
  return plan;
}

bool qconv_is_linear(const QConvShape& s) {
  return s.groups == 1 && s.kh == s.h && s.kw == s.w && s.pad_h == 0 && s.pad_w == 0 &&
         s.dil_h == 1 && s.dil_w == 1 && s.pool_kh == 1 && s.pool_kw == 1 && s.pool_ph == 0 &&
         s.pool_pw == 0 && s.cp == s.cgp;
}

const char* qconv_kernel_name(QConvKernel k) {
  switch (k) {
    case QConvKernel::Auto:
      return "auto";
    case QConvKernel::Direct:
      return "direct dp4a";
    case QConvKernel::FewChannels:
      return "few-channel dp4a";
    case QConvKernel::TensorCores:
      return "tensor cores";
    case QConvKernel::LinearDp4a:
      return "linear dp4a";
    case QConvKernel::FewChannelsTensorCores:
      return "few-channel tensor cores";
  }
  return "?";
}

QConvKernel qconv_pick_kernel(const QConvShape& s, bool specialized) {
  if (!specialized) return QConvKernel::Direct;
  if (qconv_few_channels_mma_supported(s)) return QConvKernel::FewChannelsTensorCores;
  if (qconv_few_channels_supported(s)) return QConvKernel::FewChannels;
  if (qconv_is_linear(s) && (s.oc <= kQLinearDp4aMaxCols || s.n <= kQLinearDp4aMaxRows))
    return QConvKernel::LinearDp4a;
  if (qconv_igemm_supported(s)) return QConvKernel::TensorCores;
  return QConvKernel::Direct;
}

QConvKernel qconv_resolve_kernel(const QConvShape& s, const QConvPath& path) {
  const bool rule = path.kernel == QConvKernel::Auto;
  const QConvKernel k = rule ? qconv_pick_kernel(s, true) : path.kernel;
  CNN_CHECK(k != QConvKernel::TensorCores || path.w_igemm,
            "qconv: the tensor-core kernel ({}) needs the repacked weights, got none",
            rule ? "the rule's choice for this shape" : "forced");
  CNN_CHECK(!path.w_igemm || qconv_igemm_supported(s),
            "qconv: repacked weights given for a shape the tensor-core path does not take");
  CNN_CHECK(
      k != QConvKernel::FewChannels || qconv_few_channels_supported(s),
      "qconv: the few-channel kernel takes groups 1, c <= 4, dilation 1, kernels up to {0}x{0} "
      "and pool windows up to {1} wide within its shared memory; got groups={2} c={3} "
      "dilation {4}x{5} kernel {6}x{7} pool {8}x{9}",
      kQFewMaxKernel, kQFewMaxPoolW, s.groups, s.c, s.dil_h, s.dil_w, s.kh, s.kw, s.pool_kh,
      s.pool_kw);
  CNN_CHECK(k != QConvKernel::FewChannelsTensorCores || qconv_few_channels_mma_supported(s),
            "qconv: the few-channel tensor-core kernel takes what the few-channel kernel takes "
            "with a pool window of at most {} outputs, within its shared memory; got c={} kernel "
            "{}x{} pool {}x{} groups={} dilation {}x{}",
            kQFewMmaMaxWindow, s.c, s.kh, s.kw, s.pool_kh, s.pool_kw, s.groups, s.dil_h, s.dil_w);
  CNN_CHECK(k != QConvKernel::LinearDp4a || qconv_is_linear(s),
            "qconv: the linear dp4a kernel takes a linear layer (kernel = the {}x{} input, no "
            "padding, pool or groups, channel stride {} = the weights' {}), got kernel {}x{}",
            s.h, s.w, s.cp, s.cgp, s.kh, s.kw);
  CNN_CHECK(path.splits == 0 || path.splits == 1 || path.splits == 2 || path.splits == 4 ||
                path.splits == 8,
            "qconv: splits={} (expected 0 for the rule, 1, 2, 4 or 8)", path.splits);
  CNN_CHECK(k != QConvKernel::TensorCores || path.tile == QIgemmTile::Auto ||
                path.tile == QIgemmTile::Conv128x64 || qconv_is_linear(s),
            "qconv: the tensor-core tile {} takes linear layers only, got kernel {}x{} on a {}x{} "
            "input",
            qigemm_tile_name(path.tile), s.kh, s.kw, s.h, s.w);
  return k;
}

namespace {

// The few-channel launchers by output type, so that one dispatch below serves both.
void few_channels_cuda(const QConvShape& s, const int8_t* x, const int8_t* w, const QEpilogue& ep,
                       int8_t* y, cudaStream_t stream) {
  qconv_few_channels_forward_cuda(s, x, w, ep, y, stream);
}
void few_channels_cuda(const QConvShape& s, const int8_t* x, const int8_t* w, const QEpilogue& ep,
                       float* y, cudaStream_t stream) {
  qconv_few_channels_forward_float_cuda(s, x, w, ep, y, stream);
}
void few_channels_mma_cuda(const QConvShape& s, const int8_t* x, const int8_t* w,
                           const QEpilogue& ep, int8_t* y, cudaStream_t stream) {
  qconv_few_channels_mma_forward_cuda(s, x, w, ep, y, stream);
}
void few_channels_mma_cuda(const QConvShape& s, const int8_t* x, const int8_t* w,
                           const QEpilogue& ep, float* y, cudaStream_t stream) {
  qconv_few_channels_mma_forward_float_cuda(s, x, w, ep, y, stream);
}

// qconv_forward and qconv_forward_float: the same checks and dispatch for an int8 or a float y.
template <class T>
void forward(const char* op, const QConvShape& s, const int8_t* x, const int8_t* w,
             const QEpilogue& ep, T* y, const Exec& ex, const QConvPath& path) {
  check_qconv_shape(s);
  CNN_CHECK(x && w && y && ep.mult && ep.add, "{}: null pointer", op);
  const QConvKernel k = qconv_resolve_kernel(s, path);
  if (ex.device == Device::CPU) {
    if constexpr (std::is_same_v<T, int8_t>)
      return qconv_forward_cpu(s, x, w, ep, y);
    else
      return qconv_forward_float_cpu(s, x, w, ep, y);
  }
  CNN_CUDA_BRANCH(op, {
    switch (k) {
      case QConvKernel::FewChannels:
        return few_channels_cuda(s, x, w, ep, y, ex.stream);
      case QConvKernel::FewChannelsTensorCores:
        return few_channels_mma_cuda(s, x, w, ep, y, ex.stream);
      case QConvKernel::TensorCores:
        return qconv_igemm_forward_cuda(s, x, path.w_igemm, ep, y, path.tile, path.splits,
                                        ex.stream);
      case QConvKernel::LinearDp4a:
        return qconv_linear_forward_cuda(s, x, w, ep, y, ex.stream, path.overlap_launch);
      case QConvKernel::Direct:
      case QConvKernel::Auto:  // resolved above
        return qconv_forward_cuda(s, x, w, ep, y, ex.stream);
    }
  });
}

}  // namespace

void qconv_forward(const QConvShape& s, const int8_t* x, const int8_t* w, const QEpilogue& ep,
                   int8_t* y, const Exec& ex, const QConvPath& path) {
  forward("qconv_forward", s, x, w, ep, y, ex, path);
}

void qconv_forward_float(const QConvShape& s, const int8_t* x, const int8_t* w, const QEpilogue& ep,
                         float* y, const Exec& ex, const QConvPath& path) {
  forward("qconv_forward_float", s, x, w, ep, y, ex, path);
}

}  // namespace cnn
