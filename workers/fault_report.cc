#include "workers/fault_report.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

namespace troupe::workers {

double percentile(std::vector<double> xs, double p) {
  if (xs.empty()) return std::numeric_limits<double>::quiet_NaN();
  std::sort(xs.begin(), xs.end());
  const double k = double(xs.size() - 1) * p / 100.0;
  const size_t lo = size_t(k);
  const size_t hi = std::min(lo + 1, xs.size() - 1);
  return xs[lo] + (xs[hi] - xs[lo]) * (k - double(lo));
}

namespace {

// A loss laid to a fault (an injection, or a partition) that began at `at`:
// its outcome (detected, recovered, the seconds of each) and its kind's row.
template <typename Outcome>
void layLoss(const actors::RecoveryEvent& e, double at, Outcome* out, FaultReport::Row* row) {
  out->detected = true;
  out->detectSeconds = std::max(0.0, e.lostAtSeconds - at);
  ++row->detected;
  row->detectSeconds.push_back(out->detectSeconds);
  if (e.recoveredAtSeconds >= 0) {
    out->recovered = true;
    out->recoverSeconds = e.recoveredAtSeconds - e.lostAtSeconds;
    ++row->recovered;
    row->recoverSeconds.push_back(out->recoverSeconds);
  }
}

// Whether a process "role:rank" is on the side a rule names ("worker:1",
// "worker": any rank, "*").
bool onSide(const std::string& side, const std::string& role, int64_t rank) {
  return side == "*" || side == role || side == fmt::format("{}:{}", role, rank);
}

// The plan's message faults: a row per kind (the frames each process's
// filter hit, added up), the partitions, and what the links did.
void messageFaults(const JobOutcome& o, FaultReport* r) {
  using transport::LinkFaultKind;
  if (o.faultPlan.messages.empty()) return;
  r->hasLinks = true;
  auto& l = r->links;
  l.role = "all";
  for (const auto& c : o.links) {
    ++r->linkProcesses;
    l.resent += c.resent;
    l.duplicatesSuppressed += c.duplicatesSuppressed;
    l.heldOutOfOrder += c.heldOutOfOrder;
    l.gaps += c.gaps;
    l.malformedRefused += c.malformedRefused;
    l.linksGivenUp += c.linksGivenUp;
    l.dropped += c.dropped;
    l.duplicated += c.duplicated;
    l.delayed += c.delayed;
    l.reordered += c.reordered;
    l.corrupted += c.corrupted;
    l.partitioned += c.partitioned;
  }
  for (auto kind : {LinkFaultKind::kDrop, LinkFaultKind::kDuplicate, LinkFaultKind::kDelay, LinkFaultKind::kReorder,
                    LinkFaultKind::kCorrupt, LinkFaultKind::kPartition}) {
    const bool inPlan = std::any_of(o.faultPlan.messages.begin(), o.faultPlan.messages.end(),
                                    [&](const actors::MessageFault& m) { return m.rule.kind == kind; });
    if (!inPlan) continue;
    FaultReport::Row row;
    row.kind = transport::linkFaultKindName(kind);
    row.detects = kind == LinkFaultKind::kPartition;
    switch (kind) {
      case LinkFaultKind::kDrop: row.injected = l.dropped; break;
      case LinkFaultKind::kDuplicate: row.injected = l.duplicated; break;
      case LinkFaultKind::kDelay: row.injected = l.delayed; break;
      case LinkFaultKind::kReorder: row.injected = l.reordered; break;
      case LinkFaultKind::kCorrupt: row.injected = l.corrupted; break;
      case LinkFaultKind::kPartition: break;
    }
    if (kind == LinkFaultKind::kPartition) {
      std::vector<bool> taken(o.events.size(), false);
      for (const auto& m : o.faultPlan.messages) {
        if (m.rule.kind != kind) continue;
        FaultReport::Partition p;
        p.fault = m.id;
        p.target = m.rule.from;
        p.atSeconds = m.rule.startSeconds;
        p.durationSeconds = m.rule.endSeconds - m.rule.startSeconds;
        p.opened = p.atSeconds < o.endedAtSeconds;
        if (!p.opened) {
          ++row.unfired;
          r->partitions.push_back(p);
          continue;
        }
        ++row.injected;
        // The first process on a cut side the job lost while the
        // partition lasted (or soon after: the bound of a kill).
        const double until = std::min(m.rule.endSeconds, o.endedAtSeconds) + o.faultPlan.detectWithinSeconds;
        for (size_t i = 0; i < o.events.size(); ++i) {
          const auto& e = o.events[i];
          // Found by its silence, or by the reset of the connection it
          // closed when it timed out the coordinator first (the two race).
          const bool silent = e.cause == "timed out" || e.cause == "hung" || e.cause == "crashed" || e.cause == "left" ||
                              e.cause == "unreachable";
          // The side cut off (target), or either end of a cut between two.
          const bool cut = onSide(m.rule.from, e.role, e.rank) || (m.rule.to != "*" && onSide(m.rule.to, e.role, e.rank));
          if (taken[i] || !silent || !cut ||
              e.lostAtSeconds < p.atSeconds || e.lostAtSeconds > until) {
            continue;
          }
          taken[i] = true;
          layLoss(e, p.atSeconds, &p, &row);
          break;
        }
        r->partitions.push_back(p);
      }
    }
    r->rows.push_back(std::move(row));
  }
}

}  // namespace

Ledger ledgerOf(const JobOutcome& o) {
  Ledger l;
  l.expectedSamples = o.expectedSamples;
  if (o.shards.empty()) {
    l.samplesApplied.push_back(o.samplesApplied);
    l.workersAgree = !o.samplesDiffer;
    l.exact = o.expectedSamples > 0 && !o.samplesDiffer && o.samplesApplied == o.expectedSamples;
    return l;
  }
  l.exact = o.expectedSamples > 0;
  for (const auto& w : o.workers) {
    if (w.pushesAcknowledged < 0) {
      l.ranksNotCounted.push_back(w.rank);
    } else {
      l.pushesAcknowledged += w.pushesAcknowledged;
    }
  }
  for (const auto& sh : o.shards) {
    l.samplesApplied.push_back(sh.samplesApplied);
    int64_t inState = 0;
    for (const auto& w : o.workers) {
      if (w.pushesAcknowledged >= 0 && size_t(w.rank) < sh.pushesByWorker.size()) {
        inState += sh.pushesByWorker[size_t(w.rank)];
      }
    }
    l.pushesInState.push_back(inState);
    l.duplicatesSuppressed += sh.duplicatePushes;
    l.exact = l.exact && sh.samplesApplied == o.expectedSamples && inState == l.pushesAcknowledged;
  }
  return l;
}

FaultReport faultReport(const JobOutcome& o, bool binary, const JobOutcome* baseline) {
  FaultReport r;
  r.metric = binary ? "test_auc" : "test_accuracy";
  r.value = binary ? o.auc : o.accuracy;
  r.evaluated = o.ok && o.evaluated;
  if (baseline != nullptr) {
    r.hasBaseline = true;
    r.baselineOk = baseline->ok && baseline->evaluated;
    r.baseline = binary ? baseline->auc : baseline->accuracy;
  }
  r.seed = o.faultPlan.seed;
  for (const auto& f : o.faultPlan.faults) r.plan.push_back(f.spec);
  r.ok = o.ok;
  r.error = o.error;
  for (auto kind : {actors::FaultKind::kKill, actors::FaultKind::kStop, actors::FaultKind::kSlow,
                    actors::FaultKind::kKillActor}) {
    FaultReport::Row row;
    row.kind = actors::faultKindName(kind);
    r.rows.push_back(row);
  }
  // Each loss is laid to the latest fault that hit its process before it,
  // if that fault could have caused it: a kill found within
  // detectWithinSeconds, a stop while the process was stopped, a slow
  // worker any time after. A member stopped for a rollback was lost
  // because of another's fault, not its own.
  std::vector<int64_t> lossOf(o.injections.size(), -1);
  for (size_t i = 0; i < o.events.size(); ++i) {
    const auto& e = o.events[i];
    if (e.cause == "rolled back") continue;
    int64_t latest = -1;
    for (size_t j = 0; j < o.injections.size(); ++j) {
      const auto& in = o.injections[j];
      if (in.skipped || in.role != e.role || in.rank != e.rank || in.incarnation != e.incarnation ||
          in.atSeconds > e.lostAtSeconds + 1e-3) {
        continue;
      }
      if (latest < 0 || in.atSeconds >= o.injections[size_t(latest)].atSeconds) latest = int64_t(j);
    }
    if (latest < 0 || lossOf[size_t(latest)] >= 0) continue;
    const auto& in = o.injections[size_t(latest)];
    // A kill: any loss soon enough (the process is dead, however it was
    // noticed). A stop: the process fell silent (timed out) or was found
    // hung while stopped. A slow worker: found hung.
    bool could = false;
    const double after = e.lostAtSeconds - in.atSeconds;
    switch (in.kind) {
      case actors::FaultKind::kKill: could = after <= o.faultPlan.detectWithinSeconds; break;
      case actors::FaultKind::kStop:
        could = (e.cause == "timed out" || e.cause == "hung") &&
                after <= (o.faultPlan.byId(in.fault) ? o.faultPlan.byId(in.fault)->durationSeconds : 0) + 1.0;
        break;
      case actors::FaultKind::kSlow: could = e.cause == "hung"; break;
      // An actor killed: its supervisor gave up on it, and its process
      // reported the failure.
      case actors::FaultKind::kKillActor:
        could = e.cause == "failed" && after <= o.faultPlan.detectWithinSeconds;
        break;
    }
    if (could) lossOf[size_t(latest)] = int64_t(i);
  }
  for (size_t j = 0; j < o.injections.size(); ++j) {
    const auto& in = o.injections[j];
    FaultReport::Hit h;
    h.injection = in;
    h.target = fmt::format("{} {}{}", in.role, in.rank, in.actor.empty() ? "" : " (" + in.actor + ")");
    FaultReport::Row& row = r.rows[size_t(in.kind)];
    if (in.skipped) {
      ++row.skipped;
      r.hits.push_back(std::move(h));
      continue;
    }
    ++row.injected;
    if (lossOf[j] >= 0) {
      const auto& e = o.events[size_t(lossOf[j])];
      h.detectedBy = e.detectedBy;
      h.action = e.action;
      layLoss(e, in.atSeconds, &h, &row);
    }
    r.hits.push_back(std::move(h));
  }
  messageFaults(o, &r);
  for (const auto& f : o.faultPlan.faults) {
    if (f.everySeconds > 0) continue;
    const bool fired = std::any_of(o.injections.begin(), o.injections.end(),
                                   [&](const actors::Injection& in) { return in.fault == f.id; });
    if (!fired) ++r.rows[size_t(f.kind)].unfired;
  }
  for (const auto& w : o.workers) r.stepsRedone += w.stepsRedone;
  for (const auto& rb : o.rollbacks) r.stepsRedone += rb.stepsRedone;
  r.rollbacks = int64_t(o.rollbacks.size());
  r.replicas = o.replicas;
  r.promotions = o.promotions;
  r.copiesBuilt = o.replicasBuilt;
  r.crashes = o.crashes;
  r.regroups = o.regroups;
  r.ledger = ledgerOf(o);
  r.duplicatesSuppressed = r.ledger.duplicatesSuppressed;
  r.counted = o.countChecked > 0;
  r.countChecked = o.countChecked;
  r.countWrong = o.countWrong;
  r.countErrors = o.countErrors;
  return r;
}

namespace {

using Json = nlohmann::ordered_json;

// A time in seconds, or null when there is none (negative).
Json secondsOrNull(double s) { return s >= 0 ? Json(s) : Json(nullptr); }

}  // namespace

Json promotionsJson(const std::vector<JobOutcome::Promotion>& promotions) {
  Json out = Json::array();
  for (const auto& p : promotions) {
    out.push_back({{"shard", p.shard},
                   {"from_ps", p.from},
                   {"to_ps", p.to},
                   {"at_s", p.atSeconds},
                   {"training_at_s", secondsOrNull(p.trainingAtSeconds)}});
  }
  return out;
}

Json copiesBuiltJson(const std::vector<JobOutcome::ReplicaBuilt>& copies) {
  Json out = Json::array();
  for (const auto& b : copies) {
    out.push_back({{"shard", b.shard},
                   {"primary_ps", b.primary},
                   {"backup_ps", b.backup},
                   {"at_s", b.atSeconds},
                   {"transfer_s", b.seconds}});
  }
  return out;
}

std::string faultReportJson(const FaultReport& r) {
  Json out = Json::object();
  out["finished"] = r.ok;
  if (!r.ok) out["error"] = r.error;
  out["seed"] = r.seed;
  out[r.metric] = r.evaluated ? Json(r.value) : Json(nullptr);
  if (r.hasBaseline) out["baseline_" + r.metric] = r.baselineOk ? Json(r.baseline) : Json(nullptr);
  out["plan"] = r.plan;
  Json hits = Json::array();
  for (const auto& h : r.hits) {
    const auto& in = h.injection;
    hits.push_back({{"fault", in.fault},
                    {"kind", actors::faultKindName(in.kind)},
                    {"target", h.target},
                    {"process", in.incarnation},
                    {"pid", in.pid},
                    {"at_s", in.atSeconds},
                    {"step", in.step >= 0 ? Json(in.step) : Json(nullptr)},
                    {"skipped", in.skipped},
                    {"detected", h.detected},
                    {"detected_by", h.detected ? Json(h.detectedBy) : Json(nullptr)},
                    {"detect_s", secondsOrNull(h.detectSeconds)},
                    {"action", h.detected ? Json(h.action) : Json(nullptr)},
                    {"recovered", h.recovered},
                    {"recover_s", secondsOrNull(h.recoverSeconds)}});
  }
  out["injections"] = std::move(hits);
  Json kinds = Json::array();
  for (const auto& row : r.rows) {
    auto counted = [&](int64_t n) { return row.detects ? Json(n) : Json(nullptr); };
    // (percentile: NaN without a figure, written as null)
    kinds.push_back({{"kind", row.kind},
                     {"injected", row.injected},
                     {"skipped", row.skipped},
                     {"unfired", row.unfired},
                     {"detected", counted(row.detected)},
                     {"recovered", counted(row.recovered)},
                     {"detect_s_p50", percentile(row.detectSeconds, 50)},
                     {"detect_s_max", percentile(row.detectSeconds, 100)},
                     {"recover_s_p50", percentile(row.recoverSeconds, 50)},
                     {"recover_s_max", percentile(row.recoverSeconds, 100)}});
  }
  out["kinds"] = std::move(kinds);
  if (r.hasLinks) {
    Json parts = Json::array();
    for (const auto& p : r.partitions) {
      parts.push_back({{"fault", p.fault},
                       {"target", p.target},
                       {"at_s", p.atSeconds},
                       {"duration_s", p.durationSeconds},
                       {"opened", p.opened},
                       {"detected", p.detected},
                       {"detect_s", secondsOrNull(p.detectSeconds)},
                       {"recovered", p.recovered},
                       {"recover_s", secondsOrNull(p.recoverSeconds)}});
    }
    out["partitions"] = std::move(parts);
    const auto& l = r.links;
    out["links"] = {{"processes", r.linkProcesses},
                    {"dropped", l.dropped},
                    {"duplicated", l.duplicated},
                    {"delayed", l.delayed},
                    {"reordered", l.reordered},
                    {"corrupted", l.corrupted},
                    {"cut_by_partitions", l.partitioned},
                    {"sent_again", l.resent},
                    {"duplicates_suppressed", l.duplicatesSuppressed},
                    {"held_for_an_earlier_one", l.heldOutOfOrder},
                    {"resend_requests", l.gaps},
                    {"malformed_refused", l.malformedRefused},
                    {"given_up", l.linksGivenUp}};
  }
  out["steps_redone"] = r.stepsRedone;
  out["rollbacks"] = r.rollbacks;
  out["regroups"] = r.regroups;
  out["replicas"] = r.replicas;
  out["promotions"] = promotionsJson(r.promotions);
  out["copies_built"] = copiesBuiltJson(r.copiesBuilt);
  out["duplicates_suppressed"] = r.duplicatesSuppressed;
  out["crashes"] = r.crashes;
  if (r.counted) out["counts"] = {{"checked", r.countChecked}, {"wrong", r.countWrong}, {"errors", r.countErrors}};
  out["ledger"] = {{"expected_samples", r.ledger.expectedSamples},
                   {"samples_applied", r.ledger.samplesApplied},
                   {"pushes_acknowledged",
                    r.ledger.pushesInState.empty() ? Json(nullptr) : Json(r.ledger.pushesAcknowledged)},
                   {"pushes_in_state", r.ledger.pushesInState},
                   {"ranks_not_counted", r.ledger.ranksNotCounted},
                   {"exact", r.ledger.exact}};
  // Invalid UTF-8 in a string (an error text, a plan as typed) is replaced,
  // not thrown over.
  return out.dump(2, ' ', false, Json::error_handler_t::replace) + "\n";
}

std::string faultKindTable(const std::vector<FaultReport::Row>& rows, const std::vector<double>& percentiles) {
  auto name = [](double p) { return p >= 100 ? std::string("max") : fmt::format("p{:g}", p); };
  std::string out = fmt::format("  {:<10} {:>8} {:>8} {:>8} {:>9} {:>9}", "kind", "injected", "skipped", "unfired",
                                "detected", "recovered");
  for (double p : percentiles) out += fmt::format(" {:>10}", "detect " + name(p));
  for (double p : percentiles) out += fmt::format(" {:>11}", "recover " + name(p));
  out += "\n";
  auto cell = [](const std::vector<double>& xs, double p) {
    return xs.empty() ? std::string("-") : fmt::format("{:.3f}", percentile(xs, p));
  };
  for (const auto& row : rows) {
    if (row.injected == 0 && row.skipped == 0 && row.unfired == 0) continue;
    if (!row.detects) {
      out += fmt::format("  {:<10} {:>8} {:>8} {:>8} {:>9} {:>9}", row.kind, row.injected, row.skipped, row.unfired, "-",
                         "-");
      for (size_t i = 0; i < 2 * percentiles.size(); ++i) out += fmt::format(" {:>{}}", "-", i < percentiles.size() ? 10 : 11);
      out += "\n";
      continue;
    }
    out += fmt::format("  {:<10} {:>8} {:>8} {:>8} {:>9} {:>9}", row.kind, row.injected, row.skipped, row.unfired,
                       row.detected, row.recovered);
    for (double p : percentiles) out += fmt::format(" {:>10}", cell(row.detectSeconds, p));
    for (double p : percentiles) out += fmt::format(" {:>11}", cell(row.recoverSeconds, p));
    out += "\n";
  }
  return out;
}

std::string faultReportTable(const FaultReport& r) {
  std::string out = fmt::format("faults (seed {}):\n", r.seed);
  out += faultKindTable(r.rows, {50, 100});
  out += fmt::format("  steps redone {}, rollbacks {}, groups formed again {}, duplicate pushes suppressed {}\n",
                     r.stepsRedone, r.rollbacks, r.regroups, r.duplicatesSuppressed);
  if (r.replicas > 1) {
    double slowest = 0;
    for (const auto& b : r.copiesBuilt) slowest = std::max(slowest, b.seconds);
    double resumed = -1;
    for (const auto& p : r.promotions) {
      if (p.trainingAtSeconds >= 0) resumed = std::max(resumed, p.trainingAtSeconds - p.atSeconds);
    }
    out += fmt::format("  replicas {}: backups promoted {}{}, copies built again {}{}\n", r.replicas,
                       r.promotions.size(),
                       resumed < 0 ? "" : fmt::format(" (training went on within {:.2f} s)", resumed),
                       r.copiesBuilt.size(),
                       r.copiesBuilt.empty() ? "" : fmt::format(" (state moved in {:.3f} s at most)", slowest));
  }
  if (r.hasLinks) {
    const auto& l = r.links;
    out += fmt::format("  links ({} processes' counts): {} frames sent again, {} duplicates suppressed, {} held for an "
                       "earlier one, {} resend requests, {} malformed frames refused, {} links given up\n",
                       r.linkProcesses, l.resent, l.duplicatesSuppressed, l.heldOutOfOrder, l.gaps, l.malformedRefused,
                       l.linksGivenUp);
  }
  out += fmt::format("  processes that died of a crash signal (SIGSEGV, SIGABRT, ...): {}\n", r.crashes.size());
  for (const auto& c : r.crashes) out += fmt::format("    {}\n", c);
  const Ledger& l = r.ledger;
  std::string pushes;
  if (!l.pushesInState.empty()) {
    pushes = fmt::format("; pushes acknowledged {}, in the shards' state {}", l.pushesAcknowledged,
                         fmt::join(l.pushesInState, ", "));
    if (!l.ranksNotCounted.empty()) {
      pushes += fmt::format(" (worker ranks {} not counted: the job went on without them)",
                            fmt::join(l.ranksNotCounted, ", "));
    }
  }
  out += fmt::format("  ledger: samples applied {} of {} expected{}{}: {}\n", fmt::join(l.samplesApplied, ", "),
                     l.expectedSamples, l.pushesInState.empty() ? " (the workers' group)" : " (per shard)", pushes,
                     l.exact ? "exact" : (l.expectedSamples > 0 ? "NOT EXACT" : "not counted (train.max_steps)"));
  if (r.counted) {
    out += r.countWrong == 0
               ? fmt::format("  counts: all {} values (every key's row, the dense parameters) equal the counts of the "
                             "data: exact\n",
                             r.countChecked)
               : fmt::format("  counts: {} of {} values NOT EXACT: {}\n", r.countWrong, r.countChecked, r.countErrors);
  }
  const char* name = r.metric == "test_auc" ? "test AUC" : "test accuracy";
  if (!r.ok) {
    out += fmt::format("  the job did not finish: {}\n", r.error);
  } else if (!r.evaluated) {
    out += fmt::format("  the job did not evaluate its final model\n");
  } else if (r.hasBaseline && r.baselineOk) {
    out += fmt::format("  {} {:.5f}; without the faults (--baseline, the same seed) {:.5f}: {:+.5f}\n", name, r.value,
                       r.baseline, r.value - r.baseline);
  } else if (r.hasBaseline) {
    out += fmt::format("  {} {:.5f}; the run without the faults (--baseline) did not finish\n", name, r.value);
  }
  return out;
}

}  // namespace troupe::workers
