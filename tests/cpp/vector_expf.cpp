// kernel_helpers/vector_expf.h against this process's std::exp, and silu_mul's and gelu_mul's vector code against
// their scalar loops (ops/gated/silu_mul_rows.h, ops/gated/gelu_mul_rows.h). tests/test_kernel_contract.py
// runs it (built with -DCUSTOM_OPS_BUILD_CHECKS=ON):
// `vector_expf STRIDE` compares every STRIDE-th float bit pattern (1: all 2^32, ~25 s on the AMD EPYC; the suite takes
// a stride) with the vector code this CPU runs (AVX-512, or AVX2: CUSTOM_OPS_ISA caps it) and prints "ok avx512" or
// "ok avx2", or "no vector exp" where neither can run, or one line per failed check.
#include <cmath>
#include <initializer_list>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#include "kernel_helpers/vector_expf.h"
#include "ops/gated/gelu_mul_rows.h"
#include "ops/gated/silu_mul_rows.h"

namespace {

using namespace custom::native;

uint32_t bits_of(float x) {
  uint32_t b;
  std::memcpy(&b, &x, sizeof(b));
  return b;
}

float from_bits(uint32_t b) {
  float x;
  std::memcpy(&x, &b, sizeof(x));
  return x;
}

#ifdef CUSTOM_OPS_X86_DISPATCH
// The 64 inputs whose e^x, before its rounding to float, lies closest to a midpoint between two floats (found by a
// search over all 2^32 with the method's own double arithmetic): where any change to the arithmetic shows first.
// Computing r without its FMA, for one, changes exactly two results of all 2^32, both in this list.
constexpr uint32_t kHardest[64] = {
    0x3e73ade2u, 0xbfde3004u, 0xb3000000u, 0xbbe861b2u, 0x3d8932e8u, 0x400d98c7u, 0x3b37991au, 0xba253b54u,
    0x337fffffu, 0x33800000u, 0x343fffffu, 0x34dffffdu, 0x37ff7f01u, 0x356ffff9u, 0x3b0b4517u, 0x3fbe11a6u,
    0x40143eb5u, 0x4202422fu, 0x35f7fff1u, 0xc0d7626bu, 0x367bffe1u, 0x40c12c37u, 0x4197276cu, 0xba921bd7u,
    0xbeae4609u, 0xc1d2107au, 0x36fdffc1u, 0xbb378639u, 0x387ebe05u, 0xb9fbab76u, 0xbe14c82cu, 0x377eff81u,
    0x38fddc11u, 0xb2ffffffu, 0xc068da36u, 0xb9a56aaeu, 0xbf0fa174u, 0x3b50125au, 0x337ffffeu, 0x3d103181u,
    0x40a63bf9u, 0xbc70a558u, 0x3b8f4138u, 0xb3000001u, 0xb3c00001u, 0xb4200001u, 0xbac75bcbu, 0xbc3f2901u,
    0xb4b00002u, 0xbd3e69a5u, 0x3a29cdebu, 0xb8df930du, 0xb5d4000bu, 0xc27c65d9u, 0xb616000bu, 0xbb57a63bu,
    0xbeb7bdadu, 0xc2633f4cu, 0x3998e24bu, 0x3df0cb95u, 0xc23dd581u, 0xb6b50020u, 0xbab8080fu, 0xb2fffffeu,
};

// The hardest inputs, then every stride-th pattern, 16 at a time through `exp_block`; the differences, the first few
// printed.
uint64_t exp_differences(uint32_t stride, void (*exp_block)(const float* in, float* out)) {
  float in[16], out[16];
  uint64_t differ = 0;
  const uint64_t hardest = 64, patterns = (uint64_t{1} << 32) / stride;
  for (uint64_t base = 0; base < hardest + patterns; base += 16) {
    for (uint64_t l = 0; l < 16; ++l) {
      const uint64_t i = base + l;
      in[l] = from_bits(i < hardest ? kHardest[i] : static_cast<uint32_t>((i - hardest) * stride));
    }
    exp_block(in, out);
    for (int l = 0; l < 16; ++l) {
      const float expected = std::exp(in[l]);
      if (bits_of(expected) != bits_of(out[l]) && differ++ < 5) {
        std::printf("exp(%a): std::exp %a, vector %a\n", in[l], expected, out[l]);
      }
    }
  }
  return differ;
}
#endif

// A gated activation's float32 range (vector code and tail) against `expected`, its scalar formula, element by element:
// normal gates with every fifth 30 times wider, every seventh moved by `shift`, `edges` spread through a length with a
// tail.
template <typename Range, typename Formula>
int range_differences(const char* op, const Range& range, const Formula& expected_of, uint32_t seed, float shift,
                      std::initializer_list<float> edges, elementwise::Path vector_path) {
  std::mt19937 random(seed);
  std::normal_distribution<float> normal(0.0f, 4.0f);
  const int64_t n = 16 * 64 + 7;
  std::vector<float> gate(n), up(n), out(n);
  for (int64_t i = 0; i < n; ++i) {
    gate[i] = normal(random) * (i % 5 == 0 ? 30.0f : 1.0f) + (i % 7 == 0 ? shift : 0.0f);
    up[i] = normal(random);
  }
  int64_t at = 1;
  for (const float edge : edges) {
    gate[at] = edge;
    at += 3;
  }
  const elementwise::Path path = range(gate.data(), up.data(), out.data(), int64_t{0}, n);
  int differ = 0;
  for (int64_t i = 0; i < n; ++i) {
    const float expected = expected_of(gate[i], up[i]);
    if (bits_of(expected) != bits_of(out[i]) && !(std::isnan(expected) && std::isnan(out[i])) && differ++ < 5) {
      std::printf("%s(%a, %a): scalar %a, vector %a\n", op, gate[i], up[i], expected, out[i]);
    }
  }
  if (path != vector_path) {
    std::printf("%s's float32 range did not take the vector code\n", op);
    ++differ;
  }
  return differ;
}

// silu_mul: around the sigmoid's range and its edges (|g| past 88, infinities, NaN).
int silu_differences(elementwise::Path vector_path) {
  return range_differences(
      "silu_mul", swiglu::silu_mul_range<float>,
      [](float g, float up) { return g * (1.0f / (1.0f + std::exp(-g))) * up; }, 7, 0.0f,
      {INFINITY, -INFINITY, NAN, 88.5f, -88.5f, 104.0f, -104.0f, 0.0f, -0.0f, 1e-40f}, vector_path);
}

// gelu_mul (its scalar loop's formula, gelu_mul_rows.h): the same edges, cubes past float's range, and gates near -3
// and -10 (every seventh moved by -6), where tanh(z) nears -1.
int gelu_differences(elementwise::Path vector_path) {
  return range_differences(
      "gelu_mul", geglu::gelu_mul_range<float>,
      [](float g, float up) {
        return g / (1.0f + std::exp(-1.5957691216057308f * (g + 0.044715f * (g * g * g)))) * up;
      },
      11, -6.0f, {INFINITY, -INFINITY, NAN, 88.5f, -88.5f, 1e13f, -1e13f, 0.0f, -0.0f, 1e-40f, -3.0f, -10.0f},
      vector_path);
}

} // namespace

