#include "runtime/side_stream.h"

#include "runtime/error.h"

#ifdef CNN_HAVE_CUDA
#include "runtime/cuda_check.h"
#endif

namespace cnn {

#ifdef CNN_HAVE_CUDA
namespace {

cudaEvent_t event(void* e) {
  return static_cast<cudaEvent_t>(e);
}

void* new_event() {
  cudaEvent_t e = nullptr;
  CNN_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  return e;
}

}  // namespace
#endif

SideStream::SideStream(Device dev) {
  if (dev != Device::CUDA) return;
#ifdef CNN_HAVE_CUDA
  int least = 0, greatest = 0;
  CNN_CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&least, &greatest));
  // Non-blocking: the side stream must not wait for the legacy stream's copies.
  CNN_CUDA_CHECK(cudaStreamCreateWithPriority(&stream_, cudaStreamNonBlocking, least));
  fork_ = new_event();
  join_ = new_event();
#else
  CNN_FAIL("a CUDA side stream was requested but this build has no CUDA");
#endif
}

SideStream::~SideStream() {
#ifdef CNN_HAVE_CUDA
  if (stream_ && cudaStreamSynchronize(stream_) != cudaSuccess) (void)cudaGetLastError();
  if (fork_) cudaEventDestroy(event(fork_));
  if (join_) cudaEventDestroy(event(join_));
  if (stream_) cudaStreamDestroy(stream_);
#endif
}

void SideStream::fork_from(cudaStream_t main) {
#ifdef CNN_HAVE_CUDA
  if (!stream_) return;
  CNN_CUDA_CHECK(cudaEventRecord(event(fork_), main));
  CNN_CUDA_CHECK(cudaStreamWaitEvent(stream_, event(fork_), 0));
  forked_ = true;
#else
  (void)main;
#endif
}

void SideStream::join_into(cudaStream_t main) {
#ifdef CNN_HAVE_CUDA
  if (!stream_ || !forked_) return;
  CNN_CUDA_CHECK(cudaEventRecord(event(join_), stream_));
  CNN_CUDA_CHECK(cudaStreamWaitEvent(main, event(join_), 0));
  forked_ = false;
#else
  (void)main;
#endif
}

void SideStream::sync() {
#ifdef CNN_HAVE_CUDA
  if (stream_) CNN_CUDA_CHECK(cudaStreamSynchronize(stream_));
#endif
}

int greatest_stream_priority() {
#ifdef CNN_HAVE_CUDA
  int least = 0, greatest = 0;
  CNN_CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&least, &greatest));
  return greatest;
#else
  return 0;
#endif
}

}  // namespace cnn
