// troupe's own error category, for failures that travel between actors and
// processes as caf::error values (STYLE.md, Errors): the job's lifecycle
// (who may join, who is gone, why the job ended) and supervision. A peer's
// departure (left, crashed, timed out, refused) is transport::Departure,
// category "departure"; Loss below reads either kind from a down message.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include <caf/error.hpp>
#include <caf/make_message.hpp>
#include <caf/fwd.hpp>

#include "transport/node.h"

namespace troupe::actors {

enum class Errc : uint8_t {
  kJobFailed = 1,      // the job ended with an error (the context says why)
  kNotInJob,           // a role, rank or process the job does not have
  kRankTaken,          // every rank of that role is taken by a live process
  kStartTimeout,       // not every process was ready within cluster.start_timeout_s
  kReplaceTimeout,     // no replacement joined within supervision.replace_timeout_s
  kRestartsExhausted,  // supervision.max_restarts in supervision.restart_window_s, spent
  kStalled,            // alive but no progress for supervision.stall_timeout_s
  kCoordinatorLost,    // a member lost its coordinator
  kBadMessage,         // a message that fails its checks
  kMemberFailed,       // a member's work failed (the context says how)
  kSetupFailed,        // a member could not set up (a bad config; the context says what)
  kRolledBack,         // a member stopped so the job can roll back to a checkpoint
};

// "job failed", "not in the job", ...
const char* errcName(Errc e);

// One line for any error, without an actor system at hand: troupe's and
// departures as their renderers write them, CAF's own by name, with the
// context (the text a sender attached) in parentheses.
std::string describe(const caf::error& e);

// Renders troupe errors ("troupe: not in the job (worker 7)") and departures
// in logs; configureActorSystem calls it.
void addErrorCategories(caf::actor_system_config& cfg);

// How an actor went, read from a down message's reason: a remote actor's
// process departed (transport::Departure), a local actor exited normally,
// or it failed with some other error.
struct Loss {
  enum class Kind { kNormal, kDeparted, kFailed } kind = Kind::kNormal;
  transport::Departure departure = transport::Departure::kCrashed;  // kDeparted
  caf::error reason;  // as received
  // "left", "crashed", "timed out", ..., or describe(reason) of a failed
  // local actor, or "exited".
  std::string describe() const;
};

Loss lossOf(const caf::error& reason);

}  // namespace troupe::actors

CAF_ERROR_CODE_ENUM(troupe::actors::Errc, "troupe")
