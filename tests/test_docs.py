"""The README and docs/ stay connected to the code: every relative link and anchor resolves, every flow and models
module they run with `python -m` exists, and docs/tests.md describes every test file."""

import glob
import os
import re
import subprocess

import pytest

from helpers import REPO_ROOT

PAGES = [os.path.join(REPO_ROOT, "README.md"), *sorted(glob.glob(os.path.join(REPO_ROOT, "docs", "*.md")))]


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(path: str) -> set[str]:
    text = re.sub(r"^```.*?^```", "", open(path).read(), flags=re.M | re.S)  # no headings inside code blocks
    return {slug(m.group(1)) for m in re.finditer(r"^#+ (.*)$", text, re.M)}


@pytest.mark.parametrize("page", PAGES, ids=lambda p: os.path.relpath(p, REPO_ROOT))
def test_links_and_anchors_resolve(page):
    text = open(page).read()
    problems = []
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"\w+://", target):
            continue
        file, _, anchor = target.partition("#")
        resolved = os.path.normpath(os.path.join(os.path.dirname(page), file)) if file else page
        if not os.path.exists(resolved):
            problems.append(f"{target}: no file {resolved}")
        elif anchor and anchor not in anchors(resolved):
            problems.append(f"{target}: no heading with anchor #{anchor} in {os.path.relpath(resolved, REPO_ROOT)}")
    assert problems == []


def test_modules_they_run_exist():
    named = {(package, m) for page in PAGES
             for package, m in re.findall(r"python -m (flow|models)\.(\w+)", open(page).read())}
    missing = {f"{package}.{m}" for package, m in named if not os.path.isfile(os.path.join(REPO_ROOT, package, f"{m}.py"))}
    assert {package for package, _ in named} == {"flow", "models"} and missing == set()


def test_every_test_file_is_described():
    described = set(re.findall(r"^- `(test_\w+\.py)`", open(os.path.join(REPO_ROOT, "docs", "tests.md")).read(),
                               re.M))
    present = {os.path.basename(p) for p in glob.glob(os.path.join(REPO_ROOT, "tests", "test_*.py"))}
    assert described == present


# The upstream example's nine names, and the build and packaging files: every other file lives in a folder (an op's in
# ops/<name>/, the README's map says where).
ROOT_FILES = {"custom_ops_1.py", "custom_ops_2.py", "custom_ops_2.cpp", "custom_ops_2_out.cpp", "custom_ops_1_out.cpp",
              "custom_ops.yaml", "CMakeLists.txt", "TARGETS", "test_custom_ops.sh",
              "custom_ops.bzl", "targets.bzl", ".buckconfig", ".buckroot", "setup.py", "pyproject.toml", "README.md",
              ".gitignore"}


def test_the_root_holds_the_familiar_names_the_build_files_and_folders():
    listed = subprocess.run(["git", "ls-files"], cwd=REPO_ROOT, capture_output=True, text=True, check=True).stdout
    assert {path for path in listed.splitlines() if "/" not in path} == ROOT_FILES
