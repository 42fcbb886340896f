// tiletune/table.hpp: Table, Client and disk_cache_path (see config.hpp, which includes this).
#pragma once

#include "tiletune/config.hpp"

namespace tiletune {
namespace detail {

//! A bundle read and indexed; immutable once built.
class State {
 public:
  Bundle bundle;
  std::string error;
  std::vector<KernelIndex> kernels;
  StringIndex by_kernel;

  void build(const std::string& chip);
  Answer get(std::string_view kernel, const Dim* dims, std::size_t count, std::string_view dtype,
             std::int64_t version) const noexcept;

 private:
  bool accepts(const Entry& entry, const KernelIndex* kernel) const noexcept;
  void exact(const KernelIndex* kernel, std::int64_t version, const Dim* dims, std::size_t count, bool ordered,
             std::string_view dtype, Answer& answer) const noexcept;
  void nearest(const KernelIndex& kernel, std::int64_t version, const Dim* query, std::size_t filled,
               const Dim* asked, std::size_t count, std::string_view dtype, Answer& answer) const noexcept;
  const Group* group(const KernelIndex* kernel, std::int64_t version, std::string_view dtype) const noexcept {
    if (kernel == nullptr) return nullptr;
    for (const Group& g : kernel->groups) {
      if (g.version == version && g.dtype == dtype) return &g;
    }
    return nullptr;
  }
};

inline void compile_rules(KernelIndex& index) {
  const KernelInfo& info = *index.info;
  index.plain_dims = info.dims.size() <= kMaxDims;
  for (std::size_t i = 0; i < info.dims.size(); ++i) {
    index.plain_dims = index.plain_dims && is_identifier(info.dims[i]) &&
                       std::find(info.dims.begin(), info.dims.begin() + static_cast<std::ptrdiff_t>(i), info.dims[i]) ==
                           info.dims.begin() + static_cast<std::ptrdiff_t>(i);
  }
  for (const auto& d : info.dim_defaults) {
    index.defaults_elsewhere = index.defaults_elsewhere || std::find(info.dims.begin(), info.dims.end(), d.first) == info.dims.end();
  }
  for (const std::string& dim : info.dims) {
    bool categorical = std::find(info.categorical.begin(), info.categorical.end(), dim) != info.categorical.end();
    index.categorical_dims.push_back(categorical ? 1 : 0);
  }
  index.pow2_ceil = info.clamp_rule == "pow2_ceil";
  if (!info.has_knob_values || (info.clamp_rule != "min" && !index.pow2_ceil)) return;
  for (const std::string& knob : info.knobs) {
    const auto* values = find_named(info.knob_values, knob);
    if (values == nullptr || values->second.empty()) return;
    KnobRule rule{knob, values->second, false, {}};
    std::sort(rule.candidates.begin(), rule.candidates.end());
    rule.candidates.erase(std::unique(rule.candidates.begin(), rule.candidates.end()), rule.candidates.end());
    if (const auto* dim = find_named(info.clamp_to, knob)) {
      rule.clamped = true;
      rule.dim = dim->second;
    }
    index.rules.push_back(std::move(rule));
  }
  index.rules_known = true;
}

//! The config check of tiletune.client.knobs.KnobCheck, for an entry of `kernel`'s info version.
inline bool State::accepts(const Entry& entry, const KernelIndex* kernel) const noexcept {
  const KernelInfo* info = kernel != nullptr ? kernel->info : nullptr;
  for (const auto& knob : entry.config) {
    if (knob.second <= 0) return false;
  }
  if (info == nullptr || info->version != entry.kernel_version || info->knobs.empty()) return true;
  for (const auto& knob : entry.config) {
    if (std::find(info->knobs.begin(), info->knobs.end(), knob.first) == info->knobs.end()) return false;
  }
  for (const std::string& knob : info->knobs) {
    if (find_named(entry.config, knob) == nullptr) return false;
  }
  if (!kernel->rules_known) return true;
  for (const auto& knob : entry.config) {
    const KnobRule* rule = nullptr;
    for (const KnobRule& r : kernel->rules) {
      if (r.name == knob.first) rule = &r;
    }
    const std::vector<std::int64_t>& values = rule->candidates;
    bool listed = std::binary_search(values.begin(), values.end(), knob.second);
    if (!rule->clamped) {
      if (!listed) return false;
      continue;
    }
    const auto* dim = find_named(entry.shape, rule->dim);
    if (dim == nullptr || dim->second <= 0) return false;
    std::int64_t cap = clamp_cap(values, dim->second, kernel->pow2_ceil);
    if (!((listed && knob.second <= cap) || (knob.second == cap && values.back() >= cap))) return false;
  }
  return true;
}

//! Whether `config` names `names` in their order (then its values go into a packed row).
inline bool in_knob_order(const NamedInts& config, const std::vector<std::string>& names) noexcept {
  if (config.size() != names.size()) return false;
  for (std::size_t i = 0; i < names.size(); ++i) {
    if (config[i].first != names[i]) return false;
  }
  return true;
}

//! Fills `g.by_values` with the entries whose shape key is their shape in the kernel's dim order.
inline void index_values(const KernelIndex& kernel, Group& g) {
  if (kernel.info == nullptr || !kernel.plain_dims) return;
  const std::vector<std::string>& dims = kernel.info->dims;
  if (!kernel.info->knobs.empty()) {
    g.knob_names = kernel.info->knobs;
  } else if (!g.entries.empty()) {
    for (const auto& knob : g.entries.front()->config) g.knob_names.push_back(knob.first);
  }
  const bool long_name = std::any_of(g.knob_names.begin(), g.knob_names.end(),
                                     [](const std::string& name) { return name.size() > kMaxName; });
  if (g.knob_names.size() > kMaxKnobs || long_name) g.knob_names.clear();  // no packed rows then
  for (const std::string& name : g.knob_names) {  // names of at most kMaxName: an answer's knobs
    Knob head{};
    std::memcpy(head.name, name.data(), name.size());
    head.size = static_cast<std::uint8_t>(name.size());
    g.knob_heads.push_back(head);
  }
  std::vector<std::int64_t> values(dims.size()), knob_values(g.knob_names.size());
  std::string written;
  g.all_by_values = true;
  g.by_values.reset(dims.size(), g.knob_names.size());
  for (std::uint32_t i = 0; i < g.entries.size(); ++i) {
    const Entry& entry = *g.entries[i];
    bool canonical = entry.shape.size() == dims.size();
    written.clear();
    for (std::size_t d = 0; d < dims.size() && canonical; ++d) {
      const auto* dim = find_named(entry.shape, dims[d]);
      canonical = dim != nullptr;
      if (!canonical) break;
      values[d] = dim->second;
      written.append(d > 0 ? "," : "").append(dims[d]).append("=").append(std::to_string(dim->second));
    }
    if (canonical && written == entry.shape_key) {
      const bool packed = !g.knob_names.empty() && in_knob_order(entry.config, g.knob_names);
      for (std::size_t k = 0; packed && k < knob_values.size(); ++k) knob_values[k] = entry.config[k].second;
      g.by_values.add(values.data(), i, packed ? knob_values.data() : nullptr);
    } else {
      g.all_by_values = false;
    }
  }
  g.by_values.build();
}

//! Fills `g.shaped`, `g.values` and `g.logs` (see Group): nearest scans them without a name lookup.
inline void index_shapes(const KernelIndex& kernel, Group& g) {
  if (kernel.info == nullptr || !kernel.plain_dims) return;
  const std::vector<std::string>& dims = kernel.info->dims;
  const std::size_t n = dims.size();
  g.shaped.assign(g.entries.size(), 0);
  g.values.assign(g.entries.size() * n, 0);
  g.logs.assign(g.entries.size() * n, 0.0);
  for (std::size_t e = 0; e < g.entries.size(); ++e) {
    const NamedInts& shape = g.entries[e]->shape;
    bool same_dims = shape.size() == n;  // n distinct names all found: exactly the kernel's dims
    for (std::size_t d = 0; d < n && same_dims; ++d) {
      const auto* dim = find_named(shape, dims[d]);
      same_dims = dim != nullptr;
      if (!same_dims) break;
      g.values[e * n + d] = dim->second;
      g.logs[e * n + d] = dim->second > 0 ? std::log2(static_cast<double>(dim->second)) : 0.0;
    }
    g.shaped[e] = same_dims ? 1 : 0;
  }
}

inline void State::build(const std::string& chip) {
  const bool any_chip = chip.empty() && !bundle.has_chip;
  const std::string& wanted = chip.empty() ? bundle.chip : chip;
  std::vector<std::string_view> names;
  auto kernel_of = [&](const std::string& name) -> KernelIndex& {
    for (std::size_t i = 0; i < names.size(); ++i) {
      if (names[i] == name) return kernels[i];
    }
    names.push_back(name);
    kernels.emplace_back();
    kernels.back().valid_name = is_identifier(name);
    return kernels.back();
  };
  kernels.reserve(bundle.kernels.size() + bundle.entries.size());
  for (const KernelInfo& info : bundle.kernels) kernel_of(info.name).info = &info;  // the last one wins
  for (KernelIndex& index : kernels) compile_rules(index);
  // Newer promotions win per key; a tie keeps the first (KnownConfigs.add).
  std::unordered_map<std::string, std::pair<std::size_t, std::size_t>> placed;  // key -> (group, entry)
  std::string key;
  for (const Entry& entry : bundle.entries) {
    if (!any_chip && entry.chip != wanted) continue;
    KernelIndex& kernel = kernel_of(entry.kernel);
    if (!accepts(entry, &kernel)) continue;
    std::size_t at = 0;
    while (at < kernel.groups.size() &&
           (kernel.groups[at].version != entry.kernel_version || kernel.groups[at].dtype != entry.dtype)) {
      ++at;
    }
    if (at == kernel.groups.size()) {
      Group fresh;
      fresh.version = entry.kernel_version;
      fresh.dtype = entry.dtype;
      kernel.groups.push_back(std::move(fresh));
    }
    Group& target = kernel.groups[at];
    key.clear();
    key.append(std::to_string(&kernel - kernels.data())).append(1, ':').append(std::to_string(at));
    key.append(1, ':').append(entry.shape_key);  // kernel and group by number: no name can blur them
    auto found = placed.find(key);
    if (found == placed.end()) {
      placed.emplace(key, std::make_pair(at, target.entries.size()));
      target.entries.push_back(&entry);
    } else if (target.entries[found->second.second]->promoted_us < entry.promoted_us) {
      target.entries[found->second.second] = &entry;
    }
  }
  for (KernelIndex& kernel : kernels) {
    for (Group& g : kernel.groups) {
      std::vector<std::string_view> shape_keys;
      for (const Entry* entry : g.entries) shape_keys.push_back(entry->shape_key);
      g.by_shape_key.build(shape_keys);
      index_values(kernel, g);
      index_shapes(kernel, g);
    }
  }
  by_kernel.build(names);
}

}  // namespace detail
}  // namespace tiletune

#include "tiletune/lookup.hpp"
