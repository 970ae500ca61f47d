// conv2d API: checks the shape once, then dispatches on the device and the variant.
// CPU: naive = the reference loops, anything else = im2col + packed GEMM (conv2d_cpu_fast).
// CUDA: naive / tiled = the direct kernels of conv2d.cu; igemm = implicit GEMM (FP32 FFMA, or
// TF32 mma.sync when ex.precision is tf32); fast / auto = the single-input-channel kernels where
// C == 1 (conv1), implicit GEMM elsewhere; wgmma = the Hopper wgmma kernels at TF32: the
// forward and the stride-1 input gradient (conv2d_wgmma.h), the weight gradient
// (conv2d_wgmma_wgrad.h); refused (cnn::Error, so that autotune leaves it out) wherever they
// cannot run; its input gradient on planes of at most 16x16 output pixels as one wgmma GEMM on
// explicit copies and a col2im gather (conv2d_dgrad_col2im.h), at every precision wgmma-nhwc
// takes. wgmma-nhwc = the forward and stride-1 input gradient with TMA im2col on a
// channels-last copy (conv2d_wgmma_nhwc.h, in the caller's scratch) at TF32, BF16, or FP32 as
// 3xTF32 (split operands: FP32 accuracy on the tensor cores); its weight gradient at BF16 from
// channels-last copies too (conv2d_wgmma_wgrad_nhwc.h); at TF32 and FP32 on planes of at most
// 16x16 output pixels as one wgmma GEMM on explicit copies (conv2d_wgrad_im2col.h), which is
// wgmma's weight gradient at BF16 there; elsewhere (and where those refuse: BF16 with db or
// deterministic, larger planes) as wgmma's (TF32, 3xTF32 at FP32); refused where those are.
// A dilated or grouped shape (Conv2dShape::extended) only under wgmma-nhwc, whose kernels read
// such windows directly (conv2d_*_runs_directly); every other variant refuses it.
#include "kernels/conv/conv2d.h"

#include <algorithm>
#include <cstdint>
#include <utility>

#include "kernels/conv/conv2d_1ch.h"
#include "kernels/conv/conv2d_cpu_fast.h"
#include "kernels/conv/conv2d_cuda.h"
#include "kernels/conv/conv2d_dgrad_col2im.h"
#include "kernels/conv/conv2d_igemm.h"
#include "kernels/conv/conv2d_nhwc_layout.h"
#include "kernels/conv/conv2d_nhwc_scratch.h"
#include "kernels/conv/conv2d_wgmma.h"
#include "kernels/conv/conv2d_wgmma_nhwc.h"
#include "kernels/conv/conv2d_wgmma_wgrad.h"
#include "kernels/conv/conv2d_wgmma_wgrad_nhwc.h"
#include "kernels/conv/conv2d_wgmma_wgrad_tf32_halo.h"
#include "kernels/conv/conv2d_wgrad_im2col.h"
#include "kernels/conv/conv_window_check.h"
#include "runtime/dispatch.h"
#include "runtime/env_switches.h"
#include "runtime/error.h"

