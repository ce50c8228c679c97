#include "core/param.h"

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <mutex>

namespace cofab {
namespace {

// The table of declared parameters and test overrides. Function-local statics so that
// registration from other translation units' static initialisers is order-independent.
struct ParamTable {
  std::mutex mu;
  std::map<std::string, ParamInfo, std::less<>> declared;
  std::map<std::string, std::string, std::less<>> overrides;
};

ParamTable& table() {
  static ParamTable* t = new ParamTable();  // never destroyed: params outlive static dtors
  return *t;
}

std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return std::tolower(c); });
  return s;
}

}  // namespace

std::vector<ParamInfo> listParams() {
  auto& t = table();
  std::lock_guard<std::mutex> lock(t.mu);
  std::vector<ParamInfo> out;
  for (const auto& [_, info] : t.declared) out.push_back(info);
  return out;
}

bool rawParamValue(std::string_view name, std::string* out) {
  {
    auto& t = table();
    std::lock_guard<std::mutex> lock(t.mu);
    auto it = t.overrides.find(name);
    if (it != t.overrides.end()) {
      *out = it->second;
      return true;
    }
  }
  const char* v = std::getenv(std::string(name).c_str());
  if (v == nullptr) return false;
  *out = v;
  return true;
}

ParamBase::ParamBase(const char* name, const char* type, std::string defaultText,
                     std::string accepted, const char* doc)
    : name_(name) {
  auto& t = table();
  std::lock_guard<std::mutex> lock(t.mu);
  t.declared[name] = ParamInfo{name, type, std::move(defaultText), std::move(accepted), doc};
}

Status ParamBase::malformed(const std::string& value, const std::string& accepted) const {
  return InvalidArgument(std::string(name_) + "='" + value + "' is malformed: expected " +
                         accepted);
}

static std::string intRange(int64_t min, int64_t max) {
  return "an integer in [" + std::to_string(min) + ", " + std::to_string(max) + "]";
}

IntParam::IntParam(const char* name, int64_t def, int64_t min, int64_t max, const char* doc)
    : ParamBase(name, "int", std::to_string(def), intRange(min, max), doc),
      def_(def),
      min_(min),
      max_(max) {}

// Decimal, whole string, within [min, max]. from_chars, not strtoll: that skipped leading
// whitespace and took a '+' (" 5000" and "+5000" passed while "5000 " did not).
static bool parseIntInRange(const std::string& v, int64_t min, int64_t max, int64_t* out) {
  int64_t parsed = 0;
  const char* end = v.data() + v.size();
  const auto [ptr, ec] = std::from_chars(v.data(), end, parsed, 10);
  if (v.empty() || ec != std::errc() || ptr != end || parsed < min || parsed > max) return false;
  *out = parsed;
  return true;
}

StatusOr<int64_t> IntParam::get() const {
  std::string v;
  if (!raw(&v)) return def_;
  int64_t out = 0;
  if (!parseIntInRange(v, min_, max_, &out)) return malformed(v, intRange(min_, max_));
  return out;
}

StatusOr<int64_t> parseIntIn(const std::string& text, const std::string& source, int64_t min,
                             int64_t max) {
  int64_t out = 0;
  if (!parseIntInRange(text, min, max, &out)) {
    return InvalidArgument(source + " expects " + intRange(min, max) + ", got '" + text + "'");
  }
  return out;
}

static std::string doubleRange(double min, double max) {
  char text[96];
  std::snprintf(text, sizeof(text), "a number in [%g, %g]", min, max);
  return text;
}

// Decimal, whole string, within [min, max] (so never nan or inf). from_chars in the general
// format: no leading whitespace, '+' or hex floats, which strtod took.
static bool parseDoubleInRange(const std::string& v, double min, double max, double* out) {
  double parsed = 0;
  const char* end = v.data() + v.size();
  const auto [ptr, ec] = std::from_chars(v.data(), end, parsed, std::chars_format::general);
  if (v.empty() || ec != std::errc() || ptr != end || !(parsed >= min && parsed <= max)) {
    return false;
  }
  *out = parsed;
  return true;
}

StatusOr<double> parseDoubleIn(const std::string& text, const std::string& source, double min,
                               double max) {
  double out = 0;
  if (!parseDoubleInRange(text, min, max, &out)) {
    return InvalidArgument(source + " expects " + doubleRange(min, max) + ", got '" + text + "'");
  }
  return out;
}

DoubleParam::DoubleParam(const char* name, double def, double min, double max, const char* doc)
    : ParamBase(name, "double", std::to_string(def), doubleRange(min, max), doc),
      def_(def),
      min_(min),
      max_(max) {}

StatusOr<double> DoubleParam::get() const {
  std::string v;
  if (!raw(&v)) return def_;
  double out = 0;
  if (!parseDoubleInRange(v, min_, max_, &out)) return malformed(v, doubleRange(min_, max_));
  return out;
}

BoolParam::BoolParam(const char* name, bool def, const char* doc)
    : ParamBase(name, "bool", def ? "1" : "0", "1/0, true/false, yes/no or on/off", doc),
      def_(def) {}

std::optional<bool> parseBoolText(std::string_view text) {
  const std::string l = lower(std::string(text));
  if (l == "1" || l == "true" || l == "yes" || l == "on") return true;
  if (l == "0" || l == "false" || l == "no" || l == "off") return false;
  return std::nullopt;
}

StatusOr<bool> BoolParam::get() const {
  std::string v;
  if (!raw(&v)) return def_;
  if (const auto b = parseBoolText(v)) return *b;
  return malformed(v, "1/0, true/false, yes/no or on/off");
}

StringParam::StringParam(const char* name, const char* def, const char* doc)
    : ParamBase(name, "string", def, "any text", doc), def_(def) {}

StatusOr<std::string> StringParam::get() const {
  std::string v;
  if (!raw(&v)) return def_;
  return v;
}

static std::string joinChoices(const std::vector<std::string>& choices) {
  std::string s = "one of";
  for (size_t i = 0; i < choices.size(); ++i) s += (i ? ", " : " ") + choices[i];
  return s;
}

EnumParam::EnumParam(const char* name, const char* def, std::vector<std::string> choices,
                     const char* doc)
    : ParamBase(name, "enum", def, joinChoices(choices), doc),
      def_(def),
      choices_(std::move(choices)) {}

StatusOr<std::string> EnumParam::get() const {
  std::string v;
  if (!raw(&v)) return def_;
  if (std::find(choices_.begin(), choices_.end(), v) == choices_.end()) {
    return malformed(v, joinChoices(choices_));
  }
  return v;
}

ScopedParamOverride::ScopedParamOverride(std::string name, std::string value)
    : name_(std::move(name)) {
  auto& t = table();
  std::lock_guard<std::mutex> lock(t.mu);
  auto it = t.overrides.find(name_);
  if (it != t.overrides.end()) {
    hadPrevious_ = true;
    previous_ = it->second;
  }
  t.overrides[name_] = std::move(value);
}

ScopedParamOverride::~ScopedParamOverride() {
  auto& t = table();
  std::lock_guard<std::mutex> lock(t.mu);
  if (hadPrevious_) {
    t.overrides[name_] = previous_;
  } else {
    t.overrides.erase(name_);
  }
}

}  // namespace cofab
