"""my_ops.gguf, the reader of a llama.cpp GGUF file's own blocks, against the format's own writer and readers: files
written by the gguf package (GGUFWriter, its quantizers), read back field by field and compared with the gguf package's
dequantizers and transformers' undoing of llama.cpp's Q/K row order; the blocks packed for the kernels read back by
the ops' ATen references; types the ops do not take refused by name before anything is attached."""

import os
import re

import numpy as np
import pytest
import torch

WRITTEN = ("Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1")  # the types the gguf package's quantizers write
KQUANTS = ("Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K")  # it reads and dequantizes these, but writes none: random blocks
# (rows, inputs): one block per row, one row, a row count no group of 16 divides, ffn_down's 1536 inputs.
SHAPES = [(3, 32), (1, 64), (17, 96), (5, 1536)]
KQUANT_SHAPES = [(3, 256), (1, 512), (17, 768), (5, 1536)]
# Where each K-quant block keeps its fp16 fields (d, dmin), set to finite values in the random blocks.
HALVES = {"Q2_K": (80, 82), "Q3_K": (108,), "Q4_K": (0, 2), "Q5_K": (0, 2), "Q6_K": (208,)}


@pytest.fixture(scope="module")
def gguf_module(aot_ops, python_ops):
    import my_ops.gguf

    return my_ops.gguf


def random_kquant(shape, kind: str, generator: np.random.Generator) -> np.ndarray:
    """Rows of random K-quant blocks (every code, every packed scale and min bit) with finite scales."""
    import gguf

    qtype = gguf.GGMLQuantizationType[kind]
    data = generator.integers(0, 256, gguf.quants.quant_shape_to_byte_shape(shape, qtype), dtype=np.uint8)
    blocks = data.reshape(-1, gguf.GGML_QUANT_SIZES[qtype][1])
    for at in HALVES[kind]:
        blocks[:, at:at + 2] = (generator.random(len(blocks)) * 0.01 + 0.001).astype(np.float16).view(np.uint8).reshape(-1, 2)
    return data


