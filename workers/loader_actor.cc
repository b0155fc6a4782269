#include "workers/loader_actor.h"

#include <deque>

#include <caf/all.hpp>

#include "workers/messages.h"

namespace troupe::workers {
namespace {

struct LoaderState {
  std::shared_ptr<BatchSource> source;
  std::deque<BatchPtr> ready;
  bool ended = false;
  Status failure;
  int prefetch = 2;
  static inline const char* name = "loader";

  void readOne() {
    if (ended || !failure.isOk()) return;
    auto b = source->next();
    if (!b.hasValue()) {
      failure = b.status();
    } else if (!*b) {
      ended = true;
    } else {
      ready.push_back(std::move(*b));
    }
  }
  void fill() {
    while (int(ready.size()) < prefetch && !ended && failure.isOk()) readOne();
  }
};

caf::behavior loader(caf::stateful_actor<LoaderState>* self, std::shared_ptr<BatchSource> source, int prefetch) {
  self->state.source = std::move(source);
  self->state.prefetch = prefetch < 1 ? 1 : prefetch;
  return {
      [=](epoch_atom, int64_t epoch) -> caf::result<int64_t> {
        auto& st = self->state;
        st.ready.clear();
        st.ended = false;
        Status s = st.source->startEpoch(epoch);
        if (!s.isOk()) return caf::make_error(caf::sec::runtime_error, s.toString());
        st.failure = Status::ok();
        st.readOne();
        return st.source->rowsPerEpoch();
      },
      [=](share_atom, int64_t epoch, int64_t fromBatch, int64_t part, int64_t parts) -> caf::result<int64_t> {
        auto& st = self->state;
        Status s = st.source->reshare(epoch, fromBatch, part, parts);
        if (!s.isOk()) return caf::make_error(caf::sec::runtime_error, s.toString());
        st.ready.clear();  // read under the old division; the next epoch_atom starts over
        st.ended = true;
        return int64_t{0};
      },
      [=](next_atom) {
        auto& st = self->state;
        auto rp = self->make_response_promise<BatchPtr>();
        if (st.ready.empty()) st.readOne();
        if (!st.ready.empty()) {
          rp.deliver(st.ready.front());
          st.ready.pop_front();
        } else if (!st.failure.isOk()) {
          rp.deliver(caf::make_error(caf::sec::runtime_error, st.failure.toString()));
          return;
        } else {
          rp.deliver(BatchPtr());
        }
        st.fill();  // read ahead while the worker computes
      },
  };
}

}  // namespace

caf::actor spawnLoader(caf::actor_system& system, std::shared_ptr<BatchSource> source, int prefetch) {
  return system.spawn<caf::detached>(loader, std::move(source), prefetch);
}

}  // namespace troupe::workers
