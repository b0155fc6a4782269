#include "ps/wire.h"

#include <caf/all.hpp>
#include <gtest/gtest.h>

#include "common/hash.h"
#include "transport/message_codec.h"

namespace troupe::ps {
namespace {

using transport::Tensor;

// Through the transport's codec and frame, as between two processes.
caf::message acrossProcesses(const caf::message& msg) {
  transport::Envelope e;
  std::vector<Tensor> tensors;
  EXPECT_TRUE(transport::encodeMessage(msg, &e.body, &tensors).isOk());
  std::vector<transport::TensorView> views;
  for (const auto& t : tensors) views.push_back(transport::TensorView{t.data, t.bytes, t.dtype});
  auto frame = std::make_shared<std::vector<std::byte>>(transport::encodeFrame(e, views));
  auto decoded = transport::decodeFrame(frame->data(), frame->size());
  EXPECT_TRUE(decoded.hasValue());
  auto back = transport::decodeMessage(decoded->envelope.body, decoded->tensors, frame);
  EXPECT_TRUE(back.hasValue());
  return back.hasValue() ? *back : caf::message();
}

TEST(PsWire, PullPushAndReplyRoundTrip) {
  PullRequest pull;
  pull.keys = {{1, 2, 3}, {}, {uint64_t(1) << 63}};
  pull.create = false;
  auto p = pullFromWire(acrossProcesses(pullToWire(pull)));
  ASSERT_TRUE(p.hasValue()) << p.status().message();
  EXPECT_EQ(p->keys, pull.keys);
  EXPECT_FALSE(p->create);

  PullReply reply;
  reply.rows = {{1.5f, 2.5f, 3.5f, 4.5f}, {}, {-1.0f, 0.0f}};
  auto r = pullReplyFromWire(acrossProcesses(pullReplyToWire(reply)));
  ASSERT_TRUE(r.hasValue()) << r.status().message();
  EXPECT_EQ(r->rows, reply.rows);

  PushRequest push;
  push.worker = 3;
  push.sequence = 17;
  push.step = 99;
  push.keys = {{5, 6}, {7}};
  push.grads = {{1, 2, 3, 4}, {5, 6, 7}};  // dims 2 and 3
  auto q = pushFromWire(acrossProcesses(pushToWire(push)), {2, 3});
  ASSERT_TRUE(q.hasValue()) << q.status().message();
  EXPECT_EQ(q->worker, 3);
  EXPECT_EQ(q->sequence, 17);
  EXPECT_EQ(q->step, 99);
  EXPECT_EQ(q->keys, push.keys);
  EXPECT_EQ(q->grads, push.grads);
  EXPECT_TRUE(pushFromWire(pushToWire(push)).hasValue());  // dims unknown: widths from the counts
}

TEST(PsWire, InconsistentMessagesAreRefused) {
  PushRequest push;
  push.keys = {{5, 6}};
  push.grads = {{1, 2, 3}};  // 3 floats for 2 keys
  EXPECT_FALSE(pushFromWire(pushToWire(push)).hasValue());
  push.grads = {{1, 2, 3, 4}};
  EXPECT_FALSE(pushFromWire(pushToWire(push), {4}).hasValue());     // wrong dim
  EXPECT_FALSE(pushFromWire(pushToWire(push), {2, 2}).hasValue());  // wrong table count
  EXPECT_FALSE(pushFromWire(pushToWire(push), {0}).hasValue());     // nonsense dim
  // Counts that claim more keys than there are.
  std::vector<uint64_t> counts = {5}, keys = {1, 2};
  auto lying = caf::make_message(pull_atom::value, true, Tensor::copyOf(counts.data(), 8, transport::DType::kUInt64),
                                 Tensor::copyOf(keys.data(), 16, transport::DType::kUInt64));
  auto p = pullFromWire(lying);
  ASSERT_FALSE(p.hasValue());
  EXPECT_NE(p.status().message().find("claims"), std::string::npos) << p.status().message();
  // Wrong dtype, ragged bytes, wrong shape.
  auto floats = caf::make_message(pull_atom::value, true, Tensor::copyOf(counts.data(), 8, transport::DType::kUInt64),
                                  Tensor::copyOf(keys.data(), 16, transport::DType::kFloat32));
  EXPECT_FALSE(pullFromWire(floats).hasValue());
  auto ragged = caf::make_message(pull_atom::value, true, Tensor::copyOf(counts.data(), 7, transport::DType::kUInt64),
                                  Tensor::copyOf(keys.data(), 16, transport::DType::kUInt64));
  EXPECT_FALSE(pullFromWire(ragged).hasValue());
  EXPECT_FALSE(pullFromWire(caf::make_message(pull_atom::value)).hasValue());
  EXPECT_FALSE(pullReplyFromWire(caf::make_message(int64_t(1))).hasValue());
}

TEST(PsWire, RandomCountsNeverCrash) {
  Rng rng(9);
  for (int i = 0; i < 2000; ++i) {
    std::vector<uint64_t> counts(rng.next() % 5), keys(rng.next() % 9);
    for (auto& c : counts) c = rng.next() % 2 ? rng.next() % 6 : rng.next();
    std::vector<float> grads(rng.next() % 20);
    std::vector<uint64_t> gradCounts(counts.size());
    for (auto& g : gradCounts) g = rng.next() % 2 ? rng.next() % 20 : rng.next();
    auto msg = caf::make_message(push_atom::value, int64_t(1), int64_t(2), int64_t(3),
                                 Tensor::copyOf(counts.data(), counts.size() * 8, transport::DType::kUInt64),
                                 Tensor::copyOf(keys.data(), keys.size() * 8, transport::DType::kUInt64),
                                 Tensor::copyOf(gradCounts.data(), gradCounts.size() * 8, transport::DType::kUInt64),
                                 Tensor::copyOf(grads.data(), grads.size() * 4, transport::DType::kFloat32));
    (void)pushFromWire(msg);
    (void)pushFromWire(msg, std::vector<int>(counts.size(), int(rng.next() % 4)));
  }
}

}  // namespace
}  // namespace troupe::ps
