"""make_reference.py's tiny models: the tiny_llama and tiny_qwen2 configs, their random weights,
loading a state dict into the HF model, and writing each model directory in HF format
(config, safetensors, tokenizer.json, tokenizer_config.json, generation_config.json)."""
import shutil

import torch
import transformers
from safetensors.torch import save_file

from .gen_chat import CHATML_TEMPLATE, LLAMA2_CHAT_TEMPLATE
from .gen_common import SEED, die, log, rel, write_json
from .gen_tokenizers import SPM_SPECIALS


# ==================================================================================== models

def _randn(g, shape, std, mean=0.0):
    return (torch.randn(*shape, generator=g, dtype=torch.float32) * std + mean).contiguous()


def llama_config(vocab_size):
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": vocab_size,
        "hidden_size": 64,
        "intermediate_size": 160,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "hidden_act": "silu",
        "max_position_embeddings": 256,
        "rms_norm_eps": 1e-05,
        "rope_theta": 10000.0,
        "rope_scaling": None,
        "attention_bias": False,
        "attention_dropout": 0.0,
        "mlp_bias": False,
        "tie_word_embeddings": False,
        "bos_token_id": 1,
        "eos_token_id": 2,
        "initializer_range": 0.02,
        "pretraining_tp": 1,
        "use_cache": True,
        "torch_dtype": "float32",
    }


def qwen2_config(vocab_size, bos_id, eos_id):
    return {
        "architectures": ["Qwen2ForCausalLM"],
        "model_type": "qwen2",
        "vocab_size": vocab_size,
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 1,
        "head_dim": 16,
        "hidden_act": "silu",
        "max_position_embeddings": 256,
        "rms_norm_eps": 1e-06,
        "rope_theta": 1000000.0,
        "rope_scaling": None,
        "attention_dropout": 0.0,
        "use_sliding_window": False,
        "sliding_window": None,
        "max_window_layers": 2,
        "tie_word_embeddings": True,
        "bos_token_id": bos_id,
        "eos_token_id": eos_id,
        "initializer_range": 0.02,
        "use_cache": True,
        "torch_dtype": "bfloat16",
    }


def random_llama_weights(cfg, seed, std=0.15, embed_std=0.2, bias=False, tied=False):
    """HF-named random weights (float32). Norm weights ~ 1 + 0.1 N(0,1)."""
    g = torch.Generator().manual_seed(seed)
    H, I, V = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"]
    hd = cfg["head_dim"]
    nq, nkv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    sd = {"model.embed_tokens.weight": _randn(g, (V, H), embed_std)}
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        sd[p + "input_layernorm.weight"] = _randn(g, (H,), 0.1, 1.0)
        sd[p + "self_attn.q_proj.weight"] = _randn(g, (nq * hd, H), std)
        sd[p + "self_attn.k_proj.weight"] = _randn(g, (nkv * hd, H), std)
        sd[p + "self_attn.v_proj.weight"] = _randn(g, (nkv * hd, H), std)
        if bias:
            sd[p + "self_attn.q_proj.bias"] = _randn(g, (nq * hd,), 0.1)
            sd[p + "self_attn.k_proj.bias"] = _randn(g, (nkv * hd,), 0.1)
            sd[p + "self_attn.v_proj.bias"] = _randn(g, (nkv * hd,), 0.1)
        sd[p + "self_attn.o_proj.weight"] = _randn(g, (H, nq * hd), std)
        sd[p + "post_attention_layernorm.weight"] = _randn(g, (H,), 0.1, 1.0)
        sd[p + "mlp.gate_proj.weight"] = _randn(g, (I, H), std)
        sd[p + "mlp.up_proj.weight"] = _randn(g, (I, H), std)
        sd[p + "mlp.down_proj.weight"] = _randn(g, (H, I), std)
    sd["model.norm.weight"] = _randn(g, (H,), 0.1, 1.0)
    if not tied:
        sd["lm_head.weight"] = _randn(g, (V, H), std)
    return sd


