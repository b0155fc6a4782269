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

template <class T>
Tensor tensor(const std::vector<T>& v, transport::DType dtype) {
  return Tensor::copyOf(v.data(), v.size() * sizeof(T), dtype);
}

Tensor u64(const std::vector<uint64_t>& v) { return tensor(v, transport::DType::kUInt64); }
Tensor f32(const std::vector<float>& v) { return tensor(v, transport::DType::kFloat32); }

TEST(PsWire, PullPushAndReplyRoundTrip) {
  const std::vector<int64_t> dims = {2, 1, 3};
  caf::message pullMsg = acrossProcesses(pullToWire(4, 7, false, true, u64({2, 0, 1}), u64({1, 2, uint64_t(1) << 63})));
  auto p = pullFromWire(pullMsg, dims);
  ASSERT_TRUE(p.hasValue()) << p.status().message();
  EXPECT_EQ(p->worker, 4);
  EXPECT_EQ(p->step, 7);
  EXPECT_FALSE(p->create);
  EXPECT_TRUE(p->dense);
  ASSERT_EQ(p->keyCount, 3u);
  EXPECT_EQ(p->keys[2], uint64_t(1) << 63);
  EXPECT_EQ(p->counts[0], 2u);
  EXPECT_EQ(p->rowFloats, 2u * 2 + 1u * 3);

  caf::message replyMsg = acrossProcesses(pullReplyToWire(f32({1, 2, 3, 4, 5, 6, 7}), f32({9, 8})));
  auto r = pullReplyFromWire(replyMsg, 7, 2);
  ASSERT_TRUE(r.hasValue()) << r.status().message();
  EXPECT_EQ(r->rows[6], 7.0f);
  EXPECT_EQ(r->dense[1], 8.0f);
  EXPECT_FALSE(pullReplyFromWire(replyMsg, 8, 2).hasValue());  // not what was asked for

  caf::message pushMsg =
      acrossProcesses(pushToWire(3, 17, 99, 128, u64({2, 1}), u64({5, 6, 7}), f32({1, 2, 3, 4, 5}), f32({0.5f})));
  auto q = pushFromWire(pushMsg, {2, 1}, 1);
  ASSERT_TRUE(q.hasValue()) << q.status().message();
  EXPECT_EQ(q->worker, 3);
  EXPECT_EQ(q->sequence, 17);
  EXPECT_EQ(q->step, 99);
  EXPECT_EQ(q->samples, 128);
  EXPECT_EQ(q->keyCount, 3u);
  EXPECT_EQ(q->gradFloats, 5u);
  EXPECT_EQ(q->grads[4], 5.0f);
  ASSERT_EQ(q->denseFloats, 1u);
  EXPECT_EQ(q->denseGrads[0], 0.5f);
  // No dense part is fine too.
  EXPECT_TRUE(pushFromWire(pushToWire(3, 18, 99, 0, u64({2, 1}), u64({5, 6, 7}), f32({1, 2, 3, 4, 5}), f32({})),
                           {2, 1}, 1)
                  .hasValue());
}

TEST(PsWire, InconsistentMessagesAreRefused) {
  auto push = [](std::vector<float> grads, std::vector<float> dense) {
    return pushToWire(1, 1, 0, 4, u64({2}), u64({5, 6}), f32(grads), f32(dense));
  };
  EXPECT_FALSE(pushFromWire(push({1, 2, 3}, {}), {2}, 0).hasValue());  // 3 floats for 2 keys of dim 2
  EXPECT_TRUE(pushFromWire(push({1, 2, 3, 4}, {}), {2}, 0).hasValue());
  EXPECT_FALSE(pushFromWire(push({1, 2, 3, 4}, {}), {4}, 0).hasValue());     // wrong dim
  EXPECT_FALSE(pushFromWire(push({1, 2, 3, 4}, {}), {2, 2}, 0).hasValue());  // wrong table count
  EXPECT_FALSE(pushFromWire(push({1, 2, 3, 4}, {1, 2}), {2}, 3).hasValue());  // dense slice size
  EXPECT_FALSE(pushFromWire(pushToWire(1, 1, 0, -1, u64({2}), u64({5, 6}), f32({1, 2, 3, 4}), f32({})), {2}, 0)
                   .hasValue());  // negative samples
  // Counts that claim more keys than there are.
  auto lying = pullToWire(0, 0, true, false, u64({5}), u64({1, 2}));
  auto p = pullFromWire(lying, {1});
  ASSERT_FALSE(p.hasValue());
  EXPECT_NE(p.status().message().find("claims"), std::string::npos) << p.status().message();
  // Keys beyond the counts, wrong dtype, ragged bytes, wrong shape.
  EXPECT_FALSE(pullFromWire(pullToWire(0, 0, true, false, u64({1}), u64({1, 2})), {1}).hasValue());
  std::vector<uint64_t> keys = {1, 2};
  EXPECT_FALSE(pullFromWire(pullToWire(0, 0, true, false, u64({2}), tensor(keys, transport::DType::kFloat32)), {1})
                   .hasValue());
  std::vector<uint64_t> counts = {2};
  EXPECT_FALSE(pullFromWire(pullToWire(0, 0, true, false, Tensor::copyOf(counts.data(), 7, transport::DType::kUInt64),
                                       u64(keys)),
                            {1})
                   .hasValue());
  EXPECT_FALSE(pullFromWire(caf::make_message(pull_atom::value), {1}).hasValue());
  EXPECT_FALSE(pullReplyFromWire(caf::make_message(int64_t(1)), 0, 0).hasValue());
}

TEST(PsWire, RandomCountsNeverCrash) {
  Rng rng(9);
  for (int i = 0; i < 2000; ++i) {
    std::vector<uint64_t> counts(rng.next() % 5), keys(rng.next() % 9);
    for (auto& c : counts) c = rng.next() % 2 ? rng.next() % 6 : rng.next();
    std::vector<float> grads(rng.next() % 20), dense(rng.next() % 3);
    auto msg = pushToWire(1, 2, 3, 5, u64(counts), u64(keys), f32(grads), f32(dense));
    std::vector<int64_t> dims(counts.size(), int64_t(rng.next() % 4));
    auto v = pushFromWire(msg, dims, rng.next() % 3);
    if (v.hasValue()) {
      // Whatever is accepted is consistent: every key and float is accounted for.
      uint64_t total = 0, floats = 0;
      for (size_t t = 0; t < counts.size(); ++t) {
        total += v->counts[t];
        floats += v->counts[t] * uint64_t(dims[t]);
      }
      EXPECT_EQ(total, v->keyCount);
      EXPECT_EQ(floats, v->gradFloats);
    }
    (void)pullFromWire(pullToWire(1, 2, true, true, u64(counts), u64(keys)), dims);
  }
}

}  // namespace
}  // namespace troupe::ps
