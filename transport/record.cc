#include "transport/record.h"

#include <caf/detail/dynamic_message_data.hpp>
#include <caf/intrusive_ptr.hpp>
#include <caf/make_counted.hpp>

#include "common/check.h"
#include "common/hash.h"

namespace troupe::transport {

const char* fieldKindName(const Field& f) {
  static constexpr const char* kNames[] = {"bool",   "int32",  "int64",       "uint64",       "float64",      "text",
                                           "tensor", "int64 list", "uint64 list", "float64 list", "text list"};
  static_assert(std::size(kNames) == std::variant_size_v<Field>);
  return kNames[f.index()];
}

Status RecordReader::finish() const {
  if (!error_.isOk()) return error_;
  if (next_ != fields_.size()) {
    return Status::corruption(fmt::format("{} has {} fields, {} more than it should", typeName_, fields_.size(),
                                          fields_.size() - next_));
  }
  return Status::ok();
}

caf::message MessageElements::take() {
  // What message_builder::move_to_message makes, built from the list at once.
  caf::intrusive_ptr<caf::detail::message_data> data =
      caf::make_counted<caf::detail::dynamic_message_data>(std::move(elements_));
  elements_.clear();
  return caf::message(caf::message::data_ptr(std::move(data)));
}

WireTypes& WireTypes::merge(const WireTypes& other) {
  for (size_t i = 0; i < other.entries_.size(); ++i) insert(other.types_[i], other.entries_[i]);
  return *this;
}

void WireTypes::insert(std::type_index type, Entry e) {
  e.id = hashBytes(e.name, 0x7265636f72647331ull);
  if (byType_.count(type)) TROUPE_SETUP_ERROR("wire types: the type named '{}' is listed twice", e.name);
  if (byId_.count(e.id)) TROUPE_SETUP_ERROR("wire types: the name '{}' is listed twice", e.name);
  byType_.emplace(type, entries_.size());
  byId_.emplace(e.id, entries_.size());
  types_.push_back(type);
  entries_.push_back(std::move(e));
}

const WireTypes::Entry* WireTypes::find(const std::type_info& type) const {
  auto it = byType_.find(std::type_index(type));
  return it == byType_.end() ? nullptr : &entries_[it->second];
}

const WireTypes::Entry* WireTypes::find(uint64_t id) const {
  auto it = byId_.find(id);
  return it == byId_.end() ? nullptr : &entries_[it->second];
}

std::string to_string(const Tensor& t) {
  static constexpr const char* kTypes[] = {"bytes", "f32", "bf16", "f16", "i32", "i64", "u64"};
  const size_t d = size_t(t.dtype);
  return fmt::format("Tensor({}, {} bytes)", d < std::size(kTypes) ? kTypes[d] : "?", t.bytes);
}

}  // namespace troupe::transport