def hf_model_from_state_dict(model_dir_or_cfg, sd):
    """Instantiates the HF model from config.json in model_dir and loads sd (float32)."""
    config = transformers.AutoConfig.from_pretrained(model_dir_or_cfg)
    config._attn_implementation = "eager"
    with torch.device("cpu"):
        model = transformers.AutoModelForCausalLM.from_config(
            config, attn_implementation="eager", dtype=torch.float32)
    missing, unexpected = model.load_state_dict({k: v.float() for k, v in sd.items()},
                                                strict=False)
    missing = [k for k in missing if k != "lm_head.weight" or not config.tie_word_embeddings]
    if missing or unexpected:
        die(f"state dict mismatch: missing {missing}, unexpected {unexpected}")
    if config.tie_word_embeddings:
        model.tie_weights()
        assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    return model.eval()


def write_tiny_llama(outdir, tok, kjv_lines):
    log(f"writing {rel(outdir)}")
    if outdir.exists():
        shutil.rmtree(outdir)
    outdir.mkdir(parents=True)
    cfg = llama_config(tok.get_vocab_size())
    write_json(outdir / "config.json", cfg)
    sd = random_llama_weights(cfg, SEED)
    save_file(sd, str(outdir / "model.safetensors"), metadata={"format": "pt"})
    tok.save(str(outdir / "tokenizer.json"))
    write_json(outdir / "tokenizer_config.json", {
        "add_bos_token": True,
        "add_eos_token": False,
        "bos_token": "<s>",
        "eos_token": "</s>",
        "unk_token": "<unk>",
        "pad_token": None,
        "clean_up_tokenization_spaces": False,
        "legacy": False,
        "model_max_length": cfg["max_position_embeddings"],
        "padding_side": "right",
        "sp_model_kwargs": {},
        "tokenizer_class": "PreTrainedTokenizerFast",
        "added_tokens_decoder": {
            str(i): {"content": s, "lstrip": False, "normalized": False, "rstrip": False,
                     "single_word": False, "special": True}
            for i, s in enumerate(SPM_SPECIALS)},
        "chat_template": LLAMA2_CHAT_TEMPLATE,
    })
    write_json(outdir / "generation_config.json",
               {"bos_token_id": 1, "eos_token_id": 2, "do_sample": False})
    return cfg, sd


def write_tiny_qwen2(outdir, tok):
    log(f"writing {rel(outdir)}")
    if outdir.exists():
        shutil.rmtree(outdir)
    outdir.mkdir(parents=True)
    V = tok.get_vocab_size()
    eot, im_end = tok.token_to_id("<|endoftext|>"), tok.token_to_id("<|im_end|>")
    cfg = qwen2_config(V, eot, im_end)
    write_json(outdir / "config.json", cfg)
    sd32 = random_llama_weights(cfg, SEED + 1, std=0.15, embed_std=0.3, bias=True, tied=True)
    sd = {k: v.to(torch.bfloat16).contiguous() for k, v in sd32.items()}
    # two shards: embeddings + layer 0 | layer 1 + final norm, like HF's sharded checkpoints
    shards = [{}, {}]
    for k, v in sd.items():
        shards[1 if (k.startswith("model.layers.1.") or k == "model.norm.weight") else 0][k] = v
    names = [f"model-0000{i + 1}-of-00002.safetensors" for i in range(2)]
    weight_map, total = {}, 0
    for name, shard in zip(names, shards):
        save_file(shard, str(outdir / name), metadata={"format": "pt"})
        for k, v in shard.items():
            weight_map[k] = name
            total += v.numel() * v.element_size()
    write_json(outdir / "model.safetensors.index.json",
               {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))})
    tok.save(str(outdir / "tokenizer.json"))
    write_json(outdir / "tokenizer_config.json", {
        "add_bos_token": False,
        "add_prefix_space": False,
        "bos_token": None,
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
        "unk_token": None,
        "clean_up_tokenization_spaces": False,
        "errors": "replace",
        "model_max_length": cfg["max_position_embeddings"],
        "split_special_tokens": False,
        "tokenizer_class": "PreTrainedTokenizerFast",
        "added_tokens_decoder": {
            str(tok.token_to_id(s)): {"content": s, "lstrip": False, "normalized": False,
                                      "rstrip": False, "single_word": False, "special": True}
            for s in ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]},
        "chat_template": CHATML_TEMPLATE,
    })
    write_json(outdir / "generation_config.json",
               {"bos_token_id": eot, "eos_token_id": [im_end, eot], "pad_token_id": eot,
                "do_sample": False})
    return cfg, sd
