#include "runtime/exec.h"

#include <cstdlib>

#include "runtime/error.h"

namespace cnn {

const char* algo_name(Algo a) {
  switch (a) {
    case Algo::Auto:
      return "auto";
    case Algo::Naive:
      return "naive";
    case Algo::Tiled:
      return "tiled";
    case Algo::Igemm:
      return "igemm";
    case Algo::Fast:
      return "fast";
    case Algo::Wgmma:
      return "wgmma";
    case Algo::WgmmaNhwc:
      return "wgmma-nhwc";
  }
  return "?";
}

Algo parse_algo(const std::string& s) {
  for (Algo a : {Algo::Auto, Algo::Naive, Algo::Tiled, Algo::Igemm, Algo::Fast, Algo::Wgmma,
                 Algo::WgmmaNhwc})
    if (s == algo_name(a)) return a;
  CNN_FAIL("algorithm '{}' is not one of auto, naive, tiled, igemm, fast, wgmma, wgmma-nhwc", s);
}

const char* precision_name(Precision p) {
  switch (p) {
    case Precision::FP32:
      return "fp32";
    case Precision::TF32:
      return "tf32";
    case Precision::BF16:
      return "bf16";
  }
  return "?";
}

Precision parse_precision(const std::string& s) {
  if (s == "fp32") return Precision::FP32;
  if (s == "tf32") return Precision::TF32;
  if (s == "bf16") return Precision::BF16;
  CNN_FAIL("precision '{}' is not one of fp32, tf32, bf16", s);
}

}  // namespace cnn
