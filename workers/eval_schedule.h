// When a job evaluates on its test set while it trains (workers/evaluator_actor.h).
#pragma once

#include <cstdint>

namespace troupe::workers {

// When evaluations are due (train.eval_every_steps, train.eval_every_seconds:
// whichever comes first; both 0: never).
struct EvalSchedule {
  int64_t everySteps = 0;
  double everySeconds = 0;
  bool any() const { return everySteps > 0 || everySeconds > 0; }
  // Whether a snapshot is due after `step` at `trainSeconds`, the last one
  // having been at lastStep / lastSeconds.
  bool due(int64_t step, double trainSeconds, int64_t lastStep, double lastSeconds) const {
    if (everySteps > 0 && step / everySteps > lastStep / everySteps) return true;
    return everySeconds > 0 && trainSeconds - lastSeconds >= everySeconds;
  }
};

}  // namespace troupe::workers
