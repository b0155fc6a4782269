#include "transport/message_codec.h"

#include <algorithm>
#include <bitset>
#include <cstring>
#include <optional>
#include <variant>

#include <caf/atom.hpp>
#include <caf/error.hpp>
#include <caf/message.hpp>
#include <caf/unit.hpp>
#include <capnp/message.h>
#include <capnp/serialize.h>
#include <kj/exception.h>

#include "transport/internal/capnp_util.h"
#include "transport/internal/message.capnp.h"

namespace troupe::transport {
namespace {

std::string errorContext(const caf::error& e) {
  return !e || e.context().empty() ? std::string() : caf::to_string(e.context());
}

// Tensors of one message: each is sent once, and on receive named once.
struct TensorsOut {
  std::vector<Tensor>* list;
  Status add(const Tensor& t, uint32_t* index) {
    if (list->size() >= kMaxTensors) {
      return Status::invalidArgument(fmt::format("message has more than {} tensors", kMaxTensors));
    }
    *index = uint32_t(list->size());
    list->push_back(t);
    return Status::ok();
  }
};

struct TensorsIn {
  const std::vector<TensorView>& frame;
  const std::shared_ptr<const void>& owner;
  std::bitset<kMaxTensors> used;  // (decodeFrame admits at most kMaxTensors)
  Expected<Tensor> take(uint32_t index) {
    if (index >= frame.size()) {
      return Status::corruption(fmt::format("tensor index {} but the frame has {} tensors", index, frame.size()));
    }
    if (used[index]) return Status::corruption(fmt::format("tensor {} named twice", index));
    used[index] = true;
    Tensor t;
    t.owner = owner;
    t.data = frame[index].data;
    t.bytes = frame[index].bytes;
    t.dtype = frame[index].dtype;
    return t;
  }
};

template <class List, class T>
void setList(List list, const std::vector<T>& xs) {
  for (size_t i = 0; i < xs.size(); ++i) list.set(unsigned(i), xs[i]);
}

Status setField(wire::Value::Builder v, const Field& f, TensorsOut& tensors) {
  return std::visit(
      [&](const auto& x) -> Status {
        using T = std::decay_t<decltype(x)>;
        if constexpr (std::is_same_v<T, bool>) {
          v.setBoolean(x);
        } else if constexpr (std::is_same_v<T, int32_t>) {
          v.setInt32(x);
        } else if constexpr (std::is_same_v<T, int64_t>) {
          v.setInt64(x);
        } else if constexpr (std::is_same_v<T, uint64_t>) {
          v.setUint64(x);
        } else if constexpr (std::is_same_v<T, double>) {
          v.setFloat64(x);
        } else if constexpr (std::is_same_v<T, std::string>) {
          v.setText(capnp::Text::Reader(x.data(), x.size()));
        } else if constexpr (std::is_same_v<T, Tensor>) {
          uint32_t index = 0;
          Status s = tensors.add(x, &index);
          if (!s.isOk()) return s;
          v.setTensor(index);
        } else if constexpr (std::is_same_v<T, std::vector<int64_t>>) {
          setList(v.initInt64s(unsigned(x.size())), x);
        } else if constexpr (std::is_same_v<T, std::vector<uint64_t>>) {
          setList(v.initUint64s(unsigned(x.size())), x);
        } else if constexpr (std::is_same_v<T, std::vector<double>>) {
          setList(v.initFloat64s(unsigned(x.size())), x);
        } else {
          static_assert(std::is_same_v<T, std::vector<std::string>>);
          auto list = v.initTexts(unsigned(x.size()));
          for (size_t i = 0; i < x.size(); ++i) list.set(unsigned(i), capnp::Text::Reader(x[i].data(), x[i].size()));
        }
        return Status::ok();
      },
      f);
}

template <class T, class List>
std::vector<T> listOf(List list) {
  std::vector<T> out;
  out.reserve(list.size());
  for (auto x : list) out.push_back(T(x));
  return out;
}

// A value that is a Field (what records hold); nullopt for the kinds only a
// message's top level carries (atoms, errors, units, 16-bit and 32-bit
// floats) and for records.
Expected<std::optional<Field>> fieldOf(wire::Value::Reader v, TensorsIn& tensors) {
  switch (v.which()) {
    case wire::Value::BOOLEAN: return std::optional<Field>(bool(v.getBoolean()));
    case wire::Value::INT32: return std::optional<Field>(int32_t(v.getInt32()));
    case wire::Value::INT64: return std::optional<Field>(int64_t(v.getInt64()));
    case wire::Value::UINT64: return std::optional<Field>(uint64_t(v.getUint64()));
    case wire::Value::FLOAT64: return std::optional<Field>(double(v.getFloat64()));
    case wire::Value::TEXT: {
      auto t = v.getText();
      return std::optional<Field>(std::string(t.begin(), t.size()));
    }
    case wire::Value::TENSOR: {
      auto t = tensors.take(v.getTensor());
      if (!t.hasValue()) return t.status();
      return std::optional<Field>(std::move(*t));
    }
    case wire::Value::INT64S: return std::optional<Field>(listOf<int64_t>(v.getInt64s()));
    case wire::Value::UINT64S: return std::optional<Field>(listOf<uint64_t>(v.getUint64s()));
    case wire::Value::FLOAT64S: return std::optional<Field>(listOf<double>(v.getFloat64s()));
    case wire::Value::TEXTS: {
      std::vector<std::string> out;
      for (auto t : v.getTexts()) out.emplace_back(t.begin(), t.size());
      return std::optional<Field>(std::move(out));
    }
    default: return std::optional<Field>();
  }
}

}  // namespace

Status encodeMessage(const caf::message& msg, std::string* body, std::vector<Tensor>* tensors,
                     const WireTypes* types) {
  internal::ScratchBuilder scratch;
  capnp::MessageBuilder& builder = scratch.get();
  auto root = builder.initRoot<wire::ActorMessage>();
  auto values = root.initValues(unsigned(msg.size()));
  TensorsOut out{tensors};
  for (size_t i = 0; i < msg.size(); ++i) {
    auto v = values[unsigned(i)];
    Status s;
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
      s = setField(v, msg.get_as<std::string>(i), out);
    } else if (msg.match_element<Tensor>(i)) {
      s = setField(v, msg.get_as<Tensor>(i), out);
    } else if (msg.match_element<std::vector<int64_t>>(i)) {
      s = setField(v, msg.get_as<std::vector<int64_t>>(i), out);
    } else if (msg.match_element<std::vector<uint64_t>>(i)) {
      s = setField(v, msg.get_as<std::vector<uint64_t>>(i), out);
    } else if (msg.match_element<std::vector<double>>(i)) {
      s = setField(v, msg.get_as<std::vector<double>>(i), out);
    } else if (msg.match_element<std::vector<std::string>>(i)) {
      s = setField(v, msg.get_as<std::vector<std::string>>(i), out);
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
    } else if (const auto rtti = msg.type(i);
               types != nullptr && rtti.first == 0 && rtti.second != nullptr && types->find(*rtti.second)) {
      const WireTypes::Entry* entry = types->find(*rtti.second);
      std::vector<Field> fields = entry->encode(msg, i);
      auto record = v.initRecord();
      record.setType(entry->id);
      auto list = record.initFields(unsigned(fields.size()));
      for (size_t f = 0; f < fields.size() && s.isOk(); ++f) s = setField(list[unsigned(f)], fields[f], out);
    } else {
      return Status::invalidArgument(
          fmt::format("element {} of message {} has a type that cannot cross processes", i, caf::to_string(msg)));
    }
    if (!s.isOk()) return s;
  }
  const size_t bytes = internal::flatBytes(builder);
  if (bytes > kMaxMessageBodyBytes) {
    // The receiver would drop it: say so here, where the sender hears it.
    return Status::invalidArgument(fmt::format("message body of {} bytes, more than {} (send bulk data as tensors)",
                                               bytes, kMaxMessageBodyBytes));
  }
  body->resize(bytes);
  internal::writeFlat(builder, reinterpret_cast<std::byte*>(body->data()));
  return Status::ok();
}

