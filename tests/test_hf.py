"""my_ops.hf on Hugging Face decoders no one here wrote (examples/hf_models.py: tiny Llama, Qwen3 and Gemma 3
checkpoints saved and loaded with from_pretrained): the swap in eager against transformers' own generate(), the swaps
a mistake would break (each must change the tokens), the refusals, and the `hf` mode's flow end to end (export, a
runner selected from the program, 200 tokens decoded twice in the runner and the Python runtime)."""

import os
import re
import time

import pytest
import torch

from conftest import cmake_build

EAGER_TOKENS = 24  # the eager checks: enough steps that a cache or position mistake shows, in seconds


@pytest.fixture(scope="module")
def hf(aot_ops, python_ops):
    import my_ops.hf  # noqa: F401  (after the ops are registered: the package finds them defined)
    from models import hf_checkpoints as flow_hf

    return flow_hf


@pytest.fixture(scope="module")
def checkpoints(hf, tmp_path_factory):
    m = hf.hf_models()
    root = tmp_path_factory.mktemp("checkpoints")
    made = {name: m.make_checkpoint(name, str(root / name)) for name in (*hf.MODELS, "mistral")}
    # A large epsilon, so that a norm which drops it decodes other tokens.
    made["llama_large_eps"] = m.make_checkpoint("llama", str(root / "llama_large_eps"), rms_norm_eps=0.5)
    return made


def decode_swapped(directory: str, new_tokens: int = EAGER_TOKENS):
    """The checkpoint put on my_ops and decoded greedily in eager (the ops' CPU kernels, the cache written with
    my_ops::update_cache)."""
    import my_ops.hf
    from examples import hf_models
    from models.decoding import decode_eager

    model = my_ops.hf.swap_ops(hf_models.load(directory))
    return decode_eager(my_ops.hf.ExportableDecoder(model, hf_models.MAX_POSITIONS).eval(), hf_models.PROMPT,
                        new_tokens)


def reference(hf, directory: str, new_tokens: int = EAGER_TOKENS):
    return hf.generate_eager(directory, hf.hf_models().PROMPT, new_tokens)


@pytest.mark.parametrize("name", ["llama", "qwen3", "gemma3", "mistral"])
def test_a_swapped_model_decodes_like_transformers_in_eager(name, hf, checkpoints):
    import my_ops.hf
    from examples import hf_models
    from models.decoding import difference

    model = my_ops.hf.swap_ops(hf_models.load(checkpoints[name]))
    norms = [n for n, module in model.named_modules() if isinstance(module, my_ops.hf.RMSNorm)]
    layers = hf_models.configs()[name].num_hidden_layers
    # Two per layer (Gemma 3: four) and the final one; Qwen3 and Gemma 3 also normalize each head's queries and keys.
    per_layer = {"llama": 2, "qwen3": 4, "gemma3": 6, "mistral": 2}[name]
    assert len(norms) == per_layer * layers + 1
    for swapped in (my_ops.hf.Attention, my_ops.hf.MLP):
        assert sum(isinstance(module, swapped) for module in model.modules()) == layers
    windows = [module.window for module in model.modules() if isinstance(module, my_ops.hf.Attention)]
    assert windows == {"gemma3": [hf_models.SLIDING_WINDOW, 0], "mistral": [hf_models.SLIDING_WINDOW] * 2}.get(
        name, [0] * layers)
    assert not [n for n, module in model.named_modules() if type(module).__name__.endswith("RMSNorm")
                and not isinstance(module, my_ops.hf.RMSNorm)]
    assert difference(decode_swapped(checkpoints[name]), reference(hf, checkpoints[name]), hf.FLOAT32_TOLERANCE) is None


def _dropped_epsilon(monkeypatch, hf_module):
    monkeypatch.setitem(hf_module.NORMS, "LlamaRMSNorm", lambda module: (module.weight, 0.0))


def _gemma_norm_without_one(monkeypatch, hf_module):
    monkeypatch.setitem(hf_module.NORMS, "Gemma3RMSNorm", lambda module: (module.weight, float(module.eps)))


def _cache_one_position_off(monkeypatch, hf_module):
    # The step's position is read once a step (ExportableDecoder) and every layer writes its cache there.
    start_of = hf_module.swap._start_of
    monkeypatch.setattr(hf_module.swap, "_start_of",
                        lambda positions, length, capacity: start_of(positions, length, capacity) + 1)


