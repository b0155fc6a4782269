#include "transport/internal/control.h"

#include <arpa/inet.h>

#include <cstring>
#include <optional>

#include <capnp/message.h>
#include <capnp/serialize.h>
#include <kj/exception.h>

#include "transport/internal/capnp_util.h"
#include "transport/internal/control.capnp.h"

namespace troupe::transport::internal {
namespace {

constexpr size_t kMaxControlBytes = 64 << 10;
constexpr size_t kMaxMembers = 4096;
constexpr size_t kMaxText = 1024;

std::string bodyOf(capnp::MallocMessageBuilder& message) {
  std::string body(flatBytes(message), '\0');
  writeFlat(message, reinterpret_cast<std::byte*>(body.data()));
  return body;
}

// Runs `read` over the body's root; any Cap'n Proto complaint becomes a
// corruption Status.
template <class Root, class T, class F>
Expected<T> readBody(const std::string& body, const char* what, F read) {
  if (body.empty() || body.size() % sizeof(capnp::word) != 0 || body.size() > kMaxControlBytes) {
    return Status::corruption(fmt::format("{} of {} bytes (a non-zero multiple of 8, at most {})", what,
                                          body.size(), kMaxControlBytes));
  }
  const WordsOf words(body.data(), body.size());
  try {
    capnp::ReaderOptions options;
    options.traversalLimitInWords = 4 * words.get().size() + 64;  // fields may be read more than once
    options.nestingLimit = 8;
    capnp::FlatArrayMessageReader reader(words.get(), options);
    return read(reader.getRoot<Root>());
  } catch (const kj::Exception& e) {
    return Status::corruption(fmt::format("malformed {}: {}", what, e.getDescription().cStr()));
  }
}

template <size_t N>
bool copyFixed(capnp::Data::Reader from, std::array<uint8_t, N>* to) {
  if (from.size() != N) return false;
  std::memcpy(to->data(), from.begin(), N);
  return true;
}

Expected<Member> memberOf(wire::Member::Reader m) {
  Member out;
  out.nodeId = m.getNodeId();
  auto role = m.getRole();
  auto host = m.getHost();
  if (role.size() > kMaxText || host.size() > kMaxText) return Status::corruption("member text too long");
  out.role.assign(role.begin(), role.size());
  out.host.assign(host.begin(), host.size());
  out.port = m.getPort();
  in_addr addr{};
  if (out.nodeId == 0 || out.port == 0 || inet_pton(AF_INET, out.host.c_str(), &addr) != 1 ||
      addr.s_addr == htonl(INADDR_ANY)) {
    return Status::corruption(fmt::format("member {:x} with a bad address '{}:{}'", out.nodeId, out.host, out.port));
  }
  return out;
}

void setMember(wire::Member::Builder b, const Member& m) {
  b.setNodeId(m.nodeId);
  b.setRole(m.role);
  b.setHost(m.host);
  b.setPort(m.port);
}

}  // namespace

std::string encodeHello(const Hello& m) {
  capnp::MallocMessageBuilder b;
  auto r = b.initRoot<wire::Hello>();
  r.setNodeId(m.nodeId);
  r.setNonce(kj::arrayPtr(m.nonce.data(), m.nonce.size()));
  r.setIntegrity(m.integrity);
  return bodyOf(b);
}

std::string encodeChallenge(const Challenge& m) {
  capnp::MallocMessageBuilder b;
  auto r = b.initRoot<wire::Challenge>();
  r.setNodeId(m.nodeId);
  r.setNonce(kj::arrayPtr(m.nonce.data(), m.nonce.size()));
  r.setMac(kj::arrayPtr(m.mac.data(), m.mac.size()));
  r.setIntegrity(m.integrity);
  return bodyOf(b);
}

std::string encodeProof(const Proof& m) {
  capnp::MallocMessageBuilder b;
  b.initRoot<wire::Proof>().setMac(kj::arrayPtr(m.mac.data(), m.mac.size()));
  return bodyOf(b);
}

std::string encodeRefused(const Refused& m) {
  capnp::MallocMessageBuilder b;
  b.initRoot<wire::Refused>().setReason(m.reason.substr(0, kMaxText));
  return bodyOf(b);
}

std::string encodeJoin(const Member& self) {
  capnp::MallocMessageBuilder b;
  setMember(b.initRoot<wire::Join>().initSelf(), self);
  return bodyOf(b);
}

std::string encodeMembers(const MemberList& m) {
  capnp::MallocMessageBuilder b;
  auto r = b.initRoot<wire::Members>();
  r.setEpoch(m.epoch);
  auto list = r.initMembers(unsigned(m.members.size()));
  for (size_t i = 0; i < m.members.size(); ++i) setMember(list[unsigned(i)], m.members[i]);
  return bodyOf(b);
}

std::string encodeEmpty() {
  capnp::MallocMessageBuilder b;
  b.initRoot<wire::Proof>();
  return bodyOf(b);
}

Expected<Hello> decodeHello(const std::string& body) {
  return readBody<wire::Hello, Hello>(body, "hello", [](wire::Hello::Reader r) -> Expected<Hello> {
    Hello h;
    h.nodeId = r.getNodeId();
    h.integrity = r.getIntegrity();
    if (h.nodeId == 0 || !copyFixed(r.getNonce(), &h.nonce)) {
      return Status::corruption("hello without a node id or a 32-byte nonce");
    }
    return h;
  });
}

Expected<Challenge> decodeChallenge(const std::string& body) {
  return readBody<wire::Challenge, Challenge>(body, "challenge", [](wire::Challenge::Reader r) -> Expected<Challenge> {
    Challenge c;
    c.nodeId = r.getNodeId();
    c.integrity = r.getIntegrity();
    if (c.nodeId == 0 || !copyFixed(r.getNonce(), &c.nonce) || !copyFixed(r.getMac(), &c.mac)) {
      return Status::corruption("challenge without a node id, a 32-byte nonce or a 32-byte MAC");
    }
    return c;
  });
}

Expected<Proof> decodeProof(const std::string& body) {
  return readBody<wire::Proof, Proof>(body, "proof", [](wire::Proof::Reader r) -> Expected<Proof> {
    Proof p;
    if (!copyFixed(r.getMac(), &p.mac)) return Status::corruption("proof without a 32-byte MAC");
    return p;
  });
}

Expected<Refused> decodeRefused(const std::string& body) {
  return readBody<wire::Refused, Refused>(body, "refusal", [](wire::Refused::Reader r) -> Expected<Refused> {
    auto t = r.getReason();
    return Refused{std::string(t.begin(), std::min<size_t>(t.size(), kMaxText))};
  });
}

Expected<Member> decodeJoin(const std::string& body) {
  return readBody<wire::Join, Member>(body, "join", [](wire::Join::Reader r) { return memberOf(r.getSelf()); });
}

Expected<MemberList> decodeMembers(const std::string& body) {
  return readBody<wire::Members, MemberList>(body, "member list", [](wire::Members::Reader r) -> Expected<MemberList> {
    MemberList out;
    out.epoch = r.getEpoch();
    auto list = r.getMembers();
    if (list.size() > kMaxMembers) return Status::corruption(fmt::format("{} members (at most {})", list.size(), kMaxMembers));
    for (auto m : list) {
      auto member = memberOf(m);
      if (!member.hasValue()) return member.status();
      out.members.push_back(*member);
    }
    return out;
  });
}

}  // namespace troupe::transport::internal
