// What both runners' greedy decoding shares (custom_ops_executor_runner and custom_ops_aoti_runner): taking a step's
// token from its logits, and the summary printed after decoding, in one format that one parser reads
// (models/decoding.py) and the ExecuTorch vs AOTInductor benchmark compares (benchmark/bench_aoti.py): tokens, prefill
// and decode times, the process's peak resident memory and how much of it is on huge pages.
#pragma once

#include <algorithm>
#include <cinttypes>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <initializer_list>
#include <optional>
#include <vector>

namespace custom_ops_runner {

// The sum of the KiB values of `fields` (e.g. "VmHWM:") in a /proc file of this process; nothing where it is absent
// (not Linux) or names none of them.
inline std::optional<uint64_t> proc_kib(const char* path, std::initializer_list<const char*> fields) {
  std::FILE* file = std::fopen(path, "r");
  if (file == nullptr) {
    return std::nullopt;
  }
  std::optional<uint64_t> kib;
  char line[256];
  unsigned long long value = 0;
  while (std::fgets(line, sizeof(line), file) != nullptr) {
    for (const char* field : fields) {
      const size_t length = std::strlen(field);
      if (std::strncmp(line, field, length) == 0 && std::sscanf(line + length, "%llu", &value) == 1) {
        kib = kib.value_or(0) + value;
      }
    }
  }
  std::fclose(file);
  return kib;
}

// The peak resident memory (VmHWM), read from inside: a parent's wait4() also counts what the forked child held
// before exec, which from a Python parent with torch loaded is hundreds of MiB.
inline std::optional<uint64_t> peak_resident_kib() {
  return proc_kib("/proc/self/status", {"VmHWM:"});
}

// The memory mapped with 2 MiB pages (anonymous, file and shared memory). A decode step streams the weights: on small
// pages it reads them well below the machine's bandwidth (file_segment_loader.h).
inline std::optional<uint64_t> huge_page_kib() {
  return proc_kib("/proc/self/smaps_rollup", {"AnonHugePages:", "FilePmdMapped:", "ShmemPmdMapped:"});
}

// Appends a step's greedy token (the first of equal maxima, as torch.argmax) and, when `logits` is given, its logits
// (kept only for --logits_path: a 262k-token vocabulary is a MiB a step); false, appending nothing, when a logit is
// NaN (no token is the answer then).
inline bool take_greedy_token(const float* values, int64_t vocab, std::vector<float>* logits,
                              std::vector<int64_t>& generated) {
  if (std::any_of(values, values + vocab, [](float v) { return std::isnan(v); })) {
    return false;
  }
  if (logits != nullptr) {
    logits->insert(logits->end(), values, values + vocab);
  }
  generated.push_back(std::max_element(values, values + vocab) - values);
  return true;
}

// generated: the last generation's tokens; the times are totals over `generations` generations.
inline void print_decode_summary(const std::vector<int64_t>& generated, size_t prompt_length, uint64_t new_tokens,
                                 double prefill_total_us, double decode_total_us, uint64_t generations) {
  const double runs = static_cast<double>(generations);
  const double decode_steps = static_cast<double>(new_tokens - 1);
  std::printf("Tokens:");
  for (int64_t token : generated) {
    std::printf(" %" PRId64, token);
  }
  std::printf("\nPrefill: %zu tokens in %.3f us; decode: %.0f tokens in %.3f us (%.1f tokens/s), averaged over %"
              PRIu64 " generation(s)\n", prompt_length, prefill_total_us / runs, decode_steps, decode_total_us / runs,
              decode_steps > 0 ? decode_steps * 1e6 * runs / decode_total_us : 0.0, generations);
  if (auto kib = peak_resident_kib()) {
    std::printf("Peak resident memory: %llu KiB\n", static_cast<unsigned long long>(*kib));
  }
  if (auto kib = huge_page_kib()) {
    std::printf("On huge pages: %llu KiB\n", static_cast<unsigned long long>(*kib));
  }
}

} // namespace custom_ops_runner
