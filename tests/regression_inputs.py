"""The libFuzzer findings that once broke the runner, kept as hex text in tests/fuzz_regressions/NAME.hex: the bytes
of each input exactly as found, without tracking a .pte (a build output) in git. The tests decode them into .pte files.

    python tests/regression_inputs.py decode DIR            # every finding as DIR/NAME.pte (e.g. into a fuzz corpus)
    python tests/regression_inputs.py add crash-HASH NAME   # a new finding, once it is fixed
"""

import glob
import os
import sys
import textwrap

DIRECTORY = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fuzz_regressions")


def names() -> list[str]:
    return sorted(os.path.basename(p)[: -len(".hex")] for p in glob.glob(os.path.join(DIRECTORY, "*.hex")))


def decode(destination) -> list[str]:
    """Writes every finding as <destination>/NAME.pte; returns the paths, sorted by name."""
    os.makedirs(destination, exist_ok=True)
    paths = []
    for name in names():
        with open(os.path.join(DIRECTORY, f"{name}.hex")) as f:
            data = bytes.fromhex(f.read())  # whitespace (the line breaks) is ignored
        paths.append(os.path.join(destination, f"{name}.pte"))
        with open(paths[-1], "wb") as f:
            f.write(data)
    return paths


def add(finding: str, name: str) -> str:
    with open(finding, "rb") as f:
        text = "\n".join(textwrap.wrap(f.read().hex(), 64)) + "\n"
    path = os.path.join(DIRECTORY, f"{name}.hex")
    with open(path, "w") as f:
        f.write(text)
    return path


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "decode":
        print("\n".join(decode(sys.argv[2])))
    elif len(sys.argv) == 4 and sys.argv[1] == "add":
        print(add(sys.argv[2], sys.argv[3]))
    else:
        sys.exit(__doc__)
