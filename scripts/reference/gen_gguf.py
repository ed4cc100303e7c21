"""make_reference.py's GGUF part: tiny_llama written as GGUF v3 the way llama.cpp's converter
does (Q/K rows permuted, mixed tensor types, SPM tokenizer metadata), and the dequantized
tensors mapped back into an HF state dict."""
import shutil

import gguf
import numpy as np
import torch

from .gen_chat import LLAMA2_CHAT_TEMPLATE
from .gen_common import log, rel


# --------------------------------------------------------------------------------------- GGUF

def permute_qk(w, n_head, n_head_kv=None):
    """convert_hf_to_gguf.py LlamaModel.permute: HF (rotate-half) -> GGUF (interleaved)."""
    if n_head_kv is not None and n_head != n_head_kv:
        n_head = n_head_kv
    return (w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:])
            .swapaxes(1, 2).reshape(w.shape))


def unpermute_qk(w, n_head, n_head_kv=None):
    """Inverse of permute_qk (what transformers' GGUF loader does)."""
    if n_head_kv is not None and n_head != n_head_kv:
        n_head = n_head_kv
    return (w.reshape(n_head, w.shape[0] // n_head // 2, 2, *w.shape[1:])
            .swapaxes(1, 2).reshape(w.shape))


Q = gguf.GGMLQuantizationType
# layer 0 all F32; layer 1 a mix of quantized types; norms F32
GGUF_TYPES = {
    "token_embd.weight": Q.F16,
    "output.weight": Q.Q8_0,
    "blk.1.attn_q.weight": Q.Q8_0,
    "blk.1.attn_k.weight": Q.Q8_0,
    "blk.1.attn_v.weight": Q.Q4_0,
    "blk.1.attn_output.weight": Q.BF16,
    "blk.1.ffn_gate.weight": Q.Q4_1,
    "blk.1.ffn_up.weight": Q.Q8_0,
    "blk.1.ffn_down.weight": Q.Q8_0,
}


def write_tiny_llama_gguf(path, cfg, sd, vocab, scores):
    """Writes the tiny llama as GGUF v3; returns ({gguf name: dequantized float32 ndarray in
    GGUF row layout}, {gguf name: type name})."""
    log(f"writing {rel(path)}")
    if path.parent.exists():
        shutil.rmtree(path.parent)
    path.parent.mkdir(parents=True)
    nq, nkv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    per_layer = {"input_layernorm": "attn_norm", "self_attn.q_proj": "attn_q",
                 "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
                 "self_attn.o_proj": "attn_output", "post_attention_layernorm": "ffn_norm",
                 "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down"}
    tensors = {}
    tensors["token_embd.weight"] = sd["model.embed_tokens.weight"]
    for i in range(cfg["num_hidden_layers"]):
        for hf, gg in per_layer.items():
            tensors[f"blk.{i}.{gg}.weight"] = sd[f"model.layers.{i}.{hf}.weight"]
    tensors["output_norm.weight"] = sd["model.norm.weight"]
    tensors["output.weight"] = sd["lm_head.weight"]

    w = gguf.GGUFWriter(str(path), "llama")
    w.add_name("tiny_llama")
    w.add_description("thetaserve test model: random weights, not a language model")
    w.add_context_length(cfg["max_position_embeddings"])
    w.add_embedding_length(cfg["hidden_size"])
    w.add_block_count(cfg["num_hidden_layers"])
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_head_count(nq)
    w.add_head_count_kv(nkv)
    w.add_rope_dimension_count(cfg["head_dim"])
    w.add_rope_freq_base(cfg["rope_theta"])
    w.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    w.add_key_length(cfg["head_dim"])
    w.add_value_length(cfg["head_dim"])
    w.add_vocab_size(cfg["vocab_size"])
    w.add_file_type(gguf.LlamaFileType.MOSTLY_Q8_0)
    w.add_quantization_version(gguf.GGML_QUANT_VERSION)
    # tokenizer (llama.cpp "llama" = SentencePiece-style)
    types = ([gguf.TokenType.UNKNOWN, gguf.TokenType.CONTROL, gguf.TokenType.CONTROL]
             + [gguf.TokenType.BYTE] * 256
             + [gguf.TokenType.NORMAL] * (len(vocab) - 259))
    w.add_tokenizer_model("llama")
    w.add_tokenizer_pre("default")
    w.add_token_list(vocab)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_unk_token_id(0)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_add_bos_token(True)
    w.add_add_eos_token(False)
    w.add_add_space_prefix(True)
    w.add_chat_template(LLAMA2_CHAT_TEMPLATE)

    deq, type_names = {}, {}
    for name, t in tensors.items():
        a = t.float().numpy()
        if name.endswith("attn_q.weight"):
            a = permute_qk(a, nq, nq)
        elif name.endswith("attn_k.weight"):
            a = permute_qk(a, nq, nkv)
        a = np.ascontiguousarray(a, dtype=np.float32)
        qt = GGUF_TYPES.get(name, Q.F32)
        if qt == Q.F32:
            w.add_tensor(name, a)
            d = a
        elif qt == Q.F16:
            h = a.astype(np.float16)
            w.add_tensor(name, h)
            d = h.astype(np.float32)
        else:
            qd = gguf.quants.quantize(a, qt)
            w.add_tensor(name, qd, raw_shape=qd.shape, raw_dtype=qt)
            d = gguf.quants.dequantize(qd, qt).reshape(a.shape).astype(np.float32)
        deq[name] = d
        type_names[name] = qt.name
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return deq, type_names


def hf_sd_from_gguf_dequant(deq, cfg):
    """Inverse mapping: dequantized GGUF tensors -> HF state dict (Q/K un-permuted)."""
    nq, nkv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    sd = {"model.embed_tokens.weight": deq["token_embd.weight"],
          "model.norm.weight": deq["output_norm.weight"],
          "lm_head.weight": deq["output.weight"]}
    per_layer = {"attn_norm": "input_layernorm", "attn_q": "self_attn.q_proj",
                 "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
                 "attn_output": "self_attn.o_proj", "ffn_norm": "post_attention_layernorm",
                 "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj"}
    for i in range(cfg["num_hidden_layers"]):
        for gg, hf in per_layer.items():
            a = deq[f"blk.{i}.{gg}.weight"]
            if gg == "attn_q":
                a = unpermute_qk(a, nq, nq)
            elif gg == "attn_k":
                a = unpermute_qk(a, nq, nkv)
            sd[f"model.layers.{i}.{hf}.weight"] = a
    return {k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in sd.items()}
