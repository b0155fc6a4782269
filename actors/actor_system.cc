#include "actors/actor_system.h"

#include <algorithm>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <sys/stat.h>
#include <unistd.h>

#include <caf/actor_system_config.hpp>
#include <caf/atom.hpp>
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
    cfg.set("scheduler.policy", caf::atom("sharing"));
  }
  cfg.add_message_types<caf::id_block::troupe_actors>();
  addErrorCategories(cfg);
  cfg.add_thread_hook<ThreadRoster>();
}

}  // namespace troupe::actors
