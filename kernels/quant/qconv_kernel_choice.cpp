#include "kernels/quant/qconv_kernel_choice.h"

#include "kernels/quant/qconv_few_channels.h"

namespace cnn {

const char* qconv_kernel_name(QConvKernel k) {
  switch (k) {
    case QConvKernel::Direct:
      return "direct dp4a";
    case QConvKernel::TensorCore:
      return "tensor cores";
    case QConvKernel::FewChannels:
      return "few-channel dp4a";
  }
  return "?";
}

QConvKernel qconv_pick_kernel(const QConvShape& s, bool specialized) {
  if (!specialized) return QConvKernel::Direct;
  if (qconv_few_channels_supported(s)) return QConvKernel::FewChannels;
  if (qconv_igemm_supported(s)) return QConvKernel::TensorCore;
  return QConvKernel::Direct;
}

}  // namespace cnn
