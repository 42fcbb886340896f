// tiletune/json.hpp: a small, strict JSON reader (RFC 8259), header-only C++17.
//
// Contract: parse() never throws out (allocation failure included) and reads exactly one JSON
// value, whitespace around it, nothing else: no comments, no trailing commas, no NaN/Infinity,
// no byte order mark, no leading zeros, no raw control characters in strings, valid UTF-8 only,
// \u escapes with surrogates in pairs only. Nesting is bounded (kMaxDepth). An object keeps its
// members in the order they first appear; a name given twice takes its last value (as Python's
// json and pydantic read it). A number written without fraction or exponent that fits int64 is
// `integral`; every number also has its correctly rounded double (`number`).
#pragma once

#include <charconv>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace tiletune::json {

enum class Kind : std::uint8_t { null, boolean, number, string, array, object };

//! One JSON value. Arrays hold their elements in `items`; objects their member names in `names`
//! and values in `items` (same index).
struct Value {
  Kind kind = Kind::null;
  bool boolean = false;
  bool integral = false;
  std::int64_t integer = 0;
  double number = 0.0;
  std::string text;
  std::vector<std::string> names;
  std::vector<Value> items;

  //! The member named `name` of an object, or nullptr (not an object, or no such member).
  const Value* find(std::string_view name) const noexcept {
    if (kind != Kind::object) return nullptr;
    for (std::size_t i = 0; i < names.size(); ++i) {
      if (names[i] == name) return &items[i];
    }
    return nullptr;
  }
};

//! The most nested arrays and objects a document may hold.
constexpr int kMaxDepth = 64;

namespace detail {

class Parser {
 public:
  explicit Parser(std::string_view text) noexcept : text_(text) {}

  bool document(Value& out, std::string& error) {
    skip_space();
    if (!value(out, 0)) return fail_with(error);
    skip_space();
    if (pos_ != text_.size()) {
      error_ = "trailing characters";
      return fail_with(error);
    }
    return true;
  }

 private:
  bool fail_with(std::string& error) {
    error = error_ + " at byte " + std::to_string(pos_);
    return false;
  }
  bool fail(const char* why) {
    error_ = why;
    return false;
  }
  void skip_space() noexcept {
    while (pos_ < text_.size()) {
      char c = text_[pos_];
      if (c != ' ' && c != '\t' && c != '\n' && c != '\r') return;
      ++pos_;
    }
  }
  bool literal(std::string_view word) noexcept {
    if (text_.substr(pos_, word.size()) != word) return false;
    pos_ += word.size();
    return true;
  }

  bool value(Value& out, int depth) {
    if (pos_ >= text_.size()) return fail("unexpected end");
    char c = text_[pos_];
    if (c == '{') return object(out, depth + 1);
    if (c == '[') return array(out, depth + 1);
    if (c == '"') {
      out.kind = Kind::string;
      return string(out.text);
    }
    if (c == '-' || (c >= '0' && c <= '9')) return number(out);
    if (literal("true") || literal("false")) {
      out.kind = Kind::boolean;
      out.boolean = c == 't';
      return true;
    }
    if (literal("null")) {
      out.kind = Kind::null;
      return true;
    }
    return fail("not a JSON value");
  }

  bool array(Value& out, int depth) {
    if (depth > kMaxDepth) return fail("nested too deeply");
    out.kind = Kind::array;
    ++pos_;
    skip_space();
    if (pos_ < text_.size() && text_[pos_] == ']') {
      ++pos_;
      return true;
    }
    for (;;) {
      skip_space();
      out.items.emplace_back();
      if (!value(out.items.back(), depth)) return false;
      skip_space();
      if (pos_ >= text_.size()) return fail("unexpected end in an array");
      char c = text_[pos_++];
      if (c == ']') return true;
      if (c != ',') return fail("expected , or ] in an array");
    }
  }

