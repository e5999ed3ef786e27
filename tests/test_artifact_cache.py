"""The cache of slow artifacts (flow/artifact_cache.py: AOTInductor packages, the hf mode's programs): one is made
again exactly when a source or a package version it comes from changed, and a reader never sees half of one."""

import os

import pytest

from flow import artifact_cache


@pytest.fixture
def repo(tmp_path, monkeypatch):
    """A stand-in repository with one source of each kind the cache hashes, and its own cmake-out/."""
    for relative in ("ops/twice/op_twice.cpp", "flow/step.py", "custom_ops.bzl"):
        (tmp_path / relative).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / relative).write_text(f"# {relative}\n")
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


@pytest.mark.parametrize("change", ["edit a C++ source", "edit a flow module", "add an op's file", "another setting",
                                    "another transformers"])
def test_any_change_to_what_it_is_made_from_makes_it_again(repo, change, monkeypatch):
    made = []
    before, _ = artifact_cache.cached("programs", "model.pte", make_counting(made))
    artifact_cache.source_hash.cache_clear()  # a new process
    settings = ()
    if change == "edit a C++ source":
        (repo / "ops/twice/op_twice.cpp").write_text("// changed\n")
    elif change == "edit a flow module":
        (repo / "flow/step.py").write_text("# changed\n")
    elif change == "add an op's file":
        (repo / "ops/twice/op_twice.h").write_text("#pragma once\n")
    elif change == "another setting":
        settings = ("aot_inductor.check_lowerbound=True",)
    else:
        real = artifact_cache._version
        monkeypatch.setattr(artifact_cache, "_version", lambda p: "0.0" if p == "transformers" else real(p))
    after, fresh = artifact_cache.cached("programs", "model.pte", make_counting(made), *settings)
    assert fresh and after != before and len(made) == 2


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
