// tiletune/lookup.hpp: how a Table answers a key (exact, nearest, default); see config.hpp.
#pragma once

#include "tiletune/table.hpp"

namespace tiletune {
namespace detail {

//! The most dims a key holds once the kernel's dim defaults are filled in.
constexpr std::size_t kMaxFilled = 64;
//! The longest canonical shape text looked up (16 dims of 64-character names need under 1,500).
constexpr std::size_t kMaxKeyBytes = 4096;

//! `a == b`, inline (names are short: a call to memcmp costs more than the comparison).
inline bool same(std::string_view a, std::string_view b) noexcept {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (a[i] != b[i]) return false;
  }
  return true;
}

//! The dtype of a launch key as tiletune.client.keys.key_problem takes it (the kernel's name is
//! checked once, when the table is built: a name the table lacks is answered the default anyway).
inline bool valid_dtype(std::string_view dtype) noexcept {
  if (dtype.empty() || dtype.size() > 64) return false;
  std::size_t characters = 0;
  for (char c : dtype) characters += (static_cast<unsigned char>(c) & 0xC0u) != 0x80u;
  return characters > 0 && characters <= 16;
}

//! The dims of a launch key as key_problem takes them (and no dim named twice); `named`: the
//! names are known good (in_kernel_order), only the values are checked.
inline bool valid_dims(const Dim* dims, std::size_t count, bool named) noexcept {
  if (count > kMaxDims || (count > 0 && dims == nullptr)) return false;
  for (std::size_t i = 0; i < count; ++i) {
    if (dims[i].value < 0 || dims[i].value > kMaxDim) return false;
    if (named) continue;
    if (!is_identifier(dims[i].name)) return false;
    for (std::size_t j = 0; j < i; ++j) {
      if (same(dims[j].name, dims[i].name)) return false;
    }
  }
  return true;
}

inline const Dim* find_dim(const Dim* dims, std::size_t count, std::string_view name) noexcept {
  for (std::size_t i = 0; i < count; ++i) {
    if (same(dims[i].name, name)) return &dims[i];
  }
  return nullptr;
}

//! Whether the key's dims are the kernel's, in its order, and the kernel's dims are distinct
//! identifiers (then the key's names need no check, and it is its own canonical order).
inline bool in_kernel_order(const KernelIndex* kernel, const Dim* dims, std::size_t count) noexcept {
  if (kernel == nullptr || kernel->info == nullptr || !kernel->plain_dims || kernel->info->dims.size() != count) {
    return false;
  }
  for (std::size_t i = 0; i < count; ++i) {
    if (!same(dims[i].name, kernel->info->dims[i])) return false;
  }
  return true;
}

//! Whether the key leaves out a dim the kernel's info gives a default (then with_defaults fills it).
inline bool needs_defaults(const KernelInfo* info, const Dim* dims, std::size_t count) noexcept {
  if (info == nullptr) return false;
  for (const auto& d : info->dim_defaults) {
    if (find_dim(dims, count, d.first) == nullptr) return true;
  }
  return false;
}

//! tiletune.client.known.with_defaults: the key with the dims it leaves out that have a default
//! (when needs_defaults), into `filled`; how many dims it has.
inline std::size_t with_defaults(const KernelInfo* info, const Dim* dims, std::size_t count, Dim* filled) noexcept {
  for (std::size_t i = 0; i < count; ++i) filled[i] = dims[i];
  std::size_t size = count;
  for (const std::string& dim : info->dims) {
    const auto* rule = find_named(info->dim_defaults, dim);
    if (rule == nullptr || size == kMaxFilled || find_dim(filled, size, dim) != nullptr) continue;
    if (rule->second.second.empty()) {
      filled[size++] = Dim{dim, rule->second.first};
    } else if (const Dim* named = find_dim(filled, size, rule->second.second)) {
      filled[size++] = Dim{dim, named->value};
    }
  }
  return size;
}

//! tiletune.client.known.canonical_shape into `out`; false when it does not fit.
inline bool canonical_shape(const KernelInfo* info, const Dim* dims, std::size_t count, bool ordered, char* out,
                            std::size_t& size) noexcept {
  bool in_dim_order = info != nullptr && !ordered;  // ordered: the caller's order is the kernel's
  if (in_dim_order) {
    for (const std::string& dim : info->dims) in_dim_order = in_dim_order && find_dim(dims, count, dim) != nullptr;
    for (std::size_t i = 0; i < count && in_dim_order; ++i) {
      bool listed = false;
      for (const std::string& dim : info->dims) listed = listed || same(dim, dims[i].name);
      in_dim_order = listed;
    }
  }
  size = 0;
  auto put = [&](std::string_view name, std::int64_t value) {
    if (size + name.size() + 24 > kMaxKeyBytes) return false;
    if (size > 0) out[size++] = ',';
    std::memcpy(out + size, name.data(), name.size());
    size += name.size();
    out[size++] = '=';
    size = static_cast<std::size_t>(std::to_chars(out + size, out + kMaxKeyBytes, value).ptr - out);
    return true;
  };
  if (in_dim_order) {
    for (const std::string& dim : info->dims) {
      if (!put(dim, find_dim(dims, count, dim)->value)) return false;
    }
    return true;
  }
  for (std::size_t i = 0; i < count; ++i) {
    if (!put(dims[i].name, dims[i].value)) return false;
  }
  return true;
}

//! tiletune.client.nearest.shape_distance; false when the shapes are not comparable.
inline bool shape_distance(const Dim* a, std::size_t count, const NamedInts& b, const KernelInfo& info,
                           double& total) noexcept {
  if (b.size() != count) return false;
  total = 0.0;
  for (std::size_t i = 0; i < count; ++i) {
    const auto* other = find_named(b, a[i].name);
    if (other == nullptr) return false;
    if (std::find(info.categorical.begin(), info.categorical.end(), a[i].name) != info.categorical.end()) {
      if (a[i].value != other->second) return false;
    } else if (a[i].value <= 0 || other->second <= 0) {
      return false;
    } else {
      total += std::fabs(std::log2(static_cast<double>(a[i].value)) - std::log2(static_cast<double>(other->second)));
    }
  }
  return true;
}

//! tiletune.client.knobs.adapt: a nearest entry's config snapped down to the asked shape's values.
inline bool adapt(const KernelIndex& kernel, std::int64_t version, const NamedInts& config, const Dim* asked,
                  std::size_t count, Answer& answer) noexcept {
  const KernelInfo* info = kernel.info != nullptr && kernel.info->version == version ? kernel.info : nullptr;
  bool known = info != nullptr && kernel.rules_known;
  for (std::size_t i = 0; known && i < kernel.rules.size(); ++i) {
    const Dim* dim = kernel.rules[i].clamped ? find_dim(asked, count, kernel.rules[i].dim) : nullptr;
    known = !kernel.rules[i].clamped || (dim != nullptr && dim->value > 0);
  }
  bool same_knobs = info == nullptr || info->knobs.empty() || !known;
  if (info != nullptr) {
    same_knobs = true;
    for (const auto& knob : config) {
      same_knobs = same_knobs && std::find(info->knobs.begin(), info->knobs.end(), knob.first) != info->knobs.end();
    }
    for (const std::string& knob : info->knobs) same_knobs = same_knobs && find_named(config, knob) != nullptr;
    if (!known && info->knobs.empty()) same_knobs = true;
  }
  if (!same_knobs) return false;
  if (!known) {
    for (const auto& knob : config) answer.add(knob.first, knob.second);
    return true;
  }
  for (std::size_t i = 0; i < kernel.rules.size(); ++i) {
    const KnobRule& rule = kernel.rules[i];
    if (answer.get(rule.name, -1) != -1) continue;  // a knob named twice in the info: its first place
    std::int64_t value = find_named(config, rule.name)->second;
    std::int64_t cap = rule.clamped ? clamp_cap(rule.candidates, find_dim(asked, count, rule.dim)->value, kernel.pow2_ceil)
                                    : INT64_MAX;
    std::int64_t below = INT64_MIN, smallest = INT64_MAX;
    for (std::int64_t candidate : rule.candidates) {
      std::int64_t v = std::min(candidate, cap);
      smallest = std::min(smallest, v);
      if (v <= value) below = std::max(below, v);
    }
    answer.add(rule.name, below != INT64_MIN ? below : smallest);
  }
  return true;
}

inline void State::exact(const KernelIndex* kernel, std::int64_t version, const Dim* dims, std::size_t count,
                         bool ordered, std::string_view dtype, Answer& answer) const noexcept {
  const Group* g = group(kernel, version, dtype);
  if (g == nullptr) return;
  const std::int64_t* row = ordered ? g->by_values.find(dims, count) : nullptr;
  if (row != nullptr) {
    if (const std::int64_t* values = g->by_values.knobs(row)) {  // the answer from the row alone
      const std::size_t knobs = g->knob_heads.size();
      for (std::size_t k = 0; k < knobs; ++k) {
        answer.knobs[k] = g->knob_heads[k];
        answer.knobs[k].value = values[k];
      }
      answer.count = static_cast<std::uint8_t>(knobs);
      answer.match = Match::exact;
      return;
    }
  }
  std::int64_t found = row != nullptr ? static_cast<std::int64_t>(g->by_values.entry(row)) : -1;
  if (found < 0 && !(ordered && g->all_by_values)) {  // a key not in the kernel's order, or odd shape keys
    char key[kMaxKeyBytes];
    std::size_t size = 0;
    if (!canonical_shape(kernel->info, dims, count, ordered, key, size)) return;
    found = g->by_shape_key.find(std::string_view(key, size));
  }
  if (found < 0) return;
  for (const auto& knob : g->entries[static_cast<std::size_t>(found)]->config) answer.add(knob.first, knob.second);
  answer.match = Match::exact;
}

//! The query's dims as places in the kernel's dim order, and their log2 (0 where not positive), for
//! the scan of Group::shaped entries; false when the query's dims are not the kernel's (then no
//! such entry is comparable: shape_distance needs the same dims).
inline bool query_places(const KernelIndex& kernel, const Dim* query, std::size_t count, std::size_t* places,
                         double* logs) noexcept {
  const std::vector<std::string>& dims = kernel.info->dims;
  if (count != dims.size()) return false;
  for (std::size_t i = 0; i < count; ++i) {
    std::size_t d = 0;
    while (d < dims.size() && !same(dims[d], query[i].name)) ++d;
    if (d == dims.size()) return false;
    places[i] = d;
    logs[i] = query[i].value > 0 ? std::log2(static_cast<double>(query[i].value)) : 0.0;
  }
  return true;
}

//! shape_distance for a Group::shaped entry, from the precomputed logs: the same terms summed in
//! the same (the query's) order, so the same double.
inline bool scanned_distance(const KernelIndex& kernel, const Group& g, std::size_t e, const Dim* query,
                             std::size_t count, const std::size_t* places, const double* logs,
                             double& total) noexcept {
  const std::int64_t* values = &g.values[e * count];
  const double* entry_logs = &g.logs[e * count];
  total = 0.0;
  for (std::size_t i = 0; i < count; ++i) {
    const std::size_t d = places[i];
    if (kernel.categorical_dims[d] != 0) {
      if (query[i].value != values[d]) return false;
    } else if (query[i].value <= 0 || values[d] <= 0) {
      return false;
    } else {
      total += std::fabs(logs[i] - entry_logs[d]);
    }
  }
  return true;
}

inline void State::nearest(const KernelIndex& kernel, std::int64_t version, const Dim* query, std::size_t filled,
                           const Dim* asked, std::size_t count, std::string_view dtype, Answer& answer) const noexcept {
  const Group* g = group(&kernel, version, dtype);
  if (g == nullptr) return;
  std::size_t places[kMaxFilled];
  double logs[kMaxFilled];
  const bool scannable = !g->shaped.empty() && query_places(kernel, query, filled, places, logs);
  const Entry* best = nullptr;
  double best_distance = 0.0;
  for (std::size_t e = 0; e < g->entries.size(); ++e) {
    const Entry* entry = g->entries[e];
    double distance = 0.0;
    const bool comparable = !g->shaped.empty() && g->shaped[e] != 0
                                ? scannable && scanned_distance(kernel, *g, e, query, filled, places, logs, distance)
                                : shape_distance(query, filled, entry->shape, *kernel.info, distance);
    if (!comparable) continue;
    if (best == nullptr || distance < best_distance ||
        (distance == best_distance && entry->shape_key < best->shape_key)) {
      best = entry;
      best_distance = distance;
    }
  }
  if (best == nullptr || !adapt(kernel, version, best->config, asked, count, answer)) {
    answer.count = 0;
    return;
  }
  answer.match = Match::nearest;
  answer.distance = best_distance;
}

inline Answer State::get(std::string_view kernel_name, const Dim* dims, std::size_t count, std::string_view dtype,
                         std::int64_t version) const noexcept {
  Answer answer;
  if (kernel_name.size() > kMaxName) return answer;  // never an identifier: not hashed
  std::int64_t at = by_kernel.find(kernel_name);
  const KernelIndex* kernel = at >= 0 ? &kernels[static_cast<std::size_t>(at)] : nullptr;
  if (kernel == nullptr || !kernel->valid_name || !valid_dtype(dtype)) return answer;
  const KernelInfo* info = kernel->info;
  const bool ordered = in_kernel_order(kernel, dims, count);
  if (!valid_dims(dims, count, ordered)) return answer;
  if (version == kBundleVersion) {
    if (info == nullptr) return answer;
    version = info->version;
  }
  if (ordered ? !kernel->defaults_elsewhere : !needs_defaults(info, dims, count)) {  // the key as given
    exact(kernel, version, dims, count, ordered, dtype, answer);
    if (answer.match == Match::exact || info == nullptr) return answer;
    nearest(*kernel, version, dims, count, dims, count, dtype, answer);
    return answer;
  }
  Dim filled[kMaxFilled];
  std::size_t size = with_defaults(info, dims, count, filled);
  exact(kernel, version, filled, size, in_kernel_order(kernel, filled, size), dtype, answer);
  if (answer.match == Match::exact) return answer;
  nearest(*kernel, version, filled, size, dims, count, dtype, answer);
  return answer;
}

inline std::string file_text(const std::string& path, std::string& error) {
  constexpr std::streamoff kMaxBundleBytes = std::streamoff{256} << 20;
  std::ifstream file(path, std::ios::binary);
  if (!file) {
    error = "cannot open " + path;
    return {};
  }
  file.seekg(0, std::ios::end);
  std::streamoff size = file.tellg();
  if (size < 0 || size > kMaxBundleBytes) {
    error = path + " is not a readable file of at most 256 MiB";
    return {};
  }
  std::string text(static_cast<std::size_t>(size), '\0');
  file.seekg(0, std::ios::beg);
  if (!file.read(text.data(), size)) {
    error = "cannot read " + path;
    return {};
  }
  return text;
}

}  // namespace detail

