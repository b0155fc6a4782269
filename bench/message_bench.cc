// The CPU cost of one actor message between processes, without UCX and
// without threads: what the sending side does to a message (encode its
// values, build the frame's envelope, CRC32C over envelope and tensor) and
// what the receiving side does (copy the frame out of the transport's
// buffer into one of the node's receive buffers, as the node does, check and decode the frame, rebuild the
// caf::message), for `troupe bench transport`'s message: an atom and a
// tensor of --bytes bytes; and the receiving side of a message of a pull
// request's shape (8 elements, two tensors of --bytes together). The ceiling beside them, in the same run: a
// memcpy and a CRC32C of the same bytes (what any transport that checks its
// frames must do once per side). Each also reports the heap allocations it
// makes per message (allocs_per_msg: calls of malloc, calloc and realloc,
// counted by this binary's own wrappers around glibc's).
//
//   troupe_message_bench [--bytes=4096] [benchmark flags, e.g. --benchmark_repetitions=5]
#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include <benchmark/benchmark.h>
#include <caf/atom.hpp>
#include <caf/message.hpp>

#include "transport/frame.h"
#include "transport/internal/frame_buffers.h"
#include "transport/message_codec.h"
#include "transport/tensor.h"

// Every allocation in the process goes through these (the executable's
// symbols take precedence over libc's for every library). memalign,
// aligned_alloc, posix_memalign and the aligned operator new are not
// counted, so the figure is a lower bound (none are on these paths). Not
// under a sanitizer, whose own allocator these would bypass.
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
constexpr bool kCounting = false;
namespace {
std::atomic<uint64_t> g_allocations{0};
}
#else
constexpr bool kCounting = true;
extern "C" {
void* __libc_malloc(size_t);
void* __libc_calloc(size_t, size_t);
void* __libc_realloc(void*, size_t);
void __libc_free(void*);
}
namespace {
std::atomic<uint64_t> g_allocations{0};
}
extern "C" void* malloc(size_t n) {
  g_allocations.fetch_add(1, std::memory_order_relaxed);
  return __libc_malloc(n);
}
extern "C" void* calloc(size_t n, size_t size) {
  g_allocations.fetch_add(1, std::memory_order_relaxed);
  return __libc_calloc(n, size);
}
extern "C" void* realloc(void* p, size_t n) {
  g_allocations.fetch_add(1, std::memory_order_relaxed);
  return __libc_realloc(p, n);
}
extern "C" void free(void* p) { __libc_free(p); }
#endif

namespace troupe::bench {
namespace {

// Allocations per iteration of a benchmark's loop.
class AllocationCount {
 public:
  AllocationCount() : start_(g_allocations.load()) {}
  void report(benchmark::State& state) const {
    if (!kCounting) return;
    state.counters["allocs_per_msg"] =
        double(g_allocations.load() - start_) / double(std::max<benchmark::IterationCount>(1, state.iterations()));
  }

