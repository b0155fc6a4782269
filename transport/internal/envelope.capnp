# The envelope of every message between troupe processes (DESIGN.md, Messages
# and location transparency). Private to transport/: code outside sees the
# plain structs of transport/frame.h. Tensor payloads never travel inside the
# envelope; it only describes the raw buffers that follow it in the frame.
@0xd4c5a1f2b3e49a07;

using Cxx = import "/capnp/c++.capnp";
$Cxx.namespace("troupe::transport::wire");

struct TensorRef {
  bytes @0 :UInt64;    # length of the raw buffer in the frame
  dtype @1 :UInt8;     # transport::DType
}

struct Envelope {
  sourceNode @0 :UInt64;
  sourceActor @1 :UInt64;
  destActor @2 :UInt64;
  requestId @3 :UInt64;
  kind @4 :UInt16;     # which message this is (a transport::MessageKind)
  body @5 :Data;       # the message's own small fields, encoded by its owner
  tensors @6 :List(TensorRef);
  linkSeq @7 :UInt64;  # reliable links: this frame's number on its link
  linkAck @8 :UInt64;  # every frame of the reverse link before this arrived
  linkSent @9 :UInt64; # the highest number sent on this link so far
}
