# Actor messages between processes (DESIGN.md, Messages and location
# transparency). An actor message is a list of values: atoms, numbers, text,
# errors, and tensors, which stay raw buffers in the frame and are named here
# only by their index. Private to transport/: message_codec.cc turns these into
# caf::message and back.
@0xb61c2e4d8a3f5e19;

using Cxx = import "/capnp/c++.capnp";
$Cxx.namespace("troupe::transport::wire");

struct ErrorValue {
  code @0 :UInt8;
  category @1 :UInt64;   # a caf::atom_value
  context @2 :Text;      # rendered context, for logs
}

struct Value {
  union {
    atom @0 :UInt64;       # caf::atom_value
    int64 @1 :Int64;
    uint64 @2 :UInt64;
    int32 @3 :Int32;
    uint32 @4 :UInt32;
    float64 @5 :Float64;
    float32 @6 :Float32;
    boolean @7 :Bool;
    text @8 :Text;
    tensor @9 :UInt32;     # index into the frame's tensors
    error @10 :ErrorValue;
    unit @11 :Void;        # caf::unit_t (an empty reply)
    uint16 @12 :UInt16;
  }
}

struct ActorMessage {
  values @0 :List(Value);
}