def _kv_heads_swapped(monkeypatch, hf_module):
    make = hf_module.swap._cache_class

    def swapped():
        class Swapped(make()):
            def write(self, layer_idx, key_states, value_states, cache_position):
                return super().write(layer_idx, key_states.flip(2), value_states, cache_position)

        return Swapped

    monkeypatch.setattr(hf_module.swap, "_cache_class", swapped)


def _window_ignored(monkeypatch, hf_module):
    monkeypatch.setattr(hf_module.swap, "_window", lambda attention: 0)


def _window_one_longer(monkeypatch, hf_module):
    # transformers' rule is q - k < window; q - k <= window sees one position more.
    window = hf_module.swap._window
    monkeypatch.setattr(hf_module.swap, "_window", lambda attention: window(attention) and window(attention) + 1)


@pytest.mark.parametrize("mistake", [_dropped_epsilon, _gemma_norm_without_one, _cache_one_position_off,
                                     _kv_heads_swapped, _window_ignored, _window_one_longer],
                         ids=["the norm's epsilon dropped", "Gemma's norm scaling by its weight, not 1 + weight",
                              "the cache written one position off", "the kv heads mapped to the wrong query heads",
                              "Gemma's local layer attending to every position", "the window one position longer"])
def test_a_wrong_swap_decodes_other_tokens(mistake, hf, checkpoints, monkeypatch):
    import my_ops.hf
    from models.decoding import difference

    gemma = (_gemma_norm_without_one, _window_ignored, _window_one_longer)
    directory = checkpoints["llama_large_eps" if mistake is _dropped_epsilon else "gemma3" if mistake in gemma
                            else "llama"]
    expected = reference(hf, directory)
    assert difference(decode_swapped(directory), expected, hf.FLOAT32_TOLERANCE) is None  # the right swap first
    mistake(monkeypatch, my_ops.hf)
    assert difference(decode_swapped(directory), expected, hf.FLOAT32_TOLERANCE) is not None


def test_a_scaled_embedding_keeps_its_scale_on_the_block_ops(hf, checkpoints):
    # Gemma's embedding multiplies its rows by sqrt(hidden size); put on my_ops::embedding_blocks (8-bit), it still
    # does. (The 8-bit program's own check compares with the same quantized model in eager, which would share a lost
    # scale; this compares with transformers' own embedding.)
    import my_ops.hf.quantize
    from examples import hf_models

    model = hf_models.load(checkpoints["gemma3"])
    tokens = torch.tensor([hf_models.PROMPT])
    expected = model.get_input_embeddings()(tokens)
    my_ops.hf.quantize.put_linears_on_ops(model, "8da8w")
    embedding = model.get_input_embeddings()
    assert isinstance(embedding, my_ops.hf.quantize.Embedding)
    torch.testing.assert_close(embedding(tokens), expected, rtol=0.0, atol=float(expected.abs().max()) / 100)


def test_the_program_does_not_depend_on_the_order_a_module_registered_its_buffers(hf, checkpoints):
    # transformers registers Gemma 3's two rotary tables in the order of a set, which Python's hash seed decides, and
    # the export takes the program's inputs in the modules' order: either order gives the same bytes.
    import my_ops.hf
    from examples import hf_models

    programs = []
    for reverse in (False, True):
        model = hf_models.load(checkpoints["gemma3"])
        assert len(model.model.rotary_emb._buffers) == 2
        if reverse:
            for module in model.modules():
                module._buffers = dict(reversed(module._buffers.items()))
        programs.append(my_ops.hf.export_program(model, max_seq_len=16).buffer)
    assert programs[0] == programs[1]