int main(int argc, char** argv) {
#ifdef CUSTOM_OPS_X86_DISPATCH
  const bool avx512 = simd::detected_isa() == simd::Isa::kAvx512;
  if (simd::detected_isa() == simd::Isa::kBaseline) {
    std::printf("no vector exp\n");
    return 0;
  }
  if (vector_expf::isa() == simd::Isa::kBaseline) {
    std::printf("the vector exp disagrees with this libm's std::exp: silu_mul keeps std::exp\n");
    return 1;
  }
  const uint32_t stride = argc > 1 ? static_cast<uint32_t>(std::strtoul(argv[1], nullptr, 10)) : 1;
  const uint64_t exp_differ = exp_differences(stride == 0 ? 1 : stride,
                                              avx512 ? vector_expf::exp_block_avx512 : vector_expf::exp_block_avx2);
  const elementwise::Path path = avx512 ? elementwise::kAvx512Elements : elementwise::kAvx2Elements;
  const int silu_differ = silu_differences(path), gelu_differ = gelu_differences(path);
  if (exp_differ == 0 && silu_differ == 0 && gelu_differ == 0) {
    std::printf("ok %s\n", avx512 ? "avx512" : "avx2");
    return 0;
  }
  std::printf("%llu exp differences, %d silu_mul differences, %d gelu_mul differences\n",
              static_cast<unsigned long long>(exp_differ), silu_differ, gelu_differ);
  return 1;
#else
  std::printf("no vector exp\n");
  return 0;
#endif
}
