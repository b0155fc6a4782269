// Turns actor messages (caf::message) into envelope bodies plus raw tensors
// and back. A message crosses processes when every element is one of: atom,
// bool, (u)int16/32/64, float, double, std::string, caf::error, caf::unit_t,
// transport::Tensor, std::vector of int64_t / uint64_t / double /
// std::string, or a record listed in the WireTypes given (record.h). Tensors
// leave as raw buffers beside the envelope and come back pointing into the
// received frame (no copy).
//
// Decoding trusts nothing: the Cap'n Proto body is read with a traversal
// limit of its own size, tensor indices are checked against the frame, each
// tensor may appear once, and a record must be of a listed type with exactly
// its fields. Failures are Status values, never exceptions.
//
// Threading: plain functions; safe from any thread.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include <caf/fwd.hpp>

#include "common/status.h"
#include "transport/frame.h"
#include "transport/record.h"
#include "transport/tensor.h"

namespace troupe::transport {

// Largest actor-message body decodeMessage accepts.
inline constexpr size_t kMaxMessageBodyBytes = size_t{1} << 20;

// Fills `body` and `tensors` (appended) from `msg`. Fails with
// invalidArgument naming the element that cannot cross processes. `types`:
// the records that may be sent (null: none).
Status encodeMessage(const caf::message& msg, std::string* body, std::vector<Tensor>* tensors,
                     const WireTypes* types = nullptr);

// Rebuilds the message. Tensor elements point into `frameTensors`, whose
// bytes `frameOwner` keeps alive. `types`: the records accepted (null: none).
Expected<caf::message> decodeMessage(const std::string& body, const std::vector<TensorView>& frameTensors,
                                     const std::shared_ptr<const void>& frameOwner,
                                     const WireTypes* types = nullptr);

}  // namespace troupe::transport
