#include "ps/table_holder.h"

#include <map>
#include <memory>

#include <caf/all.hpp>

#include "common/logging.h"
#include "kernels/kernels.h"
#include "ps/messages.h"

namespace troupe::ps {
namespace {

// Tables whose rows one optimizer call can update together: same dim, same
// optimizer and hyperparameters.
bool sameUpdate(const EmbeddingTableOptions& a, const EmbeddingTableOptions& b) {
  const auto &x = a.optimizer, &y = b.optimizer;
  return a.dim == b.dim && x.kind == y.kind && x.learningRate == y.learningRate && x.weightDecay == y.weightDecay &&
         x.eps == y.eps && x.initialAccumulator == y.initialAccumulator && x.beta1 == y.beta1 &&
         x.beta2 == y.beta2 && x.ftrlBeta == y.ftrlBeta && x.l1 == y.l1 && x.l2 == y.l2;
}

struct TableHolderState {
  std::vector<std::unique_ptr<EmbeddingTable>> tables;
  bool uniform = false;  // every table sameUpdate as the first
  std::vector<float*> rows;    // scratch of a uniform push
  std::vector<float> grads;
  std::shared_ptr<kernels::Kernels> kernels;
  std::map<int64_t, int64_t> lastSequence;  // per worker
  static inline const char* name = "table_holder";
};

caf::error invalid(std::string what) {
  return caf::make_error(caf::sec::invalid_argument, std::move(what));
}

caf::behavior tableHolder(caf::stateful_actor<TableHolderState>* self, TableHolderOptions options) {
  for (const auto& t : options.tables) self->state.tables.push_back(std::make_unique<EmbeddingTable>(t));
  self->state.uniform = !options.tables.empty();
  for (const auto& t : options.tables) self->state.uniform &= sameUpdate(t, options.tables.front());
  self->state.kernels = options.kernels ? options.kernels
                                        : std::shared_ptr<kernels::Kernels>(
                                              kernels::createKernels({kernels::Device::kCpu, options.threads}));
  return {
      [=](pull_atom, const PullRequestPtr& req) -> caf::result<PullReplyPtr> {
        auto& tables = self->state.tables;
        if (!req || req->keys.size() != tables.size()) {
          return invalid(fmt::format("pull: {} key lists for {} tables", req ? req->keys.size() : 0, tables.size()));
        }
        auto reply = std::make_shared<PullReply>();
        reply->rows.resize(tables.size());
        for (size_t t = 0; t < tables.size(); ++t) {
          const auto& keys = req->keys[t];
          const int64_t dim = tables[t]->dim();
          auto& rows = reply->rows[t];
          rows.resize(keys.size() * size_t(dim));
          if (req->create) {
            tables[t]->pull(keys.data(), int64_t(keys.size()), rows.data());
          } else {
            tables[t]->peek(keys.data(), int64_t(keys.size()), rows.data());
          }
        }
        return PullReplyPtr(std::move(reply));
      },
      [=](push_atom, const PushRequestPtr& req) -> caf::result<int64_t> {
        auto& tables = self->state.tables;
        if (!req || req->keys.size() != tables.size() || req->grads.size() != tables.size()) {
          return invalid("push: the key and gradient lists do not match the tables");
        }
        for (size_t t = 0; t < tables.size(); ++t) {
          if (req->grads[t].size() != req->keys[t].size() * size_t(tables[t]->dim())) {
            return invalid(fmt::format("push: table {} has {} keys but {} gradient floats (dim {})", t,
                                       req->keys[t].size(), req->grads[t].size(), tables[t]->dim()));
          }
        }
        auto [it, fresh] = self->state.lastSequence.emplace(req->worker, -1);
        if (req->sequence <= it->second) return req->sequence;  // a duplicate: applied already
        auto& st = self->state;
        if (st.uniform) {
          // One optimizer call for every table's rows (same dim and optimizer).
          st.rows.clear();
          st.grads.clear();
          for (size_t t = 0; t < tables.size(); ++t) {
            auto n = tables[t]->preparePush(req->keys[t].data(), req->grads[t].data(),
                                            int64_t(req->keys[t].size()), *st.kernels);
            if (!n.hasValue()) return caf::make_error(caf::sec::runtime_error, n.status().toString());
            const float* g = tables[t]->preparedGrads();
            st.rows.insert(st.rows.end(), tables[t]->preparedRows(), tables[t]->preparedRows() + *n);
            st.grads.insert(st.grads.end(), g, g + *n * tables[t]->dim());
          }
          kernels::OptimizerConfig config = tables.front()->options().optimizer;
          config.step = req->step;
          Status s = st.kernels->applyRowOptimizer(config, st.rows.data(), int64_t(st.rows.size()),
                                                   tables.front()->dim(), st.grads.data());
          if (!s.isOk()) return caf::make_error(caf::sec::runtime_error, s.toString());
        } else {
          for (size_t t = 0; t < tables.size(); ++t) {
            Status s = tables[t]->push(req->keys[t].data(), req->grads[t].data(), int64_t(req->keys[t].size()),
                                       req->step, *st.kernels);
            if (!s.isOk()) return caf::make_error(caf::sec::runtime_error, s.toString());
          }
        }
        it->second = req->sequence;
        return req->sequence;
      },
      [=](stats_atom) -> int64_t {
        int64_t rows = 0;
        for (const auto& t : self->state.tables) rows += t->size();
        return rows;
      },
  };
}

}  // namespace

caf::actor spawnTableHolder(caf::actor_system& system, const TableHolderOptions& options) {
  return system.spawn<caf::detached>(tableHolder, options);
}

}  // namespace troupe::ps
