#include "common/config.h"

#include <algorithm>
#include <cmath>

#include <cerrno>
#include <charconv>
#include <cstring>
#include <fstream>
#include <sstream>

#include <fmt/ranges.h>
#include <toml++/toml.h>

#include "common/check.h"

namespace troupe {
namespace {

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

bool parseInt(std::string_view s, int64_t* out) {
  s = trim(s);
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), *out);
  return ec == std::errc() && p == s.data() + s.size() && !s.empty();
}

bool parseFloat(std::string_view s, double* out) {
  s = trim(s);
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), *out);
  return ec == std::errc() && p == s.data() + s.size() && !s.empty();
}

// Whether `s` is well-formed UTF-8 (no overlong forms, surrogates or code
// points past U+10FFFF): TOML text must be, so a string that is not could
// be set but not written to a run's config.toml and read back.
bool isUtf8(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    const auto c = static_cast<unsigned char>(s[i]);
    size_t n;
    uint32_t cp;
    if (c < 0x80) {
      ++i;
      continue;
    } else if ((c & 0xe0) == 0xc0) {
      n = 1;
      cp = c & 0x1f;
    } else if ((c & 0xf0) == 0xe0) {
      n = 2;
      cp = c & 0x0f;
    } else if ((c & 0xf8) == 0xf0) {
      n = 3;
      cp = c & 0x07;
    } else {
      return false;
    }
    if (i + n >= s.size()) return false;  // truncated
    for (size_t k = 1; k <= n; ++k) {
      const auto d = static_cast<unsigned char>(s[i + k]);
      if ((d & 0xc0) != 0x80) return false;
      cp = (cp << 6) | (d & 0x3f);
    }
    static constexpr uint32_t kLeast[4] = {0, 0x80, 0x800, 0x10000};
    if (cp < kLeast[n] || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) return false;
    i += n + 1;
  }
  return true;
}

void checkUtf8(std::string_view key, std::string_view text, std::string_view where) {
  if (!isUtf8(text)) TROUPE_SETUP_ERROR("config: {}: {} must be UTF-8 text; its value is not", where, key);
}

std::string formatValue(const Config::Value& v) {
  struct Visitor {
    std::string operator()(int64_t x) const { return std::to_string(x); }
    std::string operator()(double x) const {
      std::string s = fmt::format("{}", x);
      if (s.find_first_of(".eEn") == std::string::npos) s += ".0";
      return s;
    }
    std::string operator()(bool x) const { return x ? "true" : "false"; }
    std::string operator()(const std::string& x) const {
      std::ostringstream os;
      os << toml::value<std::string>(x);
      return os.str();
    }
    std::string operator()(const std::vector<int64_t>& x) const {
      return fmt::format("[{}]", fmt::join(x, ", "));
    }
    std::string operator()(const std::vector<std::string>& x) const {
      std::string out = "[";
      for (const auto& item : x) out += (out.size() > 1 ? ", " : "") + (*this)(item);
      return out + "]";
    }
  };
  return std::visit(Visitor{}, v);
}

const char* nodeTypeName(const toml::node& n) {
  switch (n.type()) {
    case toml::node_type::table: return "a table";
    case toml::node_type::array: return "an array";
    case toml::node_type::string: return "a string";
    case toml::node_type::integer: return "an integer";
    case toml::node_type::floating_point: return "a float";
    case toml::node_type::boolean: return "a boolean";
    default: return "a date or time";
  }
}

