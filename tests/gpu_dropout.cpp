// Dropout on the GPU: the same bits as the CPU reference (the mask is a hash of seed, step and
// index on both), in place, and inside a captured CUDA graph the step is read from device memory
// at every replay, so each replay draws that step's mask.
#include <gtest/gtest.h>

#include <vector>

#include "app/train/step_graph.h"
#include "kernels/pointwise/dropout.h"
#include "runtime/memory.h"
#include "tests/test_util.h"

using namespace cnn;

TEST(GpuDropout, BitwiseEqualToCpu) {
  CNN_REQUIRE_GPU();
  for (int64_t count : {int64_t(1), int64_t(3), int64_t(1031), int64_t(4000037)})
    for (float p : {0.1f, 0.5f}) {
      const uint64_t seed = test::fresh_seed();
      SCOPED_TRACE("seed " + std::to_string(seed) + " count " + std::to_string(count));
      const std::vector<float> x = test::random_vector(size_t(count), seed);
      const int64_t step = 12345;
      DropoutArgs a;
      a.p = p;
      a.seed = seed;
      a.step = &step;
      std::vector<float> ref(x.size()), dref(x.size());
      dropout_forward_cpu(count, x.data(), ref.data(), a);
      dropout_backward_cpu(count, x.data(), dref.data(), a);
      Exec ex;
      ex.device = Device::CUDA;
      Buffer<int64_t> d_step(1, Device::CUDA);
      d_step.copy_from(&step, Device::CPU, 1);
      a.step = d_step.data();
      Tensor d_x = test::to_device(x);
      Buffer<float> d_y(x.size(), Device::CUDA);
      test::poison_device(d_y.data(), x.size());
      dropout_forward(count, d_x.data(), d_y.data(), a, ex);
      EXPECT_EQ(test::to_host(d_y.data(), x.size()), ref);
      dropout_backward(count, d_x.data(), d_x.data(), a, ex);  // in place
      EXPECT_EQ(test::to_host(d_x.data(), x.size()), dref);
    }
}

TEST(GpuDropout, CapturedGraphReadsTheStepAtEveryReplay) {
  CNN_REQUIRE_GPU();
  const int64_t count = 10007;
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  const std::vector<float> x = test::random_vector(size_t(count), seed);
  TrainStream stream(Device::CUDA);
  Exec ex;
  ex.device = Device::CUDA;
  ex.stream = stream.get();
  Buffer<int64_t> d_step(1, Device::CUDA);
  Tensor d_x = test::to_device(x);
  Buffer<float> d_y(x.size(), Device::CUDA);
  DropoutArgs a;
  a.p = 0.3f;
  a.seed = seed;
  a.step = d_step.data();
  StepGraph graph(ex, true);
  std::vector<float> previous;
  for (int64_t step = 1; step <= 4; ++step) {  // eager warm-up, capture, then replays
    d_step.copy_from(&step, Device::CPU, 1);
    graph.run([&] { dropout_forward(count, d_x.data(), d_y.data(), a, ex); }, true);
    stream_sync(Device::CUDA, ex.stream);
    DropoutArgs host = a;
    host.step = &step;
    std::vector<float> ref(x.size());
    dropout_forward_cpu(count, x.data(), ref.data(), host);
    const std::vector<float> got = test::to_host(d_y.data(), x.size());
    EXPECT_EQ(got, ref) << "step " << step << (graph.replaying() ? " (replay)" : " (eager)");
    EXPECT_NE(got, previous);
    previous = got;
  }
  EXPECT_TRUE(graph.replaying());
}
