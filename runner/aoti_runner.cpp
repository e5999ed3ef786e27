// AOTInductor's side of the comparison with ExecuTorch (flow/aoti.py, docs/aoti.md): loads a package written by
// torch._inductor.aoti_compile_and_package and runs it from C++, without Python. Custom ops reach the package's
// code through AOTInductor's proxy executor, which looks each one up in PyTorch's dispatcher when the package loads:
// the libraries that register them are loaded here first (--op_library), as Python would import them. Every failure
// is one "error:" line naming the problem and the fix, exit code 1 (2 for a bad command line).
#include <dlfcn.h>

#include <ATen/ATen.h>
#include <torch/csrc/inductor/aoti_package/model_package_loader.h>

#include <algorithm>
#include <chrono>
#include <cinttypes>
#include <cmath>
#include <cstdlib>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <optional>
#include <string>
#include <vector>

#include "command_line.h"
#include "greedy_decoding.h"

namespace {

using custom_ops_runner::CommandLine;
using custom_ops_runner::Runner;

int fail(const std::string& message, int code = 1) {
  std::fprintf(stderr, "error: %s\n", message.c_str());
  return code;
}

at::ScalarType dtype_named(const std::string& name) {
  static const std::pair<const char*, at::ScalarType> kDtypes[] = {
      {"float32", at::kFloat}, {"float64", at::kDouble}, {"float16", at::kHalf}, {"bfloat16", at::kBFloat16},
      {"uint8", at::kByte},    {"int8", at::kChar},      {"int16", at::kShort},  {"int32", at::kInt},
      {"int64", at::kLong},    {"bool", at::kBool}};
  static_assert(std::size(kDtypes) == std::size(custom_ops_runner::kSpecDtypes), "every spec dtype has a ScalarType");
  for (const auto& [known, dtype] : kDtypes) {
    if (name == known) {
      return dtype;
    }
  }
  return at::kFloat;  // unreachable: parse_command_line accepts kSpecDtypes only
}

std::string spec_text(const custom_ops_runner::InputSpec& spec) {
  std::string text = spec.dtype + ":";
  for (size_t d = 0; d < spec.shape.size(); ++d) {
    text += (d ? "x" : "") + std::to_string(spec.shape[d]);
  }
  return text;
}

std::optional<std::string> read_inputs(const CommandLine& options, const std::vector<std::string>& files,
                                       std::vector<at::Tensor>& inputs) {
  inputs.clear();
  for (size_t i = 0; i < files.size(); ++i) {  // parse_command_line checked one spec per file in every list
    const auto& spec = options.input_specs[i];
    at::Tensor tensor = at::empty(spec.shape, at::TensorOptions().dtype(dtype_named(spec.dtype)));
    std::ifstream file(files[i], std::ios::binary | std::ios::ate);
    if (!file) {
      return "cannot open input file '" + files[i] + "'";
    }
    const auto size = static_cast<uint64_t>(file.tellg());
    if (size != tensor.nbytes()) {
      return "input file '" + files[i] + "' holds " + std::to_string(size) + " bytes; " + spec_text(spec) +
          " needs " + std::to_string(tensor.nbytes());
    }
    file.seekg(0);
    file.read(static_cast<char*>(tensor.data_ptr()), static_cast<std::streamsize>(size));
    inputs.push_back(tensor);
  }
  return std::nullopt;
}

std::optional<std::string> write_file(const std::string& path, const void* data, size_t size, const char* what) {
  std::ofstream file(path, std::ios::binary);
  if (!file.write(static_cast<const char*>(data), static_cast<std::streamsize>(size))) {
    return std::string("cannot write ") + what + " to '" + path + "'";
  }
  return std::nullopt;
}

std::string shape_of(const at::Tensor& tensor) {
  std::string text;
  for (int64_t d = 0; d < tensor.dim(); ++d) {
    text += (d ? ", " : "") + std::to_string(tensor.size(d));
  }
  return text;
}

// The package's model, loaded after the op libraries. A custom op that no loaded library registers fails the load
// (the proxy executor resolves every op up front): that error gets the fix added.
std::optional<std::string> load(const CommandLine& options,
                                std::unique_ptr<torch::inductor::AOTIModelPackageLoader>& loader) {
  for (const auto& path : options.op_libraries) {
    if (dlopen(path.c_str(), RTLD_NOW | RTLD_GLOBAL) == nullptr) {
      return "cannot load op library '" + path + "': " + dlerror();
    }
  }
  try {
    loader = std::make_unique<torch::inductor::AOTIModelPackageLoader>(options.program);
  } catch (const std::exception& err) {
    std::string message = err.what();
    message = message.substr(0, message.find('\n'));
    const std::string missing = "Could not find schema for ";
    if (message.rfind(missing, 0) == 0) {
      // "my_ops::rms_norm." (an op made with torch.library.custom_op: more text follows)
      std::string op = message.substr(missing.size());
      op = op.substr(0, op.find(' '));
      op = op.substr(0, op.find_last_not_of('.') + 1);
      const std::string name = op.substr(op.find("::") == std::string::npos ? 0 : op.find("::") + 2);
      return "the package '" + options.program + "' calls " + op + " but no loaded library registers it. Pass " +
          "--op_library with the library that does: libcustom_ops_aot_lib.so (ops registered from C++) or " +
          "libcustom_ops_without_python.so (ops registered from Python, from their without_python_sources), built " +
          "by `bash test_custom_ops.sh aoti`. An op registered from Python with no without_python_sources is in " +
          "neither: write ops/" + name + "/" + name + "_without_python.cpp (its schemas and CPU kernel, registered " +
          "from C++) and list it as without_python_sources in custom_ops.bzl (docs/adding-an-op.md)";
    }
    return "cannot load the package '" + options.program + "': " + message;
  }
  return std::nullopt;
}

std::optional<std::string> run_inputs(torch::inductor::AOTIModelPackageLoader& loader, const CommandLine& options) {
  std::vector<at::Tensor> inputs, outputs;
  double total_us = 0;
  for (uint64_t run = 0; run < options.num_executions; ++run) {
    if (!options.inputs.empty()) {
      if (auto err = read_inputs(options, options.inputs[run % options.inputs.size()], inputs)) {
        return err;
      }
    }
    const auto start = std::chrono::steady_clock::now();
    outputs = loader.run(inputs);
    total_us += std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start).count();
  }
  if (!options.outputs.empty() && options.outputs.size() != outputs.size()) {
    return "--outputs names " + std::to_string(options.outputs.size()) + " file(s) but the package returns " +
        std::to_string(outputs.size()) + " output(s)";
  }
  for (size_t i = 0; i < outputs.size(); ++i) {
    const at::Tensor output = outputs[i].contiguous();
    std::printf("Output %zu: %s[%s]\n", i, c10::toString(output.scalar_type()), shape_of(output).c_str());
    if (!options.outputs.empty()) {
      if (auto err = write_file(options.outputs[i], output.const_data_ptr(), output.nbytes(), "an output")) {
        return err;
      }
    }
  }
  std::printf("Average execution: %.3f us over %" PRIu64 " execution(s)\n", total_us / options.num_executions,
              options.num_executions);
  return std::nullopt;
}