//! The tuned configs of one bundle; see config.hpp. Copies share the same immutable data.
class Table {
 public:
  Table() noexcept = default;

  //! The bundle in `text`, entries of `chip` (empty: the bundle's chip; all when it names none).
  static Table parse(std::string_view text, const std::string& chip = "") noexcept {
    Table table;
    try {
      auto state = std::make_shared<detail::State>();
      if (read_bundle(text, state->bundle, state->error)) state->build(chip);
      table.state_ = std::move(state);
    } catch (...) {  // out of memory: an empty table
      table.state_.reset();
    }
    return table;
  }

  //! The bundle file at `path` (the server's export or the Python client's disk cache).
  static Table load(const std::string& path, const std::string& chip = "") noexcept {
    try {
      std::string error;
      std::string text = detail::file_text(path, error);
      if (!error.empty()) {
        Table table;
        auto state = std::make_shared<detail::State>();
        state->error = std::move(error);
        table.state_ = std::move(state);
        return table;
      }
      return parse(text, chip);
    } catch (...) {
      return Table();
    }
  }

  Answer get(std::string_view kernel, const Dim* dims, std::size_t count, std::string_view dtype,
             std::int64_t version = kBundleVersion) const noexcept {
    if (!state_) return Answer();
    return state_->get(kernel, dims, count, dtype, version);
  }
  Answer get(std::string_view kernel, std::initializer_list<Dim> dims, std::string_view dtype,
             std::int64_t version = kBundleVersion) const noexcept {
    return get(kernel, dims.begin(), dims.size(), dtype, version);
  }

