// Frames: how one message travels between processes. A frame is
//
//   u32 magic "TRP1" | u32 envelope bytes E (a multiple of 8) |
//   u32 CRC32C | u32 zero |
//   E bytes of Cap'n Proto envelope (flat, unpacked) | the tensors' raw bytes, in order,
//   each padded with zeros to a multiple of 8 bytes
//
// The padding keeps every tensor of a received frame 8-byte aligned, so the
// receiver reads floats and keys in place. The CRC32C (Castagnoli, ISA-L)
// covers E and every byte after the header, padding included: a frame
// whose bits flipped on the way is refused before anything in it is
// trusted.
//
// The envelope (internal/envelope.capnp) names source node and actor,
// destination actor, request id, message kind, a small body, and the length
// and type of each tensor that follows; and, for the transport's reliable
// links, the frame's sequence number on its link and what its sender has
// received and sent there. Tensors are never lists of numbers inside
// Cap'n Proto.
//
// decodeFrame checks everything before it trusts it: the magic, E against
// the frame size and word alignment, the checksum, the Cap'n Proto message
// (with a traversal limit equal to its own size, so no amplification, and a
// nesting limit), the tensor count and every tensor length against what is
// left. Anything else is a corruption Status naming what was wrong; it
// never reads out of bounds, throws or aborts.
//
// Threading: plain functions over caller-owned memory; safe from any thread.
#pragma once

#include <cstddef>
#include <cstdint>
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
std::vector<std::byte> encodeFrame(const Envelope& envelope, const std::vector<TensorView>& tensors);

// The envelope part alone (header + Cap'n Proto bytes), for senders that
// pass the tensors as separate buffers.
std::vector<std::byte> encodeEnvelope(const Envelope& envelope, const std::vector<TensorView>& tensors);

struct DecodedFrame {
  Envelope envelope;
  std::vector<TensorView> tensors;  // point into the decoded buffer
  uint64_t wireBytes = 0;           // the frame as it arrived (set by the node)
};

// Decodes a whole frame. The TensorViews point into `data`. With
// verifyChecksum = false the CRC is not looked at (the fuzzers, and tests of
// the structural checks behind it).
Expected<DecodedFrame> decodeFrame(const std::byte* data, size_t size, bool verifyChecksum = true);

// The CRC32C of `bytes` bytes at `data`, going on from `crc` (chains: the
// CRC of a and then b is frameCrc(b, frameCrc(a))).
uint32_t frameCrc(const void* data, size_t bytes, uint32_t crc = 0);

}  // namespace troupe::transport
