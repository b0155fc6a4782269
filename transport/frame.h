// Frames: how one message travels between processes. A frame is
//
//   u32 magic "TRP1" | u32 envelope bytes E (a multiple of 8) |
//   u32 CRC32C (0 unless guarded by one) | u32 integrity (0 crc32c, 1 off, 2 hmac) |
//   E bytes of Cap'n Proto envelope (flat, unpacked) | the tensors' raw bytes, in order,
//   each padded with zeros to a multiple of 8 bytes |
//   hmac only, the seal: u64 the frame's number on its connection | HMAC-SHA256 (32 bytes)
//
// The padding keeps every tensor of a received frame 8-byte aligned, so the
// receiver reads floats and keys in place.
//
// Integrity (transport.integrity, Integrity below): with crc32c (the
// default) the CRC32C (Castagnoli, ISA-L) covers E and every byte after the
// header, padding included, so a frame whose bits flipped on the way is
// refused before anything in it is trusted. With hmac the seal's MAC, under
// a key of the connection's own (derived in its handshake, one per
// direction), covers every byte before it, its number included: a frame
// forged, altered, replayed or taken from another connection by someone
// without the token is refused (the number against the connection's
// SealWindow). With off nothing is checked (a trusted network, no cost).
// The handshake's hello, challenge and proof (and a refusal) carry a CRC32C
// whatever the setting; under hmac everything from the server's welcome on
// is sealed. A receiver takes only frames guarded as its connection's
// setting says.
//
// The envelope (internal/envelope.capnp) names source node and actor,
// destination actor, request id, message kind, a small body, and the length
// and type of each tensor that follows; and, for the transport's reliable
// links, the frame's sequence number on its link and what its sender has
// received and sent there. Tensors are never lists of numbers inside
// Cap'n Proto.
//
// decodeFrame checks everything before it trusts it: the magic, E against
// the frame size and word alignment, the integrity word, the checksum or
// the seal, the Cap'n Proto message (with a traversal limit equal to its
// own size, so no amplification, and a nesting limit), the tensor count and
// every tensor length against what is left. Anything else is a corruption
// Status naming what was wrong; it never reads out of bounds, throws or
// aborts. (The node decodes a sealed frame's structure first, with
// FrameCheck::verify false, and then checks its seal with FrameMac::verify
// before it uses anything in it: garbage costs no hash.)
//
// Threading: plain functions over caller-owned memory, and FrameMac and
// SealWindow objects used by one thread at a time.
#pragma once

#include <array>
#include <bitset>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/status.h"

namespace troupe::transport {

enum class DType : uint8_t { kBytes = 0, kFloat32 = 1, kBFloat16 = 2, kFloat16 = 3, kInt32 = 4, kInt64 = 5, kUInt64 = 6 };

inline constexpr uint32_t kFrameMagic = 0x31505254;  // "TRP1" little-endian
inline constexpr size_t kFrameHeaderBytes = 16;
// Largest envelope decodeFrame accepts (tensors are not counted).
inline constexpr size_t kMaxEnvelopeBytes = size_t{1} << 20;
inline constexpr size_t kMaxTensors = 4096;

// How frames are guarded after the handshake (transport.integrity); the
// values are the header's integrity word.
enum class Integrity : uint8_t { kCrc32c = 0, kOff = 1, kHmac = 2 };
// "crc32c", "off", "hmac".
const char* integrityName(Integrity integrity);
// From those names; invalidArgument naming the three otherwise.
Expected<Integrity> parseIntegrity(const std::string& name);

inline constexpr size_t kSealBytes = 40;  // u64 number | HMAC-SHA256
using FrameKey = std::array<uint8_t, 32>;

inline constexpr uint64_t paddedTensorBytes(uint64_t bytes) { return (bytes + 7) & ~uint64_t{7}; }

struct Envelope {
  uint64_t sourceNode = 0;
  uint64_t sourceActor = 0;
  uint64_t destActor = 0;
  uint64_t requestId = 0;
  uint16_t kind = 0;
  std::string body;  // opaque bytes of the message's own fields
  // Reliable links (transport/internal/links.h); 0 where unused.
  uint64_t linkSeq = 0;   // this frame's number on its link (0: not sequenced)
  uint64_t linkAck = 0;   // the sender has every frame of the reverse link before this number
  uint64_t linkSent = 0;  // the highest number the sender has sent on this link
  // Traffic accounting (NodeStats::sentByTraffic): the label this frame's
  // bytes are counted under, 0 for none. Local to the sender, never encoded.
  uint8_t traffic = 0;
};

// Labels a node counts sent bytes under (Envelope::traffic, 1 to this - 1).
inline constexpr size_t kTrafficLabels = 16;

// A tensor buffer: borrowed, the caller keeps it alive.
struct TensorView {
  const std::byte* data = nullptr;
  uint64_t bytes = 0;
  DType dtype = DType::kBytes;
};

// Envelope and tensors in one contiguous frame (the tensors are copied; the
// zero-copy path sends them as separate UCX buffers beside the envelope).
// The frame is guarded as `integrity` says (hmac: its integrity word
// only; the caller appends FrameMac::seal).
std::vector<std::byte> encodeFrame(const Envelope& envelope, const std::vector<TensorView>& tensors,
                                   Integrity integrity = Integrity::kCrc32c);

// The envelope part alone (header + Cap'n Proto bytes), for senders that
// pass the tensors as separate buffers (crc32c: the CRC still covers them).
std::vector<std::byte> encodeEnvelope(const Envelope& envelope, const std::vector<TensorView>& tensors,
                                      Integrity integrity = Integrity::kCrc32c);
// The same into `out` (replacing what it held; its capacity is reused).
void encodeEnvelope(const Envelope& envelope, const std::vector<TensorView>& tensors, Integrity integrity,
                    std::vector<std::byte>* out);

// HMAC-SHA256 under one connection's key for one direction: seals the
// frames it sends, or checks those it receives.
class FrameMac {
 public:
  explicit FrameMac(const FrameKey& key);
  ~FrameMac();
  FrameMac(const FrameMac&) = delete;
  FrameMac& operator=(const FrameMac&) = delete;

