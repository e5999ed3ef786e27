// Test tool for tests/test_xnnpack_payload.py: the runner's XNNPACK payload checker (runner/xnnpack_payload.cpp)
// on one payload file. `describe FILE` prints every field it read, one "name=value" line each; `check FILE` prints
// its verdict ("ok" or the problem). Built from the runner's own source, so the test compares what the runner reads.
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <vector>

#include "xnnpack_payload.h"

int main(int argc, char** argv) {
  if (argc != 3 || (std::strcmp(argv[1], "describe") != 0 && std::strcmp(argv[1], "check") != 0)) {
    std::fprintf(stderr, "usage: %s describe|check PAYLOAD\n", argv[0]);
    return 2;
  }
  std::ifstream file(argv[2], std::ios::binary);
  const std::vector<uint8_t> bytes((std::istreambuf_iterator<char>(file)), std::istreambuf_iterator<char>());
  if (std::strcmp(argv[1], "describe") == 0) {
    for (const auto& line : custom_ops_runner::describe_xnnpack_payload(bytes.data(), bytes.size())) {
      std::printf("%s\n", line.c_str());
    }
  } else {
    auto problem = custom_ops_runner::check_xnnpack_payload(bytes.data(), bytes.size(), {});
    std::printf("%s\n", problem ? problem->c_str() : "ok");
  }
  return 0;
}