// One table of an array of tables as "field=value,field=value" (values:
// strings, integers, floats, booleans; none may hold ',' or '=').
std::string tableItem(const toml::table& t, const std::string& where, const std::string& name, size_t n) {
  std::string out;
  for (const auto& [k, v] : t) {
    std::string value;
    if (v.is_string()) {
      value = v.as_string()->get();
    } else if (v.is_integer()) {
      value = std::to_string(v.as_integer()->get());
    } else if (v.is_floating_point()) {
      value = fmt::format("{}", v.as_floating_point()->get());
    } else if (v.is_boolean()) {
      value = v.as_boolean()->get() ? "true" : "false";
    } else {
      TROUPE_SETUP_ERROR("config: {}: {} item {}: '{}' must be a string or a number, got {}", where, name, n,
                         k.str(), nodeTypeName(v));
    }
    if (value.find_first_of(",=") != std::string::npos || k.str().find_first_of(",=") != std::string_view::npos) {
      TROUPE_SETUP_ERROR("config: {}: {} item {}: '{}' must not hold ',' or '='", where, name, n, k.str());
    }
    out += fmt::format("{}{}={}", out.empty() ? "" : ",", k.str(), value);
  }
  return out;
}

}  // namespace

const char* Config::typeName(Type type) {
  switch (type) {
    case Type::kInt: return "integer";
    case Type::kFloat: return "float";
    case Type::kBool: return "boolean";
    case Type::kString: return "string";
    case Type::kIntList: return "list of integers";
    case Type::kStringList: return "list of strings";
  }
  return "?";
}

Config::Config(std::vector<Key> schema) {
  for (auto& k : schema) {
    std::string name = k.name;
    Value v = k.defaultValue;
    TROUPE_CHECK(v.index() == static_cast<size_t>(k.type), "schema default of '{}' has the wrong type",
                 name);
    TROUPE_CHECK(!(k.range.lo > k.range.hi), "schema range of '{}' is empty", name);
    TROUPE_CHECK(inRange(k, v), "schema default of '{}' is not finite, outside its range {} or not one of its choices",
                 name, k.range.toString());
    auto [it, fresh] = entries_.emplace(name, Entry{std::move(k), std::move(v), false});
    TROUPE_CHECK(fresh, "schema declares '{}' twice", name);
  }
}

Config::Entry& Config::mutableEntry(std::string_view key, std::string_view origin) {
  auto it = entries_.find(key);
  if (it == entries_.end()) {
    // Suggest a key in the same table, the likeliest typo fix.
    std::string hint;
    auto dot = key.rfind('.');
    std::string_view table = dot == std::string_view::npos ? std::string_view() : key.substr(0, dot + 1);
    for (const auto& [name, e] : entries_) {
      if (!table.empty() && name.compare(0, table.size(), table) == 0) {
        hint += hint.empty() ? " (keys in that table: " : ", ";
        hint += name;
      }
    }
    if (!hint.empty()) hint += ")";
    TROUPE_SETUP_ERROR("config: unknown key '{}' in {}{}", key, origin, hint);
  }
  return it->second;
}

void Config::loadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    TROUPE_SETUP_ERROR("config: cannot open '{}': {}", path, std::strerror(errno));
  }
  std::stringstream buf;
  buf << in.rdbuf();
  loadString(buf.str(), path);
}

