#include "actors/actor_system.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <sys/stat.h>
#include <unistd.h>

#include <caf/actor_system_config.hpp>
#include <caf/atom.hpp>
#include <caf/policy/unprofiled.hpp>
#include <caf/resumable.hpp>
#include <caf/scheduler/coordinator.hpp>
#include <caf/thread_hook.hpp>

#include "actors/errors.h"
#include "actors/messages.h"

namespace troupe::actors {
namespace {

// The kernel's ids of the threads actor systems started, in this process.
struct ThreadIds {
  std::mutex mutex;
  std::vector<pid_t> ids;
};

ThreadIds& threadIds() {
  static ThreadIds* ids = new ThreadIds;  // never destroyed: threads may report after main
  return *ids;
}

// CAF's work-sharing scheduler (one queue for every thread of the process),
// changed in two ways. A thread that runs out of work polls the queue for
// `spin` before it sleeps on the condition variable, yielding between polls,
// so a message that comes soon after (the reply to a request the thread's
// actor just sent) is taken without a wake-up. And an enqueue signals the
// condition variable only when a thread sleeps on it. (A scheduler policy
// is a set of member templates that caf::scheduler::coordinator calls; the
// coordinator is given to CAF as its scheduler module.)
class SpinThenSleep : public caf::policy::unprofiled {
 public:
  using Clock = std::chrono::steady_clock;

  struct coordinator_data {
    explicit coordinator_data(caf::scheduler::abstract_coordinator*) {}
    std::mutex lock;
    std::condition_variable cv;
    std::deque<caf::resumable*> queue;    // under lock
    int sleepers = 0;                     // under lock
    std::atomic<size_t> queued{0};        // queue.size(), read while spinning
    std::chrono::microseconds spin{0};
  };

  struct worker_data {
    explicit worker_data(caf::scheduler::abstract_coordinator*) {}
  };

  template <class Coordinator>
  void enqueue(Coordinator* self, caf::resumable* job) {
    auto& d = self->data();
    bool wake;
    {
      std::lock_guard<std::mutex> guard(d.lock);
      d.queue.push_back(job);
      d.queued.store(d.queue.size(), std::memory_order_release);
      wake = d.sleepers > 0;
    }
    // A thread counts itself a sleeper under the lock and waits in the same
    // step (the wait lets the lock go), so while it is counted it waits, or
    // was woken and wants the lock back to look at the queue again.
    if (wake) d.cv.notify_one();
  }

  template <class Coordinator>
  void central_enqueue(Coordinator* self, caf::resumable* job) {
    enqueue(self, job);
  }

  template <class Worker>
  void external_enqueue(Worker* self, caf::resumable* job) {
    enqueue(self->parent(), job);
  }

  template <class Worker>
  void internal_enqueue(Worker* self, caf::resumable* job) {
    enqueue(self->parent(), job);
  }

  template <class Worker>
  void resume_job_later(Worker* self, caf::resumable* job) {
    enqueue(self->parent(), job);  // to the back of the queue
  }

  template <class Worker>
  caf::resumable* dequeue(Worker* self) {
    auto& d = self->parent()->data();
    if (d.spin.count() > 0) {
      // The clock at every poll: on a busy machine one yield may give the
      // core away for a whole time slice.
      const auto until = Clock::now() + d.spin;
      for (;;) {
        if (d.queued.load(std::memory_order_acquire) > 0) {
          std::lock_guard<std::mutex> guard(d.lock);
          if (!d.queue.empty()) return pop(d);
        }
        if (Clock::now() >= until) break;
        std::this_thread::yield();
      }
    }
    std::unique_lock<std::mutex> guard(d.lock);
    ++d.sleepers;
    d.cv.wait(guard, [&] { return !d.queue.empty(); });
    --d.sleepers;
    return pop(d);
  }

  template <class Worker, class UnaryFunction>
  void foreach_resumable(Worker*, UnaryFunction) {}

  template <class Coordinator, class UnaryFunction>
  void foreach_central_resumable(Coordinator* self, UnaryFunction f) {
    auto& d = self->data();
    std::lock_guard<std::mutex> guard(d.lock);
    while (!d.queue.empty()) f(pop(d));
  }

 private:
  static caf::resumable* pop(coordinator_data& d) {  // under d.lock, the queue not empty
    caf::resumable* job = d.queue.front();
    d.queue.pop_front();
    d.queued.store(d.queue.size(), std::memory_order_release);
    return job;
  }
};

class SpinThenSleepCoordinator final : public caf::scheduler::coordinator<SpinThenSleep> {
 public:
  SpinThenSleepCoordinator(caf::actor_system& sys, std::chrono::microseconds spin) : coordinator(sys) {
    data().spin = spin;
  }
};

class ThreadRoster final : public caf::thread_hook {
 public:
  void init(caf::actor_system&) override {}
  void thread_started() override {
    auto& t = threadIds();
    std::lock_guard<std::mutex> lock(t.mutex);
    t.ids.push_back(::gettid());
  }
  void thread_terminates() override {}
};

bool threadAlive(pid_t id) {
  struct stat st;
  return ::stat(("/proc/self/task/" + std::to_string(id)).c_str(), &st) == 0;
}

}  // namespace

size_t awaitActorThreadsGone(std::chrono::milliseconds bound) {
  const auto deadline = std::chrono::steady_clock::now() + bound;
  const pid_t self = ::gettid();
  auto& t = threadIds();
  for (;;) {
    std::vector<pid_t> ids;
    {
      std::lock_guard<std::mutex> lock(t.mutex);  // (not held while it sleeps: threads may still start)
      ids = t.ids;
    }
    std::vector<pid_t> gone;
    for (pid_t id : ids) {
      if (id == self || !threadAlive(id)) gone.push_back(id);
    }
    size_t left = 0;
    {
      std::lock_guard<std::mutex> lock(t.mutex);
      t.ids.erase(std::remove_if(t.ids.begin(), t.ids.end(),
                                 [&](pid_t id) { return std::find(gone.begin(), gone.end(), id) != gone.end(); }),
                  t.ids.end());
      left = t.ids.size();
    }
    if (left == 0 || std::chrono::steady_clock::now() >= deadline) return left;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

bool actorThreadListed(int id) {
  auto& t = threadIds();
  std::lock_guard<std::mutex> lock(t.mutex);
  return std::find(t.ids.begin(), t.ids.end(), id) != t.ids.end();
}

void configureActorSystem(caf::actor_system_config& cfg, const ActorSystemOptions& options) {
  if (options.deterministic) {
    cfg.set("scheduler.policy", caf::atom("testing"));
  } else {
    cfg.set("scheduler.max-threads", std::max(1, options.threads));
    const auto spin = options.spin;
    cfg.module_factories.push_back([spin](caf::actor_system& sys) -> caf::actor_system::module* {
      return new SpinThenSleepCoordinator(sys, spin);
    });
  }
  cfg.add_message_types<caf::id_block::troupe_actors>();
  addErrorCategories(cfg);
  cfg.add_thread_hook<ThreadRoster>();
}

}  // namespace troupe::actors
