// What bounds a prefill's linear layers on this CPU (`bash test_custom_ops.sh bench ceiling`): the ISA's multiply-add
// peak, measured with independent accumulators (float FMA; 8-bit: AVX2's vpsignb-vpmaddubsw-vpmaddwd-vpaddd chain, the
// block formats' inner step, or AVX-512's vpdpbusd), beside linear_blocks' own prefill (activations prepared, then the
// units) at the same ISA, on one thread and on every thread of ExecuTorch's pool. A kernel near its peak gains little
// from tuning; a goal past the peak needs another ISA. CUSTOM_OPS_ISA caps both, as it caps the kernels.
//   prefill_ceiling [TOKENS] [ROUNDS] [FORMAT,...]   ->   one line per measurement, GMAC/s per thread (medians and
//   min-max); the formats by default F32, Q8_0 and Q4_1
#include <executorch/runtime/kernel/thread_parallel_interface.h>
#include <executorch/runtime/platform/runtime.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "ops/blocks/block_ops.h"

namespace {

using Clock = std::chrono::steady_clock;
namespace blocks = custom::native::blocks;
namespace simd = custom::native::simd;

constexpr int64_t kPeakSteps = 1 << 22;  // iterations of a peak loop: ~0.1 s a thread

#if defined(CUSTOM_OPS_X86_DISPATCH)
// 12 independent FMA chains of 8 lanes: more than the FMA units' latency times their count on any x86 core.
CUSTOM_OPS_AVX2 double fma_macs_avx2(int64_t steps, float* sink) {
  __m256 acc[12];
  for (int i = 0; i < 12; ++i) {
    acc[i] = _mm256_set1_ps(1e-3f * static_cast<float>(i));
  }
  const __m256 a = _mm256_set1_ps(0.999f), b = _mm256_set1_ps(1e-6f);
  for (int64_t s = 0; s < steps; ++s) {
    CUSTOM_OPS_UNROLL
    for (int i = 0; i < 12; ++i) {
      acc[i] = _mm256_fmadd_ps(acc[i], a, b);
    }
  }
  for (int i = 1; i < 12; ++i) {
    acc[0] = _mm256_add_ps(acc[0], acc[i]);
  }
  *sink = _mm256_cvtss_f32(acc[0]);
  return static_cast<double>(steps) * 12 * 8;
}

CUSTOM_OPS_AVX512 double fma_macs_avx512(int64_t steps, float* sink) {
  __m512 acc[16];
  for (int i = 0; i < 16; ++i) {
    acc[i] = _mm512_set1_ps(1e-3f * static_cast<float>(i));
  }
  const __m512 a = _mm512_set1_ps(0.999f), b = _mm512_set1_ps(1e-6f);
  for (int64_t s = 0; s < steps; ++s) {
    CUSTOM_OPS_UNROLL
    for (int i = 0; i < 16; ++i) {
      acc[i] = _mm512_fmadd_ps(acc[i], a, b);
    }
  }
  for (int i = 1; i < 16; ++i) {
    acc[0] = _mm512_add_ps(acc[0], acc[i]);
  }
  *sink = _mm512_reduce_add_ps(acc[0]);
  return static_cast<double>(steps) * 16 * 16;
}

// AVX2 has no 8-bit multiply-accumulate: each quad of a row against four activations is a sign, a vpmaddubsw, a
// vpmaddwd and an add (block_tiles_avx2.h's step), 32 multiply-adds per chain step.
CUSTOM_OPS_AVX2 double int8_macs_avx2(int64_t steps, float* sink) {
  __m256i acc[8];
  for (int i = 0; i < 8; ++i) {
    acc[i] = _mm256_set1_epi32(i);
  }
  const __m256i w = _mm256_set1_epi8(3), x = _mm256_set1_epi8(-5), ones = _mm256_set1_epi16(1);
  for (int64_t s = 0; s < steps; ++s) {
    CUSTOM_OPS_UNROLL
    for (int i = 0; i < 8; ++i) {
      const __m256i pairs = _mm256_maddubs_epi16(w, _mm256_sign_epi8(x, acc[i]));
      acc[i] = _mm256_add_epi32(acc[i], _mm256_madd_epi16(pairs, ones));
    }
  }
  for (int i = 1; i < 8; ++i) {
    acc[0] = _mm256_add_epi32(acc[0], acc[i]);
  }
  *sink = static_cast<float>(_mm256_extract_epi32(acc[0], 0));
  return static_cast<double>(steps) * 8 * 32;
}

CUSTOM_OPS_AVX512_VNNI double int8_macs_avx512(int64_t steps, float* sink) {
  __m512i acc[16];
  for (int i = 0; i < 16; ++i) {
    acc[i] = _mm512_set1_epi32(i);
  }
  const __m512i w = _mm512_set1_epi8(3), x = _mm512_set1_epi8(-5);
  for (int64_t s = 0; s < steps; ++s) {
    CUSTOM_OPS_UNROLL
    for (int i = 0; i < 16; ++i) {
      acc[i] = _mm512_dpbusd_epi32(acc[i], w, x);
    }
  }
  for (int i = 1; i < 16; ++i) {
    acc[0] = _mm512_add_epi32(acc[0], acc[i]);
  }
  *sink = static_cast<float>(_mm512_reduce_add_epi32(acc[0]));
  return static_cast<double>(steps) * 16 * 64;
}
#endif

using PeakLoop = double (*)(int64_t, float*);  // runs `steps` steps, returns the multiply-adds done

constexpr const char* kPathNames[] = {"baseline", "avx2", "avx512", "dotprod", "i8mm"};  // by blocks::Isa

// The peak loop of the instructions format f's kernels run on this CPU (the cap applied): FMA for the row formats,
// the 8-bit step for the block formats; null where none is written here (the portable loop, ARM64).
PeakLoop peak_loop(const blocks::FormatKernels& f) {
#if defined(CUSTOM_OPS_X86_DISPATCH)
  const blocks::Isa path = blocks::isa_of(f);
  if (path == blocks::Isa::kAvx512) {
    return f.quantizes_activations ? int8_macs_avx512 : fma_macs_avx512;
  }
  if (path == blocks::Isa::kAvx2) {
    return f.quantizes_activations ? int8_macs_avx2 : fma_macs_avx2;
  }
#endif
  (void)f;
  return nullptr;
}

struct Spread {
  double median, low, high;
};

Spread spread(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  return {values[values.size() / 2], values.front(), values.back()};
}

// GMAC/s a thread of `loop` on `threads` threads at once, each with its own accumulators, per round.
Spread peak(PeakLoop loop, int64_t threads, int rounds) {
  std::vector<double> rates;
  std::vector<float> sinks(static_cast<size_t>(threads) * 16);  // a cache line a thread
  for (int r = 0; r < rounds; ++r) {
    std::vector<double> seconds(static_cast<size_t>(threads)), macs(static_cast<size_t>(threads));
    std::atomic<int64_t> arrived{0};
    auto one = [&](int64_t t) {
      // Start together: a pool thread that wakes late must not leave the others measuring a lone thread's rate (a
      // second at most, so a pool smaller than asked cannot hang the loop).
      arrived.fetch_add(1);
      const auto since = Clock::now();
      while (arrived.load() < threads && Clock::now() - since < std::chrono::seconds(1)) {
      }
      const auto start = Clock::now();
      macs[static_cast<size_t>(t)] = loop(kPeakSteps, &sinks[static_cast<size_t>(t) * 16]);
      seconds[static_cast<size_t>(t)] = std::chrono::duration<double>(Clock::now() - start).count();
    };
    if (threads == 1) {
      one(0);
    } else {
      executorch::extension::parallel_for(0, threads, 1, [&](int64_t begin, int64_t end) {
        for (int64_t t = begin; t < end; ++t) {
          one(t);
        }
      });
    }
    rates.push_back(macs[0] / *std::max_element(seconds.begin(), seconds.end()) / 1e9);
  }
  return spread(rates);
}

// A linear layer of `format` as the op runs it (blocks::linear: activations prepared, units on the pool), or on the
// calling thread alone: GMAC/s a thread, per round.
struct Shape {
  int64_t k, n;
};

Spread linear_rate(const blocks::FormatKernels& f, int64_t tokens, const std::vector<Shape>& shapes, bool one_thread,
                   int rounds) {
  std::mt19937 random(1);
  std::normal_distribution<float> normal;
  struct Layer {
    std::vector<uint8_t> weight;
    std::vector<float> x, out;
    Shape shape;
  };
  std::vector<Layer> layers;
  for (const Shape& s : shapes) {
    Layer layer{{}, std::vector<float>(static_cast<size_t>(tokens * s.k)),
                std::vector<float>(static_cast<size_t>(tokens * s.n)), s};
    const int64_t bytes = s.n * (s.k / f.weights_per_block) * f.block_bytes;
    layer.weight.resize(static_cast<size_t>(bytes));
    if (f.storage == blocks::Storage::kFloat32) {
      auto* w = reinterpret_cast<float*>(layer.weight.data());
      for (int64_t i = 0; i < bytes / 4; ++i) {
        w[i] = normal(random);
      }
    } else {
      for (uint8_t& b : layer.weight) {
        b = static_cast<uint8_t>(random() & 0x3B);  // any codes; fp16 fields finite
      }
    }
    for (float& v : layer.x) {
      v = normal(random);
    }
    layers.push_back(std::move(layer));
  }
  const int64_t threads = one_thread ? 1 : executorch::extension::get_thread_count();
  std::vector<double> rates;
  for (int r = -1; r < rounds; ++r) {  // round -1 warms up: first touches, the pool's start
    double macs = 0;
    const auto start = Clock::now();
    for (Layer& l : layers) {
      if (one_thread) {
        thread_local blocks::Activations activations;
        const blocks::LinearTasks tasks = blocks::plan_linear(f, l.x.data(), tokens, l.shape.k, l.weight.data(),
                                                              l.shape.n, l.out.data(), activations, 1);
        tasks.prepare(0, tasks.prepare_blocks());
        tasks.run(0, tasks.count);
      } else if (!blocks::linear(f, l.x.data(), tokens, l.shape.k, l.weight.data(), l.shape.n, l.out.data())) {
        std::fprintf(stderr, "error: the threadpool did not run every task\n");
        std::exit(1);
      }
      macs += static_cast<double>(tokens) * static_cast<double>(l.shape.k) * static_cast<double>(l.shape.n);
    }
    const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
    if (r >= 0) {
      rates.push_back(macs / seconds / 1e9 / static_cast<double>(threads));
    }
  }
  return spread(rates);
}

void print(const char* what, int64_t threads, const Spread& s, double peak) {
  std::printf("%-40s %2lld threads: %6.1f GMAC/s a thread (%.1f-%.1f)", what, static_cast<long long>(threads),
              s.median, s.low, s.high);
  if (peak > 0) {
    std::printf(", %3.0f%% of the peak", 100 * s.median / peak);
  }
  std::printf("\n");
}

}  // namespace