def write_gguf(path, tensors: dict, architecture: str = "llama") -> None:
    """A GGUF file of `tensors` ({name: (float32 array, GGUF type name)}), written by the gguf package: its quantizers'
    blocks, random K-quant blocks of the array's shape, or zero bytes of a type it does not write (IQ4_NL)."""
    import gguf

    writer = gguf.GGUFWriter(str(path), architecture)
    generator = np.random.default_rng(7)
    for name, (values, kind) in tensors.items():
        qtype = gguf.GGMLQuantizationType[kind]
        if kind in KQUANTS:
            data = random_kquant(values.shape, kind, generator)
        elif kind in (*WRITTEN, "F32", "F16", "BF16"):
            data = gguf.quants.quantize(values, qtype)
        else:
            data = np.zeros(gguf.quants.quant_shape_to_byte_shape(values.shape, qtype), np.uint8)
        writer.add_tensor(name, data, raw_dtype=qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def file_tensors(path) -> dict:
    import gguf

    return {t.name: t for t in gguf.GGUFReader(str(path)).tensors}


def gguf_dequantized(tensor) -> np.ndarray:
    import gguf

    return gguf.quants.dequantize(np.asarray(tensor.data), tensor.tensor_type)


@pytest.mark.parametrize("kind", WRITTEN + KQUANTS)
def test_blocks_read_and_packed_as_the_gguf_package_dequantizes_them(kind, gguf_module, tmp_path):
    # The chain a program's weights take: the file, my_ops.gguf's reader, the packer's layout (my_ops.hf.quantize's
    # interleave), what the kernel reads: the op's reference (ops/blocks/blocks.py, written apart from the reader)
    # reads it back to the gguf package's own dequantization, bit for bit; the embedding kernel too.
    from flow.compare import assert_bit_exact
    from flow.declarations import import_repository_module
    from my_ops.hf.quantize import interleave

    reference = import_repository_module("ops.blocks.blocks")
    generator = np.random.default_rng(0)
    shapes = {f"t{i}": (generator.standard_normal(shape).astype(np.float32) * 0.1 + 0.02, kind)
              for i, shape in enumerate(KQUANT_SHAPES if kind in KQUANTS else SHAPES)}
    write_gguf(tmp_path / "blocks.gguf", shapes)
    for name, tensor in file_tensors(tmp_path / "blocks.gguf").items():
        codes, records = gguf_module.codes_and_records(np.asarray(tensor.data), kind)
        rows, inputs = shapes[name][0].shape
        assert codes.shape == (rows, inputs) and records.shape[:2] == (rows, inputs // reference.LAYOUTS[kind].weights)
        packed = interleave(torch.from_numpy(codes), torch.from_numpy(records), kind)
        assert packed.shape == tuple(np.asarray(tensor.data).shape)  # the same bytes, rearranged
        expected = torch.from_numpy(gguf_dequantized(tensor).reshape(rows, inputs))
        assert_bit_exact(reference.dequantize(packed, kind), expected, f"{kind} {name}")
        assert_bit_exact(torch.ops.my_ops.embedding_blocks(packed, torch.arange(rows), kind), expected, kind)


def tiny_llama():
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=64, hidden_size=64, intermediate_size=256, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=16, tie_word_embeddings=True)
    torch.manual_seed(0)
    return LlamaForCausalLM(config).eval()


def llama_cpp_permute(weight: np.ndarray, heads: int) -> np.ndarray:
    """What llama.cpp's converter (convert_hf_to_gguf.py, LlamaModel.permute) does to a Q or K weight's rows: each
    head's two rotary halves interleaved."""
    return weight.reshape(heads, 2, weight.shape[0] // heads // 2, *weight.shape[1:]).swapaxes(1, 2).reshape(
        weight.shape)


def write_model_gguf(model, path, kind: str = "Q4_1", overrides: dict | None = None,
                     architecture: str = "llama", extra: dict | None = None) -> dict:
    """The model's tensors as llama.cpp's converter names and orders them (Q and K rows interleaved for the llama
    architecture, as they are for Gemma 3), its matrices quantized to `kind` (`overrides`: {GGUF name: type}), the
    norms float32, then `extra` ({GGUF name: (array, type)}); returns {GGUF name: transformers parameter}."""
    from transformers.modeling_gguf_pytorch_utils import get_gguf_hf_weights_map

    names = get_gguf_hf_weights_map(model)
    parameters = dict(model.named_parameters())
    config = model.config
    tensors = {}
    for gguf_name, hf_name in names.items():
        if hf_name not in parameters or gguf_name in tensors:
            continue
        weight = parameters[hf_name].detach().numpy()
        if architecture == "llama" and (".attn_q." in gguf_name or ".attn_k." in gguf_name):
            heads = config.num_attention_heads if ".attn_q." in gguf_name else config.num_key_value_heads
            weight = llama_cpp_permute(weight, heads)
        tensors[gguf_name] = (weight, (overrides or {}).get(gguf_name, kind if weight.ndim == 2 else "F32"))
    write_gguf(path, {**tensors, **(extra or {})}, architecture)
    return {n: h for n, h in names.items() if n in tensors}


def test_attached_blocks_are_the_files_in_transformers_row_order(gguf_module, tmp_path):
    # Every matrix of a small llama written as llama.cpp's converter writes it (Q and K rows permuted for its rotary
    # layout), attached to the model: the blocks dequantized equal the gguf package's dequantization of the file's
    # tensor put back in transformers' order by transformers' own loader step.
    from flow.declarations import import_repository_module
    from transformers.modeling_gguf_pytorch_utils import LlamaTensorProcessor

    reference = import_repository_module("ops.blocks.blocks")
    model = tiny_llama()
    names = write_model_gguf(model, tmp_path / "tiny.gguf")
    attached = gguf_module.attach_blocks(model, str(tmp_path / "tiny.gguf"))
    matrices = {n for n in names if n.endswith(".weight") and "norm" not in n}
    assert set(attached) == matrices and set(attached.values()) == {"Q4_1"}
    undo = LlamaTensorProcessor(config=model.config.to_dict())._reverse_permute_weights
    modules = dict(model.named_modules())
    tensors = file_tensors(tmp_path / "tiny.gguf")
    for name in sorted(matrices):
        expected = gguf_dequantized(tensors[name])
        if ".attn_q." in name:
            expected = undo(expected, model.config.num_attention_heads, model.config.num_attention_heads)
        elif ".attn_k." in name:
            expected = undo(expected, model.config.num_attention_heads, model.config.num_key_value_heads)
        weight, fmt = modules[names[name].rsplit(".", 1)[0]].gguf_blocks
        assert fmt == "Q4_1"
        got = reference.dequantize(weight, fmt).numpy()
        np.testing.assert_array_equal(got, expected, err_msg=name)


def test_gemma3s_blocks_keep_the_files_row_order(gguf_module, tmp_path):
    # llama.cpp's converter leaves Gemma 3's Q and K rows as they are (and transformers does not reorder them): the
    # blocks attached from a gemma3 file are the file's rows, not the llama order's (seen: "is is is is" from the real
    # Gemma 3 file's own blocks while its Q and K rows were reordered).
    from flow.declarations import import_repository_module
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    reference = import_repository_module("ops.blocks.blocks")
    torch.manual_seed(0)
    model = Gemma3ForCausalLM(Gemma3TextConfig(vocab_size=64, hidden_size=64, intermediate_size=256,
                                               num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2,
                                               head_dim=16)).eval()
    names = write_model_gguf(model, tmp_path / "gemma3.gguf", architecture="gemma3")
    attached = gguf_module.attach_blocks(model, str(tmp_path / "gemma3.gguf"))
    assert {"blk.0.attn_q.weight", "blk.0.attn_k.weight"} <= set(attached)
    modules = dict(model.named_modules())
    tensors = file_tensors(tmp_path / "gemma3.gguf")
    for name in sorted(attached):
        weight, fmt = modules[names[name].rsplit(".", 1)[0]].gguf_blocks
        got = reference.dequantize(weight, fmt).numpy()
        np.testing.assert_array_equal(got, gguf_dequantized(tensors[name]), err_msg=name)


def test_a_type_the_ops_do_not_take_is_refused_by_name_before_anything_is_attached(gguf_module, tmp_path):
    model = tiny_llama()
    write_model_gguf(model, tmp_path / "iquant.gguf", overrides={"blk.1.ffn_down.weight": "IQ4_NL"})
    with pytest.raises(gguf_module.UnsupportedTensorError,
                       match=r"blk\.1\.ffn_down\.weight \(IQ4_NL\).*it takes F32, F16, BF16, Q8_0, .*Q6_K") as error:
        gguf_module.attach_blocks(model, str(tmp_path / "iquant.gguf"))
    assert "llama-quantize" in str(error.value)
    assert not any(hasattr(m, "gguf_blocks") for m in model.modules())


def test_a_block_tensor_of_a_partial_block_is_refused(gguf_module):
    with pytest.raises(gguf_module.UnsupportedTensorError, match=r"Q4_1 tensor's rows are whole blocks of 20 bytes.*21 bytes a row"):
        gguf_module.codes_and_records(np.zeros((2, 21), np.uint8), "Q4_1")


def test_exporting_gguf_without_a_gguf_file_is_refused(gguf_module, tmp_path):
    import my_ops.hf
    import my_ops.hf.checkpoint
    from my_ops.hf.checkpoint import Checkpoint
    from my_ops.hf.to_program import export_checkpoint

    with pytest.raises(my_ops.hf.UnsupportedModelError, match="carries none"):
        my_ops.hf.prepare(tiny_llama(), max_seq_len=16, quantize="gguf")
    folder = Checkpoint(tiny_llama(), None, str(tmp_path))
    with pytest.raises(my_ops.hf.UnsupportedModelError, match="give a .gguf file"):
        export_checkpoint(folder, max_seq_len=16, quantize="gguf")
    # a model on a file's own tensors has no float32 weights to quantize, and a folder's weights are float32
    on_file = Checkpoint(tiny_llama(), None, str(tmp_path / "m.gguf"), dequantized=False)
    with pytest.raises(my_ops.hf.UnsupportedModelError, match="the GGUF file's own tensors only.*dequantize=True"):
        export_checkpoint(on_file, max_seq_len=16, quantize="8da4w")
    with pytest.raises(my_ops.hf.UnsupportedModelError, match="a model folder's weights load in float32"):
        my_ops.hf.checkpoint.load(str(tmp_path), dequantize=False)


def test_the_tiny_gguf_model_decodes_like_its_eager_reference(gguf_module, tmp_path, combined_build):
    # The small llama's own GGUF blocks through export into a program, decoded twice in the Python runtime: the same
    # logits as the model on the same blocks in eager PyTorch with every my_ops op computed by its ATen reference.
    import copy

    from models.hf_checkpoints import reference_decode
    from models.decoding import decode_runtime
    from flow.runtime import load_kernel_library
    from my_ops.hf import export_program

    model = tiny_llama()
    write_model_gguf(model, tmp_path / "tiny.gguf")
    gguf_module.attach_blocks(model, str(tmp_path / "tiny.gguf"))
    reference = reference_decode(copy.deepcopy(model), "gguf", 32, [1, 5, 9], 6)
    pte = tmp_path / "tiny.pte"
    with open(pte, "wb") as f:
        export_program(model, max_seq_len=32, quantize="gguf").write_to_file(f)
    load_kernel_library(combined_build.kernel_lib)
    decoded = decode_runtime(str(pte), [1, 5, 9], 6, generations=2)
    assert decoded.tokens == reference.tokens
    torch.testing.assert_close(decoded.logits, reference.logits, atol=1e-3, rtol=0)


# A file as llama-quantize's presets write one: another format per kind of tensor, the fused q/k/v and gate/up in
# several (kept as parts), 16-bit tensors kept at 16 bits, the tied embedding BF16.
MIXED = {"attn_q": "Q4_K", "attn_k": "Q5_K", "attn_v": "Q6_K", "attn_output": "F16", "ffn_gate": "Q3_K",
         "ffn_up": "Q2_K", "ffn_down": "Q5_0", "token_embd": "BF16"}


def exported_in_formats_and_decoded_like_eager(gguf_module, kinds: dict, path, combined_build):
    """mixed_llama() written to `path` with each tensor kind in the format `kinds` gives it (llama-quantize's names:
    attn_q, ffn_down, ...), its file's tensors attached, exported with quantize="gguf" and written beside the file; the
    program decodes the eager model's tokens and logits. (names written, attached, the swapped model, program, .pte)."""
    import copy

    from models.hf_checkpoints import reference_decode
    from models.decoding import decode_runtime
    from flow.runtime import load_kernel_library
    from my_ops.hf import export_program

    model = mixed_llama()
    names = write_model_gguf(model, path, overrides={
        name: kind for name in gguf_names(model) for part, kind in kinds.items() if f"{part}." in name})
    attached = gguf_module.attach_blocks(model, str(path))
    reference = reference_decode(copy.deepcopy(model), "gguf", 32, [1, 5, 9], 6)
    swapped = copy.deepcopy(model)
    program = export_program(swapped, max_seq_len=32, quantize="gguf")
    pte = path.with_suffix(".pte")
    with open(pte, "wb") as f:
        program.write_to_file(f)
    load_kernel_library(combined_build.kernel_lib)
    decoded = decode_runtime(str(pte), [1, 5, 9], 6, generations=2)
    assert decoded.tokens == reference.tokens
    torch.testing.assert_close(decoded.logits, reference.logits, atol=1e-3, rtol=0)
    return names, attached, swapped, program, pte


def test_a_file_of_many_formats_runs_each_tensor_in_its_own_and_decodes_like_its_eager_reference(gguf_module, tmp_path,
                                                                                                combined_build):
    from my_ops.hf.quantize import formats_in

    names, attached, swapped, _, pte = exported_in_formats_and_decoded_like_eager(
        gguf_module, MIXED, tmp_path / "mixed.gguf", combined_build)
    assert set(attached.values()) == set(MIXED.values()) and len(attached) == len(names) - 5  # the 5 norms stay F32
    # each tensor in its format: q/k/v in three (a part each), gate/up in two, the tied table once in BF16
    assert formats_in(swapped) == {"Q4_K": 2, "Q5_K": 2, "Q6_K": 2, "F16": 2, "Q3_K": 2, "Q2_K": 2, "Q5_0": 2,
                                   "BF16": 2}
    file_bytes = sum(t.n_bytes for t in file_tensors(tmp_path / "mixed.gguf").values())
    assert abs(os.path.getsize(pte) / file_bytes - 1) < 0.05, (os.path.getsize(pte), file_bytes)


# llama-quantize's Q4_K_M and Q5_K_M: q and k in one format, v in another (half the layers of a Llama 3 file).
Q4_K_M_LAYER = {"attn_q": "Q4_K", "attn_k": "Q4_K", "attn_v": "Q6_K", "attn_output": "Q4_K", "ffn_gate": "Q4_K",
                "ffn_up": "Q4_K", "ffn_down": "Q6_K", "token_embd": "Q6_K"}


def test_a_layer_with_v_in_more_bits_is_one_fused_layer_and_decodes_like_its_eager_reference(gguf_module, tmp_path,
                                                                                            combined_build):
    # q and k joined into one projection, v beside it in its own format: the export pass still puts the whole layer
    # into my_ops::decoder_layer (v_weight, v_format), and the program decodes the eager model's tokens.
    from my_ops.hf.quantize import formats_in

    _, _, swapped, program, _ = exported_in_formats_and_decoded_like_eager(
        gguf_module, Q4_K_M_LAYER, tmp_path / "q4_k_m.gguf", combined_build)
    # per layer: q|k, o, gate|up in Q4_K; v and down in Q6_K; the tied table (embedding and output projection)
    assert formats_in(swapped) == {"Q4_K": 6, "Q6_K": 6}
    calls = [str(n.target) for n in program.exported_program().graph.nodes if n.op == "call_function"]
    layers = [n for n in program.exported_program().graph.nodes if "decoder_layer" in str(n.target)]
    assert len(layers) == 2 and all(len(n.args) == 20 and n.args[19] == "Q6_K" for n in layers), calls
    assert sum("linear_blocks" in c for c in calls) == 1  # the output projection alone


def test_a_model_built_without_weights_takes_the_files_tensors_and_exports_the_same_program(gguf_module, tmp_path):
    # The file's tensors given to a model built without weights (my_ops.hf.checkpoint.load(dequantize=False)): the
    # block and 16-bit matrices stay unallocated as float32 (no float copy of them exists), the norms and the float32
    # matrix come from the file, the tied output projection reads the embedding's table, and the program is the one
    # exported from the float32 model with the blocks attached, byte for byte.
    import copy

    from my_ops.hf import export_program
    from my_ops.hf.checkpoint import _model_on_file_tensors
    from my_ops.hf.disk_weights import tag_of

    model = mixed_llama()
    overrides = {name: kind for name in gguf_names(model) for part, kind in MIXED.items() if f"{part}." in name}
    overrides["blk.1.attn_output.weight"] = "F32"  # a matrix the file keeps in float32 stays a float32 parameter
    write_model_gguf(model, tmp_path / "mixed.gguf", overrides=overrides)
    path = str(tmp_path / "mixed.gguf")
    attached = gguf_module.attach_blocks(model, path)
    on_file = _model_on_file_tensors(copy.deepcopy(model.config), path)
    modules = dict(on_file.named_modules())
    assert on_file.lm_head.weight is on_file.model.embed_tokens.weight
    for name, original in model.named_parameters():
        value = on_file.get_parameter(name)
        blocks = getattr(modules[name.rsplit(".", 1)[0]], "gguf_blocks", None)
        if blocks is not None:
            assert value.is_meta, name
            torch.testing.assert_close(blocks[0], modules_of(model)[name.rsplit(".", 1)[0]].gguf_blocks[0],
                                       rtol=0, atol=0)
        elif name == "lm_head.weight":
            assert value.is_meta  # the embedding's, tied
        else:  # the file's float32 values, as transformers' loader made them (the model was written from them)
            assert not value.is_meta and torch.equal(value, original.detach()), name
    assert len(attached) == sum(hasattr(m, "gguf_blocks") for m in modules.values())
    expected = export_program(copy.deepcopy(model), max_seq_len=32, quantize="gguf").buffer
    assert export_program(copy.deepcopy(on_file), max_seq_len=32, quantize="gguf").buffer == expected
    # the packed weights waiting on disk while the program is emitted (my_ops/hf/disk_weights.py): the same bytes
    weights = tmp_path / "weights"
    weights.mkdir()
    program = export_program(on_file, max_seq_len=32, quantize="gguf", weights_dir=str(weights))
    held = sorted(weights.iterdir())
    assert len(held) == 14  # 2 layers x (q/k/v in 3 formats, output, gate/up in 2, down) + the tied table, once
    with open(tmp_path / "held.pte", "wb") as f:
        program.write_to_file(f)
    assert (tmp_path / "held.pte").read_bytes() == expected
    table = next(m for m in on_file.modules() if hasattr(m, "table")).table
    assert tag_of(table) is not None  # the model keeps placeholders
    # the file's tensors sent to disk as they are packed (load(weights_dir=...)), joined there by the swap
    on_disk = _model_on_file_tensors(copy.deepcopy(model.config), path, str(weights))
    blocks = [m.gguf_blocks[0] for m in on_disk.modules() if hasattr(m, "gguf_blocks")]
    assert blocks and all(tag_of(b) is not None for b in blocks)
    program = export_program(on_disk, max_seq_len=32, quantize="gguf", weights_dir=str(weights))
    with open(tmp_path / "on_disk.pte", "wb") as f:
        program.write_to_file(f)
    assert (tmp_path / "on_disk.pte").read_bytes() == expected


def test_weights_held_on_disk_reach_a_named_data_file_as_they_are(gguf_module, tmp_path):
    # The program with its weights in model.ptd (export_program's data_file): from the file's tensors waiting on disk,
    # the program and the data file are byte for byte those of the model holding its blocks in memory.
    import copy

    from my_ops.hf import export_program
    from my_ops.hf.checkpoint import _model_on_file_tensors
    from my_ops.hf.to_program import write_program

    model = mixed_llama()
    write_model_gguf(model, tmp_path / "mixed.gguf")
    path = str(tmp_path / "mixed.gguf")
    gguf_module.attach_blocks(model, path)
    written = {}
    for way in ("memory", "disk"):
        (tmp_path / way).mkdir()
        if way == "memory":
            program = export_program(copy.deepcopy(model), max_seq_len=32, quantize="gguf", data_file="model")
        else:
            weights = tmp_path / "weights"
            weights.mkdir()
            on_disk = _model_on_file_tensors(copy.deepcopy(model.config), path, str(weights))
            program = export_program(on_disk, max_seq_len=32, quantize="gguf", weights_dir=str(weights),
                                     data_file="model")
        written[way] = [open(f, "rb").read() for f in write_program(program, str(tmp_path / way / "model.pte"),
                                                                      "model")]
    assert [len(b) for b in written["disk"]] == [len(b) for b in written["memory"]]
    assert written["disk"] == written["memory"] and len(written["disk"][1]) > 20 * len(written["disk"][0])


def test_a_files_rope_factors_rotate_as_transformers_llama3_scaling(gguf_module, tmp_path):
    # Llama 3's rope scaling as llama.cpp's converter stores it (rope_freqs.weight, each frequency's divisor; made by
    # models/scale_models.py's llama3_rope_factors), read into a model built from the file's config, which has no
    # rope scaling: its rotary embedding's cos and sin, at every position, are those of transformers' own llama3
    # scaling of the same config. An original context of 64 puts the 8 frequencies in all three of its bands.
    import copy

    from transformers import LlamaForCausalLM

    from models.scale_models import llama3_rope_factors
    from my_ops.hf.checkpoint import _model_on_file_tensors, apply_rope_freqs
    from my_ops.hf.gguf_file import check

    model = tiny_llama()
    config = model.config
    scaling = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 64}
    theta = config.rope_parameters["rope_theta"]
    factors = llama3_rope_factors(theta, config.head_dim, 8.0, 1.0, 4.0, 64)
    assert sorted(set(np.round(factors, 4))) != [1.0] and factors.min() == 1 and factors.max() == 8
    assert ((factors > 1) & (factors < 8)).any()  # a smoothed band too
    write_model_gguf(model, tmp_path / "scaled.gguf", extra={"rope_freqs.weight": (factors, "F32")})
    scaled_config = copy.deepcopy(config)
    scaled_config.rope_parameters = {**scaling, "rope_theta": theta}
    expected_model = LlamaForCausalLM(scaled_config).eval()
    positions = torch.arange(200)[None]
    x = torch.zeros(1, 200, config.hidden_size)
    expected = expected_model.model.rotary_emb(x, positions)
    assert not torch.allclose(expected[0], model.model.rotary_emb(x, positions)[0])  # the scaling moves them
    header = check(str(tmp_path / "scaled.gguf"))
    on_file = _model_on_file_tensors(copy.deepcopy(config), str(tmp_path / "scaled.gguf"))  # --quantize gguf's path
    in_float32 = copy.deepcopy(model)  # the float32 path: from_pretrained's model, then the factors
    apply_rope_freqs(in_float32, header)
    for loaded in (on_file, in_float32):
        got = loaded.model.rotary_emb(x, positions)
        for a, b in zip(got, expected):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
    # factors that do not fit the model's rotary embedding: refused by name
    write_model_gguf(model, tmp_path / "wrong.gguf", extra={"rope_freqs.weight": (np.ones(5, np.float32), "F32")})
    with pytest.raises(gguf_module.UnsupportedTensorError, match="rope_freqs.weight holds 5 factors"):
        _model_on_file_tensors(copy.deepcopy(config), str(tmp_path / "wrong.gguf"))