  bool object(Value& out, int depth) {
    if (depth > kMaxDepth) return fail("nested too deeply");
    out.kind = Kind::object;
    ++pos_;
    skip_space();
    if (pos_ < text_.size() && text_[pos_] == '}') {
      ++pos_;
      return true;
    }
    std::unordered_map<std::string, std::size_t> seen;  // filled once an object grows large
    for (;;) {
      skip_space();
      std::string name;
      if (pos_ >= text_.size() || text_[pos_] != '"') return fail("expected a member name");
      if (!string(name)) return false;
      skip_space();
      if (pos_ >= text_.size() || text_[pos_++] != ':') return fail("expected : after a member name");
      skip_space();
      Value item;
      if (!value(item, depth)) return false;
      put_member(out, std::move(name), std::move(item), seen);
      skip_space();
      if (pos_ >= text_.size()) return fail("unexpected end in an object");
      char c = text_[pos_++];
      if (c == '}') return true;
      if (c != ',') return fail("expected , or } in an object");
    }
  }

  //! A member given twice keeps its first place and takes its last value.
  static void put_member(Value& out, std::string name, Value item,
                         std::unordered_map<std::string, std::size_t>& seen) {
    constexpr std::size_t kLinear = 16;
    if (out.names.size() < kLinear) {
      for (std::size_t i = 0; i < out.names.size(); ++i) {
        if (out.names[i] == name) {
          out.items[i] = std::move(item);
          return;
        }
      }
    } else {
      if (seen.empty()) {
        for (std::size_t i = 0; i < out.names.size(); ++i) seen.emplace(out.names[i], i);
      }
      auto found = seen.find(name);
      if (found != seen.end()) {
        out.items[found->second] = std::move(item);
        return;
      }
      seen.emplace(name, out.names.size());
    }
    out.names.push_back(std::move(name));
    out.items.push_back(std::move(item));
  }

  bool number(Value& out) {
    std::size_t start = pos_;
    if (text_[pos_] == '-') ++pos_;
    if (pos_ >= text_.size() || text_[pos_] < '0' || text_[pos_] > '9') return fail("bad number");
    if (text_[pos_] == '0') {
      ++pos_;
    } else {
      while (pos_ < text_.size() && text_[pos_] >= '0' && text_[pos_] <= '9') ++pos_;
    }
    bool plain = true;
    if (pos_ < text_.size() && text_[pos_] == '.') {
      plain = false;
      ++pos_;
      if (!digits()) return fail("bad number fraction");
    }
    if (pos_ < text_.size() && (text_[pos_] == 'e' || text_[pos_] == 'E')) {
      plain = false;
      ++pos_;
      if (pos_ < text_.size() && (text_[pos_] == '+' || text_[pos_] == '-')) ++pos_;
      if (!digits()) return fail("bad number exponent");
    }
    const char* first = text_.data() + start;
    const char* last = text_.data() + pos_;
    out.kind = Kind::number;
    auto as_double = std::from_chars(first, last, out.number);
    if (as_double.ec == std::errc::result_out_of_range) {  // 1e400: infinite, 1e-400: zero (as Python)
      std::string_view written(first, pos_ - start);
      std::size_t e = written.find_first_of("eE");
      bool tiny = e != std::string_view::npos && e + 1 < written.size() && written[e + 1] == '-';
      out.number = std::copysign(tiny ? 0.0 : HUGE_VAL, *first == '-' ? -1.0 : 1.0);
    } else if (as_double.ec != std::errc()) {
      return fail("bad number");
    }
    if (plain) {
      auto as_int = std::from_chars(first, last, out.integer);
      out.integral = as_int.ec == std::errc() && as_int.ptr == last;
    }
    return true;
  }

  bool digits() noexcept {
    std::size_t start = pos_;
    while (pos_ < text_.size() && text_[pos_] >= '0' && text_[pos_] <= '9') ++pos_;
    return pos_ > start;
  }

  static void append_utf8(std::string& out, std::uint32_t code) {
    if (code < 0x80) {
      out += static_cast<char>(code);
    } else if (code < 0x800) {
      out += static_cast<char>(0xC0 | (code >> 6));
      out += static_cast<char>(0x80 | (code & 0x3F));
    } else if (code < 0x10000) {
      out += static_cast<char>(0xE0 | (code >> 12));
      out += static_cast<char>(0x80 | ((code >> 6) & 0x3F));
      out += static_cast<char>(0x80 | (code & 0x3F));
    } else {
      out += static_cast<char>(0xF0 | (code >> 18));
      out += static_cast<char>(0x80 | ((code >> 12) & 0x3F));
      out += static_cast<char>(0x80 | ((code >> 6) & 0x3F));
      out += static_cast<char>(0x80 | (code & 0x3F));
    }
  }

