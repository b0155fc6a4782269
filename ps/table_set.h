// TableSet: the embedding tables one actor owns (every table of a model in the
// in-process table holder, one hash partition of each in a shard), read and
// updated with the flat layout of the wire (ps/wire.h): one key count per
// table, keys of all tables back to back, rows / gradients likewise.
//
// A push whose tables share dim and optimizer runs one optimizer call for all
// of them (the common DLRM case); otherwise one per table.
//
// Threading: one owner.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "common/status.h"
#include "ps/embedding_table.h"

namespace troupe::ps {

class TableSet final {
 public:
  // Throws SetupError on a bad table (see EmbeddingTable).
  explicit TableSet(const std::vector<EmbeddingTableOptions>& tables);

  size_t size() const { return tables_.size(); }
  const std::vector<int64_t>& dims() const { return dims_; }
  EmbeddingTable& table(size_t t) { return *tables_[t]; }
  int64_t rows() const;

  // Writes the weights of the keys into out (sum_t counts[t] x dim_t floats).
  // create == false: unseen keys get their initial weights, uninserted.
  // remember (with create): each table keeps the keys and their rows for a
  // push of the same keys (EmbeddingTable::pull).
  void pull(const uint64_t* counts, const uint64_t* keys, bool create, float* out, bool remember = false);
  // The same for n keys of table t only.
  void pullTable(size_t t, const uint64_t* keys, int64_t n, bool create, float* out, bool remember = false);

  // Every table's rows (a checkpoint), and a set filled from them: whole,
  // or not at all when any image does not match its table.
  std::vector<TableImage> image() const;
  Status load(const std::vector<TableImage>& images);

  // One optimizer step (global step `step`) for the rows of the keys with
  // the gradients (same layout as pull's out); repeated keys are summed.
  // lrScale multiplies every table's learning rate for this step.
  // keysUnique: no key repeats within a table, on the caller's word
  // (EmbeddingTable::preparePush: only for callers in this process).
  Status push(const uint64_t* counts, const uint64_t* keys, const float* grads, int64_t step,
              kernels::Kernels& kernels, float lrScale = 1.0f, bool keysUnique = false);

 private:
  std::vector<std::unique_ptr<EmbeddingTable>> tables_;
  std::vector<int64_t> dims_;
  bool uniform_ = false;  // every table updates like the first
  std::vector<float*> rows_;
  std::vector<float> grads_;
  std::vector<int64_t> firstKey_, unique_;  // per table: its first key in a push, its unique keys
  std::vector<Status> status_;
};

}  // namespace troupe::ps
