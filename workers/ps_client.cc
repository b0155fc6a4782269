#include "workers/ps_client.h"

#include <algorithm>
#include <map>
#include <unordered_map>

#include <caf/all.hpp>

#include "ps/shard.h"
#include "ps/wire.h"
#include "common/hash.h"
#include "common/logging.h"
#include "transport/remote_actors.h"

namespace troupe::workers {
namespace {

using transport::DType;
using transport::Tensor;

using reroute_tick_atom = caf::atom_constant<caf::atom("reroute")>;
using Clock = std::chrono::steady_clock;

// One request to one shard, kept until answered so that it can be sent
// again to the shard's new primary (ps.replicas = 2).
struct Token {
  int shard = 0;
  uint64_t id = 0;
  int64_t attempt = 0;
};

struct Call {
  std::function<void(Token)> issue;
  int64_t attempt = 0;
  bool waiting = false;  // its shard went down: waits for a new primary
  Clock::time_point waitingSince;
  std::function<void(const std::string&)> giveUp;
};

// Error feedback of compressed pushes: per table, a residual row for every
// key pushed (what its encodings have not sent yet), and per shard one for
// the dense slice.
struct PushResiduals {
  std::vector<std::unordered_map<uint64_t, size_t>> slot;  // [table] key -> offset in rows[table]
  std::vector<std::vector<float>> rows;                    // [table]
  std::vector<std::vector<float>> dense;                   // [shard]
  int64_t slotCount = 0;  // keys with a residual row, all tables
  int64_t dropped = 0;    // times the rows were dropped for the bound
  void clearRows() {
    for (auto& m : slot) m.clear();
    for (auto& v : rows) v.clear();
    slotCount = 0;
  }
  void clear() {
    clearRows();
    for (auto& v : dense) v.clear();
  }
};

struct PsClientState {
  PsClientOptions options;
  std::unique_ptr<kernels::Codec> pushCodec, pullCodec;
  PushResiduals residuals;
  std::vector<std::map<uint64_t, Call>> calls;  // by shard
  uint64_t nextCall = 0;
  bool ticking = false;
  static inline const char* name = "ps_client";
};

using Self = caf::stateful_actor<PsClientState>;

// The shard's process went (its proxy says so at once). A timeout is not:
// a shard that fails a parked pull says request_timeout itself, naming whom
// it waited for; a stopped primary's requests are sent again when the
// coordinator names its backup.
bool unreachable(const caf::error& err) {
  return err == caf::sec::request_receiver_down || err.category() == transport::kDepartureCategory;
}

// Sends a request to `shard` through `issue` and keeps it until answered.
void startCall(Self* self, int shard, std::function<void(Token)> issue, std::function<void(const std::string&)> giveUp) {
  auto& st = self->state;
  const uint64_t id = st.nextCall++;
  Call& c = st.calls[size_t(shard)][id];
  c.issue = std::move(issue);
  c.attempt = 1;
  c.giveUp = std::move(giveUp);
  c.issue(Token{shard, id, 1});
}

// A reply of the call's latest attempt (true: handle it; the call is done).
bool claim(Self* self, const Token& t) {
  auto& calls = self->state.calls[size_t(t.shard)];
  auto it = calls.find(t.id);
  if (it == calls.end() || it->second.attempt != t.attempt) return false;
  calls.erase(it);
  return true;
}

void askRoutes(Self* self);

// An error of the call's latest attempt: true when the call fails with it;
// false when it is stale, or (replicas) its shard went down and the call
// waits for the shard's new primary.
bool claimError(Self* self, const Token& t, const caf::error& err) {
  auto& st = self->state;
  auto& calls = st.calls[size_t(t.shard)];
  auto it = calls.find(t.id);
  if (it == calls.end() || it->second.attempt != t.attempt) return false;
  if (st.options.replicated && unreachable(err)) {
    if (!it->second.waiting) {
      it->second.waiting = true;
      it->second.waitingSince = Clock::now();
    }
    askRoutes(self);
    return false;
  }
  calls.erase(it);
  return true;
}

// The primaries' nodes: a shard whose primary moved is reached there, and
// what waits on it is sent again.
void applyRoutes(Self* self, const std::vector<int64_t>& nodes) {
  auto& st = self->state;
  auto& o = st.options;
  if (!o.replicated || nodes.size() != o.shards.size() || !o.locate) return;
  for (size_t k = 0; k < nodes.size(); ++k) {
    if (uint64_t(nodes[k]) == o.nodes[k]) continue;
    o.nodes[k] = uint64_t(nodes[k]);
    o.shards[k] = o.locate(o.nodes[k], ps::shardCopyName(int64_t(k)));
    logger("job")->info("worker {}: shard {}'s primary is on node {:x} now; {} requests sent there again", o.worker, k,
                        o.nodes[k], st.calls[k].size());
    std::vector<std::pair<uint64_t, int64_t>> again;
    for (auto& [id, c] : st.calls[k]) {
      c.waiting = false;
      again.emplace_back(id, ++c.attempt);
    }
    for (auto [id, attempt] : again) {
      auto it = st.calls[k].find(id);
      if (it != st.calls[k].end()) it->second.issue(Token{int(k), id, attempt});
    }
  }
}

void askRoutes(Self* self) {
  auto& st = self->state;
  if (!st.options.coordinator) return;
  self->request(st.options.coordinator, std::chrono::seconds(10), ps::routes_atom::value)
      .then([self](const std::vector<int64_t>& nodes) { applyRoutes(self, nodes); }, [](caf::error&) {});
  if (!st.ticking) {
    st.ticking = true;
    self->delayed_send(self, std::chrono::milliseconds(500), reroute_tick_atom::value);
  }
}

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
  self->state.calls.resize(self->state.options.shards.size());
  {
    auto& st = self->state;
    if (st.options.pushCodec.kind != kernels::CodecKind::kNone) st.pushCodec = kernels::makeCodec(st.options.pushCodec);
    if (st.options.pullCodec.kind != kernels::CodecKind::kNone) st.pullCodec = kernels::makeCodec(st.options.pullCodec);
    st.residuals.slot.resize(st.options.dims.size());
    st.residuals.rows.resize(st.options.dims.size());
    st.residuals.dense.resize(st.options.shards.size());
    if (const auto& img = st.options.resumedResiduals) {
      auto& r = st.residuals;
      for (size_t k = 0; k < img->pushDense.size() && k < r.dense.size(); ++k) r.dense[k] = img->pushDense[k];
      for (size_t t = 0; t < img->pushRows.size() && t < r.rows.size(); ++t) {
        const auto& rows = img->pushRows[t];
        for (uint64_t key : rows.keys) r.slot[t].emplace(key, r.slot[t].size() * size_t(st.options.dims[t]));
        r.rows[t] = rows.values;
        r.slotCount += int64_t(rows.keys.size());
      }
      st.options.resumedResiduals.reset();
    }
  }
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
          auto issue = [=](Token t) {
            self->request(self->state.options.shards[size_t(s)], self->state.options.requestTimeout, msg)
              .then(
                  [=](const Tensor& rowsIn, const Tensor& denseIn) {
                    if (!claim(self, t) || gather->failed) return;
                    const kernels::Codec* codec = self->state.pullCodec.get();
                    auto rowsT = ps::decodePart(rowsIn, rowFloats, codec, "pull reply rows");
                    auto denseT = ps::decodePart(denseIn, denseFloats, codec, "pull reply dense");
                    if (!rowsT.hasValue() || !denseT.hasValue()) {
                      return gather->fail(fmt::format(
                          "shard {}: {}", s, (rowsT.hasValue() ? denseT.status() : rowsT.status()).message()));
                    }
                    if (auto& b = self->state.options.bytes) {
                      b->pulls++;
                      if (rowsIn.dtype == DType::kBytes || denseIn.dtype == DType::kBytes) b->pullsCompressed++;
                      b->pullEncoded += rowsIn.bytes + denseIn.bytes;
                      b->pullRaw += (rowFloats + denseFloats) * 4;
                    }
                    auto view = ps::pullReplyFromWire(caf::make_message(*rowsT, *denseT), rowFloats, denseFloats);
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
                  [=](caf::error& err) {
                    if (claimError(self, t, err)) gather->fail(fmt::format("pull from shard {}: {}", s, caf::to_string(err)));
                  });
          };
          startCall(self, s, issue, [gather](const std::string& why) { gather->fail(why); });
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
        const kernels::Codec* codec = req->clock >= o.warmupSteps ? self->state.pushCodec.get() : nullptr;
        if (codec != nullptr && o.maxResidualRows > 0) {
          // The bound, before any row is taken (the offsets taken below
          // must stay valid to the end of this push): if the keys of this
          // push that have no residual row yet would take the rows past
          // it, every leftover row goes first (a bounded loss, logged) and
          // the rows start again.
          auto& r = self->state.residuals;
          int64_t fresh = 0;
          for (size_t t = 0; t < req->keys.size(); ++t) {
            for (uint64_t key : req->keys[t]) fresh += r.slot[t].count(key) ? 0 : 1;
          }
          if (r.slotCount > 0 && r.slotCount + fresh > o.maxResidualRows) {
            ++r.dropped;
            if (r.dropped == 1 || r.dropped % 100 == 0) {  // (the first time, then every 100th)
              logger("job")->info("worker {}: {} residual rows of compressed pushes held and {} more needed; the rows "
                                  "are dropped (compression.residual_rows = {}; {} times so far)",
                                  o.worker, r.slotCount, fresh, o.maxResidualRows, r.dropped);
            }
            r.clearRows();
          }
        }
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
          const size_t keyBytes = (split.keys[size_t(s)].size() + split.counts[size_t(s)].size()) * 8;
          const size_t rawBytes = keyBytes + (grads.size() + dense.size()) * 4;
          Tensor gradsT, denseT;
          if (codec != nullptr) {
            // Error feedback: each key's residual row joins its gradient and
            // keeps what this encoding does not send.
            auto& r = self->state.residuals;
            std::vector<float> res(grads.size());
            std::vector<size_t> back;  // each key's residual offset in rows[table]
            back.reserve(split.origin[size_t(s)].size());
            size_t at = 0;
            for (auto [t, i] : split.origin[size_t(s)]) {
              const size_t dim = size_t(o.dims[t]);
              auto [it, fresh] = r.slot[t].try_emplace(req->keys[t][i], r.rows[t].size());
              r.slotCount += fresh ? 1 : 0;
              if (fresh) r.rows[t].resize(r.rows[t].size() + dim, 0.0f);
              float* stored = r.rows[t].data() + it->second;
              std::copy_n(stored, dim, res.data() + at);
              std::fill_n(stored, dim, 0.0f);  // taken (a key twice in a push: the second takes 0)
              back.push_back(it->second);
              at += dim;
            }
            const uint64_t step = hashCombine(uint64_t(req->clock), uint64_t(o.worker), uint64_t(s));
            auto g = ps::encodePart(std::move(grads), codec, res.data(), step);
            if (!g.hasValue()) {
              gather->fail(fmt::format("push to shard {}: {}", s, g.status().message()));
              return promise;
            }
            at = 0;
            for (size_t k = 0; k < back.size(); ++k) {
              const auto [t, i] = split.origin[size_t(s)][k];
              const size_t dim = size_t(o.dims[t]);
              float* stored = r.rows[t].data() + back[k];
              for (size_t d = 0; d < dim; ++d) stored[d] += res[at + d];
              at += dim;
            }
            gradsT = std::move(*g);
            if (dense.empty()) {
              denseT = Tensor::adopt(std::move(dense), DType::kFloat32);
            } else {
              auto& dr = r.dense[size_t(s)];
              dr.resize(dense.size(), 0.0f);
              auto d = ps::encodePart(std::move(dense), codec, dr.data(), step);
              if (!d.hasValue()) {
                gather->fail(fmt::format("push to shard {}: {}", s, d.status().message()));
                return promise;
              }
              denseT = std::move(*d);
            }
          } else {
            gradsT = Tensor::adopt(std::move(grads), DType::kFloat32);
            denseT = Tensor::adopt(std::move(dense), DType::kFloat32);
          }
          if (auto& b = o.bytes) {
            b->pushEncoded += keyBytes + gradsT.bytes + denseT.bytes;
            b->pushRaw += rawBytes;
          }
          caf::message msg = ps::pushToWire(o.worker, sequence, req->clock, req->samples,
                                            Tensor::adopt(std::move(split.counts[size_t(s)]), DType::kUInt64),
                                            Tensor::adopt(std::move(split.keys[size_t(s)]), DType::kUInt64),
                                            std::move(gradsT), std::move(denseT), o.generation, req->lrScale);
          auto issue = [=](Token t) {
            self->request(self->state.options.shards[size_t(s)], self->state.options.requestTimeout, msg)
                .then(
                    [=](int64_t) {
                      if (claim(self, t) && gather->arrived()) gather->promise.deliver(sequence);
                    },
                    [=](caf::error& err) {
                      if (claimError(self, t, err)) gather->fail(fmt::format("push to shard {}: {}", s, caf::to_string(err)));
                    });
          };
          startCall(self, s, issue, [gather](const std::string& why) { gather->fail(why); });
        }
        if (auto& b = o.bytes) {
          b->pushes++;
          if (codec != nullptr) b->pushesCompressed++;
        }
        return promise;
      },
      [=](ps::route_atom, const std::vector<int64_t>& nodes) { applyRoutes(self, nodes); },
      [=](reroute_tick_atom) {
        // Calls waiting for a new primary: ask again, or give up.
        auto& st = self->state;
        st.ticking = false;
        bool waiting = false;
        const auto now = Clock::now();
        for (size_t k = 0; k < st.calls.size(); ++k) {
          std::vector<std::function<void(const std::string&)>> expired;
          for (auto it = st.calls[k].begin(); it != st.calls[k].end();) {
            if (it->second.waiting && now - it->second.waitingSince >= st.options.rerouteTimeout) {
              expired.push_back(std::move(it->second.giveUp));
              it = st.calls[k].erase(it);
              continue;
            }
            waiting = waiting || it->second.waiting;
            ++it;
          }
          for (auto& f : expired) {
            f(fmt::format("shard {} went down and no new primary was named within {} s", k,
                          st.options.rerouteTimeout.count()));
          }
        }
        if (waiting) askRoutes(self);
      },
      [=](residuals_atom) -> ResidualImagePtr {
        const auto& r = self->state.residuals;
        const auto& dims = self->state.options.dims;
        auto img = std::make_shared<ResidualImage>();
        if (self->state.pushCodec) {
          img->pushCodec = uint8_t(self->state.pushCodec->kind());
          img->pushDense = r.dense;
          img->pushRows.resize(r.rows.size());
          for (size_t t = 0; t < r.rows.size(); ++t) {
            auto& out = img->pushRows[t];
            const size_t dim = size_t(dims[t]);
            out.keys.reserve(r.slot[t].size());
            out.values.reserve(r.slot[t].size() * dim);
            for (const auto& [key, at] : r.slot[t]) {
              out.keys.push_back(key);
              out.values.insert(out.values.end(), r.rows[t].begin() + int64_t(at), r.rows[t].begin() + int64_t(at + dim));
            }
          }
        }
        return img;
      },
      [=](ps::generation_atom, int64_t generation) -> int64_t {
        self->state.options.generation = generation;
        // The shards moved on (a rollback, or a hybrid step undone): what
        // the residuals held back of pushes now undone must not be sent
        // again with the steps redone.
        self->state.residuals.clear();
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
        for (int s = 0; s < int(o.shards.size()); ++s) {
          auto issue = [=](Token t) {
            auto& o = self->state.options;
            self->request(o.shards[size_t(s)], o.requestTimeout, ps::leave_atom::value, o.worker, o.generation)
                .then(
                    [=](int64_t worker) {
                      if (claim(self, t) && gather->arrived()) gather->promise.deliver(worker);
                    },
                    [=](caf::error& err) {
                      if (claimError(self, t, err)) gather->fail(fmt::format("leave at shard {}: {}", s, caf::to_string(err)));
                    });
          };
          startCall(self, s, issue, [gather](const std::string& why) { gather->fail(why); });
        }
        return promise;
      },
  };
}

}  // namespace

caf::actor spawnPsClient(caf::actor_system& system, const PsClientOptions& options) {
  PsClientOptions o = options;
  o.nodes.resize(o.shards.size(), 0);
  return system.spawn(psClient, o);
}

}  // namespace troupe::workers