  bool hex4(std::uint32_t& code) noexcept {
    if (text_.size() - pos_ < 4) return false;
    code = 0;
    for (int i = 0; i < 4; ++i) {
      char c = text_[pos_++];
      code <<= 4;
      if (c >= '0' && c <= '9') code |= static_cast<std::uint32_t>(c - '0');
      else if (c >= 'a' && c <= 'f') code |= static_cast<std::uint32_t>(c - 'a' + 10);
      else if (c >= 'A' && c <= 'F') code |= static_cast<std::uint32_t>(c - 'A' + 10);
      else return false;
    }
    return true;
  }

  bool escape(std::string& out) {
    if (pos_ >= text_.size()) return fail("unexpected end in a string");
    char c = text_[pos_++];
    switch (c) {
      case '"': out += '"'; return true;
      case '\\': out += '\\'; return true;
      case '/': out += '/'; return true;
      case 'b': out += '\b'; return true;
      case 'f': out += '\f'; return true;
      case 'n': out += '\n'; return true;
      case 'r': out += '\r'; return true;
      case 't': out += '\t'; return true;
      case 'u': break;
      default: return fail("bad escape");
    }
    std::uint32_t code = 0;
    if (!hex4(code)) return fail("bad \\u escape");
    if (code >= 0xDC00 && code <= 0xDFFF) return fail("a lone surrogate");
    if (code >= 0xD800 && code <= 0xDBFF) {
      std::uint32_t low = 0;
      if (!literal("\\u") || !hex4(low) || low < 0xDC00 || low > 0xDFFF) return fail("a lone surrogate");
      code = 0x10000 + ((code - 0xD800) << 10) + (low - 0xDC00);
    }
    append_utf8(out, code);
    return true;
  }

  //! One UTF-8 sequence of 2 to 4 bytes starting at pos_ (lead byte `lead`), checked and copied.
  bool utf8_sequence(std::string& out, unsigned char lead) {
    int more = 0;
    std::uint32_t code = 0;
    if (lead >= 0xC2 && lead <= 0xDF) { more = 1; code = lead & 0x1Fu; }
    else if (lead >= 0xE0 && lead <= 0xEF) { more = 2; code = lead & 0x0Fu; }
    else if (lead >= 0xF0 && lead <= 0xF4) { more = 3; code = lead & 0x07u; }
    else return fail("invalid UTF-8");
    if (text_.size() - pos_ < static_cast<std::size_t>(more) + 1) return fail("invalid UTF-8");
    for (int i = 1; i <= more; ++i) {
      auto next = static_cast<unsigned char>(text_[pos_ + static_cast<std::size_t>(i)]);
      if ((next & 0xC0u) != 0x80u) return fail("invalid UTF-8");
      code = (code << 6) | (next & 0x3Fu);
    }
    static constexpr std::uint32_t kSmallest[] = {0, 0x80, 0x800, 0x10000};
    if (code < kSmallest[more] || code > 0x10FFFF || (code >= 0xD800 && code <= 0xDFFF)) {
      return fail("invalid UTF-8");
    }
    out.append(text_.data() + pos_, static_cast<std::size_t>(more) + 1);
    pos_ += static_cast<std::size_t>(more) + 1;
    return true;
  }

  bool string(std::string& out) {
    ++pos_;  // the opening quote
    for (;;) {
      if (pos_ >= text_.size()) return fail("unexpected end in a string");
      auto c = static_cast<unsigned char>(text_[pos_]);
      if (c == '"') {
        ++pos_;
        return true;
      }
      if (c < 0x20) return fail("a control character in a string");
      if (c == '\\') {
        ++pos_;
        if (!escape(out)) return false;
      } else if (c < 0x80) {
        out += static_cast<char>(c);
        ++pos_;
      } else if (!utf8_sequence(out, c)) {
        return false;
      }
    }
  }

  std::string_view text_;
  std::size_t pos_ = 0;
  std::string error_;
};

}  // namespace detail

//! Parse `text` into `out`; false (with `error` saying what and where) when it is not one
//! strict JSON document. Never throws.
inline bool parse(std::string_view text, Value& out, std::string& error) noexcept {
  try {
    out = Value();
    return detail::Parser(text).document(out, error);
  } catch (...) {  // allocation failure
    out = Value();
    error = "out of memory";
    return false;
  }
}

}  // namespace tiletune::json
