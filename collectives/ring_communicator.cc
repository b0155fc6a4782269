#include "collectives/ring_communicator.h"

#include <algorithm>
#include <condition_variable>
#include <cstring>
#include <map>
#include <mutex>
#include <thread>
#include <unordered_map>

#include "collectives/reduce.h"
#include "common/logging.h"

namespace troupe::collectives {
namespace {

using Clock = std::chrono::steady_clock;
using transport::Envelope;
using transport::Tensor;

// Control frames carry op kControlOp and one of these tags; data frames
// carry the collective's sequence number (from 1) and (step << 24 | chunk).
constexpr uint64_t kControlOp = ~uint64_t{0};
constexpr uint64_t kHelloTag = 1;
constexpr uint64_t kAckTag = 2;
constexpr uint64_t kAbortTag = 3;

// A waiter that receives a chunk of at least this many bytes hands progress
// back to the progress thread while it reduces it (transport/node.h).
constexpr uint64_t kHandBackBytes = 64 << 10;

uint64_t tag(uint64_t step, uint64_t chunk) { return (step << 24) | chunk; }

std::shared_ptr<spdlog::logger> log() {
  static auto l = logger("collectives");
  return l;
}

}  // namespace

// The receiving side: frames by (source rank, op, tag), the failure state
// and the count of sends UCX still reads from the caller's buffers.
struct RingCommunicator::Inbox final : public transport::FrameSink {
  struct Key {
    uint64_t op, tag;
    int src;
    bool operator==(const Key& o) const { return op == o.op && tag == o.tag && src == o.src; }
  };
  struct KeyHash {
    size_t operator()(const Key& k) const {
      return std::hash<uint64_t>()(k.op * 0x9E3779B97F4A7C15ull ^ k.tag * 0xC2B2AE3D27D4EB4Full ^ uint64_t(k.src));
    }
  };
  struct Msg {
    const std::byte* data = nullptr;
    uint64_t bytes = 0;
    std::shared_ptr<const void> owner;
  };

  Inbox(transport::RemoteActors& remote, int self, std::vector<uint64_t> nodes, uint64_t epoch)
      : remote(remote), self(self), nodes(std::move(nodes)), epoch(epoch), acked(this->nodes.size(), false) {
    for (size_t r = 0; r < this->nodes.size(); ++r) rankOf[this->nodes[r]] = int(r);
  }

  void onFrame(uint64_t peer, transport::DecodedFrame frame, std::shared_ptr<const void> owner) override {
    auto it = rankOf.find(peer);
    if (it == rankOf.end()) return;  // not of this group
    const int src = it->second;
    const Envelope& e = frame.envelope;
    if (e.sourceActor != epoch) return;  // of an earlier group of these nodes (before a regroup)
    if (e.requestId == kControlOp) {
      if (e.destActor == kHelloTag) {
        Envelope ack;
        ack.kind = transport::kCollectiveKind;
        ack.sourceActor = epoch;
        ack.requestId = kControlOp;
        ack.destActor = kAckTag;
        remote.sendFrame(peer, std::move(ack), {});
      } else if (e.destActor == kAckTag) {
        std::lock_guard<std::mutex> lock(mutex);
        acked[size_t(src)] = true;
        cv.notify_all();
      } else if (e.destActor == kAbortTag) {
        fail(Status::unavailable(fmt::format("rank {} gave up the collective: {}", src, e.body)));
      }
      return;
    }
    Msg m;
    if (!frame.tensors.empty()) {
      m.data = frame.tensors[0].data;
      m.bytes = frame.tensors[0].bytes;
    }
    m.owner = std::move(owner);
    {
      std::lock_guard<std::mutex> lock(mutex);
      messages[Key{e.requestId, e.destActor, src}] = std::move(m);
    }
    arrivals.fetch_add(1, std::memory_order_release);
    cv.notify_all();
  }

  void onPeerDown(uint64_t peer, transport::Departure how, const Status& why) override {
    auto it = rankOf.find(peer);
    if (it == rankOf.end() || it->second == self) return;
    Status down = Status::unavailable(fmt::format("rank {} (node {:x}) is down: {}", it->second, peer, why.message()));
    if (how == transport::Departure::kLeft) {
      // A goodbye comes after every frame the peer sent, so whatever it
      // sent is here: only a wait for more from it fails (a rank that
      // finished the last collective and left is no failure).
      std::lock_guard<std::mutex> lock(mutex);
      gone.emplace(it->second, std::move(down));
      cv.notify_all();
      return;
    }
    fail(std::move(down));
  }

