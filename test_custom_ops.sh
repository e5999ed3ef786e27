#!/usr/bin/env bash
# Drives the whole custom-op flow for every op declared in custom_ops.bzl: build (select -> generate -> compile) ->
# register with PyTorch -> export (.pte) -> run -> verify against the op's ATen reference. The machinery is the Python
# package flow/ (python -m flow.<module>). On first use it creates .venv/ with the pins from pyproject.toml; later runs
# reuse it (and reinstall when the pins change).
#
#   bash test_custom_ops.sh cmake [NAME...]   each declared op's flow (or the named ones: mul3, my_ops::mul4, ...)
#   bash test_custom_ops.sh buck2 [NAME...]   the same flows built with Buck2; without buck2 on PATH: the graph check
#                                             (tests/buck2_graph.py), then exit 3 saying buck2 itself did not run
#   bash test_custom_ops.sh aarch64 [NAME...] the flows cross-compiled for 64-bit ARM, run under qemu-aarch64
#   bash test_custom_ops.sh profile [NAME]    ETDump + ETRecord + Inspector: per-op times in a program calling every op
#                                             (or NAME's example; NAME decoder or decoder_q8: the model, decoding,
#                                             XNNPACK's ops included), every op of every execution checked
#   bash test_custom_ops.sh model [ARGS]      the ops in a real model: examples/decoder.py (XNNPACK-lowered,
#                                             float32 and 8-bit) decoded token by token in the runner and the Python runtime vs eager
#   bash test_custom_ops.sh hf [ARGS]         models no one here wrote: tiny Hugging Face Llama and Qwen3 checkpoints
#                                             put on my_ops (my_ops/hf/), exported (float32, 8-bit), decoded in a
#                                             runner selected from the programs and in the Python runtime vs
#                                             transformers (ARGS: --models llama,qwen3)
#   bash test_custom_ops.sh real [ARGS]       a real pretrained model: SmolLM2-135M-Instruct (a GGUF file from PyPI)
#                                             on my_ops at float32, 8da8w and 8da4w (my_ops.hf), decoded in the runner,
#                                             the Python runtime and ExecuTorch's LLM runner vs transformers, with each
#                                             program's perplexity (ARGS: --precisions float32,8da8w,8da4w); then
#                                             llama-quantize's presets of the file (Q4_K_M, ...) on their own tensors,
#                                             perplexity beside llama-perplexity's (builds llama.cpp once)
#   bash test_custom_ops.sh aoti              the peer path: every example and the decoder packaged with AOTInductor,
#                                             run from C++ without Python (custom_ops_aoti_runner), checked vs eager
#   bash test_custom_ops.sh wheel             the my_ops wheel (setup.py: C++ AOT ops + Python registrations) in dist/
#   bash test_custom_ops.sh test [ARGS]       the whole test suite (pytest; ARGS go to pytest)
#   bash test_custom_ops.sh test quick [ARGS] the developer's loop: the PyTorch side, codegen, one runner flow, the
#                                             verifier's machinery (tests/conftest.py QUICK) and every op's own tests
#                                             (ops/<name>/test_*.py), minutes once built
#   bash test_custom_ops.sh doctor            versions and the paths the build will use
#   bash test_custom_ops.sh bench [ARGS]      the kernels vs ExecuTorch's aten::mul.out and memcpy (benchmark/);
#                                             bench rms_norm: rms_norm vs the same math in ATen ops;
#                                             bench decoder: the decoder's tokens/s, custom vs ATen ops, XNNPACK, 8-bit
#                                             bench attention: sdpa_with_cache vs ATen ops and llama::custom_sdpa
#                                             bench hf: my_ops.hf vs optimum-executorch on the same checkpoints
#                                             bench real: SmolLM2-135M vs optimum-executorch and llama.cpp, and
#                                             bench presets: the GGUF presets vs llama.cpp at 1 and all threads
#                                             (real, presets: --isa avx2 runs both sides' AVX2 code)
#                                             bench aoti: the decoder in ExecuTorch vs AOTInductor (speed, memory,
#                                             size, start)
#                                             bench ceiling: the CPU's multiply-add peak beside linear_blocks' prefill
#                                             (CUSTOM_OPS_ISA=avx2 for the AVX2 code)
set -euo pipefail

REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
VENV="${REPO_ROOT}/.venv"
PYTHON="${VENV}/bin/python"
BUILD_ROOT="${REPO_ROOT}/cmake-out"

usage() {  # the modes listed in the header above
  sed -n '/^#   bash test_custom_ops.sh/,/^set -euo/p' "${BASH_SOURCE[0]}" | grep '^#' | sed 's/^#//' >&2
  exit 2
}

step() { printf '\n\033[1m==> %s\033[0m\n' "$*"; }
die() { echo "error: $*" >&2; exit 1; }