def test_unsupported_models_are_refused_by_name_before_export(hf):
    import my_ops.hf
    from transformers import AutoModelForCausalLM, GPT2Config, Qwen3Config

    tiny = dict(vocab_size=64, num_hidden_layers=1)
    cases = {
        "transformer.h.0.ln_1 (LayerNorm): no my_ops mapping":
            AutoModelForCausalLM.from_config(GPT2Config(**tiny, n_embd=32, n_head=2, n_positions=32)),
        "layer types ['chunked_attention']: only full and sliding-window attention are supported":
            AutoModelForCausalLM.from_config(Qwen3Config(**tiny, hidden_size=32, intermediate_size=64,
                                                         num_attention_heads=2, num_key_value_heads=1, head_dim=16,
                                                         layer_types=["chunked_attention"])),
    }
    for message, model in cases.items():
        with pytest.raises(my_ops.hf.UnsupportedModelError, match=re.escape(message)):
            my_ops.hf.export_program(model, max_seq_len=16)
    with pytest.raises(my_ops.hf.UnsupportedModelError, match="quantize='int4': choose None"):
        my_ops.hf.export_program(cases["transformer.h.0.ln_1 (LayerNorm): no my_ops mapping"], quantize="int4")


def test_a_missing_op_is_named_with_the_way_to_register_it(hf, checkpoints, monkeypatch):
    import my_ops.hf
    from examples import hf_models

    monkeypatch.setattr(my_ops.hf.swap, "OPS", (*my_ops.hf.OPS, "my_ops::not_built"))
    found = my_ops.hf.problems(hf_models.load(checkpoints["llama"]))
    assert len(found) == 1 and found[0].startswith("my_ops::not_built not registered with PyTorch: `import my_ops`")


def test_the_hf_flow_decodes_every_architecture_in_the_runner_and_the_python_runtime(hf, load_method, tmp_path,
                                                                                         capsys):
    # The `hf` mode's steps in this process (its imports and registrations are made): export, a runner selected from
    # the programs (linear_blocks on F32 weights, or on Q8_0 blocks), then 200 tokens twice in the runner and twice in
    # the Python runtime per program. Llama float32, Qwen3 8-bit, Gemma 3 both (its scaled embedding on the block ops):
    # each comparison and each architecture runs (the mode makes all six). `load_method` is asked for its side effect:
    # the combined kernel library loaded into this process, which check_all's Python-runtime decode needs.
    out = str(tmp_path)
    programs = [("llama", False), ("qwen3", True), ("gemma3", False), ("gemma3", True)]
    exported = hf.export_all(programs, out)
    runner = cmake_build("hf_runner", f"CUSTOM_OPS_MODEL_FILE={','.join(exported)}",
                         "CUSTOM_OPS_BUILD_AOT_LIBRARY=OFF")
    assert hf.check_all(programs, out, runner.runner) == 0, capsys.readouterr().err[-4000:]
    lines = [line for line in capsys.readouterr().out.splitlines() if not line.startswith(("Exported", "Reused"))]
    assert len(lines) == 4, lines
    for line, (name, quantized) in zip(lines, programs):
        if quantized:
            assert line.startswith(f"{name}_8da8w.pte: runner = Python runtime; fed eager's 200 tokens"), line
        else:
            assert line.startswith(f"{name}.pte: 200 tokens equal transformers' generate()"), line


def test_executorchs_own_llm_runner_decodes_the_program_to_generates_tokens(hf, load_method, tmp_path):
    # The program carries the metadata methods ExecuTorch's LLM runner (extension/llm/runner's TextLLMRunner) reads,
    # so that runner, given a tokenizer for the tiny vocabulary, decodes it: 200 tokens equal to transformers'
    # generate(), twice on one runner (reset() between). The export is the flow's, from its cache when unchanged.
    from executorch.extension.llm.runner import TextLLMRunner

    m = hf.hf_models()
    (pte,) = hf.export_all([("llama", False)], str(tmp_path))
    runner = TextLLMRunner(pte, hf.write_llm_runner_tokenizer(str(tmp_path / "tokenizer.bin"), m.VOCAB))
    ids = {piece: i for i, piece in enumerate(hf.llm_runner_pieces(m.VOCAB))}
    expected = hf.generate_eager(hf.checkpoint_dir(str(tmp_path), "llama"), hf.llm_runner_prompt_ids(),
                                 m.NEW_TOKENS).tokens
    for _ in range(2):
        pieces = []
        runner.reset()
        runner.generate(hf.LLM_RUNNER_PROMPT, hf.llm_runner_config(m.NEW_TOKENS, m.MAX_POSITIONS),
                        token_callback=pieces.append)
        assert [ids[p] for p in pieces] == expected


