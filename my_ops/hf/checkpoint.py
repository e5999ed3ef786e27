"""A model as users have it, a Hugging Face folder or a llama.cpp GGUF file, loaded the way transformers loads it:
the model in float32 (a GGUF file's blocks dequantized by transformers' own reader) and its tokenizer, with the chat
template and the tokens that end a generation.

    checkpoint = my_ops.hf.checkpoint.load("SmolLM2-135M-Instruct.Q4_1.gguf")   # or a folder with config.json
    checkpoint.model, checkpoint.tokenizer, checkpoint.stop_ids

`dequantize=False` (a GGUF file, for its own blocks: quantize="gguf") builds the model without weights and gives it the
file's tensors instead, the matrices packed as the block ops read them (my_ops.hf.gguf_blocks.load_file_weights): the
export then holds about the file's size, where the float32 model takes 4 bytes a parameter (a 1B model ~4.5 GiB, an 8B
one ~32 GiB). The float32 model is for the precisions that quantize it (8da8w, 8da4w) and for eager references.

`layers=N` keeps the model's first N blocks (transformers builds it with num_hidden_layers=N and reads those blocks'
weights from the file): every path of the full model through export and the runtimes at a fraction of the cost, for
checks of the machinery; its text is not the model's.

transformers 5.0.0rc1 fails on two steps of the GGUF path, both worked around here: its model loader needs a
generation_config.json beside the file (a TypeError in adjust_generation_fn otherwise), so the file is loaded from a
temporary folder holding a link to it and one; and its tokenizer loader raises UnboundLocalError for a GGUF file, so
the tokenizer is built from the file's vocabulary: with transformers' own converter, or for a SentencePiece-style
vocabulary (Gemma's), which that converter gets wrong, as llama.cpp splits text (my_ops.hf.gguf_tokenizer).
"""

from __future__ import annotations

import glob
import hashlib
import json
import os
import tempfile
from dataclasses import dataclass, field

import torch

from .swap import UnsupportedModelError


@dataclass
class Checkpoint:
    model: torch.nn.Module  # float32, eval mode
    tokenizer: object  # a transformers PreTrainedTokenizerFast; None from load(tokenizer=False)
    path: str  # the folder or the .gguf file it came from
    stop_ids: list[int] = field(default_factory=list)  # the tokens that end a generation (eos)
    add_bos: bool = False  # whether the model's text starts with its BOS token (a GGUF file's add_bos_token)
    layers: int | None = None  # the first N blocks only (load(layers=N)); None: all of the file's
    dequantized: bool = True  # the model in float32; False: the GGUF file's own tensors only (load(dequantize=False))
    weights_dir: str | None = None  # where those tensors wait on disk, the model holding placeholders (load's)

    def files(self) -> list[str]:
        """The files the model is made from (what a cached export is keyed by)."""
        if os.path.isfile(self.path):
            return [self.path]
        return sorted(p for p in glob.glob(os.path.join(self.path, "*")) if os.path.isfile(p))

    def digest(self) -> str:
        """A hash of the model's files: the same checkpoint anywhere gives the same one."""
        h = hashlib.sha256()
        if self.layers is not None:
            h.update(f"first {self.layers} layers\0".encode())
        for path in self.files():
            h.update(os.path.basename(path).encode() + b"\0")
            with open(path, "rb") as f:
                for chunk in iter(lambda: f.read(1 << 24), b""):
                    h.update(chunk)
        return h.hexdigest()[:16]


def gguf_file(path: str) -> str | None:
    """The GGUF file `path` names: itself, or a folder's only .gguf file when the folder has no config.json."""
    if os.path.isfile(path):
        return path if path.endswith(".gguf") else None
    found = glob.glob(os.path.join(path, "*.gguf"))
    return found[0] if len(found) == 1 and not os.path.isfile(os.path.join(path, "config.json")) else None


