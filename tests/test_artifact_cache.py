"""The cache of slow artifacts (flow/artifact_cache.py: AOTInductor packages, the hf mode's programs): one is made
again exactly when a source or a package version it comes from changed, and a reader never sees half of one."""

import os

import pytest

from flow import artifact_cache


# Two ops of the stand-in repository: half's kernel includes a header of twice's folder.
DECLARATIONS = """CUSTOM_OPS = {
    "my_ops::twice": {"registered_from": "python", "python_module": "ops.twice.twice",
                      "kernel_sources": ["ops/twice/twice_out.cpp"], "example_program": "twice",
                      "reference": "ops.twice.twice.reference", "dtypes": ["float32"],
                      "example_inputs": [("float32", [2])]},
    "my_ops::half": {"registered_from": "cpp", "aot_sources": ["ops/half/half.cpp"],
                     "kernel_sources": ["ops/half/half_out.cpp"], "example_program": "half",
                     "reference": "ops.half.half.reference", "dtypes": ["float32"],
                     "example_inputs": [("float32", [2])]},
}
"""
SOURCES = {"ops/twice/twice.py": "def reference(x):\n    return 2 * x\n", "ops/twice/twice_out.cpp": "// twice\n",
           "ops/twice/twice_rows.h": "#pragma once\n", "ops/half/half.cpp": "// half\n",
           "ops/half/half.py": "def reference(x):\n    return x / 2\n",
           "ops/half/half_out.cpp": '#include "ops/twice/twice_rows.h"\n', "flow/step.py": "# a flow module\n",
           "custom_ops.bzl": DECLARATIONS}


@pytest.fixture
def repo(tmp_path, monkeypatch):
    """A stand-in repository with two ops, a flow module and its own cmake-out/."""
    for relative, text in SOURCES.items():
        (tmp_path / relative).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / relative).write_text(text)
    monkeypatch.setattr(artifact_cache, "REPO_ROOT", str(tmp_path))
    monkeypatch.setattr(artifact_cache, "CACHE_ROOT", str(tmp_path / "cmake-out"))
    artifact_cache.source_hash.cache_clear()
    yield tmp_path
    artifact_cache.source_hash.cache_clear()


def make_counting(made):
    def make(path):
        made.append(path)
        with open(path, "w") as f:
            f.write(f"artifact {len(made)}")
    return make


def test_an_artifact_is_made_once_per_source_hash(repo):
    made = []
    first, fresh = artifact_cache.cached("programs", "model.pte", make_counting(made))
    again, fresh_again = artifact_cache.cached("programs", "model.pte", make_counting(made))
    assert (fresh, fresh_again, len(made)) == (True, False, 1)
    assert again == first and open(first).read() == "artifact 1"
    assert os.listdir(os.path.dirname(first)) == [os.path.basename(first)]  # no partial files left beside it


def declare_thrice(repo):
    """Another op, in its own folder."""
    (repo / "ops/thrice").mkdir()
    (repo / "ops/thrice/thrice_out.cpp").write_text("// thrice\n")
    (repo / "ops/thrice/thrice.py").write_text("def reference(x):\n    return 3 * x\n")
    declarations = (repo / "custom_ops.bzl").read_text().replace("CUSTOM_OPS = {", """CUSTOM_OPS = {
    "my_ops::thrice": {"registered_from": "python", "python_module": "ops.thrice.thrice",
                       "kernel_sources": ["ops/thrice/thrice_out.cpp"], "example_program": "thrice",
                       "reference": "ops.thrice.thrice.reference", "dtypes": ["float32"],
                       "example_inputs": [("float32", [2])]},""")
    (repo / "custom_ops.bzl").write_text(declarations)


def edit_dtypes(repo, op):
    text = (repo / "custom_ops.bzl").read_text()
    start = text.index(f'"my_ops::{op}"')
    edited = text[start:].replace('"dtypes": ["float32"]', '"dtypes": ["float32", "float64"]', 1)
    (repo / "custom_ops.bzl").write_text(text[:start] + edited)


def edit_twices_declaration(repo):
    edit_dtypes(repo, "twice")


def edit_halfs_declaration(repo):
    edit_dtypes(repo, "half")


def remade(repo, change, ops, settings=()) -> bool:
    """Whether an artifact calling `ops` is made again after `change` (in a new process)."""
    made = []
    before, _ = artifact_cache.cached("programs", "model.pte", make_counting(made), ops=ops)
    artifact_cache.source_hash.cache_clear()  # a new process
    change(repo)
    after, fresh = artifact_cache.cached("programs", "model.pte", make_counting(made), *settings, ops=ops)
    assert fresh == (after != before) == (len(made) == 2)
    return fresh


CHANGES = {
    "edit the op's C++ source": lambda repo: (repo / "ops/twice/twice_out.cpp").write_text("// changed\n"),
    "edit the op's reference": lambda repo: (repo / "ops/twice/twice.py").write_text("def reference(x):\n    return x\n"),
    "add a file to the op's folder": lambda repo: (repo / "ops/twice/twice.h").write_text("#pragma once\n"),
    "edit the op's declaration": edit_twices_declaration,
    "edit a flow module": lambda repo: (repo / "flow/step.py").write_text("# changed\n"),
}


@pytest.mark.parametrize("change", CHANGES)
def test_a_change_to_what_it_is_made_from_makes_it_again(repo, change):
    assert remade(repo, CHANGES[change], ["my_ops::twice"])


def test_a_header_its_op_includes_from_another_folder_makes_it_again(repo):
    edit = lambda repo: (repo / "ops/twice/twice_rows.h").write_text("#pragma once  // changed\n")  # noqa: E731
    assert remade(repo, edit, ["my_ops::half"])


def test_another_setting_makes_it_again(repo):
    assert remade(repo, lambda repo: None, ["my_ops::twice"], ("aot_inductor.check_lowerbound=True",))


def test_another_package_version_makes_it_again(repo, monkeypatch):
    real = artifact_cache._version
    other = lambda repo: monkeypatch.setattr(  # noqa: E731
        artifact_cache, "_version", lambda p: "0.0" if p == "transformers" else real(p))
    assert remade(repo, other, ["my_ops::twice"])


@pytest.mark.parametrize("change", ["declare another op", "edit another op's source", "edit another op's declaration"])
def test_another_op_declared_or_edited_keeps_it(repo, change):
    edit = {"declare another op": declare_thrice,
            "edit another op's source": lambda repo: (repo / "ops/half/half_out.cpp").write_text("// changed\n"),
            "edit another op's declaration": edit_halfs_declaration}[change]
    assert not remade(repo, edit, ["my_ops::twice"])


def test_a_failed_make_leaves_nothing_to_reuse(repo):
    def broken(path):
        with open(path, "w") as f:
            f.write("half")
        raise RuntimeError("lowering failed")

    with pytest.raises(RuntimeError, match="lowering failed"):
        artifact_cache.cached("programs", "model.pte", broken)
    made = []
    _, fresh = artifact_cache.cached("programs", "model.pte", make_counting(made))
    assert fresh and len(made) == 1
