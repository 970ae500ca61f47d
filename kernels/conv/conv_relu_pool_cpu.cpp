// CPU twins of the fused conv -> ReLU -> 2x2 max-pool: the unfused chain of CPU references
// through a full-size temporary (obviously the semantics the CUDA kernels must reproduce).
#include <vector>

#include "kernels/conv/conv_relu_pool.h"

namespace cnn {

void conv_relu_pool_forward_cpu(const Conv2dShape& s, const float* x, const float* w,
                                const float* b, float* y, int32_t* argmax) {
  std::vector<float> conv(size_t(s.n) * s.oc * s.oh() * s.ow());  // (N, OC, OH, OW)
  conv2d_forward_cpu(s, x, w, b, conv.data(), true);
  maxpool_forward_cpu(conv_relu_pool_pool_shape(s), conv.data(), y, argmax);
}

void conv_relu_pool_backward_weight_cpu(const Conv2dShape& s, const float* x, const float* y,
                                        const float* dy, const int32_t* argmax, float* dw,
                                        float* db) {
  std::vector<float> dconv(size_t(s.n) * s.oc * s.oh() * s.ow());  // (N, OC, OH, OW)
  maxpool_backward_cpu(conv_relu_pool_pool_shape(s), dy, argmax, dconv.data(), y);
  conv2d_backward_weight_cpu(s, x, dconv.data(), dw, db);
}

}  // namespace cnn