int main(int argc, char** argv) {
  executorch::runtime::runtime_init();
  const int64_t tokens = argc > 1 ? std::atoll(argv[1]) : 128;
  const int rounds = argc > 2 ? std::atoi(argv[2]) : 5;
  std::vector<std::string> names;
  for (std::string list = argc > 3 ? argv[3] : "F32,Q8_0,Q4_1", name; !list.empty();) {
    const size_t comma = list.find(',');
    name = list.substr(0, comma);
    list = comma == std::string::npos ? "" : list.substr(comma + 1);
    if (blocks::find_format(name) == nullptr) {
      std::fprintf(stderr, "prefill_ceiling: no format named '%s' (ops/blocks/formats.h lists them)\n", name.c_str());
      return 2;
    }
    names.push_back(name);
  }
  if (tokens <= 0 || rounds <= 0 || names.empty()) {
    std::fprintf(stderr, "usage: prefill_ceiling [TOKENS > 0] [ROUNDS > 0] [FORMAT,...]\n");
    return 2;
  }
  const int64_t all = executorch::extension::get_thread_count();
  // SmolLM2-135M's projections; a format whose blocks do not divide 576 (the K-quants' 256) takes Llama 3.2 1B's.
  const std::vector<Shape> small{{576, 1536}, {1536, 576}, {576, 576}}, large{{2048, 8192}, {8192, 2048}, {2048, 2048}};
  const auto shapes_of = [&](const blocks::FormatKernels& f) { return 576 % f.weights_per_block == 0 ? small : large; };
  std::printf("%lld tokens against SmolLM2-135M's projections (576 -> 1536 -> 576, 576 -> 576), or Llama 3.2 1B's "
              "(2048 -> 8192 -> 2048, 2048 -> 2048) for the K-quants\n",
              static_cast<long long>(tokens));
  for (const int64_t threads : {int64_t{1}, all}) {
    for (const std::string& name : names) {
      const blocks::FormatKernels& f = *blocks::find_format(name);
      const std::string path = kPathNames[static_cast<int>(blocks::isa_of(f))];
      const PeakLoop loop = peak_loop(f);
      double ceiling = 0;
      // Narrower codes than 8 bits are unsigned (no sign step, several quads summed in 16 bits): a step of their own,
      // no ceiling here.
      if (loop != nullptr && (!f.quantizes_activations || name == "Q8_0")) {
        const Spread p = peak(loop, threads, rounds);
        ceiling = p.median;
        print(("peak " + path + (f.quantizes_activations ? " 8-bit multiply-add" : " float FMA")).c_str(), threads,
              p, 0);
      }
      print(("linear_blocks " + name + " (" + path + ")").c_str(), threads,
            linear_rate(f, tokens, shapes_of(f), threads == 1, rounds), ceiling);
    }
    if (all == 1) {
      break;
    }
  }
  return 0;
}