def test_the_program_cache_makes_once_per_identity_and_keeps_only_the_newest_of_a_name(hf, tmp_path):
    # `python -m my_ops.hf` and the real mode keep their programs in ~/.cache/my_ops/programs: hundreds of MiB each,
    # so a program made for a new identity (other sources, schemas, packages) replaces the one it supersedes once that
    # one has gone unused for a while (another checkout, on older sources, may be reading it).
    from my_ops.file_cache import SUPERSEDED_KEPT_S, cached

    made = []

    def make(path):
        made.append(path)
        with open(path, "w") as f:
            f.write(str(len(made)))

    def last_used(path, seconds_ago):
        os.utime(path, (time.time() - seconds_ago,) * 2)

    first, fresh = cached(str(tmp_path), "model_8da4w.pte", "identity 1", make)
    last_used(first, 2 * SUPERSEDED_KEPT_S)
    again, fresh_again = cached(str(tmp_path), "model_8da4w.pte", "identity 1", make)  # a use: kept again
    other, _ = cached(str(tmp_path), "other_8da4w.pte", "identity 1", make)
    newer, fresh_newer = cached(str(tmp_path), "model_8da4w.pte", "identity 2", make)
    assert (fresh, fresh_again, fresh_newer, len(made)) == (True, False, True, 3) and again == first != newer
    assert sorted(os.listdir(tmp_path)) == sorted(map(os.path.basename, [first, other, newer]))
    assert open(newer).read() == "3"
    last_used(first, 2 * SUPERSEDED_KEPT_S)
    newest, _ = cached(str(tmp_path), "model_8da4w.pte", "identity 3", make)
    assert sorted(os.listdir(tmp_path)) == sorted(map(os.path.basename, [other, newer, newest]))  # newer: just used


def test_the_program_identity_is_the_schemas_not_the_kernels(hf):
    # A rebuilt kernel keeps the programs; a changed schema of an op programs use (here: one more overload of a probe
    # taken for one) makes them anew; an op declared beside them, which no program uses, keeps them.
    from my_ops.hf.session import PROGRAM_OPS, schema_hash

    before = schema_hash()
    assert schema_hash() == before
    library = torch.library.Library("my_ops", "FRAGMENT")
    library.define("cache_identity_probe(Tensor x) -> Tensor")
    try:
        assert schema_hash() == before
        assert schema_hash(PROGRAM_OPS + ("cache_identity_probe",)) != schema_hash(PROGRAM_OPS)
    finally:
        library._destroy()
    assert schema_hash() == before


def test_the_program_identity_names_every_op_my_ops_hf_uses():
    # Every my_ops op a my_ops.hf module names (torch.ops.my_ops.X, "my_ops::X") is in PROGRAM_OPS, or a program using
    # it would outlive a change of its schema.
    import glob
    import re

    from helpers import REPO_ROOT
    from my_ops.hf.session import PROGRAM_OPS

    named = set()
    for path in glob.glob(os.path.join(REPO_ROOT, "my_ops", "hf", "*.py")):
        with open(path) as f:
            text = f.read()
        named |= set(re.findall(r"(?:torch\.ops\.my_ops\.|my_ops::)([a-z_0-9]+)", text))
        named |= set(re.findall(r"\"my_ops\.([a-z_0-9]+)\.default\"", text))  # the fusion pass's node targets
    assert named and named <= set(PROGRAM_OPS), sorted(named - set(PROGRAM_OPS))


def test_the_program_identity_covers_every_module_an_export_runs(hf):
    # A cached program is made again when a source it comes from changes: EXPORT_SOURCES must hold export.py and every
    # my_ops.hf module it imports, transitively, and my_ops' own __init__ (the registration); the command line and the
    # text helpers are left out on purpose.
    import ast

    from my_ops.hf import session

    def imported(relative):
        tree = ast.parse(open(os.path.join(session.PACKAGE_DIR, relative)).read())
        package = os.path.dirname(relative)
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.level == 1 and package == "hf":
                yield os.path.join(package, f"{node.module}.py" if node.module else "__init__.py")

    reached, pending = set(), ["hf/to_program.py", "hf/__init__.py", "__init__.py"]
    while pending:
        relative = pending.pop()
        if relative not in reached:
            reached.add(relative)
            pending.extend(imported(relative))
    assert reached - set(session.NOT_IN_PROGRAMS) == set(session.EXPORT_SOURCES)
