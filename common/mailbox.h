// How many messages wait in an actor's mailbox (the live metrics' mailbox
// depths, `troupe_actor_mailbox_depth`).
#pragma once

#include <cstdint>

namespace troupe {

// The messages waiting in `self`'s mailbox behind the one it is handling
// (that one is out of the mailbox already). Call it only from `self`'s own
// handlers: CAF's mailbox moves what arrived into its queue as it counts,
// which only its owner may do.
template <class Actor>
int64_t mailboxDepth(Actor* self) {
  return int64_t(self->mailbox().size());
}

}  // namespace troupe
