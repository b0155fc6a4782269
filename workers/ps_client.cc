#include "workers/ps_client.h"

#include <algorithm>

#include <caf/all.hpp>

#include "ps/shard.h"
#include "ps/wire.h"

namespace troupe::workers {
namespace {

using transport::DType;
using transport::Tensor;

struct PsClientState {
  PsClientOptions options;
  static inline const char* name = "ps_client";
};

using Self = caf::stateful_actor<PsClientState>;

// Where each key of a request goes: per shard, the (table, index) of its keys.
struct Split {
  std::vector<std::vector<uint64_t>> counts;  // [shard][table]
  std::vector<std::vector<uint64_t>> keys;    // [shard]
  std::vector<std::vector<std::pair<uint32_t, uint32_t>>> origin;  // [shard] -> (table, index)
};

Split splitKeys(const std::vector<std::vector<uint64_t>>& keys, int shards) {
  Split s;
  s.counts.assign(size_t(shards), std::vector<uint64_t>(keys.size(), 0));
  s.keys.resize(size_t(shards));
  s.origin.resize(size_t(shards));
  for (size_t t = 0; t < keys.size(); ++t) {
    for (size_t i = 0; i < keys[t].size(); ++i) {
      const int shard = ps::shardOfKey(keys[t][i], shards);
      ++s.counts[size_t(shard)][t];
      s.keys[size_t(shard)].push_back(keys[t][i]);
      s.origin[size_t(shard)].emplace_back(uint32_t(t), uint32_t(i));
    }
  }
  return s;
}

// One request fanned out to every shard: answered once, with the first
// failure or when the last reply is in.
template <class Promise>
struct Gather {
  Gather(Promise p, int shards) : promise(std::move(p)), left(shards) {}
  // Counts a reply; true when it was the last one and nothing failed.
  bool arrived() { return !failed && --left == 0; }
  void fail(std::string what) {
    if (failed) return;
    failed = true;
    promise.deliver(caf::make_error(caf::sec::runtime_error, std::move(what)));
  }
  Promise promise;
  int left;
  bool failed = false;
};

template <class Promise>
std::shared_ptr<Gather<Promise>> gatherOf(Promise promise, size_t shards) {
  return std::make_shared<Gather<Promise>>(std::move(promise), int(shards));
}

caf::behavior psClient(Self* self, PsClientOptions options) {
  self->state.options = std::move(options);
  self->set_error_handler([](caf::error&) {});  // a stray error must not stop the client
  return {
      [=](ps::pull_atom, const ps::PullRequestPtr& req) -> caf::typed_response_promise<ps::PullReplyPtr> {
        auto& o = self->state.options;
        auto promise = self->make_response_promise<ps::PullReplyPtr>();
        const int shards = int(o.shards.size());
        if (req->keys.size() != o.dims.size()) {
          promise.deliver(caf::make_error(caf::sec::invalid_argument,
                                          fmt::format("pull: {} key lists for {} tables", req->keys.size(),
                                                      o.dims.size())));
          return promise;
        }
        auto split = std::make_shared<Split>(splitKeys(req->keys, shards));
        auto reply = std::make_shared<ps::PullReply>();
        reply->rows.resize(req->keys.size());
        for (size_t t = 0; t < req->keys.size(); ++t) reply->rows[t].resize(req->keys[t].size() * size_t(o.dims[t]));
        if (req->dense) reply->dense.resize(size_t(o.denseSize));
        auto gather = gatherOf(promise, o.shards.size());
        for (int s = 0; s < shards; ++s) {
          size_t rowFloats = 0;
          for (size_t t = 0; t < o.dims.size(); ++t) rowFloats += split->counts[size_t(s)][t] * size_t(o.dims[t]);
          const auto slice = ps::denseSlice(o.denseSize, s, shards);
          const int64_t begin = slice.first;
          const size_t denseFloats = req->dense ? size_t(slice.second - slice.first) : 0;
          caf::message msg =
              ps::pullToWire(o.worker, req->step, req->create, req->dense,
                             Tensor::adopt(std::move(split->counts[size_t(s)]), DType::kUInt64),
                             Tensor::adopt(std::move(split->keys[size_t(s)]), DType::kUInt64), o.generation);
          self->request(o.shards[size_t(s)], o.requestTimeout, std::move(msg))
              .then(
                  [=](const Tensor& rowsT, const Tensor& denseT) {
                    if (gather->failed) return;
                    auto view = ps::pullReplyFromWire(caf::make_message(rowsT, denseT), rowFloats, denseFloats);
                    if (!view.hasValue()) return gather->fail(fmt::format("shard {}: {}", s, view.status().message()));
                    const auto& dims = self->state.options.dims;
                    const float* src = view->rows;
                    for (auto [t, i] : split->origin[size_t(s)]) {
                      const int64_t dim = dims[t];
                      std::copy_n(src, dim, reply->rows[t].data() + int64_t(i) * dim);
                      src += dim;
                    }
                    if (denseFloats) std::copy_n(view->dense, denseFloats, reply->dense.data() + begin);
                    if (gather->arrived()) gather->promise.deliver(ps::PullReplyPtr(reply));
                  },
                  [=](caf::error& err) { gather->fail(fmt::format("pull from shard {}: {}", s, caf::to_string(err))); });
        }
        return promise;
      },
      [=](ps::push_atom, const ps::PushRequestPtr& req) -> caf::typed_response_promise<int64_t> {
        auto& o = self->state.options;
        auto promise = self->make_response_promise<int64_t>();
        const int shards = int(o.shards.size());
        if (req->keys.size() != o.dims.size() || req->grads.size() != o.dims.size()) {
          promise.deliver(caf::make_error(caf::sec::invalid_argument, "push: key and gradient lists do not match the tables"));
          return promise;
        }
        Split split = splitKeys(req->keys, shards);
        auto gather = gatherOf(promise, o.shards.size());
        const int64_t sequence = req->sequence;
        for (int s = 0; s < shards; ++s) {
          std::vector<float> grads;
          for (auto [t, i] : split.origin[size_t(s)]) {
            const int64_t dim = o.dims[t];
            const float* g = req->grads[t].data() + int64_t(i) * dim;
            grads.insert(grads.end(), g, g + dim);
          }
          std::vector<float> dense;
          if (!req->denseGrads.empty()) {
            const auto slice = ps::denseSlice(o.denseSize, s, shards);
            dense.assign(req->denseGrads.begin() + slice.first, req->denseGrads.begin() + slice.second);
          }
          caf::message msg = ps::pushToWire(o.worker, sequence, req->clock, req->samples,
                                            Tensor::adopt(std::move(split.counts[size_t(s)]), DType::kUInt64),
                                            Tensor::adopt(std::move(split.keys[size_t(s)]), DType::kUInt64),
                                            Tensor::adopt(std::move(grads), DType::kFloat32),
                                            Tensor::adopt(std::move(dense), DType::kFloat32), o.generation);
          self->request(o.shards[size_t(s)], o.requestTimeout, std::move(msg))
              .then(
                  [=](int64_t) {
                    if (gather->arrived()) gather->promise.deliver(sequence);
                  },
                  [=](caf::error& err) { gather->fail(fmt::format("push to shard {}: {}", s, caf::to_string(err))); });
        }
        return promise;
      },
      [=](ps::generation_atom, int64_t generation) -> int64_t {
        self->state.options.generation = generation;
        return generation;
      },
      [=](ps::leave_atom) -> caf::typed_response_promise<int64_t> {
        auto& o = self->state.options;
        auto promise = self->make_response_promise<int64_t>();
        if (o.shards.empty()) {
          promise.deliver(o.worker);
          return promise;
        }
        auto gather = gatherOf(promise, o.shards.size());
        for (const auto& shard : o.shards) {
          self->request(shard, o.requestTimeout, ps::leave_atom::value, o.worker, o.generation)
              .then(
                  [=](int64_t worker) {
                    if (gather->arrived()) gather->promise.deliver(worker);
                  },
                  [=](caf::error& err) { gather->fail(fmt::format("leave at a shard: {}", caf::to_string(err))); });
        }
        return promise;
      },
  };
}

}  // namespace

caf::actor spawnPsClient(caf::actor_system& system, const PsClientOptions& options) {
  return system.spawn(psClient, options);
}

}  // namespace troupe::workers
