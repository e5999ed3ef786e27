"""docs/adding-an-op.md, followed literally: in a copy of the repository, every fenced block of the page is applied
as it says (`file=F` creates F, `mode=append` appends to it, `mode=insert` inserts above the declarations'
"# Add new ops above this line." marker) and every `bash run` block is run. That adds my_ops::add7 from Python,
my_ops::relu6 from C++, my_ops::scaled_add (two tensors and a float, on the N-input helper, from C++ with
Autograd), a kernel for aten::triu (an ATen op ExecuTorch's kernels lack) and the out variant of
other_lib::scale_shift (an op another library defined without one), and runs each one's flow; then their runners are
checked against ATen: x + 7, relu6, triu, x * 0.5 - 1.25, and x + 0.1 * y broadcast every way, on x86 and cross-built for ARM64 under qemu (0.1 * y rounds: a kernel fusing x + alpha * y into one FMA would
differ); scaled_add's gradients equal ATen's."""

import os
import re
import subprocess
import sys

import pytest
import torch

import forked_python
from flow.compare import mismatches
from flow.runner import run_pte
from helpers import REPO_ROOT, copy_repository, full_range, qemu

INSERT_MARKER = "    # Add new ops above this line.\n"


def recipe_blocks():
    with open(os.path.join(REPO_ROOT, "docs", "adding-an-op.md")) as f:
        section = f.read()
    blocks = []
    for info, body in re.findall(r"^```(\w[^\n]*)\n(.*?)^```", section, re.M | re.S):
        words = info.split()
        attributes = dict(word.split("=", 1) for word in words[1:] if "=" in word)
        if "file" in attributes or "run" in words[1:]:  # a step; other blocks only illustrate
            blocks.append((words[0], attributes, "run" in words[1:], body))
    return blocks


def apply_block(repo, attributes, body):
    path = os.path.join(repo, attributes["file"])
    mode = attributes.get("mode", "create")
    if mode == "create":
        assert not os.path.exists(path), f"the recipe creates {attributes['file']}, which already exists"
        os.makedirs(os.path.dirname(path), exist_ok=True)
        text = body
    else:
        text = open(path).read()
        if mode == "append":
            text = text.rstrip("\n") + "\n\n" + body
        else:
            assert mode == "insert" and INSERT_MARKER in text, f"no insertion marker in {attributes['file']}"
            text = text.replace(INSERT_MARKER, body + INSERT_MARKER)
    with open(path, "w") as f:
        f.write(text)


def test_the_recipe_has_the_files_and_commands_of_both_paths():
    blocks = recipe_blocks()
    files = [a["file"] for _, a, run, _ in blocks if not run]
    commands = [body.strip() for _, _, run, body in blocks if run]
    assert files == ["ops/add7/add7.py", "ops/add7/add7_out.cpp", "custom_ops.yaml", "custom_ops.bzl",
                     "ops/relu6/relu6.cpp", "ops/relu6/relu6_out.cpp", "custom_ops.yaml", "custom_ops.bzl",
                     "ops/scaled_add/scaled_add.cpp", "ops/scaled_add/scaled_add_out.cpp", "ops/scaled_add/scaled_add.py",
                     "custom_ops.yaml", "custom_ops.bzl",
                     "ops/triu/triu.py", "ops/triu/triu_out.cpp", "custom_ops.yaml", "custom_ops.bzl",
                     "ops/scale_shift/scale_shift.py", "ops/scale_shift/scale_shift_out.cpp", "custom_ops.yaml",
                     "custom_ops.bzl"]
    # A new op's own files are in its folder; the rest are the two declarations.
    assert {f.split("/")[0] for f in files} == {"ops", "custom_ops.yaml", "custom_ops.bzl"}
    assert commands == ["bash test_custom_ops.sh cmake add7", "bash test_custom_ops.sh cmake relu6",
                        "bash test_custom_ops.sh cmake scaled_add", "bash test_custom_ops.sh cmake triu",
                        "bash test_custom_ops.sh cmake scale_shift"]


