"""my_ops.gguf, the reader of a llama.cpp GGUF file's own blocks, against the format's own writer and readers: files
written by the gguf package (GGUFWriter, its quantizers), read back field by field and compared with the gguf package's
dequantizers and transformers' undoing of llama.cpp's Q/K row order; the blocks packed for the kernels read back by
the ops' ATen references; types the ops do not take refused by name before anything is attached."""

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


def write_gguf(path, tensors: dict) -> None:
    """A GGUF file of `tensors` ({name: (float32 array, GGUF type name)}), written by the gguf package: its quantizers'
    blocks, random K-quant blocks of the array's shape, or zero bytes of a type it does not write (IQ4_NL)."""
    import gguf

    writer = gguf.GGUFWriter(str(path), "llama")
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
        assert codes.shape == (rows, inputs) and records.shape[:2] == (rows, inputs // reference.FORMATS[kind].weights)
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


def write_model_gguf(model, path, kind: str = "Q4_1", overrides: dict | None = None) -> dict:
    """The model's tensors as llama.cpp's converter names and orders them, its matrices quantized to `kind`
    (`overrides`: {GGUF name: type}), the norms float32; returns {GGUF name: transformers parameter}."""
    from transformers.modeling_gguf_pytorch_utils import get_gguf_hf_weights_map

    names = get_gguf_hf_weights_map(model)
    parameters = dict(model.named_parameters())
    config = model.config
    tensors = {}
    for gguf_name, hf_name in names.items():
        if hf_name not in parameters or gguf_name in tensors:
            continue
        weight = parameters[hf_name].detach().numpy()
        if ".attn_q." in gguf_name or ".attn_k." in gguf_name:
            heads = config.num_attention_heads if ".attn_q." in gguf_name else config.num_key_value_heads
            weight = llama_cpp_permute(weight, heads)
        tensors[gguf_name] = (weight, (overrides or {}).get(gguf_name, kind if weight.ndim == 2 else "F32"))
    write_gguf(path, tensors)
    return {n: h for n, h in names.items() if n in tensors}


def test_attached_blocks_are_the_files_in_transformers_row_order(gguf_module, tmp_path):
    # Every matrix of a small llama written as llama.cpp's converter writes it (Q and K rows permuted for its rotary
    # layout), attached to the model: the blocks dequantized equal the gguf package's dequantization of the file's
    # tensor put back in transformers' order by transformers' own loader step.
    from flow.declarations import import_repository_module
    from my_ops.hf.quantize import interleave
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
        codes, records, fmt = modules[names[name].rsplit(".", 1)[0]].gguf_blocks
        assert fmt == "Q4_1"
        got = reference.dequantize(interleave(codes, records, fmt), fmt).numpy()
        np.testing.assert_array_equal(got, expected, err_msg=name)


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
    from my_ops.hf.checkpoint import Checkpoint
    from my_ops.hf.export import export_checkpoint

    with pytest.raises(my_ops.hf.UnsupportedModelError, match="carries none"):
        my_ops.hf.prepare(tiny_llama(), max_seq_len=16, quantize="gguf")
    folder = Checkpoint(tiny_llama(), None, str(tmp_path))
    with pytest.raises(my_ops.hf.UnsupportedModelError, match="give a .gguf file"):
        export_checkpoint(folder, max_seq_len=16, quantize="gguf")


def test_the_tiny_gguf_model_decodes_like_its_eager_reference(gguf_module, tmp_path, combined_build):
    # The small llama's own GGUF blocks through export into a program, decoded twice in the Python runtime: the same
    # logits as the model on the same blocks in eager PyTorch with every my_ops op computed by its ATen reference.
    import copy

    from flow.hf import reference_decode
    from flow.model import decode_runtime
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
