// The kernel of my_ops::decoder_layer.out (decoder_layer.py registers the op with PyTorch): a pre-norm decoder layer
// (Llama's, SmolLM2's) in one call,
//   h   = hidden + o_proj(attention(rope(qkv_proj(rms_norm(hidden)))))    (k and v written into the caches)
//   out = h + down_proj(silu(gate) * up),  gate | up = gate_up_proj(rms_norm(h))
// in one parallel region of the pool (kernel_helpers/steps_region.h): one hand-off a layer where the ops it replaces
// (rms_norm, linear_blocks, rope_sdpa_with_cache, add_rms_norm, silu_mul) hand the pool five. Each step runs the row
// code of the op it replaces, so the layer gives their bits. ExecuTorch mode: registers itself
// (EXECUTORCH_LIBRARY_CHECKED, at the end) since its schema mutates the caches; ATen mode: the CPU kernel
// decoder_layer_without_python.cpp registers.
#include <array>
#include <cmath>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "declared_dtypes/my_ops/decoder_layer.h"
#include "kernel_helpers/kernel_contract.h"
#include "kernel_helpers/steps_region.h"
#include "ops/blocks/block_ops.h"
#include "ops/rms_norm/rms_norm_rows.h"
#include "ops/rope_sdpa_with_cache/qkv_rows.h"
#include "ops/sdpa_with_cache/attention.h"
#include "ops/gated/silu_mul_rows.h"
#ifndef USE_ATEN_LIB
#include "kernel_helpers/checked_unboxing.h"
#endif

namespace custom {
namespace native {
namespace {

constexpr const char* kOp = "my_ops::decoder_layer.out";
// Elements of silu(gate) * up a unit at decode: a multiple of every format's block of activations (32 or 256), so a
// unit quantizes the blocks it fills, whole. With more tokens a unit is a group's whole rows: chunks of one group's
// tokens would write side by side in the blocks' scales, one cache line for two threads.
constexpr int64_t kSiluChunk = 256;

using blocks::FormatKernels;

// The layer's weights, as the program passes them. v: v's projection when its format is not q and k's (llama-quantize's
// Q4_K_M and Q5_K_M give some layers' attn_v more bits); qkv then holds q and k alone.
struct Weights {
  const Tensor& input_norm;
  const Tensor& qkv;
  std::string_view qkv_format;
  const Tensor* v;
  std::string_view v_format;
  const Tensor& o;
  std::string_view o_format;
  const Tensor& post_norm;
  const Tensor& gate_up;
  std::string_view gate_up_format;
  const Tensor& down;
  std::string_view down_format;
};

// Its projections' formats, found by name (v's none when q, k and v are one projection).
struct Formats {
  const FormatKernels *qkv, *v, *o, *gate_up, *down;

  explicit Formats(const Weights& w)
      : qkv(blocks::find_format(w.qkv_format)), v(w.v == nullptr ? nullptr : blocks::find_format(w.v_format)),
        o(blocks::find_format(w.o_format)), gate_up(blocks::find_format(w.gate_up_format)),
        down(blocks::find_format(w.down_format)) {}
};

// The sizes, read from the arguments once they are checked.
struct Shape {
  int64_t batch, length, model, heads, kv_heads, head_dim, positions, hidden_mlp;

