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

//! Fills `g.by_values` with the entries whose shape key is their shape in the kernel's dim order.
inline void index_values(const KernelIndex& kernel, Group& g) {
  if (kernel.info == nullptr || !kernel.plain_dims) return;
  const std::vector<std::string>& dims = kernel.info->dims;
  std::vector<std::int64_t> values(dims.size());
  std::string written;
  g.all_by_values = true;
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
      g.by_values.add(values.data(), dims.size(), i);
    } else {
      g.all_by_values = false;
    }
  }
  g.by_values.build();
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
    if (at == kernel.groups.size()) kernel.groups.push_back(Group{entry.kernel_version, entry.dtype, {}, {}, {}, false});
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
    }
  }
  by_kernel.build(names);
}

}  // namespace detail
}  // namespace tiletune

#include "tiletune/lookup.hpp"
