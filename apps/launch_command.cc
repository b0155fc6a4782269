#include "apps/launch_command.h"

#include <memory>

#include <cstdlib>

#include "actors/launcher.h"
#include "actors/node_agent.h"
#include "apps/cli_common.h"
#include "apps/train_command.h"
#include "common/check.h"
#include "common/logging.h"
#include "transport/node_config.h"
#include "workers/job_messages.h"
#include "workers/ps_role.h"
#include "workers/worker_role.h"

namespace troupe::apps {
namespace {

struct LaunchFlags {
  CommonFlags common;
  std::string role;
  std::string coordinator;
  std::string listen;
  int64_t rank = -1;
  std::string summaryJson;
  int metricsPort = 0;
};

int runLaunch(const LaunchFlags& flags) {
  if (flags.role == "coordinator") {
    return runCoordinatorCommand(flags.common, flags.coordinator, flags.summaryJson, flags.metricsPort);
  }
  if (flags.metricsPort != 0) {
    TROUPE_SETUP_ERROR("launch --role {}: --metrics-port is the coordinator's (it serves the whole job's metrics)",
                       flags.role);
  }
  if (!flags.common.faults.empty()) {
    TROUPE_SETUP_ERROR("launch --role {}: --fault goes to the coordinator (troupe launch --role coordinator), whose "
                       "plan every process follows",
                       flags.role);
  }
  Config config = loadConfig(flags.common);
  actors::MemberOptions m;
  m.role = flags.role;
  m.types = workers::trainingWireTypes();
  m.configure = workers::addTrainingTypes;
  m.node = transport::nodeOptionsFromConfig(config);
  m.node.token = transport::jobToken(config);
  m.node.coordinator = flags.coordinator;
  auto hp = transport::parseHostPort(flags.coordinator);
  if (!hp.hasValue()) TROUPE_SETUP_ERROR("--coordinator: {}", hp.status().message());
  if (!flags.listen.empty()) {
    m.node.listenHost = flags.listen;
  } else if (!config.isSet("transport.listen_host") && hp->first.rfind("127.", 0) != 0 && hp->first != "localhost") {
    TROUPE_SETUP_ERROR("the coordinator is at {}, not on loopback: give --listen ADDRESS, the address of this "
                       "machine the other processes reach it at", flags.coordinator);
  }
  m.requestedRank = flags.rank;
  if (m.requestedRank < 0) {
    std::string from;
    if (auto r = actors::launcherRank(&from)) {
      m.requestedRank = *r;
      logger("apps")->info("rank {} from {}", *r, from);
    }
  }
  // NCCL's bootstrap sockets stay on loopback with the transport (set
  // before any thread starts: getenv elsewhere is not synchronized).
  if (m.node.listenHost.rfind("127.", 0) == 0 || m.node.listenHost == "localhost") {
    ::setenv("NCCL_SOCKET_IFNAME", "lo", 0);
  }
  const int threads = flags.common.threads > 0 ? flags.common.threads : 0;
  if (flags.role == "ps") {
    workers::PsRole role(threads);
    return actors::runMember(m, role);
  }
  workers::WorkerRole role(threads);
  // supervision.on_worker_loss = shrink in ps mode moves a lost rank into a
  // live worker's process.
  m.anotherRole = [threads] { return std::make_unique<workers::WorkerRole>(threads); };
  return actors::runMember(m, role);
}

}  // namespace

void addLaunchCommand(CLI::App* app, int* result) {
  auto flags = std::make_shared<LaunchFlags>();
  auto* cmd = app->add_subcommand("launch", "Start one process of a multi-process job (coordinator, ps or worker)");
  addCommonFlags(cmd, &flags->common);
  addFaultFlag(cmd, &flags->common);
  cmd->add_option("--role", flags->role, "coordinator, ps or worker")
      ->required()
      ->check(CLI::IsMember({"coordinator", "ps", "worker"}));
  cmd->add_option("--coordinator", flags->coordinator,
                  "HOST:PORT of the coordinator (for the coordinator: where it listens)")
      ->required();
  cmd->add_option("--listen", flags->listen, "ps / worker: the address this process listens on (default: "
                                             "transport.listen_host)");
  cmd->add_option("--rank", flags->rank, "ps / worker: the rank to ask for (default: the launcher's rank variable)");
  cmd->add_option("--summary-json", flags->summaryJson, "coordinator: write the job's summary as JSON here");
  cmd->add_option("--metrics-port", flags->metricsPort,
                  "coordinator: serve the job's metrics (Prometheus text format) on its host at this port");
  cmd->callback([=] { *result = runGuarded([&] { return runLaunch(*flags); }); });
}

}  // namespace troupe::apps
