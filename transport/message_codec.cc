#include "transport/message_codec.h"

#include <cstring>

#include <caf/atom.hpp>
#include <caf/error.hpp>
#include <caf/message.hpp>
#include <caf/message_builder.hpp>
#include <caf/unit.hpp>
#include <capnp/message.h>
#include <capnp/serialize.h>
#include <kj/exception.h>

#include "transport/internal/message.capnp.h"

namespace troupe::transport {
namespace {

// Envelopes and bodies are small: a first segment of 64 words (512 bytes)
// instead of Cap'n Proto's 1024, which it zeroes for every message.
constexpr unsigned kFirstSegmentWords = 64;

std::string errorContext(const caf::error& e) {
  return !e || e.context().empty() ? std::string() : caf::to_string(e.context());
}

}  // namespace

Status encodeMessage(const caf::message& msg, std::string* body, std::vector<Tensor>* tensors) {
  capnp::MallocMessageBuilder builder(kFirstSegmentWords);
  auto root = builder.initRoot<wire::ActorMessage>();
  auto values = root.initValues(unsigned(msg.size()));
  for (size_t i = 0; i < msg.size(); ++i) {
    auto v = values[unsigned(i)];
    if (msg.match_element<caf::atom_value>(i)) {
      v.setAtom(uint64_t(msg.get_as<caf::atom_value>(i)));
    } else if (msg.match_element<int64_t>(i)) {
      v.setInt64(msg.get_as<int64_t>(i));
    } else if (msg.match_element<uint64_t>(i)) {
      v.setUint64(msg.get_as<uint64_t>(i));
    } else if (msg.match_element<int32_t>(i)) {
      v.setInt32(msg.get_as<int32_t>(i));
    } else if (msg.match_element<uint32_t>(i)) {
      v.setUint32(msg.get_as<uint32_t>(i));
    } else if (msg.match_element<uint16_t>(i)) {
      v.setUint16(msg.get_as<uint16_t>(i));
    } else if (msg.match_element<double>(i)) {
      v.setFloat64(msg.get_as<double>(i));
    } else if (msg.match_element<float>(i)) {
      v.setFloat32(msg.get_as<float>(i));
    } else if (msg.match_element<bool>(i)) {
      v.setBoolean(msg.get_as<bool>(i));
    } else if (msg.match_element<std::string>(i)) {
      const auto& s = msg.get_as<std::string>(i);
      v.setText(capnp::Text::Reader(s.data(), s.size()));
    } else if (msg.match_element<Tensor>(i)) {
      if (tensors->size() >= kMaxTensors) {
        return Status::invalidArgument(fmt::format("message has more than {} tensors", kMaxTensors));
      }
      v.setTensor(uint32_t(tensors->size()));
      tensors->push_back(msg.get_as<Tensor>(i));
    } else if (msg.match_element<caf::error>(i)) {
      const auto& e = msg.get_as<caf::error>(i);
      auto ev = v.initError();
      if (e) {  // a default-constructed error ("none") has no code to read
        ev.setCode(e.code());
        ev.setCategory(uint64_t(e.category()));
        ev.setContext(errorContext(e));
      }
    } else if (msg.match_element<caf::unit_t>(i)) {
      v.setUnit();
    } else {
      return Status::invalidArgument(
          fmt::format("element {} of message {} has a type that cannot cross processes", i, caf::to_string(msg)));
    }
  }
  kj::Array<capnp::word> words = capnp::messageToFlatArray(builder);
  body->assign(reinterpret_cast<const char*>(words.begin()), words.size() * sizeof(capnp::word));
  return Status::ok();
}

Expected<caf::message> decodeMessage(const std::string& body, const std::vector<TensorView>& frameTensors,
                                     const std::shared_ptr<const void>& frameOwner) {
  if (body.empty() || body.size() % sizeof(capnp::word) != 0 || body.size() > kMaxMessageBodyBytes) {
    return Status::corruption(fmt::format("message body of {} bytes (a non-zero multiple of 8, at most {})",
                                          body.size(), kMaxMessageBodyBytes));
  }
  kj::Array<capnp::word> words = kj::heapArray<capnp::word>(body.size() / sizeof(capnp::word));
  std::memcpy(words.begin(), body.data(), body.size());
  caf::message_builder out;
  std::vector<bool> used(frameTensors.size(), false);
  try {
    capnp::ReaderOptions options;
    options.traversalLimitInWords = 4 * words.size() + 64;  // fields may be read more than once
    options.nestingLimit = 8;
    capnp::FlatArrayMessageReader reader(words.asPtr(), options);
    auto values = reader.getRoot<wire::ActorMessage>().getValues();
    if (values.size() == 0) return Status::corruption("message with no elements");
    for (auto v : values) {
      switch (v.which()) {
        case wire::Value::ATOM: out.append(caf::atom_value(v.getAtom())); break;
        case wire::Value::INT64: out.append(int64_t(v.getInt64())); break;
        case wire::Value::UINT64: out.append(uint64_t(v.getUint64())); break;
        case wire::Value::INT32: out.append(int32_t(v.getInt32())); break;
        case wire::Value::UINT32: out.append(uint32_t(v.getUint32())); break;
        case wire::Value::UINT16: out.append(uint16_t(v.getUint16())); break;
        case wire::Value::FLOAT64: out.append(double(v.getFloat64())); break;
        case wire::Value::FLOAT32: out.append(float(v.getFloat32())); break;
        case wire::Value::BOOLEAN: out.append(bool(v.getBoolean())); break;
        case wire::Value::TEXT: {
          auto t = v.getText();
          out.append(std::string(t.begin(), t.size()));
          break;
        }
        case wire::Value::TENSOR: {
          const uint32_t index = v.getTensor();
          if (index >= frameTensors.size()) {
            return Status::corruption(
                fmt::format("tensor index {} but the frame has {} tensors", index, frameTensors.size()));
          }
          if (used[index]) return Status::corruption(fmt::format("tensor {} named twice", index));
          used[index] = true;
          Tensor t;
          t.owner = frameOwner;
          t.data = frameTensors[index].data;
          t.bytes = frameTensors[index].bytes;
          t.dtype = frameTensors[index].dtype;
          out.append(std::move(t));
          break;
        }
        case wire::Value::ERROR: {
          auto e = v.getError();
          auto ctx = e.getContext();
          if (e.getCode() == 0) {
            out.append(caf::error{});  // "none" (code 0 means no error)
            break;
          }
          caf::error err(e.getCode(), caf::atom_value(e.getCategory()),
                         ctx.size() ? caf::make_message(std::string(ctx.begin(), ctx.size())) : caf::message());
          out.append(std::move(err));
          break;
        }
        case wire::Value::UNIT: out.append(caf::unit); break;
        default: return Status::corruption("unknown message value kind");
      }
    }
  } catch (const kj::Exception& e) {
    return Status::corruption(fmt::format("malformed message body: {}", e.getDescription().cStr()));
  }
  for (size_t i = 0; i < used.size(); ++i) {
    if (!used[i]) return Status::corruption(fmt::format("tensor {} is not named by the message", i));
  }
  return out.move_to_message();
}

}  // namespace troupe::transport
