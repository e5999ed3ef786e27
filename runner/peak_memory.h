// The process's peak resident memory, for the runners' decoding summary (benchmark/aoti.py compares the two runtimes
// with it). Read from inside: a parent's wait4() also counts what the forked child held before exec, which from a
// Python parent with torch loaded is hundreds of MiB.
#pragma once

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <optional>

namespace custom_ops_runner {

// VmHWM of /proc/self/status in KiB; nothing where /proc is absent (not Linux).
inline std::optional<uint64_t> peak_resident_kib() {
  std::FILE* status = std::fopen("/proc/self/status", "r");
  if (status == nullptr) {
    return std::nullopt;
  }
  std::optional<uint64_t> kib;
  char line[256];
  unsigned long long value = 0;
  while (std::fgets(line, sizeof(line), status) != nullptr) {
    if (std::strncmp(line, "VmHWM:", 6) == 0 && std::sscanf(line + 6, "%llu", &value) == 1) {
      kib = value;
      break;
    }
  }
  std::fclose(status);
  return kib;
}

// The line both runners print after decoding: "Peak resident memory: N KiB".
inline void print_peak_memory() {
  if (auto kib = peak_resident_kib()) {
    std::printf("Peak resident memory: %llu KiB\n", static_cast<unsigned long long>(*kib));
  }
}

} // namespace custom_ops_runner
