"""The my_ops package: `bash test_custom_ops.sh wheel` builds it (setup.py), it installs into an empty --target
directory, and from outside the repository `import my_ops` registers both ops, which compute what ATen does and export
to a program the runner runs; with the repository's own registrations in the same process nothing registers twice."""

import glob
import os
import subprocess
import sys
import zipfile

import pytest
import torch

from helpers import REPO_ROOT, compile_commands, run_in_fresh_python
from flow import declarations
from flow.compare import mismatches
from flow.runner import run_pte


@pytest.fixture(scope="module")
def wheel(combined_build):
    # After the combined build: setup.py compiles its AOT library with the same commands, so ccache serves every object.
    proc = subprocess.run(["bash", os.path.join(REPO_ROOT, "test_custom_ops.sh"), "wheel"], capture_output=True,
                          text=True, timeout=1800)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    (built,) = [line.split()[1] for line in proc.stdout.splitlines() if line.startswith("Built dist/")]
    return os.path.join(REPO_ROOT, built)


@pytest.fixture(scope="module")
def site(wheel, tmp_path_factory):
    target = tmp_path_factory.mktemp("site")
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target", str(target), wheel],
                   check=True, capture_output=True)
    return str(target)


DECLARED = declarations.load()  # every op the package registers, in declaration order
# The package's modules, from the declarations: its own, the shared Python side, and each Python op's module (flat);
# what `import my_ops` imports. The wheel also carries my_ops.gguf and the package my_ops.hf, imported on demand.
PACKAGE_MODULES = sorted({"my_ops", "my_ops._declared", "my_ops.block_layouts", "my_ops.cache_positions",
                          "my_ops.file_cache", "my_ops.torch_compat", "my_ops.vmap_rules",
                          *(f"my_ops.{op.wheel_module}" for op in DECLARED.values() if op.wheel_module)})
HF_MODULES = sorted(os.path.basename(p)[:-3] for p in glob.glob(os.path.join(REPO_ROOT, "my_ops", "hf", "*.py")))
# The checked loader's copies (flow.declarations.WHEEL_SHARED_MODULES beyond what `import my_ops` imports), loaded
# with a program.
LOADER_MODULES = ["runtime", "program", "data_file", "xnnpack_payload", "xnnpack_layout", "lazy_exir", "dtypes",
                  "argument_kinds", "runtime_kernels"]


def test_the_wheel_holds_the_package_and_nothing_else(wheel):
    assert wheel.endswith("-cp310-abi3-linux_x86_64.whl")  # the stable ABI: one wheel for Python 3.10+
    names = set(zipfile.ZipFile(wheel).namelist())
    package = {n for n in names if not n.startswith("my_ops-0.1.0.dist-info/")}
    library = {"my_ops/_C.abi3.so"} if any(op.from_cpp for op in DECLARED.values()) else set()
    modules = {m.replace(".", "/") + ("/__init__.py" if m == "my_ops" else ".py") for m in PACKAGE_MODULES}
    on_demand = {"my_ops/gguf.py", *(f"my_ops/hf/{m}.py" for m in HF_MODULES),
                 *(f"my_ops/{m}.py" for m in LOADER_MODULES)}
    assert package == modules | library | on_demand
    # Stripped: no debug info, no build outputs (with debug info it is tens of MiB). The project's ops make ~450 KiB,
    # each C++ op ~30-60 KiB more (the recipe's copy, with relu6 and scaled_add: 550 KiB).
    assert os.path.getsize(wheel) < 1024 * 1024


def test_the_wheels_library_is_compiled_by_the_combined_builds_commands(wheel, combined_build):
    """setup.py builds my_ops._C with CMakeLists.txt: the AOT library's compile commands are the combined build's
    (the build directory aside), so the flags cannot drift from the flows' and ccache serves the wheel that tree's
    objects."""
    def aot_library_commands(build_dir):
        return sorted(" ".join(c).replace(build_dir, "<build>") for c in compile_commands(build_dir)
                      if any("custom_ops_aot_lib.dir" in a for a in c))

    wheel_commands = aot_library_commands(os.path.join(REPO_ROOT, "build", "aot_library"))
    cpp_ops = [op for op in DECLARED.values() if op.from_cpp]
    assert len(wheel_commands) >= len(cpp_ops) + 2  # each op's sources and the two generated registrations
    assert wheel_commands == aot_library_commands(combined_build.build_dir)


