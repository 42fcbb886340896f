// tiletune/config.hpp: the tilings tiletune tuned, for C++ host code (header-only C++17).
//
//   #include <tiletune/config.hpp>
//   static const tiletune::Table table = tiletune::Table::load(tiletune::disk_cache_path(chip), chip);
//   tiletune::Answer answer = table.get("native_add", {{"n", total}}, "float32");
//   int64_t tile = answer.get("tile_size", rule_tile);   // the caller's rule when not tuned
//
// A Table is one bundle file (the server's export, or the Python client's disk cache) read once
// and immutable after: any number of threads may call get() at once. get() answers exactly as the
// Python client (tiletune.client) answers from the same file, in the same order:
//   1. exact: the entry of (kernel, version, canonical shape, dtype); the shape is completed with
//      the kernel's dim defaults and written in the kernel's dim order when it has those dims;
//   2. nearest: the entry of the same kernel version and dtype whose shape is closest (the sum of
//      |log2 a - log2 b| over size dims; categorical dims must agree; ties to the smaller shape
//      key), its config snapped down to the values the asked shape allows;
//   3. default: no config (count 0): Answer::get returns the caller's fallback, its own rule.
// `version` is the kernel version the caller's code is (kBundleVersion: the bundle's). An entry
// of another kernel version is never answered. Entries are checked against the kernel's knobs
// when read (a config outside them is dropped, so its key falls to nearest or the default), and
// only entries of the table's chip are taken (the `chip` argument, else the bundle's).
// A file that is missing, not a bundle, or whose checksum does not match gives an empty table
// (every answer the default) whose error() says why. Nothing here throws.
//
// A Client holds a table it can reload from its file while other threads call get(): the new
// table is swapped in whole (an atomic shared_ptr), a reader sees the old or the new one.
#pragma once

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <initializer_list>
#include <iterator>
#include <memory>
#include <atomic>
#include <sstream>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "tiletune/bundle.hpp"

namespace tiletune {

//! "Use the kernel version the bundle describes" (the Python client's version without a pin).
constexpr std::int64_t kBundleVersion = INT64_MIN;

//! One dim of a launch key.
struct Dim {
  std::string_view name;
  std::int64_t value;
};

enum class Match : std::uint8_t { exact, nearest, fallback };

//! One knob of an answer: its name (copied: an answer outlives its table) and value.
struct Knob {
  char name[kMaxName];
  std::uint8_t size;
  std::int64_t value;
  std::string_view view() const noexcept { return {name, size}; }
};

//! A tiling: how it was found and its knobs (none for the default).
struct Answer {
  Match match = Match::fallback;
  std::uint8_t count = 0;
  double distance = 0.0;  //! nearest: the distance of the entry's shape
  Knob knobs[kMaxKnobs];

