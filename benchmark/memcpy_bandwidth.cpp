// The bandwidth ceiling for benchmark/benchmark.py: times a memcpy of N bytes split across all threads of
// ExecuTorch's threadpool (the pool the kernels use), so kernel throughput can be stated as a fraction of it.
//   memcpy_bandwidth BYTES REPETITIONS   ->   prints "memcpy <bytes> bytes, <threads> threads: median <us> us"
#include <executorch/runtime/kernel/thread_parallel_interface.h>
#include <executorch/runtime/platform/runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: memcpy_bandwidth BYTES REPETITIONS\n");
    return 2;
  }
  executorch::runtime::runtime_init();
  const int64_t bytes = std::atoll(argv[1]);
  const int repetitions = std::atoi(argv[2]);
  if (bytes <= 0 || repetitions <= 0) {
    std::fprintf(stderr, "error: BYTES and REPETITIONS must be positive\n");
    return 2;
  }
  const size_t padded = (static_cast<size_t>(bytes) + 63) / 64 * 64;
  auto* src = static_cast<char*>(std::aligned_alloc(64, padded));
  auto* dst = static_cast<char*>(std::aligned_alloc(64, padded));
  std::memset(src, 1, padded);
  std::memset(dst, 0, padded);

  const int64_t threads = executorch::extension::get_thread_count();
  const int64_t grain = (bytes + threads - 1) / threads;  // one contiguous slice per thread
  std::vector<double> times;
  for (int r = 0; r < repetitions; ++r) {
    const auto start = std::chrono::steady_clock::now();
    executorch::extension::parallel_for(0, bytes, grain, [&](int64_t begin, int64_t end) {
      std::memcpy(dst + begin, src + begin, static_cast<size_t>(end - begin));
    });
    times.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start).count());
  }
  std::sort(times.begin(), times.end());
  std::printf("memcpy %lld bytes, %lld threads: median %.3f us\n", static_cast<long long>(bytes),
              static_cast<long long>(threads), times[times.size() / 2]);
  const bool copied = std::memcmp(src, dst, static_cast<size_t>(bytes)) == 0;
  std::free(src);
  std::free(dst);
  return copied ? 0 : 1;
}
