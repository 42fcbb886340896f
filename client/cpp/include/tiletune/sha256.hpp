// tiletune/sha256.hpp: SHA-256 (FIPS 180-4), header-only C++17, no allocation, never throws.
//
//   tiletune::Sha256 hash; hash.update(bytes); std::string hex = hash.hex_digest();
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

namespace tiletune {

//! An incremental SHA-256. `hex_digest` finishes it (call it once; `update` after it is undefined).
class Sha256 {
 public:
  void update(std::string_view data) noexcept {
    const auto* bytes = reinterpret_cast<const unsigned char*>(data.data());
    std::size_t size = data.size();
    length_bytes_ += size;
    while (size > 0) {
      std::size_t take = std::min(size, kBlockBytes - used_);
      std::memcpy(block_.data() + used_, bytes, take);
      used_ += take;
      bytes += take;
      size -= take;
      if (used_ == kBlockBytes) {
        compress();
        used_ = 0;
      }
    }
  }

  //! The digest as 64 lowercase hex digits (as Python's hashlib.sha256().hexdigest()).
  std::string hex_digest() {
    std::array<unsigned char, 32> digest = finish();
    static constexpr char kHex[] = "0123456789abcdef";
    std::string text(64, '0');
    for (std::size_t i = 0; i < digest.size(); ++i) {
      text[2 * i] = kHex[digest[i] >> 4];
      text[2 * i + 1] = kHex[digest[i] & 0xF];
    }
    return text;
  }

  //! The 32 bytes of the digest.
  std::array<unsigned char, 32> finish() noexcept {
    std::uint64_t bits = length_bytes_ * 8;
    block_[used_++] = 0x80;
    if (used_ > kBlockBytes - 8) {
      std::memset(block_.data() + used_, 0, kBlockBytes - used_);
      compress();
      used_ = 0;
    }
    std::memset(block_.data() + used_, 0, kBlockBytes - 8 - used_);
    for (int i = 0; i < 8; ++i) block_[kBlockBytes - 1 - i] = static_cast<unsigned char>(bits >> (8 * i));
    compress();
    std::array<unsigned char, 32> digest{};
    for (std::size_t i = 0; i < 8; ++i) {
      for (std::size_t j = 0; j < 4; ++j) digest[4 * i + j] = static_cast<unsigned char>(state_[i] >> (24 - 8 * j));
    }
    return digest;
  }

 private:
  static constexpr std::size_t kBlockBytes = 64;

  static std::uint32_t rotr(std::uint32_t x, int n) noexcept { return (x >> n) | (x << (32 - n)); }

  void compress() noexcept {
    static constexpr std::uint32_t kRound[64] = {
        0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
        0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
        0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
        0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
        0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
        0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
        0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
        0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2};
    std::uint32_t w[64];
    for (std::size_t i = 0; i < 16; ++i) {
      w[i] = (std::uint32_t{block_[4 * i]} << 24) | (std::uint32_t{block_[4 * i + 1]} << 16) |
             (std::uint32_t{block_[4 * i + 2]} << 8) | std::uint32_t{block_[4 * i + 3]};
    }
    for (std::size_t i = 16; i < 64; ++i) {
      std::uint32_t s0 = rotr(w[i - 15], 7) ^ rotr(w[i - 15], 18) ^ (w[i - 15] >> 3);
      std::uint32_t s1 = rotr(w[i - 2], 17) ^ rotr(w[i - 2], 19) ^ (w[i - 2] >> 10);
      w[i] = w[i - 16] + s0 + w[i - 7] + s1;
    }
    std::uint32_t a = state_[0], b = state_[1], c = state_[2], d = state_[3];
    std::uint32_t e = state_[4], f = state_[5], g = state_[6], h = state_[7];
    for (std::size_t i = 0; i < 64; ++i) {
      std::uint32_t t1 = h + (rotr(e, 6) ^ rotr(e, 11) ^ rotr(e, 25)) + ((e & f) ^ (~e & g)) + kRound[i] + w[i];
      std::uint32_t t2 = (rotr(a, 2) ^ rotr(a, 13) ^ rotr(a, 22)) + ((a & b) ^ (a & c) ^ (b & c));
      h = g;
      g = f;
      f = e;
      e = d + t1;
      d = c;
      c = b;
      b = a;
      a = t1 + t2;
    }
    state_[0] += a; state_[1] += b; state_[2] += c; state_[3] += d;
    state_[4] += e; state_[5] += f; state_[6] += g; state_[7] += h;
  }

  std::array<std::uint32_t, 8> state_{0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a,
                                      0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};
  std::array<unsigned char, kBlockBytes> block_{};
  std::size_t used_ = 0;
  std::uint64_t length_bytes_ = 0;
};

//! The SHA-256 of `data` as 64 lowercase hex digits.
inline std::string sha256_hex(std::string_view data) {
  Sha256 hash;
  hash.update(data);
  return hash.hex_digest();
}

}  // namespace tiletune
