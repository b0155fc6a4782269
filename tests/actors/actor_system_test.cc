// The roster of actor threads: the thread of a detached actor is counted
// while it runs, and, once its actor system is gone, awaitActorThreadsGone
// sees it end (CAF 0.17 does not join it; main waits on this before it
// returns, so no library finalizer runs beside a thread's own exit).
#include "actors/actor_system.h"

#include <atomic>
#include <chrono>
#include <thread>

#include <unistd.h>

#include <caf/all.hpp>
#include <gtest/gtest.h>

namespace troupe::actors {
namespace {

using namespace std::chrono_literals;

TEST(ActorSystemTest, ADetachedActorsThreadIsAwaitedUntilItHasEnded) {
  ASSERT_EQ(awaitActorThreadsGone(5s), 0u);  // none from before
  std::atomic<bool> release{false};
  std::atomic<int> tid{0};
  {
    caf::actor_system_config cfg;
    configureActorSystem(cfg, {1});
    caf::actor_system system{cfg};
    system.spawn<caf::detached>([&](caf::event_based_actor* self) {
      tid = int(::gettid());
      for (int i = 0; i < 10000 && !release; ++i) std::this_thread::sleep_for(1ms);  // at most 10 s
      self->quit();
    });
    for (int i = 0; i < 5000 && tid == 0; ++i) std::this_thread::sleep_for(1ms);
    ASSERT_NE(tid.load(), 0);
    // The detached actor's thread is listed, and alive: not gone in 50 ms.
    EXPECT_TRUE(actorThreadListed(tid));
    EXPECT_GE(awaitActorThreadsGone(50ms), 1u);
    EXPECT_TRUE(actorThreadListed(tid));
    release = true;
  }  // the system waits until its detached thread says it is done
  EXPECT_EQ(awaitActorThreadsGone(5s), 0u);
  EXPECT_FALSE(actorThreadListed(tid));
}

}  // namespace
}  // namespace troupe::actors