@pytest.fixture(scope="module")
def repo_with_recipe(tmp_path_factory):
    repo = copy_repository(tmp_path_factory.mktemp("own_op") / "repo")
    for _, attributes, run, body in recipe_blocks():
        if not run:
            apply_block(repo, attributes, body)
            continue
        proc = subprocess.run(["bash", "-c", body], cwd=repo, capture_output=True, text=True, timeout=1200,
                              env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"})
        assert proc.returncode == 0, f"{body.strip()} failed:\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"
        assert "outputs match the reference" in proc.stdout and "All flows passed" in proc.stdout
    return repo


@pytest.mark.parametrize("program, shapes, reference", [
    ("add7", [(2, 3)], lambda x: x + 7),
    ("relu6", [(4, 8)], torch.nn.functional.relu6),
    ("scaled_add", [(3, 40), (40,)], lambda x, y: x + 0.1 * y),  # y broadcast; alpha 0.1: the product rounds
    ("triu", [(2, 5, 7)], lambda x: torch.triu(x, 1)),  # ATen's op, the kernel the recipe adds for it
    ("scale_shift", [(3, 33)], lambda x: x * 0.5 - 1.25),  # another library's op, the out variant the recipe adds
])
def test_the_new_ops_compute_what_aten_does(repo_with_recipe, program, shapes, reference):
    runner = os.path.join(repo_with_recipe, "cmake-out", program, "custom_ops_executor_runner")
    pte = os.path.join(repo_with_recipe, f"{program}.pte")
    for seed in range(3):
        inputs = [full_range(shape, torch.float32, seed + 10 * i) / 1e3 for i, shape in enumerate(shapes)]
        expected = [reference(*inputs)]  # / 1e3: mostly within relu6's [0, 6] knee
        assert mismatches(run_pte(runner, pte, inputs, expected), expected, exact=True) == []


BROADCASTS = [[(3, 40), (3, 1)], [(2, 1, 5), (4, 1)], [(1,), (2, 3)], [(4, 1, 3), (1, 6, 1)]]


def run_on_the_copys_modules(repo, code):
    """`code` in a new process (forked_python.py) that imports the copy's modules first and has loaded the copy's AOT
    library of scaled_add (its C++ registration)."""
    aot_library = os.path.join(repo, "cmake-out", "scaled_add", "libcustom_ops_aot_lib.so")
    preamble = f"import sys\nsys.path.insert(0, {repo!r})\nimport torch\ntorch.ops.load_library({aot_library!r})\n"
    returncode, _, stderr = forked_python.run(preamble + code, dict(os.environ), 300)
    assert returncode == 0, stderr[-3000:]


@pytest.fixture(scope="module")
def broadcast_programs(repo_with_recipe, tmp_path_factory):
    """scaled_add exported at each broadcast case's shapes, by the copy's own modules (one process for all)."""
    directory = tmp_path_factory.mktemp("broadcasts")
    programs = [str(directory / f"scaled_add_{i}.pte") for i in range(len(BROADCASTS))]
    run_on_the_copys_modules(repo_with_recipe, f"""
from ops.scaled_add import scaled_add
from flow.export import export_to_pte
for shapes, pte in zip({BROADCASTS!r}, {programs!r}):
    export_to_pte(scaled_add.ScaledAddExample(), tuple(torch.ones(s) for s in shapes), pte)
""")
    return programs


@pytest.mark.parametrize("case", range(len(BROADCASTS)), ids=[str(shapes) for shapes in BROADCASTS])
def test_scaled_add_broadcasts_like_aten(repo_with_recipe, broadcast_programs, case):
    # The N-input helper's strided loop: a broadcast innermost dimension, a new leading one, the first input broadcast.
    shapes = BROADCASTS[case]
    runner = os.path.join(repo_with_recipe, "cmake-out", "scaled_add", "custom_ops_executor_runner")
    inputs = [full_range(shape, torch.float32, i) / 1e3 for i, shape in enumerate(shapes)]
    expected = [inputs[0] + 0.1 * inputs[1]]
    assert mismatches(run_pte(runner, broadcast_programs[case], inputs, expected), expected, exact=True) == []


GRADIENT = """
for x_shape, y_shape in {broadcasts!r}:
    x, y = torch.randn(x_shape, requires_grad=True), torch.randn(y_shape, requires_grad=True)
    out = torch.ops.my_ops.scaled_add(x, y, 0.1)
    grad = torch.randn(out.shape)
    got = torch.autograd.grad(out, (x, y), grad)
    want = torch.autograd.grad(x + 0.1 * y, (x, y), grad)
    assert all(torch.equal(a, b) for a, b in zip(got, want)), (x_shape, y_shape)
try:
    torch.ops.my_ops.scaled_add(torch.ones(2, dtype=torch.int32), torch.ones(2, dtype=torch.int32))
except RuntimeError as error:
    assert str(error).startswith("my_ops::scaled_add: input has unsupported dtype int32"), str(error)
else:
    raise AssertionError("int32 accepted")
"""


def test_scaled_adds_gradients_equal_atens(repo_with_recipe):
    # The recipe's Autograd kernel: d/dx = grad and d/dy = 0.1 * grad, each summed back over the dimensions it was
    # broadcast along, as ATen's x + 0.1 * y gives them; a refused dtype is reported under the functional op's name.
    run_on_the_copys_modules(repo_with_recipe, GRADIENT.format(broadcasts=BROADCASTS))


def test_scaled_add_equals_aten_bit_for_bit_on_arm64(repo_with_recipe, aarch64_package):
    """The recipe's op, cross-built from the user's copy for ARM64 and run under qemu: ATen rounds 0.1 * y and then the
    sum; GCC would fuse x + alpha * y into one FMA (one rounding) unless the build turns contraction off."""
    build = os.path.join(repo_with_recipe, "cmake-out", "aarch64", "scaled_add")
    env = dict(os.environ, PATH=os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"])
    for command in (["cmake", "-S", repo_with_recipe, "-B", build, "-G", "Ninja", f"-DPython3_EXECUTABLE={sys.executable}",
                     f"-DCMAKE_TOOLCHAIN_FILE={repo_with_recipe}/cmake/aarch64-linux-gnu.toolchain.cmake",
                     f"-DEXECUTORCH_PACKAGE_DIR={aarch64_package}", "-DCUSTOM_OPS_BUILD_AOT_LIBRARY=OFF",
                     "-DCUSTOM_OPS_RUNNER_XNNPACK=OFF", "-DCUSTOM_OPS_RUNNER_QUANTIZED=OFF",
                     "-DCUSTOM_OPS_ROOT_OPS=my_ops::scaled_add.out"],
                    ["cmake", "--build", build, "--target", "custom_ops_executor_runner"]):
        proc = subprocess.run(command, capture_output=True, text=True, env=env, timeout=900)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    runner = os.path.join(build, "custom_ops_executor_runner")
    pte = os.path.join(repo_with_recipe, "scaled_add.pte")
    for seed in range(3):
        inputs = [full_range(shape, torch.float32, seed + 10 * i) / 1e3 for i, shape in enumerate([(3, 40), (40,)])]
        expected = [inputs[0] + 0.1 * inputs[1]]
        assert mismatches(run_pte(runner, pte, inputs, expected, emulator=qemu("max")), expected, exact=True) == []


# The project's tests that derive what they expect from the declarations, run inside the copy that now declares three
# more ops (one from Python, one from C++, a float-only one with two inputs): none may assume the project's own ops.
DECLARATION_DRIVEN = ["tests/test_references.py", "tests/test_imports.py", "tests/test_docs.py",
                      "tests/test_wheel.py::test_the_wheel_holds_the_package_and_nothing_else"]


def test_the_declaration_driven_tests_pass_with_the_new_ops(repo_with_recipe):
    # The copy's own .venv (a link to this one): paths under the copy are what ccache hashes relative to it, so its
    # builds reuse this tree's objects; through this interpreter's path, torch's headers would hash as another tree's.
    python = os.path.join(repo_with_recipe, ".venv", "bin", "python")
    proc = subprocess.run([python if os.path.exists(python) else sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-n0", "-v", "--durations=0",
                           # The new ops' cases and every case not of one op: the project's own ops' cases ran in
                           # this suite already. wrong_functor copies the tree again; root_holds needs git.
                           *DECLARATION_DRIVEN, "-k", "(add7 or relu6 or scaled_add or triu or scale_shift or not "
                           "(my_ops or aten)) and not wrong_functor and not root_holds"],
                          cwd=repo_with_recipe, capture_output=True, text=True, timeout=1800,
                          # These files use the combined runner and AOT library, not AOTInductor's side or the
                          # helpers' checks: a dozen compiles of the copy's tree spared.
                          env={**{k: v for k, v in os.environ.items() if k != "PYTHONPATH"},
                               "CUSTOM_OPS_TEST_COMBINED_EXTRAS": "OFF"})
    assert proc.returncode == 0, proc.stdout[-5000:] + proc.stderr[-2000:]
    for case in ("declared_dtype[my_ops::add7-int8]", "declared_dtype[my_ops::relu6-bfloat16]",
                 "does_not_declare[my_ops::add7-bool]", "does_not_declare[my_ops::relu6-complex64]",
                 "imports_only_torch[ops/scaled_add/scaled_add.py]"):
        assert f"{case} PASSED" in proc.stdout, case
