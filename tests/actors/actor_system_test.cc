// The roster of actor threads: the thread of a detached actor is counted
// while it runs, and, once its actor system is gone, awaitActorThreadsGone
// sees it end (CAF 0.17 does not join it; main waits on this before it
// returns, so no library finalizer runs beside a thread's own exit).
#include "actors/actor_system.h"
#include "common/mailbox.h"

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

// mailboxDepth (the live metrics' troupe_actor_mailbox_depth): an actor held
// in a handler while the test sends it a question and then 7 more messages
// answers, once let go, that exactly those 7 wait behind the question.
TEST(ActorSystemTest, AnActorsMailboxDepthCountsTheMessagesWaitingBehindTheOneItHandles) {
  caf::actor_system_config cfg;
  configureActorSystem(cfg, {1});
  caf::actor_system system{cfg};
  std::atomic<bool> inside{false}, release{false};
  std::atomic<int> handled{0};
  auto actor = system.spawn<caf::detached>([&](caf::event_based_actor* self) -> caf::behavior {
    return {
        [&](int32_t) {
          inside = true;
          for (int i = 0; i < 10000 && !release; ++i) std::this_thread::sleep_for(1ms);  // at most 10 s
        },
        [&, self](double) -> int64_t { return mailboxDepth(self); },
        [&](const std::string&) { ++handled; },
    };
  });
  caf::scoped_actor me{system};
  me->send(actor, int32_t{1});
  for (int i = 0; i < 5000 && !inside; ++i) std::this_thread::sleep_for(1ms);
  ASSERT_TRUE(inside.load());
  auto answer = me->request(actor, std::chrono::seconds(10), 0.5);
  for (int i = 0; i < 7; ++i) me->send(actor, std::string("behind"));
  release = true;
  int64_t depth = -1;
  answer.receive([&](int64_t d) { depth = d; }, [&](caf::error& e) { FAIL() << system.render(e); });
  EXPECT_EQ(depth, 7);
  // And once they are handled, none waits.
  for (int i = 0; i < 5000 && handled < 7; ++i) std::this_thread::sleep_for(1ms);
  ASSERT_EQ(handled.load(), 7);
  me->request(actor, std::chrono::seconds(5), 0.5).receive([&](int64_t d) { depth = d; },
                                                          [&](caf::error& e) { FAIL() << system.render(e); });
  EXPECT_EQ(depth, 0);
  me->send_exit(actor, caf::exit_reason::user_shutdown);
}

}  // namespace
}  // namespace troupe::actors