 private:
  uint64_t start_;
};

using transport::Tensor;
using transport::TensorView;
using data_atom = caf::atom_constant<caf::atom("data")>;
using pull_atom = caf::atom_constant<caf::atom("pull")>;

size_t g_bytes = 4096;

// Encodes the message as RemoteActors and the node do before UCX takes it
// (the node keeps its views and the frame's head from send to send).
void sendSide(const caf::message& msg, std::vector<Tensor>* tensors, std::vector<TensorView>* views,
              std::vector<std::byte>* head) {
  transport::Envelope e;
  e.kind = 16;
  e.destActor = 7;
  e.sourceNode = 1;
  tensors->clear();
  if (!transport::encodeMessage(msg, &e.body, tensors).isOk()) std::abort();
  views->clear();
  for (const Tensor& t : *tensors) views->push_back(TensorView{t.data, t.bytes, t.dtype});
  transport::encodeEnvelope(e, *views, transport::Integrity::kCrc32c, head);
}

void sendBench(benchmark::State& state) {
  const caf::message msg = caf::make_message(data_atom::value, Tensor::copyOf(std::string(g_bytes, 'x').data(), g_bytes));
  std::vector<Tensor> tensors;
  std::vector<TensorView> views;
  std::vector<std::byte> head;
  AllocationCount count;
  for (auto _ : state) {
    sendSide(msg, &tensors, &views, &head);
    benchmark::DoNotOptimize(head.data());
  }
  count.report(state);
  state.SetBytesProcessed(int64_t(state.iterations()) * int64_t(g_bytes));
}

// The receiving side of `msg` (bytes processed: its tensors' bytes).
void receiveSide(benchmark::State& state, const caf::message& msg) {
  std::vector<Tensor> tensors;
  std::vector<TensorView> views;
  std::vector<std::byte> head;
  sendSide(msg, &tensors, &views, &head);
  // The frame as UCX hands it over: the envelope as the header, the
  // tensors as the data (in a buffer of its own, as the transport's FIFO
  // would be).
  std::vector<std::byte> data;
  for (const Tensor& t : tensors) {
    const size_t at = data.size();
    data.resize(at + transport::paddedTensorBytes(t.bytes));
    std::memcpy(data.data() + at, t.data, t.bytes);
  }
  const size_t dataBytes = data.size();
  const size_t frameBytes = head.size() + transport::paddedTensorBytes(dataBytes);
  transport::internal::FrameBuffers buffers;  // as the node's receive buffers
  AllocationCount count;
  for (auto _ : state) {
    std::shared_ptr<uint64_t[]> storage = buffers.get(frameBytes);
    auto* bytes = reinterpret_cast<std::byte*>(storage.get());
    std::memcpy(bytes, head.data(), head.size());
    std::memcpy(bytes + head.size(), data.data(), dataBytes);
    std::memset(bytes + head.size() + dataBytes, 0, frameBytes - head.size() - dataBytes);
    auto frame = transport::decodeFrame(bytes, frameBytes);
    if (!frame.hasValue()) std::abort();
    auto back = transport::decodeMessage(frame->envelope.body, frame->tensors, storage);
    if (!back.hasValue() || back->size() != msg.size() || back->type_token() != msg.type_token()) std::abort();
    benchmark::DoNotOptimize(back->cvals().get());
  }
  count.report(state);
  size_t tensorBytes = 0;
  for (const Tensor& t : tensors) tensorBytes += t.bytes;
  state.SetBytesProcessed(int64_t(state.iterations()) * int64_t(tensorBytes));
}

void receiveBench(benchmark::State& state) {
  receiveSide(state, caf::make_message(data_atom::value, Tensor::copyOf(std::string(g_bytes, 'x').data(), g_bytes)));
}

// A message of a parameter server's pull request's shape (ps/wire.h's
// pullToWire: an atom, the worker, the step, two flags, the counts and the
// keys, the generation), its two tensors g_bytes together (at least 72).
void receivePullBench(benchmark::State& state) {
  const size_t counts = 64, keys = std::max<size_t>(g_bytes, counts + 8) - counts;
  receiveSide(state, caf::make_message(pull_atom::value, int64_t(3), int64_t(1200), true, false,
                                       Tensor::copyOf(std::string(counts, 'c').data(), counts),
                                       Tensor::copyOf(std::string(keys, 'k').data(), keys), int64_t(2)));
}

// The ceiling: one copy and one CRC32C of the tensor's bytes.
// (Source and destination in one buffer, 256 bytes off a 4 KiB multiple
// apart: separate vectors may land a multiple of 4 KiB apart, and on the
// AMD hosts used here rep movsb then copies 4 KiB in 2 us instead of 0.1.)
void copyAndCrcBench(benchmark::State& state) {
  const size_t apart = (g_bytes + 4095) / 4096 * 4096 + 256;
  std::vector<std::byte> buffer(apart + g_bytes, std::byte{1});
  std::byte* a = buffer.data();
  std::byte* b = buffer.data() + apart;
  AllocationCount count;
  for (auto _ : state) {
    std::memcpy(b, a, g_bytes);
    benchmark::DoNotOptimize(transport::frameCrc(b, g_bytes));
    benchmark::ClobberMemory();
  }
  count.report(state);
  state.SetBytesProcessed(int64_t(state.iterations()) * int64_t(g_bytes));
}

}  // namespace
}  // namespace troupe::bench

int main(int argc, char** argv) {
  std::vector<char*> rest;
  for (int i = 0; i < argc; ++i) {
    if (std::strncmp(argv[i], "--bytes=", 8) == 0) {
      troupe::bench::g_bytes = std::strtoull(argv[i] + 8, nullptr, 10);
    } else {
      rest.push_back(argv[i]);
    }
  }
  int n = int(rest.size());
  benchmark::RegisterBenchmark("copy_and_crc32c", troupe::bench::copyAndCrcBench);
  benchmark::RegisterBenchmark("send_side", troupe::bench::sendBench);
  benchmark::RegisterBenchmark("receive_side", troupe::bench::receiveBench);
  benchmark::RegisterBenchmark("receive_side_pull", troupe::bench::receivePullBench);
  benchmark::Initialize(&n, rest.data());
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
