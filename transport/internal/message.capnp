# Actor messages between processes (DESIGN.md, Messages and location
# transparency). An actor message is a list of values: atoms, numbers, text,
# errors, lists of numbers or text, records (structs, transport/record.h) and
# tensors, which stay raw buffers in the frame and are named here only by
# their index. Private to transport/: message_codec.cc turns these into
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
    record @13 :Record;
    int64s @14 :List(Int64);
    uint64s @15 :List(UInt64);
    float64s @16 :List(Float64);
    texts @17 :List(Text);
  }
}

# A struct listed in the receiver's WireTypes: its type (a hash of its
# name) and its fields in declaration order (scalars, text, tensors, lists;
# never another record).
struct Record {
  type @0 :UInt64;
  fields @1 :List(Value);
}

struct ActorMessage {
  values @0 :List(Value);
}
