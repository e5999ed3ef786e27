// The out kernels of my_ops::linear_blocks and embedding_blocks (ops/blocks), both modes, around the kernels of
// block_formats.h: the format found by name, every argument checked before memory is touched (one body of checks,
// one message for PyTorch and the runtime), the output resized to the op's shape, then the format's kernel, split
// across the thread pool. A program is untrusted input: an unknown format, a weight whose dtype or shape does not
// hold whole blocks of its format, or an input whose width is not the weight's, is refused, so the kernel never reads
// past the constant's bytes; so is an embedding index outside the table.
#pragma once

#include <array>
#include <cstring>
#include <utility>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "declared_dtypes/my_ops/linear_blocks.h"
#include "kernel_helpers/block_formats.h"
#include "kernel_helpers/kernel_contract.h"
#include "ops/blocks/formats.h"

namespace custom {
namespace native {
namespace blocks {

// ---- Checks ---------------------------------------------------------------------------------------------------------
inline contract::Problem format_problem(const FormatKernels* format, std::string_view name, const char* op) {
  if (format != nullptr) {
    return std::nullopt;
  }
  return std::string(op) + ": format '" + std::string(name) + "' is not one this op takes; it takes the GGUF types " +
      format_names() + " (i-quants, TQ and MXFP4 are not among them: requantize with llama-quantize)";
}

inline ScalarType dtype_of(Storage storage) {
  switch (storage) {
    case Storage::kFloat32: return ScalarType::Float;
    case Storage::kFloat16: return ScalarType::Half;
    case Storage::kBFloat16: return ScalarType::BFloat16;
    default: return ScalarType::Byte;
  }
}

// The weight of a layer with k inputs and n outputs: a row format's [n, k] of its dtype; a block format's uint8
// [n, k / W * B] (whole blocks of W weights and B bytes).
inline contract::Problem weight_problem(const Tensor& weight, const FormatKernels& f, const char* op) {
  const std::string name = op;
  const bool rows = f.storage != Storage::kBytes;
  if (weight.scalar_type() != dtype_of(f.storage)) {
    return name + ": weight has dtype " + contract::dtype_name(weight.scalar_type()) + " but a " + f.name +
        " weight is " + (rows ? contract::dtype_name(dtype_of(f.storage)) : "uint8 (the blocks' bytes, packed at export)");
  }
  if (weight.dim() != 2) {
    return name + ": weight " + contract::shape_text(weight) + " must have 2 dimensions, [outputs, " +
        (rows ? std::string("inputs]") : "bytes per row]");
  }
  if (!rows && weight.size(1) % f.block_bytes != 0) {
    return name + ": weight " + contract::shape_text(weight) + " rows of " + std::to_string(weight.size(1)) +
        " bytes are not whole " + f.name + " blocks of " + std::to_string(f.block_bytes) + " bytes (" +
        std::to_string(f.weights_per_block) + " weights each); pack it with the op's Python side";
  }
  return std::nullopt;
}

// Inputs of the layer the weight holds.
inline int64_t inputs_of(const Tensor& weight, const FormatKernels& f) {
  return f.storage == Storage::kBytes ? weight.size(1) / f.block_bytes * f.weights_per_block : weight.size(1);
}

// The layer reads float inputs: the declaration may name no other dtype.
static_assert(std::is_same_v<declared_dtypes::my_ops::linear_blocks, contract::DtypeSet<ScalarType::Float>>,
              "my_ops::linear_blocks computes in float32 alone: declare its dtypes as [\"float32\"] in custom_ops.bzl");

inline contract::Problem linear_problem(const Tensor& input, const Tensor& weight, const FormatKernels& f,
                                        const Tensor& out, const char* op) {
  if (auto p = contract::dtype_problem<declared_dtypes::my_ops::linear_blocks>(input, op, "input")) {
    return p;
  }
  if (auto p = contract::same_dtype_problem(out, input, op, "out", "input")) {
    return p;
  }
  if (auto p = weight_problem(weight, f, op)) {
    return p;
  }
  if (input.dim() < 1 || input.size(input.dim() - 1) != inputs_of(weight, f)) {
    return std::string(op) + ": input " + contract::shape_text(input) + " must end in the layer's " +
        std::to_string(inputs_of(weight, f)) + " inputs (weight " + contract::shape_text(weight) + ", " + f.name + ")";
  }
  return std::nullopt;
}

inline contract::Problem embedding_problem(const Tensor& weight, const Tensor& indices, const FormatKernels& f,
                                           const Tensor& out, const char* op) {
  if (auto p = weight_problem(weight, f, op)) {
    return p;
  }
  if (indices.scalar_type() != ScalarType::Long) {
    return std::string(op) + ": indices have dtype " + contract::dtype_name(indices.scalar_type()) +
        "; they must be int64";
  }
  if (out.scalar_type() != ScalarType::Float) {
    return std::string(op) + ": out has dtype " + contract::dtype_name(out.scalar_type()) + "; it must be float32";
  }
  return std::nullopt;
}

// Read after the layout checks (dense indices): every index names a row of the table.
inline contract::Problem index_problem(const Tensor& weight, const Tensor& indices, const char* op) {
  const int64_t* data = indices.template const_data_ptr<int64_t>();
  const int64_t rows = weight.size(0);
  for (int64_t i = 0; i < indices.numel(); ++i) {
    if (data[i] < 0 || data[i] >= rows) {
      return std::string(op) + ": index " + std::to_string(data[i]) + " (element " + std::to_string(i) +
          " of indices) is outside the table's " + std::to_string(rows) + " rows";
    }
  }
  return std::nullopt;
}

inline contract::Problem layout_problem(const char* op, std::initializer_list<contract::Operand> outputs,
                                        std::initializer_list<contract::Operand> inputs) {
  for (std::initializer_list<contract::Operand> group : {outputs, inputs}) {
    for (const contract::Operand& t : group) {
      if (auto p = contract::dense_problem(t.tensor, op, t.name)) {
        return p;
      }
    }
  }
  return contract::memory_problem(op, outputs, inputs);
}

// Leading dimensions of `lead` (all but its last when `drop_last`), then `last`.
template <typename Sizes>
void output_sizes(const Tensor& lead, bool drop_last, int64_t last, Sizes& sizes, size_t& dims) {
  dims = 0;
  for (int64_t d = 0; d < lead.dim() - (drop_last ? 1 : 0); ++d) {
    sizes[dims++] = lead.size(d);
  }
  sizes[dims++] = last;
}

// ---- The linear layer, split across the pool -------------------------------------------------------------------------
// The code path a format runs on this CPU (capped by CUSTOM_OPS_ISA): the block formats' AVX-512 code needs VNNI too;
// on ARM64 the block formats take the smmla tiles where the CPU has the 8-bit matrix multiply, else the sdot tiles
// where it has the dot product (row formats: the portable loop); a sanitized build has the portable loop alone
// (kernel_helpers/block_formats.h).
inline Isa isa_of(const FormatKernels& f) {
#ifdef CUSTOM_OPS_BLOCKS_DOTPROD_DISPATCH
  if (f.quantizes_activations && simd::cpu_has_i8mm()) {
    return Isa::kI8mm;
  }
  if (f.quantizes_activations && simd::cpu_has_dot_product()) {
    return Isa::kDotProd;
  }
#endif
#if defined(CUSTOM_OPS_X86_DISPATCH) && !defined(CUSTOM_OPS_BLOCKS_PORTABLE_ONLY)
  switch (simd::detected_isa()) {
    case simd::Isa::kAvx512:
      return !f.avx512_needs_vnni || simd::cpu_has_avx512_vnni() ? Isa::kAvx512 : Isa::kAvx2;
    case simd::Isa::kAvx2:
      return Isa::kAvx2;
    case simd::Isa::kBaseline:
      break;
  }
#endif
  return Isa::kBaseline;
}

// Units per task: enough tasks to keep every thread busy, each unit of a task in cache while it goes through the
// tokens. Calls under kSerialWork multiply-adds stay on the calling thread: waking the pool costs more than a small
// decode projection.
constexpr double kSerialWork = 1 << 18;

// Row formats read each activation once per weight they multiply, 64 bytes at a time: a load that straddles two cache
// lines is two accesses. ExecuTorch's memory plan aligns tensors to 16 bytes only, so activations that are not
// line-aligned are copied to a buffer that is (a few KB at decode; measured: the F32 decode row kernel read weights
// at ~29 GB/s with x 16 bytes off a line, ~38 with it aligned).
inline const float* line_aligned(const float* x, int64_t count) {
  constexpr uintptr_t kLine = 64;
  if (reinterpret_cast<uintptr_t>(x) % kLine == 0) {
    return x;
  }
  thread_local std::vector<float> buffer;  // the calling thread's; its tasks only read it
  buffer.resize(static_cast<size_t>(count) + kLine / sizeof(float));
  float* aligned = buffer.data() + (kLine - reinterpret_cast<uintptr_t>(buffer.data()) % kLine) % kLine / sizeof(float);
  std::memcpy(aligned, x, static_cast<size_t>(count) * sizeof(float));
  return aligned;
}

// A linear layer's call as tasks any thread may run (my_ops::decoder_layer runs them in its own region): plan_linear()
// sizes the activations; prepare(first, end) quantizes blocks [first, end) of them, or puts a row format's into panels
// at prefill (prepare_blocks() in all, each once, after the values it reads are final: prepare_group() names the
// blocks by token group and inputs; nothing for a row format at decode, whose tasks read x itself); then
// run(first, end) computes tasks [first, end) of [0, count), each a range of the weight's units against every token.
struct LinearTasks {
  Task task;
  Activations* activations;
  Units units_of;
  Isa isa;
  bool prepares;
  int64_t units, per_task, count, rows_per_unit;

