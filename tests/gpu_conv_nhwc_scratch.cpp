// The TMA-im2col convolution (algo wgmma-nhwc) allocates nothing: its channels-last copies live in
// the caller's scratch, which the Network allocates once, before the trainer captures its step.
// Skipped unless the device is compute capability 9.0 and the build has the sm_90a kernels:
//   NullScratchRefused          a null scratch is a one-line cnn::Error naming the floats needed
//                               (conv2d_*_scratch_floats), from the direct call and the dispatch.
//   CapturedCallsAllocateNothing
//                               conv2d_forward and conv2d_backward_data with Algo::WgmmaNhwc at
//                               TF32 and BF16, captured on a stream: the graph has kernel nodes
//                               and no memory-allocation or -free node; its replay gives the bits
//                               of the eager call.
//   CapturedTrainingStepAllocatesNothing
//                               a Network whose convolutions run wgmma-nhwc (TF32, deterministic:
//                               the weight gradient's partial sums and the input gradient's copy
//                               share the one scratch) captured around forward_backward: no
//                               allocation node; the replay's gradients are the eager step's bits
//                               and match the CPU network's to TF32 accuracy.
//   AutotunedStepAllocatesNothing
//                               algo auto: autotune() (which times wgmma-nhwc on the grown
//                               scratch, then fits the scratch to the picks), then the captured
//                               step: no allocation node, finite gradients.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "kernels/conv/conv2d.h"
#include "layers/layer_spec.h"
#include "layers/network.h"
#include "runtime/error.h"
#include "runtime/exec.h"
#include "runtime/memory.h"
#include "runtime/tensor.h"
#include "tests/conv_test_check.h"
#include "tests/test_util.h"
#include "tests/wgmma_test_require.h"
#ifdef CNN_HAVE_CUDA
#include <cuda_runtime.h>

#include "kernels/conv/conv2d_wgmma_nhwc.h"
#endif

using namespace cnn;

namespace {

#ifdef CNN_HAVE_CUDA

Conv2dShape conv(int n, int c, int h, int w, int oc, int k, int pad) {
  Conv2dShape s;
  s.n = n, s.c = c, s.h = h, s.w = w, s.oc = oc, s.kh = s.kw = k, s.pad_h = s.pad_w = pad;
  return s;
}

// A created stream (the legacy default stream cannot be captured), synchronizing with the legacy
// stream like the trainer's, so that the tests' plain copies see its work.
struct Stream {
  cudaStream_t s = nullptr;
  Stream() { EXPECT_EQ(cudaStreamCreate(&s), cudaSuccess); }
  ~Stream() { cudaStreamDestroy(s); }
};

// One captured graph, instantiated.
struct Captured {
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  ~Captured() {
    if (exec) cudaGraphExecDestroy(exec);
    if (graph) cudaGraphDestroy(graph);
  }
};

// Captures body's launches on `stream` as the trainer's StepGraph does (thread-local mode).
void capture(cudaStream_t stream, const std::function<void()>& body, Captured* g) {
  ASSERT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), cudaSuccess);
  std::string failure;
  try {
    body();
  } catch (const std::exception& e) {
    failure = e.what();
  }
  const cudaError_t end = cudaStreamEndCapture(stream, &g->graph);
  ASSERT_TRUE(failure.empty()) << "the captured body threw: " << failure;
  ASSERT_EQ(end, cudaSuccess) << cudaGetErrorString(end);
  ASSERT_EQ(cudaGraphInstantiate(&g->exec, g->graph, 0), cudaSuccess);
}

struct NodeCounts {
  int kernels = 0, allocs = 0, frees = 0;
};

NodeCounts count_nodes(cudaGraph_t graph) {
  NodeCounts c;
  size_t n = 0;
  EXPECT_EQ(cudaGraphGetNodes(graph, nullptr, &n), cudaSuccess);
  std::vector<cudaGraphNode_t> nodes(n);
  if (n > 0) {
    EXPECT_EQ(cudaGraphGetNodes(graph, nodes.data(), &n), cudaSuccess);
  }
  for (cudaGraphNode_t node : nodes) {
    cudaGraphNodeType t{};
    EXPECT_EQ(cudaGraphNodeGetType(node, &t), cudaSuccess);
    c.kernels += t == cudaGraphNodeTypeKernel;
    c.allocs += t == cudaGraphNodeTypeMemAlloc;
    c.frees += t == cudaGraphNodeTypeMemFree;
  }
  return c;
}

