// Records: structs that cross processes inside actor messages
// (message_codec.h), described once by a CAF-style inspect function:
//
//   struct Hello { std::string role; int64_t rank = -1; };
//   template <class Inspector>
//   typename Inspector::result_type inspect(Inspector& f, Hello& x) {
//     return f(caf::meta::type_name("Hello"), x.role, x.rank);
//   }
//
// The same function serves CAF (to_string, type registration) and the wire:
// RecordWriter turns the fields into a list of Fields in declaration order,
// RecordReader reads them back and fails, naming the field, on a missing,
// extra or mistyped one. Field types: bool, int32_t, int64_t, uint64_t,
// double, std::string, Tensor, and std::vector of int64_t, uint64_t, double
// or std::string. Anything else does not compile (no enums: carry them as
// integers and check their range where they are read).
//
// WireTypes lists the record types one RemoteActors instance sends and
// accepts, each under a name (its wire id is a hash of the name, so both
// sides must use the same names). A record of a type the table does not
// list is refused on encode and dropped on decode.
//
// Threading: a WireTypes is immutable once handed to RemoteActors::start.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <type_traits>
#include <typeindex>
#include <unordered_map>
#include <variant>
#include <vector>

#include <caf/message.hpp>
#include <caf/message_builder.hpp>  // make_type_erased_value, implicit_conversions, unbox_message_element
#include <caf/meta/annotation.hpp>
#include <fmt/format.h>

#include "common/status.h"
#include "transport/tensor.h"

namespace troupe::transport {

using Field = std::variant<bool, int32_t, int64_t, uint64_t, double, std::string, Tensor, std::vector<int64_t>,
                           std::vector<uint64_t>, std::vector<double>, std::vector<std::string>>;

// The name of a Field's alternative ("int64", "text", ...), for errors.
const char* fieldKindName(const Field& f);

// Collects a record's fields (an inspector that reads the record).
class RecordWriter {
 public:
  using result_type = void;
  static constexpr bool reads_state = true;
  static constexpr bool writes_state = false;

  template <class... Ts>
  void operator()(Ts&&... xs) {
    (put(xs), ...);
  }

  std::vector<Field> fields;

 private:
  template <class T>
  void put(const T& x) {
    if constexpr (std::is_base_of_v<caf::meta::annotation, T>) {
      // a type name or another annotation: not data
    } else {
      static_assert(std::is_constructible_v<Field, const T&> && !std::is_enum_v<T>,
                    "a record field must be one of the types listed in transport/record.h");
      fields.emplace_back(std::in_place_type<T>, x);
    }
  }
};

// Fills a record from fields (an inspector that writes the record).
class RecordReader {
 public:
  using result_type = void;
  static constexpr bool reads_state = false;
  static constexpr bool writes_state = true;

  RecordReader(std::vector<Field> fields, const char* typeName) : fields_(std::move(fields)), typeName_(typeName) {}

  template <class... Ts>
  void operator()(Ts&&... xs) {
    (take(xs), ...);
  }

  // OK when every field was there with the right type and none is left.
  Status finish() const;

 private:
  template <class T>
  void take(T& x) {
    if constexpr (std::is_base_of_v<caf::meta::annotation, std::decay_t<T>>) {
      // not data
    } else {
      static_assert(std::is_constructible_v<Field, const T&> && !std::is_enum_v<T>,
                    "a record field must be one of the types listed in transport/record.h");
      const size_t i = next_++;
      if (!error_.isOk()) return;
      if (i >= fields_.size()) {
        error_ = Status::corruption(fmt::format("{} has {} fields, field {} is missing", typeName_, fields_.size(), i));
        return;
      }
      if (auto* v = std::get_if<T>(&fields_[i])) {
        x = std::move(*v);
      } else {
        error_ = Status::corruption(fmt::format("{}: field {} is a {}, not the {} it should be", typeName_, i,
                                                fieldKindName(fields_[i]), fieldKindName(Field(std::in_place_type<T>))));
      }
    }
  }

  std::vector<Field> fields_;
  const char* typeName_;
  size_t next_ = 0;
  Status error_;
};

// The elements of a message being decoded, each held as CAF's
// message_builder holds it (a type-erased value), in a list sized once for
// the message: message_builder grows its list an element at a time, which
// cost an 8-element message (a pull request) four allocations where this
// costs one.
class MessageElements {
 public:
  explicit MessageElements(size_t expected) { elements_.reserve(expected); }
  // Holds x as the type message_builder::append would (after CAF's
  // implicit conversions), so handlers match the message as before.
  template <class T>
  void append(T&& x) {
    using Held = typename caf::unbox_message_element<
        typename caf::detail::implicit_conversions<std::decay_t<T>>::type>::type;
    elements_.push_back(caf::make_type_erased_value<Held>(std::forward<T>(x)));
  }
  size_t size() const { return elements_.size(); }
  // The message (elements in the order appended); this is left empty.
  caf::message take();

 private:
  std::vector<caf::type_erased_value_ptr> elements_;
};

class WireTypes {
 public:
  struct Entry {
    uint64_t id = 0;
    std::string name;
    // The fields of element `index` of `msg` (which is of this type).
    std::function<std::vector<Field>(const caf::message& msg, size_t index)> encode;
    // Appends the record built from `fields` to `out`, or says what is wrong.
    std::function<Status(std::vector<Field> fields, MessageElements& out)> decode;
  };

  // Lists T under `name`. Throws SetupError when the name or the type is
  // listed already.
  template <class T>
  WireTypes& add(const std::string& name) {
    static_assert(std::is_default_constructible_v<T> && std::is_copy_constructible_v<T>);
    Entry e;
    e.name = name;
    e.encode = [](const caf::message& msg, size_t index) {
      RecordWriter w;
      inspect(w, const_cast<T&>(msg.get_as<T>(index)));
      return std::move(w.fields);
    };
    e.decode = [name](std::vector<Field> fields, MessageElements& out) -> Status {
      T x;
      RecordReader r(std::move(fields), name.c_str());
      inspect(r, x);
      Status s = r.finish();
      if (s.isOk()) out.append(std::move(x));
      return s;
    };
    insert(std::type_index(typeid(T)), std::move(e));
    return *this;
  }

  // Adds every entry of `other` (same rules as add).
  WireTypes& merge(const WireTypes& other);

  const Entry* find(const std::type_info& type) const;
  const Entry* find(uint64_t id) const;
  size_t size() const { return entries_.size(); }

 private:
  void insert(std::type_index type, Entry e);
  std::vector<Entry> entries_;
  std::vector<std::type_index> types_;
  std::unordered_map<std::type_index, size_t> byType_;
  std::unordered_map<uint64_t, size_t> byId_;
};

}  // namespace troupe::transport
