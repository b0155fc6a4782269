// Config: one typed configuration for a whole job (STYLE.md, Interfaces).
//
// Keys are declared up front in a schema (name, type, default, help). Values
// come from, in order: the defaults, a TOML file, then `--set key=value`
// overrides. Nested TOML tables are flattened to dotted names: `[data]` with
// `rows = 10` is the key "data.rows".
//
// A list of strings may also be written as an array of tables: each table
// becomes one "field=value,field=value" string (the fault plan's
// `[[faults.plan]]`, or `[[faults]]` at the top level, is "faults.plan").
// `--set` does not take a list of strings; Config::append adds one item.
//
// Every failure is a SetupError whose message is one line naming the path or
// key and what was wrong: a missing or unreadable file, TOML syntax (with line
// and column), an unknown key, a value of the wrong type, a bad override, a
// number outside its key's range (NaN and infinity for a float key).
//
// Not thread-safe while being loaded; const access is safe from any thread.
#pragma once

#include <cstdint>
#include <limits>
#include <map>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

namespace troupe {

class Config {
 public:
  enum class Type { kInt, kFloat, kBool, kString, kIntList, kStringList };
  using Value = std::variant<int64_t, double, bool, std::string, std::vector<int64_t>, std::vector<std::string>>;

  // The values a numeric key may take: from lo to hi, either end open. A
  // float key must also be finite (NaN and infinity are refused whatever
  // its range). The default range is any value.
  struct Range {
    double lo = -std::numeric_limits<double>::infinity();
    double hi = std::numeric_limits<double>::infinity();
    bool loOpen = false, hiOpen = false;
    bool contains(double v) const;
    bool containsInteger(int64_t v) const;  // exact for every int64
    bool any() const;
    std::string toString() const;  // "(0, 1]", "[0, 100]", ">= 0", "any value"
  };

  struct Key {
    std::string name;  // dotted, e.g. "data.synthetic.rows"
    Type type;
    Value defaultValue;
    std::string help;
    Range range = {};  // numeric keys (kInt, kFloat)
    std::vector<std::string> choices = {};  // kString: the values it may take (empty: any text)
  };

  explicit Config(std::vector<Key> schema);

  // Loads a TOML file over the current values.
  void loadFile(const std::string& path);
  // Loads TOML text; `origin` names it in error messages.
  void loadString(std::string_view toml, std::string_view origin);
  // Applies one "key=value" override, the value parsed as the key's type.
  void set(std::string_view assignment);
  // Appends one item to a list of strings (`--fault SPEC` uses this).
  void append(std::string_view key, std::string item);
  // Sets a key from a typed value (the CLI's own flags use this).
  void setValue(std::string_view key, Value value);

  bool has(std::string_view key) const;
  int64_t getInt(std::string_view key) const;
  double getFloat(std::string_view key) const;
  bool getBool(std::string_view key) const;
  const std::string& getString(std::string_view key) const;
  const std::vector<int64_t>& getIntList(std::string_view key) const;
  const std::vector<std::string>& getStringList(std::string_view key) const;
  // True when the key was given by a file or an override, not defaulted.
  bool isSet(std::string_view key) const;

  // The resolved configuration as TOML (every key, grouped by table), so a run
  // directory can keep exactly what was used.
  std::string toToml() const;
  // One line per key: name, type, default, help (and a numeric key's range).
  std::string describe() const;

  static const char* typeName(Type type);

 private:
  struct Entry {
    Key key;
    Value value;
    bool set = false;
  };
  const Entry& entry(std::string_view key, Type type) const;
  // Whether a value may be stored for the key: a number inside its range
  // (and finite, for a float); any value of the other types.
  static bool inRange(const Key& key, const Value& value);
  // Refuses what inRange refuses, naming `where` the value came from.
  static void checkRange(const Key& key, const Value& value, std::string_view where);
  Entry& mutableEntry(std::string_view key, std::string_view origin);

  std::map<std::string, Entry, std::less<>> entries_;
};

// The schema of every key troupe understands.
std::vector<Config::Key> troupeConfigSchema();

}  // namespace troupe