  Shape(const Tensor& hidden, const Tensor& key_cache, const Weights& w)
      : batch(hidden.size(0)), length(hidden.size(1)), model(hidden.size(2)), heads(0), kv_heads(key_cache.size(2)),
        head_dim(key_cache.size(3)), positions(key_cache.size(1)), hidden_mlp(w.gate_up.size(0) / 2) {
    heads = head_dim > 0 ? w.qkv.size(0) / head_dim - (w.v == nullptr ? 2 : 1) * kv_heads : 0;
  }
  int64_t tokens() const { return batch * length; }
  int64_t qkv_width() const { return (heads + 2 * kv_heads) * head_dim; }
};

// ---- Checks: one body for both modes, before `out` is resized ------------------------------------------------------
contract::Problem v_pair_problem(bool has_weight, bool has_format) {
  if (has_weight != has_format) {
    return std::string(kOp) + ": " + (has_weight ? "v_weight is given without v_format" : "v_format is given "
        "without v_weight") + "; give both (v's projection in a format of its own) or neither";
  }
  return std::nullopt;
}

using Dtypes = declared_dtypes::my_ops::decoder_layer;
static_assert(std::is_same_v<Dtypes, contract::DtypeSet<ScalarType::Float>>,
              "my_ops::decoder_layer computes in float32 alone: declare its dtypes as [\"float32\"] in custom_ops.bzl");

contract::Problem float_problem(const Tensor& t, const char* name) {
  if (!Dtypes::contains(t.scalar_type())) {
    return std::string(kOp) + ": " + name + " has dtype " + contract::dtype_name(t.scalar_type()) +
        "; the layer computes in " + Dtypes::names();
  }
  return std::nullopt;
}

// A projection's weight: its format takes it, it has `inputs` inputs, and (`outputs` >= 0) that many outputs.
contract::Problem projection_problem(const Tensor& weight, std::string_view format_name, const FormatKernels* format,
                                     const char* name, int64_t inputs, int64_t outputs, const char* inputs_are) {
  const contract::Problem p = format == nullptr ? blocks::format_problem(format, format_name, kOp)
                                                : blocks::weight_problem(weight, *format, kOp);
  if (p) {
    return *p + " (" + name + ")";
  }
  if (blocks::inputs_of(weight, *format) != inputs || (outputs >= 0 && weight.size(0) != outputs)) {
    return std::string(kOp) + ": " + name + " " + contract::shape_text(weight) + " (" + format->name + ") holds " +
        std::to_string(blocks::inputs_of(weight, *format)) + " inputs and " + std::to_string(weight.size(0)) +
        " outputs; it must take " + std::to_string(inputs) + " (" + inputs_are + ")" +
        (outputs >= 0 ? " and give " + std::to_string(outputs) : std::string());
  }
  return std::nullopt;
}

contract::Problem arguments_problem(const Tensor& hidden, const Weights& w, const Formats& f, const Tensor& cos,
                                    const Tensor& sin, const Tensor& key_cache, const Tensor& value_cache,
                                    int64_t start, const std::optional<double>& scale, double eps, const Tensor& out) {
  for (const auto& [t, name] : {std::pair<const Tensor&, const char*>{hidden, "hidden"}, {w.input_norm, "input_norm"},
                                {w.post_norm, "post_norm"}, {cos, "cos"}, {sin, "sin"}, {key_cache, "key_cache"},
                                {value_cache, "value_cache"}, {out, "out"}}) {
    if (auto p = float_problem(t, name)) {
      return p;
    }
  }
  const std::string op = kOp;
  if (hidden.dim() != 3 || key_cache.dim() != 4) {
    return op + ": hidden " + contract::shape_text(hidden) + " must be [batch, length, model] and key_cache " +
        contract::shape_text(key_cache) + " [batch, positions, kv_heads, head_dim]";
  }
  if (!contract::same_sizes(value_cache, key_cache) || key_cache.size(0) != hidden.size(0)) {
    return op + ": key_cache " + contract::shape_text(key_cache) + " and value_cache " +
        contract::shape_text(value_cache) + " must have one shape, with hidden's batch " +
        std::to_string(hidden.size(0));
  }
  const int64_t model = hidden.size(2), kv_heads = key_cache.size(2), head_dim = key_cache.size(3);
  for (const auto& [t, name] : {std::pair<const Tensor&, const char*>{w.input_norm, "input_norm"},
                                {w.post_norm, "post_norm"}}) {
    if (!norm::weight_fits(hidden, t)) {
      return op + ": " + name + " " + contract::shape_text(t) + " must scale hidden's " + std::to_string(model) +
          " features; give it shape [" + std::to_string(model) + "]";
    }
  }
  if (head_dim == 0 || head_dim % 2 != 0 || kv_heads == 0) {
    return op + ": key_cache " + contract::shape_text(key_cache) + " must have kv heads and an even head_dim (the "
        "rotary embedding rotates its halves)";
  }
  if (auto p = projection_problem(w.qkv, w.qkv_format, f.qkv, "qkv_weight", model, -1, "hidden's features")) {
    return p;
  }
  const int64_t parts = w.v == nullptr ? 2 : 1;  // k and v's share of qkv_weight's rows, in kv heads
  const int64_t qkv_outputs = w.qkv.size(0), heads = qkv_outputs / head_dim - parts * kv_heads;
  if (qkv_outputs % head_dim != 0 || heads < kv_heads || heads % kv_heads != 0) {
    return op + ": qkv_weight's " + std::to_string(qkv_outputs) + " outputs are not (heads + " +
        std::to_string(parts) + " * " + std::to_string(kv_heads) + ") * " + std::to_string(head_dim) +
        " for a number of query heads that is a multiple of the cache's " + std::to_string(kv_heads) + " kv heads" +
        (w.v == nullptr ? " (q, k and v's rows; with v_weight, q and k's)" : " (q and k's rows: v_weight holds v's)");
  }
  if (w.v != nullptr) {
    if (auto p = projection_problem(*w.v, w.v_format, f.v, "v_weight", model, kv_heads * head_dim,
                                    "hidden's features")) {
      return p;
    }
  }
  if (auto p = projection_problem(w.o, w.o_format, f.o, "o_weight", heads * head_dim, model,
                                  "the attention's heads * head_dim")) {
    return p;
  }
  if (auto p = projection_problem(w.gate_up, w.gate_up_format, f.gate_up, "gate_up_weight", model, -1,
                                  "hidden's features")) {
    return p;
  }
  if (w.gate_up.size(0) == 0 || w.gate_up.size(0) % 2 != 0) {
    return op + ": gate_up_weight " + contract::shape_text(w.gate_up) + " must give the gate's outputs, then as "
        "many of up's: an even, non-zero number";
  }
  if (auto p = projection_problem(w.down, w.down_format, f.down, "down_weight", w.gate_up.size(0) / 2, model,
                                  "half of gate_up's outputs")) {
    return p;
  }
  if (auto p = attention::positions_problem(op, cos, sin, hidden.size(0), hidden.size(1), head_dim, key_cache.size(1),
                                            start, scale)) {
    return p;
  }
  if (!std::isfinite(eps) || eps < 0) {
    return op + ": eps " + std::to_string(eps) + " must be finite and not negative";
  }
  return std::nullopt;
}

contract::Problem layout_problem(const Tensor& hidden, const Weights& w, const Tensor& cos, const Tensor& sin,
                                 const Tensor& key_cache, const Tensor& value_cache, const Tensor& out) {
  // Without v_weight, qkv_weight stands in its place in both lists (a second look at the same tensor).
  const Tensor& v = w.v == nullptr ? w.qkv : *w.v;
  for (const auto& [t, name] : {std::pair<const Tensor&, const char*>{hidden, "hidden"}, {w.input_norm, "input_norm"},
                                {w.qkv, "qkv_weight"}, {v, "v_weight"}, {w.o, "o_weight"}, {w.post_norm, "post_norm"},
                                {w.gate_up, "gate_up_weight"}, {w.down, "down_weight"}, {cos, "cos"}, {sin, "sin"},
                                {key_cache, "key_cache"}, {value_cache, "value_cache"}, {out, "out"}}) {
    if (auto p = contract::dense_problem(t, kOp, name)) {
      return p;
    }
  }
  return contract::memory_problem(
      kOp, {{out, "out"}, {key_cache, "key_cache"}, {value_cache, "value_cache"}},
      {{hidden, "hidden"}, {w.input_norm, "input_norm"}, {w.qkv, "qkv_weight"}, {v, "v_weight"}, {w.o, "o_weight"},
       {w.post_norm, "post_norm"}, {w.gate_up, "gate_up_weight"}, {w.down, "down_weight"}, {cos, "cos"},
       {sin, "sin"}});
}

// ---- The layer ------------------------------------------------------------------------------------------------------
// The calling thread's buffers between steps, each on a cache line (a row format's tasks read their activations 64
// bytes at a time).
struct Scratch {
  std::vector<float> storage;
  blocks::Activations qkv, v, o, gate_up, down;

