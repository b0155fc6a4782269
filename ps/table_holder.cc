#include "ps/table_holder.h"

#include <map>
#include <memory>

#include <caf/all.hpp>

#include "common/logging.h"
#include "kernels/kernels.h"
#include "ps/applied_window.h"
#include "ps/messages.h"
#include "ps/wire.h"
#include "ps/table_set.h"

namespace troupe::ps {
namespace {

struct TableHolderState {
  TableHolderOptions options;
  std::unique_ptr<TableSet> tables;
  std::vector<uint64_t> counts, keys;  // scratch: a request flattened
  std::vector<float> grads;
  std::shared_ptr<kernels::Kernels> kernels;
  std::map<int64_t, AppliedWindow> applied;  // per worker
  static inline const char* name = "table_holder";
};

caf::error invalid(std::string what) {
  return caf::make_error(caf::sec::invalid_argument, std::move(what));
}

caf::behavior tableHolder(caf::stateful_actor<TableHolderState>* self, TableHolderOptions options) {
  self->state.options = options;
  self->state.tables = std::make_unique<TableSet>(options.tables);
  self->state.kernels = options.kernels ? options.kernels
                                        : std::shared_ptr<kernels::Kernels>(
                                              kernels::createKernels({kernels::Device::kCpu, options.threads}));
  return {
      [=](pull_atom, const PullRequestPtr& req) -> caf::result<PullReplyPtr> {
        TableSet& tables = *self->state.tables;
        if (!req || req->keys.size() != tables.size()) {
          return invalid(fmt::format("pull: {} key lists for {} tables", req ? req->keys.size() : 0, tables.size()));
        }
        auto reply = std::make_shared<PullReply>();
        reply->rows.resize(tables.size());
        for (size_t t = 0; t < tables.size(); ++t) reply->rows[t].resize(req->keys[t].size() * size_t(tables.dims()[t]));
        // The tables side by side (each one's rows found, or created, in its own map).
        self->state.kernels->forEachIndependent(int64_t(tables.size()), [&](int64_t i) {
          const size_t t = size_t(i);
          const auto& keys = req->keys[t];
          // (remembered: the worker's push of these keys finds their rows)
          tables.pullTable(t, keys.data(), int64_t(keys.size()), req->create, reply->rows[t].data(), true);
        });
        return PullReplyPtr(std::move(reply));
      },
      [=](push_atom, const PushRequestPtr& req) -> caf::result<int64_t> {
        auto& st = self->state;
        TableSet& tables = *st.tables;
        if (!req || req->keys.size() != tables.size() || req->grads.size() != tables.size()) {
          return invalid("push: the key and gradient lists do not match the tables");
        }
        for (size_t t = 0; t < tables.size(); ++t) {
          if (req->grads[t].size() != req->keys[t].size() * size_t(tables.dims()[t])) {
            return invalid(fmt::format("push: table {} has {} keys but {} gradient floats (dim {})", t,
                                       req->keys[t].size(), req->grads[t].size(), tables.dims()[t]));
          }
        }
        AppliedWindow& applied = st.applied[req->worker];
        if (applied.contains(req->sequence)) return req->sequence;  // a duplicate: applied already
        if (!applied.acceptable(req->sequence)) {
          return invalid(fmt::format("push {} of worker {}, whose oldest unapplied push is {}", req->sequence,
                                     req->worker, applied.floor()));
        }
        st.counts.clear();
        st.keys.clear();
        st.grads.clear();
        for (size_t t = 0; t < tables.size(); ++t) {
          st.counts.push_back(req->keys[t].size());
          st.keys.insert(st.keys.end(), req->keys[t].begin(), req->keys[t].end());
          st.grads.insert(st.grads.end(), req->grads[t].begin(), req->grads[t].end());
        }
        Status s = tables.push(st.counts.data(), st.keys.data(), st.grads.data(), req->step, *st.kernels, 1.0f,
                               req->keysUnique);
        if (!s.isOk()) return caf::make_error(caf::sec::runtime_error, s.toString());
        applied.insert(req->sequence);
        return req->sequence;
      },
      [=](stats_atom) -> int64_t {
        return self->state.tables->rows();
      },
      // A worker that trains no more: nothing waits on workers here.
      [=](leave_atom) -> int64_t { return 0; },
      [=](image_atom) -> TableImagesPtr {
        return std::make_shared<const std::vector<TableImage>>(self->state.tables->image());
      },
      [=](load_atom, const TableImagesPtr& images, int64_t worker, int64_t floor) -> caf::result<int64_t> {
        auto& st = self->state;
        if (!images || floor < 0) return invalid("load: no images, or a negative push floor");
        auto fresh = std::make_unique<TableSet>(st.options.tables);
        Status s = fresh->load(*images);
        if (!s.isOk()) return invalid("load: " + s.message());
        st.tables = std::move(fresh);
        st.applied[worker] = AppliedWindow(floor, {});
        return st.tables->rows();
      },
  };
}

}  // namespace

caf::actor spawnTableHolder(caf::actor_system& system, const TableHolderOptions& options) {
  return system.spawn<caf::detached>(tableHolder, options);
}

}  // namespace troupe::ps
