// Fault plans (DESIGN.md, Supervision and fault tolerance): faults a user
// injects on purpose, to see the job survive them and to measure how.
//
// A plan is a list of faults, each one line of "field=value" pairs, from
// `[[faults]]` (or `[[faults.plan]]`) tables in the config or repeated
// `--fault SPEC` flags, both ending up in the config key "faults.plan":
//
//   kind=kill,target=worker:1,at_step=40        SIGKILL when it has taken 40 steps
//   kind=kill,target=ps:0,at_s=5                SIGKILL 5 s after training started
//   kind=kill,target=worker,every_s=20,count=3  a random worker, every 20 s on average
//   kind=stop,target=worker:0,at_s=3,duration_s=8   SIGSTOP, SIGCONT 8 s later
//   kind=slow,target=worker:1,factor=3          every step 3 x as long (a straggler)
//   kind=slow,target=worker:1,delay_ms=20,at_step=10,steps=50
//
// Fields:
//   kind        kill | stop | slow
//   target      worker[:RANK] | ps[:RANK]; without a rank (or '*'), one is
//               drawn from faults.seed (at each firing, for every_s)
//   at_step     fires once the target (a worker) has taken this many steps
//   at_s        fires this many seconds after every process was first ready
//               (at most a week)
//   every_s     fires again and again, the gaps drawn from an exponential
//               distribution of this mean (the mean time between failures;
//               0.1 s to a week)
//   count       with every_s: at most this many firings (0: no limit)
//   duration_s  stop: how long the process stays stopped (required; 1 ms
//               to a day)
//   factor      slow: each step takes this many times as long (> 1, <= 1000)
//   delay_ms    slow: each step takes this many milliseconds more (<= 1 h)
//   steps       slow: for this many steps (0: to the end)
//   after_checkpoint
//               at_s and every_s count from the moment the run has written
//               this many checkpoints instead of from the start (a shard
//               lost before the first checkpoint has nothing to roll back
//               to); a fault whose checkpoint never comes does not fire
// Message faults (transport/link_faults.h), injected below every process's
// reliable links, so each message still arrives once and in order; what
// they cost is resends and waiting, and a partition is a loss the job
// recovers from as from a hung process:
//
//   kind=drop,from=worker,to=ps:0,p=0.05        5% of worker -> ps 0 messages lost
//   kind=dup,from=*,to=*,p=0.01                 1% of all messages doubled
//   kind=delay,from=ps,to=worker,p=0.1,delay_ms=2-30
//   kind=reorder,from=worker:1,to=ps,p=0.05
//   kind=corrupt,from=worker,to=ps,p=0.01,bits=3
//   kind=partition,target=ps:1,at_s=5,duration_s=4   ps 1 cut off from all
//
//   from, to    worker[:RANK] | ps[:RANK] | coordinator | * (default *)
//   both_ways   true: also from `to` to `from` (a partition always is)
//   p           the probability per message, 0 < p <= 1 (not for partition)
//   delay_ms    delay: a fixed delay, or LO-HI drawn uniformly (<= 1 h)
//   bits        corrupt: bits flipped per message (1..64, default 1)
//   at_s        open from this many seconds after the coordinator started (default 0)
//   duration_s  open for this long (default: to the end; partition: required)
//   target      partition: the side cut off (from = target, to = * unless given)
//
// kill and stop take exactly one of at_step, at_s, every_s; slow starts at
// at_step (default: the first step). A fault hits the process that holds
// its target when it fires; a step-triggered one is armed in the rank's
// first process only (a replacement that redoes those steps is not hit
// again). Every random choice comes from faults.seed, so the same plan and
// seed draw the same ranks and times.
//
// parseFaultPlan refuses a bad plan before the job starts, with a SetupError
// naming the fault and the field.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/config.h"
#include "transport/link_faults.h"

namespace troupe::actors {

// kKillActor: kind=kill with actor=NAME (or kind=kill-actor): one actor of
// the process is killed, not the process.
enum class FaultKind { kKill, kStop, kSlow, kKillActor };
const char* faultKindName(FaultKind kind);
// The kind a name means ("kill", "stop", "slow"), if any.
std::optional<FaultKind> faultKindOf(std::string_view name);
// Whether `name` is a message fault (drop, dup, delay, reorder, corrupt,
// partition).
bool isMessageFault(std::string_view name);

// A message fault of the plan: a rule of every process's link filter.
struct MessageFault {
  int64_t id = 0;  // 1-based, in plan order (shared with the process faults)
  std::string spec;
  transport::LinkFaultRule rule;
};

struct Fault {
  int64_t id = 0;        // 1-based, in plan order
  std::string spec;      // as given
  FaultKind kind = FaultKind::kKill;
  std::string role;      // "worker" or "ps"
  int64_t rank = -1;     // -1: drawn at each firing (every_s)
  int64_t atStep = -1;
  double atSeconds = -1;
  double everySeconds = 0;
  int64_t count = 0;
  double durationSeconds = 0;
  double factor = 1;
  int64_t delayMs = 0;
  int64_t steps = 0;
  int64_t afterCheckpoint = 0;  // 0: timed from the start
  std::string actor;            // kKillActor: the actor of the process (actorNames)

  bool stepTriggered() const { return atStep >= 0; }
};

struct FaultPlan {
  uint64_t seed = 1;
  std::vector<Fault> faults;  // process faults: kill, stop, slow
  std::vector<MessageFault> messages;
  // A killed process is found within this (twice the heartbeat timeout,
  // and a second): the report lays a later loss to no kill.
  double detectWithinSeconds = 7;
  // faults.start_unix_ms: when the message faults' at_s counts from (0: when
  // each process joined).
  int64_t startUnixMs = 0;

  bool empty() const { return faults.empty() && messages.empty(); }
  // The link filter rules of the message faults, in plan order.
  std::vector<transport::LinkFaultRule> linkRules() const;
  // The fault of that id, or null.
  const Fault* byId(int64_t id) const;
  // The step-triggered faults (kill, stop, slow) of worker `rank`.
  std::vector<Fault> stepFaultsOf(int64_t rank) const;
};

// The actors of a process a kill fault may name (actor=NAME), by role: a
// worker's "worker" (its training loop), "train-loader", "test-loader" and
// "tables" (its client of the shards, or its replica of the tables); a
// parameter server's "shard" (the primary copy it serves) and, with
// ps.replicas = 2, "backup" (the other copy it holds).
const std::vector<std::string>& actorNames(const std::string& role);

// Whether slow fault `f` holds back its worker's step `step`, and for how
// long: delay_ms, or factor - 1 times `base` (the seconds of step work the
// slowdown took as its measure when it began: a factor of 3 makes a 10 ms
// step take 30 ms).
bool slowsStep(const Fault& f, int64_t step);
std::chrono::microseconds slowDelayOf(const Fault& f, double base);

// Parses config "faults.plan" and "faults.seed" for a job of `workers`
// workers and `servers` parameter servers. Throws SetupError.
FaultPlan parseFaultPlan(const Config& config, int64_t workers, int64_t servers);

// A generator seeded from the plan's seed and a stream number (a fault's id,
// a firing): the same numbers on every host.
uint64_t faultRandom(uint64_t seed, uint64_t stream, uint64_t draw);

}  // namespace troupe::actors
