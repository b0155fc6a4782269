#include "actors/errors.h"

#include <caf/actor_system_config.hpp>
#include <caf/exit_reason.hpp>
#include <fmt/format.h>

#include "transport/remote_actors.h"

namespace troupe::actors {

const char* errcName(Errc e) {
  switch (e) {
    case Errc::kJobFailed: return "job failed";
    case Errc::kNotInJob: return "not in the job";
    case Errc::kRankTaken: return "rank taken";
    case Errc::kStartTimeout: return "start timeout";
    case Errc::kReplaceTimeout: return "replace timeout";
    case Errc::kRestartsExhausted: return "restarts exhausted";
    case Errc::kStalled: return "stalled";
    case Errc::kCoordinatorLost: return "coordinator lost";
    case Errc::kBadMessage: return "bad message";
    case Errc::kMemberFailed: return "failed";
    case Errc::kSetupFailed: return "set-up failed";
    case Errc::kRolledBack: return "rolled back";
  }
  return "unknown";
}

namespace {

std::string contextText(const caf::message& context) {
  if (context.empty()) return "";
  if (context.match_elements<std::string>()) return context.get_as<std::string>(0);
  return caf::to_string(context);
}

std::string renderTroupe(uint8_t code, caf::atom_value, const caf::message& context) {
  const bool known = code >= uint8_t(Errc::kJobFailed) && code <= uint8_t(Errc::kRolledBack);
  std::string out = fmt::format("troupe: {}", known ? errcName(Errc(code)) : "unknown error");
  const std::string ctx = contextText(context);
  if (!ctx.empty()) out += fmt::format(" ({})", ctx);
  return out;
}

}  // namespace

std::string describe(const caf::error& e) {
  if (!e) return "no error";
  const std::string ctx = contextText(e.context());
  const std::string suffix = ctx.empty() ? "" : fmt::format(" ({})", ctx);
  if (e.category() == caf::atom("troupe")) return renderTroupe(e.code(), e.category(), e.context());
  if (auto how = transport::departureOf(e)) return fmt::format("departure: {}{}", transport::departureName(*how), suffix);
  if (e.category() == caf::atom("system")) return caf::to_string(caf::sec(e.code())) + suffix;
  if (e.category() == caf::atom("exit")) return caf::to_string(caf::exit_reason(e.code())) + suffix;
  return caf::to_string(e);
}

void addErrorCategories(caf::actor_system_config& cfg) {
  cfg.add_error_category(caf::atom("troupe"), renderTroupe);
  transport::addDepartureCategory(cfg);
}

Loss lossOf(const caf::error& reason) {
  Loss l;
  l.reason = reason;
  if (auto how = transport::departureOf(reason)) {
    l.kind = Loss::Kind::kDeparted;
    l.departure = *how;
  } else if (!reason || reason == caf::exit_reason::normal) {
    l.kind = Loss::Kind::kNormal;
  } else {
    l.kind = Loss::Kind::kFailed;
  }
  return l;
}

std::string Loss::describe() const {
  switch (kind) {
    case Kind::kNormal: return "exited";
    case Kind::kDeparted: return transport::departureName(departure);
    case Kind::kFailed:
      if (reason.category() == caf::atom("troupe") && reason.code() == uint8_t(Errc::kMemberFailed)) {
        return "failed: " + contextText(reason.context());
      }
      if (reason.category() == caf::atom("troupe") && reason.code() == uint8_t(Errc::kSetupFailed)) {
        return "could not set up: " + contextText(reason.context());
      }
      if (reason.category() == caf::atom("troupe") && reason.code() == uint8_t(Errc::kRolledBack)) {
        return "stopped for a rollback: " + contextText(reason.context());
      }
      if (reason.category() == caf::atom("troupe") && reason.code() == uint8_t(Errc::kStalled)) {
        return "hung: " + contextText(reason.context());
      }
      return actors::describe(reason);
  }
  return "?";
}

}  // namespace troupe::actors
