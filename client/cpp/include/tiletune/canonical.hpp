// tiletune/canonical.hpp: values written as Python writes them, for the bundle's checksum.
//
// A bundle's checksum is the SHA-256 of its entries as Python's
// json.dumps(entries, sort_keys=True, separators=(",", ":")) writes them after pydantic has read
// them. These functions write the pieces byte for byte as that does:
// - append_float: a double as Python's repr (shortest round trip; exponent form when the decimal
//   exponent is below -4 or above 15: 1e-05, 1e+16; else fixed with at least one decimal: 2.0);
// - append_string: a string as json.dumps with ensure_ascii (\" \\ \n \r \t \b \f, other
//   characters below 0x20 or above 0x7e as \u00xx, astral ones as surrogate pairs, lowercase hex);
// - normalize_datetime: an ISO 8601 date-time as pydantic serialises it
//   (YYYY-MM-DDTHH:MM:SS[.ffffff][Z|+HH:MM|-HH:MM]; a zero offset is Z, fractions are cut to
//   microseconds and written only when not zero), with its instant in microseconds for ordering.
// All are header-only C++17; none throws but std::bad_alloc.
#pragma once

#include <charconv>
#include <cstdint>
#include <cstdio>
#include <string>
#include <string_view>

namespace tiletune::canonical {

//! Append `value` (finite) as Python's repr(float) writes it.
inline void append_float(std::string& out, double value) {
  char buffer[64];
  auto written = std::to_chars(buffer, buffer + sizeof buffer, value, std::chars_format::scientific);
  std::string_view text(buffer, static_cast<std::size_t>(written.ptr - buffer));
  if (!text.empty() && text[0] == '-') {
    out += '-';
    text.remove_prefix(1);
  }
  std::size_t e = text.find('e');
  std::string digits;
  for (char c : text.substr(0, e)) {
    if (c != '.') digits += c;
  }
  int exponent = 0;
  std::string_view power = text.substr(e + 1);
  if (!power.empty() && power[0] == '+') power.remove_prefix(1);
  std::from_chars(power.data(), power.data() + power.size(), exponent);
  const int point = exponent + 1;  // digits are 0.d1d2... x 10^point
  const int count = static_cast<int>(digits.size());
  if (point <= -4 || point > 16) {
    out += digits[0];
    if (count > 1) {
      out += '.';
      out.append(digits, 1, std::string::npos);
    }
    char tail[16];
    std::snprintf(tail, sizeof tail, "e%c%02d", exponent < 0 ? '-' : '+', exponent < 0 ? -exponent : exponent);
    out += tail;
  } else if (point <= 0) {
    out += "0.";
    out.append(static_cast<std::size_t>(-point), '0');
    out += digits;
  } else if (point < count) {
    out.append(digits, 0, static_cast<std::size_t>(point));
    out += '.';
    out.append(digits, static_cast<std::size_t>(point), std::string::npos);
  } else {
    out += digits;
    out.append(static_cast<std::size_t>(point - count), '0');
    out += ".0";
  }
}

//! Append `text` (valid UTF-8) as a JSON string the way json.dumps(ensure_ascii=True) writes it.
inline void append_string(std::string& out, std::string_view text) {
  static constexpr char kHex[] = "0123456789abcdef";
  auto escape = [&out](std::uint32_t unit) {
    out += "\\u";
    for (int shift = 12; shift >= 0; shift -= 4) out += kHex[(unit >> shift) & 0xF];
  };
  out += '"';
  for (std::size_t i = 0; i < text.size();) {
    auto c = static_cast<unsigned char>(text[i]);
    if (c < 0x80) {
      ++i;
      switch (c) {
        case '"': out += "\\\""; continue;
        case '\\': out += "\\\\"; continue;
        case '\n': out += "\\n"; continue;
        case '\r': out += "\\r"; continue;
        case '\t': out += "\\t"; continue;
        case '\b': out += "\\b"; continue;
        case '\f': out += "\\f"; continue;
        default: break;
      }
      if (c < 0x20 || c == 0x7F) escape(c);
      else out += static_cast<char>(c);
      continue;
    }
    int more = c >= 0xF0 ? 3 : c >= 0xE0 ? 2 : 1;
    std::uint32_t code = c & (more == 3 ? 0x07u : more == 2 ? 0x0Fu : 0x1Fu);
    for (int k = 1; k <= more && i + static_cast<std::size_t>(k) < text.size(); ++k) {
      code = (code << 6) | (static_cast<unsigned char>(text[i + static_cast<std::size_t>(k)]) & 0x3Fu);
    }
    i += static_cast<std::size_t>(more) + 1;
    if (code >= 0x10000) {
      code -= 0x10000;
      escape(0xD800 + (code >> 10));
      escape(0xDC00 + (code & 0x3FF));
    } else {
      escape(code);
    }
  }
  out += '"';
}

namespace detail {

inline bool number_of(std::string_view text, std::size_t at, std::size_t width, int& value) noexcept {
  if (at + width > text.size()) return false;
  value = 0;
  for (std::size_t i = at; i < at + width; ++i) {
    if (text[i] < '0' || text[i] > '9') return false;
    value = value * 10 + (text[i] - '0');
  }
  return true;
}

inline int days_in_month(int year, int month) noexcept {
  static constexpr int kDays[] = {31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31};
  bool leap = (year % 4 == 0 && year % 100 != 0) || year % 400 == 0;
  return month == 2 && leap ? 29 : kDays[month - 1];
}

//! Days from 1970-01-01 to a civil date (Howard Hinnant's algorithm).
inline std::int64_t days_from_civil(int year, int month, int day) noexcept {
  year -= month <= 2;
  const std::int64_t era = (year >= 0 ? year : year - 399) / 400;
  const std::int64_t of_era = year - era * 400;
  const std::int64_t of_year = (153 * (month + (month > 2 ? -3 : 9)) + 2) / 5 + day - 1;
  const std::int64_t of_cycle = of_era * 365 + of_era / 4 - of_era / 100 + of_year;
  return era * 146097 + of_cycle - 719468;
}

//! Reads the time of day after a date (`at` is just past the separator); false when malformed.
inline bool time_of_day(std::string_view text, std::size_t& at, int& hour, int& minute, int& second,
                        int& micros) noexcept {
  if (!number_of(text, at, 2, hour) || at + 2 >= text.size() || text[at + 2] != ':' ||
      !number_of(text, at + 3, 2, minute)) {
    return false;
  }
  at += 5;
  second = 0;
  micros = 0;
  if (at < text.size() && text[at] == ':') {
    if (!number_of(text, at + 1, 2, second)) return false;
    at += 3;
    if (at < text.size() && (text[at] == '.' || text[at] == ',')) {
      std::size_t first = ++at;
      while (at < text.size() && text[at] >= '0' && text[at] <= '9') {
        if (at - first < 6) micros = micros * 10 + (text[at] - '0');
        ++at;
      }
      if (at == first) return false;
      for (std::size_t k = at - first; k < 6; ++k) micros *= 10;
    }
  }
  return hour < 24 && minute < 60 && second < 60;
}

}  // namespace detail

//! `text` (YYYY-MM-DD, optionally [T|t| ]HH:MM[:SS[.f...]] and Z, z, +HH:MM, -HH:MM, +HHMM or
//! -HHMM) as pydantic writes the datetime it reads, into `out`, and its instant in microseconds
//! since the epoch (a date-time without offset counts as UTC). False when `text` is not one.
inline bool normalize_datetime(std::string_view text, std::string& out, std::int64_t& instant_us) {
  int year = 0, month = 0, day = 0, hour = 0, minute = 0, second = 0, micros = 0;
  if (!detail::number_of(text, 0, 4, year) || text.size() < 10 || text[4] != '-' || text[7] != '-' ||
      !detail::number_of(text, 5, 2, month) || !detail::number_of(text, 8, 2, day) || month < 1 ||
      month > 12 || day < 1 || day > detail::days_in_month(year, month) || year < 1) {
    return false;
  }
  std::size_t at = 10;
  bool has_offset = false;
  int offset_minutes = 0;
  if (at < text.size()) {
    if (text[at] != 'T' && text[at] != 't' && text[at] != ' ') return false;
    ++at;
    if (!detail::time_of_day(text, at, hour, minute, second, micros)) return false;
    if (at < text.size() && (text[at] == 'Z' || text[at] == 'z')) {
      has_offset = true;
      ++at;
    } else if (at < text.size() && (text[at] == '+' || text[at] == '-')) {
      int sign = text[at] == '-' ? -1 : 1, off_h = 0, off_m = 0;
      std::size_t minutes_at = at + 3 < text.size() && text[at + 3] == ':' ? at + 4 : at + 3;
      if (!detail::number_of(text, at + 1, 2, off_h) || !detail::number_of(text, minutes_at, 2, off_m) ||
          off_h > 23 || off_m > 59) {
        return false;
      }
      has_offset = true;
      offset_minutes = sign * (off_h * 60 + off_m);
      at = minutes_at + 2;
    }
    if (at != text.size()) return false;
  }
  char buffer[48];
  int size = std::snprintf(buffer, sizeof buffer, "%04d-%02d-%02dT%02d:%02d:%02d", year, month, day, hour,
                           minute, second);
  out.assign(buffer, static_cast<std::size_t>(size));
  if (micros != 0) {
    size = std::snprintf(buffer, sizeof buffer, ".%06d", micros);
    out.append(buffer, static_cast<std::size_t>(size));
  }
  if (has_offset && offset_minutes == 0) {
    out += 'Z';
  } else if (has_offset) {
    int magnitude = offset_minutes < 0 ? -offset_minutes : offset_minutes;
    size = std::snprintf(buffer, sizeof buffer, "%c%02d:%02d", offset_minutes < 0 ? '-' : '+', magnitude / 60,
                         magnitude % 60);
    out.append(buffer, static_cast<std::size_t>(size));
  }
  std::int64_t seconds = detail::days_from_civil(year, month, day) * 86400 + hour * 3600 + minute * 60 + second -
                         std::int64_t{offset_minutes} * 60;
  instant_us = seconds * 1000000 + micros;
  return true;
}

}  // namespace tiletune::canonical
