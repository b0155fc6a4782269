#include "actors/fault_plan.h"

#include <algorithm>
#include <charconv>
#include <limits>
#include <cmath>
#include <map>
#include <set>
#include <string_view>

#include "common/check.h"

namespace troupe::actors {
namespace {

constexpr int64_t kMaxSteps = 1'000'000'000'000;
constexpr double kMaxSeconds = 7 * 86400;
constexpr double kMinEverySeconds = 0.1;
constexpr const char* kFields =
    "kind, target, actor, at_step, at_s, every_s, count, duration_s, factor, delay_ms, steps, after_checkpoint";

constexpr const char* kMessageFields = "kind, from, to, target, both_ways, p, delay_ms, bits, at_s, duration_s";

const std::map<std::string_view, transport::LinkFaultKind> kMessageKinds = {
    {"drop", transport::LinkFaultKind::kDrop},         {"dup", transport::LinkFaultKind::kDuplicate},
    {"duplicate", transport::LinkFaultKind::kDuplicate}, {"delay", transport::LinkFaultKind::kDelay},
    {"reorder", transport::LinkFaultKind::kReorder},   {"corrupt", transport::LinkFaultKind::kCorrupt},
    {"partition", transport::LinkFaultKind::kPartition}};

struct Parser {
  const Fault& f;
  std::string_view field;