OUTSIDE = """
import json, sys
import torch
import my_ops
assert {repo!r} not in sys.path and my_ops.__file__.startswith({site!r})
# The wheel's own modules, imported relative to the package: no repository module, nothing under another name.
assert not [m for m in sys.modules if m in ("custom_ops_1", "torch_compat", "vmap_rules")
            or m.split(".")[0] in ("flow", "ops", "examples")]
assert sorted(m for m in sys.modules if m.startswith("my_ops")) == {modules!r}
results = {{"ops": my_ops.OPS, "library": my_ops.library_path}}
# The public API for Hugging Face models, from the wheel: a tiny Llama put on the wheel's ops, one step in eager.
import my_ops.hf
from transformers import LlamaConfig, LlamaForCausalLM
assert my_ops.hf.__file__.startswith({site!r})
llama = LlamaForCausalLM(LlamaConfig(vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                     num_attention_heads=2, max_position_embeddings=8)).eval()
with torch.no_grad():
    logits = my_ops.hf.ExportableDecoder(my_ops.hf.swap_ops(llama), 8)(torch.tensor([[1, 2]]), torch.tensor([0]))
results["hf"] = [list(logits.shape), sum(isinstance(m, my_ops.hf.RMSNorm) for m in llama.modules())]
for dtype in (torch.float32, torch.float16, torch.int32):
    x = (torch.randn(64) * 100).to(dtype)
    results[str(dtype)] = [torch.equal(torch.ops.my_ops.mul3(x), x * 3), torch.equal(torch.ops.my_ops.mul4(x), x * 4)]

class Both(torch.nn.Module):
    def forward(self, x):
        return torch.ops.my_ops.mul4(torch.ops.my_ops.mul3(x) + 1)

from executorch.exir import to_edge
program = to_edge(torch.export.export(Both(), (torch.randn(3, 5),))).to_executorch()
with open("both.pte", "wb") as f:
    program.write_to_file(f)
# my_ops.hf's loader from the wheel, which carries no flow/: its copy of the checked loader, my_ops.runtime.
class Bins(torch.nn.Module):  # an ATen op the project declares a kernel for, beside one of its own
    def forward(self, x, boundaries):
        return torch.bucketize(torch.ops.my_ops.mul3(x), boundaries)

from executorch.exir import EdgeCompileConfig
bins = to_edge(torch.export.export(Bins(), (torch.randn(4), torch.tensor([0.0, 1.0]))),
               compile_config=EdgeCompileConfig(_core_aten_ops_exception_list=[torch.ops.aten.bucketize.Tensor]))
bins = bins.to_executorch()
with open("bins.pte", "wb") as f:
    bins.write_to_file(f)
with open("both.pte", "rb") as f:
    data = f.read()
with open("cut.pte", "wb") as f:
    f.write(data[:len(data) // 2])
import my_ops.runtime
from my_ops.hf import session
assert session.checked_loader() is my_ops.runtime
refused = {{}}
for pte, error in (("bins.pte", my_ops.runtime.MissingOperatorError), ("cut.pte", ValueError)):
    try:
        session.load_method(pte)  # bins.pte before any kernel library: each op named, with what to do
    except error as err:
        refused[pte] = str(err)
results["refused"] = [refused]
session.load_kernels({kernels!r})
program, method = session.load_method("both.pte")
x = torch.randn(3, 5)
results["session"] = [torch.equal(method.execute([x])[0], (x * 3 + 1) * 4)]
assert not [m for m in sys.modules if m.split(".")[0] == "flow"]
print("@@" + json.dumps(results))
"""