  //! The value of knob `name`, else `fallback` (the caller's rule).
  std::int64_t get(std::string_view name, std::int64_t fallback) const noexcept {
    for (std::uint8_t i = 0; i < count; ++i) {
      if (knobs[i].view() == name) return knobs[i].value;
    }
    return fallback;
  }
  //! "exact", "nearest" or "default" (the Python client's Tiling.match).
  const char* match_name() const noexcept {
    return match == Match::exact ? "exact" : match == Match::nearest ? "nearest" : "default";
  }
  void add(std::string_view name, std::int64_t value) noexcept {
    Knob& knob = knobs[count++];
    std::memcpy(knob.name, name.data(), name.size());
    knob.size = static_cast<std::uint8_t>(name.size());
    knob.value = value;
  }
};

namespace detail {

//! An open-addressing map from strings to indexes, looked up by string_view without allocating.
class StringIndex {
 public:
  void build(const std::vector<std::string_view>& keys) {
    std::size_t size = 8;
    while (size < keys.size() * 2) size <<= 1;
    slots_.assign(size, kEmpty);
    keys_ = keys;
    for (std::size_t i = 0; i < keys.size(); ++i) {
      std::size_t at = hash(keys[i]) & (size - 1);
      while (slots_[at] != kEmpty) at = (at + 1) & (size - 1);
      slots_[at] = static_cast<std::uint32_t>(i);
    }
  }
  //! The index of `key`, or -1.
  std::int64_t find(std::string_view key) const noexcept {
    if (slots_.empty()) return -1;
    const std::size_t mask = slots_.size() - 1;
    for (std::size_t at = hash(key) & mask;; at = (at + 1) & mask) {
      std::uint32_t slot = slots_[at];
      if (slot == kEmpty) return -1;
      if (keys_[slot] == key) return slot;
    }
  }
  //! A multiply-xorshift hash of 8 bytes a step (the launch path hashes ~100-byte shape keys).
  static std::uint64_t hash(std::string_view key) noexcept {
    const char* at = key.data();
    std::size_t left = key.size();
    std::uint64_t h = 0x9E3779B97F4A7C15ull ^ left;
    std::uint64_t word = 0;
    for (; left >= 8; left -= 8, at += 8) {
      std::memcpy(&word, at, 8);
      h = (h ^ word) * 0xBF58476D1CE4E5B9ull;
      h ^= h >> 31;
    }
    word = 0;
    for (std::size_t i = 0; i < left; ++i) word |= std::uint64_t{static_cast<unsigned char>(at[i])} << (8 * i);
    h = (h ^ word ^ (std::uint64_t{left} << 56)) * 0x94D049BB133111EBull;
    return h ^ (h >> 29);
  }

 private:
  static constexpr std::uint32_t kEmpty = 0xFFFFFFFFu;
  std::vector<std::uint32_t> slots_;
  std::vector<std::string_view> keys_;
};

//! The entries whose shape key is their shape written in the kernel's dim order (as the server
//! writes every key), by their dims' values in that order: a launch key in the kernel's order is
//! looked up without writing its shape key. A row holds the dims' values, the entry's index and,
//! when the entry's config names the group's knobs in their order (`packed`), the knobs' values:
//! a hit reads one row, not the entry (the launch path's cache misses are its cost).
class ValueIndex {
 public:
  //! Starts an index of rows of `dims` values and `knobs` knob values.
  void reset(std::size_t dims, std::size_t knobs) {
    dims_ = dims;
    stride_ = dims + 1 + knobs;
  }
  //! One entry's row; `knob_values` null when its config is not in the group's knob order.
  void add(const std::int64_t* values, std::uint32_t entry, const std::int64_t* knob_values) {
    rows_.insert(rows_.end(), values, values + dims_);
    rows_.push_back(static_cast<std::int64_t>(entry) | (knob_values == nullptr ? kUnpacked : 0));
    const std::size_t knobs = stride_ - dims_ - 1;
    if (knob_values != nullptr) {
      rows_.insert(rows_.end(), knob_values, knob_values + knobs);
    } else {
      rows_.insert(rows_.end(), knobs, 0);
    }
    ++size_;
  }
  void build() {
    std::size_t size = 8;
    while (size < size_ * 2) size <<= 1;
    slots_.assign(size, kEmpty);
    for (std::uint32_t i = 0; i < size_; ++i) {
      std::size_t at = hash(&rows_[i * stride_], dims_) & (size - 1);
      while (slots_[at] != kEmpty) at = (at + 1) & (size - 1);
      slots_[at] = i;
    }
  }
  //! The row whose values are `dims`' values, or null: `entry(row)`, and `knobs(row)` when packed.
  const std::int64_t* find(const Dim* dims, std::size_t count) const noexcept {
    if (size_ == 0 || count != dims_) return nullptr;
    std::uint64_t h = 0x9E3779B97F4A7C15ull;
    for (std::size_t i = 0; i < count; ++i) h = mix(h, dims[i].value);
    const std::size_t mask = slots_.size() - 1;
    for (std::size_t at = h & mask;; at = (at + 1) & mask) {
      std::uint32_t slot = slots_[at];
      if (slot == kEmpty) return nullptr;
      const std::int64_t* row = &rows_[slot * stride_];
      bool equal = true;
      for (std::size_t i = 0; i < count && equal; ++i) equal = row[i] == dims[i].value;
      if (equal) return row;
    }
  }
  //! The index in the group of a row's entry.
  std::size_t entry(const std::int64_t* row) const noexcept {
    return static_cast<std::size_t>(row[dims_] & ~kUnpacked);
  }
  //! A packed row's knob values (in the group's knob order), else null.
  const std::int64_t* knobs(const std::int64_t* row) const noexcept {
    return (row[dims_] & kUnpacked) != 0 ? nullptr : row + dims_ + 1;
  }

