// Label-smoothed softmax cross-entropy on the GPU against the CPU reference: batch 1, 2 and 1000
// classes, confident rows; NaN-poisoned outputs.
#include <gtest/gtest.h>

#include <vector>

#include "kernels/loss/softmax_xent.h"
#include "runtime/memory.h"
#include "tests/test_util.h"

using namespace cnn;

TEST(GpuLabelSmoothing, MatchesCpu) {
  CNN_REQUIRE_GPU();
  for (const auto& [n, k] : std::vector<std::pair<int, int>>{{1, 2}, {37, 10}, {5, 1000}, {300, 3}})
    for (float eps : {0.1f, 0.6f})
      for (float spread : {2.f, 30.f}) {  // 30: confident rows, p of the max ~ 1
        const uint64_t seed = test::fresh_seed();
        SCOPED_TRACE(::testing::Message() << "seed " << seed << " n " << n << " classes " << k
                                          << " eps " << eps << " spread " << spread);
        const std::vector<float> logits = test::random_vector(size_t(n) * k, seed, -spread, spread);
        const std::vector<int32_t> labels = test::random_labels(size_t(n), k, seed + 1);
        std::vector<float> loss_ref(static_cast<size_t>(n)), d_ref(size_t(n) * k);
        std::vector<int32_t> pred_ref(static_cast<size_t>(n));
        softmax_xent_cpu({n, k}, logits.data(), labels.data(), loss_ref.data(), pred_ref.data(),
                         d_ref.data(), 1.f / float(n), eps);
        Exec ex;
        ex.device = Device::CUDA;
        Tensor d_logits = test::to_device(logits);
        Buffer<int32_t> d_labels(labels.size(), Device::CUDA);
        d_labels.copy_from(labels.data(), Device::CPU, labels.size());
        Buffer<float> d_loss(size_t(n), Device::CUDA), d_d(size_t(n) * k, Device::CUDA);
        Buffer<int32_t> d_pred(size_t(n), Device::CUDA);
        test::poison_device(d_loss.data(), size_t(n));
        test::poison_device(d_d.data(), size_t(n) * k);
        softmax_xent({n, k}, d_logits.data(), d_labels.data(), d_loss.data(), d_pred.data(),
                     d_d.data(), 1.f / float(n), ex, eps);
        EXPECT_LT(test::max_rel_error(test::to_host(d_loss.data(), size_t(n)), loss_ref), 1e-4);
        EXPECT_LT(test::max_rel_error(test::to_host(d_d.data(), size_t(n) * k), d_ref, 1e-4), 1e-4);
      }
}
