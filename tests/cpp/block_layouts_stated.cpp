// ops/blocks/formats.h's check that a block format's traits are the layout ops/blocks/block_layouts.py states for it
// (is_stated), checked field by field at compile time: a traits struct equal to Q8_0's is stated by stated::kQ8_0, and
// a statement that differs in any one field is not. Built with -DCUSTOM_OPS_BUILD_CHECKS=ON (the suite's combined
// tree): a comparison dropped from is_stated stops that build here. Running it only says so.
#include <array>
#include <cstdio>

#include "ops/blocks/formats.h"

namespace {
using custom::native::blocks::Plane;
using custom::native::blocks::is_stated;
using custom::native::blocks::stated::kQ8_0;
using custom::native::blocks::stated::Layout;

struct Q8_0Traits {  // Q8_0's facts, as ops/blocks/formats/q8_0.cpp states them
  static constexpr const char* kName = "Q8_0";
  static constexpr int kWeights = 32, kSub = 32, kOffset = 128;
  static constexpr std::array<Plane, 1> kPlanes{{{8, 0}}};
  static constexpr std::array<int, 1> kFields{2};
};

template <typename Change>
constexpr Layout changed(Change change) {
  Layout layout = kQ8_0;
  change(layout);
  return layout;
}

static_assert(is_stated<Q8_0Traits>(kQ8_0));
static_assert(!is_stated<Q8_0Traits>(changed([](Layout& l) { l.name = "Q4_0"; })));
static_assert(!is_stated<Q8_0Traits>(changed([](Layout& l) { l.weights = 256; })));
static_assert(!is_stated<Q8_0Traits>(changed([](Layout& l) { l.sub = 16; })));
static_assert(!is_stated<Q8_0Traits>(changed([](Layout& l) { l.offset = 127; })));
static_assert(!is_stated<Q8_0Traits>(changed([](Layout& l) { l.planes = 2; })));
static_assert(!is_stated<Q8_0Traits>(changed([](Layout& l) { l.plane_bits[0] = 4; })));
static_assert(!is_stated<Q8_0Traits>(changed([](Layout& l) { l.plane_shifts[0] = 4; })));
static_assert(!is_stated<Q8_0Traits>(changed([](Layout& l) { l.fields = 2; })));
static_assert(!is_stated<Q8_0Traits>(changed([](Layout& l) { l.field_bytes[0] = 4; })));
}  // namespace

int main() {
  std::puts("ok: is_stated tells each field of a layout");
  return 0;
}