  void fail(Status s) {
    std::lock_guard<std::mutex> lock(mutex);
    if (!failed.isOk()) return;
    failed = std::move(s);
    hasFailed.store(true, std::memory_order_release);
    cv.notify_all();
  }

  Status failure() {
    std::lock_guard<std::mutex> lock(mutex);
    return failed;
  }

  Expected<Msg> wait(int src, uint64_t op, uint64_t t, Clock::time_point deadline, std::chrono::microseconds spin) {
    const Key key{op, t, src};
    const auto spinUntil = Clock::now() + spin;
    std::unique_lock<std::mutex> lock(mutex);
    for (;;) {
      auto it = messages.find(key);
      if (it != messages.end()) {
        Msg m = std::move(it->second);
        messages.erase(it);
        // A large chunk is reduced for a while: the progress thread keeps
        // the pipeline moving meanwhile.
        if (m.bytes >= kHandBackBytes) remote.node().handBackProgress(true);
        return m;
      }
      if (!failed.isOk()) return failed;
      if (auto g = gone.find(src); g != gone.end()) return g->second;
      const auto now = Clock::now();
      if (now >= deadline) {
        return Status::timeout(fmt::format("rank {} sent nothing for collective {} step {} chunk {} in time", src, op,
                                           t >> 24, t & 0xffffff));
      }
      if (now < spinUntil) {
        // Drive the transport from this thread while spinning: the frame is
        // handed to onFrame here, without waiting for the progress thread
        // to be scheduled and to wake this one.
        const uint64_t seen = arrivals.load(std::memory_order_acquire);
        lock.unlock();
        transport::Node& node = remote.node();
        struct Polling {  // ends the progress thread's back-off even if a callback throws
          transport::Node& node;
          explicit Polling(transport::Node& n) : node(n) { node.beginPolling(); }
          ~Polling() { node.endPolling(); }
        };
        bool arrived = false;
        {
          Polling polling(node);
          // An idle poll yields: with more ranks than cores on a host, the
          // rank this one waits for needs the core (measured: a pure spin,
          // or a yield every 8th idle poll, made n = 4 on 2 cores 2.5-6x
          // slower).
          while (!(arrived = arrivals.load(std::memory_order_acquire) != seen) &&
                 !hasFailed.load(std::memory_order_acquire) && Clock::now() < spinUntil) {
            if (!node.pollOnce()) std::this_thread::yield();
          }
        }
        if (!arrived) node.handBackProgress(true);  // about to sleep: the progress thread takes over
        lock.lock();
        continue;
      }
      cv.wait_until(lock, deadline);
    }
  }

  void sendStarted() { sendsInFlight.fetch_add(1, std::memory_order_relaxed); }
  void sendDone() {
    if (sendsInFlight.fetch_sub(1, std::memory_order_acq_rel) == 1) {
      std::lock_guard<std::mutex> lock(mutex);
      cv.notify_all();
    }
  }
  // Until UCX holds no buffer of the caller's any more (bounded); with
  // stopOnFailure, also until the group fails (sends to a dead peer never
  // complete).
  bool waitSends(Clock::time_point deadline, bool stopOnFailure = false) {
    std::unique_lock<std::mutex> lock(mutex);
    return cv.wait_until(lock, deadline, [&] {
      return sendsInFlight.load(std::memory_order_acquire) == 0 || (stopOnFailure && !failed.isOk());
    }) && sendsInFlight.load(std::memory_order_acquire) == 0;
  }

