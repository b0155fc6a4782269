// An actor system on CAF's deterministic test scheduler: nothing runs until
// the test says so (run), and time moves only when the test moves it
// (advance). A scoped actor stands in for whoever talks to the actors
// under test; what it received is read with take<T>() after a run.
#pragma once

#include <chrono>
#include <memory>
#include <optional>
#include <vector>

#include <caf/all.hpp>
#include <caf/scheduler/test_coordinator.hpp>
#include <gtest/gtest.h>

#include "actors/actor_system.h"

namespace troupe::actors::testing {

class Deterministic : public ::testing::Test {
 protected:
  Deterministic() {
    configureActorSystem(cfg_, {1, true});
    system_ = std::make_unique<caf::actor_system>(cfg_);
    sched_ = &dynamic_cast<caf::scheduler::test_coordinator&>(system_->scheduler());
    self_ = std::make_unique<caf::scoped_actor>(*system_);
  }
  ~Deterministic() override {
    // The system waits for every actor when it goes: stop what the test left.
    for (auto& a : stopAtEnd_) caf::anon_send_exit(a, caf::exit_reason::user_shutdown);
    sched_->run();
    self_.reset();
    sched_->run();
  }

  caf::actor_system& system() { return *system_; }
  caf::scoped_actor& self() { return *self_; }
  // Runs every actor until nothing is left to do.
  void run() { sched_->run(); }
  // Moves the clock (firing what falls due) and runs.
  void advance(std::chrono::milliseconds d) {
    sched_->advance_time(d);
    run();
  }
  // A catch-all handler (CAF 0.17: `others`; a handler taking caf::message
  // matches only a message whose one element is a message).
  static auto dropAny() {
    return caf::others >> [](caf::message_view&) -> caf::result<caf::message> { return caf::message{}; };
  }
  // The next message of type T the scoped actor holds, if any (others
  // before it are dropped).
  template <class T>
  std::optional<T> take() {
    std::optional<T> out;
    bool more = true;
    while (!out && more) {
      (*self_)->receive([&](T& x) { out = std::move(x); }, dropAny(),
                        caf::after(std::chrono::seconds(0)) >> [&] { more = false; });
    }
    return out;
  }
  // Whether the scoped actor holds nothing (what it holds is dropped).
  bool idle() {
    bool none = false;
    (*self_)->receive(dropAny(), caf::after(std::chrono::seconds(0)) >> [&] { none = true; });
    return none;
  }


  // Actors the fixture stops when the test ends.
  void stopAtEnd(caf::actor a) { stopAtEnd_.push_back(std::move(a)); }

  caf::actor_system_config cfg_;
  std::vector<caf::actor> stopAtEnd_;
  std::unique_ptr<caf::actor_system> system_;
  caf::scheduler::test_coordinator* sched_ = nullptr;
  std::unique_ptr<caf::scoped_actor> self_;
};

}  // namespace troupe::actors::testing
