#include "transport/frame.h"

#include <algorithm>
#include <cstring>

#include <capnp/message.h>
#include <capnp/serialize.h>
#include <kj/exception.h>
#include <isa-l/crc.h>
#include <openssl/core_names.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/params.h>

#include "common/check.h"

#include "transport/internal/capnp_util.h"
#include "transport/internal/envelope.capnp.h"

namespace troupe::transport {
namespace {

// Little-endian unsigned integers of the header and the seal.
template <typename T>
void putLe(std::byte* p, T v) {
  for (size_t i = 0; i < sizeof(T); ++i) p[i] = std::byte((v >> (8 * i)) & 0xff);
}

template <typename T>
T getLe(const std::byte* p) {
  T v = 0;
  for (size_t i = 0; i < sizeof(T); ++i) v |= T(uint8_t(p[i])) << (8 * i);
  return v;
}

void putU32(std::byte* p, uint32_t v) { putLe(p, v); }
uint32_t getU32(const std::byte* p) { return getLe<uint32_t>(p); }
void putU64(std::byte* p, uint64_t v) { putLe(p, v); }
uint64_t getU64(const std::byte* p) { return getLe<uint64_t>(p); }

void buildEnvelope(capnp::MessageBuilder& message, const Envelope& e, const std::vector<TensorView>& tensors) {
  auto root = message.initRoot<wire::Envelope>();
  root.setSourceNode(e.sourceNode);
  root.setSourceActor(e.sourceActor);
  root.setDestActor(e.destActor);
  root.setRequestId(e.requestId);
  root.setKind(e.kind);
  root.setLinkSeq(e.linkSeq);
  root.setLinkAck(e.linkAck);
  root.setLinkSent(e.linkSent);
  root.setBody(kj::arrayPtr(reinterpret_cast<const capnp::byte*>(e.body.data()), e.body.size()));
  auto list = root.initTensors(unsigned(tensors.size()));
  for (size_t i = 0; i < tensors.size(); ++i) {
    list[unsigned(i)].setBytes(tensors[i].bytes);
    list[unsigned(i)].setDtype(uint8_t(tensors[i].dtype));
  }
}

constexpr std::byte kZeros[8] = {};

void frameOf(const Envelope& e, const std::vector<TensorView>& tensors, bool withTensors, Integrity integrity,
             std::vector<std::byte>* frame) {
  internal::ScratchBuilder message;
  buildEnvelope(message.get(), e, tensors);
  const size_t envelopeBytes = internal::flatBytes(message.get());
  size_t total = kFrameHeaderBytes + envelopeBytes;
  if (withTensors) {
    for (const auto& t : tensors) total += paddedTensorBytes(t.bytes);
  }
  std::vector<std::byte>& out = *frame;
  out.clear();
  out.resize(total);  // zeroed: the check word and the padding stay 0
  putU32(out.data(), kFrameMagic);
  putU32(out.data() + 4, uint32_t(envelopeBytes));
  putU32(out.data() + 12, uint32_t(integrity));
  internal::writeFlat(message.get(), out.data() + kFrameHeaderBytes);
  std::byte* p = out.data() + kFrameHeaderBytes + envelopeBytes;
  if (withTensors) {
    for (const auto& t : tensors) {
      if (t.bytes) std::memcpy(p, t.data, t.bytes);
      p += paddedTensorBytes(t.bytes);
    }
  }
  if (integrity != Integrity::kCrc32c) return;  // check word 0; an hmac frame's seal is the caller's
  uint32_t crc = frameCrc(out.data() + 4, 4);
  crc = frameCrc(out.data() + kFrameHeaderBytes, envelopeBytes, crc);
  if (withTensors) {
    crc = frameCrc(out.data() + kFrameHeaderBytes + envelopeBytes, total - kFrameHeaderBytes - envelopeBytes, crc);
  } else {
    for (const auto& t : tensors) {
      crc = frameCrc(t.data, t.bytes, crc);
      crc = frameCrc(kZeros, paddedTensorBytes(t.bytes) - t.bytes, crc);
    }
  }
  putU32(out.data() + 8, crc);
}

EVP_MAC* hmacAlgorithm() {
  static EVP_MAC* mac = EVP_MAC_fetch(nullptr, "HMAC", nullptr);
  TROUPE_CHECK(mac != nullptr, "OpenSSL has no HMAC");
  return mac;
}

}  // namespace

const char* integrityName(Integrity integrity) {
  switch (integrity) {
    case Integrity::kCrc32c: return "crc32c";
    case Integrity::kOff: return "off";
    case Integrity::kHmac: return "hmac";
  }
  return "?";
}

Expected<Integrity> parseIntegrity(const std::string& name) {
  for (Integrity i : {Integrity::kOff, Integrity::kCrc32c, Integrity::kHmac}) {
    if (name == integrityName(i)) return i;
  }
  return Status::invalidArgument(fmt::format("'{}' is not one of off, crc32c, hmac", name));
}

std::vector<std::byte> encodeFrame(const Envelope& envelope, const std::vector<TensorView>& tensors,
                                   Integrity integrity) {
  std::vector<std::byte> out;
  frameOf(envelope, tensors, true, integrity, &out);
  return out;
}

std::vector<std::byte> encodeEnvelope(const Envelope& envelope, const std::vector<TensorView>& tensors,
                                      Integrity integrity) {
  std::vector<std::byte> out;
  frameOf(envelope, tensors, false, integrity, &out);
  return out;
}

void encodeEnvelope(const Envelope& envelope, const std::vector<TensorView>& tensors, Integrity integrity,
                    std::vector<std::byte>* out) {
  frameOf(envelope, tensors, false, integrity, out);
}

// ---------------------------------------------------------------- seals

struct FrameMac::Ctx {
  EVP_MAC_CTX* keyed = nullptr;
  ~Ctx() { EVP_MAC_CTX_free(keyed); }
};

FrameMac::FrameMac(const FrameKey& key) : ctx_(std::make_unique<Ctx>()) {
  ctx_->keyed = EVP_MAC_CTX_new(hmacAlgorithm());
  TROUPE_CHECK(ctx_->keyed != nullptr, "EVP_MAC_CTX_new failed");
  char digest[] = "SHA256";
  OSSL_PARAM params[] = {OSSL_PARAM_construct_utf8_string(OSSL_MAC_PARAM_DIGEST, digest, 0), OSSL_PARAM_construct_end()};
  TROUPE_CHECK(EVP_MAC_init(ctx_->keyed, key.data(), key.size(), params) == 1, "HMAC-SHA256 init failed");
}

FrameMac::~FrameMac() = default;

namespace {

// HMAC over the pieces, each (pointer, bytes), into `out` (32 bytes);
// false when OpenSSL fails (no memory).
template <typename Feed>
bool macOf(EVP_MAC_CTX* keyed, Feed&& feed, unsigned char* out) {
  EVP_MAC_CTX* ctx = EVP_MAC_CTX_dup(keyed);
  if (ctx == nullptr) return false;
  bool ok = true;
  feed([&](const void* data, size_t bytes) {
    if (bytes && ok) ok = EVP_MAC_update(ctx, static_cast<const unsigned char*>(data), bytes) == 1;
  });
  size_t length = 0;
  ok = ok && EVP_MAC_final(ctx, out, &length, 32) == 1 && length == 32;
  EVP_MAC_CTX_free(ctx);
  return ok;
}

}  // namespace

std::array<std::byte, kSealBytes> FrameMac::seal(uint64_t seq, const std::byte* head, size_t headBytes,
                                                 const std::vector<TensorView>& tensors) const {
  std::array<std::byte, kSealBytes> out{};
  putU64(out.data(), seq);
  const bool ok = macOf(
      ctx_->keyed,
      [&](auto&& update) {
        update(head, headBytes);
        for (const auto& t : tensors) {
          update(t.data, t.bytes);
          update(kZeros, paddedTensorBytes(t.bytes) - t.bytes);
        }
        update(out.data(), 8);
      },
      reinterpret_cast<unsigned char*>(out.data() + 8));
  TROUPE_CHECK(ok, "HMAC-SHA256 of a frame failed (out of memory)");  // a sender has nothing to send without it
  return out;
}

bool FrameMac::verify(const std::byte* frame, size_t size) const {
  if (size < kSealBytes) return false;
  unsigned char mac[32];
  if (!macOf(ctx_->keyed, [&](auto&& update) { update(frame, size - 32); }, mac)) return false;  // refused, not a crash
  return CRYPTO_memcmp(mac, frame + size - 32, 32) == 0;
}

Status SealWindow::accept(uint64_t seq) {
  if (seq == 0) return Status::corruption("sealed frame numbered 0");
  if (seq > highest_) {
    // Forget the numbers that fall out of the window's span.
    const uint64_t advance = seq - highest_;
    if (advance >= kSpan) {
      seen_.reset();
    } else {
      for (uint64_t i = 1; i <= advance; ++i) seen_.reset((highest_ + i) % kSpan);
    }
    highest_ = seq;
    seen_.set(seq % kSpan);
    return Status::ok();
  }
  if (highest_ - seq >= kSpan) {
    return Status::corruption(fmt::format("sealed frame number {} is older than the window ({} numbers below {})", seq,
                                          kSpan, highest_));
  }
  if (seen_.test(seq % kSpan)) return Status::corruption(fmt::format("sealed frame number {} was seen before (a replay)", seq));
  seen_.set(seq % kSpan);
  return Status::ok();
}

std::optional<uint32_t> frameIntegrityWord(const std::byte* data, size_t size) {
  if (size < kFrameHeaderBytes) return std::nullopt;
  return getU32(data + 12);
}

void reguardFrame(std::vector<std::byte>* frame, Integrity integrity, const FrameMac* mac, uint64_t seq) {
  TROUPE_CHECK(frame->size() >= kFrameHeaderBytes, "reguardFrame of a {}-byte frame", frame->size());
  if (integrity == Integrity::kCrc32c) return;
  putU32(frame->data() + 8, 0);
  putU32(frame->data() + 12, uint32_t(integrity));
  if (integrity != Integrity::kHmac) return;
  TROUPE_CHECK(mac != nullptr, "reguardFrame to hmac without a key");
  const auto seal = mac->seal(seq, frame->data(), frame->size());
  frame->insert(frame->end(), seal.begin(), seal.end());
}

uint32_t frameCrc(const void* data, size_t bytes, uint32_t crc) {
  auto* p = static_cast<unsigned char*>(const_cast<void*>(data));
  while (bytes > 0) {
    const int n = int(std::min<size_t>(bytes, size_t{1} << 30));
    crc = crc32_iscsi(p, n, crc);
    p += n;
    bytes -= size_t(n);
  }
  return crc;
}

Expected<DecodedFrame> decodeFrame(const std::byte* data, size_t size, const FrameCheck& check) {
  if (size < kFrameHeaderBytes) {
    return Status::corruption(fmt::format("frame of {} bytes is shorter than its {}-byte header", size,
                                          kFrameHeaderBytes));
  }
  const uint32_t magic = getU32(data);
  if (magic != kFrameMagic) return Status::corruption(fmt::format("bad frame magic 0x{:08x}", magic));
  const size_t envelopeBytes = getU32(data + 4);
  if (envelopeBytes == 0 || envelopeBytes % sizeof(capnp::word) != 0 || envelopeBytes > kMaxEnvelopeBytes) {
    return Status::corruption(fmt::format("bad envelope length {} (a non-zero multiple of 8, at most {})",
                                          envelopeBytes, kMaxEnvelopeBytes));
  }
  const uint32_t word = getU32(data + 12);
  if (word != uint32_t(check.integrity)) {
    const std::string says = word <= uint32_t(Integrity::kHmac) ? integrityName(Integrity(word))
                                                                 : fmt::format("unknown (0x{:08x})", word);
    return Status::corruption(fmt::format("frame guarded by {} where {} is required (transport.integrity)", says,
                                          integrityName(check.integrity)));
  }
  DecodedFrame frame;
  if (check.integrity == Integrity::kHmac) {
    if (size < kFrameHeaderBytes + kSealBytes) {
      return Status::corruption(fmt::format("sealed frame of {} bytes is shorter than its header and seal", size));
    }
    if (envelopeBytes > size - kFrameHeaderBytes - kSealBytes) {
      return Status::corruption(fmt::format("envelope of {} bytes does not fit the {}-byte sealed frame", envelopeBytes,
                                            size));
    }
    if (check.verify) {
      TROUPE_CHECK(check.mac != nullptr, "decodeFrame of an hmac frame without its connection's key");
      if (!check.mac->verify(data, size)) {
        return Status::corruption(fmt::format("the seal of a {}-byte frame does not verify (forged, altered, or "
                                              "another connection's)", size));
      }
    }
    frame.sealSeq = getU64(data + size - kSealBytes);
    size -= kSealBytes;  // the rest is an ordinary frame
  }
  if (envelopeBytes > size - kFrameHeaderBytes) {
    return Status::corruption(fmt::format("envelope of {} bytes does not fit the {}-byte frame", envelopeBytes, size));
  }
  if (check.verify && check.integrity == Integrity::kCrc32c) {
    const uint32_t want = getU32(data + 8);
    const uint32_t got = frameCrc(data + kFrameHeaderBytes, size - kFrameHeaderBytes, frameCrc(data + 4, 4));
    if (want != got) {
      return Status::corruption(fmt::format("checksum mismatch: the frame says {:08x}, its {} bytes give {:08x}",
                                            want, size, got));
    }
  } else if (check.integrity != Integrity::kCrc32c && getU32(data + 8) != 0) {
    return Status::corruption(fmt::format("check word 0x{:08x} is not zero in a frame guarded by {}", getU32(data + 8),
                                          integrityName(check.integrity)));
  }
  // Cap'n Proto reads words in place (a copy first if they are not aligned).
  const internal::WordsOf words(data + kFrameHeaderBytes, envelopeBytes);
  try {
    capnp::ReaderOptions options;
    options.traversalLimitInWords = words.get().size();  // no reading more than was sent
    options.nestingLimit = 8;
    capnp::FlatArrayMessageReader reader(words.get(), options);
    auto root = reader.getRoot<wire::Envelope>();
    frame.envelope.sourceNode = root.getSourceNode();
    frame.envelope.sourceActor = root.getSourceActor();
    frame.envelope.destActor = root.getDestActor();
    frame.envelope.requestId = root.getRequestId();
    frame.envelope.kind = root.getKind();
    frame.envelope.linkSeq = root.getLinkSeq();
    frame.envelope.linkAck = root.getLinkAck();
    frame.envelope.linkSent = root.getLinkSent();
    auto body = root.getBody();
    frame.envelope.body.assign(reinterpret_cast<const char*>(body.begin()), body.size());
    auto list = root.getTensors();
    if (list.size() > kMaxTensors) {
      return Status::corruption(fmt::format("{} tensors in one frame (at most {})", list.size(), kMaxTensors));
    }
    frame.tensors.reserve(list.size());
    for (auto t : list) {
      if (t.getDtype() > uint8_t(DType::kUInt64)) {
        return Status::corruption(fmt::format("unknown tensor dtype {}", t.getDtype()));
      }
      frame.tensors.push_back(TensorView{nullptr, t.getBytes(), DType(t.getDtype())});
    }
  } catch (const kj::Exception& e) {
    return Status::corruption(fmt::format("malformed envelope: {}", e.getDescription().cStr()));
  }
  size_t offset = kFrameHeaderBytes + envelopeBytes;
  for (size_t i = 0; i < frame.tensors.size(); ++i) {
    const uint64_t bytes = frame.tensors[i].bytes;
    if (bytes > size - offset || paddedTensorBytes(bytes) > size - offset) {
      return Status::corruption(
          fmt::format("tensor {} of {} bytes runs past the frame ({} bytes left)", i, bytes, size - offset));
    }
    frame.tensors[i].data = data + offset;
    offset += paddedTensorBytes(bytes);
  }
  if (offset != size) {
    return Status::corruption(fmt::format("{} bytes after the last tensor", size - offset));
  }
  return frame;
}

}  // namespace troupe::transport