# ---- Environment ------------------------------------------------------------------------------------------------------
# Installs [project].dependencies of pyproject.toml into .venv/. A stamp holding the hash of pyproject.toml makes
# reruns free and re-installs when the pins change.
ensure_venv() {
  local stamp="${VENV}/.pins.sha256" want
  want="$(sha256sum "${REPO_ROOT}/pyproject.toml" | cut -d' ' -f1)"
  if [[ -x "${PYTHON}" && -f "${stamp}" && "$(cat "${stamp}")" == "${want}" ]]; then
    return
  fi
  local base_python="${PYTHON_FOR_VENV:-python3}"
  command -v "${base_python}" >/dev/null || die "python3 not found; install Python 3.10+ (or set PYTHON_FOR_VENV)"
  step "Creating ${VENV} with the pins from pyproject.toml (first run: a few minutes)"
  [[ -x "${PYTHON}" ]] || "${base_python}" -m venv "${VENV}"
  local requirements="${VENV}/requirements.txt"
  "${PYTHON}" "${REPO_ROOT}/tools/pyproject_pins.py" "${REPO_ROOT}/pyproject.toml" > "${requirements}"
  local log="${VENV}/pip-install.log"
  # torch first, alone: the pin resolves to the CPU wheel and executorch then keeps it.
  "${PYTHON}" "${REPO_ROOT}/tools/pyproject_pins.py" "${REPO_ROOT}/pyproject.toml" no-deps > "${VENV}/no-deps.txt"
  if ! { "${PYTHON}" -m pip install --quiet "$(grep '^torch==' "${requirements}")" &&
         "${PYTHON}" -m pip install --quiet -r "${requirements}" &&
         "${PYTHON}" -m pip install --quiet --no-deps -r "${VENV}/no-deps.txt"; } >"${log}" 2>&1; then
    tail -n 30 "${log}" >&2
    die "installing the pins failed (full log: ${log})"
  fi
  echo "${want}" > "${stamp}"
}

# Run the venv's tools (cmake, ninja, ccache from PyPI) ahead of the system's. One compiler cache for every build tree
# (cmake/CompilerCache.cmake) and one of codegen output (codegen/run_codegen.py generate), the copies of the repository
# the tests make included: they inherit CCACHE_DIR and CUSTOM_OPS_CODEGEN_CACHE.
use_venv() {
  export PATH="${VENV}/bin:${PATH}"
  export PYTHONPATH="${REPO_ROOT}${PYTHONPATH:+:${PYTHONPATH}}"
  export CCACHE_DIR="${CCACHE_DIR:-${BUILD_ROOT}/ccache}"
  export CUSTOM_OPS_CODEGEN_CACHE="${CUSTOM_OPS_CODEGEN_CACHE:-${BUILD_ROOT}/codegen-cache}"
}

# ---- CMake flow ---------------------------------------------------------------------------------------------------
# cmake_build <build dir> <cmake args...>: configure (once) and build one variant of the runtime side. The lock keeps
# two builds of one directory (the tests run in parallel) from interleaving.
cmake_build() {
  local build_dir="$1" lock; shift
  mkdir -p "${build_dir}"
  exec {lock}>"${build_dir}/.build.lock"
  flock "${lock}"
  if ! cmake -S "${REPO_ROOT}" -B "${build_dir}" -G Ninja -DPython3_EXECUTABLE="${PYTHON}" "$@" \
      >"${build_dir}/configure.log" 2>&1; then
    cat "${build_dir}/configure.log" >&2
    die "configuring ${build_dir} failed"
  fi
  cmake --build "${build_dir}" -j "$(nproc)"
  exec {lock}>&-
}

# One op's flow. Arguments: a line of `python -m flow.declarations list` (short name, name, example program,
# registered_from, the module or sources that register it, runtime_registration, out variant).
run_flow_cmake() {
  local short="$1" name="$2" program="$3" origin="$4" where="$5" out_variant="$7"
  local build_dir="${BUILD_ROOT}/${program}" pte="${REPO_ROOT}/${program}.pte"
  local built="the kernels and runner"
  [[ "${origin}" == cpp ]] && built="the kernels, runner and libcustom_ops_aot_lib.so (${where} + kernels in ATen mode)"
  step "${short} 1/4: select ${out_variant}, generate its registration, build ${built} (CMakeLists.txt)"
  cmake_build "${build_dir}" "-DCUSTOM_OPS_ROOT_OPS=${out_variant}"

  local registered="register ${name} with PyTorch from Python (${where})"
  [[ "${origin}" == cpp ]] && registered="register ${name} with PyTorch from C++ (${where})"
  [[ "${origin}" == aten ]] && registered="${name} is PyTorch's own"
  step "${short} 2/4: ${registered}, export ${program}.pte (flow/export.py)"
  "${PYTHON}" -m flow.export --op "${name}" --output_dir "${REPO_ROOT}" \
    --aot_library "${build_dir}/libcustom_ops_aot_lib.so"

  step "${short} 3/4: run ${program}.pte in ${build_dir#"${REPO_ROOT}"/}/custom_ops_executor_runner on its default \
inputs, every element 1 (a smoke run: step 4 feeds the example's inputs and checks them)"
  "${build_dir}/custom_ops_executor_runner" --model_path="${pte}"

  step "${short} 4/4: the example's inputs through the runner and the Python runtime, checked against the op's ATen \
reference, executed 3 times (flow/verify.py)"
  "${PYTHON}" -m flow.verify --pte "${pte}" --runner "${build_dir}/custom_ops_executor_runner" \
    --kernel_library "${build_dir}/libcustom_ops_lib.so"
}