  [[noreturn]] void bad(const std::string& what) const {
    TROUPE_SETUP_ERROR("fault {} ({}): {}: {}", f.id, f.spec, field, what);
  }
  int64_t integer(std::string_view v, int64_t min, int64_t max) const {
    int64_t x = 0;
    auto [p, ec] = std::from_chars(v.data(), v.data() + v.size(), x);
    if (ec != std::errc() || p != v.data() + v.size() || v.empty()) {
      bad(fmt::format("'{}' is not an integer{}", v, ec == std::errc::result_out_of_range ? " we can hold" : ""));
    }
    if (x < min) bad(fmt::format("{} is less than {}", x, min));
    if (x > max) bad(fmt::format("{} is more than {}", x, max));
    return x;
  }
  double number(std::string_view v, double min, bool strict, double max) const {
    double x = 0;
    auto [p, ec] = std::from_chars(v.data(), v.data() + v.size(), x);
    if (ec != std::errc() || p != v.data() + v.size() || v.empty() || !std::isfinite(x)) {
      bad(fmt::format("'{}' is not a number", v));
    }
    if (strict ? x <= min : x < min) bad(fmt::format("{} must be {} {}", x, strict ? "more than" : "at least", min));
    if (x > max) bad(fmt::format("{} must be at most {}", x, max));
    return x;
  }
};

}  // namespace

const std::vector<std::string>& actorNames(const std::string& role) {
  static const std::vector<std::string> worker = {"worker", "train-loader", "test-loader", "tables"};
  static const std::vector<std::string> ps = {"shard", "backup"};
  static const std::vector<std::string> none;
  return role == "worker" ? worker : role == "ps" ? ps : none;
}

std::optional<FaultKind> faultKindOf(std::string_view name) {
  for (auto kind : {FaultKind::kKill, FaultKind::kStop, FaultKind::kSlow, FaultKind::kKillActor}) {
    if (name == faultKindName(kind)) return kind;
  }
  return std::nullopt;
}

bool isMessageFault(std::string_view name) { return kMessageKinds.count(name) != 0; }

std::vector<transport::LinkFaultRule> FaultPlan::linkRules() const {
  std::vector<transport::LinkFaultRule> rules;
  for (const auto& m : messages) rules.push_back(m.rule);
  return rules;
}

namespace {

using Fields = std::map<std::string, std::string, std::less<>>;

// A link end: "*", a role, or role:rank of this job.
std::string linkEnd(const Parser& p, std::string_view v, int64_t workers, int64_t servers) {
  if (v == "*" || v == "coordinator") return std::string(v);
  const size_t colon = v.find(':');
  const std::string role(v.substr(0, colon));
  if (role != "worker" && role != "ps") p.bad(fmt::format("'{}' is not worker[:RANK], ps[:RANK], coordinator or *", v));
  const int64_t count = role == "worker" ? workers : servers;
  if (count == 0) p.bad(fmt::format("the job has no {} process", role == "ps" ? "parameter-server" : "worker"));
  if (colon == std::string_view::npos || v.substr(colon + 1) == "*") return role;
  const int64_t rank = p.integer(v.substr(colon + 1), 0, std::numeric_limits<int64_t>::max());
  if (rank >= count) {
    p.bad(fmt::format("{} {} is not in the job ({} {} rank{}: 0 to {})", role, rank, count, role, count == 1 ? "" : "s",
                      count - 1));
  }
  return fmt::format("{}:{}", role, rank);
}

MessageFault parseMessageFault(const Fault& f, const Fields& fields, transport::LinkFaultKind kind, int64_t workers,
                               int64_t servers) {
  using transport::LinkFaultKind;
  static const std::set<std::string_view> known = {"kind", "from", "to",   "target", "both_ways",
                                                   "p",    "delay_ms", "bits", "at_s",   "duration_s"};
  for (const auto& [name, value] : fields) {
    if (known.count(name) == 0) {
      TROUPE_SETUP_ERROR("fault {} ({}): unknown field '{}' for a message fault (fields: {})", f.id, f.spec, name,
                         kMessageFields);
    }
  }
  auto has = [&](std::string_view name) { return fields.count(name) != 0; };
  auto value = [&](std::string_view name) -> std::string_view { return fields.find(name)->second; };
  MessageFault m;
  m.id = f.id;
  m.spec = f.spec;
  transport::LinkFaultRule& r = m.rule;
  r.kind = kind;
  const char* kindName = transport::linkFaultKindName(kind);
  auto refuse = [&](std::string_view name, const std::string& why) {
    if (has(name)) Parser{f, name}.bad(why);
  };
  if (kind == LinkFaultKind::kPartition) {
    if (!has("target") && !has("from")) {
      TROUPE_SETUP_ERROR("fault {} ({}): a partition needs target (the side cut off)", f.id, f.spec);
    }
    if (has("target") && has("from")) Parser{f, "target"}.bad("give target or from, not both");
    refuse("p", "a partition drops everything while it lasts (no probability)");
    if (!has("duration_s")) TROUPE_SETUP_ERROR("fault {} ({}): a partition needs duration_s", f.id, f.spec);
  } else {
    refuse("target", fmt::format("a {} fault names its links with from and to", kindName));
    if (!has("p")) TROUPE_SETUP_ERROR("fault {} ({}): a {} fault needs p (0 < p <= 1)", f.id, f.spec, kindName);
    r.probability = Parser{f, "p"}.number(value("p"), 0, true, 1);
  }
  if (has("target")) {
    r.from = linkEnd(Parser{f, "target"}, value("target"), workers, servers);
    if (r.from == "*") Parser{f, "target"}.bad("a partition cuts one side off the rest: name it (worker:1, ps, ...)");
  }
  if (has("from")) r.from = linkEnd(Parser{f, "from"}, value("from"), workers, servers);
  if (has("to")) r.to = linkEnd(Parser{f, "to"}, value("to"), workers, servers);
  if (has("both_ways")) {
    const std::string_view b = value("both_ways");
    if (b != "true" && b != "false" && b != "1" && b != "0") Parser{f, "both_ways"}.bad("true or false");
    r.bothWays = b == "true" || b == "1";
  }
  if (kind == LinkFaultKind::kDelay) {
    if (!has("delay_ms")) TROUPE_SETUP_ERROR("fault {} ({}): a delay fault needs delay_ms (MS or LO-HI)", f.id, f.spec);
    const Parser p{f, "delay_ms"};
    const std::string_view v = value("delay_ms");
    const size_t dash = v.find('-');
    const int64_t lo = p.integer(v.substr(0, dash), 0, 3'600'000);
    const int64_t hi = dash == std::string_view::npos ? lo : p.integer(v.substr(dash + 1), 0, 3'600'000);
    if (hi < lo) p.bad(fmt::format("{} is less than {}", hi, lo));
    if (hi == 0) p.bad("a delay of 0 ms");
    r.delayMin = std::chrono::milliseconds(lo);
    r.delayMax = std::chrono::milliseconds(hi);
  } else {
    refuse("delay_ms", fmt::format("a {} fault takes no delay", kindName));
  }
  if (kind == LinkFaultKind::kCorrupt) {
    if (has("bits")) r.bits = int(Parser{f, "bits"}.integer(value("bits"), 1, 64));
  } else {
    refuse("bits", fmt::format("a {} fault flips no bits", kindName));
  }
  if (has("at_s")) r.startSeconds = Parser{f, "at_s"}.number(value("at_s"), 0, false, kMaxSeconds);
  if (has("duration_s")) {
    r.endSeconds = r.startSeconds + Parser{f, "duration_s"}.number(value("duration_s"), 0.001, false, kMaxSeconds);
  }
  return m;
}

}  // namespace

const Fault* FaultPlan::byId(int64_t id) const {
  for (const auto& f : faults) {
    if (f.id == id) return &f;
  }
  return nullptr;
}

const char* faultKindName(FaultKind kind) {
  switch (kind) {
    case FaultKind::kKill: return "kill";
    case FaultKind::kStop: return "stop";
    case FaultKind::kSlow: return "slow";
    case FaultKind::kKillActor: return "kill-actor";
  }
  return "?";
}

uint64_t faultRandom(uint64_t seed, uint64_t stream, uint64_t draw) {
  // splitmix64 over the three: well mixed, and the same everywhere.
  uint64_t z = seed * 0x9E3779B97F4A7C15ull + stream * 0xBF58476D1CE4E5B9ull + draw * 0x94D049BB133111EBull + 1;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

bool slowsStep(const Fault& f, int64_t step) {
  return f.kind == FaultKind::kSlow && step >= f.atStep && (f.steps <= 0 || step < f.atStep + f.steps);
}

std::chrono::microseconds slowDelayOf(const Fault& f, double base) {
  if (f.delayMs > 0) return std::chrono::microseconds(f.delayMs * 1000);
  return std::chrono::microseconds(int64_t((f.factor - 1) * std::min(base, 3600.0) * 1e6));
}

std::vector<Fault> FaultPlan::stepFaultsOf(int64_t rank) const {
  std::vector<Fault> out;
  for (const auto& f : faults) {
    if (f.role == "worker" && f.rank == rank && f.stepTriggered()) out.push_back(f);
  }
  return out;
}

FaultPlan parseFaultPlan(const Config& config, int64_t workers, int64_t servers) {
  FaultPlan plan;
  plan.seed = uint64_t(config.getInt("faults.seed"));
  plan.startUnixMs = config.getInt("faults.start_unix_ms");
  plan.detectWithinSeconds = 2 * double(config.getInt("transport.heartbeat_timeout_ms")) / 1000.0 + 1.0;
  const auto& specs = config.getStringList("faults.plan");
  for (size_t i = 0; i < specs.size(); ++i) {
    Fault f;
    f.id = int64_t(i) + 1;
    f.spec = specs[i];
    std::map<std::string, std::string, std::less<>> fields;
    std::string_view rest = f.spec;
    while (!rest.empty()) {
      const size_t comma = rest.find(',');
      std::string_view item = rest.substr(0, comma);
      rest = comma == std::string_view::npos ? std::string_view() : rest.substr(comma + 1);
      while (!item.empty() && item.front() == ' ') item.remove_prefix(1);
      while (!item.empty() && item.back() == ' ') item.remove_suffix(1);
      if (item.empty()) continue;
      const size_t eq = item.find('=');
      if (eq == std::string_view::npos || eq == 0) {
        TROUPE_SETUP_ERROR("fault {} ({}): '{}' is not field=value", f.id, f.spec, item);
      }
      std::string name(item.substr(0, eq));
      if (!fields.emplace(name, std::string(item.substr(eq + 1))).second) {
        TROUPE_SETUP_ERROR("fault {} ({}): {} is given twice", f.id, f.spec, name);
      }
    }
    if (auto kind = fields.find("kind"); kind != fields.end() && kMessageKinds.count(kind->second)) {
      plan.messages.push_back(parseMessageFault(f, fields, kMessageKinds.at(kind->second), workers, servers));
      continue;
    }
    for (const auto& [name, value] : fields) {
      static const std::set<std::string_view> known = {"kind",     "target", "actor",      "at_step",
                                                       "at_s",     "every_s", "count",     "duration_s",
                                                       "factor",   "delay_ms", "steps",    "after_checkpoint"};
      if (known.count(name) == 0) {
        TROUPE_SETUP_ERROR("fault {} ({}): unknown field '{}' (fields: {})", f.id, f.spec, name, kFields);
      }
    }
    auto has = [&](std::string_view name) { return fields.count(name) != 0; };
    auto value = [&](std::string_view name) -> std::string_view { return fields.find(name)->second; };

    if (!has("kind")) {
      TROUPE_SETUP_ERROR("fault {} ({}): kind is missing (kill, stop, slow, drop, dup, delay, reorder, corrupt or "
                         "partition)",
                         f.id, f.spec);
    }
    const std::string_view kind = value("kind");
    if (const auto k = faultKindOf(kind)) {
      f.kind = *k;
    } else {
      TROUPE_SETUP_ERROR("fault {} ({}): kind: '{}' is not a fault kind (kill, stop, slow, drop, dup, delay, "
                         "reorder, corrupt or partition)",
                         f.id, f.spec, kind);
    }
    if (has("actor") && f.kind != FaultKind::kKill && f.kind != FaultKind::kKillActor) {
      Parser{f, "actor"}.bad(fmt::format("a {} fault hits a process, not one of its actors (kind=kill,actor=NAME)", kind));
    }
    if (has("actor")) f.kind = FaultKind::kKillActor;
    if (f.kind == FaultKind::kKillActor && !has("actor")) {
      TROUPE_SETUP_ERROR("fault {} ({}): a kill-actor fault needs actor (worker: worker, train-loader, test-loader, "
                         "tables; ps: shard, backup)",
                         f.id, f.spec);
    }

    if (!has("target")) TROUPE_SETUP_ERROR("fault {} ({}): target is missing (worker[:RANK] or ps[:RANK])", f.id, f.spec);
    {
      Parser p{f, "target"};
      const std::string_view t = value("target");
      const size_t colon = t.find(':');
      f.role = std::string(t.substr(0, colon));
      const std::string_view rank = colon == std::string_view::npos ? std::string_view("*") : t.substr(colon + 1);
      if (f.role != "worker" && f.role != "ps") p.bad(fmt::format("'{}' is not worker[:RANK] or ps[:RANK]", t));
      const int64_t count = f.role == "worker" ? workers : servers;
      if (count == 0) p.bad(fmt::format("the job has no {} process", f.role == "ps" ? "parameter-server" : "worker"));
      if (rank != "*") {
        f.rank = p.integer(rank, 0, std::numeric_limits<int64_t>::max());
        if (f.rank >= count) {
          p.bad(fmt::format("{} {} is not in the job ({} {} rank{}: 0 to {})", f.role, f.rank, count, f.role,
                            count == 1 ? "" : "s", count - 1));
        }
      }
    }

    auto number = [&](std::string_view name, double min, bool strict, double max) {
      return Parser{f, name}.number(value(name), min, strict, max);
    };
    auto integer = [&](std::string_view name, int64_t min, int64_t max) {
      return Parser{f, name}.integer(value(name), min, max);
    };
    auto refuse = [&](std::initializer_list<std::string_view> names, std::string_view why) {
      for (auto n : names) {
        if (has(n)) Parser{f, n}.bad(std::string(why));
      }
    };
    // Bounds a job can live with (a week, a day's stop, an hour's delay):
    // beyond them a value is a typo, and arithmetic on it would overflow.
    if (has("at_step")) f.atStep = integer("at_step", f.kind == FaultKind::kSlow ? 0 : 1, kMaxSteps);
    if (has("at_s")) f.atSeconds = number("at_s", 0, false, kMaxSeconds);
    if (has("every_s")) f.everySeconds = number("every_s", kMinEverySeconds, false, kMaxSeconds);
    if (has("count")) f.count = integer("count", 0, 1'000'000);
    if (has("duration_s")) f.durationSeconds = number("duration_s", 0.001, false, 86400);
    if (has("factor")) f.factor = number("factor", 1, true, 1000);
    if (has("delay_ms")) f.delayMs = integer("delay_ms", 1, 3'600'000);
    if (has("steps")) f.steps = integer("steps", 0, kMaxSteps);
    if (has("after_checkpoint")) {
      f.afterCheckpoint = integer("after_checkpoint", 1, 1'000'000);
      if (!has("at_s") && !has("every_s")) Parser{f, "after_checkpoint"}.bad("it goes with at_s or every_s");
    }

    if (f.kind == FaultKind::kKillActor) {
      const Parser p{f, "actor"};
      f.actor = std::string(value("actor"));
      const auto& names = actorNames(f.role);
      if (std::find(names.begin(), names.end(), f.actor) == names.end()) {
        p.bad(fmt::format("a {} has no actor '{}' ({})", f.role, f.actor, fmt::join(names, ", ")));
      }
      if (f.actor == "backup" && config.getInt("ps.replicas") != 2) {
        p.bad("a parameter server holds a backup only with ps.replicas = 2");
      }
      if (f.actor == "tables" && config.getString("train.mode") == "allreduce" &&
          config.getString("model.kind") == "mlp") {
        p.bad("an MLP trained by all-reduce has no tables");
      }
    }
    if (f.kind == FaultKind::kSlow) {
      refuse({"at_s", "every_s", "count", "duration_s"}, "a slow fault starts at a step (at_step) and lasts steps");
      if (f.role != "worker") Parser{f, "target"}.bad("only a worker is slowed");
      if (has("factor") == has("delay_ms")) {
        TROUPE_SETUP_ERROR("fault {} ({}): a slow fault takes one of factor and delay_ms", f.id, f.spec);
      }
      if (f.atStep < 0) f.atStep = 0;
    } else {
      refuse({"factor", "delay_ms", "steps"}, fmt::format("a {} fault takes no such field", kind));
      const int triggers = int(has("at_step")) + int(has("at_s")) + int(has("every_s"));
      if (triggers != 1) {
        TROUPE_SETUP_ERROR("fault {} ({}): a {} fault takes exactly one of at_step, at_s and every_s", f.id, f.spec,
                           kind);
      }
      if (has("count") && !has("every_s")) Parser{f, "count"}.bad("count goes with every_s");
      if (has("at_step") && f.role != "worker") {
        Parser{f, "at_step"}.bad("only a worker has steps of its own (use at_s or every_s for a parameter server)");
      }
      if (f.kind == FaultKind::kStop && !has("duration_s")) {
        TROUPE_SETUP_ERROR("fault {} ({}): a stop fault needs duration_s", f.id, f.spec);
      }
      if ((f.kind == FaultKind::kKill || f.kind == FaultKind::kKillActor) && has("duration_s")) {
        Parser{f, "duration_s"}.bad("a kill fault has no duration");
      }
    }
    // A step-triggered fault on no rank in particular: the rank, drawn once.
    if (f.rank < 0 && f.stepTriggered()) {
      f.rank = int64_t(faultRandom(plan.seed, uint64_t(f.id), 0) % uint64_t(f.role == "worker" ? workers : servers));
    }
    plan.faults.push_back(std::move(f));
  }
  return plan;
}

}  // namespace troupe::actors
