#include "apps/metrics_server.h"

#include <fmt/format.h>
#include <httplib.h>

namespace troupe::apps {

Expected<std::unique_ptr<MetricsServer>> MetricsServer::start(const std::string& host, int port,
                                                              std::shared_ptr<const MetricsRegistry> registry) {
  if (port < 1 || port > 65535) return Status::invalidArgument(fmt::format("--metrics-port must be 1 to 65535, got {}", port));
  std::unique_ptr<MetricsServer> s(new MetricsServer);
  s->server_ = std::make_unique<httplib::Server>();
  // SO_REUSEADDR only: httplib's default adds SO_REUSEPORT, with which a
  // second job would share the port instead of being refused.
  s->server_->set_socket_options([](socket_t sock) {
    int yes = 1;
    ::setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof yes);
  });
  s->server_->Get("/metrics", [registry](const httplib::Request&, httplib::Response& res) {
    res.set_content(registry->render(), "text/plain; version=0.0.4; charset=utf-8");
  });
  s->server_->Get("/", [](const httplib::Request&, httplib::Response& res) {
    res.set_content("troupe: the job's metrics are at /metrics\n", "text/plain");
  });
  if (!s->server_->bind_to_port(host, port)) {
    return Status::unavailable(fmt::format("--metrics-port {}: cannot listen on {}:{} (in use, or not this machine's "
                                           "address)",
                                           port, host, port));
  }
  httplib::Server* server = s->server_.get();
  s->thread_ = std::thread([server] { server->listen_after_bind(); });
  return s;
}

MetricsServer::~MetricsServer() {
  if (server_) server_->stop();
  if (thread_.joinable()) thread_.join();
}

}  // namespace troupe::apps
