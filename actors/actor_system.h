// One place that sets up an actor system for troupe (every role, the
// single-process trainer, the benchmarks, the tests).
#pragma once

#include <chrono>
#include <cstddef>

#include <caf/fwd.hpp>

namespace troupe::actors {

struct ActorSystemOptions {
  // CAF scheduler threads, sharing one queue (CAF's work-sharing policy,
  // changed as `spin` says): idle threads sleep on a condition variable and
  // wake when a message arrives, where CAF's work stealing polls with sleeps
  // in between (measured here: round trips of 210-290 us with work stealing,
  // 85-135 us with sharing). The heavy actors run detached, so two threads
  // serve a process.
  int threads = 2;
  // CAF's deterministic test scheduler (caf::scheduler::test_coordinator):
  // nothing runs until a test says so, and time moves only when it is
  // advanced. For unit tests of actor logic.
  bool deterministic = false;
  // How long a scheduler thread that ran out of work polls the queue
  // (yielding between polls) before it sleeps: a reply that comes within it
  // costs no wake-up. 50 us, as the transport's progress thread
  // (transport.spin_us): on 2 cores, median round trips 39 against 52 us and
  // 4 KiB messages 1.28x faster than with none (bench/RESULTS.md).
  std::chrono::microseconds spin{50};
};

// Sets the scheduler, registers troupe's error categories (troupe,
// departure) and the lifecycle records (actors/messages.h) with CAF's type
// ids. Call before the actor system is made from `cfg`.
void configureActorSystem(caf::actor_system_config& cfg, const ActorSystemOptions& options = {});

// Waits, at most `bound`, until every thread an actor system made (through
// configureActorSystem) has ended, and returns how many are still there.
// CAF 0.17 cannot join the thread of a detached actor: the actor system's
// destructor waits only until the thread has said it is done, and the
// thread then still runs its own exit (its thread-local destructors and
// malloc's thread cache). A process that returned from main meanwhile ran
// its libraries' finalizers beside that exit, and now and then (about 1
// run in 200 of the chaos campaign) died of "double free or corruption"
// in the exiting thread. main calls this before it returns.
size_t awaitActorThreadsGone(std::chrono::milliseconds bound);
// Whether the thread of kernel id `id` is listed (for tests).
bool actorThreadListed(int id);

}  // namespace troupe::actors
