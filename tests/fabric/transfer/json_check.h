// A small strict JSON parser for tests (RFC 8259 grammar; numbers as double, no extensions), so
// that a test can check that a file is valid JSON and look into it without a dependency.
#pragma once

#include <cctype>
#include <cstdlib>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace cofab::testing {

struct JsonValue {
  enum class Kind { kNull, kBool, kNumber, kString, kArray, kObject } kind = Kind::kNull;
  bool boolean = false;
  double number = 0;
  std::string string;
  std::vector<JsonValue> array;
  std::map<std::string, JsonValue> object;
  const JsonValue* get(const std::string& k) const {
    auto it = object.find(k);
    return it == object.end() ? nullptr : &it->second;
  }
};

class JsonParser {
 public:
  // True if `text` is exactly one JSON value (surrounded by whitespace); else `error` says where.
  static bool parse(const std::string& text, JsonValue* out, std::string* error) {
    JsonParser p(text);
    if (!p.value(out, 0)) {
      *error = p.error_ + " at offset " + std::to_string(p.pos_);
      return false;
    }
    p.ws();
    if (p.pos_ != text.size()) {
      *error = "trailing characters at offset " + std::to_string(p.pos_);
      return false;
    }
    return true;
  }

 private:
  explicit JsonParser(const std::string& t) : t_(t) {}
  void ws() {
    while (pos_ < t_.size() &&
           (t_[pos_] == ' ' || t_[pos_] == '\n' || t_[pos_] == '\r' || t_[pos_] == '\t')) {
      ++pos_;
    }
  }
  bool fail(const char* what) {
    error_ = what;
    return false;
  }
  bool literal(const char* word) {
    const std::string w(word);
    if (t_.compare(pos_, w.size(), w) != 0) return fail("bad literal");
    pos_ += w.size();
    return true;
  }
  bool value(JsonValue* v, int depth) {
    if (depth > 64) return fail("nesting too deep");
    ws();
    if (pos_ >= t_.size()) return fail("unexpected end");
    const char c = t_[pos_];
    if (c == '{') return object(v, depth);
    if (c == '[') return array(v, depth);
    if (c == '"') {
      v->kind = JsonValue::Kind::kString;
      return string(&v->string);
    }
    if (c == 't' || c == 'f') {
      v->kind = JsonValue::Kind::kBool;
      v->boolean = c == 't';
      return literal(c == 't' ? "true" : "false");
    }
    if (c == 'n') {
      v->kind = JsonValue::Kind::kNull;
      return literal("null");
    }
    return number(v);
  }
  bool number(JsonValue* v) {
    const size_t start = pos_;
    if (pos_ < t_.size() && t_[pos_] == '-') ++pos_;
    if (pos_ >= t_.size() || !std::isdigit(static_cast<unsigned char>(t_[pos_]))) {
      return fail("expected a value");
    }
    if (t_[pos_] == '0') {
      ++pos_;
    } else {
      while (pos_ < t_.size() && std::isdigit(static_cast<unsigned char>(t_[pos_]))) ++pos_;
    }
    if (pos_ < t_.size() && t_[pos_] == '.') {
      ++pos_;
      if (pos_ >= t_.size() || !std::isdigit(static_cast<unsigned char>(t_[pos_]))) {
        return fail("digit expected after '.'");
      }
      while (pos_ < t_.size() && std::isdigit(static_cast<unsigned char>(t_[pos_]))) ++pos_;
    }
    if (pos_ < t_.size() && (t_[pos_] == 'e' || t_[pos_] == 'E')) {
      ++pos_;
      if (pos_ < t_.size() && (t_[pos_] == '+' || t_[pos_] == '-')) ++pos_;
      if (pos_ >= t_.size() || !std::isdigit(static_cast<unsigned char>(t_[pos_]))) {
        return fail("digit expected in exponent");
      }
      while (pos_ < t_.size() && std::isdigit(static_cast<unsigned char>(t_[pos_]))) ++pos_;
    }
    v->kind = JsonValue::Kind::kNumber;
    v->number = std::strtod(t_.substr(start, pos_ - start).c_str(), nullptr);
    return true;
  }
  bool string(std::string* out) {
    ++pos_;  // '"'
    while (pos_ < t_.size()) {
      const char c = t_[pos_++];
      if (c == '"') return true;
      if (static_cast<unsigned char>(c) < 0x20) return fail("control character in string");
      if (c != '\\') {
        out->push_back(c);
        continue;
      }
      if (pos_ >= t_.size()) break;
      const char e = t_[pos_++];
      switch (e) {
        case '"':
        case '\\':
        case '/':
          out->push_back(e);
          break;
        case 'b':
        case 'f':
        case 'n':
        case 'r':
        case 't':
          out->push_back(' ');
          break;
        case 'u':
          for (int i = 0; i < 4; ++i) {
            if (pos_ >= t_.size() || !std::isxdigit(static_cast<unsigned char>(t_[pos_++]))) {
              return fail("bad \\u escape");
            }
          }
          out->push_back('?');
          break;
        default:
          return fail("bad escape");
      }
    }
    return fail("unterminated string");
  }
  bool array(JsonValue* v, int depth) {
    v->kind = JsonValue::Kind::kArray;
    ++pos_;
    ws();
    if (pos_ < t_.size() && t_[pos_] == ']') {
      ++pos_;
      return true;
    }
    for (;;) {
      v->array.emplace_back();
      if (!value(&v->array.back(), depth + 1)) return false;
      ws();
      if (pos_ >= t_.size()) return fail("unterminated array");
      if (t_[pos_] == ',') {
        ++pos_;
        continue;
      }
      if (t_[pos_] == ']') {
        ++pos_;
        return true;
      }
      return fail("expected ',' or ']'");
    }
  }
  bool object(JsonValue* v, int depth) {
    v->kind = JsonValue::Kind::kObject;
    ++pos_;
    ws();
    if (pos_ < t_.size() && t_[pos_] == '}') {
      ++pos_;
      return true;
    }
    for (;;) {
      ws();
      if (pos_ >= t_.size() || t_[pos_] != '"') return fail("expected a key");
      std::string key;
      if (!string(&key)) return false;
      ws();
      if (pos_ >= t_.size() || t_[pos_] != ':') return fail("expected ':'");
      ++pos_;
      if (v->object.count(key)) return fail("duplicate key");
      if (!value(&v->object[key], depth + 1)) return false;
      ws();
      if (pos_ >= t_.size()) return fail("unterminated object");
      if (t_[pos_] == ',') {
        ++pos_;
        continue;
      }
      if (t_[pos_] == '}') {
        ++pos_;
        return true;
      }
      return fail("expected ',' or '}'");
    }
  }

  const std::string& t_;
  size_t pos_ = 0;
  std::string error_;
};

}  // namespace cofab::testing
