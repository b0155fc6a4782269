#include "ps/wire.h"

#include <cmath>
#include <cstring>

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
  // The dense learning rate's scale (train.lr_decay) crosses as it is, and
  // only one in (0, 1] is taken.
  auto scaled = [](double s) { return pushToWire(1, 1, 0, 4, u64({2}), u64({5, 6}), f32({1, 2, 3, 4}), f32({}), 0, s); };
  auto quarter = pushFromWire(acrossProcesses(scaled(0.25)), {2}, 0);
  ASSERT_TRUE(quarter.hasValue()) << quarter.status().message();
  EXPECT_EQ(quarter->lrScale, 0.25);
  EXPECT_EQ(pushFromWire(push({1, 2, 3, 4}, {}), {2}, 0)->lrScale, 1.0);  // (the default: none)
  for (double bad : {0.0, -0.5, 1.5, std::nan("")}) {
    auto refused = pushFromWire(scaled(bad), {2}, 0);
    ASSERT_FALSE(refused.hasValue()) << bad;
    EXPECT_NE(refused.status().message().find("learning-rate scale"), std::string::npos) << refused.status().message();
  }
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

// compression.push: a push whose gradients travel encoded decodes to the
// floats the codec's decode gives (for int8: within a chunk's step), and an
// encoding the shard cannot read is refused, naming the part.
TEST(PsWire, EncodedPushesDecodeAndBadEncodingsAreRefused) {
  kernels::CodecOptions o;
  o.kind = kernels::CodecKind::kInt8;
  o.chunk = 4;
  auto codec = kernels::makeCodec(o);
  const std::vector<float> grads = {0.5f, -1.0f, 0.25f, 2.0f, -0.125f, 1.5f};  // 3 keys of dim 2
  const std::vector<float> dense = {3.0f, -4.0f};
  std::vector<float> residual(grads.size(), 0.0f), denseResidual(dense.size(), 0.0f);
  auto g = encodePart(grads, codec.get(), residual.data(), 11);
  auto d = encodePart(dense, codec.get(), denseResidual.data(), 11);
  ASSERT_TRUE(g.hasValue() && d.hasValue());
  EXPECT_EQ(g->dtype, transport::DType::kBytes);
  auto wire = acrossProcesses(pushToWire(1, 1, 0, 4, u64({3}), u64({5, 6, 7}), *g, *d));
  auto decoded = decodePush(wire, {2}, 2, codec.get());
  ASSERT_TRUE(decoded.hasValue()) << decoded.status().message();
  auto v = pushFromWire(*decoded, {2}, 2);
  ASSERT_TRUE(v.hasValue()) << v.status().message();
  ASSERT_EQ(v->gradFloats, grads.size());
  ASSERT_EQ(v->denseFloats, dense.size());
  // What was sent plus what the residual kept is the gradient, to the bit.
  for (size_t i = 0; i < grads.size(); ++i) EXPECT_EQ(v->grads[i] + residual[i], grads[i]) << i;
  for (size_t i = 0; i < dense.size(); ++i) EXPECT_EQ(v->denseGrads[i] + denseResidual[i], dense[i]) << i;
  // int8 with chunks of 4: each value within one step (max |x| / 127) of its chunk.
  EXPECT_LE(std::fabs(v->grads[3] - 2.0f), 2.0f / 127 + 1e-6f);
  // A float32 push passes through unchanged, with or without a codec.
  auto plain = pushToWire(1, 2, 0, 4, u64({3}), u64({5, 6, 7}), f32(grads), f32({}));
  ASSERT_TRUE(decodePush(plain, {2}, 2, nullptr).hasValue());
  // An encoded push to a shard without a codec, with another codec, with a
  // cut payload, or claiming other shapes: refused, naming what.
  auto noCodec = decodePush(wire, {2}, 2, nullptr);
  ASSERT_FALSE(noCodec.hasValue());
  EXPECT_NE(noCodec.status().message().find("no codec"), std::string::npos) << noCodec.status().message();
  o.kind = kernels::CodecKind::kOneBit;
  auto other = decodePush(wire, {2}, 2, kernels::makeCodec(o).get());
  ASSERT_FALSE(other.hasValue());
  EXPECT_NE(other.status().message().find("push gradients"), std::string::npos) << other.status().message();
  Tensor cut = *g;
  cut.bytes -= 1;
  EXPECT_FALSE(decodePush(pushToWire(1, 1, 0, 4, u64({3}), u64({5, 6, 7}), cut, *d), {2}, 2, codec.get()).hasValue());
  EXPECT_FALSE(decodePush(pushToWire(1, 1, 0, 4, u64({2}), u64({5, 6}), *g, *d), {2}, 2, codec.get()).hasValue());
  EXPECT_FALSE(decodePush(pushToWire(1, 1, 0, 4, u64({3}), u64({5, 6, 7}), *g, *d), {2}, 3, codec.get()).hasValue());
  // Random bytes where an encoding should be never crash.
  Rng rng(3);
  for (int i = 0; i < 500; ++i) {
    std::vector<uint8_t> junk(rng.next() % 96);
    for (auto& b : junk) b = uint8_t(rng.next());
    if (junk.size() >= 4 && rng.next() % 2) std::memcpy(junk.data(), g->data, 4);  // the magic, sometimes
    Tensor t = Tensor::copyOf(junk.data(), junk.size(), transport::DType::kBytes);
    EXPECT_FALSE(decodePush(pushToWire(1, 1, 0, 4, u64({3}), u64({5, 6, 7}), t, f32({})), {2}, 2, codec.get()).hasValue());
  }
}

// compression.pull: a cast reply part decodes to the weights rounded to
// half precision; float32 parts pass; a part of the wrong length is refused.
TEST(PsWire, CastPullRepliesDecode) {
  kernels::CodecOptions o;
  o.kind = kernels::CodecKind::kBf16;
  auto codec = kernels::makeCodec(o);
  const std::vector<float> rows = {1.0f, 1.00390625f, -3.14159f, 0.0f};
  auto part = encodePart(rows, codec.get(), nullptr, 0);
  ASSERT_TRUE(part.hasValue());
  EXPECT_EQ(part->bytes, kernels::kCodecHeaderBytes + rows.size() * 2);
  auto back = decodePart(*part, rows.size(), codec.get(), "rows");
  ASSERT_TRUE(back.hasValue()) << back.status().message();
  const float* f = back->as<float>();
  EXPECT_EQ(f[0], 1.0f);
  EXPECT_EQ(f[1], 1.0f);  // 1 + 2^-8 rounds to even: 1
  EXPECT_NEAR(f[2], -3.14159f, 3.14159f / 256);
  EXPECT_EQ(f[3], 0.0f);
  EXPECT_FALSE(decodePart(*part, rows.size() + 1, codec.get(), "rows").hasValue());
  EXPECT_FALSE(decodePart(*part, rows.size(), nullptr, "rows").hasValue());
  auto plain = decodePart(f32(rows), rows.size(), nullptr, "rows");
  ASSERT_TRUE(plain.hasValue());
  EXPECT_EQ(plain->dtype, transport::DType::kFloat32);
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