def test_a_weight_placeholder_that_does_not_reach_the_program_is_refused(gguf_module, tmp_path):
    # A placeholder an export pass turned into another constant would leave its bytes in the program: refused.
    from my_ops.hf import export_program
    from my_ops.hf.disk_weights import DiskWeights
    from my_ops.hf.quantize import Linear, packed_buffers

    model = tiny_llama()
    write_model_gguf(model, tmp_path / "tiny.gguf")
    gguf_module.attach_blocks(model, str(tmp_path / "tiny.gguf"))
    program = export_program(model, max_seq_len=32, quantize="gguf")
    disk = DiskWeights(str(tmp_path))
    disk.hold_buffers(packed_buffers(Linear(torch.ones(64, 128, dtype=torch.uint8), "Q8_0", None, "test")))
    assert len(disk.expected) == 1  # a placeholder the program (exported apart) does not hold
    with pytest.raises(RuntimeError, match="1 of 1 weights did not reach the program as they were"):
        disk.fill(program)


# A model of 16-bit matrices exported with its weights on disk, in a fresh interpreter; the peak of the memory
# Python allocated inside to_executorch (tracemalloc: the emitter's copies are bytes objects; a resident-memory figure
# would miss them where the heap reuses what the model's making freed).
_EMITTING = """
import os
import tracemalloc
import torch
import my_ops.gguf
from executorch.exir.program._program import EdgeProgramManager
from transformers import LlamaConfig, LlamaForCausalLM
from my_ops.hf import export_program
from test_gguf import write_model_gguf

peaks = []
to_executorch = EdgeProgramManager.to_executorch
def measured(self, *args, **kwargs):
    tracemalloc.start()
    try:
        return to_executorch(self, *args, **kwargs)
    finally:
        peaks.append(tracemalloc.get_traced_memory()[1])
        tracemalloc.stop()
EdgeProgramManager.to_executorch = measured

torch.manual_seed(0)
model = LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=1024, intermediate_size=4096, num_hidden_layers=4,
                                     num_attention_heads=8, num_key_value_heads=8, head_dim=128)).eval()
write_model_gguf(model, os.path.join(FOLDER, "wide.gguf"), kind="F16")
my_ops.gguf.attach_blocks(model, os.path.join(FOLDER, "wide.gguf"))
program = export_program(model, max_seq_len=16, quantize="gguf", weights_dir=FOLDER, data_file=DATA_FILE)
written = [program._pte_data, *(program._tensor_data or {}).values()]
result = {"peak": peaks[0], "program": sum(map(len, written))}
"""