  int64_t prepare_blocks() const { return prepares ? activations->blocks_in_all() : 0; }
  // Groups of tokens whose blocks a thread prepares together (tokens one by one when nothing is prepared).
  int64_t token_groups() const { return prepares ? activations->groups() : task.tokens; }
  int64_t group_tokens() const { return prepares ? kPanel : 1; }
  // The blocks of group g's inputs [first, end) (multiples of the block).
  void prepare_group(int64_t g, int64_t first, int64_t end) const {
    if (!prepares) {
      return;
    }
    const int64_t block = activations->block, per_row = task.k / block;  // a token's blocks; in panels, a group's
    if (activations->in_panels) {
      prepare(g * per_row + first / block, g * per_row + end / block);
      return;
    }
    for (int64_t t = g * kPanel; t < std::min(task.tokens, (g + 1) * kPanel); ++t) {
      prepare(t * per_row + first / block, t * per_row + end / block);
    }
  }
  void prepare(int64_t first, int64_t end) const {
    if (!prepares) {
      return;
    }
    if (activations->in_panels) {
      prepare_panels(task.x, first, end, *activations);
      return;
    }
#if defined(CUSTOM_OPS_X86_DISPATCH) && !defined(CUSTOM_OPS_BLOCKS_PORTABLE_ONLY)
    if (isa == Isa::kAvx512) {
      prepare_blocks_avx512(task.x, first, end, *activations);
      return;
    }
    if (isa == Isa::kAvx2) {
      prepare_blocks_avx2(task.x, first, end, *activations);
      return;
    }
#endif
    blocks::prepare_blocks(task.x, first, end, *activations);
  }
  void run(int64_t first, int64_t end) const { units_of(task, first * per_task, std::min(units, end * per_task)); }
  // The output columns tasks [first, end) write (of every token's row).
  std::pair<int64_t, int64_t> columns(int64_t first, int64_t end) const {
    return {std::min(task.n, first * per_task * rows_per_unit),
            std::min(task.n, std::min(units, end * per_task) * rows_per_unit)};
  }
  // Small calls: waking the pool costs more than the work.
  bool serial() const {
    return count < 2 || static_cast<double>(task.tokens) * static_cast<double>(task.n) *
                                static_cast<double>(task.k) < kSerialWork;
  }
  // The path counters: the outputs, by the ISA whose code computed them (the smmla tiles take tokens in pairs,
  // in_token_runs leaves an odd last one to sdot).
  void count_outputs() const {
    const int64_t outputs = task.tokens * task.n;
    if (isa == Isa::kI8mm) {
      const int64_t by_sdot = task.tokens % 2 * task.n;
      elementwise::count(elementwise::kMatrixMultiplyElements, static_cast<uint64_t>(outputs - by_sdot));
      elementwise::count(elementwise::kDotProductElements, static_cast<uint64_t>(by_sdot));
      return;
    }
    elementwise::count(isa == Isa::kAvx512     ? elementwise::kAvx512Elements
                       : isa == Isa::kAvx2     ? elementwise::kAvx2Elements
                       : isa == Isa::kDotProd  ? elementwise::kDotProductElements
                                               : elementwise::kBaselineElements,
                       static_cast<uint64_t>(outputs));
  }
};

// Tokens from which a row format's vector code (AVX2, AVX-512) takes its activations in panels (block_layout.h):
// below, a panel's unused lanes, or a half-precision weight's conversion shared by too few tokens, cost more than the
// tiles' horizontal sums (measured with AVX-512 on the AMD EPYC, docs/benchmarks.md: float32 gains from 16 tokens,
// F16 and BF16 from 32).
inline int64_t panel_tokens(Storage storage) {
  return storage == Storage::kFloat32 ? 16 : 32;
}

// x: read by the tasks as it is at decode (a row format's should be line_aligned()).
inline LinearTasks plan_linear(const FormatKernels& f, const float* x, int64_t tokens, int64_t k, const void* weight,
                               int64_t n, float* out, Activations& activations, int64_t threads) {
  const Isa which = isa_of(f);
  const bool panels = !f.quantizes_activations && (which == Isa::kAvx2 || which == Isa::kAvx512) &&
                      tokens >= panel_tokens(f.storage) && k % kPanel == 0;
  if (f.quantizes_activations) {
    activations.resize(tokens, k, f.weights_per_block);
  } else if (panels) {
    activations.resize_panels(tokens, k);
  } else {
    activations.unused();
  }
  const bool blocks = f.storage == Storage::kBytes;
  const int64_t units = blocks ? (n + kGroup - 1) / kGroup : n;
  int64_t per_task = std::max<int64_t>(1, units / (4 * std::max<int64_t>(1, threads)));
  if (panels) {  // whole tiles of rows
    per_task = (per_task + kPanelRows - 1) / kPanelRows * kPanelRows;
  }
  return {Task{weight, x, &activations, tokens, n, k, out}, &activations, f.units[static_cast<int>(which)], which,
          f.quantizes_activations || panels, units, per_task, (units + per_task - 1) / per_task, blocks ? kGroup : 1};
}

// out [tokens, n] = x [tokens, k] . weight^T. False when the pool did not run every task.
inline bool linear(const FormatKernels& f, const float* x, int64_t tokens, int64_t k, const void* weight, int64_t n,
                   float* out) {
  thread_local Activations activations;  // the calling thread's; its tasks only read it
  LinearTasks tasks = plan_linear(f, x, tokens, k, weight, n, out, activations, contract::thread_count());
  if (!tasks.prepares) {  // a row format's tasks read x itself
    tasks.task.x = line_aligned(x, tokens * k);
  }
  tasks.prepare(0, tasks.prepare_blocks());
  bool ran = true;
  if (tasks.serial()) {
    tasks.run(0, tasks.count);
  } else {
    ran = contract::parallel_for(0, tasks.count, 1, [&](int64_t first, int64_t end) { tasks.run(first, end); },
                                 contract::PoolUser::kLinear);
  }
  tasks.count_outputs();
  return ran;
}

// ---- The two kernels, in each mode ----------------------------------------------------------------------------------
#ifdef USE_ATEN_LIB
inline const FormatKernels& require_format(std::string_view name, const char* op) {
  const FormatKernels* f = find_format(name);
  contract::require(format_problem(f, name, op));
  return *f;
}

inline at::Tensor& linear_out(const at::Tensor& input, const at::Tensor& weight, std::string_view format,
                              at::Tensor& out, const char* op) {
  const FormatKernels& f = require_format(format, op);
  contract::require(linear_problem(input, weight, f, out, op));
  std::vector<int64_t> sizes(input.dim());
  size_t dims = 0;
  output_sizes(input, true, weight.size(0), sizes, dims);
  contract::resize_output(out, c10::fromIntArrayRefSlow(sizes), op);
  contract::check_memory(op, {{out, "out"}}, {{input, "input"}, {weight, "weight"}});
  const at::Tensor x = input.contiguous(), w = weight.contiguous();
  return contract::into_dense_out(out, [&](at::Tensor& y) {
    contract::require(layout_problem(op, {{y, "out"}}, {{x, "input"}, {w, "weight"}}));
    const int64_t k = inputs_of(w, f);
    linear(f, x.const_data_ptr<float>(), k == 0 ? 0 : x.numel() / k, k, w.const_data_ptr(), w.size(0),
           y.mutable_data_ptr<float>());
  });
}

inline at::Tensor& embedding_out(const at::Tensor& weight, const at::Tensor& indices, std::string_view format,
                                 at::Tensor& out, const char* op) {
  const FormatKernels& f = require_format(format, op);
  contract::require(embedding_problem(weight, indices, f, out, op));
  std::vector<int64_t> sizes(indices.dim() + 1);
  size_t dims = 0;
  output_sizes(indices, false, inputs_of(weight, f), sizes, dims);
  contract::resize_output(out, c10::fromIntArrayRefSlow(sizes), op);
  contract::check_memory(op, {{out, "out"}}, {{weight, "weight"}, {indices, "indices"}});
  const at::Tensor w = weight.contiguous(), i = indices.contiguous();
  return contract::into_dense_out(out, [&](at::Tensor& y) {
    contract::require(layout_problem(op, {{y, "out"}}, {{w, "weight"}, {i, "indices"}}));
    contract::require(index_problem(w, i, op));
    f.embed(static_cast<const uint8_t*>(w.const_data_ptr()), w.size(0), inputs_of(w, f), i.const_data_ptr<int64_t>(),
            i.numel(), y.mutable_data_ptr<float>());
  });
}
#else
using Sizes = std::array<executorch::aten::SizesType, executorch::runtime::kTensorDimensionLimit>;

inline Tensor& linear_out(KernelContext& ctx, const Tensor& input, const Tensor& weight, std::string_view format,
                          Tensor& out, const char* op) {
  const FormatKernels* f = find_format(format);
  if (!contract::require(ctx, format_problem(f, format, op)) ||
      !contract::require(ctx, linear_problem(input, weight, *f, out, op))) {
    return out;
  }
  Sizes sizes;
  size_t dims = 0;
  output_sizes(input, true, weight.size(0), sizes, dims);
  if (!contract::resize_output(ctx, out, {sizes.data(), dims}, op, "out") ||
      !contract::require(ctx, layout_problem(op, {{out, "out"}}, {{input, "input"}, {weight, "weight"}}))) {
    return out;
  }
  const int64_t k = inputs_of(weight, *f);
  const bool ran = linear(*f, input.const_data_ptr<float>(), k == 0 ? 0 : input.numel() / k, k,
                          weight.const_data_ptr(), weight.size(0), out.mutable_data_ptr<float>());
  ET_KERNEL_CHECK_MSG(ctx, ran, Internal, out, "%s: the threadpool did not run all of the tasks", op);
  return out;
}

inline Tensor& embedding_out(KernelContext& ctx, const Tensor& weight, const Tensor& indices, std::string_view format,
                             Tensor& out, const char* op) {
  const FormatKernels* f = find_format(format);
  if (!contract::require(ctx, format_problem(f, format, op)) ||
      !contract::require(ctx, embedding_problem(weight, indices, *f, out, op))) {
    return out;
  }
  Sizes sizes;
  size_t dims = 0;
  if (indices.dim() + 1 > static_cast<int64_t>(sizes.size())) {
    contract::require(ctx, std::string(op) + ": indices have " + std::to_string(indices.dim()) +
                               " dimensions; the output would have more than the runtime's limit");
    return out;
  }
  output_sizes(indices, false, inputs_of(weight, *f), sizes, dims);
  if (!contract::resize_output(ctx, out, {sizes.data(), dims}, op, "out") ||
      !contract::require(ctx, layout_problem(op, {{out, "out"}}, {{weight, "weight"}, {indices, "indices"}})) ||
      !contract::require(ctx, index_problem(weight, indices, op))) {
    return out;
  }
  f->embed(static_cast<const uint8_t*>(weight.const_data_ptr()), weight.size(0), inputs_of(weight, *f),
           indices.const_data_ptr<int64_t>(), indices.numel(), out.mutable_data_ptr<float>());
  return out;
}
#endif

}  // namespace blocks
}  // namespace native
}  // namespace custom