Expected<caf::message> decodeMessage(const std::string& body, const std::vector<TensorView>& frameTensors,
                                     const std::shared_ptr<const void>& frameOwner, const WireTypes* types) {
  if (body.empty() || body.size() % sizeof(capnp::word) != 0 || body.size() > kMaxMessageBodyBytes) {
    return Status::corruption(fmt::format("message body of {} bytes (a non-zero multiple of 8, at most {})",
                                          body.size(), kMaxMessageBodyBytes));
  }
  const internal::WordsOf words(body.data(), body.size());
  if (frameTensors.size() > kMaxTensors) {
    return Status::corruption(fmt::format("{} tensors in one frame (at most {})", frameTensors.size(), kMaxTensors));
  }
  TensorsIn tensors{frameTensors, frameOwner, {}};
  std::optional<MessageElements> out;
  try {
    capnp::ReaderOptions options;
    options.traversalLimitInWords = 4 * words.get().size() + 64;  // fields may be read more than once
    options.nestingLimit = 8;
    capnp::FlatArrayMessageReader reader(words.get(), options);
    auto values = reader.getRoot<wire::ActorMessage>().getValues();
    if (values.size() == 0) return Status::corruption("message with no elements");
    // Sized for the elements, up to a bound (a hostile body may claim a
    // long list of empty elements).
    out.emplace(std::min<size_t>(values.size(), 64));
    for (auto v : values) {
      switch (v.which()) {
        case wire::Value::ATOM: out->append(caf::atom_value(v.getAtom())); break;
        case wire::Value::UINT32: out->append(uint32_t(v.getUint32())); break;
        case wire::Value::UINT16: out->append(uint16_t(v.getUint16())); break;
        case wire::Value::FLOAT32: out->append(float(v.getFloat32())); break;
        case wire::Value::ERROR: {
          auto e = v.getError();
          auto ctx = e.getContext();
          if (e.getCode() == 0) {
            out->append(caf::error{});  // "none" (code 0 means no error)
            break;
          }
          caf::error err(e.getCode(), caf::atom_value(e.getCategory()),
                         ctx.size() ? caf::make_message(std::string(ctx.begin(), ctx.size())) : caf::message());
          out->append(std::move(err));
          break;
        }
        case wire::Value::UNIT: out->append(caf::unit); break;
        case wire::Value::RECORD: {
          auto record = v.getRecord();
          const WireTypes::Entry* entry = types ? types->find(record.getType()) : nullptr;
          if (!entry) return Status::corruption(fmt::format("a record of unknown type {:x}", record.getType()));
          std::vector<Field> fields;
          for (auto f : record.getFields()) {
            auto field = fieldOf(f, tensors);
            if (!field.hasValue()) return field.status();
            if (!*field) {
              return Status::corruption(fmt::format("{}: field {} is of a kind no record holds", entry->name,
                                                    fields.size()));
            }
            fields.push_back(std::move(**field));
          }
          Status s = entry->decode(std::move(fields), *out);
          if (!s.isOk()) return s;
          break;
        }
        default: {
          auto field = fieldOf(v, tensors);
          if (!field.hasValue()) return field.status();
          if (!*field) return Status::corruption("unknown message value kind");
          std::visit([&](auto&& x) { out->append(std::move(x)); }, std::move(**field));
        }
      }
    }
  } catch (const kj::Exception& e) {
    return Status::corruption(fmt::format("malformed message body: {}", e.getDescription().cStr()));
  }
  for (size_t i = 0; i < frameTensors.size(); ++i) {
    if (!tensors.used[i]) return Status::corruption(fmt::format("tensor {} is not named by the message", i));
  }
  return out->take();
}

}  // namespace troupe::transport