@pytest.mark.parametrize("data_file", [None, "model"])
def test_the_emitter_holds_one_weight_at_a_time_when_the_weights_wait_on_disk(data_file, combined_build, tmp_path):
    # ExecuTorch's emitter copies every constant out of its tensor and keeps the copies until the program is written;
    # a placeholder's copy is swapped for its file as the emitter stores it (in the program, or in its .ptd), so
    # emitting holds about one weight's bytes, not all of them (8B parameters in Q4_K_M: 4.6 GiB).
    from helpers import run_in_fresh_python

    measured = run_in_fresh_python(f"FOLDER, DATA_FILE = {str(tmp_path)!r}, {data_file!r}\n" + _EMITTING, timeout=600)
    assert measured["program"] > 64 << 20, measured  # the 16-bit matrices, 8 MiB each, 32 for the MLP's
    assert measured["peak"] < measured["program"] / 4, measured


def test_a_placeholder_is_forgotten_when_no_tensor_holds_its_memory(tmp_path):
    # disk_weights' registry of placeholders (tag -> file) lasts as long as a tensor over a placeholder's memory does:
    # a view keeps it, the last tensor's end removes it.
    import gc

    from my_ops.hf import disk_weights

    path = tmp_path / "weight"
    path.write_bytes(bytes(8192))
    placeholder = disk_weights._placeholder((64, 128), torch.uint8, str(path))
    tag = disk_weights.tag_of(placeholder)
    assert tag is not None and disk_weights._FILES[tag] == str(path)
    view = placeholder.view(-1)
    del placeholder
    gc.collect()
    assert disk_weights.tag_of(view) == tag
    del view
    gc.collect()
    assert tag not in disk_weights._FILES


