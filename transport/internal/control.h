// The transport's own messages (handshake, heartbeat, goodbye, bootstrap) as
// plain structs, and their Cap'n Proto bodies (internal/control.capnp).
// Hello and Proof arrive before a peer is authenticated, so their decoders
// face anyone who can open a socket: every decode is bounds-checked, checks
// lengths and ranges, and returns an error value, never throws.
//
// Threading: plain functions; safe from any thread.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"
#include "transport/handshake.h"
#include "transport/node.h"

namespace troupe::transport::internal {

enum ControlKind : uint16_t {
  kHello = 1,
  kChallenge = 2,
  kProof = 3,
  kHeartbeat = 4,
  kJoin = 5,
  kMembers = 6,
  kWelcome = 7,
  kRefused = 8,
  kGoodbye = 9,
};

struct Hello {
  uint64_t nodeId = 0;
  Nonce nonce{};
  uint8_t integrity = 0;  // transport/frame.h's Integrity
};
struct Challenge {
  uint64_t nodeId = 0;
  Nonce nonce{};
  Mac mac{};
  uint8_t integrity = 0;
};
struct Proof {
  Mac mac{};
};
struct Refused {
  std::string reason;
};
struct MemberList {
  std::vector<Member> members;
  uint64_t epoch = 0;
};

std::string encodeHello(const Hello& m);
std::string encodeChallenge(const Challenge& m);
std::string encodeProof(const Proof& m);
std::string encodeRefused(const Refused& m);
std::string encodeJoin(const Member& self);
std::string encodeMembers(const MemberList& m);
// Heartbeat, Welcome and Goodbye carry nothing.
std::string encodeEmpty();

Expected<Hello> decodeHello(const std::string& body);
Expected<Challenge> decodeChallenge(const std::string& body);
Expected<Proof> decodeProof(const std::string& body);
Expected<Refused> decodeRefused(const std::string& body);
// Checks the member's id is non-zero and its address a reachable IPv4
// address and port.
Expected<Member> decodeJoin(const std::string& body);
Expected<MemberList> decodeMembers(const std::string& body);

}  // namespace troupe::transport::internal

namespace troupe::transport {
// What both node implementations check before they start (a token,
// heartbeat timing); draws a node id when none is given (node.cc).
Status checkNodeOptions(NodeOptions* options);
}  // namespace troupe::transport