  transport::RemoteActors& remote;
  const int self;
  const std::vector<uint64_t> nodes;
  const uint64_t epoch;
  std::unordered_map<uint64_t, int> rankOf;
  std::mutex mutex;
  std::condition_variable cv;
  std::unordered_map<Key, Msg, KeyHash> messages;
  std::vector<bool> acked;
  std::map<int, Status> gone;  // ranks that left the job
  Status failed;
  std::atomic<bool> hasFailed{false};
  std::atomic<uint64_t> arrivals{0};
  std::atomic<int64_t> sendsInFlight{0};
};

namespace {

// Sends `bytes` at `data` (zero copy: the inbox counts the send until UCX
// lets go of the buffer).
void sendChunk(transport::RemoteActors& remote, const std::shared_ptr<RingCommunicator::Inbox>& inbox, uint8_t traffic,
               uint64_t node, uint64_t op, uint64_t t, const std::byte* data, size_t bytes) {
  inbox->sendStarted();
  std::shared_ptr<const void> owner(static_cast<const void*>(data), [inbox](const void*) { inbox->sendDone(); });
  Tensor tensor;
  tensor.owner = std::move(owner);
  tensor.data = data;
  tensor.bytes = bytes;
  Envelope e;
  e.kind = transport::kCollectiveKind;
  e.sourceActor = inbox->epoch;
  e.requestId = op;
  e.destActor = t;
  e.traffic = traffic;
  std::vector<Tensor> tensors;
  tensors.push_back(std::move(tensor));
  remote.sendFrame(node, std::move(e), std::move(tensors));
}

size_t ceilDiv(size_t a, size_t b) { return (a + b - 1) / b; }

}  // namespace

RingCommunicator::RingCommunicator(transport::RemoteActors& remote, RingOptions options, std::shared_ptr<Inbox> inbox)
    : remote_(remote), options_(std::move(options)), inbox_(std::move(inbox)) {}

RingCommunicator::~RingCommunicator() {
  const bool failed = !inbox_->failure().isOk();
  inbox_->waitSends(Clock::now() + (failed ? std::chrono::milliseconds(100) : std::chrono::milliseconds(5000)));
  remote_.detachSink(transport::kCollectiveKind, inbox_.get());  // not a later group's
}

Expected<std::unique_ptr<RingCommunicator>> RingCommunicator::create(transport::RemoteActors& remote,
                                                                      RingOptions options) {
  const int n = int(options.nodes.size());
  if (n < 1) return Status::invalidArgument("a communicator needs at least one rank");
  if (options.rank < 0 || options.rank >= n) {
    return Status::invalidArgument(fmt::format("rank {} is not in a group of {}", options.rank, n));
  }
  if (options.nodes[size_t(options.rank)] != remote.node().id()) {
    return Status::invalidArgument(fmt::format("rank {} is node {:x}, but this process is node {:x}", options.rank,
                                               options.nodes[size_t(options.rank)], remote.node().id()));
  }
  {
    std::vector<uint64_t> sorted = options.nodes;
    std::sort(sorted.begin(), sorted.end());
    if (std::adjacent_find(sorted.begin(), sorted.end()) != sorted.end()) {
      return Status::invalidArgument("the communicator's node list names a node twice");
    }
  }
  if (options.chunkBytes < 64) return Status::invalidArgument("chunkBytes must be at least 64");
  auto inbox = std::make_shared<Inbox>(remote, options.rank, options.nodes, options.epoch);
  remote.attachSink(transport::kCollectiveKind, inbox);
  std::unique_ptr<RingCommunicator> comm(new RingCommunicator(remote, std::move(options), std::move(inbox)));
  comm->setTrafficLabel("collective");
  Status s = comm->connect();
  if (!s.isOk()) return s;
  return comm;
}

// Hello to every other rank until each has acknowledged (its inbox is
// attached, so no later chunk of ours is dropped as an unknown kind).
Status RingCommunicator::connect() {
  const int n = size();
  const auto deadline = Clock::now() + options_.connectTimeout;
  inbox_->acked[size_t(rank())] = true;
  for (;;) {
    std::vector<int> missing;
    {
      std::lock_guard<std::mutex> lock(inbox_->mutex);
      if (!inbox_->failed.isOk()) return inbox_->failed;
      for (int r = 0; r < n; ++r) {
        if (inbox_->acked[size_t(r)]) continue;
        // A rank that left the job (its process exited) will never answer.
        if (auto g = inbox_->gone.find(r); g != inbox_->gone.end()) return g->second;
        missing.push_back(r);
      }
    }
    if (missing.empty()) return Status::ok();
    if (Clock::now() >= deadline) {
      return Status::timeout(fmt::format("ranks [{}] did not answer within {} ms", fmt::join(missing, ", "),
                                         options_.connectTimeout.count()));
    }
    for (int r : missing) {
      Envelope e;
      e.kind = transport::kCollectiveKind;
      e.sourceActor = options_.epoch;
      e.requestId = kControlOp;
      e.destActor = kHelloTag;
      remote_.sendFrame(options_.nodes[size_t(r)], std::move(e), {});
    }
    std::unique_lock<std::mutex> lock(inbox_->mutex);
    inbox_->cv.wait_for(lock, std::chrono::milliseconds(20));
  }
}

Status RingCommunicator::begin() {
  ++op_;
  return inbox_->failure();
}

// Every collective ends here: on success once UCX has let go of the
// caller's buffers; on failure the others are told and the failure sticks.
Status RingCommunicator::finish(Status s) {
  // This caller stops polling until its next collective: the progress
  // thread serves the transport meanwhile (frames of the next collective,
  // actor messages) from its next tick. Not woken at once: back-to-back
  // small collectives would pay a wake-up and a competing spin each
  // (measured: 4 KiB all-reduce 6 -> 19 us with n = 2).
  remote_.node().handBackProgress(false);
  if (s.isOk()) {
    if (inbox_->waitSends(Clock::now() + options_.timeout, true)) return Status::ok();
    s = inbox_->failure();
    if (s.isOk()) s = Status::timeout("the transport did not finish sending a collective's chunks in time");
  }
  const bool first = inbox_->failure().isOk();
  inbox_->fail(s);
  Status failed = inbox_->failure();
  if (first) {
    log()->error("collective failed on rank {}: {}", rank(), failed.message());
    for (int r = 0; r < size(); ++r) {
      if (r == rank()) continue;
      Envelope e;
      e.kind = transport::kCollectiveKind;
      e.sourceActor = options_.epoch;
      e.requestId = kControlOp;
      e.destActor = kAbortTag;
      e.body = failed.message();
      remote_.sendFrame(options_.nodes[size_t(r)], std::move(e), {});
    }
  }
  // Sends to a dead peer never complete (UCX shared memory has no peer
  // error handling); those to live peers finish soon.
  inbox_->waitSends(Clock::now() + std::chrono::milliseconds(100));
  return failed;
}

Status RingCommunicator::allReduce(void* data, size_t count, DType dtype, ReduceOp op) {
  const size_t es = reduceElementBytes(dtype);
  if (es == 0) return Status::invalidArgument(fmt::format("allReduce: dtype {} is not float32, bf16 or fp16", int(dtype)));
  if (count > 0 && data == nullptr) return Status::invalidArgument("allReduce: null buffer");
  Status s = begin();
  if (!s.isOk()) return s;
  auto* bytes = static_cast<std::byte*>(data);
  const int n = size();
  if (n == 1 || count == 0) return finish(Status::ok());
  const bool powerOfTwo = (n & (n - 1)) == 0;
  if (powerOfTwo && count * es <= options_.smallBytes) return finish(doublingAllReduce(bytes, count, dtype, op));
  return finish(ringAllReduce(bytes, count, dtype, op));
}

Status RingCommunicator::doublingAllReduce(std::byte* data, size_t count, DType dtype, ReduceOp op) {
  const int n = size(), r = rank();
  const size_t es = reduceElementBytes(dtype), bytes = count * es;
  const auto deadline = Clock::now() + options_.timeout;
  uint64_t step = 0;
  for (int mask = 1; mask < n; mask <<= 1, ++step) {
    const int partner = r ^ mask;
    // A copy: this rank's buffer changes before UCX may have sent it.
    Tensor t = Tensor::copyOf(data, bytes, dtype);
    Envelope e;
    e.kind = transport::kCollectiveKind;
    e.sourceActor = options_.epoch;
    e.requestId = op_;
    e.destActor = tag(step, 0);
    e.traffic = traffic_;
    std::vector<Tensor> ts;
    ts.push_back(std::move(t));
    remote_.sendFrame(options_.nodes[size_t(partner)], std::move(e), std::move(ts));
    auto m = inbox_->wait(partner, op_, tag(step, 0), deadline, options_.spin);
    if (!m.hasValue()) return m.status();
    if (m->bytes != bytes) {
      return Status::corruption(fmt::format("rank {} sent {} bytes for an all-reduce of {}", partner, m->bytes, bytes));
    }
    reduceSum(data, m->data, count, dtype);
  }
  if (op == ReduceOp::kAverage) scaleBy(data, count, dtype, 1.0f / float(n));
  return Status::ok();
}

Status RingCommunicator::ringAllReduce(std::byte* data, size_t count, DType dtype, ReduceOp op) {
  const int n = size(), r = rank();
  const size_t es = reduceElementBytes(dtype);
  const uint64_t next = options_.nodes[size_t((r + 1) % n)];
  const int prev = (r + n - 1) % n;
  const size_t chunkElems = std::max<size_t>(1, options_.chunkBytes / es);
  auto segBegin = [&](int seg) { return count * size_t(seg) / size_t(n); };
  auto segChunks = [&](int seg) { return ceilDiv(segBegin(seg + 1) - segBegin(seg), chunkElems); };
  // Elements [first, last) of chunk c of segment seg.
  auto chunk = [&](int seg, size_t c) {
    const size_t first = segBegin(seg) + c * chunkElems;
    return std::make_pair(first, std::min(segBegin(seg + 1), first + chunkElems));
  };
  auto mod = [n](int x) { return ((x % n) + n) % n; };
  const auto deadline = Clock::now() + options_.timeout;
  auto receive = [&](uint64_t step, int seg, size_t c) -> Expected<Inbox::Msg> {
    auto m = inbox_->wait(prev, op_, tag(step, c), deadline, options_.spin);
    if (!m.hasValue()) return m.status();
    const auto [first, last] = chunk(seg, c);
    if (m->bytes != (last - first) * es) {
      return Status::corruption(fmt::format("rank {} sent {} bytes for a chunk of {} in step {}", prev, m->bytes,
                                            (last - first) * es, step));
    }
    return m;
  };
  // Reduce-scatter: step s sends segment r - s and reduces segment r - s - 1
  // into this rank's buffer; each reduced chunk goes on at once. Step n - 2
  // leaves segment r + 1 complete here, and its chunks open the all-gather.
  for (size_t c = 0; c < segChunks(r); ++c) {
    const auto [first, last] = chunk(r, c);
    sendChunk(remote_, inbox_, traffic_, next, op_, tag(0, c), data + first * es, (last - first) * es);
  }
  for (int s = 0; s + 1 < n; ++s) {
    const int seg = mod(r - s - 1);
    for (size_t c = 0; c < segChunks(seg); ++c) {
      auto m = receive(uint64_t(s), seg, c);
      if (!m.hasValue()) return m.status();
      const auto [first, last] = chunk(seg, c);
      reduceSum(data + first * es, m->data, last - first, dtype);
      if (s + 2 == n && op == ReduceOp::kAverage) scaleBy(data + first * es, last - first, dtype, 1.0f / float(n));
      sendChunk(remote_, inbox_, traffic_, next, op_, tag(uint64_t(s + 1), c), data + first * es, (last - first) * es);
    }
  }
  // All-gather: step t (tags n - 1 + t) brings segment r - t, forwarded on
  // until it has gone round.
  for (int t = 0; t + 1 < n; ++t) {
    const int seg = mod(r - t);
    const uint64_t step = uint64_t(n - 1 + t);
    for (size_t c = 0; c < segChunks(seg); ++c) {
      auto m = receive(step, seg, c);
      if (!m.hasValue()) return m.status();
      const auto [first, last] = chunk(seg, c);
      std::memcpy(data + first * es, m->data, (last - first) * es);
      if (t + 2 < n) sendChunk(remote_, inbox_, traffic_, next, op_, tag(step + 1, c), data + first * es, (last - first) * es);
    }
  }
  return Status::ok();
}

Status RingCommunicator::broadcast(void* data, size_t bytes, int root) {
  const int n = size();
  if (root < 0 || root >= n) return Status::invalidArgument(fmt::format("broadcast: root {} of {} ranks", root, n));
  if (bytes > 0 && data == nullptr) return Status::invalidArgument("broadcast: null buffer");
  Status s = begin();
  if (!s.isOk()) return s;
  if (n == 1 || bytes == 0) return finish(Status::ok());
  auto* buf = static_cast<std::byte*>(data);
  const int pos = (rank() - root + n) % n;  // place in the chain from the root
  const uint64_t next = options_.nodes[size_t((rank() + 1) % n)];
  const int prev = (rank() + n - 1) % n;
  const size_t cb = options_.chunkBytes, chunks = ceilDiv(bytes, cb);
  const auto deadline = Clock::now() + options_.timeout;
  for (size_t c = 0; c < chunks; ++c) {
    const size_t first = c * cb, len = std::min(bytes, first + cb) - first;
    if (pos > 0) {
      auto m = inbox_->wait(prev, op_, tag(0, c), deadline, options_.spin);
      if (!m.hasValue()) return finish(m.status());
      if (m->bytes != len) {
        return finish(Status::corruption(fmt::format("rank {} sent {} bytes of a broadcast chunk of {}", prev, m->bytes, len)));
      }
      std::memcpy(buf + first, m->data, len);
    }
    if (pos + 1 < n) sendChunk(remote_, inbox_, traffic_, next, op_, tag(0, c), buf + first, len);
  }
  return finish(Status::ok());
}

Status RingCommunicator::ringGather(const std::vector<std::byte*>& blocks, const std::vector<size_t>& sizes) {
  const int n = size(), r = rank();
  const uint64_t next = options_.nodes[size_t((r + 1) % n)];
  const int prev = (r + n - 1) % n;
  const size_t cb = options_.chunkBytes;
  const auto deadline = Clock::now() + options_.timeout;
  for (size_t c = 0; c < ceilDiv(sizes[size_t(r)], cb); ++c) {
    const size_t first = c * cb;
    sendChunk(remote_, inbox_, traffic_, next, op_, tag(0, c), blocks[size_t(r)] + first,
              std::min(sizes[size_t(r)], first + cb) - first);
  }
  for (int t = 0; t + 1 < n; ++t) {
    const int b = ((r - t - 1) % n + n) % n;
    const size_t bytes = sizes[size_t(b)];
    for (size_t c = 0; c < ceilDiv(bytes, cb); ++c) {
      const size_t first = c * cb, len = std::min(bytes, first + cb) - first;
      auto m = inbox_->wait(prev, op_, tag(uint64_t(t), c), deadline, options_.spin);
      if (!m.hasValue()) return m.status();
      if (m->bytes != len) {
        return Status::corruption(fmt::format("rank {} sent {} bytes of a gather chunk of {}", prev, m->bytes, len));
      }
      std::memcpy(blocks[size_t(b)] + first, m->data, len);
      if (t + 2 < n) sendChunk(remote_, inbox_, traffic_, next, op_, tag(uint64_t(t + 1), c), blocks[size_t(b)] + first, len);
    }
  }
  return Status::ok();
}

Status RingCommunicator::allGather(const void* in, void* out, size_t bytes) {
  if (bytes > 0 && (in == nullptr || out == nullptr)) return Status::invalidArgument("allGather: null buffer");
  Status s = begin();
  if (!s.isOk()) return s;
  const int n = size();
  auto* o = static_cast<std::byte*>(out);
  if (bytes) std::memmove(o + size_t(rank()) * bytes, in, bytes);
  if (n == 1 || bytes == 0) return finish(Status::ok());
  std::vector<std::byte*> blocks(static_cast<size_t>(n));
  for (int r = 0; r < n; ++r) blocks[size_t(r)] = o + size_t(r) * bytes;
  return finish(ringGather(blocks, std::vector<size_t>(size_t(n), bytes)));
}

Expected<std::vector<std::vector<std::byte>>> RingCommunicator::allGatherV(const void* in, size_t bytes) {
  if (bytes > 0 && in == nullptr) return Status::invalidArgument("allGatherV: null buffer");
  const int n = size();
  std::vector<uint64_t> sizes(static_cast<size_t>(n), 0);
  const uint64_t mine = bytes;
  Status s = allGather(&mine, sizes.data(), sizeof(uint64_t));
  if (!s.isOk()) return s;
  std::vector<std::vector<std::byte>> out(static_cast<size_t>(n));
  std::vector<std::byte*> blocks(static_cast<size_t>(n));
  std::vector<size_t> lengths(static_cast<size_t>(n));
  for (int r = 0; r < n; ++r) {
    if (sizes[size_t(r)] > (uint64_t{1} << 40)) {
      return finish(Status::corruption(fmt::format("rank {} claims a gather block of {} bytes", r, sizes[size_t(r)])));
    }
    out[size_t(r)].resize(size_t(sizes[size_t(r)]));
    blocks[size_t(r)] = out[size_t(r)].data();
    lengths[size_t(r)] = size_t(sizes[size_t(r)]);
  }
  if (bytes) std::memcpy(blocks[size_t(rank())], in, bytes);
  s = begin();
  if (!s.isOk()) return s;
  if (n > 1) s = ringGather(blocks, lengths);
  s = finish(s);
  if (!s.isOk()) return s;
  return out;
}

Status RingCommunicator::abort(Status why) {
  if (why.isOk()) why = Status::internal("aborted with no reason");
  ++op_;
  return finish(std::move(why));
}

double RingCommunicator::allReduceBytesSent(size_t count, DType dtype) const {
  const int n = size();
  const double bytes = double(count) * double(reduceElementBytes(dtype));
  if (n <= 1 || count == 0) return 0.0;
  if ((n & (n - 1)) == 0 && bytes <= double(options_.smallBytes)) {
    int steps = 0;
    for (int m = 1; m < n; m <<= 1) ++steps;
    return double(steps) * bytes;
  }
  // The ring: segment s of n, sent by its n - 1 ... steps in each half.
  double sent = 0;
  for (int step = 0; step + 1 < n; ++step) {
    const int r = rank();
    const int scatter = ((r - step) % n + n) % n, gather = ((r + 1 - step) % n + n) % n;
    auto seg = [&](int s) { return double(count * size_t(s + 1) / size_t(n) - count * size_t(s) / size_t(n)); };
    sent += seg(scatter) + seg(gather);
  }
  return sent * double(reduceElementBytes(dtype));
}

Status RingCommunicator::allToAll(const void* in, void* out, size_t bytes) {
  if (bytes > 0 && (in == nullptr || out == nullptr)) return Status::invalidArgument("allToAll: null buffer");
  Status s = begin();
  if (!s.isOk()) return s;
  const int n = size(), r = rank();
  const auto* src = static_cast<const std::byte*>(in);
  auto* dst = static_cast<std::byte*>(out);
  if (bytes) std::memcpy(dst + size_t(r) * bytes, src + size_t(r) * bytes, bytes);
  if (n == 1 || bytes == 0) return finish(Status::ok());
  const size_t cb = options_.chunkBytes, chunks = ceilDiv(bytes, cb);
  const auto deadline = Clock::now() + options_.timeout;
  // Rank r sends to r + 1, r + 2, ... first: no rank is everyone's first.
  for (int k = 1; k < n; ++k) {
    const int to = (r + k) % n;
    for (size_t c = 0; c < chunks; ++c) {
      const size_t first = c * cb, len = std::min(bytes, first + cb) - first;
      sendChunk(remote_, inbox_, traffic_, options_.nodes[size_t(to)], op_, tag(0, c), src + size_t(to) * bytes + first,
                len);
    }
  }
  for (int k = 1; k < n; ++k) {
    const int from = (r - k + n) % n;
    for (size_t c = 0; c < chunks; ++c) {
      const size_t first = c * cb, len = std::min(bytes, first + cb) - first;
      auto m = inbox_->wait(from, op_, tag(0, c), deadline, options_.spin);
      if (!m.hasValue()) return finish(m.status());
      if (m->bytes != len) {
        return finish(Status::corruption(
            fmt::format("rank {} sent {} bytes of an all-to-all chunk of {}", from, m->bytes, len)));
      }
      std::memcpy(dst + size_t(from) * bytes + first, m->data, len);
    }
  }
  return finish(Status::ok());
}

Status RingCommunicator::barrier() {
  float one = 1.0f;
  Status s = allReduce(&one, 1, DType::kFloat32, ReduceOp::kSum);
  if (!s.isOk()) return s;
  if (one != float(size())) {
    return finish(Status::internal(fmt::format("barrier counted {} ranks of {}", one, size())));
  }
  return Status::ok();
}

}  // namespace troupe::collectives
