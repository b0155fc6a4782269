// --metrics-port: the coordinator serves its MetricsRegistry over HTTP
// (GET /metrics, the Prometheus text format) with Debian's cpp-httplib, on
// the transport's listen host only, while the job runs.
#pragma once

#include <atomic>
#include <memory>
#include <string>
#include <thread>

#include "common/metrics_registry.h"
#include "common/status.h"

namespace httplib {
class Server;
}

namespace troupe::apps {

class MetricsServer {
 public:
  // Listens on host:port (SetupError-worthy Status when it cannot).
  static Expected<std::unique_ptr<MetricsServer>> start(const std::string& host, int port,
                                                        std::shared_ptr<const MetricsRegistry> registry);
  ~MetricsServer();  // stops serving and joins its thread
  MetricsServer(const MetricsServer&) = delete;
  MetricsServer& operator=(const MetricsServer&) = delete;

 private:
  MetricsServer() = default;
  std::unique_ptr<httplib::Server> server_;
  std::thread thread_;
  std::shared_ptr<std::atomic<bool>> done_ = std::make_shared<std::atomic<bool>>(false);  // listen returned
};

}  // namespace troupe::apps
