// Small, fast, portable hashes and a seeded random generator. Every result is
// fixed by its inputs alone (no std:: distributions, whose output differs by
// library), so data, embedding rows and planted models are reproducible on any
// machine.
#pragma once

#include <cstdint>
#include <string_view>

namespace troupe {

// SplitMix64 finaliser: a bijective 64-bit mixer.
inline constexpr uint64_t mix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

// Hash of several 64-bit words, order-sensitive.
inline constexpr uint64_t hashCombine(uint64_t a, uint64_t b) { return mix64(a ^ mix64(b)); }
inline constexpr uint64_t hashCombine(uint64_t a, uint64_t b, uint64_t c) {
  return hashCombine(hashCombine(a, b), c);
}

// 64-bit hash of a byte string, seeded (FNV-1a over 8-byte words, then mixed).
inline uint64_t hashBytes(std::string_view s, uint64_t seed = 0) {
  uint64_t h = 0xcbf29ce484222325ULL ^ mix64(seed);
  size_t i = 0;
  for (; i + 8 <= s.size(); i += 8) {
    uint64_t w = 0;
    for (int b = 0; b < 8; ++b) w |= uint64_t(static_cast<unsigned char>(s[i + b])) << (8 * b);
    h = (h ^ w) * 0x100000001b3ULL;
    h ^= h >> 29;
  }
  for (; i < s.size(); ++i) h = (h ^ static_cast<unsigned char>(s[i])) * 0x100000001b3ULL;
  return mix64(h ^ s.size());
}

// A uniform double in [0, 1) from 64 random bits.
inline constexpr double unitDouble(uint64_t bits) { return double(bits >> 11) * 0x1.0p-53; }

// xoshiro256** seeded through SplitMix64: fast, good quality, reproducible.
class Rng {
 public:
  explicit Rng(uint64_t seed) {
    uint64_t x = seed;
    for (auto& w : s_) {
      x += 0x9e3779b97f4a7c15ULL;
      w = mix64(x);
    }
  }
  uint64_t next() {
    const uint64_t result = rotl(s_[1] * 5, 7) * 9;
    const uint64_t t = s_[1] << 17;
    s_[2] ^= s_[0];
    s_[3] ^= s_[1];
    s_[1] ^= s_[2];
    s_[0] ^= s_[3];
    s_[2] ^= t;
    s_[3] = rotl(s_[3], 45);
    return result;
  }
  // Uniform in [0, 1).
  double uniform() { return unitDouble(next()); }
  // Uniform integer in [0, n), n > 0 (Lemire's multiply-shift, tiny bias for huge n).
  uint64_t below(uint64_t n) { return uint64_t((__uint128_t(next()) * n) >> 64); }
  // Standard normal (Box-Muller, one value per call).
  double normal();

 private:
  static constexpr uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }
  uint64_t s_[4];
};

}  // namespace troupe
