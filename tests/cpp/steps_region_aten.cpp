// kernel_helpers/steps_region.h on ATen's thread pool (the helper my_ops::decoder_layer runs its steps in): every unit
// of every step runs once, after every unit of the steps before it, at 1 to 4 threads and with more units than threads
// and fewer; a step of no units is passed; a unit that throws reaches the caller instead of leaving the other threads
// waiting for it. tests/test_kernel_contract.py runs it (built with -DCUSTOM_OPS_BUILD_CHECKS=ON); exit 0 and "ok" when
// every check holds, else one line per failed check.
#include <ATen/Parallel.h>

#include <array>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "kernel_helpers/steps_region.h"

namespace {

int failures = 0;

void expect(bool ok, const std::string& what) {
  if (!ok) {
    std::printf("FAILED: %s\n", what.c_str());
    ++failures;
  }
}

// Four steps: the first writes its units' slots (its unit 0 slowly), the second reads every slot of the first (all of
// them must be written by then) into its own, the third has no units, the fourth sums the second's.
void check_order(int threads, int64_t units) {
  at::set_num_threads(threads);
  std::vector<std::atomic<int>> runs(static_cast<size_t>(3 * units));
  std::vector<int64_t> first(static_cast<size_t>(units), 0), second(static_cast<size_t>(units), 0);
  std::atomic<int64_t> third{0};
  const std::array<int64_t, 4> counts{units, units, 0, units};
  const bool ran = custom::native::steps::run(counts, [&](size_t step, int64_t unit) {
    if (step == 0) {
      if (unit == 0) {  // the slowest unit: a thread that did not wait for it would read its slot unwritten
        std::this_thread::sleep_for(std::chrono::milliseconds(2));
      }
      first[unit] = unit + 1;
    } else if (step == 1) {
      int64_t seen = 0;
      for (int64_t value : first) {
        seen += value;
      }
      second[unit] = seen;
    } else if (step == 3) {
      third.fetch_add(second[unit]);
    }
    runs[static_cast<size_t>(std::min<size_t>(step, 2) * units + unit)].fetch_add(1);
  }, true);
  const std::string where = std::to_string(threads) + " threads, " + std::to_string(units) + " units";
  expect(ran, where + ": the pool ran the region");
  bool once = true;
  for (const auto& count : runs) {
    once = once && count.load() == 1;
  }
  expect(once, where + ": every unit ran once");
  const int64_t total = units * (units + 1) / 2;
  bool ordered = true;
  for (int64_t value : second) {
    ordered = ordered && value == total;
  }
  expect(ordered, where + ": each unit of step 1 saw every unit of step 0");
  expect(third.load() == units * total, where + ": the last step saw every unit of the one before the empty step");
}

void check_a_throwing_unit(int threads) {
  at::set_num_threads(threads);
  std::atomic<int> after{0};
  const std::array<int64_t, 2> counts{8, 8};
  std::string message;
  try {
    custom::native::steps::run(counts, [&](size_t step, int64_t unit) {
      if (step == 0 && unit == 3) {
        throw std::runtime_error("unit 3 failed");
      }
      if (step == 1) {
        after.fetch_add(1);
      }
    }, true);
  } catch (const std::runtime_error& error) {
    message = error.what();
  }
  const std::string where = std::to_string(threads) + " threads";
  expect(message == "unit 3 failed", where + ": the unit's exception reached the caller (got '" + message + "')");
  expect(after.load() == 8, where + ": the other units still ran");
}

} // namespace

int main() {
  for (int threads : {1, 2, 3, 4}) {
    for (int64_t units : {1, 2, 7, 64}) {
      check_order(threads, units);
    }
    check_a_throwing_unit(threads);
  }
  if (failures == 0) {
    std::printf("ok\n");
  }
  return failures == 0 ? 0 : 1;
}
