// The bandwidth ceiling for benchmark/bench_elementwise.py: times a memcpy of N bytes split across all threads of
// ExecuTorch's threadpool (the pool the kernels use), so kernel throughput can be stated as a fraction of it; `read`
// only reads the bytes (a sum of them), the ceiling of a kernel that streams weights and writes little (a decode step),
// from memory on 2 MiB pages where the system gives them, as the runner and the Python runtime hold a large program's
// weights (runner/file_segment_loader.h): on 4 KiB pages one core read 241 MiB at 16 GB/s, on 2 MiB pages at 30.
//   memcpy_bandwidth BYTES REPETITIONS [read [THREADS]]
//     ->   "memcpy|read <bytes> bytes, <threads> threads: median <us> us"   (THREADS: the read on that many of the
//     pool's threads, 1 on the calling thread; the pool's size by default)
#include <executorch/runtime/kernel/thread_parallel_interface.h>
#include <executorch/runtime/platform/runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#if defined(__linux__)
#include <sys/mman.h>
#endif

namespace {

// Eight independent sums so the loads are not serialized on one add; the compiler vectorizes the loop.
uint64_t sum_words(const uint64_t* words, int64_t count) {
  uint64_t sums[8] = {};
  int64_t i = 0;
  for (; i + 8 <= count; i += 8) {
    for (int j = 0; j < 8; ++j) {
      sums[j] += words[i + j];
    }
  }
  for (; i < count; ++i) {
    sums[0] += words[i];
  }
  uint64_t total = 0;
  for (uint64_t s : sums) {
    total += s;
  }
  return total;
}

}  // namespace

int main(int argc, char** argv) {
  const bool read_only = (argc == 4 || argc == 5) && std::string(argv[3]) == "read";
  if (argc != 3 && !read_only) {
    std::fprintf(stderr, "usage: memcpy_bandwidth BYTES REPETITIONS [read [THREADS]]\n");
    return 2;
  }
  executorch::runtime::runtime_init();
  const int64_t bytes = std::atoll(argv[1]);
  const int repetitions = std::atoi(argv[2]);
  if (bytes <= 0 || repetitions <= 0) {
    std::fprintf(stderr, "error: BYTES and REPETITIONS must be positive\n");
    return 2;
  }
  const size_t alignment = read_only ? size_t(2) << 20 : 64;
  const size_t padded = (static_cast<size_t>(bytes) + alignment - 1) / alignment * alignment;
  auto* src = static_cast<char*>(std::aligned_alloc(alignment, padded));
#if defined(MADV_HUGEPAGE)
  if (read_only) {
    madvise(src, padded, MADV_HUGEPAGE);  // before the memset below touches it
  }
#endif
  auto* dst = static_cast<char*>(std::aligned_alloc(64, padded));
  std::memset(src, 1, static_cast<size_t>(bytes));
  std::memset(src + bytes, 0, padded - static_cast<size_t>(bytes));
  std::memset(dst, 0, padded);

  const int64_t threads = argc == 5 ? std::atoll(argv[4]) : executorch::extension::get_thread_count();
  if (threads <= 0) {
    std::fprintf(stderr, "error: THREADS must be positive\n");
    return 2;
  }
  // One contiguous slice per thread; reading, whole 64-byte lines (the padding is zeros past BYTES).
  const int64_t units = read_only ? static_cast<int64_t>(padded / 64) : bytes;
  const int64_t grain = (units + threads - 1) / threads;
  std::vector<uint64_t> sums(static_cast<size_t>(threads) * 8);  // a cache line per thread: no false sharing
  std::vector<double> times;
  for (int r = 0; r < repetitions; ++r) {
    const auto start = std::chrono::steady_clock::now();
    executorch::extension::parallel_for(0, units, grain, [&](int64_t begin, int64_t end) {
      if (read_only) {
        sums[static_cast<size_t>(begin / grain) * 8] +=
            sum_words(reinterpret_cast<const uint64_t*>(src) + begin * 8, (end - begin) * 8);
      } else {
        std::memcpy(dst + begin, src + begin, static_cast<size_t>(end - begin));
      }
    });
    times.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start).count());
  }
  std::sort(times.begin(), times.end());
  std::printf("%s %lld bytes, %lld threads: median %.3f us\n", read_only ? "read" : "memcpy",
              static_cast<long long>(bytes), static_cast<long long>(threads), times[times.size() / 2]);
  uint64_t total = 0;
  for (size_t t = 0; t < sums.size(); t += 8) {
    total += sums[t];
  }
  const uint64_t once = sum_words(reinterpret_cast<const uint64_t*>(src), static_cast<int64_t>(padded / 8));
  const bool copied = read_only ? total == once * static_cast<uint64_t>(repetitions)
                                : std::memcmp(src, dst, static_cast<size_t>(bytes)) == 0;
  std::free(src);
  std::free(dst);
  return copied ? 0 : 1;
}
