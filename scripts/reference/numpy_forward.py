#!/usr/bin/env python3
"""Independent NumPy re-implementation of the LLaMA/Qwen2 forward pass, used to cross-check the
committed reference logits (computed with HF transformers) without transformers:

  * safetensors models (tiny_llama F32, tiny_qwen2 BF16 shards + QKV bias + tied embeddings),
    RoPE in HF's rotate-half form;
  * GGUF models (tiny_llama_gguf, SmolLM2 Q4_1), read the way llama.cpp reads them: tensors
    dequantized with gguf-py, Q/K left PERMUTED as stored and RoPE applied to adjacent pairs
    (llama.cpp's "normal" rope mode) -- this checks the file's permutation convention.

Usage (repo root):  python3 scripts/reference/numpy_forward.py [tiny_llama tiny_qwen2
                    tiny_llama_gguf smollm2]
Prints the max |logit difference| against tests/data/reference/<name>.logits.bin per case.
"""
import json
import sys
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[2]
REF = REPO / "tests" / "data" / "reference"


def rms_norm(x, w, eps):
    x64 = x.astype(np.float64)
    return (x64 / np.sqrt((x64 * x64).mean(-1, keepdims=True) + eps) * w).astype(np.float32)


def rope(x, pos, theta, interleaved):
    """x: [T, H, d]."""
    d = x.shape[-1]
    inv = theta ** (-np.arange(0, d, 2, dtype=np.float64) / d)          # [d/2]
    ang = pos[:, None].astype(np.float64) * inv[None, :]                 # [T, d/2]
    cos, sin = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]
    x = x.astype(np.float64)
    if interleaved:
        a, b = x[..., 0::2], x[..., 1::2]
        out = np.empty_like(x)
        out[..., 0::2] = a * cos - b * sin
        out[..., 1::2] = a * sin + b * cos
    else:
        a, b = x[..., : d // 2], x[..., d // 2:]
        out = np.concatenate([a * cos - b * sin, a * sin + b * cos], axis=-1)
    return out.astype(np.float32)


def forward(W, cfg, ids, interleaved):
    nq, nkv, hd = cfg["nq"], cfg["nkv"], cfg["hd"]
    T = len(ids)
    x = W["embed"][np.asarray(ids)]
    pos = np.arange(T)
    mask = np.triu(np.full((T, T), -np.inf, dtype=np.float32), 1)
    for L in W["layers"]:
        h = rms_norm(x, L["attn_norm"], cfg["eps"])
        q, k, v = h @ L["wq"].T, h @ L["wk"].T, h @ L["wv"].T
        if "bq" in L:
            q, k, v = q + L["bq"], k + L["bk"], v + L["bv"]
        q = rope(q.reshape(T, nq, hd), pos, cfg["theta"], interleaved)
        k = rope(k.reshape(T, nkv, hd), pos, cfg["theta"], interleaved)
        v = v.reshape(T, nkv, hd)
        rep = nq // nkv
        k, v = np.repeat(k, rep, axis=1), np.repeat(v, rep, axis=1)
        s = np.einsum("thd,shd->hts", q, k) / np.sqrt(hd) + mask
        s = np.exp(s - s.max(-1, keepdims=True))
        p = s / s.sum(-1, keepdims=True)
        o = np.einsum("hts,shd->thd", p, v).reshape(T, nq * hd)
        x = x + o @ L["wo"].T
        h = rms_norm(x, L["ffn_norm"], cfg["eps"])
        g, u = h @ L["wg"].T, h @ L["wu"].T
        x = x + ((g / (1.0 + np.exp(-g))) * u) @ L["wd"].T
    x = rms_norm(x, W["norm"], cfg["eps"])
    return x @ W["out"].T


def load_safetensors(d):
    from safetensors.torch import load_file as tload  # torch tensors: numpy lacks bf16
    cfg = json.loads((d / "config.json").read_text())
    files = sorted(d.glob("*.safetensors"))
    sd = {}
    for f in files:
        sd.update({k: v.float().numpy() for k, v in tload(str(f)).items()})
    c = {"hidden": cfg["hidden_size"], "nq": cfg["num_attention_heads"],
         "nkv": cfg["num_key_value_heads"], "hd": cfg.get("head_dim") or
         cfg["hidden_size"] // cfg["num_attention_heads"], "eps": cfg["rms_norm_eps"],
         "theta": cfg["rope_theta"]}
    W = {"embed": sd["model.embed_tokens.weight"], "norm": sd["model.norm.weight"],
         "out": sd.get("lm_head.weight", sd["model.embed_tokens.weight"]), "layers": []}
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        L = {"attn_norm": sd[p + "input_layernorm.weight"],
             "ffn_norm": sd[p + "post_attention_layernorm.weight"],
             "wq": sd[p + "self_attn.q_proj.weight"], "wk": sd[p + "self_attn.k_proj.weight"],
             "wv": sd[p + "self_attn.v_proj.weight"], "wo": sd[p + "self_attn.o_proj.weight"],
             "wg": sd[p + "mlp.gate_proj.weight"], "wu": sd[p + "mlp.up_proj.weight"],
             "wd": sd[p + "mlp.down_proj.weight"]}
        if p + "self_attn.q_proj.bias" in sd:
            L.update(bq=sd[p + "self_attn.q_proj.bias"], bk=sd[p + "self_attn.k_proj.bias"],
                     bv=sd[p + "self_attn.v_proj.bias"])
        W["layers"].append(L)
    return W, c


def load_gguf(path):
    import gguf
    r = gguf.GGUFReader(str(path))
    arch = r.fields["general.architecture"].contents()

    def kv(k):
        return r.fields[f"{arch}.{k}"].contents()
    T = {}
    for t in r.tensors:
        shape = [int(s) for s in reversed(t.shape)]   # numpy order: [rows, cols]
        T[t.name] = gguf.quants.dequantize(t.data, t.tensor_type).reshape(shape).astype(np.float32)
    c = {"hidden": kv("embedding_length"), "nq": kv("attention.head_count"),
         "nkv": kv("attention.head_count_kv"), "eps": kv("attention.layer_norm_rms_epsilon"),
         "theta": kv("rope.freq_base")}
    c["hd"] = c["hidden"] // c["nq"]
    W = {"embed": T["token_embd.weight"], "norm": T["output_norm.weight"],
         "out": T.get("output.weight", T["token_embd.weight"]), "layers": []}
    for i in range(kv("block_count")):
        p = f"blk.{i}."
        W["layers"].append({"attn_norm": T[p + "attn_norm.weight"],
                            "ffn_norm": T[p + "ffn_norm.weight"],
                            "wq": T[p + "attn_q.weight"], "wk": T[p + "attn_k.weight"],
                            "wv": T[p + "attn_v.weight"], "wo": T[p + "attn_output.weight"],
                            "wg": T[p + "ffn_gate.weight"], "wu": T[p + "ffn_up.weight"],
                            "wd": T[p + "ffn_down.weight"]})
    return W, c


def check(name):
    meta = json.loads((REF / f"{name}.json").read_text())
    V = meta["vocab_size"]
    logits = np.fromfile(REF / meta["logits_file"], dtype="<f4").reshape(-1, V)
    path = REPO / meta["model_path"]
    if meta["format"] == "gguf":
        W, c = load_gguf(path)
        interleaved = True
    else:
        W, c = load_safetensors(path)
        interleaved = False
    worst = 0.0
    for case in meta["cases"]:
        rows = logits[case["logits_first_row"]: case["logits_first_row"] + case["logits_rows"]]
        if meta["logits_scope"] == "all_positions":
            ids = case["prompt_ids"] + case["greedy_ids"]
            got = forward(W, c, ids, interleaved)
        else:
            got = forward(W, c, case["prompt_ids"], interleaved)[-1:]
        diff = float(np.abs(got - rows).max())
        agree = bool((got.argmax(-1) == rows.argmax(-1)).all())
        scale = float(np.abs(rows).max())
        worst = max(worst, diff)
        print(f"{name:16s} {case['name']:14s} rows {rows.shape[0]:4d}  max|dlogit| {diff:.2e}"
              f"  (max|logit| {scale:.2f})  argmax agree {agree}")
    return worst


if __name__ == "__main__":
    names = sys.argv[1:] or ["tiny_llama", "tiny_qwen2", "tiny_llama_gguf", "smollm2"]
    for n in names:
        if n == "smollm2" and not (REPO / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf").exists():
            print("smollm2: model not fetched, skipped")
            continue
        check(n)
