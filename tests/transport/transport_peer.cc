#include "tests/transport/transport_peer.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include <caf/all.hpp>
#include <ucp/api/ucp.h>

#include "common/hash.h"
#include "common/logging.h"
#include "transport/frame.h"
#include "transport/remote_actors.h"

namespace troupe::transport::testing {
namespace {

struct PeerArgs {
  std::string mode;
  uint64_t id = 0;
  std::string coordinator;
  std::string token = "test-token";
  std::string listen = "127.0.0.1";
  int lifetimeMs = 60000;
  int heartbeatTimeoutMs = 1000;
  std::string portFile;
  uint64_t expectPeer = 0;
  int count = 0;
};

struct EchoState {
  int64_t next = 0;
  int64_t count = 0;
  bool ordered = true;
  std::vector<caf::response_promise> held;
};

// Frames that must be counted and dropped by the receiver, never crash it.
std::vector<std::vector<std::byte>> garbageFrames(uint64_t self) {
  std::vector<std::vector<std::byte>> out;
  Rng rng(7);
  for (int i = 0; i < 20; ++i) {  // random bytes of random length
    std::vector<std::byte> b(8 + rng.next() % 300);
    for (auto& x : b) x = std::byte(rng.next());
    out.push_back(std::move(b));
  }
  Envelope e;
  e.sourceNode = self;
  e.kind = kActorMessageKind;
  e.destActor = publishedActorId("nobody");
  e.body = "not a cap'n proto message";  // wrong length and content
  out.push_back(encodeFrame(e, {}));
  e.body.assign(64, '\xff');  // right length, garbage words
  out.push_back(encodeFrame(e, {}));
  std::vector<std::byte> tensor(100, std::byte{1});
  auto frame = encodeFrame(e, {TensorView{tensor.data(), tensor.size(), DType::kBytes}});
  out.push_back(std::vector<std::byte>(frame.begin(), frame.end() - 50));  // truncated tensor
  frame[4] = std::byte{0xf8};  // envelope length lies
  out.push_back(frame);
  e.sourceNode = self + 1000;  // claims another sender
  out.push_back(encodeFrame(e, {}));
  return out;
}

void sendBurst(caf::stateful_actor<EchoState>* self, const caf::actor& dest, int64_t first, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    self->send(dest, seq_atom::value, first + i);
    if (i % 50 == 49) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

caf::behavior echoActor(caf::stateful_actor<EchoState>* self, RemoteActors* remote, uint64_t selfId) {
  return {
      [=](echo_atom, const Tensor& t) { return t; },
      [=](add_atom, int64_t a, int64_t b) { return a + b; },
      [=](seq_atom, int64_t i) {
        if (i != self->state.next) self->state.ordered = false;
        self->state.next = i + 1;
        self->state.count++;
      },
      [=](seq_atom, int64_t i, const Tensor& t) {
        if (i != self->state.next || t.bytes == 0 || t.as<int64_t>()[0] != i) self->state.ordered = false;
        self->state.next = i + 1;
        self->state.count++;
      },
      [=](seqcheck_atom) { return caf::make_message(self->state.count, self->state.ordered); },
      [=](hold_atom) { self->state.held.push_back(self->make_response_promise()); },
      [=](whoami_atom) { return selfId; },
      [=](relay_atom, uint64_t peer, int64_t a, int64_t b) {
        auto rp = self->make_response_promise<int64_t>();
        auto dest = remote->remoteActor(peer, "echo");
        self->request(dest, std::chrono::seconds(10), add_atom::value, a, b)
            .then([=](int64_t sum) mutable { rp.deliver(sum); }, [=](caf::error& e) mutable { rp.deliver(e); });
        return rp;
      },
      [=](burst_atom, uint64_t peer, int64_t n) {
        // seq 0 .. n-1 to the peer's echo, 50 every millisecond or so: the
        // first opens this node's connection to it, and the rest go on
        // while the handshakes of both sides' connections finish.
        sendBurst(self, remote->remoteActor(peer, "echo"), 0, n);
        return n;
      },
      [=](burst_atom, uint64_t peer, int64_t first, int64_t n) {  // seq first .. first + n - 1
        sendBurst(self, remote->remoteActor(peer, "echo"), first, n);
        return n;
      },
      [=](handed_atom) { return int64_t(remote->node().stats().framesHandedOver); },
      [=](garbage_atom, uint64_t peer) {
        auto frames = garbageFrames(selfId);
        const int64_t n = int64_t(frames.size());
        for (auto& f : frames) remote->node().sendRawFrame(peer, std::move(f));
        return n;
      },
      [=](quit_atom) {
        self->quit();
        return true;
      },
  };
}

int runEcho(const PeerArgs& a) {
  caf::actor_system_config cfg;
  cfg.set("scheduler.max-threads", 2);
  caf::actor_system system{cfg};
  NodeOptions options;
  options.nodeId = a.id;
  options.role = "echo";
  options.listenHost = a.listen;
  options.token = a.token;
  options.coordinator = a.coordinator;
  options.heartbeatInterval = std::chrono::milliseconds(100);
  options.heartbeatTimeout = std::chrono::milliseconds(a.heartbeatTimeoutMs);
  auto remote = RemoteActors::start(system, options);
  if (!remote.hasValue()) {
    logger("tests")->error("peer: {}", remote.status().message());
    return 2;
  }
  auto echo = system.spawn(echoActor, remote->get(), a.id);
  (*remote)->publish(echo, "echo");
  // Announce readiness only after publishing: join now.
  Status joined = (*remote)->node().waitForMembers(2, std::chrono::seconds(10));
  if (!joined.isOk()) {
    logger("tests")->error("peer: {}", joined.message());
    return 3;
  }
  caf::scoped_actor waiter{system};
  waiter->monitor(echo);
  int rc = 0;
  waiter->receive([](const caf::down_msg&) {},
                  caf::after(std::chrono::milliseconds(a.lifetimeMs)) >> [&] { rc = 4; });
  // Let the reply to quit leave before the node goes.
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  caf::anon_send_exit(echo, caf::exit_reason::user_shutdown);
  remote->reset();
  return rc;
}

int runBadToken(const PeerArgs& a) {
  caf::actor_system_config cfg;
  cfg.set("scheduler.max-threads", 1);
  caf::actor_system system{cfg};
  NodeOptions options;
  options.nodeId = a.id;
  options.listenHost = a.listen;
  options.token = a.token;
  options.coordinator = a.coordinator;
  auto remote = RemoteActors::start(system, options);
  if (!remote.hasValue()) return 2;
  Status joined = (*remote)->node().waitForMembers(2, std::chrono::seconds(10));
  if (joined.isOk()) return 1;
  logger("tests")->info("peer refused as expected: {}", joined.message());
  return joined.message().find("could not join") != std::string::npos ? 0 : 5;
}

// A slow-loris: opens UCX connections to the coordinator and sends nothing on
// any of them, so each holds one of the coordinator's handshake slots until
// it is closed to make room, refused or past its deadline. Opens --count of
// them 2 ms apart and says how many in --port-file; then one more every
// 10 ms until --lifetime-ms is over, and writes how many it opened in all
// to --port-file.total before it exits.
int runIdle(const PeerArgs& a) {
  auto hp = parseHostPort(a.coordinator);
  if (!hp.hasValue()) return 2;
  sockaddr_in sin{};
  sin.sin_family = AF_INET;
  sin.sin_port = htons(hp->second);
  if (inet_pton(AF_INET, hp->first.c_str(), &sin.sin_addr) != 1) return 2;
  ucp_config_t* config = nullptr;
  if (ucp_config_read(nullptr, nullptr, &config) != UCS_OK) return 2;
  ucp_params_t params{};
  params.field_mask = UCP_PARAM_FIELD_FEATURES;
  params.features = UCP_FEATURE_AM | UCP_FEATURE_WAKEUP;
  ucp_context_h context = nullptr;
  const ucs_status_t st = ucp_init(&params, config, &context);
  ucp_config_release(config);
  if (st != UCS_OK) return 2;
  ucp_worker_params_t wp{};
  wp.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
  wp.thread_mode = UCS_THREAD_MODE_SINGLE;
  ucp_worker_h worker = nullptr;
  if (ucp_worker_create(context, &wp, &worker) != UCS_OK) return 2;
  auto progress = [&](std::chrono::milliseconds forMs) {
    const auto until = std::chrono::steady_clock::now() + forMs;
    while (std::chrono::steady_clock::now() < until) {
      if (ucp_worker_progress(worker) == 0) std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
  };
  std::vector<ucp_ep_h> eps;
  auto open = [&] {
    ucp_ep_params_t ep{};
    ep.field_mask = UCP_EP_PARAM_FIELD_FLAGS | UCP_EP_PARAM_FIELD_SOCK_ADDR | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE;
    ep.flags = UCP_EP_PARAMS_FLAGS_CLIENT_SERVER;
    ep.sockaddr.addr = reinterpret_cast<const sockaddr*>(&sin);
    ep.sockaddr.addrlen = sizeof sin;
    ep.err_mode = UCP_ERR_HANDLING_MODE_NONE;  // as the node on one host
    ucp_ep_h h = nullptr;
    if (ucp_ep_create(worker, &ep, &h) == UCS_OK) eps.push_back(h);
  };
  auto say = [&](const std::string& path) {
    const std::string tmp = path + ".tmp";
    FILE* f = fopen(tmp.c_str(), "w");
    if (!f) return false;
    fprintf(f, "%zu\n", eps.size());
    fclose(f);
    return rename(tmp.c_str(), path.c_str()) == 0;
  };
  const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(a.lifetimeMs);
  for (int i = 0; i < a.count; ++i) {
    open();
    progress(std::chrono::milliseconds(2));
  }
  progress(std::chrono::milliseconds(100));
  if (!say(a.portFile)) return 2;
  while (std::chrono::steady_clock::now() < until) {
    open();
    progress(std::chrono::milliseconds(10));
  }
  progress(std::chrono::milliseconds(100));
  if (!say(a.portFile + ".total")) return 2;
  ucp_request_param_t rp{};
  rp.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
  rp.flags = UCP_EP_CLOSE_FLAG_FORCE;
  for (ucp_ep_h h : eps) {
    void* req = ucp_ep_close_nbx(h, &rp);
    if (UCS_PTR_IS_PTR(req)) ucp_request_free(req);
  }
  progress(std::chrono::milliseconds(50));
  ucp_worker_destroy(worker);
  ucp_cleanup(context);
  return 0;
}

int runCoordinator(const PeerArgs& a) {
  caf::actor_system_config cfg;
  cfg.set("scheduler.max-threads", 2);
  caf::actor_system system{cfg};
  NodeOptions options;
  options.nodeId = a.id;
  options.role = "coordinator";
  options.isCoordinator = true;
  options.listenHost = a.listen;
  options.token = a.token;
  auto remote = RemoteActors::start(system, options);
  if (!remote.hasValue()) {
    logger("tests")->error("coordinator: {}", remote.status().message());
    return 2;
  }
  {
    const std::string tmp = a.portFile + ".tmp";
    FILE* f = fopen(tmp.c_str(), "w");
    if (!f) return 2;
    fprintf(f, "%u\n", unsigned((*remote)->node().port()));
    fclose(f);
    if (rename(tmp.c_str(), a.portFile.c_str()) != 0) return 2;
  }
  Status joined = (*remote)->node().waitForMembers(2, std::chrono::seconds(20));
  if (!joined.isOk()) {
    logger("tests")->error("coordinator: {}", joined.message());
    return 3;
  }
  auto echo = (*remote)->remoteActor(a.expectPeer, "echo");
  auto sum = ask(system, echo, caf::make_message(add_atom::value, int64_t(40), int64_t(2)));
  if (!sum.match_elements<int64_t>() || sum.get_as<int64_t>(0) != 42) {
    logger("tests")->error("coordinator: add gave {}", caf::to_string(sum));
    return 4;
  }
  std::vector<int64_t> data(1 << 17);
  for (size_t i = 0; i < data.size(); ++i) data[i] = int64_t(mix64(i));
  auto back = ask(system, echo, caf::make_message(echo_atom::value, Tensor::copyOf(data.data(), data.size() * 8)));
  if (!back.match_elements<Tensor>() || back.get_as<Tensor>(0).bytes != data.size() * 8 ||
      std::memcmp(back.get_as<Tensor>(0).data, data.data(), data.size() * 8) != 0) {
    logger("tests")->error("coordinator: tensor round trip gave {}", caf::to_string(back));
    return 5;
  }
  for (const Member& m : (*remote)->node().members()) {
    logger("tests")->info("member {:x} {} at {}:{}", m.nodeId, m.role, m.host, m.port);
  }
  ask(system, echo, caf::make_message(quit_atom::value));
  return 0;
}

}  // namespace

caf::message ask(caf::actor_system& system, const caf::actor& dest, caf::message msg,
                 std::chrono::milliseconds timeout) {
  caf::scoped_actor self{system};
  caf::message out;
  self->request(dest, timeout, std::move(msg))
      .receive([&]() {},
               [&](caf::error& e) {
                 out = e == caf::sec::unexpected_response ? e.context() : caf::make_message(std::move(e));
               });
  return out;
}

int runPeerIfAsked(int argc, char** argv) {
  PeerArgs a;
  bool asked = false;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i], v = argv[i + 1];
    if (k == "--peer") {
      a.mode = v;
      asked = true;
    } else if (k == "--id") {
      a.id = std::stoull(v);
    } else if (k == "--coordinator") {
      a.coordinator = v;
    } else if (k == "--token") {
      a.token = v;
    } else if (k == "--listen") {
      a.listen = v;
    } else if (k == "--lifetime-ms") {
      a.lifetimeMs = std::stoi(v);
    } else if (k == "--port-file") {
      a.portFile = v;
    } else if (k == "--expect-peer") {
      a.expectPeer = std::stoull(v);
    } else if (k == "--count") {
      a.count = std::stoi(v);
    } else if (k == "--heartbeat-timeout-ms") {
      a.heartbeatTimeoutMs = std::stoi(v);
    }
  }
  if (!asked) return -1;
  if (a.mode == "echo") return runEcho(a);
  if (a.mode == "badtoken") return runBadToken(a);
  if (a.mode == "coordinator") return runCoordinator(a);
  if (a.mode == "idle") return runIdle(a);
  return 64;
}

}  // namespace troupe::transport::testing
