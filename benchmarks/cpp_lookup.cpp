// The C++ client's lookup cost (benchmarks/cpp_lookup.py builds and runs it).
//
//   cpp_lookup BUNDLE < keys     (a key line: "kernel dtype name=value,...")
//
// Loads BUNDLE (timed), then runs 200 rounds, each one batch of 10,000 lookups of every kind:
// exact (the keys given, in turn, through a Table), exact_same_key (one key the whole batch, as a
// launch loop asks for one shape; the next batch another key), exact_via_client (in turn, through
// a Client: its atomic table swap), default (an unknown kernel), and every fourth round nearest
// (each key's first dim plus one: a scan of the kernel's entries, batches of 200). Prints one
// JSON document: per kind, ns per lookup over its batches (median, p10, p90, p99, min).
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
//! A nearest answer scans the kernel's entries (microseconds, not nanoseconds): fewer lookups.
constexpr int kNearestRounds = 50;
constexpr int kNearestBatch = 200;

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

//! One kind's ns per lookup, a value per batch, and how many answers were the expected kind.
struct Series {
  const char* expected;
  std::vector<double> ns;
  std::int64_t matched = 0, total = 0;

  std::string json() {
    std::sort(ns.begin(), ns.end());
    auto q = [&](double f) { return ns[static_cast<std::size_t>(f * static_cast<double>(ns.size() - 1))]; };
    char text[256];
    std::snprintf(text, sizeof text,
                  "{\"median_ns\": %.1f, \"p10_ns\": %.1f, \"p90_ns\": %.1f, \"p99_ns\": %.1f, \"min_ns\": %.1f, "
                  "\"answered_as_expected\": %.4f}",
                  q(0.5), q(0.1), q(0.9), q(0.99), ns.front(), static_cast<double>(matched) / static_cast<double>(total));
    return text;
  }
};

//! One batch of `batch` lookups into `series`: keys[first], then the next ones in turn (`cycle`),
//! or keys[first] every time (a launch loop asking for one shape).
template <typename Lookup>
void batch_into(Series& series, const std::vector<Key>& keys, Lookup lookup, std::size_t first, int batch,
                bool cycle) {
  std::size_t at = first % keys.size();
  auto start = std::chrono::steady_clock::now();
  std::int64_t acc = 0, matched = 0;
  for (int i = 0; i < batch; ++i) {
    const Key& key = keys[at];
    tiletune::Answer answer = lookup(key);
    acc += answer.count > 0 ? answer.knobs[0].value : 0;
    matched += std::string_view(answer.match_name()) == series.expected;
    if (cycle) at = at + 1 == keys.size() ? 0 : at + 1;
  }
  auto stop = std::chrono::steady_clock::now();
  sink = sink + acc;
  series.matched += matched;
  series.total += batch;
  series.ns.push_back(std::chrono::duration<double, std::nano>(stop - start).count() / batch);
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
  // One batch of each kind per round, so a slow spell of the machine falls on every kind alike.
  Series exact{"exact", {}}, same_key{"exact", {}}, via_client{"exact", {}}, fallback{"default", {}};
  Series nearest{"nearest", {}};
  for (int round = 0; round < kRounds; ++round) {
    const std::size_t first = static_cast<std::size_t>(round) * 7919u;
    batch_into(exact, keys, by_table, first, kBatch, true);
    batch_into(same_key, keys, by_table, first, kBatch, false);
    batch_into(via_client, keys, by_client, first, kBatch, true);
    batch_into(fallback, unknown, by_table, first, kBatch, true);
    if (round % (kRounds / kNearestRounds) == 0) batch_into(nearest, near, by_table, first, kNearestBatch, true);
  }
  std::printf(" \"exact\": %s,\n", exact.json().c_str());
  std::printf(" \"exact_same_key\": %s,\n", same_key.json().c_str());
  std::printf(" \"exact_via_client\": %s,\n", via_client.json().c_str());
  std::printf(" \"nearest\": %s,\n", nearest.json().c_str());
  std::printf(" \"default\": %s}\n", fallback.json().c_str());
  return 0;
}
