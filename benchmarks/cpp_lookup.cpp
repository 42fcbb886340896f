// The C++ client's lookup cost (benchmarks/cpp_lookup.py builds and runs it).
//
//   cpp_lookup BUNDLE < keys     (a key line: "kernel dtype name=value,...")
//
// Loads BUNDLE (timed), then for each of exact (the keys given), nearest (each key's first dim
// plus one) and default (an unknown kernel) runs ROUNDS batches of BATCH lookups cycling over
// the keys, through a Table and through a Client (its atomic table swap), and prints one JSON
// document: per kind, ns per lookup over batches (median, p10, p90, p99, min).
#include <tiletune/config.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

namespace {

constexpr int kRounds = 200;
constexpr int kBatch = 10000;

struct Key {
  std::string kernel, dtype;
  std::vector<std::string> names;
  std::vector<tiletune::Dim> dims;
};

std::vector<Key> read_keys() {
  std::vector<Key> keys;
  std::string line;
  while (std::getline(std::cin, line)) {
    std::istringstream in(line);
    Key key;
    std::string dims, part;
    in >> key.kernel >> key.dtype >> dims;
    std::istringstream parts(dims);
    std::vector<std::int64_t> values;
    while (std::getline(parts, part, ',')) {
      key.names.push_back(part.substr(0, part.find('=')));
      values.push_back(std::stoll(part.substr(part.find('=') + 1)));
    }
    for (std::size_t i = 0; i < values.size(); ++i) key.dims.push_back({key.names[i], values[i]});
    keys.push_back(std::move(key));
  }
  return keys;
}

volatile std::int64_t sink = 0;

template <typename Lookup>
std::string measure(const std::vector<Key>& keys, Lookup lookup, const char* expected) {
  std::vector<double> ns;
  std::int64_t matched = 0, total = 0;
  for (int round = 0; round < kRounds; ++round) {
    std::size_t at = static_cast<std::size_t>(round) % keys.size();
    auto start = std::chrono::steady_clock::now();
    std::int64_t acc = 0;
    for (int i = 0; i < kBatch; ++i) {
      const Key& key = keys[at];
      tiletune::Answer answer = lookup(key);
      acc += answer.count > 0 ? answer.knobs[0].value : 0;
      matched += std::string_view(answer.match_name()) == expected;
      at = at + 1 == keys.size() ? 0 : at + 1;
    }
    auto stop = std::chrono::steady_clock::now();
    sink = sink + acc;
    total += kBatch;
    ns.push_back(std::chrono::duration<double, std::nano>(stop - start).count() / kBatch);
  }
  std::sort(ns.begin(), ns.end());
  auto q = [&](double f) { return ns[static_cast<std::size_t>(f * static_cast<double>(ns.size() - 1))]; };
  char text[256];
  std::snprintf(text, sizeof text,
                "{\"median_ns\": %.1f, \"p10_ns\": %.1f, \"p90_ns\": %.1f, \"p99_ns\": %.1f, \"min_ns\": %.1f, "
                "\"answered_as_expected\": %.4f}",
                q(0.5), q(0.1), q(0.9), q(0.99), ns.front(), static_cast<double>(matched) / static_cast<double>(total));
  return text;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::cerr << "usage: cpp_lookup BUNDLE < keys\n";
    return 2;
  }
  std::vector<Key> keys = read_keys();
  auto start = std::chrono::steady_clock::now();
  tiletune::Table table = tiletune::Table::load(argv[1]);
  double load_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  if (!table.ok() || keys.empty()) {
    std::cerr << "cannot benchmark: " << table.error() << "\n";
    return 1;
  }
  tiletune::Client client(argv[1]);
  std::vector<Key> near = keys, unknown = keys;
  for (std::size_t i = 0; i < keys.size(); ++i) {
    near[i].dims[0].value += 1;
    unknown[i].kernel = "not_tuned";
  }
  for (std::size_t i = 0; i < keys.size(); ++i) {  // the copies' names point at their own strings
    for (std::size_t d = 0; d < keys[i].dims.size(); ++d) {
      near[i].dims[d].name = near[i].names[d];
      unknown[i].dims[d].name = unknown[i].names[d];
    }
  }
  auto by_table = [&](const Key& k) { return table.get(k.kernel, k.dims.data(), k.dims.size(), k.dtype); };
  auto by_client = [&](const Key& k) { return client.get(k.kernel, k.dims.data(), k.dims.size(), k.dtype); };
  std::printf("{\"entries\": %zu, \"keys\": %zu, \"batch\": %d, \"rounds\": %d, \"load_ms\": %.2f,\n", table.entries_read(),
              keys.size(), kBatch, kRounds, load_ms);
  std::printf(" \"exact\": %s,\n", measure(keys, by_table, "exact").c_str());
  std::printf(" \"exact_via_client\": %s,\n", measure(keys, by_client, "exact").c_str());
  std::printf(" \"nearest\": %s,\n", measure(near, by_table, "nearest").c_str());
  std::printf(" \"default\": %s}\n", measure(unknown, by_table, "default").c_str());
  return 0;
}
