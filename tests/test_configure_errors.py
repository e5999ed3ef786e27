"""Selection and declaration mistakes stop the build at configure time with one line that names the problem and the
fix, instead of building an empty library or failing later; a kernel_name that no source defines fails the kernel
library's own link, naming the symbol."""

import os
import subprocess
import sys

import pytest

from helpers import REPO_ROOT, copy_repository


def configure(build_dir, *definitions, source=REPO_ROOT):
    return subprocess.run(["cmake", "-S", source, "-B", str(build_dir), "-G", "Ninja",
                           f"-DPython3_EXECUTABLE={sys.executable}", *(f"-D{d}" for d in definitions)],
                          capture_output=True, text=True, timeout=300)


def error_line(proc):
    assert proc.returncode != 0, proc.stdout[-2000:]
    lines = [line.strip() for line in proc.stderr.splitlines() if line.strip().startswith("error: ")]
    assert len(lines) == 1, proc.stderr
    return lines[0]


def edited_copy(tmp_path, path, old, new):
    """A copy of the repository with one mistake made: `old` in `path` (relative to the root) replaced once by `new`,
    or `new` appended where `old` is empty. The anchor must be there, else the test would check an unedited copy."""
    repo = copy_repository(tmp_path / "repo")
    with open(os.path.join(repo, path)) as f:
        text = f.read()
    if old:
        assert old in text, f"the mistake's anchor is gone from {path}: {old!r}"
        text = text.replace(old, new, 1)
    else:
        text += new
    with open(os.path.join(repo, path), "w") as f:
        f.write(text)
    return repo


@pytest.mark.parametrize("root_ops, expected", [
    ("my_ops::nope.out", "error: root op 'my_ops::nope.out' is not in custom_ops.yaml, which binds: my_ops::mul3.out, "
                         "my_ops::mul4.out"),
    ("my_ops::mul3", "error: root op 'my_ops::mul3' names no overload; did you mean my_ops::mul3.out?"),
])
def test_a_root_op_that_is_not_bound_fails_at_configure_time(root_ops, expected, tmp_path):
    assert error_line(configure(tmp_path, f"CUSTOM_OPS_ROOT_OPS={root_ops}")).startswith(expected)


@pytest.mark.parametrize("after_a_program", [False, True], ids=["alone", "second of two"])
def test_a_missing_model_file_fails_at_configure_time(after_a_program, request, tmp_path):
    # Alone, or listed after a program that exists (a runner for several programs): the missing one is named.
    missing = tmp_path / "nonexistent.pte"
    files = str(missing)
    if after_a_program:
        from flow.export import export_example

        declared = request.getfixturevalue("declared")
        request.getfixturevalue("python_ops")
        files = f"{export_example(declared['my_ops::mul3'], str(tmp_path))},{missing}"
    line = error_line(configure(tmp_path / "build", f"CUSTOM_OPS_MODEL_FILE={files}"))
    assert line.startswith(f"error: model file {missing} does not exist")


def test_a_model_file_that_is_not_a_program_fails_at_configure_time(tmp_path):
    not_a_program = tmp_path / "notes.pte"
    not_a_program.write_text("these are not the bytes of a program\n" * 10)
    line = error_line(configure(tmp_path / "build", f"CUSTOM_OPS_MODEL_FILE={not_a_program}"))
    assert line.startswith(f"error: model file {not_a_program} is not an ExecuTorch program (.pte)")


def test_a_yaml_syntax_error_names_file_line_and_column(tmp_path):
    repo = edited_copy(tmp_path, "custom_ops.yaml", "",
                       "\n- func: my_ops::broken.out(Tensor input) -> Tensor\n  kernels: [unclosed\n")
    yaml_path = os.path.join(repo, "custom_ops.yaml")
    line = error_line(configure(tmp_path / "build", source=repo))
    assert line.startswith(f"error: {yaml_path}:"), line
    assert "YAML syntax error" in line
    line_number, column = line.split(f"{yaml_path}:")[1].split(":")[:2]
    assert int(line_number) > 10 and int(column) >= 1


def test_a_declaration_mistake_names_the_op_and_field(tmp_path):
    repo = edited_copy(tmp_path, "custom_ops.bzl", '"kernel_sources": ["custom_ops_1_out.cpp"]',
                       '"kernel_source": ["custom_ops_1_out.cpp"]')
    bzl = os.path.join(repo, "custom_ops.bzl")
    line = error_line(configure(tmp_path / "build", source=repo))
    assert f"{bzl}: my_ops::mul3: unknown field(s) ['kernel_source']" in line