namespace cnn {

void check_conv2d_shape_any(const Conv2dShape& s) {
  check_conv_window({s.n, s.c, s.h, s.w, s.oc, s.kh, s.kw, s.stride_h, s.stride_w, s.pad_h, s.pad_w,
                     s.dil_h, s.dil_w});
  CNN_CHECK(s.groups >= 1 && s.c % s.groups == 0 && s.oc % s.groups == 0,
            "conv2d: groups = {} must divide c = {} and oc = {}", s.groups, s.c, s.oc);
}

void check_conv2d_shape(const Conv2dShape& s) {
  check_conv2d_shape_any(s);
  CNN_CHECK(!s.extended(),
            "conv2d: dilation {}x{}, groups {} run on algo wgmma-nhwc only (expected 1x1, 1 here); "
            "the other variants run them on dilation phases, block-diagonal weights or one group "
            "at a time (conv2d_dilated_dense.h, conv2d_grouped_dense.h)",
            s.dil_h, s.dil_w, s.groups);
}

namespace {

enum class ConvPath { Direct, Igemm, OneChannel, Wgmma, WgmmaNhwc };

// Which CUDA implementation serves `algo` for this shape (unused in a CPU-only build).
[[maybe_unused]] ConvPath cuda_path(const Conv2dShape& s, Algo algo) {
  if (algo == Algo::Naive || algo == Algo::Tiled) return ConvPath::Direct;
  if (algo == Algo::Igemm) return ConvPath::Igemm;
  if (algo == Algo::Wgmma) return ConvPath::Wgmma;
  if (algo == Algo::WgmmaNhwc) return ConvPath::WgmmaNhwc;
  return conv2d_1ch_applicable(s) ? ConvPath::OneChannel : ConvPath::Igemm;
}

// The implicit-GEMM gradient kernel `algo` names: igemm the generic one (any shape), fast and
// auto the dedicated ones where they take the shape. Two candidates for autotune: the dedicated
// TF32 input gradient, built for LeNet's 5x5 layers, took 54-114 us on MobileNet's 1x1 layers
// (64-256 output channels, H200), where the generic kernel took 25-37 us even in FP32 FFMA.
[[maybe_unused]] IgemmVariant igemm_variant(Algo algo) {
  return algo == Algo::Igemm ? IgemmVariant::Generic : IgemmVariant::Auto;
}

// How FP32 multiplies in the generic forward and input gradient: igemm on FFMA, fast and auto
// as 3xTF32 on the tensor cores (mma.sync, compute capability 8.0 and up), so that autotune
// times both.
[[maybe_unused]] Fp32Math igemm_fp32_math(Algo algo) {
  return algo == Algo::Igemm ? Fp32Math::Ffma : Fp32Math::Tf32x3;
}

// The wgmma kernels (NCHW gather) multiply in TF32 only: FP32 runs FFMA or wgmma-nhwc's 3xTF32,
// BF16 has its own kernels.
[[maybe_unused]] void check_wgmma_precision(const char* op, const Exec& ex) {
  CNN_CHECK(ex.precision == Precision::TF32,
            "{}: algo wgmma runs at precision tf32 only (got {}); expected igemm, fast or auto", op,
            precision_name(ex.precision));
}

// Whether wgmma-nhwc runs at this precision (the others are refused, needing no scratch): TF32,
// BF16 (its own instance), and FP32 as 3xTF32 (its split instance, FP32 accuracy).
bool wgmma_nhwc_precision(Precision p) {
  return p == Precision::FP32 || p == Precision::TF32 || p == Precision::BF16;
}

[[maybe_unused]] WgmmaNhwcOptions wgmma_nhwc_options(const char* op, const Exec& ex) {
  CNN_CHECK(wgmma_nhwc_precision(ex.precision),
            "{}: algo wgmma-nhwc runs at precision fp32, tf32 or bf16 only (got {}); expected "
            "igemm, fast or auto",
            op, precision_name(ex.precision));
  WgmmaNhwcOptions o;
  o.precision = ex.precision;
  return o;
}

// Whether wgmma's input gradient runs as one GEMM on explicit copies and a col2im gather
// (conv2d_dgrad_col2im.h; at every precision wgmma-nhwc takes, FP32 as 3xTF32): planes of at
// most 16x16 output pixels, where the implicit GEMMs leave SMs idle; elsewhere the TF32 kernel.
[[maybe_unused]] bool wgmma_dgrad_on_copies(const Conv2dShape& s, const Exec& ex) {
  return wgmma_nhwc_precision(ex.precision) && conv2d_dgrad_col2im_refusal(s).empty();
}

// The kernel conv2d_backward_weight runs for a wgmma or wgmma-nhwc call on CUDA with a scratch.
enum class WgradRoute {
  // wgmma-nhwc at bf16: the BF16 kernel on channels-last copies of x and dy, where it takes the
  // call (not deterministic: its splits add with atomics).
  ChannelsLast,
  // wgmma-nhwc at tf32: the TF32 halo kernel on the FP32 x and dy themselves
  // (conv2d_wgmma_wgrad_tf32_halo.h: stride 1, OW a multiple of 8 up to 64; not deterministic),
  // weighed by autotune against wgmma's boxes.
  Tf32Halo,
  // One GEMM on explicit copies where they take the shape (few output pixels a plane):
  // wgmma-nhwc's at tf32 and fp32, weighed by autotune against wgmma's boxes, and wgmma's at
  // bf16, weighed against wgmma-nhwc's channels-last kernel.
  Im2colGemm,
  // The TF32 wgmma kernel on NCHW (TMA boxes of x, or a gather), 3xTF32 at fp32: the rest.
  WgmmaKernel,
};

// tf32_halo false: the route where the TF32 halo kernel declined the call.
[[maybe_unused]] WgradRoute wgrad_route(const Conv2dShape& s, Algo algo, const Exec& ex,
                                        bool tf32_halo = true) {
  if (algo == Algo::WgmmaNhwc && conv2d_wgrad_wgmma_nhwc_refusal(s, ex).empty())
    return WgradRoute::ChannelsLast;
  if (tf32_halo && algo == Algo::WgmmaNhwc && process_env_switches().wgmma_wgrad_tf32_halo &&
      conv2d_wgrad_tf32_halo_refusal(s, ex).empty())
    return WgradRoute::Tf32Halo;
  if ((algo == Algo::WgmmaNhwc) == (ex.precision != Precision::BF16) &&
      conv2d_wgrad_im2col_refusal(s).empty())
    return WgradRoute::Im2colGemm;
  return WgradRoute::WgmmaKernel;
}

// The Exec and options WgradRoute::WgmmaKernel calls that kernel with. Under bf16 it runs in
// TF32: TF32 keeps 3 more mantissa bits than BF16, so the pass is never less precise than the
// BF16 kernels', and autotune picks it only where it is also faster than the other candidates.
// Dilated or grouped: the gather (the boxes copy undilated taps of every channel); else the B
// loader wgmma_wgrad_b_for names (CNN_WGMMA_WGRAD_B).
[[maybe_unused]] std::pair<Exec, WgmmaWgradOptions> wgmma_kernel_call(const Conv2dShape& s,
                                                                      Algo algo, const Exec& ex) {
  Exec tf32 = ex;
  if (ex.precision == Precision::BF16) tf32.precision = Precision::TF32;
  WgmmaWgradOptions o;
  o.b = s.extended() ? WgmmaWgradOptions::BLoad::Gather : wgmma_wgrad_b_for(algo);
  return {tf32, o};
}

// conv2d_backward_weight_may_cluster on CUDA: only the TF32 wgmma kernel has clusters.
[[maybe_unused]] bool wgrad_may_cluster_cuda(const Conv2dShape& s, Algo algo, const Exec& ex,
                                             bool db) {
  if (algo != Algo::Wgmma && algo != Algo::WgmmaNhwc) return false;
  if (wgrad_route(s, algo, ex) != WgradRoute::WgmmaKernel) return false;
  const auto [tf32, o] = wgmma_kernel_call(s, algo, ex);
  const WgradCluster c = conv2d_wgrad_wgmma_planned_cluster(s, tf32, db, o);
  return c.x * c.z > 1;
}

// The shape check for `algo`: a dilated or grouped shape only under wgmma-nhwc on CUDA, whose
// kernels read such windows directly.
void check_shape_for(const Conv2dShape& s, Algo algo, const Exec& ex) {
  if (ex.device == Device::CUDA && algo == Algo::WgmmaNhwc)
    check_conv2d_shape_any(s);
  else
    check_conv2d_shape(s);
}

// Whether wgmma-nhwc's TMA im2col expresses the GEMM view g at `precision`'s channel block.
bool im2col_expresses(const Conv2dShape& g, Precision precision) {
  try {
    (void)im2col_geometry(g, "conv2d", nhwc_channel_block(precision, "conv2d"));
  } catch (const Error&) {
    return false;
  }
  return true;
}

// Why algo wgmma-nhwc does not take s's input gradient ("" where it does): the kernel's refusal,
// or a strided one unless CNN_WGMMA_NHWC_PHASES=1.
std::string nhwc_dispatch_input_gradient_refusal(const Conv2dShape& s) {
  std::string why = nhwc_input_gradient_refusal(s);
  if (why.empty() && (s.stride_h != 1 || s.stride_w != 1) &&
      !process_env_switches().wgmma_nhwc_phases)
    why = fmt::format(
        "algo wgmma-nhwc takes strided input gradients under CNN_WGMMA_NHWC_PHASES=1 only (got "
        "stride {}x{}); expected igemm, fast or auto",
        s.stride_h, s.stride_w);
  return why;
}

// An extended shape, valid, under the variant that reads such windows (wgmma-nhwc on CUDA).
bool extended_call(const Conv2dShape& s, Algo algo, const Exec& ex) {
  if (!s.extended() || ex.device != Device::CUDA || algo != Algo::WgmmaNhwc) return false;
  try {
    check_conv2d_shape_any(s);
  } catch (const Error&) {
    return false;
  }
  return true;
}

}  // namespace

bool conv2d_forward_runs_directly(const Conv2dShape& s, Algo algo, const Exec& ex) {
  return extended_call(s, algo, ex) && wgmma_nhwc_precision(ex.precision) &&
         im2col_expresses(s, ex.precision);
}

bool conv2d_backward_data_runs_directly(const Conv2dShape& s, Algo algo, const Exec& ex) {
  if (!extended_call(s, algo, ex) || !wgmma_nhwc_precision(ex.precision) ||
      !nhwc_dispatch_input_gradient_refusal(s).empty())
    return false;
  if (s.stride_h == 1 && s.stride_w == 1)
    return im2col_expresses(backward_data_as_forward(s), ex.precision);
  try {  // a strided one: each of its phases (dilation 1 only)
    (void)nhwc_dgrad_phases(s, "conv2d", nhwc_channel_block(ex.precision, "conv2d"));
  } catch (const Error&) {
    return false;
  }
  return true;
}

bool conv2d_backward_weight_runs_directly(const Conv2dShape& s, Algo algo, const Exec& ex) {
  // The BF16 channels-last kernel where it takes the call, else the wgmma kernel's gather (TF32,
  // 3xTF32 at FP32, and TF32 under BF16 as conv2d_backward_weight runs it): every shape.
  return extended_call(s, algo, ex) && wgmma_nhwc_precision(ex.precision) &&
         CNN_CUDA_VALUE(true, false);
}

std::size_t conv2d_forward_scratch_floats(const Conv2dShape& s, Algo algo, const Exec& ex) {
  check_shape_for(s, algo, ex);
  if (ex.device != Device::CUDA || algo != Algo::WgmmaNhwc || !wgmma_nhwc_precision(ex.precision))
    return 0;
  return conv2d_forward_wgmma_nhwc_scratch_floats(s, ex.precision);
}

std::size_t conv2d_backward_data_scratch_floats(const Conv2dShape& s, Algo algo, const Exec& ex) {
  check_shape_for(s, algo, ex);
  if (ex.device == Device::CUDA && algo == Algo::Wgmma)
    return CNN_CUDA_VALUE(
        wgmma_dgrad_on_copies(s, ex) ? conv2d_dgrad_col2im_scratch_floats(s, ex) : std::size_t(0),
        std::size_t(0));
  if (ex.device != Device::CUDA || algo != Algo::WgmmaNhwc || !wgmma_nhwc_precision(ex.precision))
    return 0;
  if (!nhwc_dispatch_input_gradient_refusal(s).empty()) return 0;  // refused
  return conv2d_backward_data_wgmma_nhwc_scratch_floats(s, ex.precision);
}

void conv2d_forward(const Conv2dShape& s, const float* x, const float* w, const float* b, float* y,
                    bool relu, float* scratch, Algo algo, const Exec& ex) {
  check_shape_for(s, algo, ex);
  CNN_CHECK(x && w && y, "conv2d_forward: x, w and y must not be null");
  if (ex.device == Device::CPU) {
    if (algo == Algo::Naive)
      conv2d_forward_cpu(s, x, w, b, y, relu);
    else
      conv2d_forward_cpu_fast(s, x, w, b, y, relu);
    return;
  }
  CNN_CUDA_BRANCH("conv2d_forward", {
    switch (cuda_path(s, algo)) {
      case ConvPath::Direct:
        conv2d_forward_cuda(s, x, w, b, y, relu, algo, ex.stream);
        break;
      case ConvPath::Igemm:
        conv2d_forward_igemm_cuda(s, x, w, b, y, relu, ex, Bf16Tiles::Auto,
                                  igemm_fp32_math(algo));
        break;
      case ConvPath::OneChannel:
        conv2d_forward_1ch_cuda(s, x, w, b, y, relu, ex);
        break;
      case ConvPath::Wgmma:
        check_wgmma_precision("conv2d_forward", ex);
        conv2d_forward_wgmma(s, x, w, b, y, relu, ex.stream);
        break;
      case ConvPath::WgmmaNhwc:
        conv2d_forward_wgmma_nhwc(s, x, w, b, y, relu, scratch, ex.stream,
                                  wgmma_nhwc_options("conv2d_forward", ex));
        break;
    }
  });
}

void conv2d_backward_data(const Conv2dShape& s, const float* dy, const float* w, float* dx,
                          float* scratch, Algo algo, const Exec& ex) {
  check_shape_for(s, algo, ex);
  CNN_CHECK(dy && w && dx, "conv2d_backward_data: dy, w and dx must not be null");
  if (ex.device == Device::CPU) {
    if (algo == Algo::Naive)
      conv2d_backward_data_cpu(s, dy, w, dx);
    else
      conv2d_backward_data_cpu_fast(s, dy, w, dx);
    return;
  }
  CNN_CUDA_BRANCH("conv2d_backward_data", {
    switch (cuda_path(s, algo)) {
      case ConvPath::Direct:
        conv2d_backward_data_cuda(s, dy, w, dx, algo, ex.stream);
        break;
      case ConvPath::Wgmma:
        if (scratch && wgmma_dgrad_on_copies(s, ex)) {
          conv2d_backward_data_col2im(s, dy, w, dx, scratch, ex);
          break;
        }
        check_wgmma_precision("conv2d_backward_data", ex);
        conv2d_backward_data_wgmma(s, dy, w, dx, ex.stream);
        break;
      case ConvPath::WgmmaNhwc: {
        const std::string why = nhwc_dispatch_input_gradient_refusal(s);
        CNN_CHECK(why.empty(), "conv2d_backward_data: {}", why);
        conv2d_backward_data_wgmma_nhwc(s, dy, w, dx, scratch, ex.stream,
                                        wgmma_nhwc_options("conv2d_backward_data", ex));
        break;
      }
      default:  // igemm: the generic kernel; fast / auto: the dedicated one where it applies
        conv2d_backward_data_igemm_cuda(s, dy, w, dx, ex, igemm_variant(algo), Bf16Tiles::Auto,
                                        DgradStrided::Auto, igemm_fp32_math(algo));
        break;
    }
  });
}

std::size_t conv2d_backward_weight_scratch_floats(const Conv2dShape& s, const Exec& ex) {
  if (s.extended()) {  // the wgmma kernels that read such windows (see ..._runs_directly)
    check_conv2d_shape_any(s);
    if (ex.device != Device::CUDA) return 0;
    Exec tf32 = ex;
    if (ex.precision == Precision::BF16) tf32.precision = Precision::TF32;
    return CNN_CUDA_VALUE(
        std::max(ex.precision == Precision::BF16 ? conv2d_wgrad_wgmma_nhwc_scratch_floats(s)
                                                 : std::size_t(0),
                 conv2d_wgrad_wgmma_scratch_floats(s, tf32, WgmmaWgradOptions::BLoad::Gather)),
        std::size_t(0));
  }
  check_conv2d_shape(s);
  if (ex.device == Device::CPU) return 0;
  // The largest of the variants, so that a layer can switch variant without reallocating.
  return CNN_CUDA_VALUE(
      std::max({conv2d_backward_weight_scratch_floats_cuda(s, ex.deterministic),
                conv2d_backward_weight_igemm_scratch_floats(s, ex),
                conv2d_wgrad_wgmma_scratch_floats(s, ex), conv2d_wgrad_im2col_scratch_floats(s, ex),
                ex.precision == Precision::BF16 ? conv2d_wgrad_wgmma_nhwc_scratch_floats(s)
                                                : std::size_t(0),
                conv2d_1ch_applicable(s) ? conv2d_backward_weight_1ch_scratch_floats(s, ex)
                                         : std::size_t(0)}),
      std::size_t(0));
}

bool conv2d_backward_shared(const Conv2dShape& s, const float* x, const float* dy, const float* w,
                            float* dw, float* db, float* dx, float* scratch, Algo dw_algo,
                            Algo dx_algo, const Exec& ex) {
  check_shape_for(s, dw_algo == dx_algo ? dx_algo : Algo::Auto, ex);
  if (ex.device != Device::CUDA || dw_algo != Algo::WgmmaNhwc || dx_algo != Algo::WgmmaNhwc || !x ||
      !dy || !w || !dw || !dx || !scratch || !process_env_switches().conv_shared_dy ||
      !nhwc_dispatch_input_gradient_refusal(s).empty())
    return false;
  bool ran = false;
  CNN_CUDA_BRANCH("conv2d_backward", {
    ran = conv2d_backward_wgmma_nhwc_shared_dy(s, x, dy, w, dw, db, dx, scratch, ex);
  });
  return ran;
}

bool conv2d_backward_weight_may_cluster(const Conv2dShape& s, Algo algo, const Exec& ex, bool db) {
  check_shape_for(s, algo, ex);
  if (ex.device != Device::CUDA) return false;
  return CNN_CUDA_VALUE(wgrad_may_cluster_cuda(s, algo, ex, db), false);
}

void conv2d_backward_weight(const Conv2dShape& s, const float* x, const float* dy, float* dw,
                            float* db, float* scratch, Algo algo, const Exec& ex) {
  check_shape_for(s, algo, ex);
  CNN_CHECK(x && dy && dw, "conv2d_backward_weight: x, dy and dw must not be null");
  if (ex.device == Device::CPU) {
    if (algo == Algo::Naive)
      conv2d_backward_weight_cpu(s, x, dy, dw, db);
    else
      conv2d_backward_weight_cpu_fast(s, x, dy, dw, db);
    return;
  }
  CNN_CUDA_BRANCH("conv2d_backward_weight", {
    const std::size_t need = conv2d_backward_weight_scratch_floats(s, ex);
    // Deterministic mode cannot run without its slabs. Atomic mode can: the wgmma weight
    // gradient's default loader then gathers instead of boxing copies of x (which need scratch).
    CNN_CHECK(scratch || need == 0 || !ex.deterministic,
              "conv2d_backward_weight: deterministic mode needs a scratch buffer of {} floats "
              "(conv2d_backward_weight_scratch_floats), got null",
              need);
    switch (cuda_path(s, algo)) {
      case ConvPath::Direct:
        conv2d_backward_weight_cuda(s, x, dy, dw, db, scratch, algo, ex.deterministic, ex.stream);
        break;
      case ConvPath::Igemm:
        conv2d_backward_weight_igemm_cuda(s, x, dy, dw, db, scratch, ex, igemm_variant(algo));
        break;
      case ConvPath::OneChannel:
        conv2d_backward_weight_1ch_cuda(s, x, dy, dw, db, scratch, ex);
        break;
      case ConvPath::Wgmma:
      case ConvPath::WgmmaNhwc: {
        WgradRoute route = scratch ? wgrad_route(s, algo, ex) : WgradRoute::WgmmaKernel;
        // The TF32 halo kernel declines x or dy off 16 bytes (the TMA's rule): then the route
        // below it.
        if (route == WgradRoute::Tf32Halo) {
          if (conv2d_backward_weight_tf32_halo(s, x, dy, dw, db, ex)) break;
          route = wgrad_route(s, algo, ex, false);
        }
        switch (route) {
          case WgradRoute::ChannelsLast:
            conv2d_backward_weight_wgmma_nhwc(s, x, dy, dw, db, scratch, ex);
            break;
          case WgradRoute::Tf32Halo:  // handled above
          case WgradRoute::Im2colGemm:
            conv2d_backward_weight_im2col(s, x, dy, dw, db, scratch, ex);
            break;
          case WgradRoute::WgmmaKernel: {
            const auto [tf32, o] = wgmma_kernel_call(s, algo, ex);
            conv2d_backward_weight_wgmma(s, x, dy, dw, db, scratch, tf32, o);  // throws its reason
            break;
          }
        }
        break;
      }
    }
  });
}

}  // namespace cnn
