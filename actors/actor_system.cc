#include "actors/actor_system.h"

#include <algorithm>

#include <caf/actor_system_config.hpp>
#include <caf/atom.hpp>

#include "actors/errors.h"
#include "actors/messages.h"

namespace troupe::actors {

void configureActorSystem(caf::actor_system_config& cfg, const ActorSystemOptions& options) {
  if (options.deterministic) {
    cfg.set("scheduler.policy", caf::atom("testing"));
  } else {
    cfg.set("scheduler.max-threads", std::max(1, options.threads));
    cfg.set("scheduler.policy", caf::atom("sharing"));
  }
  cfg.add_message_types<caf::id_block::troupe_actors>();
  addErrorCategories(cfg);
}

}  // namespace troupe::actors
