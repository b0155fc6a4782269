#include "apps/metrics_server.h"

#include <signal.h>
#include <sys/socket.h>

#include <chrono>

#include <fmt/format.h>
#include <httplib.h>

namespace troupe::apps {

Expected<std::unique_ptr<MetricsServer>> MetricsServer::start(const std::string& host, int port,
                                                              std::shared_ptr<const MetricsRegistry> registry) {
  if (port < 1 || port > 65535) return Status::invalidArgument(fmt::format("--metrics-port must be 1 to 65535, got {}", port));
  std::unique_ptr<MetricsServer> s(new MetricsServer);
  // httplib's server ignores SIGPIPE for the whole process (its sends take
  // no MSG_NOSIGNAL), and an ignored signal stays ignored in the processes
  // this one starts: the disposition is put back, and the server's threads
  // block SIGPIPE instead (below).
  struct sigaction before {};
  ::sigaction(SIGPIPE, nullptr, &before);
  s->server_ = std::make_unique<httplib::Server>();
  ::sigaction(SIGPIPE, &before, nullptr);
  // SO_REUSEADDR only: httplib's default adds SO_REUSEPORT, with which a
  // second job would share the port instead of being refused.
  s->server_->set_socket_options([](socket_t sock) {
    int yes = 1;
    ::setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof yes);
  });
  // A scraper's connection is not kept: the server stops at once at the end.
  s->server_->set_keep_alive_max_count(1);
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
  auto done = s->done_;
  s->thread_ = std::thread([server, done] {
    sigset_t pipe;
    sigemptyset(&pipe);
    sigaddset(&pipe, SIGPIPE);
    ::pthread_sigmask(SIG_BLOCK, &pipe, nullptr);  // (its pool's threads inherit the mask)
    server->listen_after_bind();
    done->store(true);
  });
  // Serving once stop() can stop it (it is a no-op before), bounded.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (!server->is_running() && !done->load() && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  if (!server->is_running()) return Status::unavailable(fmt::format("--metrics-port {}: the server did not start", port));
  return s;
}

MetricsServer::~MetricsServer() {
  // stop() ends listen_after_bind once it runs; repeated until it has.
  for (int i = 0; server_ && thread_.joinable() && !done_->load() && i < 10000; ++i) {
    server_->stop();
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  if (thread_.joinable()) {
    if (done_->load()) {
      thread_.join();
    } else {
      // 10 s and it did not stop: the thread is left (the process is
      // ending), and so is the server it runs on.
      thread_.detach();
      (void)server_.release();
    }
  }
}

}  // namespace troupe::apps