void Config::loadString(std::string_view text, std::string_view origin) {
  toml::table root;
  try {
    root = toml::parse(text, origin);
  } catch (const toml::parse_error& e) {
    const auto& where = e.source().begin;
    TROUPE_SETUP_ERROR("config: {}:{}:{}: {}", origin, where.line, where.column, e.description());
  }
  // Walk nested tables; every leaf must be a declared key of the right type.
  std::vector<std::pair<std::string, const toml::table*>> stack{{"", &root}};
  while (!stack.empty()) {
    auto [prefix, table] = stack.back();
    stack.pop_back();
    for (const auto& item : *table) {
      const auto& k = item.first;
      const toml::node& node = item.second;  // a plain reference: lambdas below capture it
      std::string name = prefix.empty() ? std::string(k.str()) : prefix + "." + std::string(k.str());
      if (const auto* sub = node.as_table()) {
        stack.emplace_back(name, sub);
        continue;
      }
      const auto line = node.source().begin.line;
      std::string where = fmt::format("{}:{}", origin, line);
      // `[[faults]]` at the top level is the fault plan, "faults.plan".
      if (node.is_array() && entries_.count(name) == 0 && entries_.count(name + ".plan") != 0) name += ".plan";
      Entry& e = mutableEntry(name, where);
      auto wrongType = [&]() {
        TROUPE_SETUP_ERROR("config: {}: '{}' must be {} {}, got {}", where, name,
                           e.key.type == Type::kInt ? "an" : "a", typeName(e.key.type),
                           nodeTypeName(node));
      };
      switch (e.key.type) {
        case Type::kInt: {
          if (!node.is_integer()) wrongType();
          const Value v = node.as_integer()->get();
          checkRange(e.key, v, where);
          e.value = v;
          break;
        }
        case Type::kFloat: {
          if (!node.is_integer() && !node.is_floating_point()) wrongType();
          const Value v = node.is_integer() ? double(node.as_integer()->get()) : node.as_floating_point()->get();
          checkRange(e.key, v, where);
          e.value = v;
          break;
        }
        case Type::kBool:
          if (!node.is_boolean()) wrongType();
          e.value = node.as_boolean()->get();
          break;
        case Type::kString: {
          if (!node.is_string()) wrongType();
          const Value v = node.as_string()->get();
          checkRange(e.key, v, where);
          e.value = v;
          break;
        }
        case Type::kIntList: {
          const auto* arr = node.as_array();
          if (!arr) wrongType();
          std::vector<int64_t> list;
          for (const auto& item : *arr) {
            if (!item.is_integer()) {
              TROUPE_SETUP_ERROR("config: {}: '{}' must be a list of integers, got an element that is {}",
                                 where, name, nodeTypeName(item));
            }
            list.push_back(item.as_integer()->get());
          }
          checkRange(e.key, list, where);
          e.value = std::move(list);
          break;
        }
        case Type::kStringList: {
          const auto* arr = node.as_array();
          if (!arr) wrongType();
          std::vector<std::string> list;
          for (const auto& item : *arr) {
            if (item.is_string()) {
              list.push_back(item.as_string()->get());
            } else if (const auto* t = item.as_table()) {
              list.push_back(tableItem(*t, fmt::format("{}:{}", origin, item.source().begin.line), name,
                                       list.size() + 1));
            } else {
              TROUPE_SETUP_ERROR("config: {}: '{}' must be a list of strings or of tables, got an element that is {}",
                                 where, name, nodeTypeName(item));
            }
          }
          e.value = std::move(list);
          break;
        }
      }
      e.set = true;
    }
  }
}

void Config::set(std::string_view assignment) {
  auto eq = assignment.find('=');
  if (eq == std::string_view::npos || trim(assignment.substr(0, eq)).empty()) {
    TROUPE_SETUP_ERROR("config: bad override '{}' (expected key=value)", assignment);
  }
  std::string_view key = trim(assignment.substr(0, eq));
  std::string_view text = trim(assignment.substr(eq + 1));
  Entry& e = mutableEntry(key, "--set");
  auto bad = [&]() {
    TROUPE_SETUP_ERROR("config: --set {}: '{}' is not a valid {}", key, text, typeName(e.key.type));
  };
  switch (e.key.type) {
    case Type::kInt: {
      int64_t v;
      if (!parseInt(text, &v)) bad();
      checkRange(e.key, v, "--set");
      e.value = v;
      break;
    }
    case Type::kFloat: {
      double v;
      if (!parseFloat(text, &v)) bad();
      checkRange(e.key, v, "--set");
      e.value = v;
      break;
    }
    case Type::kBool:
      if (text == "true" || text == "1") {
        e.value = true;
      } else if (text == "false" || text == "0") {
        e.value = false;
      } else {
        bad();
      }
      break;
    case Type::kString:
      if (text.size() >= 2 && text.front() == '"' && text.back() == '"') {
        text = text.substr(1, text.size() - 2);
      }
      checkUtf8(key, text, "--set");
      checkRange(e.key, std::string(text), "--set");
      e.value = std::string(text);
      break;
    case Type::kIntList: {
      std::string_view body = text;
      if (!body.empty() && body.front() == '[' && body.back() == ']') {
        body = body.substr(1, body.size() - 2);
      }
      std::vector<int64_t> list;
      while (!trim(body).empty()) {
        auto comma = body.find(',');
        int64_t v;
        if (!parseInt(body.substr(0, comma), &v)) bad();
        list.push_back(v);
        if (comma == std::string_view::npos) break;
        body = body.substr(comma + 1);
      }
      checkRange(e.key, list, "--set");
      e.value = std::move(list);
      break;
    }
    case Type::kStringList:
      TROUPE_SETUP_ERROR("config: --set {}: a list of strings is not set with --set{}", key,
                         key == "faults.plan" ? " (give each fault with --fault SPEC)" : "");
  }
  e.set = true;
}

