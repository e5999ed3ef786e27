// What both runners' greedy decoding shares (custom_ops_executor_runner and custom_ops_aoti_runner): taking a step's
// token from its logits, and the summary printed after decoding, in one format that one parser reads (flow/model.py)
// and the ExecuTorch vs AOTInductor benchmark compares (benchmark/aoti.py): tokens, prefill and decode times, the
// process's peak resident memory and how much of it is on huge pages.
#pragma once

#include <algorithm>
#include <cinttypes>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <optional>
#include <vector>

namespace custom_ops_runner {

// VmHWM of /proc/self/status in KiB; nothing where /proc is absent (not Linux). Read from inside: a parent's wait4()
// also counts what the forked child held before exec, which from a Python parent with torch loaded is hundreds of MiB.
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

// The process's memory mapped with 2 MiB pages, in KiB (anonymous, file and shared memory: smaps_rollup's
// AnonHugePages, FilePmdMapped and ShmemPmdMapped); nothing where /proc is absent. A decode step streams the weights:
// on small pages it reads them well below the machine's bandwidth (file_segment_loader.h).
inline std::optional<uint64_t> huge_page_kib() {
  std::FILE* rollup = std::fopen("/proc/self/smaps_rollup", "r");
  if (rollup == nullptr) {
    return std::nullopt;
  }
  uint64_t kib = 0;
  char line[256];
  unsigned long long value = 0;
  while (std::fgets(line, sizeof(line), rollup) != nullptr) {
    for (const char* field : {"AnonHugePages:", "FilePmdMapped:", "ShmemPmdMapped:"}) {
      const size_t length = std::strlen(field);
      if (std::strncmp(line, field, length) == 0 && std::sscanf(line + length, "%llu", &value) == 1) {
        kib += value;
      }
    }
  }
  std::fclose(rollup);
  return kib;
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
