#!/usr/bin/env bash
# Drives the whole custom-op flow for every op declared in custom_ops.bzl: build (select -> generate -> compile) ->
# register with PyTorch -> export (.pte) -> run -> verify against the op's ATen reference. This script makes the venv
# and hands each mode to its Python entry point: flow/modes.py (the op machinery's modes), models/model_modes.py (the
# model layer's), benchmark/bench.py and pytest. On first use it creates .venv/ with the pins from pyproject.toml; later
# runs reuse it (and reinstall when the pins change).
#
#   bash test_custom_ops.sh cmake [NAME...]   each declared op's flow (or the named ones: mul3, my_ops::mul4, ...)
#   bash test_custom_ops.sh buck2 [NAME...]   the same flows built with Buck2; without buck2 on PATH: the graph check
#                                             (tests/buck2_graph.py), then exit 3 saying buck2 itself did not run
#   bash test_custom_ops.sh aarch64 [NAME...] the flows cross-compiled for 64-bit ARM, run under qemu-aarch64
#   bash test_custom_ops.sh profile [NAME]    ETDump + ETRecord + Inspector: per-op times in a program calling every op
#                                             (or NAME's example; NAME decoder or decoder_q8: the model, decoding,
#                                             XNNPACK's ops included), every op of every execution checked
#   bash test_custom_ops.sh model [ARGS]      the ops in a real model: examples/decoder.py (XNNPACK-lowered,
#                                             float32 and 8-bit) decoded token by token in the runner and the
#                                             Python runtime vs eager
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
#                                             bench real: SmolLM2-135M vs optimum-executorch and llama.cpp
#                                             (--llama_cpp_only: llama.cpp alone, no peer environment), and
#                                             bench presets: the GGUF presets vs llama.cpp at 1 and all threads
#                                             bench scale: GGUF files of 135M to 8B parameters (the 1B and 8B
#                                             shapes made once into ~/.cache/my_ops/scale) exported and decoded
#                                             beside llama.cpp: time, memory, read bound, KL divergence
#                                             (real, presets, scale: --isa avx2 runs both sides' AVX2 code)
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

# ---- Environment ----------------------------------------------------------------------------------------------------
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

# ---- Modes ----------------------------------------------------------------------------------------------------------
mode_test() {
  cd "${REPO_ROOT}"
  if [[ "${1:-}" == quick ]]; then  # the developer's loop (tests/conftest.py QUICK); the full suite is the contract
    shift
    set -- --quick "$@"
  fi
  exec "${PYTHON}" -m pytest "$@"
}

# run_mode MODULE MODE [ARGS]: `python -m MODULE MODE [ARGS]` with this checkout first on the path, wherever the shell
# stands (`python -m` puts the working directory first, which may be another checkout).
run_mode() {
  exec "${PYTHON}" -c 'import runpy, sys
sys.path[0] = sys.argv.pop(1)
runpy.run_module(sys.argv.pop(1), run_name="__main__", alter_sys=True)' "${REPO_ROOT}" "$@"
}

case "${1:-}" in
  cmake|buck2|aarch64|wheel|doctor) ensure_venv; use_venv; run_mode flow.modes "$@" ;;
  model|hf|real|aoti|profile) ensure_venv; use_venv; run_mode models.model_modes "$@" ;;
  bench) shift; ensure_venv; use_venv; exec "${PYTHON}" "${REPO_ROOT}/benchmark/bench.py" "$@" ;;
  test) shift; ensure_venv; use_venv; mode_test "$@" ;;
  *) usage ;;
esac
