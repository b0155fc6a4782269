#include "workers/job_messages.h"

#include <caf/actor_system_config.hpp>

namespace troupe::workers {

transport::WireTypes trainingWireTypes() {
  transport::WireTypes t;
  t.add<Progress>("troupe.Progress")
      .add<GateRequest>("troupe.GateRequest")
      .add<GateDecision>("troupe.GateDecision")
      .add<WorkerReport>("troupe.WorkerReport")
      .add<CommOffer>("troupe.CommOffer")
      .add<CommChoice>("troupe.CommChoice")
      .add<CheckpointPause>("troupe.CheckpointPause")
      .add<CheckpointPaused>("troupe.CheckpointPaused")
      .add<CheckpointResume>("troupe.CheckpointResume")
      .add<RegroupReady>("troupe.RegroupReady")
      .add<Regroup>("troupe.Regroup")
      .add<RegroupDone>("troupe.RegroupDone")
      .add<RegroupNow>("troupe.RegroupNow")
      .add<ModelSnapshot>("troupe.ModelSnapshot")
      .add<ModelCut>("troupe.ModelCut")
      .add<ModelWritten>("troupe.ModelWritten")
      .add<ResidualSnapshot>("troupe.ResidualSnapshot")
      .add<ResidualWritten>("troupe.ResidualWritten")
      .add<EvalPoint>("troupe.EvalPoint");
  return t;
}

void addTrainingTypes(caf::actor_system_config& cfg) { cfg.add_message_types<caf::id_block::troupe_workers>(); }

}  // namespace troupe::workers