  float* carve(int64_t count, float*& next) {
    float* start = next;
    next += (count + 15) / 16 * 16;
    return start;
  }
};

bool run(const Tensor& hidden_t, const Weights& w, const Formats& f, const Tensor& cos_t, const Tensor& sin_t,
         Tensor& key_cache, Tensor& value_cache, int64_t start, const std::optional<double>& scale, double eps,
         Tensor& out_t) {
  const Shape s(hidden_t, key_cache, w);
  const int64_t T = s.tokens(), M = s.model, I = s.hidden_mlp, D = s.head_dim;
  thread_local Scratch scratch;
  const int64_t buffers = 6, floats = 2 * T * M + T * s.qkv_width() + T * s.heads * D + 3 * T * I;
  scratch.storage.resize(static_cast<size_t>(floats + (buffers + 1) * 16));
  float* next = scratch.storage.data() + (64 - reinterpret_cast<uintptr_t>(scratch.storage.data()) % 64) % 64 / 4;
  float* normed = scratch.carve(T * M, next);     // rms_norm(hidden), then rms_norm(h)
  float* qkv = scratch.carve(T * s.qkv_width(), next);  // with v_weight: q and k's rows, then v's
  const int64_t v_width = s.kv_heads * D, qk_width = s.qkv_width() - (w.v == nullptr ? 0 : v_width);
  float* v = qkv + T * qk_width;
  float* attended = scratch.carve(T * s.heads * D, next);  // rotated q, then attention's output in its place
  float* projected = scratch.carve(T * M, next);  // o_proj's output, then down_proj's
  float* gate_up = scratch.carve(2 * T * I, next);
  float* activated = scratch.carve(T * I, next);

  const float* hidden = hidden_t.const_data_ptr<float>();
  float* out = out_t.mutable_data_ptr<float>();  // h, then h + down_proj(...)
  const int64_t threads = contract::thread_count();
  const blocks::LinearTasks qkv_proj = blocks::plan_linear(*f.qkv, normed, T, M, w.qkv.const_data_ptr(), qk_width,
                                                           qkv, scratch.qkv, threads);
  // v's projection of its own, or none: no tasks nor token groups, so the steps it adds pass at once.
  const blocks::LinearTasks v_proj = w.v == nullptr ? blocks::LinearTasks{} : blocks::plan_linear(
      *f.v, normed, T, M, w.v->const_data_ptr(), v_width, v, scratch.v, threads);
  const blocks::LinearTasks o_proj = blocks::plan_linear(*f.o, attended, T, s.heads * D, w.o.const_data_ptr(), M,
                                                         projected, scratch.o, threads);
  const blocks::LinearTasks gate_up_proj = blocks::plan_linear(*f.gate_up, normed, T, M, w.gate_up.const_data_ptr(),
                                                               2 * I, gate_up, scratch.gate_up, threads);
  const blocks::LinearTasks down_proj = blocks::plan_linear(*f.down, activated, T, I, w.down.const_data_ptr(), M,
                                                            projected, scratch.down, threads);
  const attention::QkvRows<float> rows{qkv, cos_t.const_data_ptr<float>(), sin_t.const_data_ptr<float>(),
                                       key_cache.mutable_data_ptr<float>(), value_cache.mutable_data_ptr<float>(),
                                       attended, s.batch, s.length, s.heads, s.kv_heads, D, s.positions, start,
                                       cos_t.size(0), w.v == nullptr ? nullptr : v};
  const attention::Geometry g{s.batch, s.length, s.heads, s.kv_heads, D, s.positions, start,
                              static_cast<float>(scale.value_or(1.0 / std::sqrt(static_cast<double>(D)))), threads};
  const attention::Tensors<float> heads{attended, rows.keys, rows.values, attended};
  const float* input_norm = w.input_norm.const_data_ptr<float>();
  const float* post_norm = w.post_norm.const_data_ptr<float>();
  // my_ops::rms_norm's and add_rms_norm's choice for a float32 output of this size.
  const norm::Isa norm_isa = norm::row_isa<float>(static_cast<size_t>(T * M) * sizeof(float));
  const int64_t silu_chunks = T == 1 ? (I + kSiluChunk - 1) / kSiluChunk : 1;
  const int64_t silu_chunk = T == 1 ? kSiluChunk : I;
  // A group of tokens' rows of `in` normalized into `normed`, then their activation blocks for `next`, the projection
  // that reads them.
  const auto normalize_rows = [&](const float* in, const float* weight, const blocks::LinearTasks& next, int64_t g) {
    const int64_t first = g * next.group_tokens();
    norm::normalize_rows(in, weight, normed, first, std::min(T, first + next.group_tokens()), M,
                         static_cast<float>(eps), norm_isa);
    next.prepare_group(g, 0, M);
  };
  // Tasks [unit, unit + 1) of `proj` into `projected`, then out = residual + projected in the columns they wrote.
  const auto project_and_add = [&](const blocks::LinearTasks& proj, const float* residual, int64_t unit) {
    proj.run(unit, unit + 1);
    const auto [first, end] = proj.columns(unit, unit + 1);
    for (int64_t t = 0; t < T; ++t) {
      for (int64_t c = first; c < end; ++c) {
        out[t * M + c] = residual[t * M + c] + projected[t * M + c];
      }
    }
  };

  enum Step { kNorm, kPrepareV, kQkv, kRotate, kAttend, kPrepareO, kO, kPostNorm, kGateUp, kSilu, kDown, kSteps };
  const std::array<int64_t, kSteps> units{qkv_proj.token_groups(), v_proj.token_groups(),
                                          qkv_proj.count + v_proj.count, T, g.tasks(), o_proj.token_groups(),
                                          o_proj.count, gate_up_proj.token_groups(), gate_up_proj.count,
                                          down_proj.token_groups() * silu_chunks, down_proj.count};
  const auto step = [&](size_t which, int64_t unit) {
    switch (which) {
      case kNorm:
        normalize_rows(hidden, input_norm, qkv_proj, unit);
        break;
      case kPrepareV:  // v's activation blocks, in its format's groups of tokens (the rows are normalized)
        v_proj.prepare_group(unit, 0, M);
        break;
      case kQkv:  // q and k's tasks (or q, k and v's), then v's
        if (unit < qkv_proj.count) {
          qkv_proj.run(unit, unit + 1);
        } else {
          v_proj.run(unit - qkv_proj.count, unit - qkv_proj.count + 1);
        }
        break;
      case kRotate:
        rows.rotate_and_write(unit);
        break;
      case kAttend:
        attention::attend_tasks<float>(g, heads, unit, unit + 1);
        break;
      case kPrepareO:
        o_proj.prepare_group(unit, 0, s.heads * D);
        break;
      case kO:  // h = hidden + o_proj
        project_and_add(o_proj, hidden, unit);
        break;
      case kPostNorm:
        normalize_rows(out, post_norm, gate_up_proj, unit);
        break;
      case kGateUp:
        gate_up_proj.run(unit, unit + 1);
        break;
      case kSilu: {  // a chunk of a group's silu(gate) * up, then the activation blocks of down_proj it fills
        const int64_t group = unit / silu_chunks, first = unit % silu_chunks * silu_chunk;
        const int64_t end = std::min(I, first + silu_chunk), tokens = down_proj.group_tokens();
        for (int64_t t = group * tokens; t < std::min(T, (group + 1) * tokens); ++t) {
          const elementwise::Path path = swiglu::silu_mul_range<float>(gate_up + t * 2 * I, gate_up + t * 2 * I + I,
                                                                       activated + t * I, first, end);
          elementwise::count(path, static_cast<uint64_t>(end - first));  // as silu_mul counts its elements
        }
        down_proj.prepare_group(group, first, end);
        break;
      }
      case kDown:  // out = h + down_proj
        project_and_add(down_proj, out, unit);
        break;
      default:
        break;
    }
  };
  const bool parallel = !(qkv_proj.serial() && v_proj.serial() && o_proj.serial() && gate_up_proj.serial() &&
                          down_proj.serial());
  const bool ran = steps::run(units, step, parallel);
  // The path counters, as the ops this layer replaces count: every output by the code that computed it.
  norm::count_rows(norm_isa, 2 * T * M);
  for (const blocks::LinearTasks* p : {&qkv_proj, &v_proj, &o_proj, &gate_up_proj, &down_proj}) {
    p->count_outputs();  // none for an absent v
  }
  // The rotations, as rope_sdpa_with_cache counts them.
  elementwise::count(elementwise::kBaselineElements, static_cast<uint64_t>(T * s.qkv_width()));
  return ran;
}

} // namespace

#ifdef USE_ATEN_LIB
at::Tensor& decoder_layer_out_impl(const at::Tensor& hidden_in, const at::Tensor& input_norm,
                                   const at::Tensor& qkv_weight, c10::string_view qkv_format, const at::Tensor& cos_in,
                                   const at::Tensor& sin_in, at::Tensor& key_cache, at::Tensor& value_cache,
                                   int64_t start_pos, std::optional<double> scale, const at::Tensor& o_weight,
                                   c10::string_view o_format, const at::Tensor& post_norm,
                                   const at::Tensor& gate_up_weight, c10::string_view gate_up_format,
                                   const at::Tensor& down_weight, c10::string_view down_format, double eps,
                                   const std::optional<at::Tensor>& v_weight, std::optional<c10::string_view> v_format,
                                   at::Tensor& out) {
  // Strided inputs are read as the dense tensors an export would hold; the caches are written in place, so dense.
  const at::Tensor hidden = hidden_in.contiguous(), cos = cos_in.contiguous(), sin = sin_in.contiguous();
  const at::Tensor in_norm = input_norm.contiguous(), qkv = qkv_weight.contiguous(), o = o_weight.contiguous();
  const at::Tensor post = post_norm.contiguous(), gate_up = gate_up_weight.contiguous();
  const at::Tensor down = down_weight.contiguous();
  const at::Tensor v = v_weight.has_value() ? v_weight->contiguous() : at::Tensor();
  const std::string_view v_name = v_format.has_value() ? std::string_view(v_format->data(), v_format->size()) : "";
  const Weights w{in_norm, qkv, {qkv_format.data(), qkv_format.size()}, v_weight.has_value() ? &v : nullptr, v_name,
                  o, {o_format.data(), o_format.size()}, post, gate_up, {gate_up_format.data(), gate_up_format.size()},
                  down, {down_format.data(), down_format.size()}};
  contract::require(v_pair_problem(v_weight.has_value(), v_format.has_value()));
  const Formats f(w);
  contract::require(arguments_problem(hidden, w, f, cos, sin, key_cache, value_cache, start_pos, scale, eps, out));
  contract::resize_output(out, hidden.sym_sizes(), kOp);
  contract::require(layout_problem(hidden, w, cos, sin, key_cache, value_cache, out));
  run(hidden, w, f, cos, sin, key_cache, value_cache, start_pos, scale, eps, out);
  return out;
}
#else
executorch::aten::Tensor& decoder_layer_out_impl(
    executorch::runtime::KernelRuntimeContext& ctx,
    const executorch::aten::Tensor& hidden,
    const executorch::aten::Tensor& input_norm,
    const executorch::aten::Tensor& qkv_weight,
    std::string_view qkv_format,
    const executorch::aten::Tensor& cos,
    const executorch::aten::Tensor& sin,
    executorch::aten::Tensor& key_cache,
    executorch::aten::Tensor& value_cache,
    int64_t start_pos,
    std::optional<double> scale,
    const executorch::aten::Tensor& o_weight,
    std::string_view o_format,
    const executorch::aten::Tensor& post_norm,
    const executorch::aten::Tensor& gate_up_weight,
    std::string_view gate_up_format,
    const executorch::aten::Tensor& down_weight,
    std::string_view down_format,
    double eps,
    const std::optional<executorch::aten::Tensor>& v_weight,
    std::optional<std::string_view> v_format,
    executorch::aten::Tensor& out) {
  const Weights w{input_norm, qkv_weight, qkv_format, v_weight.has_value() ? &*v_weight : nullptr,
                  v_format.value_or(""), o_weight, o_format, post_norm, gate_up_weight, gate_up_format, down_weight,
                  down_format};
  if (!contract::require(ctx, v_pair_problem(v_weight.has_value(), v_format.has_value()))) {
    return out;
  }
  const Formats f(w);
  if (!contract::require(ctx, arguments_problem(hidden, w, f, cos, sin, key_cache, value_cache, start_pos, scale, eps,
                                                out)) ||
      !contract::resize_output(ctx, out, hidden.sizes(), kOp, "out") ||
      !contract::require(ctx, layout_problem(hidden, w, cos, sin, key_cache, value_cache, out))) {
    return out;
  }
  const bool ran = run(hidden, w, f, cos, sin, key_cache, value_cache, start_pos, scale, eps, out);
  ET_KERNEL_CHECK_MSG(ctx, ran, Internal, out, "%s: the threadpool did not run all of the layer", kOp);
  return out;
}
#endif

} // namespace native
} // namespace custom

#ifndef USE_ATEN_LIB
// v_weight and v_format came later: a program exported before them runs with neither.
EXECUTORCH_LIBRARY_CHECKED_ADDED(my_ops, "decoder_layer.out", custom::native::decoder_layer_out_impl, 2);
#endif