def test_a_misspelled_kernel_name_fails_the_kernel_library_link_naming_the_symbol(tmp_path):
    repo = edited_copy(tmp_path, "custom_ops.yaml", "custom::mul3_out_impl", "custom::mul3_out_iml")
    build = tmp_path / "build"
    assert configure(build, "CUSTOM_OPS_ROOT_OPS=my_ops::mul3.out", source=repo).returncode == 0
    proc = subprocess.run(["cmake", "--build", str(build), "--target", "custom_ops_lib"], capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode != 0
    assert "Linking CXX shared library libcustom_ops_lib.so" in proc.stdout
    assert "undefined reference to `custom::native::mul3_out_iml(" in proc.stdout


# How the runtime registers an op (custom_ops.bzl's runtime_registration) must agree with custom_ops.yaml and with the
# kernel source: twice registered fails at load, never registered only when a program calls the op.
REGISTRATION_MISTAKES = {
    "the yaml binds an op its source registers": (
        "custom_ops.yaml", "",
        "\n- func: my_ops::update_cache.out(Tensor value, Tensor(a!) cache, SymInt start_pos, *, Tensor(b!) out) -> "
        "Tensor(b!)\n  kernels:\n    - arg_meta: null\n      kernel_name: custom::x\n",
        "custom_ops.yaml binds my_ops::update_cache.out, which custom_ops.bzl registers with EXECUTORCH_LIBRARY"),
    "declared executorch_library, the source registers nothing": (
        "ops/update_cache/update_cache_out.cpp",
        'EXECUTORCH_LIBRARY_CHECKED(my_ops, "update_cache.out", custom::native::update_cache_out_impl);', "",
        "none of its kernel_sources registers it: add EXECUTORCH_LIBRARY_CHECKED(my_ops, \"update_cache.out\", "),
    "a codegen op's source registers it too": (
        "custom_ops_1_out.cpp", "", '\n#include "kernel_helpers/checked_unboxing.h"\n'
        'EXECUTORCH_LIBRARY_CHECKED(my_ops, "mul3.out", custom::native::mul3_out_impl);\n',
        "custom_ops_1_out.cpp registers my_ops::mul3.out with EXECUTORCH_LIBRARY, and custom_ops.yaml binds it"),
    "a C++-registered op declared executorch_library": (
        "custom_ops.bzl", '"aot_sources": ["ops/rms_norm/rms_norm.cpp"],',
        '"aot_sources": ["ops/rms_norm/rms_norm.cpp"],\n        "runtime_registration": "executorch_library",',
        "my_ops::rms_norm: runtime_registration 'executorch_library' is for ops registered from Python"),
}


@pytest.mark.parametrize("mistake", REGISTRATION_MISTAKES)
def test_a_registration_mistake_fails_at_configure_time(mistake, tmp_path):
    path, old, new, expected = REGISTRATION_MISTAKES[mistake]
    repo = edited_copy(tmp_path, path, old, new)
    line = error_line(configure(tmp_path / "build", source=repo))
    assert expected in line, line


def test_a_python_module_refusing_a_declared_dtype_stops_configure_naming_both(tmp_path):
    # rope.py refusing bfloat16 while custom_ops.bzl declares it: export would refuse programs the kernel runs. The
    # step that writes the kernels' dtype sets from the declarations (declared_dtypes/) stops first.
    repo = edited_copy(tmp_path, "ops/rope/rope.py", "DTYPES = (torch.float32, torch.float16, torch.bfloat16)",
                       "DTYPES = (torch.float32, torch.float16)")
    line = error_line(configure(tmp_path / "build", "CUSTOM_OPS_ROOT_OPS=my_ops::rope.out", source=repo))
    assert line == ("error: ops/rope/rope.py: DTYPES is (float32, float16) but custom_ops.bzl declares my_ops::rope's "
                    "dtypes as (float32, float16, bfloat16); make the two agree, in that order")
    assert not (tmp_path / "build" / "generated" / "declared" / "declared_dtypes").exists()


def test_a_block_format_stated_without_its_traits_source_stops_configure(tmp_path):
    # The formats' sources are compiled by a pattern (custom_ops.bzl's BLOCK_FORMAT_SOURCES); a layout whose source is
    # missing would leave its kernels undefined until the library loads. The step that writes the layouts stops first.
    stated = '    "Q8_0": Layout(32, 32, 128, ((8, 0),), (2,)),\n'
    repo = edited_copy(tmp_path, "ops/blocks/block_layouts.py", stated, stated + stated.replace("Q8_0", "Q9_0"))
    line = error_line(configure(tmp_path / "build", source=repo))
    assert line == ("error: ops/blocks/block_layouts.py states the block format Q9_0, whose traits source "
                    "ops/blocks/formats/q9_0.cpp does not exist: write it (as q8_0.cpp is) or remove the layout")


def test_a_format_source_added_without_its_layout_stops_the_next_build(tmp_path):
    # A file the pattern matches, added after configure: the build re-checks the pattern (CMake's CONFIGURE_DEPENDS
    # glob in the plan), configures again, and stops at the source no layout is stated for.
    repo = copy_repository(tmp_path / "repo")
    build = tmp_path / "build"
    assert configure(build, "CUSTOM_OPS_ROOT_OPS=my_ops::linear_blocks.out", "CUSTOM_OPS_BUILD_AOT_LIBRARY=OFF",
                     source=repo).returncode == 0
    formats = os.path.join(repo, "ops", "blocks", "formats")
    with open(os.path.join(formats, "q8_0.cpp")) as f, open(os.path.join(formats, "q9_0.cpp"), "w") as copy:
        copy.write(f.read())
    proc = subprocess.run(["cmake", "--build", str(build), "--target", "help"], capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode != 0, proc.stdout[-2000:]
    assert ("error: ops/blocks/formats/q9_0.cpp is compiled as a format's traits, but ops/blocks/block_layouts.py "
            "states no layout for Q9_0: add its entry to LAYOUTS or remove the source") in proc.stdout + proc.stderr


def test_a_source_pattern_that_matches_nothing_names_the_op_and_the_pattern(tmp_path):
    repo = edited_copy(tmp_path, "custom_ops.bzl", 'BLOCK_FORMAT_SOURCES = ["ops/blocks/formats/*.cpp"]',
                       'BLOCK_FORMAT_SOURCES = ["ops/blocks/formats/*.cc"]')
    line = error_line(configure(tmp_path / "build", source=repo))
    assert line == "error: custom_ops.bzl: my_ops::linear_blocks names ops/blocks/formats/*.cc, which matches no file"