def modules_of(model) -> dict:
    return dict(model.named_modules())


def test_a_parameter_the_file_lacks_is_refused_by_name(gguf_module, tmp_path):
    from my_ops.hf.checkpoint import _model_on_file_tensors

    model = tiny_llama()
    names = write_model_gguf(model, tmp_path / "tiny.gguf")
    lacking = {n: v for n, v in file_tensors(tmp_path / "tiny.gguf").items() if n != "blk.1.ffn_norm.weight"}
    write_gguf(tmp_path / "lacking.gguf", {n: (gguf_dequantized(t).reshape(tuple(reversed(t.shape.tolist()))),
                                                t.tensor_type.name) for n, t in lacking.items()})
    with pytest.raises(gguf_module.UnsupportedTensorError,
                       match=rf"no tensor for {re.escape(names['blk.1.ffn_norm.weight'])}: the file is not a whole "):
        _model_on_file_tensors(model.config, str(tmp_path / "lacking.gguf"))


def test_packed_parts_join_where_the_layout_lets_them(gguf_module):
    # Packed weights stacked by rows are the packing of the stacked rows when every part but the last holds whole
    # groups of 16 rows; otherwise the layer keeps its parts (None).
    from my_ops.hf.disk_weights import join_rows
    from my_ops.hf.quantize import pack

    generator = torch.Generator().manual_seed(0)
    parts = [torch.randn(rows, 64, generator=generator) for rows in (16, 17)]
    joined = join_rows([pack(p, "Q4_1") for p in parts], "Q4_1")
    assert torch.equal(joined, pack(torch.cat(parts), "Q4_1"))
    assert join_rows([pack(p, "Q4_1") for p in reversed(parts)], "Q4_1") is None
    halves = [p.half() for p in reversed(parts)]  # rows of a 16-bit format lie one after another: any count joins
    assert torch.equal(join_rows(halves, "F16"), torch.cat(halves))


