// The C++ client's test driver (tests/client/test_cpp_client.py builds it with g++ and runs it).
//
//   cpp_driver sha256 < hex lines          -> the SHA-256 of each line's bytes
//   cpp_driver float < 16-hex-digit lines  -> each double (its bits) as Python's repr
//   cpp_driver datetime < lines            -> each as pydantic writes it, or "!" when refused
//   cpp_driver lookup BUNDLE CHIP < keys   -> first the table's state, then one answer per key
//   cpp_driver cache-path CHIP             -> the disk cache file of CHIP
//   cpp_driver threads PATH A B KEYS       -> readers look up while PATH is swapped between A and B
//
// A key line is "kernel dtype version name=value,..." ("-" for no version, "-" for no dims); an
// answer line is "match name=value,..." with the knobs sorted.
#include <tiletune/config.hpp>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace {

struct Key {
  std::string kernel, dtype;
  std::int64_t version = tiletune::kBundleVersion;
  std::vector<std::string> names;
  std::vector<tiletune::Dim> dims;
};

Key parse_key(const std::string& line) {
  Key key;
  std::istringstream in(line);
  std::string version, dims;
  in >> key.kernel >> key.dtype >> version >> dims;
  if (version != "-") key.version = std::stoll(version);
  if (dims != "-") {
    std::istringstream parts(dims);
    std::string part;
    std::vector<std::int64_t> values;
    while (std::getline(parts, part, ',')) {
      auto eq = part.find('=');
      key.names.push_back(part.substr(0, eq));
      values.push_back(std::stoll(part.substr(eq + 1)));
    }
    for (std::size_t i = 0; i < values.size(); ++i) key.dims.push_back({key.names[i], values[i]});
  }
  return key;
}

std::string answer_text(const tiletune::Answer& answer) {
  std::vector<std::string> knobs;
  for (std::uint8_t i = 0; i < answer.count; ++i) {
    knobs.push_back(std::string(answer.knobs[i].view()) + "=" + std::to_string(answer.knobs[i].value));
  }
  std::sort(knobs.begin(), knobs.end());
  std::string text = answer.match_name();
  text += ' ';
  for (std::size_t i = 0; i < knobs.size(); ++i) text += (i ? "," : "") + knobs[i];
  return text;
}

std::vector<Key> read_keys(std::istream& in) {
  std::vector<Key> keys;
  std::string line;
  while (std::getline(in, line)) {
    if (!line.empty()) keys.push_back(parse_key(line));
  }
  return keys;
}

int lookup(const std::string& bundle, const std::string& chip) {
  tiletune::Table table = tiletune::Table::load(bundle, chip == "-" ? "" : chip);
  std::cout << (table.ok() ? "ok" : "refused: " + std::string(table.error())) << "\n";
  for (const Key& key : read_keys(std::cin)) {
    std::cout << answer_text(table.get(key.kernel, key.dims.data(), key.dims.size(), key.dtype, key.version)) << "\n";
  }
  return 0;
}

//! Readers answer KEYS while the file at PATH is replaced by A or B (renamed over it) and reloaded:
//! every answer must be A's or B's answer to that key.
int threads(const std::string& path, const std::string& a, const std::string& b) {
  std::vector<Key> keys = read_keys(std::cin);
  tiletune::Table table_a = tiletune::Table::load(a), table_b = tiletune::Table::load(b);
  std::vector<std::string> from_a, from_b;
  for (const Key& k : keys) {
    from_a.push_back(answer_text(table_a.get(k.kernel, k.dims.data(), k.dims.size(), k.dtype, k.version)));
    from_b.push_back(answer_text(table_b.get(k.kernel, k.dims.data(), k.dims.size(), k.dtype, k.version)));
  }
  std::filesystem::copy_file(a, path, std::filesystem::copy_options::overwrite_existing);
  tiletune::Client client(path);
  std::atomic<bool> done{false};
  std::atomic<long> answers{0}, wrong{0};
  std::vector<std::thread> readers;
  for (int t = 0; t < 4; ++t) {
    readers.emplace_back([&, t] {
      for (std::size_t i = static_cast<std::size_t>(t); !done.load(); i = (i + 1) % keys.size()) {
        const Key& k = keys[i];
        std::string got = answer_text(client.get(k.kernel, k.dims.data(), k.dims.size(), k.dtype, k.version));
        if (got != from_a[i] && got != from_b[i]) wrong.fetch_add(1);
        answers.fetch_add(1);
      }
    });
  }
  int reloads = 0;
  for (int round = 0; round < 200; ++round) {
    std::string next = path + ".next";
    std::filesystem::copy_file(round % 2 ? a : b, next, std::filesystem::copy_options::overwrite_existing);
    std::filesystem::rename(next, path);
    reloads += client.reload();
  }
  done = true;
  for (auto& reader : readers) reader.join();
  std::cout << "answers " << answers.load() << " wrong " << wrong.load() << " reloads " << reloads << "\n";
  return 0;
}

int lines(const std::string& what) {
  std::string line;
  while (std::getline(std::cin, line)) {
    if (what == "sha256") {
      std::string bytes;
      for (std::size_t i = 0; i + 1 < line.size(); i += 2) bytes += static_cast<char>(std::stoi(line.substr(i, 2), nullptr, 16));
      std::cout << tiletune::sha256_hex(bytes) << "\n";
    } else if (what == "float") {
      std::uint64_t bits = std::stoull(line, nullptr, 16);
      double value = 0.0;
      std::memcpy(&value, &bits, sizeof value);
      std::string text;
      tiletune::canonical::append_float(text, value);
      std::cout << text << "\n";
    } else {
      std::string text;
      std::int64_t instant = 0;
      bool ok = tiletune::canonical::normalize_datetime(line, text, instant);
      std::cout << (ok ? text + " " + std::to_string(instant) : std::string("!")) << "\n";
    }
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  if (args.size() == 1 && (args[0] == "sha256" || args[0] == "float" || args[0] == "datetime")) return lines(args[0]);
  if (args.size() == 3 && args[0] == "lookup") return lookup(args[1], args[2]);
  if (args.size() == 2 && args[0] == "cache-path") {
    std::cout << tiletune::disk_cache_path(args[1]) << "\n";
    return 0;
  }
  if (args.size() == 4 && args[0] == "threads") return threads(args[1], args[2], args[3]);
  std::cerr << "usage: cpp_driver sha256|float|datetime|lookup|cache-path|threads ...\n";
  return 2;
}