 private:
  static std::uint64_t mix(std::uint64_t h, std::int64_t value) noexcept {
    h = (h ^ static_cast<std::uint64_t>(value)) * 0xBF58476D1CE4E5B9ull;
    return h ^ (h >> 31);
  }
  static std::uint64_t hash(const std::int64_t* values, std::size_t count) noexcept {
    std::uint64_t h = 0x9E3779B97F4A7C15ull;
    for (std::size_t i = 0; i < count; ++i) h = mix(h, values[i]);
    return h;
  }
  static constexpr std::uint32_t kEmpty = 0xFFFFFFFFu;
  static constexpr std::int64_t kUnpacked = std::int64_t{1} << 40;
  std::vector<std::int64_t> rows_;
  std::vector<std::uint32_t> slots_;
  std::size_t dims_ = 0;
  std::size_t stride_ = 1;
  std::uint32_t size_ = 0;
};

//! The entries of one (kernel, kernel version, dtype), by shape key (and by values, for those
//! whose key is their shape in the kernel's order; `all_by_values` when every entry is).
struct Group {
  std::int64_t version = 0;
  std::string dtype;
  std::vector<const Entry*> entries;
  StringIndex by_shape_key;
  ValueIndex by_values;
  bool all_by_values = false;
  //! The knob names of by_values' packed rows (the kernel's knobs, else the first entry's), and
  //! the same as an answer's knobs (value 0): a hit copies them whole, no name copied by its size.
  std::vector<std::string> knob_names;
  std::vector<Knob> knob_heads;
  //! The nearest scan's view (index_shapes): `shaped[e]` when entry e's shape has exactly the
  //! kernel's dims, then its values and their log2 (0 where not positive) at e * dims + the dim's
  //! place in the kernel's order; empty when the kernel's dims are not plain.
  std::vector<std::uint8_t> shaped;
  std::vector<std::int64_t> values;
  std::vector<double> logs;
};

//! A knob as the kernel's info gives its values: candidates (sorted, distinct), the dim it is
//! clamped to, or none.
struct KnobRule {
  std::string name;
  std::vector<std::int64_t> candidates;
  bool clamped = false;
  std::string dim;
};

//! One kernel: its info (if the bundle gives one) and its entries' groups.
struct KernelIndex {
  const KernelInfo* info = nullptr;
  bool rules_known = false;  //! every knob has candidates and the clamp rule is known
  bool pow2_ceil = false;
  bool plain_dims = false;  //! the info's dims are distinct identifiers, at most kMaxDims
  bool valid_name = false;  //! the kernel's name is one a launch key may give
  bool defaults_elsewhere = false;  //! a dim default names a dim the info's dims lack
  std::vector<std::uint8_t> categorical_dims;  //! per info dim: whether it is categorical
  std::vector<KnobRule> rules;
  std::vector<Group> groups;
};

inline std::int64_t pow2_ceil(std::int64_t value) noexcept {
  std::int64_t power = 1;
  while (power < value) power <<= 1;
  return power;
}

inline std::int64_t clamp_cap(const std::vector<std::int64_t>& candidates, std::int64_t dim, bool pow2) noexcept {
  if (!pow2) return dim;
  std::int64_t smallest = candidates.front();
  for (std::int64_t c : candidates) smallest = std::min(smallest, c);
  return std::max(pow2_ceil(dim), smallest);
}

template <typename Pairs>
inline const typename Pairs::value_type* find_named(const Pairs& pairs, std::string_view name) noexcept {
  for (const auto& pair : pairs) {
    if (pair.first == name) return &pair;
  }
  return nullptr;
}

}  // namespace detail
}  // namespace tiletune

#include "tiletune/table.hpp"
