// tiletune/bundle.hpp: a config bundle file read and checked as the Python client reads it.
//
// A bundle is the JSON the server exports (`tiletune configs export`, GET /v1/configs) and the
// Python client keeps as its disk cache: {"format": "tiletune.configs/1", "chip", "kernels":
// [KernelInfo], "configs": [BestConfigPublic], "checksum", ...}. read_bundle() accepts a document
// only when all of it is valid as pydantic validates it (unknown fields ignored; a name given
// twice takes its last value) and its "checksum" is present and equal to the SHA-256 of its
// entries in canonical JSON (ConfigBundle.content_checksum), recomputed here from what was read.
// Stricter than pydantic where a file pydantic wrote never differs: integers must be JSON
// integers (not 1.0 or "1"), numbers JSON numbers, datetimes ISO 8601 text (canonical.hpp).
// Anything else is refused whole, with a reason; nothing throws (std::bad_alloc is caught).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "tiletune/canonical.hpp"
#include "tiletune/json.hpp"
#include "tiletune/sha256.hpp"

namespace tiletune {

//! The largest dim or knob value the wire takes (2^40).
constexpr std::int64_t kMaxDim = std::int64_t{1} << 40;
//! The most dims of a shape and knobs of a config.
constexpr std::size_t kMaxDims = 16;
constexpr std::size_t kMaxKnobs = 32;
//! The longest dim, knob or kernel name.
constexpr std::size_t kMaxName = 64;

using NamedInts = std::vector<std::pair<std::string, std::int64_t>>;

//! What the client knows of a kernel (the wire's KernelInfo).
struct KernelInfo {
  std::string name;
  std::int64_t version = 0;
  std::vector<std::string> dims;
  std::vector<std::string> categorical;
  std::vector<std::string> knobs;
  bool has_knob_values = false;
  std::vector<std::pair<std::string, std::vector<std::int64_t>>> knob_values;
  std::vector<std::pair<std::string, std::string>> clamp_to;
  std::string clamp_rule = "min";
  //! dim -> (value, or the dim it takes its value from when `second` is not empty).
  std::vector<std::pair<std::string, std::pair<std::int64_t, std::string>>> dim_defaults;
};

//! One tuned entry (the wire's BestConfigPublic, the fields the client decides with).
struct Entry {
  std::string kernel;
  std::int64_t kernel_version = 0;
  NamedInts shape;
  std::string shape_key;
  std::string dtype;
  std::string chip;
  NamedInts config;
  double median_ms = 0.0;
  std::int64_t promoted_us = 0;
};

struct Bundle {
  bool has_chip = false;
  std::string chip;
  std::vector<KernelInfo> kernels;
  std::vector<Entry> entries;
};

namespace detail {

using json::Kind;
using json::Value;

inline bool is_identifier(std::string_view name) noexcept {
  if (name.empty() || name.size() > kMaxName) return false;
  for (std::size_t i = 0; i < name.size(); ++i) {
    char c = name[i];
    bool letter = (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || c == '_';
    if (!letter && !(i > 0 && c >= '0' && c <= '9')) return false;
  }
  return true;
}

//! The reader of one document: each method false with `error` set when the document is refused.
class Reader {
 public:
  std::string error;

  bool text(const Value* v, const char* field, std::string& out, bool required = true) {
    if (v == nullptr) return !required || fail(field, "is missing");
    if (v->kind != Kind::string) return fail(field, "is not a string");
    out = v->text;
    return true;
  }
  bool integer(const Value* v, const char* field, std::int64_t& out) {
    if (v == nullptr) return fail(field, "is missing");
    if (v->kind != Kind::number || !v->integral) return fail(field, "is not an integer");
    out = v->integer;
    return true;
  }
  bool texts(const Value* v, const char* field, std::vector<std::string>& out) {
    if (v == nullptr) return true;
    if (v->kind != Kind::array) return fail(field, "is not a list");
    for (const Value& item : v->items) {
      if (item.kind != Kind::string) return fail(field, "holds a non-string");
      out.push_back(item.text);
    }
    return true;
  }
  //! A shape or config: at most `most` identifiers to integers in [0, kMaxDim].
  bool dims(const Value* v, const char* field, std::size_t most, NamedInts& out) {
    if (v == nullptr) return fail(field, "is missing");
    if (v->kind != Kind::object) return fail(field, "is not an object");
    if (v->names.size() > most) return fail(field, "has too many members");
    for (std::size_t i = 0; i < v->names.size(); ++i) {
      const Value& value = v->items[i];
      if (!is_identifier(v->names[i])) return fail(field, "has a name that is not an identifier");
      if (value.kind != Kind::number || !value.integral || value.integer < 0 || value.integer > kMaxDim) {
        return fail(field, "has a value that is not an integer in [0, 2^40]");
      }
      out.emplace_back(v->names[i], value.integer);
    }
    return true;
  }

  bool kernel_info(const Value& v, KernelInfo& info);
  bool entry(const Value& v, Entry& entry, std::string& canonical);

 public:
  bool fail(const char* field, const char* why) {
    error = std::string(field) + " " + why;
    return false;
  }
};

inline bool Reader::kernel_info(const Value& v, KernelInfo& info) {
  if (v.kind != Kind::object) return fail("a kernel", "is not an object");
  if (!text(v.find("name"), "kernels.name", info.name) || !integer(v.find("version"), "kernels.version", info.version) ||
      !texts(v.find("dims"), "kernels.dims", info.dims) ||
      !texts(v.find("categorical"), "kernels.categorical", info.categorical) ||
      !texts(v.find("knobs"), "kernels.knobs", info.knobs) ||
      !text(v.find("clamp_rule"), "kernels.clamp_rule", info.clamp_rule, false)) {
    return false;
  }
  if (v.find("dims") == nullptr) return fail("kernels.dims", "is missing");
  const Value* values = v.find("knob_values");
  if (values != nullptr && values->kind != Kind::null) {
    if (values->kind != Kind::object) return fail("kernels.knob_values", "is not an object");
    info.has_knob_values = true;
    for (std::size_t i = 0; i < values->names.size(); ++i) {
      std::vector<std::int64_t> list;
      if (values->items[i].kind != Kind::array) return fail("kernels.knob_values", "holds a non-list");
      for (const Value& item : values->items[i].items) {
        if (item.kind != Kind::number || !item.integral) return fail("kernels.knob_values", "holds a non-integer");
        list.push_back(item.integer);
      }
      info.knob_values.emplace_back(values->names[i], std::move(list));
    }
  }
  if (const Value* clamp = v.find("clamp_to"); clamp != nullptr) {
    if (clamp->kind != Kind::object) return fail("kernels.clamp_to", "is not an object");
    for (std::size_t i = 0; i < clamp->names.size(); ++i) {
      if (clamp->items[i].kind != Kind::string) return fail("kernels.clamp_to", "holds a non-string");
      info.clamp_to.emplace_back(clamp->names[i], clamp->items[i].text);
    }
  }
  if (const Value* defaults = v.find("dim_defaults"); defaults != nullptr) {
    if (defaults->kind != Kind::object) return fail("kernels.dim_defaults", "is not an object");
    for (std::size_t i = 0; i < defaults->names.size(); ++i) {
      const Value& d = defaults->items[i];
      if (d.kind == Kind::string) {
        info.dim_defaults.push_back({defaults->names[i], {0, d.text}});
      } else if (d.kind == Kind::number && d.integral) {
        info.dim_defaults.push_back({defaults->names[i], {d.integer, std::string()}});
      } else {
        return fail("kernels.dim_defaults", "holds neither an integer nor a string");
      }
    }
  }
  return true;
}

//! Appends `{"a":1,...}` with sorted names (json.dumps(sort_keys=True)).
inline void append_sorted_ints(std::string& out, NamedInts members) {
  std::sort(members.begin(), members.end());
  out += '{';
  for (std::size_t i = 0; i < members.size(); ++i) {
    if (i > 0) out += ',';
    canonical::append_string(out, members[i].first);
    out += ':' + std::to_string(members[i].second);
  }
  out += '}';
}

//! A float field (`required`, else float or null) appended in canonical form.
inline bool append_float_field(Reader& reader, const Value* v, const char* field, bool required, std::string& out,
                               double* keep = nullptr) {
  if (v == nullptr || v->kind == Kind::null) {
    if (required) return reader.fail(field, "is missing");
    out += "null";
    return true;
  }
  if (v->kind != Kind::number) return reader.fail(field, "is not a number");
  if (!std::isfinite(v->number)) return reader.fail(field, "is not finite");
  canonical::append_float(out, v->number);
  if (keep != nullptr) *keep = v->number;
  return true;
}


inline bool append_int_or_null(Reader& reader, const Value* v, const char* field, std::string& out) {
  if (v == nullptr || v->kind == Kind::null) {
    out += "null";
    return true;
  }
  if (v->kind != Kind::number || !v->integral) return reader.fail(field, "is not an integer");
  out += std::to_string(v->integer);
  return true;
}

inline bool append_software(Reader& reader, const Value* v, std::string& out) {
  if (v == nullptr) {
    out += "{}";
    return true;
  }
  if (v->kind != Kind::object) return reader.fail("software", "is not an object");
  std::vector<std::pair<std::string, const Value*>> members;
  for (std::size_t i = 0; i < v->names.size(); ++i) {
    const Value& value = v->items[i];
    if (value.kind != Kind::string && value.kind != Kind::null) return reader.fail("software", "holds a non-string");
    members.emplace_back(v->names[i], &value);
  }
  std::sort(members.begin(), members.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  out += '{';
  for (std::size_t i = 0; i < members.size(); ++i) {
    if (i > 0) out += ',';
    canonical::append_string(out, members[i].first);
    out += ':';
    if (members[i].second->kind == Kind::null) out += "null";
    else canonical::append_string(out, members[i].second->text);
  }
  out += '}';
  return true;
}

//! Reads one entry into `entry` and writes it as ConfigBundle.content_checksum hashes it.
inline bool Reader::entry(const Value& v, Entry& entry, std::string& out) {
  if (v.kind != Kind::object) return fail("an entry", "is not an object");
  std::string promoted;
  if (!text(v.find("kernel"), "kernel", entry.kernel) ||
      !integer(v.find("kernel_version"), "kernel_version", entry.kernel_version) ||
      !dims(v.find("shape"), "shape", kMaxDims, entry.shape) || !text(v.find("shape_key"), "shape_key", entry.shape_key) ||
      !text(v.find("dtype"), "dtype", entry.dtype) || !text(v.find("chip"), "chip", entry.chip) ||
      !dims(v.find("config"), "config", kMaxKnobs, entry.config) || !text(v.find("promoted_at"), "promoted_at", promoted)) {
    return false;
  }
  std::string promoted_text;
  if (!canonical::normalize_datetime(promoted, promoted_text, entry.promoted_us)) {
    return fail("promoted_at", "is not an ISO 8601 date-time");
  }
  out += "{\"chip\":";
  canonical::append_string(out, entry.chip);
  out += ",\"config\":";
  append_sorted_ints(out, entry.config);
  out += ",\"default_config\":";
  const Value* default_config = v.find("default_config");
  if (default_config == nullptr || default_config->kind == Kind::null) {
    out += "null";
  } else {
    NamedInts config;
    if (!dims(default_config, "default_config", kMaxKnobs, config)) return false;
    append_sorted_ints(out, std::move(config));
  }
  out += ",\"default_ms\":";
  if (!append_float_field(*this, v.find("default_ms"), "default_ms", false, out)) return false;
  out += ",\"dtype\":";
  canonical::append_string(out, entry.dtype);
  out += ",\"job_id\":";
  if (!append_int_or_null(*this, v.find("job_id"), "job_id", out)) return false;
  out += ",\"kernel\":";
  canonical::append_string(out, entry.kernel);
  out += ",\"kernel_version\":" + std::to_string(entry.kernel_version) + ",\"median_ms\":";
  if (!append_float_field(*this, v.find("median_ms"), "median_ms", true, out, &entry.median_ms)) return false;
  out += ",\"promoted_at\":";
  canonical::append_string(out, promoted_text);
  out += ",\"shape\":";
  append_sorted_ints(out, entry.shape);
  out += ",\"shape_key\":";
  canonical::append_string(out, entry.shape_key);
  out += ",\"software\":";
  if (!append_software(*this, v.find("software"), out)) return false;
  out += ",\"speedup_vs_default\":";
  if (!append_float_field(*this, v.find("speedup_vs_default"), "speedup_vs_default", false, out)) return false;
  out += ",\"trial_id\":";
  if (!append_int_or_null(*this, v.find("trial_id"), "trial_id", out)) return false;
  out += '}';
  return true;
}

inline bool read_head(Reader& reader, const Value& document, Bundle& out) {
  if (document.kind != Kind::object) return reader.fail("the document", "is not an object");
  const Value* format = document.find("format");
  if (format != nullptr && (format->kind != Kind::string || format->text != "tiletune.configs/1")) {
    return reader.fail("format", "is not tiletune.configs/1");
  }
  if (const Value* exported = document.find("exported_at"); exported != nullptr && exported->kind != Kind::null) {
    std::string text, ignored;
    std::int64_t instant = 0;
    if (!reader.text(exported, "exported_at", text) || !canonical::normalize_datetime(text, ignored, instant)) {
      return reader.fail("exported_at", "is not an ISO 8601 date-time");
    }
  }
  if (const Value* chip = document.find("chip"); chip != nullptr && chip->kind != Kind::null) {
    if (!reader.text(chip, "chip", out.chip)) return false;
    out.has_chip = true;
  }
  if (const Value* kernels = document.find("kernels"); kernels != nullptr) {
    if (kernels->kind != Kind::array) return reader.fail("kernels", "is not a list");
    for (const Value& item : kernels->items) {
      out.kernels.emplace_back();
      if (!reader.kernel_info(item, out.kernels.back())) return false;
    }
  }
  return true;
}

inline bool read_document(std::string_view text, Bundle& out, std::string& error) {
  json::Value document;
  if (!json::parse(text, document, error)) {
    error = "not JSON: " + error;
    return false;
  }
  Reader reader;
  if (!read_head(reader, document, out)) {
    error = reader.error;
    return false;
  }
  const Value* configs = document.find("configs");
  if (configs == nullptr || configs->kind != Kind::array) {
    error = "configs is missing or not a list";
    return false;
  }
  Sha256 hash;
  hash.update("[");
  std::string canonical;
  for (std::size_t i = 0; i < configs->items.size(); ++i) {
    canonical.clear();
    out.entries.emplace_back();
    if (!reader.entry(configs->items[i], out.entries.back(), canonical)) {
      error = "entry " + std::to_string(i) + ": " + reader.error;
      return false;
    }
    if (i > 0) hash.update(",");
    hash.update(canonical);
  }
  hash.update("]");
  const Value* checksum = document.find("checksum");
  if (checksum == nullptr || checksum->kind != Kind::string) {
    error = "the bundle has no checksum";
    return false;
  }
  if (checksum->text != hash.hex_digest()) {
    error = "the checksum does not match the entries";
    return false;
  }
  return true;
}

}  // namespace detail

//! Read a bundle document (see the file's comment). False, with `error` saying why, when it is
//! refused; `out` is then empty. Never throws.
inline bool read_bundle(std::string_view text, Bundle& out, std::string& error) noexcept {
  try {
    out = Bundle();
    if (detail::read_document(text, out, error)) return true;
  } catch (...) {
    error = "out of memory";
  }
  out = Bundle();
  return false;
}

}  // namespace tiletune