def load(path: str, layers: int | None = None, *, dequantize: bool = True,
         weights_dir: str | None = None, tokenizer: bool = True) -> Checkpoint:
    """The model and tokenizer at `path` (a folder transformers' from_pretrained reads, or a .gguf file); with
    `layers`, the model's first `layers` blocks only; dequantize=False: a .gguf file's model on the file's own tensors,
    no float32 copy of its matrices (for quantize="gguf"); and with weights_dir, those tensors wait on disk there as
    they are packed, for the export to take (my_ops/hf/disk_weights.py: the model holds placeholders, for export only;
    the folder must outlive the program's writing). tokenizer=False: the model alone (tokenizer None, no stop_ids,
    add_bos False), for an export, which needs no tokenizer and whose peak memory a large vocabulary's would raise
    (Gemma 3's 262k tokens: ~0.4 GiB); tokenizer_of(path) builds it afterwards."""
    from transformers.utils import logging

    logging.disable_progress_bar()
    if not os.path.exists(path):
        raise UnsupportedModelError(f"{path}: no such file or folder; give a model folder (config.json, weights, "
                                    "tokenizer) or a llama.cpp .gguf file")
    if layers is not None and (not isinstance(layers, int) or layers < 1):
        raise UnsupportedModelError(f"layers={layers!r}: keep at least one layer (a whole number >= 1)")
    gguf = gguf_file(path)
    if not dequantize and not gguf:
        raise UnsupportedModelError(f"{path}: dequantize=False builds a model on a GGUF file's own tensors; a model "
                                    "folder's weights load in float32 (dequantize=True)")
    if weights_dir is not None and dequantize:
        raise UnsupportedModelError("weights_dir keeps a GGUF file's own tensors on disk: it goes with "
                                    "dequantize=False")
    checkpoint = (_load_gguf(gguf, layers, dequantize, weights_dir, tokenizer) if gguf
                  else _load_folder(path, layers, tokenizer))
    checkpoint.layers, checkpoint.dequantized, checkpoint.weights_dir = layers, dequantize, weights_dir
    checkpoint.model.eval()
    return checkpoint


def _first_layers(path: str, layers: int | None, in_file: int | None) -> dict:
    """from_pretrained's override for `layers` (none for all), refused past the count the model has."""
    if layers is None:
        return {}
    if in_file is not None and layers > in_file:
        raise UnsupportedModelError(f"{path}: layers={layers}, but the model has {in_file}; keep at most {in_file}")
    return {"num_hidden_layers": layers}


def tokenizer_of(path: str):
    """The tokenizer load(path) gives its checkpoint, built alone: a folder's, or a GGUF file's
    (my_ops.hf.gguf_tokenizer)."""
    if gguf := gguf_file(path):
        from .gguf_tokenizer import load as load_gguf_tokenizer

        return load_gguf_tokenizer(gguf)[0]
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(path)


def _load_folder(path: str, layers: int | None, with_tokenizer: bool = True) -> Checkpoint:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    config = os.path.join(path, "config.json")
    if not os.path.isfile(config):
        raise UnsupportedModelError(f"{path}: a model folder holds config.json (or a single .gguf file)")
    with open(config, encoding="utf-8") as f:
        in_file = json.load(f).get("num_hidden_layers")
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, **_first_layers(path, layers, in_file))
    if not with_tokenizer:
        return Checkpoint(model, None, path)
    tokenizer = AutoTokenizer.from_pretrained(path)
    return Checkpoint(model, tokenizer, path, _stop_ids(model.generation_config.eos_token_id, tokenizer),
                      bool(getattr(tokenizer, "add_bos_token", False)))


def gguf_config(parsed: dict, overrides: dict | None = None):
    """The model's configuration from transformers' reading of a GGUF file (check_and_parse), as from_pretrained makes
    it from the file: given to from_pretrained, it spares a second reading of the file's metadata (3 s for SmolLM2's
    vocabulary)."""
    from transformers import AutoConfig

    values = {**parsed["config"], **(overrides or {})}
    return AutoConfig.for_model(values.pop("model_type"), **values)


def _load_gguf(path: str, layers: int | None, dequantize: bool, weights_dir: str | None = None,
               with_tokenizer: bool = True) -> Checkpoint:
    from transformers import AutoModelForCausalLM

    from .gguf_tokenizer import from_file

    from .gguf_file import check_and_parse

    path, header, parsed = check_and_parse(path)
    vocabulary = parsed["tokenizer"]
    config = gguf_config(parsed, _first_layers(path, layers, parsed["config"].get("num_hidden_layers")))
    if dequantize:
        with tempfile.TemporaryDirectory() as folder:
            os.symlink(path, os.path.join(folder, os.path.basename(path)))
            with open(os.path.join(folder, "generation_config.json"), "w") as f:
                json.dump({k: vocabulary[k] for k in ("bos_token_id", "eos_token_id") if k in vocabulary}, f)
            model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=os.path.basename(path), config=config,
                                                         dtype=torch.float32)
        apply_rope_freqs(model, header)
    else:
        model = _model_on_file_tensors(config, path, weights_dir, header)
    if not with_tokenizer:
        return Checkpoint(model, None, path)
    tokenizer, add_bos = from_file(path, header, parsed)
    return Checkpoint(model, tokenizer, path, _stop_ids(vocabulary.get("eos_token_id"), tokenizer), add_bos)


