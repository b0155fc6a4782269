// The roster of actor threads: the thread of a detached actor is counted
// while it runs, and, once its actor system is gone, awaitActorThreadsGone
// sees it end (CAF 0.17 does not join it; main waits on this before it
// returns, so no library finalizer runs beside a thread's own exit).
#include "actors/actor_system.h"
#include "common/mailbox.h"

#include <atomic>
#include <chrono>
#include <ctime>
#include <memory>
#include <thread>
#include <vector>

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

// The scheduler (configureActorSystem: one shared queue; a thread out of
// work polls it for ActorSystemOptions::spin, then sleeps): four threads
// outside the system send 5 000 numbers each to eight scheduled actors on
// two scheduler threads. Every message is handled exactly once, and each
// actor sees each sender's numbers in the order sent (CAF's promise for one
// sender and one receiver): a job the queue lost shows in the count, and
// one run twice in the count or the order (if it does not crash).
constexpr int kSenders = 4, kActors = 8, kEach = 5000;

TEST(ActorSystemTest, TheSchedulerRunsEveryMessageOnceInEachSendersOrder) {
  caf::actor_system_config cfg;
  configureActorSystem(cfg, {2});
  caf::actor_system system{cfg};
  struct Tally {
    std::atomic<int64_t> handled{0};
    std::atomic<int64_t> outOfOrder{0};
  };
  auto tally = std::make_shared<Tally>();
  std::vector<caf::actor> actors;
  for (int a = 0; a < kActors; ++a) {
    actors.push_back(system.spawn([tally](caf::event_based_actor*) -> caf::behavior {
      auto last = std::make_shared<std::vector<int32_t>>(kSenders, -1);
      return {[tally, last](int32_t sender, int32_t n) {
        if (n != (*last)[size_t(sender)] + 1) ++tally->outOfOrder;
        (*last)[size_t(sender)] = n;
        ++tally->handled;
      }};
    }));
  }
  std::vector<std::thread> senders;
  for (int s = 0; s < kSenders; ++s) {
    senders.emplace_back([&, s] {
      caf::scoped_actor me{system};
      for (int32_t n = 0; n < kEach; ++n) {
        for (auto& a : actors) me->send(a, int32_t(s), n);
        if (n % 500 == 0) std::this_thread::sleep_for(1ms);  // idle gaps: threads go to sleep and wake again
      }
    });
  }
  for (auto& t : senders) t.join();
  const int64_t want = int64_t(kSenders) * kActors * kEach;
  for (int i = 0; i < 30000 && tally->handled < want; ++i) std::this_thread::sleep_for(1ms);  // at most 30 s
  EXPECT_EQ(tally->handled.load(), want);
  EXPECT_EQ(tally->outOfOrder.load(), 0);
  for (auto& a : actors) caf::anon_send_exit(a, caf::exit_reason::user_shutdown);
}

// A scheduler thread stops polling once `spin` has passed without work:
// over 300 ms with nothing to do, the process spends almost no CPU time (a
// thread that went on polling would spend about 300 ms). And a thread that
// slept wakes for the next message: 200 requests, each after a pause longer
// than the spin or about as long (a message that comes while a thread goes
// from polling to sleep), are each answered (a lost wake-up would leave one
// unanswered until its 5 s timeout).
TEST(ActorSystemTest, AnIdleSchedulerThreadSleepsAndWakesForTheNextMessage) {
  caf::actor_system_config cfg;
  ActorSystemOptions options;
  options.threads = 2;
  options.spin = std::chrono::microseconds(50);
  configureActorSystem(cfg, options);
  caf::actor_system system{cfg};
  auto echo = system.spawn([](caf::event_based_actor*) -> caf::behavior {
    return {[](int32_t x) { return x + 1; }};
  });
  caf::scoped_actor me{system};
  int answered = 0;
  auto ask = [&](int32_t x) {
    bool ok = false;
    me->request(echo, std::chrono::seconds(5), x)
        .receive([&](int32_t y) { ok = y == x + 1; },
                 [&](caf::error& e) { ADD_FAILURE() << "request " << x << ": " << system.render(e); });
    answered += ok ? 1 : 0;
    return ok;
  };
  ask(0);
  ASSERT_EQ(answered, 1);
  auto cpu = [] {
    timespec t{};
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
    return double(t.tv_sec) + double(t.tv_nsec) * 1e-9;
  };
  const double before = cpu();
  std::this_thread::sleep_for(300ms);
  const double idle = cpu() - before;
  EXPECT_LT(idle, 0.05) << "the process spent " << idle << " s of CPU time in 300 ms with nothing to do";
  for (int32_t i = 1; i <= 200; ++i) {
    std::this_thread::sleep_for(std::chrono::microseconds(i % 2 == 0 ? 200 + 37 * (i % 7) : 30 + 5 * (i % 11)));
    if (!ask(i)) break;  // (one unanswered request is enough)
  }
  EXPECT_EQ(answered, 201);
  me->send_exit(echo, caf::exit_reason::user_shutdown);
}

}  // namespace
}  // namespace troupe::actors
