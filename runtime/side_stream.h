#pragma once
// A second stream that work forks onto from a main stream and joins back from, through events,
// for work that may run beside what the main stream enqueues next (the optimizer's early updates
// beside the rest of backward). Inside a CUDA graph capture the fork and the join become the
// graph's edges. It has the device's lowest stream priority, the main streams of the programs the
// greatest (greatest_stream_priority), so that the block scheduler hands SMs to the main stream's
// kernels first and the side stream's fill what they leave. On the CPU every call is a no-op:
// the work runs in program order.
#include "runtime/exec.h"
#include "runtime/stream.h"

namespace cnn {

class SideStream {
 public:
  explicit SideStream(Device dev);
  ~SideStream();
  SideStream(const SideStream&) = delete;
  SideStream& operator=(const SideStream&) = delete;

  cudaStream_t get() const { return stream_; }
  // The side stream waits for everything enqueued on `main` so far.
  void fork_from(cudaStream_t main);
  // `main` waits for everything enqueued on the side stream so far, if anything was forked onto
  // it since the last join (a capture must not wait on a stream it has not forked).
  void join_into(cudaStream_t main);
  // The host waits for the side stream's work.
  void sync();

 private:
  cudaStream_t stream_ = nullptr;
  void* fork_ = nullptr;  // cudaEvent_t
  void* join_ = nullptr;
  bool forked_ = false;
};

// The current device's greatest (most urgent) stream priority; 0 without CUDA.
int greatest_stream_priority();

}  // namespace cnn