using conv_test::bitwise_equal;

Exec cuda_exec(Precision p, cudaStream_t stream = nullptr) {
  Exec ex;
  ex.device = Device::CUDA;
  ex.precision = p;
  ex.stream = stream;
  return ex;
}

// conv -> relu -> pool -> conv -> relu -> pool -> flatten -> fc -> relu -> fc -> loss on
// (3, 12, 12) images; the pool is not fused into the first conv (that pass has no wgmma-nhwc).
std::vector<LayerSpec> small_net() {
  ConvNetSizes sizes;
  sizes.conv1 = 24, sizes.kernel1 = 3, sizes.pad1 = 1;
  sizes.conv2 = 40, sizes.kernel2 = 3, sizes.pad2 = 1;
  sizes.fc1 = 32, sizes.classes = 10;
  return conv_net_specs(sizes);
}
const Shape kImage = {3, 12, 12};
constexpr int kBatch = 6;

NetworkOptions net_options(Algo conv_algo) {
  NetworkOptions no;
  no.max_batch = kBatch;
  no.seed = 7;
  no.fuse_pool = PoolFusion::Off;
  no.autotune = true;
  no.conv_algo = conv_algo;
  return no;
}

struct Batch {
  std::vector<float> h_x;
  Buffer<float> x;
  Buffer<int32_t> labels;
};

Batch make_batch(Device dev) {
  Batch b;
  b.h_x = test::random_vector(size_t(kBatch) * 3 * 12 * 12, 11);
  std::vector<int32_t> h_labels(kBatch);
  for (int i = 0; i < kBatch; ++i) h_labels[size_t(i)] = (i * 7) % 10;
  b.x = Buffer<float>(b.h_x.size(), dev);
  b.x.copy_from(b.h_x.data(), Device::CPU, b.h_x.size());
  b.labels = Buffer<int32_t>(h_labels.size(), dev);
  b.labels.copy_from(h_labels.data(), Device::CPU, h_labels.size());
  return b;
}

// One training step's gradients, zeroed first (forward_backward accumulates), all on ex.stream.
void step(Network& net, const Batch& b, cudaStream_t stream) {
  EXPECT_EQ(cudaMemsetAsync(net.grads(), 0, size_t(net.num_params()) * sizeof(float), stream),
            cudaSuccess);
  net.forward_backward(kBatch, b.x.data(), b.labels.data(), 1.f / kBatch);
}

#endif  // CNN_HAVE_CUDA

}  // namespace

TEST(GpuConvNhwcScratch, NullScratchRefused) {
#ifdef CNN_HAVE_CUDA
  CNN_REQUIRE_WGMMA_NHWC();
  const Conv2dShape s = conv(2, 8, 9, 9, 16, 3, 1);
  Tensor d_x = test::to_device(test::random_vector(size_t(2) * 8 * 81, 1));
  Tensor d_w = test::to_device(test::random_vector(size_t(16) * 8 * 9, 2));
  Tensor d_y = test::to_device(std::vector<float>(size_t(2) * 16 * 81, 0.f));
  const Exec ex = cuda_exec(Precision::TF32);
  const size_t fwd = conv2d_forward_scratch_floats(s, Algo::WgmmaNhwc, ex);
  const size_t dx = conv2d_backward_data_scratch_floats(s, Algo::WgmmaNhwc, ex);
  ASSERT_GT(fwd, 0u);
  ASSERT_GT(dx, 0u);
  auto expect_refused = [](const std::function<void()>& f, size_t floats, const char* what) {
    try {
      f();
      ADD_FAILURE() << what << ": a null scratch was accepted";
    } catch (const Error& e) {
      const std::string msg = e.what();
      std::printf("%s: %s\n", what, msg.c_str());
      EXPECT_NE(msg.find("needs a scratch of " + std::to_string(floats) + " floats"),
                std::string::npos)
          << what << ": " << msg;
      EXPECT_EQ(msg.find('\n'), std::string::npos) << what << ": one line expected: " << msg;
    }
  };
  expect_refused(
      [&] {
        conv2d_forward(s, d_x.data(), d_w.data(), nullptr, d_y.data(), false, nullptr,
                       Algo::WgmmaNhwc, ex);
      },
      fwd, "forward");
  expect_refused(
      [&] {
        conv2d_backward_data(s, d_y.data(), d_w.data(), d_x.data(), nullptr, Algo::WgmmaNhwc, ex);
      },
      dx, "input gradient");
  expect_refused(
      [&] {
        conv2d_forward_wgmma_nhwc(s, d_x.data(), d_w.data(), nullptr, d_y.data(), false, nullptr,
                                  nullptr);
      },
      fwd, "direct forward");
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);  // nothing was launched half-way
#else
  GTEST_SKIP() << "built without CUDA";
