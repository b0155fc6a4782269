// The roster of actor threads: the thread of a detached actor is counted
// while it runs, and, once its actor system is gone, awaitActorThreadsGone
// sees it end (CAF 0.17 does not join it; main waits on this before it
// returns, so no library finalizer runs beside a thread's own exit).
#include "actors/actor_system.h"

#include <atomic>
#include <chrono>
#include <thread>

#include <caf/all.hpp>
#include <gtest/gtest.h>

namespace troupe::actors {
namespace {

using namespace std::chrono_literals;

TEST(ActorSystemTest, ADetachedActorsThreadIsAwaitedUntilItHasEnded) {
  ASSERT_EQ(awaitActorThreadsGone(5s), 0u);  // none from before
  std::atomic<bool> release{false}, running{false};
  {
    caf::actor_system_config cfg;
    configureActorSystem(cfg, {1});
    caf::actor_system system{cfg};
    system.spawn<caf::detached>([&](caf::event_based_actor* self) {
      running = true;
      while (!release) std::this_thread::sleep_for(1ms);  // bounded by the test below
      self->quit();
    });
    for (int i = 0; i < 5000 && !running; ++i) std::this_thread::sleep_for(1ms);
    ASSERT_TRUE(running);
    // The scheduler's thread and the detached actor's are both alive.
    EXPECT_GE(awaitActorThreadsGone(50ms), 2u);
    release = true;
  }  // the system waits until its detached thread says it is done
  EXPECT_EQ(awaitActorThreadsGone(5s), 0u);
}

}  // namespace
}  // namespace troupe::actors
