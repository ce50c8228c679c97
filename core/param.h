// COFAB_* parameters: every environment variable cofab reads is declared once, next to its use,
// with a type, a default and a one-line doc. `cofab-info` lists them all.
//
//   COFAB_PARAM_INT(kTcpLoops, "COFAB_TCP_LOOPS", 1, 1, 64, "epoll loop threads per context");
//   ...
//   COFAB_ASSIGN_OR_RETURN(int64_t loops, kTcpLoops.get());
//
// get() validates on every read: a malformed value is InvalidArgument naming the variable and
// the accepted form. Tests override values with ScopedParamOverride (thread-safe, process-wide,
// takes precedence over the environment).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"

namespace cofab {

struct ParamInfo {
  std::string name;         // "COFAB_TCP_LOOPS"
  std::string type;         // "int", "bool", "string", "double", "enum"
  std::string defaultText;  // default value as text
  std::string accepted;     // the accepted form, e.g. "integer in [1, 64]"
  std::string doc;          // one line
};

// All parameters declared in the libraries linked into this process, sorted by name.
std::vector<ParamInfo> listParams();
// The raw text currently in effect (override, else environment), or nullopt-like empty+false.
bool rawParamValue(std::string_view name, std::string* out);

class ParamBase {
 public:
  ParamBase(const char* name, const char* type, std::string defaultText, std::string accepted,
            const char* doc);
  const char* name() const { return name_; }

 protected:
  // The raw text in effect, or false if neither overridden nor set in the environment.
  bool raw(std::string* out) const { return rawParamValue(name_, out); }
  Status malformed(const std::string& value, const std::string& accepted) const;

 private:
  const char* name_;
};

// A decimal integer in [min, max] from elsewhere than the environment (a flag, a config file
// line): InvalidArgument naming `source` ("--engines") and the accepted range otherwise.
StatusOr<int64_t> parseIntIn(const std::string& text, const std::string& source, int64_t min,
                             int64_t max);
// The same for a decimal number in [min, max] (nan and inf refused).
StatusOr<double> parseDoubleIn(const std::string& text, const std::string& source, double min,
                               double max);

class IntParam : public ParamBase {
 public:
  IntParam(const char* name, int64_t def, int64_t min, int64_t max, const char* doc);
  StatusOr<int64_t> get() const;
  int64_t defaultValue() const { return def_; }
  // parseIntIn with this parameter's range.
  StatusOr<int64_t> parse(const std::string& text, const std::string& source) const {
    return parseIntIn(text, source, min_, max_);
  }

 private:
  int64_t def_, min_, max_;
};

class DoubleParam : public ParamBase {
 public:
  DoubleParam(const char* name, double def, double min, double max, const char* doc);
  StatusOr<double> get() const;

 private:
  double def_, min_, max_;
};

// The on/off words every cofab switch takes, from the environment or a flag: 1/0, true/false,
// yes/no, on/off, in any case. Empty when `text` is none of them.
std::optional<bool> parseBoolText(std::string_view text);

class BoolParam : public ParamBase {
 public:
  BoolParam(const char* name, bool def, const char* doc);
  // Accepts 1/0, true/false, yes/no, on/off (any case).
  StatusOr<bool> get() const;

 private:
  bool def_;
};

class StringParam : public ParamBase {
 public:
  StringParam(const char* name, const char* def, const char* doc);
  StatusOr<std::string> get() const;

 private:
  std::string def_;
};

// One of a fixed set of words (case-sensitive).
class EnumParam : public ParamBase {
 public:
  EnumParam(const char* name, const char* def, std::vector<std::string> choices, const char* doc);
  StatusOr<std::string> get() const;

 private:
  std::string def_;
  std::vector<std::string> choices_;
};

// Sets a parameter for this process until destroyed (tests, embedders). Nested overrides of
// the same name restore the previous value.
class ScopedParamOverride {
 public:
  ScopedParamOverride(std::string name, std::string value);
  ~ScopedParamOverride();
  ScopedParamOverride(const ScopedParamOverride&) = delete;
  ScopedParamOverride& operator=(const ScopedParamOverride&) = delete;

 private:
  std::string name_;
  bool hadPrevious_ = false;
  std::string previous_;
};

}  // namespace cofab

// Declares a parameter object at namespace scope in a .cc file (one definition per variable).
#define COFAB_PARAM_INT(var, name, def, min, max, doc) \
  static const ::cofab::IntParam var { name, def, min, max, doc }
#define COFAB_PARAM_DOUBLE(var, name, def, min, max, doc) \
  static const ::cofab::DoubleParam var { name, def, min, max, doc }
#define COFAB_PARAM_BOOL(var, name, def, doc) \
  static const ::cofab::BoolParam var { name, def, doc }
#define COFAB_PARAM_STRING(var, name, def, doc) \
  static const ::cofab::StringParam var { name, def, doc }
#define COFAB_PARAM_ENUM(var, name, def, choices, doc) \
  static const ::cofab::EnumParam var { name, def, choices, doc }