#endif
}

TEST(GpuConvNhwcScratch, CapturedCallsAllocateNothing) {
#ifdef CNN_HAVE_CUDA
  CNN_REQUIRE_WGMMA_NHWC();
  Stream stream;
  const Conv2dShape s = conv(3, 17, 13, 11, 24, 3, 1);
  const size_t nx = size_t(s.n) * s.c * s.h * s.w, ny = size_t(s.n) * s.oc * s.oh() * s.ow();
  Tensor d_x = test::to_device(test::random_vector(nx, test::fresh_seed()));
  Tensor d_w = test::to_device(test::random_vector(size_t(s.oc) * s.c * 9, test::fresh_seed()));
  Tensor d_b = test::to_device(test::random_vector(size_t(s.oc), test::fresh_seed()));
  Tensor d_dy = test::to_device(test::random_vector(ny, test::fresh_seed()));
  Tensor d_y = test::to_device(std::vector<float>(ny, NAN));
  Tensor d_dx = test::to_device(std::vector<float>(nx, NAN));
  for (Precision p : {Precision::TF32, Precision::BF16}) {
    SCOPED_TRACE(precision_name(p));
    const Exec ex = cuda_exec(p, stream.s);
    const size_t floats = std::max(conv2d_forward_scratch_floats(s, Algo::WgmmaNhwc, ex),
                                   conv2d_backward_data_scratch_floats(s, Algo::WgmmaNhwc, ex));
    Buffer<float> scratch(floats, Device::CUDA);
    auto passes = [&] {
      conv2d_forward(s, d_x.data(), d_w.data(), d_b.data(), d_y.data(), true, scratch.data(),
                     Algo::WgmmaNhwc, ex);
      conv2d_backward_data(s, d_dy.data(), d_w.data(), d_dx.data(), scratch.data(), Algo::WgmmaNhwc,
                           ex);
    };
    passes();  // eagerly first, as the trainer warms up before it captures
    stream_sync(Device::CUDA, stream.s);
    const std::vector<float> y = d_y.to_vector(), dx = d_dx.to_vector();
    test::poison_device(d_y.data(), ny);
    test::poison_device(d_dx.data(), nx);

    Captured g;
    capture(stream.s, passes, &g);
    if (HasFatalFailure()) return;
    const NodeCounts c = count_nodes(g.graph);
    std::printf("%s: %d kernel nodes, %d alloc, %d free\n", precision_name(p), c.kernels, c.allocs,
                c.frees);
    EXPECT_GE(c.kernels, 4) << "two passes of the pre-pass (pack and copy, one launch) and the "
                               "convolution each";
    EXPECT_EQ(c.allocs, 0) << "the captured convolution allocates";
    EXPECT_EQ(c.frees, 0) << "the captured convolution frees";
    ASSERT_EQ(cudaGraphLaunch(g.exec, stream.s), cudaSuccess);
    stream_sync(Device::CUDA, stream.s);
    EXPECT_TRUE(bitwise_equal(d_y.to_vector(), y)) << "the replayed forward";
    EXPECT_TRUE(bitwise_equal(d_dx.to_vector(), dx)) << "the replayed input gradient";
  }
#else
  GTEST_SKIP() << "built without CUDA";
#endif
}

