// The wire form of the parameter-server messages (ps/messages.h): what a
// pull or push becomes when it crosses processes through transport proxies.
// Key and row payloads travel as transport::Tensors (raw buffers beside the
// envelope), with one count per table; the small fields as integers.
//
//   pull:       (pull_atom, bool create, Tensor key counts u64, Tensor keys u64)
//   pull reply: (Tensor float counts u64, Tensor rows f32)
//   push:       (push_atom, i64 worker, i64 sequence, i64 step,
//                Tensor key counts u64, Tensor keys u64,
//                Tensor gradient float counts u64, Tensor grads f32)
//
// Decoders trust nothing: dtypes, lengths, counts against payload sizes and
// the number of tables are checked, and a mismatch is a corruption Status
// naming it.
//
// Threading: plain functions; safe from any thread.
#pragma once

#include <vector>

#include <caf/fwd.hpp>

#include "common/status.h"
#include "ps/messages.h"

namespace troupe::ps {

// More tables than this in one message is refused.
inline constexpr size_t kMaxWireTables = 4096;

caf::message pullToWire(const PullRequest& request);
caf::message pullReplyToWire(const PullReply& reply);
caf::message pushToWire(const PushRequest& request);

// From a message received through a proxy. `dims` (floats per row, one per
// table) checks a push's gradients; empty skips that check.
Expected<PullRequest> pullFromWire(const caf::message& msg);
Expected<PullReply> pullReplyFromWire(const caf::message& msg);
Expected<PushRequest> pushFromWire(const caf::message& msg, const std::vector<int>& dims = {});

}  // namespace troupe::ps