# The declared ops to run: all, or those named (a short name like mul3, or namespace::name).
selected_ops() {
  local all
  all="$("${PYTHON}" -m flow.declarations list)" || die "custom_ops.bzl could not be read (see above)"
  if [[ $# -eq 0 ]]; then
    echo "${all}"
    return
  fi
  local name line found
  for name in "$@"; do
    found=""
    while IFS=$'\t' read -r -a line; do
      if [[ "${line[0]}" == "${name}" || "${line[1]}" == "${name}" ]]; then
        found="$(IFS=$'\t'; echo "${line[*]}")"
      fi
    done <<< "${all}"
    [[ -n "${found}" ]] || die "no op '${name}' is declared in custom_ops.bzl; declared: $(cut -f1 <<< "${all}" | tr '\n' ' ')"
    echo "${found}"
  done
}

# ---- Modes ----------------------------------------------------------------------------------------------------------
# run_flows <flow function> <what> [NAME...]: the flow of each selected op, then one line saying they all passed.
run_flows() {
  local flow="$1" what="$2" ops names=() op
  shift 2
  ops="$(selected_ops "$@")"
  while IFS=$'\t' read -r -a op; do
    "${flow}" "${op[@]}"
    names+=("${op[0]}")
  done <<< "${ops}"
  step "All ${what} passed: ${names[*]} match their references"
}

# The same kernels linked as apps and firmware link them (CMakeLists.txt, 4b): a static archive linked whole, and an
# archive generated with --manual_registration whose runner calls register_all_kernels(); every example the flows
# exported checked in both runners (the manual one on ops codegen registers: an op that registers itself from its
# source needs its object linked, docs/adding-an-op.md). One verifier process per AOT library: a C++ op's is its flow's.
# Part of the whole `cmake` run; one op's flow (`cmake NAME`, the edit loop) leaves it out.
run_link_variants() {
  local build_dir="${BUILD_ROOT}/linked_as_archives" groups=() op key group args
  while IFS=$'\t' read -r -a op; do
    key="${op[5]}|"
    [[ "${op[3]}" == cpp ]] && key+="${BUILD_ROOT}/${op[2]}/libcustom_ops_aot_lib.so"
    groups+=("${key}|${REPO_ROOT}/${op[2]}.pte")
  done <<< "$(selected_ops)"
  step "Link the kernels as a static archive (linked whole) and with manual registration (${build_dir#"${REPO_ROOT}"/})"
  # Every declared op (an empty selection, set so a selection cached in the tree does not stay).
  cmake_build "${build_dir}" -DCUSTOM_OPS_LINK_VARIANTS=ON -DCUSTOM_OPS_BUILD_AOT_LIBRARY=OFF -DCUSTOM_OPS_ROOT_OPS=
  step "Each example in the whole-archive runner and, registered by codegen, the manual-registration one (flow/verify.py)"
  while IFS= read -r key; do
    IFS='|' read -r -a group <<< "${key}"
    args=(--runner "${build_dir}/custom_ops_executor_runner_whole_archive")
    [[ "${group[0]}" == codegen ]] && args+=(--runner "${build_dir}/custom_ops_executor_runner_manual")
    [[ -n "${group[1]:-}" ]] && args+=(--aot_library "${group[1]}")
    while IFS='|' read -r -a op; do
      args+=(--pte "${op[2]}")
    done < <(printf '%s\n' "${groups[@]}" | grep -F "${key}|")
    "${PYTHON}" -m flow.verify "${args[@]}"
  done < <(printf '%s\n' "${groups[@]}" | cut -d'|' -f1,2 | sort -u)
}

mode_cmake() {
  ensure_venv
  use_venv
  run_flows run_flow_cmake flows "$@"
  [[ $# -gt 0 ]] || run_link_variants
}

# Exit code of `buck2` mode when buck2 is not on PATH: the graph check ran (and passed), buck2 itself did not.
readonly EXIT_BUCK2_NOT_RUN=3

# One op's flow with buck2: build its runner (and AOT library), export, run, verify.
run_flow_buck2() {
  local short="$1" name="$2" program="$3" origin="$4"
  local targets=("//:custom_ops_executor_runner_${short}") outputs runner aot=""
  [[ "${origin}" == cpp ]] && targets+=("//:custom_ops_aot_lib_${short}[shared]")
  step "${short} 1/4: buck2 build ${targets[*]}"
  outputs="$(buck2 build --show-full-output "${targets[@]}")" || die "buck2 build ${targets[*]} failed"
  runner="$(awk -v t=":custom_ops_executor_runner_${short}" '$1 ~ t"$" {print $2}' <<< "${outputs}")"
  [[ "${origin}" == cpp ]] && aot="$(awk -v t=":custom_ops_aot_lib_${short}\\[shared\\]" '$1 ~ t"$" {print $2}' <<< "${outputs}")"
  [[ -x "${runner}" ]] || die "buck2 printed no runner for ${short}:\n${outputs}"

  step "${short} 2/4: register ${name} with PyTorch, export ${program}.pte (flow/export.py)"
  "${PYTHON}" -m flow.export --op "${name}" --output_dir "${REPO_ROOT}" ${aot:+--aot_library "${aot}"}

  step "${short} 3/4: run ${program}.pte in the buck2-built runner on its default inputs, every element 1 (a smoke run)"
  "${runner}" --model_path="${REPO_ROOT}/${program}.pte"

  step "${short} 4/4: the example's inputs through the runner, checked against the op's ATen reference (flow/verify.py)"
  "${PYTHON}" -m flow.verify --pte "${REPO_ROOT}/${program}.pte" --runner "${runner}" \
    ${aot:+--aot_library "${aot}"}
}

mode_buck2() {
  ensure_venv
  use_venv
  # Where the wheels are, for TARGETS (read_config): written here, never committed.
  "${PYTHON}" "${REPO_ROOT}/tools/buckconfig_local.py" > "${REPO_ROOT}/.buckconfig.local"
  cd "${REPO_ROOT}"
  if ! command -v buck2 >/dev/null 2>&1; then
    step "buck2 is not on PATH: checking the Buck2 graph without it (tests/buck2_graph.py)"
    # Ops named on the command line: only their own targets built and run (every target still checked).
    "${PYTHON}" "${REPO_ROOT}/tests/buck2_graph.py" ${1:+--ops "$(IFS=,; echo "$*")"} ||
      die "the Buck2 graph check failed (see above)"
    echo "error: buck2 itself was NOT run: it is not on PATH. The check above evaluated TARGETS with starlark-rust," \
      "checked every attribute against the prelude, executed the graph as buck2 would and verified every example," \
      "but only buck2 builds it for real. Get buck2 from https://github.com/facebook/buck2/releases" \
      "(buck2-x86_64-unknown-linux-musl.zst: zstd -d, chmod +x, put it on PATH), then rerun" \
      "'bash test_custom_ops.sh buck2'." >&2
    exit "${EXIT_BUCK2_NOT_RUN}"
  fi
  # The daemon keeps the environment it started with: restart it so it sees this venv.
  buck2 kill >/dev/null 2>&1 || true
  run_flows run_flow_buck2 "buck2 flows" "$@"
}

# ---- ARM64: cross-compiled runtime side, run under emulation ---------------------------------------------------------
readonly QEMU_AARCH64=(qemu-aarch64 -L /usr/aarch64-linux-gnu)

# The executorch wheel for manylinux aarch64, of the version installed here (the .pte format and codegen must match):
# downloaded once and unpacked, not installed, under cmake-out/aarch64/. Prints its package directory.
aarch64_executorch_package() {
  local version wheels site
  version="$("${PYTHON}" -c 'import importlib.metadata as m; print(m.version("executorch"))')"
  wheels="${BUILD_ROOT}/aarch64/wheels"
  site="${BUILD_ROOT}/aarch64/site-executorch-${version}"
  if [[ ! -f "${site}/.unpacked" ]]; then
    "${PYTHON}" -m pip download --quiet --no-deps --platform manylinux_2_28_aarch64 --only-binary=:all: \
      --python-version "$("${PYTHON}" -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')" \
      "executorch==${version}" -d "${wheels}" >&2 || die "could not download the aarch64 executorch ${version} wheel"
    rm -rf "${site}"
    "${PYTHON}" -m zipfile -e "$(ls "${wheels}"/executorch-"${version}"-*aarch64*.whl | head -n1)" "${site}" ||
      die "could not unpack the aarch64 executorch wheel"
    touch "${site}/.unpacked"
  fi
  echo "${site}/executorch"
}

# ARM64: the selected ops' kernels and one runner cross-compiled once (cmake-out/aarch64/all_ops); every example
# exported on this machine in one process, each run under qemu, then all verified in one process (one runner and one
# AOT library serve them all). The host's combined build (cmake-out/all_ops) gives PyTorch here the C++-registered ops.
# $1: the selected ops, as selected_ops prints them.
run_flows_aarch64() {
  local ops="$1" runner="${BUILD_ROOT}/aarch64/all_ops/custom_ops_executor_runner" names=() exports=() ptes=() op
  local aot=(--aot_library "${BUILD_ROOT}/all_ops/libcustom_ops_aot_lib.so")
  while IFS=$'\t' read -r -a op; do
    names+=("${op[0]}") exports+=(--op "${op[1]}") ptes+=(--pte "${REPO_ROOT}/${op[2]}.pte")
  done <<< "${ops}"
  step "1/3: export the examples of ${names[*]} on this machine (flow/export.py)"
  "${PYTHON}" -m flow.export "${exports[@]}" --output_dir "${REPO_ROOT}" "${aot[@]}"
  while IFS=$'\t' read -r -a op; do
    step "2/3: run ${op[2]}.pte (${op[0]}) in the aarch64 runner under ${QEMU_AARCH64[*]}"
    "${QEMU_AARCH64[@]}" "${runner}" --model_path="${REPO_ROOT}/${op[2]}.pte"
  done <<< "${ops}"
  step "3/3: each example's inputs through the aarch64 runner, checked against its op's ATen reference here \
(flow/verify.py)"
  "${PYTHON}" -m flow.verify "${ptes[@]}" --runner "${runner}" --emulator "${QEMU_AARCH64[*]}" "${aot[@]}"
  step "All aarch64 flows (under qemu-aarch64) passed: ${names[*]} match their references"
}

mode_aarch64() {
  ensure_venv
  use_venv
  bash "${REPO_ROOT}/tools/require_packages.sh" g++-aarch64-linux-gnu qemu-user ||
    die "the ARM64 flow needs the GNU cross toolchain and qemu-user (see above)"
  AARCH64_EXECUTORCH="$(aarch64_executorch_package)"
  local selected ops
  selected="$(selected_ops "$@")"
  ops="$(cut -f7 <<< "${selected}" | paste -sd, -)"
  step "Cross-compile the kernels of ${ops} and the runner for aarch64 into cmake-out/aarch64/all_ops; build this \
machine's AOT library (cmake-out/all_ops)"
  cmake_build "${BUILD_ROOT}/aarch64/all_ops" --toolchain "${REPO_ROOT}/cmake/aarch64-linux-gnu.toolchain.cmake" \
    -DEXECUTORCH_PACKAGE_DIR="${AARCH64_EXECUTORCH}" -DCUSTOM_OPS_BUILD_AOT_LIBRARY=OFF "-DCUSTOM_OPS_ROOT_OPS=${ops}"
  cmake_build "${BUILD_ROOT}/all_ops" >/dev/null
  run_flows_aarch64 "${selected}"
}

mode_profile() {
  ensure_venv
  use_venv
  [[ $# -le 1 ]] || die "profile takes at most one op or model name"
  local op=() build_dir="${BUILD_ROOT}/all_ops" line
  if [[ $# -eq 1 ]] && "${PYTHON}" -c 'import sys; from models.example_decoder import VARIANTS
sys.exit(sys.argv[1] not in VARIANTS)' "$1" 2>/dev/null; then  # a variant of the example model, decoding, all ops
    step "Build every declared op's kernels, the runner and the AOT library (cmake-out/all_ops)"
    cmake_build "${build_dir}" >/dev/null
    step "Export ${1} with an ETRecord, decode once with an ETDump and a debug buffer, inspect \
(models/example_decoder.py)"
    "${PYTHON}" -m models.example_decoder --build_dir "${build_dir}" --profile "$1"
    return
  elif [[ $# -eq 1 ]]; then  # that op's example, in the op's own build (the one `cmake NAME` makes)
    IFS=$'\t' read -r -a line <<< "$(selected_ops "$1")"
    op=(--op "${line[1]}")
    build_dir="${BUILD_ROOT}/${line[2]}"
    step "Build ${line[1]}'s kernels, the runner and the AOT library (${build_dir#"${REPO_ROOT}"/})"
    cmake_build "${build_dir}" "-DCUSTOM_OPS_ROOT_OPS=${line[6]}" >/dev/null
  else
    step "Build every declared op's kernels, the runner and the AOT library (cmake-out/all_ops)"
    cmake_build "${build_dir}" >/dev/null
  fi
  step "Export with an ETRecord, run with an ETDump and a debug buffer, inspect (flow/profile.py)"
  "${PYTHON}" -m flow.profile --build_dir "${build_dir}" "${op[@]}"
}

mode_model() {
  ensure_venv
  use_venv
  local build_dir="${BUILD_ROOT}/all_ops"
  step "Build every declared op's kernels, the runner (with the XNNPACK delegate and the quantized kernels) and the \
AOT library (${build_dir#"${REPO_ROOT}"/})"
  cmake_build "${build_dir}" >/dev/null
  step "Export the decoder (examples/decoder.py) with its linear layers on XNNPACK, check the runner has every \
operator and backend it needs, decode in the runner and the Python runtime, compare with eager \
(models/example_decoder.py)"
  "${PYTHON}" -m models.example_decoder --build_dir "${build_dir}" "$@"
  step "The decoder's tokens match eager in the runner and the Python runtime"
}

mode_hf() {
  ensure_venv
  use_venv
  local build_dir="${BUILD_ROOT}/all_ops" out="${BUILD_ROOT}/hf"
  step "Build every declared op's AOT library (the export registers the ops from it) (${build_dir#"${REPO_ROOT}"/})"
  cmake_build "${build_dir}" >/dev/null
  step "Make tiny Llama, Qwen3 and Gemma 3 checkpoints (examples/hf_models.py), load them with from_pretrained, put \
them on my_ops and export float32 and 8-bit programs (my_ops/hf/) into ${out#"${REPO_ROOT}"/}"
  "${PYTHON}" -m models.hf_checkpoints export --build_dir "${build_dir}" --output_dir "${out}" "$@"
  local programs
  programs=$(ls "${out}"/*.pte | paste -sd, -)
  step "Build the runner with the custom ops the programs call (selective build from ${out#"${REPO_ROOT}"/}/*.pte)"
  cmake_build "${out}/runner" "-DCUSTOM_OPS_MODEL_FILE=${programs}" -DCUSTOM_OPS_BUILD_AOT_LIBRARY=OFF >/dev/null
  step "Decode each program twice in the runner and twice in the Python runtime; compare with transformers \
(models/hf_checkpoints.py)"
  "${PYTHON}" -m models.hf_checkpoints check --build_dir "${build_dir}" --runner_dir "${out}/runner" \
    --output_dir "${out}" "$@"
  step "The Hugging Face models' tokens match transformers in the runner and the Python runtime"
}

# The real mode's checks (text, perplexity, size, memory against their goals): each one that fails is named, the mode
# goes on to the next, then exits 1 naming every failed check, so one missed goal hides no other result.
REAL_MISSED=()
check_and_go_on() {
  local name="$1"
  shift
  if ! "$@"; then
    echo "error: ${name}: failed (above); the mode goes on and exits 1 at the end" >&2
    REAL_MISSED+=("${name}")
  fi
}

mode_real() {
  ensure_venv
  use_venv
  local build_dir="${BUILD_ROOT}/all_ops" out="${BUILD_ROOT}/real"
  step "Build every declared op's kernels, the runner and the AOT library (${build_dir#"${REPO_ROOT}"/})"
  cmake_build "${build_dir}" >/dev/null
  step "Load SmolLM2-135M-Instruct from its GGUF file (transformers), put it on my_ops at each precision and on its own \
blocks (gguf), export each (my_ops/hf/, cached by source hash) into ${out#"${REPO_ROOT}"/}"
  "${PYTHON}" -m models.real_models export --build_dir "${build_dir}" --output_dir "${out}" "$@"
  step "Decode in the runner, the Python runtime and TextLLMRunner; compare with transformers and the eager quantized \
models; each program's perplexity (models/real_models.py)"
  check_and_go_on "SmolLM2's programs" "${PYTHON}" -m models.real_models check --build_dir "${build_dir}" \
    --output_dir "${out}" --perplexity "$@"
  local gguf
  gguf="$("${PYTHON}" -c 'from models.real_models import gguf_path; print(gguf_path())')"
  step "Text in, text out on the file's own Q4_1 blocks: python -m my_ops.hf generate --model ${gguf##*/} \
--quantize gguf --prompt 'The capital of France is'"
  "${PYTHON}" -m my_ops.hf generate --model "${gguf}" --quantize gguf --prompt "The capital of France is" \
    --max_new_tokens 32 --build_dir "${build_dir}" | tee "${out}/generate.txt"
  check_and_go_on "generate on SmolLM2's file answers Paris (its text: ${out#"${REPO_ROOT}"/}/generate.txt)" \
    grep -q "^The capital of France is Paris" "${out}/generate.txt"
  step "The GGUF files people download: llama-quantize's presets made from the shipped file (llama.cpp built from \
its pinned source once, ~8 min), each exported on its own tensors; perplexity by llama-perplexity's protocol beside \
llama-perplexity's own and the file's float32 model's (models/gguf_presets.py)"
  check_and_go_on "the presets' perplexity and size" "${PYTHON}" -m models.gguf_presets --build_dir "${build_dir}"
  step "The tokenizers my_ops.hf builds from the GGUF files (SmolLM2's, Gemma 3's) give llama-tokenize's ids on the \
examples' texts, whole and line by line (models/tokenizer_check.py)"
  check_and_go_on "the tokenizers" "${PYTHON}" -m models.tokenizer_check
  local gemma3
  gemma3="$("${PYTHON}" -c 'from models.real_models import gemma3_path; print(gemma3_path())')"
  step "A second real model as downloaded: Gemma 3 270M in Q4_K_M (PyPI's chunk packages, assembled under \
${gemma3#"${REPO_ROOT}"/}), exported at each precision and on its own blocks into ${out#"${REPO_ROOT}"/}/gemma3"
  "${PYTHON}" -m models.real_models export --model gemma3 --build_dir "${build_dir}" --output_dir "${out}/gemma3" "$@"
  step "Gemma 3: the same checks, one prompt past its local layers' 512-position window; the gguf program's size and \
peak memory beside the file's (models/real_models.py)"
  check_and_go_on "Gemma 3's programs" "${PYTHON}" -m models.real_models check --model gemma3 \
    --build_dir "${build_dir}" --output_dir "${out}/gemma3" "$@"
  step "Gemma 3's own blocks: perplexity at a context of 1024 (its window slides) beside llama-perplexity's on the \
file (models/gguf_presets.py)"
  check_and_go_on "Gemma 3's perplexity beside llama-perplexity's" "${PYTHON}" -m models.gguf_presets \
    --build_dir "${build_dir}" --presets gemma3
  step "Text in, text out on Gemma 3's own blocks: python -m my_ops.hf generate --model ${gemma3##*/} --quantize gguf \
--prompt 'The capital of France is'"
  "${PYTHON}" -m my_ops.hf generate --model "${gemma3}" --quantize gguf --prompt "The capital of France is" \
    --max_new_tokens 32 --build_dir "${build_dir}" | tee "${out}/gemma3/generate.txt"
  check_and_go_on "generate on Gemma 3's file continues about France (its text: \
${out#"${REPO_ROOT}"/}/gemma3/generate.txt)" grep -q "^The capital of France is .*France" "${out}/gemma3/generate.txt"
  if ((${#REAL_MISSED[@]})); then
    die "the real mode ran every step; these checks failed: $(IFS=';'; echo "${REAL_MISSED[*]}")"
  fi
  step "The real models' programs match their references; every preset and Gemma 3 within 0.5% of \
llama-perplexity; text in, text out: python -m my_ops.hf generate; the tokenizers equal llama.cpp's"
}

# AOTInductor's side, in the build with every op (the ExecuTorch runner it is compared with is there): that build plus
# custom_ops_aoti_runner and the C++ registration of the Python-registered ops. The option stays on in that build.
readonly AOTI_BUILD_DIR="${BUILD_ROOT}/all_ops"
build_aoti() {
  step "Build every declared op's kernels, the runner, libcustom_ops_aot_lib.so, custom_ops_aoti_runner and \
libcustom_ops_without_python.so (${AOTI_BUILD_DIR#"${REPO_ROOT}"/})"
  cmake_build "${AOTI_BUILD_DIR}" -DCUSTOM_OPS_BUILD_AOTI=ON >/dev/null
}

mode_aoti() {
  ensure_venv
  use_venv
  build_aoti
  step "Package each example and examples/decoder.py with AOTInductor (cached per source hash), run them in \
custom_ops_aoti_runner without Python, compare with eager; then without the op libraries (flow/aoti.py, \
models/example_decoder.py)"
  "${PYTHON}" -m flow.aoti --build_dir "${AOTI_BUILD_DIR}"
  "${PYTHON}" -m models.example_decoder --build_dir "${AOTI_BUILD_DIR}" --aoti
  step "Every AOTInductor package matches eager; a missing op library is one error line"
}

mode_wheel() {
  ensure_venv
  use_venv
  step "Build the my_ops wheel into dist/ (setup.py: the AOT library built by CMakeLists.txt in build/aot_library, and the Python registrations)"
  local log="${BUILD_ROOT}/wheel.log"
  mkdir -p "${BUILD_ROOT}"
  # setuptools stages the package in build/lib.*/ and keeps what an earlier build put there: a module since renamed
  # or removed would ship again. build/aot_library (CMake's tree) stays, for the compiler cache.
  rm -rf "${REPO_ROOT}"/build/lib.* "${REPO_ROOT}"/build/bdist.*
  if ! "${PYTHON}" -m pip wheel --no-build-isolation --no-deps "${REPO_ROOT}" -w "${REPO_ROOT}/dist" >"${log}" 2>&1; then
    tail -n 40 "${log}" >&2
    die "building the wheel failed (full log: ${log})"
  fi
  local wheel
  wheel="$(ls -t "${REPO_ROOT}"/dist/my_ops-*.whl | head -n1)"
  echo "Built ${wheel#"${REPO_ROOT}"/} ($(du -k "${wheel}" | cut -f1) KiB). Install it with:" \
    "pip install ${wheel#"${REPO_ROOT}"/}, then 'import my_ops' registers every declared op."
}

mode_test() {
  ensure_venv
  use_venv
  cd "${REPO_ROOT}"
  if [[ "${1:-}" == quick ]]; then  # the developer's loop (tests/conftest.py QUICK); the full suite is the contract
    shift
    set -- --quick "$@"
  fi
  exec "${PYTHON}" -m pytest "$@"
}

# The peer of `bench hf`: optimum-executorch in a venv of its own that sees .venv's packages through a .pth file, so
# torch, ExecuTorch and transformers are the very files the project uses; pip adds only what the peer needs more.
ensure_peer_venv() {
  local peer="${REPO_ROOT}/.venv-peer"
  if [[ -x "${peer}/bin/python" ]] && "${peer}/bin/python" -c "import optimum.exporters.executorch" 2>/dev/null; then
    return
  fi
  step "Creating ${peer}: optimum-executorch 1.1.0 beside this project's pins (the peer of bench hf)"
  "${PYTHON_FOR_VENV:-python3}" -m venv "${peer}"
  local site
  site="$("${peer}/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
  "${PYTHON}" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])' > "${site}/project_venv.pth"
  "${peer}/bin/python" -m pip install -q "optimum-executorch==1.1.0" > "${peer}/pip-install.log" 2>&1 ||
    { cat "${peer}/pip-install.log" >&2; die "installing optimum-executorch into ${peer} failed"; }
}

mode_bench() {
  ensure_venv
  use_venv
  if [[ "${1:-}" == hf ]]; then
    shift
    ensure_peer_venv
    cmake_build "${BUILD_ROOT}/all_ops" >/dev/null
    "${REPO_ROOT}/.venv-peer/bin/python" "${REPO_ROOT}/benchmark/bench_hf.py" --build_dir "${BUILD_ROOT}/all_ops" \
      --runner_dir "${BUILD_ROOT}/all_ops" "$@"
    return
  fi
  if [[ "${1:-}" == real ]]; then
    shift
    ensure_peer_venv
    cmake_build "${BUILD_ROOT}/all_ops" >/dev/null
    cmake_build "${BUILD_ROOT}/bench" -DCUSTOM_OPS_BUILD_BENCHMARK=ON >/dev/null  # memcpy_bandwidth
    PATH="${VENV}/bin:${PATH}" "${REPO_ROOT}/.venv-peer/bin/python" "${REPO_ROOT}/benchmark/bench_real.py" \
      --build_dir "${BUILD_ROOT}/all_ops" --memcpy "${BUILD_ROOT}/bench/memcpy_bandwidth" "$@"
    return
  fi
  if [[ "${1:-}" == presets ]]; then
    shift
    cmake_build "${BUILD_ROOT}/all_ops" >/dev/null
    "${PYTHON}" "${REPO_ROOT}/benchmark/bench_presets.py" --build_dir "${BUILD_ROOT}/all_ops" "$@"
    return
  fi
  if [[ "${1:-}" == aoti ]]; then
    shift
    build_aoti
    "${PYTHON}" "${REPO_ROOT}/benchmark/bench_aoti.py" --build_dir "${AOTI_BUILD_DIR}" "$@"
    return
  fi
  cmake_build "${BUILD_ROOT}/bench" -DCUSTOM_OPS_BUILD_BENCHMARK=ON >/dev/null
  if [[ "${1:-}" == ceiling ]]; then  # the multiply-add peak beside linear_blocks' prefill: [TOKENS] [ROUNDS]
    shift
    "${BUILD_ROOT}/bench/prefill_ceiling" "$@"
    return
  fi
  if [[ "${1:-}" == rms_norm || "${1:-}" == decoder || "${1:-}" == attention ]]; then
    local which="$1"
    shift
    "${PYTHON}" "${REPO_ROOT}/benchmark/bench_${which}.py" --build_dir "${BUILD_ROOT}/bench" "$@"
  else
    "${PYTHON}" "${REPO_ROOT}/benchmark/bench_elementwise.py" --build_dir "${BUILD_ROOT}/bench" "$@"
  fi
}

mode_doctor() {
  ensure_venv
  use_venv
  echo "repository:        ${REPO_ROOT}"
  echo "python:            $("${PYTHON}" -c 'import sys; print(sys.version.split()[0], sys.executable)')"
  "${PYTHON}" - <<'EOF' 2>/dev/null
import importlib.metadata as md, importlib.util as u, os
et = list(u.find_spec("executorch").submodule_search_locations)[0]
torch_dir = list(u.find_spec("torch").submodule_search_locations)[0]
print(f"torch:             {md.version('torch')}  ({torch_dir})")
print(f"executorch:        {md.version('executorch')}  ({et})")
print(f"  include:         {os.path.join(et, 'include')}")
print(f"  lib:             {os.path.join(et, 'lib')}")
print(f"  cmake package:   {os.path.join(et, 'share', 'cmake')}")
print(f"  libraries:       {', '.join(sorted(f for f in os.listdir(os.path.join(et, 'lib')) if f.endswith('.so')))}")
print(f"torch cmake:       {os.path.join(torch_dir, 'share', 'cmake')}")
print(f"torchgen yaml:     {os.path.join(list(u.find_spec('torchgen').submodule_search_locations)[0], 'packaged', 'ATen', 'native')}")
EOF
  echo "cmake:             $(cmake --version | head -n1) ($(command -v cmake))"
  echo "ninja:             $(ninja --version) ($(command -v ninja))"
  echo "c++ compiler:      $(${CXX:-c++} --version | head -n1)"
  echo "build directory:   ${BUILD_ROOT}"
  echo "buck2:             $(command -v buck2 || echo 'not found')"
}

case "${1:-}" in
  cmake) shift; mode_cmake "$@" ;;
  buck2) shift; mode_buck2 "$@" ;;
  aarch64) shift; mode_aarch64 "$@" ;;
  profile) shift; mode_profile "$@" ;;
  model) shift; mode_model "$@" ;;
  hf) shift; mode_hf "$@" ;;
  real) shift; mode_real "$@" ;;
  aoti) mode_aoti ;;
  wheel) mode_wheel ;;
  test) shift; mode_test "$@" ;;
  doctor) mode_doctor ;;
  bench) shift; mode_bench "$@" ;;
  *) usage ;;
esac