TEST(GpuConvNhwcScratch, CapturedTrainingStepAllocatesNothing) {
#ifdef CNN_HAVE_CUDA
  CNN_REQUIRE_WGMMA_NHWC();
  Stream stream;
  Exec ex = cuda_exec(Precision::TF32, stream.s);
  ex.deterministic = true;  // the weight gradient's partial sums go through the shared scratch
  Network net(small_net(), kImage, net_options(Algo::WgmmaNhwc), ex);
  const Batch b = make_batch(Device::CUDA);
  step(net, b, stream.s);  // eager: the warm-up step
  stream_sync(Device::CUDA, stream.s);
  const std::vector<float> eager = net.grads_to_host();

  Captured g;
  capture(
      stream.s, [&] { step(net, b, stream.s); }, &g);
  if (HasFatalFailure()) return;
  const NodeCounts c = count_nodes(g.graph);
  std::printf("training step: %d kernel nodes, %d alloc, %d free\n", c.kernels, c.allocs, c.frees);
  EXPECT_GT(c.kernels, 10);
  EXPECT_EQ(c.allocs, 0) << "the captured training step allocates";
  EXPECT_EQ(c.frees, 0) << "the captured training step frees";
  ASSERT_EQ(cudaGraphLaunch(g.exec, stream.s), cudaSuccess);
  stream_sync(Device::CUDA, stream.s);
  const std::vector<float> replayed = net.grads_to_host();
  EXPECT_TRUE(bitwise_equal(replayed, eager)) << "the replayed step's gradients";

  // The same network on the CPU (same seed: same weights): the passes that share the scratch
  // computed the right gradients, to TF32 accuracy.
  Network cpu(small_net(), kImage, net_options(Algo::Auto), Exec{});
  const Batch hb = make_batch(Device::CPU);
  cpu.forward_backward(kBatch, hb.x.data(), hb.labels.data(), 1.f / kBatch);
  const std::vector<float> ref = cpu.grads_to_host();
  ASSERT_EQ(ref.size(), replayed.size());
  double diff2 = 0, ref2 = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    diff2 += (double(replayed[i]) - ref[i]) * (double(replayed[i]) - ref[i]);
    ref2 += double(ref[i]) * ref[i];
  }
  std::printf("gradients vs the CPU network: relative error %.3g\n", std::sqrt(diff2 / ref2));
  EXPECT_LT(std::sqrt(diff2 / ref2), 1e-2);
#else
  GTEST_SKIP() << "built without CUDA";
#endif
}

TEST(GpuConvNhwcScratch, AutotunedStepAllocatesNothing) {
#ifdef CNN_HAVE_CUDA
  CNN_REQUIRE_WGMMA_NHWC();
  Stream stream;
  const Exec ex = cuda_exec(Precision::TF32, stream.s);
  Network net(small_net(), kImage, net_options(Algo::Auto), ex);
  const std::vector<std::string> picks = net.autotune();
  for (const std::string& line : picks) std::printf("%s\n", line.c_str());
  EXPECT_FALSE(picks.empty()) << "algo auto on CUDA tunes";
  const Batch b = make_batch(Device::CUDA);
  step(net, b, stream.s);
  stream_sync(Device::CUDA, stream.s);

  Captured g;
  capture(
      stream.s, [&] { step(net, b, stream.s); }, &g);
  if (HasFatalFailure()) return;
  const NodeCounts c = count_nodes(g.graph);
  std::printf("autotuned step: %d kernel nodes, %d alloc, %d free\n", c.kernels, c.allocs, c.frees);
  EXPECT_EQ(c.allocs, 0) << "the captured training step allocates";
  EXPECT_EQ(c.frees, 0) << "the captured training step frees";
  ASSERT_EQ(cudaGraphLaunch(g.exec, stream.s), cudaSuccess);
  stream_sync(Device::CUDA, stream.s);
  for (float v : net.grads_to_host()) ASSERT_TRUE(std::isfinite(v));
#else
  GTEST_SKIP() << "built without CUDA";
#endif
}