def _model_on_file_tensors(config, path: str, weights_dir: str | None = None, header=None) -> torch.nn.Module:
    """transformers' model of `config` built as from_pretrained builds it before it loads weights (parameters on the
    meta device, nothing initialized; buffers such as the rotary tables computed), then given the file's tensors (the
    packed ones waiting in weights_dir, when given) and its rotary frequency factors (apply_rope_freqs)."""
    from transformers import AutoModelForCausalLM
    from transformers.integrations.accelerate import init_empty_weights
    from transformers.modeling_utils import no_init_weights

    from .gguf_blocks import load_file_weights

    with no_init_weights(), init_empty_weights():
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.tie_weights()  # from_pretrained ties them once loaded: a tied output projection is the embedding's table
    from .disk_weights import DiskWeights

    load_file_weights(model, path, None if weights_dir is None else DiskWeights(weights_dir))
    from .gguf_file import check

    apply_rope_freqs(model, header if header is not None else check(path))
    return model


ROPE_FREQS = "rope_freqs.weight"


def apply_rope_freqs(model: torch.nn.Module, header) -> None:
    """A GGUF file's rotary frequency factors (the tensor rope_freqs.weight: llama.cpp's converter stores Llama 3's
    rope scaling that way, one factor per frequency) put into `model`: each rotary embedding's frequencies divided by
    their factors, as llama.cpp's rope divides them. transformers' GGUF loader leaves the tensor out, and the model
    would rotate every position as if unscaled. Refused by name where the factors do not fit the model's rotary
    embeddings."""
    import numpy as np
    import gguf

    from .gguf_blocks import UnsupportedTensorError

    tensor = next((t for t in header.tensors if t.name == ROPE_FREQS), None)
    if tensor is None:
        return
    with open(header.path, "rb") as f:
        f.seek(header.data_start + tensor.offset)
        raw = np.frombuffer(f.read(tensor.nbytes), np.uint8)
    factors = torch.from_numpy(np.array(gguf.quants.dequantize(raw, gguf.GGMLQuantizationType(tensor.type_id)),
                                        dtype=np.float32).reshape(-1))
    rotaries = [m for m in model.modules() if isinstance(getattr(m, "inv_freq", None), torch.Tensor)]
    sizes = sorted({m.inv_freq.numel() for m in rotaries})
    if sizes != [factors.numel()] or not bool(torch.isfinite(factors).all()) or not bool((factors > 0).all()):
        raise UnsupportedTensorError(f"{header.path}: {ROPE_FREQS} holds {factors.numel()} factors (each must be "
                                     f"finite and positive) for rotary embeddings of {sizes or 'no'} frequencies: "
                                     "the file's metadata does not describe its tensors")
    for module in rotaries:
        module.inv_freq = module.inv_freq / factors
        if isinstance(getattr(module, "original_inv_freq", None), torch.Tensor):
            module.original_inv_freq = module.original_inv_freq / factors


def float32_bytes(path: str, layers: int | None = None) -> int:
    """What the float32 model of a GGUF file takes: 4 bytes for each of its tensors' values (the first `layers`
    blocks' and the rest, with `layers`)."""
    import re

    from .gguf_file import check

    values = 0
    for tensor in check(path).tensors:
        block = re.match(r"blk\.(\d+)\.", tensor.name)
        if layers is None or block is None or int(block.group(1)) < layers:
            count = 1
            for n in tensor.shape:
                count *= n
            values += count
    return 4 * values


def _stop_ids(eos, tokenizer) -> list[int]:
    ids = eos if isinstance(eos, list) else [eos] if eos is not None else []
    if tokenizer.eos_token_id is not None:
        ids.append(tokenizer.eos_token_id)
    return sorted(set(ids))


def save_tokenizer(tokenizer, directory: str) -> str:
    """The tokenizer's files in `directory` (save_pretrained: tokenizer.json, its config and chat template), the
    tokenizer.json in the form ExecuTorch's LLM runner reads too: its loader refuses a normalizer that is an empty
    Sequence (what transformers' GGUF converter writes for "none"), so that one is written as none. Returns the
    tokenizer.json's path."""
    tokenizer.save_pretrained(directory)
    path = os.path.join(directory, "tokenizer.json")
    # read back only when the normalizer is that one: a large vocabulary's file parsed in Python takes ~10x its size
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None and (backend.normalizer is None or json.loads(backend.normalizer.__getstate__()) !=
                                {"type": "Sequence", "normalizers": []}):
        return path
    with open(path, encoding="utf-8") as f:
        spec = json.load(f)
    normalizer = spec.get("normalizer")
    if isinstance(normalizer, dict) and normalizer.get("type") == "Sequence" and not normalizer.get("normalizers"):
        spec["normalizer"] = None
        with open(path, "w", encoding="utf-8") as f:
            json.dump(spec, f, ensure_ascii=False)
    return path