def test_the_installed_package_registers_computes_and_exports_outside_the_repository(site, combined_build, tmp_path):
    # An empty cache: the wheel's loader makes its tables (the kernels ExecuTorch registers, the kinds their
    # arguments take) on its own, outside the repository.
    env = dict(os.environ, PYTHONPATH=site, CUSTOM_OPS_CODEGEN_CACHE=str(tmp_path / "tables"))
    proc = subprocess.run([sys.executable, "-c", OUTSIDE.format(repo=REPO_ROOT, site=site, modules=PACKAGE_MODULES,
                                                     kernels=combined_build.kernel_lib)], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    import json

    results = json.loads(proc.stdout.split("@@")[-1])
    assert results.pop("ops") == list(DECLARED)
    assert results.pop("library").startswith(site)
    assert results.pop("hf") == [[1, 32], 3]  # the last position's logits; two norms per layer and the final one
    (refused,) = results.pop("refused")
    # bucketize is an ATen op: the project's only by the op list the wheel was built with
    assert ("registers: my_ops::mul3.out, aten::bucketize.Tensor_out. my_ops::mul3.out, aten::bucketize.Tensor_out: "
            "an op custom_ops.bzl declares: load a kernel library built with it (my_ops.runtime.load_kernel_library(")\
        in refused["bins.pte"], refused
    assert refused["cut.pte"].startswith("not a readable ExecuTorch program: "), refused
    assert all(all(checks) for checks in results.values()), results
    x = torch.randn(3, 5)
    expected = [(x * 3 + 1) * 4]
    actual = run_pte(combined_build.runner, str(tmp_path / "both.pte"), [x], expected)
    assert mismatches(actual, expected, exact=True) == []


ALONGSIDE = """
import importlib, sys
import torch
sys.path.insert(0, {site!r})
order = {order!r}
steps = {{
    "my_ops": lambda: importlib.import_module("my_ops"),
    "custom_ops_1": lambda: importlib.import_module("custom_ops_1"),
    "cmake_library": lambda: importlib.import_module("flow.registration").load_aot_library({aot!r}),
    "my_ops_again": lambda: importlib.reload(importlib.import_module("my_ops")),
}}
for step in order:
    steps[step]()
x = torch.randn(8)
result = {{
    "mul3": torch.equal(torch.ops.my_ops.mul3(x), x * 3),
    "mul4": torch.equal(torch.ops.my_ops.mul4(x), x * 4),
    "vmap": torch.equal(torch.vmap(torch.ops.my_ops.mul4)(x.view(2, 4)), x.view(2, 4) * 4),
    "wheel_library_loaded": any({site!r} in line for line in open("/proc/self/maps")),
}}
"""


@pytest.mark.parametrize("order", [
    ["my_ops", "my_ops_again", "custom_ops_1", "cmake_library"],
    ["custom_ops_1", "cmake_library", "my_ops", "my_ops_again"],
    ["custom_ops_1", "my_ops", "cmake_library"],
], ids=["package-first", "repository-first", "interleaved"])
def test_no_double_registration_alongside_the_repository(site, combined_build, order):
    result = run_in_fresh_python(ALONGSIDE.format(site=site, order=order, aot=combined_build.aot_lib))
    assert result.pop("wheel_library_loaded") == (order.index("my_ops") < order.index("cmake_library"))
    assert result == {"mul3": True, "mul4": True, "vmap": True}


def test_an_editable_install_reads_the_checkout(tmp_path):
    # In a copy of the repository and a throwaway venv that sees this one's packages: `pip install -e .` builds _C in
    # place, and my_ops reads custom_ops_1.py and custom_ops.bzl from the checkout.
    import site as site_module

    from helpers import copy_repository

    repo = copy_repository(tmp_path / "repo")
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    (pth_dir,) = [p for p in (venv / "lib").glob("python*/site-packages")]
    # This venv's packages through the copy's .venv link: torch's headers then lie under the copy, as they do under
    # the checkout, so ccache hashes the same relative paths and the wheel's objects serve this build.
    venv_root = os.path.join(REPO_ROOT, ".venv")
    packages = [os.path.join(repo, ".venv", os.path.relpath(p, venv_root)) if p.startswith(venv_root + os.sep) else p
                for p in site_module.getsitepackages()]
    (pth_dir / "dev_venv.pth").write_text("\n".join(packages) + "\n")
    python = str(venv / "bin" / "python")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # the script puts this repository on it
    install = subprocess.run([python, "-m", "pip", "install", "--quiet", "--no-build-isolation", "--no-deps", "-e",
                              repo], capture_output=True, text=True, timeout=900, env=env)
    assert install.returncode == 0, install.stderr[-3000:]
    check = ("import importlib.util, json, torch, my_ops, sys; x = torch.randn(6); "
             "assert importlib.util.find_spec('my_ops.setup') is None, 'the checkout leaks into my_ops'; "
             "assert not [m for m in sys.modules if m in ('custom_ops_1', 'torch_compat') or m.startswith('flow')]; "
             "print('@@' + json.dumps([my_ops.__file__, my_ops.library_path, "
             "sys.modules['my_ops.custom_ops_1'].__file__, my_ops.OPS, "
             "torch.equal(torch.ops.my_ops.mul3(x), x * 3), torch.equal(torch.ops.my_ops.mul4(x), x * 4)]))")
    proc = subprocess.run([python, "-c", check], cwd=tmp_path, capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    import json

    package, library, mul3_module, ops, *computed = json.loads(proc.stdout.split("@@")[-1])
    assert package == os.path.join(repo, "my_ops", "__init__.py")
    assert library.startswith(os.path.join(repo, "my_ops", "_C"))
    assert mul3_module == os.path.join(repo, "custom_ops_1.py")
    assert ops == list(DECLARED) and computed == [True, True]