  //! Whether a bundle was read (an empty table answers every key with the default).
  bool ok() const noexcept { return state_ != nullptr && state_->error.empty(); }
  //! Why no bundle was read ("" when one was).
  std::string_view error() const noexcept {
    return state_ == nullptr ? std::string_view("out of memory") : std::string_view(state_->error);
  }
  //! The entries read from the file (before the chip filter, the check and de-duplication).
  std::size_t entries_read() const noexcept { return state_ ? state_->bundle.entries.size() : 0; }

 private:
  friend class Client;
  std::shared_ptr<const detail::State> state_;
};

//! A table that can be reloaded from its file while threads call get(); see config.hpp.
class Client {
 public:
  //! Reads `path` (entries of `chip`; empty: the bundle's) at once.
  explicit Client(const std::string& path, const std::string& chip = "") noexcept {
    try {
      path_ = path;
      chip_ = chip;
    } catch (...) {
      return;
    }
    reload();
  }

  //! Reads the file again and swaps the new table in; a file refused keeps the current table
  //! (if there is one) and returns false.
  bool reload() noexcept {
    Table fresh = Table::load(path_, chip_);
    if (!fresh.ok() && std::atomic_load(&state_) != nullptr) return false;
    std::atomic_store(&state_, fresh.state_);
    return fresh.ok();
  }

