#include "ps/wire.h"

#include <caf/make_message.hpp>
#include <caf/message.hpp>

namespace troupe::ps {
namespace {

using transport::DType;
using transport::Tensor;

template <class T>
Status typed(const Tensor& t, DType dtype, const char* what) {
  if (t.dtype != dtype || t.bytes % sizeof(T) != 0) {
    return Status::corruption(fmt::format("{}: dtype {} and {} bytes (want dtype {}, whole elements of {} bytes)",
                                          what, int(t.dtype), t.bytes, int(dtype), sizeof(T)));
  }
  return Status::ok();
}

// Checks counts against the tables and the keys; returns the row floats.
Expected<size_t> checkCounts(const Tensor& counts, const Tensor& keys, const std::vector<int64_t>& dims,
                             const char* what) {
  if (Status s = typed<uint64_t>(counts, DType::kUInt64, "key counts"); !s.isOk()) return s;
  if (Status s = typed<uint64_t>(keys, DType::kUInt64, "keys"); !s.isOk()) return s;
  const size_t tables = counts.count<uint64_t>();
  if (tables != dims.size() || tables > kMaxWireTables) {
    return Status::corruption(fmt::format("{}: {} key counts for {} tables", what, tables, dims.size()));
  }
  const uint64_t* c = counts.as<uint64_t>();
  const uint64_t n = keys.count<uint64_t>();
  uint64_t total = 0;
  size_t floats = 0;
  for (size_t t = 0; t < tables; ++t) {
    if (c[t] > n - total) {
      return Status::corruption(fmt::format("{}: table {} claims {} keys, {} are left", what, t, c[t], n - total));
    }
    total += c[t];
    floats += size_t(c[t]) * size_t(dims[t]);
  }
  if (total != n) return Status::corruption(fmt::format("{}: {} keys beyond the counts", what, n - total));
  return floats;
}

}  // namespace

caf::message pullToWire(int64_t worker, int64_t step, bool create, bool dense, Tensor counts, Tensor keys,
                        int64_t generation) {
  return caf::make_message(pull_atom::value, worker, step, create, dense, std::move(counts), std::move(keys),
                           generation);
}

caf::message pushToWire(int64_t worker, int64_t sequence, int64_t step, int64_t samples, Tensor counts, Tensor keys,
                        Tensor grads, Tensor denseGrads, int64_t generation, double lrScale) {
  return caf::make_message(push_atom::value, worker, sequence, step, samples, std::move(counts), std::move(keys),
                           std::move(grads), std::move(denseGrads), generation, lrScale);
}

caf::message pullReplyToWire(Tensor rows, Tensor dense) { return caf::make_message(std::move(rows), std::move(dense)); }

Expected<PullView> pullFromWire(const caf::message& msg, const std::vector<int64_t>& dims) {
  if (!msg.match_elements<pull_atom, int64_t, int64_t, bool, bool, Tensor, Tensor, int64_t>()) {
    return Status::corruption(fmt::format("not a pull: {}", caf::to_string(msg)));
  }
  const Tensor& counts = msg.get_as<Tensor>(5);
  const Tensor& keys = msg.get_as<Tensor>(6);
  auto floats = checkCounts(counts, keys, dims, "pull");
  if (!floats.hasValue()) return floats.status();
  PullView v;
  v.worker = msg.get_as<int64_t>(1);
  v.step = msg.get_as<int64_t>(2);
  v.create = msg.get_as<bool>(3);
  v.dense = msg.get_as<bool>(4);
  v.counts = counts.as<uint64_t>();
  v.keys = keys.as<uint64_t>();
  v.keyCount = keys.count<uint64_t>();
  v.rowFloats = *floats;
  v.generation = msg.get_as<int64_t>(7);
  return v;
}

Expected<PushView> pushFromWire(const caf::message& msg, const std::vector<int64_t>& dims, size_t denseSlice) {
  if (!msg.match_elements<push_atom, int64_t, int64_t, int64_t, int64_t, Tensor, Tensor, Tensor, Tensor, int64_t, double>()) {
    return Status::corruption(fmt::format("not a push: {}", caf::to_string(msg)));
  }
  const Tensor& counts = msg.get_as<Tensor>(5);
  const Tensor& keys = msg.get_as<Tensor>(6);
  const Tensor& grads = msg.get_as<Tensor>(7);
  const Tensor& dense = msg.get_as<Tensor>(8);
  if (msg.get_as<int64_t>(4) < 0) return Status::corruption(fmt::format("push of {} samples", msg.get_as<int64_t>(4)));
  auto floats = checkCounts(counts, keys, dims, "push");
  if (!floats.hasValue()) return floats.status();
  if (Status s = typed<float>(grads, DType::kFloat32, "push gradients"); !s.isOk()) return s;
  if (Status s = typed<float>(dense, DType::kFloat32, "push dense gradients"); !s.isOk()) return s;
  if (grads.count<float>() != *floats) {
    return Status::corruption(
        fmt::format("push: {} gradient floats for keys that need {}", grads.count<float>(), *floats));
  }
  if (dense.count<float>() != 0 && dense.count<float>() != denseSlice) {
    return Status::corruption(
        fmt::format("push: {} dense gradient floats, the dense slice has {}", dense.count<float>(), denseSlice));
  }
  PushView v;
  v.worker = msg.get_as<int64_t>(1);
  v.sequence = msg.get_as<int64_t>(2);
  v.step = msg.get_as<int64_t>(3);
  v.samples = msg.get_as<int64_t>(4);
  v.counts = counts.as<uint64_t>();
  v.keys = keys.as<uint64_t>();
  v.keyCount = keys.count<uint64_t>();
  v.grads = grads.as<float>();
  v.gradFloats = grads.count<float>();
  v.denseGrads = dense.count<float>() ? dense.as<float>() : nullptr;
  v.denseFloats = dense.count<float>();
  v.generation = msg.get_as<int64_t>(9);
  v.lrScale = msg.get_as<double>(10);
  if (!(v.lrScale > 0 && v.lrScale <= 1)) {
    return Status::corruption(fmt::format("push: learning-rate scale {} (it must be in (0, 1])", v.lrScale));
  }
  return v;
}

Expected<Tensor> encodePart(const float* values, size_t floats, const kernels::Codec* codec, float* residual,
                            uint64_t step) {
  if (codec == nullptr || codec->kind() == kernels::CodecKind::kNone) {
    return Tensor::copyOf(values, uint64_t(floats) * sizeof(float), DType::kFloat32);
  }
  if (floats > UINT32_MAX) {
    return Status::invalidArgument(fmt::format("{} values in one part: more than an encoding holds (2^32 - 1)", floats));
  }
  std::vector<std::byte> out;
  Status s = codec->encode(values, int64_t(floats), residual, step, &out);
  if (!s.isOk()) return s;
  return Tensor::adopt(std::move(out), DType::kBytes);
}

Expected<Tensor> encodePart(std::vector<float> values, const kernels::Codec* codec, float* residual, uint64_t step) {
  if (codec == nullptr || codec->kind() == kernels::CodecKind::kNone) {
    return Tensor::adopt(std::move(values), DType::kFloat32);
  }
  return encodePart(values.data(), values.size(), codec, residual, step);
}

Expected<Tensor> decodePart(const Tensor& part, size_t floats, const kernels::Codec* codec, const char* what) {
  if (part.dtype != DType::kBytes) return part;
  if (codec == nullptr || codec->kind() == kernels::CodecKind::kNone) {
    return Status::corruption(fmt::format("{}: encoded ({} bytes), and this path has no codec", what, part.bytes));
  }
  std::vector<float> out(floats);
  Status s = codec->decode(part.data, part.bytes, int64_t(floats), out.data(), false);
  if (!s.isOk()) return Status::corruption(fmt::format("{}: {}", what, s.message()));
  return Tensor::adopt(std::move(out), DType::kFloat32);
}

Expected<caf::message> decodePush(const caf::message& msg, const std::vector<int64_t>& dims, size_t denseSlice,
                                  const kernels::Codec* codec) {
  if (!msg.match_elements<push_atom, int64_t, int64_t, int64_t, int64_t, Tensor, Tensor, Tensor, Tensor, int64_t, double>()) {
    return msg;  // pushFromWire says what is wrong
  }
  const Tensor& grads = msg.get_as<Tensor>(7);
  const Tensor& dense = msg.get_as<Tensor>(8);
  if (grads.dtype != DType::kBytes && dense.dtype != DType::kBytes) return msg;
  auto floats = checkCounts(msg.get_as<Tensor>(5), msg.get_as<Tensor>(6), dims, "push");
  if (!floats.hasValue()) return floats.status();
  auto g = decodePart(grads, *floats, codec, "push gradients");
  if (!g.hasValue()) return g.status();
  auto d = decodePart(dense, denseSlice, codec, "push dense gradients");
  if (!d.hasValue()) return d.status();
  return caf::make_message(push_atom::value, msg.get_as<int64_t>(1), msg.get_as<int64_t>(2), msg.get_as<int64_t>(3),
                           msg.get_as<int64_t>(4), msg.get_as<Tensor>(5), msg.get_as<Tensor>(6), std::move(*g),
                           std::move(*d), msg.get_as<int64_t>(9), msg.get_as<double>(10));
}

Expected<PullReplyView> pullReplyFromWire(const caf::message& msg, size_t rowFloats, size_t denseFloats) {
  if (!msg.match_elements<Tensor, Tensor>()) {
    return Status::corruption(fmt::format("not a pull reply: {}", caf::to_string(msg)));
  }
  const Tensor& rows = msg.get_as<Tensor>(0);
  const Tensor& dense = msg.get_as<Tensor>(1);
  if (Status s = typed<float>(rows, DType::kFloat32, "pull reply rows"); !s.isOk()) return s;
  if (Status s = typed<float>(dense, DType::kFloat32, "pull reply dense"); !s.isOk()) return s;
  if (rows.count<float>() != rowFloats || dense.count<float>() != denseFloats) {
    return Status::corruption(fmt::format("pull reply: {} row floats and {} dense floats, asked for {} and {}",
                                          rows.count<float>(), dense.count<float>(), rowFloats, denseFloats));
  }
  return PullReplyView{rows.as<float>(), rows.count<float>(), dense.as<float>(), dense.count<float>()};
}

}  // namespace troupe::ps