void Config::append(std::string_view key, std::string item) {
  Entry& e = mutableEntry(key, "a command-line flag");
  TROUPE_CHECK(e.key.type == Type::kStringList, "append('{}') to a key that is no list of strings", key);
  checkUtf8(key, item, "a command-line flag");
  std::get<std::vector<std::string>>(e.value).push_back(std::move(item));
  e.set = true;
}

void Config::setValue(std::string_view key, Value value) {
  Entry& e = mutableEntry(key, "a command-line flag");
  TROUPE_CHECK(value.index() == static_cast<size_t>(e.key.type), "setValue('{}') with the wrong type",
               key);
  if (const auto* s = std::get_if<std::string>(&value)) checkUtf8(key, *s, "a command-line flag");
  checkRange(e.key, value, "a command-line flag");
  if (const auto* list = std::get_if<std::vector<std::string>>(&value)) {
    for (const auto& s : *list) checkUtf8(key, s, "a command-line flag");
  }
  e.value = std::move(value);
  e.set = true;
}

const Config::Entry& Config::entry(std::string_view key, Type type) const {
  auto it = entries_.find(key);
  TROUPE_CHECK(it != entries_.end(), "config key '{}' is not in the schema", key);
  TROUPE_CHECK(it->second.key.type == type, "config key '{}' is a {}, read as a {}", key,
               typeName(it->second.key.type), typeName(type));
  return it->second;
}

bool Config::has(std::string_view key) const { return entries_.count(key) != 0; }
int64_t Config::getInt(std::string_view key) const {
  return std::get<int64_t>(entry(key, Type::kInt).value);
}
double Config::getFloat(std::string_view key) const {
  return std::get<double>(entry(key, Type::kFloat).value);
}
bool Config::getBool(std::string_view key) const {
  return std::get<bool>(entry(key, Type::kBool).value);
}
const std::string& Config::getString(std::string_view key) const {
  return std::get<std::string>(entry(key, Type::kString).value);
}
const std::vector<int64_t>& Config::getIntList(std::string_view key) const {
  return std::get<std::vector<int64_t>>(entry(key, Type::kIntList).value);
}
const std::vector<std::string>& Config::getStringList(std::string_view key) const {
  return std::get<std::vector<std::string>>(entry(key, Type::kStringList).value);
}
bool Config::isSet(std::string_view key) const {
  auto it = entries_.find(key);
  TROUPE_CHECK(it != entries_.end(), "config key '{}' is not in the schema", key);
  return it->second.set;
}

std::string Config::toToml() const {
  // Group keys by their table (everything before the last dot).
  std::map<std::string, std::vector<const Entry*>> tables;
  for (const auto& [name, e] : entries_) {
    auto dot = name.rfind('.');
    tables[dot == std::string::npos ? "" : name.substr(0, dot)].push_back(&e);
  }
  std::string out;
  for (const auto& [table, list] : tables) {
    if (!table.empty()) out += fmt::format("{}[{}]\n", out.empty() ? "" : "\n", table);
    for (const Entry* e : list) {
      auto dot = e->key.name.rfind('.');
      out += fmt::format("{} = {}\n", dot == std::string::npos ? e->key.name : e->key.name.substr(dot + 1),
                         formatValue(e->value));
    }
  }
  return out;
}

bool Config::Range::contains(double v) const {
  if (std::isnan(v)) return false;
  const bool aboveLo = loOpen ? v > lo : v >= lo;
  const bool belowHi = hiOpen ? v < hi : v <= hi;
  return aboveLo && belowHi;
}

