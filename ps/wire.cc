#include "ps/wire.h"

#include <algorithm>
#include <cstring>

#include <caf/make_message.hpp>
#include <caf/message.hpp>

#include "transport/tensor.h"

namespace troupe::ps {
namespace {

using transport::DType;
using transport::Tensor;

template <class T>
Tensor tensorOf(const std::vector<T>& v, DType dtype) {
  return Tensor::copyOf(v.data(), v.size() * sizeof(T), dtype);
}

// Flattens per-table lists into (counts, values).
template <class T>
std::pair<std::vector<uint64_t>, std::vector<T>> flatten(const std::vector<std::vector<T>>& lists) {
  std::vector<uint64_t> counts;
  std::vector<T> values;
  size_t total = 0;
  for (const auto& l : lists) total += l.size();
  values.reserve(total);
  for (const auto& l : lists) {
    counts.push_back(l.size());
    values.insert(values.end(), l.begin(), l.end());
  }
  return {std::move(counts), std::move(values)};
}

template <class T>
Expected<std::vector<T>> valuesOf(const Tensor& t, DType dtype, const char* what) {
  if (t.dtype != dtype || t.bytes % sizeof(T) != 0) {
    return Status::corruption(fmt::format("{}: dtype {} and {} bytes (want dtype {}, whole elements of {} bytes)", what,
                                          int(t.dtype), t.bytes, int(dtype), sizeof(T)));
  }
  std::vector<T> out(t.bytes / sizeof(T));
  if (t.bytes) std::memcpy(out.data(), t.data, t.bytes);
  return out;
}

// Splits `values` by `counts`; each count times `width` values.
template <class T>
Expected<std::vector<std::vector<T>>> split(const std::vector<uint64_t>& counts, const std::vector<T>& values,
                                             const std::vector<uint64_t>& widths, const char* what) {
  if (counts.size() > kMaxWireTables) {
    return Status::corruption(fmt::format("{}: {} tables (at most {})", what, counts.size(), kMaxWireTables));
  }
  std::vector<std::vector<T>> out(counts.size());
  uint64_t at = 0;
  for (size_t t = 0; t < counts.size(); ++t) {
    const uint64_t width = widths.empty() ? 1 : widths[t];
    if (width != 0 && counts[t] > (values.size() - at) / width) {
      return Status::corruption(
          fmt::format("{}: table {} claims {} x {} values, {} are left", what, t, counts[t], width, values.size() - at));
    }
    const uint64_t n = counts[t] * width;
    out[t].assign(values.begin() + int64_t(at), values.begin() + int64_t(at + n));
    at += n;
  }
  if (at != values.size()) {
    return Status::corruption(fmt::format("{}: {} values beyond the counts", what, values.size() - at));
  }
  return out;
}

}  // namespace

caf::message pullToWire(const PullRequest& request) {
  auto [counts, keys] = flatten(request.keys);
  return caf::make_message(pull_atom::value, request.create, tensorOf(counts, DType::kUInt64),
                           tensorOf(keys, DType::kUInt64));
}

caf::message pullReplyToWire(const PullReply& reply) {
  auto [counts, rows] = flatten(reply.rows);
  return caf::make_message(tensorOf(counts, DType::kUInt64), tensorOf(rows, DType::kFloat32));
}

caf::message pushToWire(const PushRequest& request) {
  auto [keyCounts, keys] = flatten(request.keys);
  auto [gradCounts, grads] = flatten(request.grads);
  return caf::make_message(push_atom::value, request.worker, request.sequence, request.step,
                           tensorOf(keyCounts, DType::kUInt64), tensorOf(keys, DType::kUInt64),
                           tensorOf(gradCounts, DType::kUInt64), tensorOf(grads, DType::kFloat32));
}

Expected<PullRequest> pullFromWire(const caf::message& msg) {
  if (!msg.match_elements<pull_atom, bool, Tensor, Tensor>()) {
    return Status::corruption(fmt::format("not a pull: {}", caf::to_string(msg)));
  }
  auto counts = valuesOf<uint64_t>(msg.get_as<Tensor>(2), DType::kUInt64, "pull key counts");
  if (!counts.hasValue()) return counts.status();
  auto keys = valuesOf<uint64_t>(msg.get_as<Tensor>(3), DType::kUInt64, "pull keys");
  if (!keys.hasValue()) return keys.status();
  auto lists = split(*counts, *keys, {}, "pull");
  if (!lists.hasValue()) return lists.status();
  PullRequest out;
  out.create = msg.get_as<bool>(1);
  out.keys = std::move(*lists);
  return out;
}

Expected<PullReply> pullReplyFromWire(const caf::message& msg) {
  if (!msg.match_elements<Tensor, Tensor>()) {
    return Status::corruption(fmt::format("not a pull reply: {}", caf::to_string(msg)));
  }
  auto counts = valuesOf<uint64_t>(msg.get_as<Tensor>(0), DType::kUInt64, "pull reply counts");
  if (!counts.hasValue()) return counts.status();
  auto rows = valuesOf<float>(msg.get_as<Tensor>(1), DType::kFloat32, "pull reply rows");
  if (!rows.hasValue()) return rows.status();
  auto lists = split(*counts, *rows, {}, "pull reply");
  if (!lists.hasValue()) return lists.status();
  PullReply out;
  out.rows = std::move(*lists);
  return out;
}

Expected<PushRequest> pushFromWire(const caf::message& msg, const std::vector<int>& dims) {
  if (!msg.match_elements<push_atom, int64_t, int64_t, int64_t, Tensor, Tensor, Tensor, Tensor>()) {
    return Status::corruption(fmt::format("not a push: {}", caf::to_string(msg)));
  }
  auto keyCounts = valuesOf<uint64_t>(msg.get_as<Tensor>(4), DType::kUInt64, "push key counts");
  if (!keyCounts.hasValue()) return keyCounts.status();
  auto keys = valuesOf<uint64_t>(msg.get_as<Tensor>(5), DType::kUInt64, "push keys");
  if (!keys.hasValue()) return keys.status();
  auto gradCounts = valuesOf<uint64_t>(msg.get_as<Tensor>(6), DType::kUInt64, "push gradient counts");
  if (!gradCounts.hasValue()) return gradCounts.status();
  auto grads = valuesOf<float>(msg.get_as<Tensor>(7), DType::kFloat32, "push gradients");
  if (!grads.hasValue()) return grads.status();
  if (gradCounts->size() != keyCounts->size()) {
    return Status::corruption(fmt::format("push: {} key lists but {} gradient lists", keyCounts->size(),
                                          gradCounts->size()));
  }
  if (!dims.empty() && dims.size() != keyCounts->size()) {
    return Status::corruption(fmt::format("push for {} tables, the shard has {}", keyCounts->size(), dims.size()));
  }
  for (size_t t = 0; t < keyCounts->size(); ++t) {
    const uint64_t k = (*keyCounts)[t], g = (*gradCounts)[t];
    const uint64_t d = dims.empty() ? 0 : uint64_t(std::max(dims[t], 0));
    const bool consistent = dims.empty() ? (k == 0 ? g == 0 : g % k == 0) : (d > 0 && g % d == 0 && g / d == k);
    if (!consistent) {
      return Status::corruption(fmt::format("push: table {} has {} keys and {} gradient floats{}", t, k, g,
                                            dims.empty() ? "" : fmt::format(" (dim {})", dims[t])));
    }
  }
  auto keyLists = split(*keyCounts, *keys, {}, "push keys");
  if (!keyLists.hasValue()) return keyLists.status();
  auto gradLists = split(*gradCounts, *grads, {}, "push gradients");
  if (!gradLists.hasValue()) return gradLists.status();
  PushRequest out;
  out.worker = msg.get_as<int64_t>(1);
  out.sequence = msg.get_as<int64_t>(2);
  out.step = msg.get_as<int64_t>(3);
  out.keys = std::move(*keyLists);
  out.grads = std::move(*gradLists);
  return out;
}

}  // namespace troupe::ps