def metadata_gguf(path, architecture: str, name: str) -> None:
    """A GGUF file with the metadata llama.cpp's converter writes (hyperparameters, a BPE vocabulary, a one-element
    array, strings naming the architecture) and one tensor, written by the gguf package."""
    import gguf

    writer = gguf.GGUFWriter(str(path), architecture)
    writer.add_name(name)
    writer.add_string("general.description", f"a small {architecture} model")
    writer.add_context_length(256)
    writer.add_embedding_length(64)
    writer.add_block_count(2)
    writer.add_feed_forward_length(128)
    writer.add_head_count(4)
    writer.add_head_count_kv(2)
    writer.add_rope_freq_base(10000.0)
    writer.add_layer_norm_rms_eps(1e-6)
    writer.add_array(f"{architecture}.attention.sliding_window_pattern", [6])
    writer.add_tokenizer_model("gpt2")
    writer.add_token_list([f"t{i}" for i in range(40)] + ["Ġa", "Ġb"])
    writer.add_token_types([1] * 42)
    writer.add_token_merges(["Ġ a"])  # one element: transformers reads the array as that element
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_add_bos_token(True)
    writer.add_tensor("token_embd.weight", np.zeros((42, 64), np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


@pytest.mark.parametrize("architecture,name", [("llama", "tiny"), ("llama", "mistral"), ("qwen3", "tiny"),
                                               ("gemma3", "tiny")])
def test_the_metadata_reads_as_transformers_reads_it(architecture, name, tmp_path):
    # my_ops.hf.gguf_file.transformers_reading makes transformers' load_gguf_checkpoint's result from the header the
    # check read (one reading of the file, no second parse of the vocabulary): equal to transformers' own, every group
    # and value, the architecture renames included (llama.cpp's llama named mistral is Mistral; gemma3 its text model).
    from my_ops.hf.gguf_file import check, transformers_reading
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    metadata_gguf(tmp_path / "m.gguf", architecture, name)
    theirs = load_gguf_checkpoint(str(tmp_path / "m.gguf"), return_tensors=False)
    assert transformers_reading(check(str(tmp_path / "m.gguf"))) == theirs
    assert theirs["config"]["model_type"] == {"tiny": architecture.replace("gemma3", "gemma3_text"),
                                              "mistral": "mistral"}[name]


def test_the_header_is_read_without_reading_the_tensors(tmp_path):
    # A file whose one tensor is 1 GiB (a hole on disk): check() reads the header through a map, so the process does
    # not grow by the tensor's size (a read of the whole file did).
    import subprocess
    import sys

    import gguf
    from helpers import REPO_ROOT

    path = tmp_path / "big.gguf"
    writer = gguf.GGUFWriter(str(path), "llama")
    rows, row_bytes = (1 << 30) // 4352, 4352  # Q8_0 rows of 4096 weights
    writer.add_tensor_info("token_embd.weight", (rows, row_bytes), np.dtype(np.uint8), rows * row_bytes,
                           raw_dtype=gguf.GGMLQuantizationType.Q8_0)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    writer.close()
    os.truncate(path, (os.path.getsize(path) + 31) // 32 * 32 + rows * row_bytes)  # the data: a hole
    code = ("import resource, sys; from my_ops.hf.gguf_file import check; before = resource.getrusage("
            "resource.RUSAGE_SELF).ru_maxrss; found = check(sys.argv[1]); print(len(found.tensors), "
            "(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) // 1024)")
    out = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True, text=True, cwd=REPO_ROOT,
                         check=True).stdout.split()
    assert out[0] == "1" and int(out[1]) < 64, out  # MiB grown


def mixed_llama():
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=64, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=64, tie_word_embeddings=True)
    torch.manual_seed(0)
    return LlamaForCausalLM(config).eval()


def gguf_names(model) -> list[str]:
    from transformers.modeling_gguf_pytorch_utils import get_gguf_hf_weights_map

    return list(get_gguf_hf_weights_map(model))


# ---- The file checked whole before it is read (my_ops/hf/gguf_file.py) ----------------------------------------------
def varied_gguf(path) -> None:
    """A GGUF file written by the gguf package with a key-value pair of every value kind and tensors of three types."""
    import gguf

    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_uint32("test.u32", 7)
    writer.add_int64("test.i64", -5)
    writer.add_float32("test.f32", 0.25)
    writer.add_bool("test.flag", True)
    writer.add_string("test.text", "ünïcode")
    writer.add_array("test.ints", [1, 2, 3])
    writer.add_array("test.words", ["a", "bb", ""])
    generator = np.random.default_rng(3)
    writer.add_tensor("norm", generator.standard_normal(64).astype(np.float32))
    writer.add_tensor("q8", gguf.quants.quantize(generator.standard_normal((4, 64)).astype(np.float32),
                                                  gguf.GGMLQuantizationType.Q8_0), raw_dtype=gguf.GGMLQuantizationType.Q8_0)
    writer.add_tensor("q4k", random_kquant((2, 256), "Q4_K", generator), raw_dtype=gguf.GGMLQuantizationType.Q4_K)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def test_the_check_reads_every_field_as_the_gguf_packages_reader_does(tmp_path):
    import gguf

    from my_ops.hf.gguf_file import check

    varied_gguf(tmp_path / "v.gguf")
    found, reader = check(str(tmp_path / "v.gguf")), gguf.GGUFReader(str(tmp_path / "v.gguf"))
    assert found.version == 3
    assert found.metadata == {name: field.contents() for name, field in reader.fields.items()
                              if not name.startswith("GGUF.")}
    assert [(t.name, t.shape, t.type_id, found.data_start + t.offset, t.nbytes) for t in found.tensors] == [
        (t.name, tuple(int(n) for n in t.shape), int(t.tensor_type), int(t.data_offset), int(t.n_bytes))
        for t in reader.tensors]


def header_field_offsets(path) -> dict[str, int]:
    """Where each header field the mutants below overwrite starts, found by walking the file as the format defines."""
    import struct

    data = open(path, "rb").read()
    at = {"magic": 0, "version": 4, "tensor count": 8, "pair count": 16}
    cursor = 24
    for index in range(struct.unpack_from("<Q", data, 16)[0]):
        length = struct.unpack_from("<Q", data, cursor)[0]
        key = data[cursor + 8:cursor + 8 + length].decode()
        at.setdefault("a key's length", cursor)
        cursor += 8 + length
        kind = struct.unpack_from("<I", data, cursor)[0]
        at[f"value type of {key}"] = cursor
        cursor += 4
        if kind == 9:
            element, count = struct.unpack_from("<IQ", data, cursor)
            at[f"element type of {key}"], at[f"count of {key}"] = cursor, cursor + 4
            cursor += 12
            for _ in range(count):
                if element == 8:
                    cursor += 8 + struct.unpack_from("<Q", data, cursor)[0]
                else:
                    cursor += struct.calcsize("<" + {4: "I", 5: "i", 10: "Q", 11: "q"}.get(element, "i"))
        elif kind == 8:
            cursor += 8 + struct.unpack_from("<Q", data, cursor)[0]
        else:
            cursor += {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}[kind]
    for index in range(struct.unpack_from("<Q", data, 8)[0]):
        length = struct.unpack_from("<Q", data, cursor)[0]
        name = data[cursor + 8:cursor + 8 + length].decode()
        cursor += 8 + length
        dims = struct.unpack_from("<I", data, cursor)[0]
        at[f"dimensions of {name}"], at[f"first size of {name}"] = cursor, cursor + 4
        cursor += 4 + 8 * dims
        at[f"type of {name}"], at[f"offset of {name}"] = cursor, cursor + 4
        cursor += 12
    at["end of the infos"] = cursor
    return at


# (field, bytes written there (little-endian), words the error must hold)
MUTANTS = [
    ("magic", b"GGML", "is not a GGUF file"),
    ("version", (1).to_bytes(4, "little"), "GGUF version 1"),
    ("version", (9).to_bytes(4, "little"), "GGUF version 9"),
    ("tensor count", (2 ** 63 - 1).to_bytes(8, "little"), "claims 9223372036854775807 tensors"),
    ("pair count", (2 ** 40).to_bytes(8, "little"), "key-value pairs, more than"),
    ("a key's length", (2 ** 50).to_bytes(8, "little"), "cut short"),
    ("value type of test.u32", (13).to_bytes(4, "little"), "value type 13, which GGUF does not define"),
    ("value type of test.u32", (4278190088).to_bytes(4, "little"), "value type 4278190088"),
    ("element type of test.ints", (9).to_bytes(4, "little"), "an array of value type 9"),
    ("count of test.words", (2 ** 60).to_bytes(8, "little"), "claims 1152921504606846976 elements"),
    ("dimensions of q8", (0).to_bytes(4, "little"), "claims 0 dimensions"),
    ("dimensions of q8", (5).to_bytes(4, "little"), "claims 5 dimensions"),
    ("first size of q8", (60).to_bytes(8, "little"), "rows are not whole blocks of 32 weights"),
    ("first size of q4k", (2 ** 61).to_bytes(8, "little"), "rows are not whole blocks"),
    ("type of q8", (200).to_bytes(4, "little"), "has type 200, which the gguf package does not know"),
    ("offset of q4k", (3).to_bytes(8, "little"), "is not aligned to 32 bytes"),
    ("offset of q4k", (2 ** 40).to_bytes(8, "little"), "is cut short"),
]


@pytest.mark.parametrize("field, value, words", MUTANTS, ids=[f"{m[0]}={int.from_bytes(m[1], 'little')}" if m[0] != "magic"
                                                              else "magic" for m in MUTANTS])
def test_a_damaged_header_field_is_one_error_naming_the_file_and_the_way_out(field, value, words, tmp_path):
    from my_ops.hf.gguf_file import DamagedFileError, check

    varied_gguf(tmp_path / "v.gguf")
    data = bytearray((tmp_path / "v.gguf").read_bytes())
    at = header_field_offsets(tmp_path / "v.gguf")[field]
    data[at:at + len(value)] = value
    (tmp_path / "bad.gguf").write_bytes(bytes(data))
    with pytest.raises(DamagedFileError) as error:
        check(str(tmp_path / "bad.gguf"))
    assert words in str(error.value) and str(tmp_path / "bad.gguf") in str(error.value), str(error.value)
    assert "download" in str(error.value) or "convert" in str(error.value) or "upgrade" in str(error.value)


def test_a_file_cut_anywhere_is_one_error_naming_what_is_missing(tmp_path):
    # Cut inside every part: the magic, the counts, a key, a string array, the tensor infos, each tensor's data, and
    # one byte short of whole. Each is a DamagedFileError (no numpy error, no traceback); a cut into the data names the
    # tensor, the bytes it needs and the bytes there are.
    from my_ops.hf.gguf_file import DamagedFileError, check

    varied_gguf(tmp_path / "v.gguf")
    data = (tmp_path / "v.gguf").read_bytes()
    whole = check(str(tmp_path / "v.gguf"))
    at = header_field_offsets(tmp_path / "v.gguf")
    cuts = [2, 6, 12, 20, at["a key's length"] + 3, at["count of test.words"] + 10, at["dimensions of q8"] + 2,
            at["end of the infos"] - 1] + [whole.data_start + t.offset + t.nbytes // 2 for t in whole.tensors] + [
        len(data) - 1]
    for cut in cuts:
        (tmp_path / "cut.gguf").write_bytes(data[:cut])
        with pytest.raises(DamagedFileError, match="cut short|not a GGUF file") as error:
            check(str(tmp_path / "cut.gguf"))
        if cut >= whole.data_start:
            assert re.search(r"tensor '\w+' \(\w+ \[[0-9, ]+\], \d+ bytes\) needs bytes \d+ to \d+ of the file, which "
                             rf"has {cut}", str(error.value)), str(error.value)


def test_random_damage_to_the_header_is_never_another_exception(tmp_path):
    # Any bytes at all: the check answers with the file read or a DamagedFileError, never an exception of its own.
    from my_ops.hf.gguf_file import DamagedFileError, check

    varied_gguf(tmp_path / "v.gguf")
    data = (tmp_path / "v.gguf").read_bytes()
    header = header_field_offsets(tmp_path / "v.gguf")["end of the infos"]
    generator = np.random.default_rng(11)
    refused = 0
    for _ in range(400):
        damaged = bytearray(data)
        for at in generator.integers(0, header, generator.integers(1, 4)):
            damaged[at] = generator.integers(0, 256)
        (tmp_path / "d.gguf").write_bytes(bytes(damaged))
        try:
            check(str(tmp_path / "d.gguf"))
        except DamagedFileError:
            refused += 1
    assert refused > 100  # the damage reached the checks


def test_generate_on_a_cut_file_says_so_in_one_line(tmp_path, combined_build):
    # The user's command on the shipped file cut short at 50 MB, as a stopped download leaves it.
    from models.real_models import gguf_path
    from helpers import run_flow

    with open(gguf_path(), "rb") as f:
        (tmp_path / "cut.gguf").write_bytes(f.read(50_000_000))
    proc = run_flow("my_ops.hf", "generate", "--model", str(tmp_path / "cut.gguf"), "--quantize", "gguf", "--prompt",
                    "Hi", "--build_dir", combined_build.build_dir)
    assert proc.returncode == 1 and proc.stdout == "", proc.stderr[-3000:]
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert re.search(r"cut\.gguf: tensor 'blk\.\d+\.\w+\.weight' \(Q4_1 .*\) needs bytes \d+ to \d+ of the file, which "
                     r"has 50000000: the file is cut short .*download it again", errors[0]), errors[0]


# The export command with its two steps noted in order: the tokenizer built (gguf_tokenizer.from_file, which every
# GGUF tokenizer comes from) and the program written.
_NOTED_EXPORT = """
import sys
from my_ops.hf import __main__ as command, gguf_tokenizer, to_program
events = []
def noting(module, name, event):
    step = getattr(module, name)
    def noted(*args, **kwargs):
        result = step(*args, **kwargs)
        events.append(event)
        return result
    setattr(module, name, noted)
noting(gguf_tokenizer, "from_file", "tokenizer built")
noting(to_program, "write_program", "program written")
code = command.main(sys.argv[1:])
print("events:", events)
sys.exit(code)
"""


def test_the_export_command_builds_the_tokenizer_after_the_program_is_written(combined_build, tmp_path):
    # An export needs no tokenizer; a large vocabulary's held through it raised the peak (Gemma 3's: ~0.4 GiB). The
    # files it writes are still the tokenizer's: the same ids for a text, the normalizer ExecuTorch's runner reads.
    import json

    from tokenizers import Tokenizer

    import forked_python
    from helpers import REPO_ROOT
    from models.real_models import gguf_path
    from my_ops.hf.gguf_tokenizer import load

    proc = forked_python.python(["-c", _NOTED_EXPORT, "export", "--model", gguf_path(), "--quantize", "gguf",
                                 "--layers", "1", "--max_seq_len", "16", "--output", str(tmp_path),
                                 "--build_dir", combined_build.build_dir],
                                dict(os.environ, PYTHONPATH=REPO_ROOT), 600, cwd=REPO_ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "events: ['program written', 'tokenizer built']" in proc.stdout, proc.stdout
    text = "The capital of France is Paris; 1,234 ¼ kilos."
    written = str(tmp_path / "tokenizer.json")
    assert Tokenizer.from_file(written).encode(text).ids == load(gguf_path())[0](text)["input_ids"]
    with open(written, encoding="utf-8") as f:
        assert json.load(f)["normalizer"] is None  # the converter's empty Sequence, which the runner refuses