static_assert(std::numeric_limits<long double>::digits >= 64, "containsInteger needs every int64 exact");

bool Config::Range::containsInteger(int64_t v) const {
  // In long double (a 64-bit mantissa here), where every int64 is exact: in
  // double, 2^53 + 1 would pass a range that ends at 2^53.
  const long double x = v;
  const bool aboveLo = loOpen ? x > (long double)lo : x >= (long double)lo;
  const bool belowHi = hiOpen ? x < (long double)hi : x <= (long double)hi;
  return aboveLo && belowHi;
}

bool Config::Range::any() const { return std::isinf(lo) && lo < 0 && std::isinf(hi) && hi > 0; }

std::string Config::Range::toString() const {
  const bool bottomless = std::isinf(lo) && lo < 0, topless = std::isinf(hi) && hi > 0;
  if (bottomless && topless) return "any value";
  if (topless) return fmt::format("{} {}", loOpen ? ">" : ">=", lo);
  if (bottomless) return fmt::format("{} {}", hiOpen ? "<" : "<=", hi);
  return fmt::format("{}{}, {}{}", loOpen ? "(" : "[", lo, hi, hiOpen ? ")" : "]");
}

bool Config::inRange(const Key& key, const Value& value) {
  if (key.type == Type::kString) {
    const auto& s = std::get<std::string>(value);
    return key.choices.empty() || std::find(key.choices.begin(), key.choices.end(), s) != key.choices.end();
  }
  if (key.type == Type::kInt) return key.range.containsInteger(std::get<int64_t>(value));
  if (key.type == Type::kIntList) {
    for (int64_t v : std::get<std::vector<int64_t>>(value)) {
      if (!key.range.containsInteger(v)) return false;
    }
    return true;
  }
  if (key.type != Type::kFloat) return true;
  const double v = std::get<double>(value);
  return std::isfinite(v) && key.range.contains(v);
}

void Config::checkRange(const Key& key, const Value& value, std::string_view where) {
  if (inRange(key, value)) return;
  if (key.type == Type::kString) {
    TROUPE_SETUP_ERROR("config: {}: {} must be one of {}, got '{}'", where, key.name, fmt::join(key.choices, ", "),
                       std::get<std::string>(value));
  }
  const Range& r = key.range;
  const std::string range = r.toString();
  const std::string phrase = (range[0] == '(' || range[0] == '[' ? "in " : "") + range;  // "in [0, 1]", ">= 0"
  if (key.type == Type::kFloat && !std::isfinite(std::get<double>(value))) {
    TROUPE_SETUP_ERROR("config: {}: {} must be a finite number{}, got {}", where, key.name,
                       r.any() ? "" : " " + phrase, formatValue(value));
  }
  if (key.type == Type::kIntList) {
    TROUPE_SETUP_ERROR("config: {}: every item of {} must be {}, got {}", where, key.name, phrase, formatValue(value));
  }
  TROUPE_SETUP_ERROR("config: {}: {} must be {}, got {}", where, key.name, phrase, formatValue(value));
}

std::string Config::describe() const {
  std::string out;
  for (const auto& [name, e] : entries_) {
    std::string range;
    if (e.key.type == Type::kFloat) {
      range = e.key.range.any() ? " (finite)" : fmt::format(" (finite, {})", e.key.range.toString());
    } else if (e.key.type == Type::kInt && !e.key.range.any()) {
      range = fmt::format(" ({})", e.key.range.toString());
    } else if (e.key.type == Type::kIntList && !e.key.range.any()) {
      range = fmt::format(" (each {})", e.key.range.toString());
    } else if (e.key.type == Type::kString && !e.key.choices.empty()) {
      range = fmt::format(" (one of {})", fmt::join(e.key.choices, ", "));
    }
    out += fmt::format("{:<34} {:<16} default {:<14} {}{}\n", name, typeName(e.key.type),
                       formatValue(e.key.defaultValue), e.key.help, range);
  }
  return out;
}

}  // namespace troupe
