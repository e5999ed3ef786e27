// Several steps that must run in order (my_ops::decoder_layer: a norm, a projection, attention, ...) in one parallel
// region of the pool: one wake and one join for all of them, where an op per step would hand each to the pool. Every
// thread the region runs on takes units of the current step, one at a time, until none is left, then waits for the
// units other threads took, then goes on to the next step: threads meet between steps as llama.cpp's meet at
// barriers between a graph's nodes. A thread waits only for units a running thread has taken, never for a thread to
// arrive, so the region ends on however many threads the pool gives it, one included.
#pragma once

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <thread>

#include "kernel_contract.h"

namespace custom {
namespace native {
namespace steps {

// Pauses a waiting thread spins before it yields its core: long enough for a step of a decode (microseconds), short
// enough that a thread the OS took away from the region does not leave the others spinning for a time slice.
constexpr int kSpinsBeforeYield = 1 << 12;

inline void pause() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

// step(s, unit) for every step s in order and every unit in [0, units[s]), each once; on the pool when `parallel` (one
// hand-off), else on the calling thread. False when the pool did not run the region. A unit that throws (a failed
// allocation) still counts as done, so no thread waits for it forever; the first exception is rethrown here.
template <size_t kSteps, typename Fn>
bool run(const std::array<int64_t, kSteps>& units, const Fn& step, bool parallel) {
  struct alignas(64) Counter {  // a line each: threads claiming units of one step do not slow another's count
    std::atomic<int64_t> value{0};
  };
  Counter next[kSteps], done[kSteps];
#if defined(__cpp_exceptions)
  std::exception_ptr failure;
  std::atomic_flag failed = ATOMIC_FLAG_INIT;
#endif
  const auto region = [&](int64_t, int64_t) {
    for (size_t s = 0; s < kSteps; ++s) {
      for (int64_t unit; (unit = next[s].value.fetch_add(1, std::memory_order_relaxed)) < units[s];) {
#if defined(__cpp_exceptions)
        try {
          step(s, unit);
        } catch (...) {
          if (!failed.test_and_set()) {
            failure = std::current_exception();
          }
        }
#else
        step(s, unit);
#endif
        done[s].value.fetch_add(1, std::memory_order_release);  // the unit's writes, before it counts as done
      }
      for (int spins = 0; done[s].value.load(std::memory_order_acquire) < units[s]; ++spins) {
        if (spins < kSpinsBeforeYield) {
          pause();
        } else {
          std::this_thread::yield();
        }
      }
    }
  };
  const int64_t threads = contract::thread_count();
  bool ran = true;
  if (!parallel || threads <= 1) {
    region(0, 1);
  } else {
    ran = contract::parallel_for(0, threads, 1, region, contract::PoolUser::kLayer);
  }
#if defined(__cpp_exceptions)
  if (failure) {
    std::rethrow_exception(failure);
  }
#endif
  return ran;
}

} // namespace steps
} // namespace native
} // namespace custom