  Answer get(std::string_view kernel, const Dim* dims, std::size_t count, std::string_view dtype,
             std::int64_t version = kBundleVersion) const noexcept {
    std::shared_ptr<const detail::State> state = std::atomic_load(&state_);
    if (!state) return Answer();
    return state->get(kernel, dims, count, dtype, version);
  }
  Answer get(std::string_view kernel, std::initializer_list<Dim> dims, std::string_view dtype,
             std::int64_t version = kBundleVersion) const noexcept {
    return get(kernel, dims.begin(), dims.size(), dtype, version);
  }

  //! The table now (a caller may keep it and look up without the swap's cost).
  Table table() const noexcept {
    Table table;
    table.state_ = std::atomic_load(&state_);
    return table;
  }

 private:
  std::string path_;
  std::string chip_;
  std::shared_ptr<const detail::State> state_;
};

//! The Python client's disk cache file of `chip`: $TILETUNE_CACHE_DIR, else $XDG_CACHE_HOME/tiletune,
//! else $HOME/.cache/tiletune; the chip's name with each run of characters other than letters,
//! digits, '.' and '-' made one '_' (trimmed of '_'; "chip" when nothing is left), then ".json".
inline std::string disk_cache_path(std::string_view chip) {
  auto env = [](const char* name) -> std::string {
    const char* value = std::getenv(name);
    return value != nullptr ? value : "";
  };
  std::string folder = env("TILETUNE_CACHE_DIR");
  if (folder.empty()) {
    std::string base = env("XDG_CACHE_HOME");
    if (base.empty()) base = env("HOME") + "/.cache";
    folder = base + "/tiletune";
  }
  while (folder.size() > 1 && folder.back() == '/') folder.pop_back();
  std::string name;
  for (char c : chip) {
    bool kept = (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '.' || c == '-';
    if (kept) name += c;
    else if (name.empty() || name.back() != '_') name += '_';
  }
  std::size_t first = name.find_first_not_of('_');
  name = first == std::string::npos ? std::string("chip") : name.substr(first, name.find_last_not_of('_') - first + 1);
  return folder + "/" + name + ".json";
}

}  // namespace tiletune