  // The seal of an hmac frame numbered `seq` (from 1): the number, then
  // the MAC over the head (header and envelope, from encodeEnvelope or a
  // whole encodeFrame), each tensor with its padding to 8 bytes, and the
  // number. (Pass no tensors for a whole frame.)
  std::array<std::byte, kSealBytes> seal(uint64_t seq, const std::byte* head, size_t headBytes,
                                         const std::vector<TensorView>& tensors = {}) const;
  // Whether the last kSealBytes of `frame` seal the bytes before them.
  bool verify(const std::byte* frame, size_t size) const;

 private:
  struct Ctx;
  std::unique_ptr<Ctx> ctx_;  // keyed once; copied per frame
};

// The numbers of the sealed frames a connection took, so that a replayed
// one is refused: any number above the highest so far, or one of the
// kSpan below it not seen yet (UCX may complete a large frame after the
// smaller ones sent behind it). Only numbers of frames whose seal verified
// may be offered.
class SealWindow {
 public:
  static constexpr uint64_t kSpan = 4096;
  // Ok and remembered; else corruption saying why (seen, or too old).
  Status accept(uint64_t seq);

 private:
  uint64_t highest_ = 0;
  std::bitset<kSpan> seen_;  // bit seq % kSpan, for the kSpan numbers up to highest_
};

struct DecodedFrame {
  Envelope envelope;
  std::vector<TensorView> tensors;  // point into the decoded buffer
  uint64_t wireBytes = 0;           // the frame as it arrived (set by the node)
  uint64_t sealSeq = 0;             // an hmac frame's number (for its connection's SealWindow)
};

// What decodeFrame demands of a frame's guard.
struct FrameCheck {
  Integrity integrity = Integrity::kCrc32c;  // the integrity word must say this
  const FrameMac* mac = nullptr;             // kHmac: the seal must verify under it
  // false: neither CRC nor seal is looked at (the fuzzers, tests of the
  // structure behind, and the node, which checks a seal itself after the
  // structure).
  bool verify = true;
};

// Decodes a whole frame. The TensorViews point into `data`.
Expected<DecodedFrame> decodeFrame(const std::byte* data, size_t size, const FrameCheck& check = {});

// The integrity word of a frame's header (no other check), for a receiver
// that takes more than one kind; nothing when the frame is shorter than a header.
std::optional<uint32_t> frameIntegrityWord(const std::byte* data, size_t size);

// Re-guards a whole crc32c frame (encodeFrame's) as `integrity`: the word
// set and, for off and hmac, the CRC cleared; for hmac the seal numbered
// `seq` under `mac` appended. (The node does this to a frame a fault plan
// corrupts, so that the corruption happens after the guard, as on a wire.)
void reguardFrame(std::vector<std::byte>* frame, Integrity integrity, const FrameMac* mac, uint64_t seq);

// The CRC32C of `bytes` bytes at `data`, going on from `crc` (chains: the
// CRC of a and then b is frameCrc(b, frameCrc(a))).
uint32_t frameCrc(const void* data, size_t bytes, uint32_t crc = 0);

}  // namespace troupe::transport