// Greedy decoding: prefill at position 0, then new_tokens - 1 steps of one token; times prefill and decode apart.
std::optional<std::string> decode(torch::inductor::AOTIModelPackageLoader& loader, const CommandLine& options) {
  // A token outside the vocabulary must be refused here: the package's embedding checks its index inside an OpenMP
  // region, where the exception it throws aborts the process. The vocabulary size comes from the package.
  const auto metadata = loader.get_metadata();
  const auto vocab_entry = metadata.find("vocab");
  if (vocab_entry == metadata.end() || vocab_entry->second.empty() ||
      vocab_entry->second.find_first_not_of("0123456789") != std::string::npos || vocab_entry->second.size() > 9) {
    return "the package has no vocabulary size in its metadata ('vocab'), which decoding needs to check the prompt; "
           "package it with inductor_configs={'aot_inductor.metadata': {'vocab': '<size>'}} (flow/aoti.py does)";
  }
  const int64_t vocab_size = std::stoll(vocab_entry->second);
  for (int64_t token : options.prompt) {
    if (token >= vocab_size) {
      return "prompt token " + std::to_string(token) + " is outside the vocabulary [0, " + std::to_string(vocab_size) +
          ")";
    }
  }
  std::vector<int64_t> generated;
  std::vector<float> logits;
  double prefill_total = 0, decode_total = 0;
  for (uint64_t run = 0; run < options.num_executions; ++run) {
    generated.clear();
    logits.clear();
    std::vector<int64_t> step_tokens = options.prompt;
    int64_t position = 0;
    double prefill_us = 0, decode_us = 0;
    for (uint64_t step = 0; step < options.new_tokens; ++step) {
      std::vector<at::Tensor> inputs = {
          at::tensor(step_tokens, at::kLong).reshape({1, static_cast<int64_t>(step_tokens.size())}),
          at::tensor(std::vector<int64_t>{position}, at::kLong)};
      const auto start = std::chrono::steady_clock::now();
      std::vector<at::Tensor> outputs = loader.run(inputs);
      (step == 0 ? prefill_us : decode_us) +=
          std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start).count();
      if (outputs.size() != 1 || outputs[0].scalar_type() != at::kFloat || outputs[0].dim() != 2 ||
          outputs[0].size(0) != 1) {
        return "step " + std::to_string(step) + " returned no float32 logits [1, vocab]; decoding needs a model "
               "taking (tokens int64 [1, T], input_pos int64 [1]) and returning the last position's logits";
      }
      const at::Tensor row = outputs[0].contiguous();
      const float* values = row.const_data_ptr<float>();
      const int64_t vocab = row.size(1);
      if (!custom_ops_runner::take_greedy_token(values, vocab, options.logits_path.empty() ? nullptr : &logits,
                                                generated)) {
        return "step " + std::to_string(step) + " (position " + std::to_string(position) + ") produced NaN logits";
      }
      position += static_cast<int64_t>(step_tokens.size());
      step_tokens = {generated.back()};
    }
    prefill_total += prefill_us;
    decode_total += decode_us;
    if (options.num_executions > 1) {
      std::printf("Generation %" PRIu64 ": prefill %.3f us, decode %.3f us\n", run + 1, prefill_us, decode_us);
    }
  }
  if (!options.logits_path.empty()) {
    if (auto err = write_file(options.logits_path, logits.data(), logits.size() * sizeof(float), "logits")) {
      return err;
    }
  }
  custom_ops_runner::print_decode_summary(generated, options.prompt.size(), options.new_tokens, prefill_total,
                                          decode_total, options.num_executions);
  return std::nullopt;
}

} // namespace

int main(int argc, char** argv) {
  CommandLine options;
  if (auto err = custom_ops_runner::parse_command_line(argc, argv, Runner::kAotInductor, options)) {
    std::fputs(custom_ops_runner::usage(Runner::kAotInductor).c_str(), stderr);
    return fail(*err, 2);
  }
  if (options.help) {
    std::fputs(custom_ops_runner::usage(Runner::kAotInductor).c_str(), stdout);
    return 0;
  }
  // A package checks its inputs' dtypes, shapes and strides only when this is set (read once, at the first run);
  // unchecked, an input of another shape is read past its end.
  setenv("AOTI_RUNTIME_CHECK_INPUTS", "1", /*overwrite=*/1);
  std::unique_ptr<torch::inductor::AOTIModelPackageLoader> loader;
  if (auto err = load(options, loader)) {
    return fail(*err);
  }
  try {  // the kernels' checks throw c10::Error, as they do in PyTorch
    if (auto err = options.prompt.empty() ? run_inputs(*loader, options) : decode(*loader, options)) {
      return fail(*err);
    }
  } catch (const std::exception& err) {
    const std::string message = err.what();
    return fail("running the package failed: " + message.substr(0, message.find('\n')));
  }
  return 0;
}