// Defines custom::native::NAME_out_impl, the out kernel of my_ops::NAME.out that custom_ops.yaml binds, in the mode the
// source is compiled in: blocks::KERNEL (linear_out or embedding_out) over the op's two tensors, in its schema's
// order, and its format. Used once per op, at global scope, in its NAME_out.cpp.
#ifdef USE_ATEN_LIB
#define CUSTOM_OPS_BLOCKS_OUT_KERNEL(NAME, KERNEL)                                                                 \
  namespace custom::native {                                                                                       \
  at::Tensor& NAME##_out_impl(const at::Tensor& first, const at::Tensor& second, c10::string_view format,          \
                              at::Tensor& out) {                                                                   \
    return blocks::KERNEL(first, second, std::string_view(format.data(), format.size()), out,                      \
                          "my_ops::" #NAME ".out");                                                                \
  }                                                                                                                \
  }
#else
#define CUSTOM_OPS_BLOCKS_OUT_KERNEL(NAME, KERNEL)                                                                 \
  namespace custom::native {                                                                                       \
  executorch::aten::Tensor& NAME##_out_impl(executorch::runtime::KernelRuntimeContext& ctx,                        \
                                            const executorch::aten::Tensor& first,                                 \
                                            const executorch::aten::Tensor& second, std::string_view format,       \
                                            executorch::aten::Tensor& out) {                                       \
    return blocks::KERNEL(ctx, first, second, format, out, "my_ops::" #NAME ".out");                               \
  }                                                                                                                \
  }
#endif
