# Transport control messages: the handshake, heartbeats and the bootstrap
# directory. Each travels as the body of an envelope whose kind is one of the
# transport's control kinds (transport/node.cc). Private to transport/.
@0xe3a97c5b1d2f4068;

using Cxx = import "/capnp/c++.capnp";
$Cxx.namespace("troupe::transport::wire");

# Connecting side -> listening side, first message on a new endpoint.
struct Hello {
  nodeId @0 :UInt64;
  nonce @1 :Data;        # 32 random bytes
  unused2 @2 :UInt64;    # was a token fingerprint (a function of the token alone); never set, ignored
  integrity @3 :UInt8;   # transport.integrity (frame.h: 0 crc32c, 1 off, 2 hmac); both sides must agree
}

# Listening side -> connecting side: its own nonce and proof of the token.
struct Challenge {
  nodeId @0 :UInt64;
  nonce @1 :Data;
  mac @2 :Data;          # HMAC-SHA256(token, "server" | both nonces | both ids)
  integrity @3 :UInt8;   # as the hello's
}

# Connecting side -> listening side: its proof of the token.
struct Proof {
  mac @0 :Data;          # HMAC-SHA256(token, "client" | both nonces | both ids)
}

struct Member {
  nodeId @0 :UInt64;
  role @1 :Text;
  host @2 :Text;
  port @3 :UInt16;
}

# Node -> coordinator after the handshake.
struct Join {
  self @0 :Member;
}

# Coordinator -> every member, whenever membership changes.
struct Members {
  members @0 :List(Member);
  epoch @1 :UInt64;
}

# A member that is down, as the coordinator saw it.
struct Departed {
  nodeId @0 :UInt64;
  reason @1 :Text;
}

# Listening side -> connecting side before it closes a refused connection.
struct Refused {
  reason @0 :Text;
}
