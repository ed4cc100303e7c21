#!/usr/bin/env python3
"""Generates thetaserve's committed test models and reference outputs (tests/data/).

Run from the repository root, after scripts/fetch-corpora.sh and scripts/fetch-model.sh:

    python3 scripts/make_reference.py            # everything
    python3 scripts/make_reference.py --skip-smollm2   # without the real model

Deterministic: fixed seeds, tokenizers trained on fixed text; rerunning it reproduces the same
bytes (given the pinned versions in scripts/requirements-reference.txt). Needs torch (CPU),
transformers, accelerate (transformers' GGUF loader requires it), tokenizers, gguf,
safetensors, numpy, jinja2.

What it writes
==============
tests/data/tiny_llama/        random LLaMA, HF format: config.json, model.safetensors (F32),
                              tokenizer.json (Llama-2-style SPM BPE with byte fallback, 512
                              tokens, trained on KJV), tokenizer_config.json (Llama-2 chat
                              template, add_bos_token true)
tests/data/tiny_qwen2/        random Qwen2, HF format: BF16, 2 safetensors shards +
                              model.safetensors.index.json, QKV bias, tied embeddings,
                              byte-level BPE tokenizer (600 tokens, trained on KJV), ChatML
tests/data/tiny_llama_gguf/tiny_llama.gguf
                              the tiny_llama weights as GGUF v3 (llama.cpp names, Q/K rows
                              permuted like convert_hf_to_gguf.py), mixed tensor types (see
                              the reference JSON's "tensor_types"), SPM tokenizer metadata
tests/data/reference/         reference outputs, see below and README.md there

Model references: tests/data/reference/{tiny_llama,tiny_qwen2,tiny_llama_gguf,smollm2}.json
plus a raw little-endian float32 file <name>.logits.bin next to each:
{
  "schema": "thetaserve-logits-v1",
  "model": "tiny_llama",
  "model_path": "tests/data/tiny_llama",     // relative to the repo root (a dir or a .gguf)
  "format": "safetensors" | "gguf",
  "method": "...",                           // how the logits were computed (free text)
  "vocab_size": 512,
  "bos_id": 1 | null, "eos_id": 2,
  "logits_file": "tiny_llama.logits.bin",    // relative to this JSON's directory
  "logits_scope": "all_positions" | "last_prompt_position",
  "tensor_types": {"token_embd.weight": "F16", ...},   // GGUF models only
  "cases": [{
     "name": "short",
     "prompt": "In the beginning",           // the text (chat prompts: already templated)
     "prompt_ids": [1, ...],                 // token ids fed to the model (BOS included
                                             // when the tokenizer adds one)
     "greedy_ids": [...32 ids...],           // argmax continuation, never stopped at EOS
     "greedy_text": "...",                   // HF decode of greedy_ids (for humans)
     "step_top1_id": [...32...],             // == greedy_ids
     "step_top1_logit": [...32 floats...],   // logit of the argmax at each greedy step
     "step_top2_logit": [...32 floats...],   // runner-up logit (margin = top1 - top2)
     "step_max_abs_logit": [...32 floats...],// max |logit| over the vocab at each step
     "logits_first_row": 0,                  // row index into logits_file (a row is
                                             // vocab_size float32s: byte offset =
                                             // row * vocab_size * 4)
     "logits_rows": 48                       // rows belonging to this case
  }]
}
For logits_scope "all_positions" (tiny models) the case has len(prompt_ids) + 32 rows: row r
holds the logits after the model has read tokens 0..r of prompt_ids + greedy_ids, so row
len(prompt_ids) - 1 + i predicts greedy_ids[i]. For "last_prompt_position" (SmolLM2) there is
one row: the logits at the last prompt position (which predicts greedy_ids[0]). step_* arrays
come from the same forward passes as greedy_ids (full recompute per step, no KV cache).

Tokenization references: tests/data/reference/tokenization_{smollm2,tiny_llama,tiny_qwen2}.json
{
  "schema": "thetaserve-tokenization-v1",
  "tokenizer": "tiny_llama",
  "source": "tests/data/tiny_llama/tokenizer.json",  // or the GGUF the vocab came from
  "reference_impl": "...",                 // HF tokenizers version and how it was built
  "add_bos": true, "bos_id": 1, "eos_id": 2,
  "cases": [{
     "kind": "kjv" | "austen" | "tricky",
     "text": "...",                        // verbatim input
     "ids": [...],                         // tok.encode(text, add_special_tokens=False).ids
                                           // (special tokens written in the text ARE
                                           // recognised, as HF does by default)
     "ids_with_special": [...],            // tok.encode(text, add_special_tokens=True).ids
                                           // (adds BOS for tiny_llama; same as ids otherwise)
     "ids_special_as_text": [...],         // tricky cases only: special-token text NOT
                                           // recognised (tokenizers' encode_special_tokens)
     "decoded": "..."                      // tok.decode(ids, skip_special_tokens=False)
  }]
}
"""
import argparse
import hashlib
import json
import os
import shutil
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DATA = REPO / "data"
MODELS = REPO / "models"
TD = REPO / "tests" / "data"
REF = TD / "reference"
SMOLLM2_GGUF = MODELS / "SmolLM2-135M-Instruct.Q4_1.gguf"
N_GREEDY = 32
SEED = 0

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

import numpy as np  # noqa: E402
import torch  # noqa: E402
import gguf  # noqa: E402
import jinja2  # noqa: E402
import safetensors  # noqa: E402
import tokenizers  # noqa: E402
import transformers  # noqa: E402
from safetensors.torch import save_file, load_file  # noqa: E402
from tokenizers import Tokenizer, AddedToken, decoders, models, normalizers  # noqa: E402
from tokenizers import pre_tokenizers, processors, trainers  # noqa: E402

torch.set_num_threads(max(1, min(8, os.cpu_count() or 1)))
torch.use_deterministic_algorithms(True)


def log(msg):
    print(f"[make_reference] {msg}", flush=True)


def die(msg):
    print(f"[make_reference] error: {msg}", file=sys.stderr, flush=True)
    sys.exit(1)


def rel(p: Path) -> str:
    return str(Path(p).resolve().relative_to(REPO))


def versions():
    return {"torch": torch.__version__, "transformers": transformers.__version__,
            "tokenizers": tokenizers.__version__, "gguf": _gguf_version(),
            "safetensors": safetensors.__version__, "numpy": np.__version__}


def _gguf_version():
    try:
        from importlib.metadata import version
        return version("gguf")
    except Exception:  # pragma: no cover
        return "unknown"


# ==================================================================================== corpora

def read_corpus(name):
    p = DATA / f"{name}.txt"
    if not p.is_file():
        die(f"{rel(p)} missing: run scripts/fetch-corpora.sh first")
    return p.read_text(encoding="utf-8")


def every_nth_nonempty(text, count):
    lines = [ln for ln in text.split("\n") if ln.strip()]
    step = len(lines) // count
    return [lines[i * step] for i in range(count)]


# ================================================================================= chat templates

LLAMA2_CHAT_TEMPLATE = (
    "{% if messages[0]['role'] == 'system' %}{% set loop_messages = messages[1:] %}"
    "{% set system_message = messages[0]['content'] %}{% else %}"
    "{% set loop_messages = messages %}{% set system_message = false %}{% endif %}"
    "{% for message in loop_messages %}"
    "{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}"
    "{% endif %}"
    "{% if loop.index0 == 0 and system_message != false %}"
    "{% set content = '<<SYS>>\\n' + system_message + '\\n<</SYS>>\\n\\n' + message['content'] %}"
    "{% else %}{% set content = message['content'] %}{% endif %}"
    "{% if message['role'] == 'user' %}{{ bos_token + '[INST] ' + content.strip() + ' [/INST]' }}"
    "{% elif message['role'] == 'assistant' %}{{ ' '  + content.strip() + ' ' + eos_token }}"
    "{% endif %}{% endfor %}")

CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' }}{% endif %}"
    "{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n'}}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")


def render_chat(template, messages, **kw):
    def raise_exception(m):
        raise ValueError(m)
    env = jinja2.Environment(trim_blocks=True, lstrip_blocks=True)
    env.globals["raise_exception"] = raise_exception
    return env.from_string(template).render(messages=messages, add_generation_prompt=True, **kw)


# ================================================================================= tokenizers

SPM_SPECIALS = ["<unk>", "<s>", "</s>"]
BYTE_TOKENS = [f"<0x{b:02X}>" for b in range(256)]


def build_llama_tokenizer(kjv_lines, vocab_size=512):
    """Llama-2-style tokenizer.json: SentencePiece-like BPE with byte fallback.

    Trained with HF tokenizers' BpeTrainer on KJV (Metaspace word splitting, so no piece has
    '▁' inside), then laid out like Llama 2: <unk> <s> </s>, the 256 <0xXX> byte tokens,
    the merged pieces in merge order, then the single characters. Pieces get SentencePiece-style
    scores (-(id - 259)); the merges of the final tokenizer.json are derived from those scores
    exactly the way transformers' SentencePieceExtractor converts Llama's tokenizer.model (every
    split a+b of a piece with both halves in the vocab, ordered by the piece's score), so HF's
    rank-ordered BPE and llama.cpp's highest-score-first SPM merging agree.
    Returns (tokenizer, vocab list, scores list)."""
    n_learned = vocab_size - len(SPM_SPECIALS) - 256
    t = Tokenizer(models.BPE())
    t.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always",
                                               split=True)
    tr = trainers.BpeTrainer(vocab_size=n_learned, special_tokens=[], limit_alphabet=1000,
                             show_progress=False)
    t.train_from_iterator(kjv_lines, tr)
    m = json.loads(t.to_str())["model"]
    trained = sorted(m["vocab"].items(), key=lambda kv: kv[1])
    merged_pieces = ["".join(p) for p in m["merges"]]
    chars = [tok for tok, _ in trained if len(tok) == 1]
    assert len(chars) + len(merged_pieces) == len(trained) == n_learned, "unexpected trainer vocab"
    pieces = merged_pieces + chars
    vocab = SPM_SPECIALS + BYTE_TOKENS + pieces
    assert len(vocab) == vocab_size and len(set(vocab)) == vocab_size
    scores = [0.0] * (len(SPM_SPECIALS) + 256) + [-float(i) for i in range(len(pieces))]
    vocab_ids = {tok: i for i, tok in enumerate(vocab)}

    # SentencePieceExtractor-style merges
    first_piece = len(SPM_SPECIALS) + 256
    merges = []
    for pid in range(first_piece, vocab_size):
        piece = vocab[pid]
        local = []
        for k in range(1, len(piece)):
            a, b = piece[:k], piece[k:]
            if vocab_ids.get(a, -1) >= first_piece and vocab_ids.get(b, -1) >= first_piece:
                local.append((a, b))
        local.sort(key=lambda ab: (vocab_ids[ab[0]], vocab_ids[ab[1]]))
        merges.extend(local)  # pieces are visited in descending score order

    tok = Tokenizer(models.BPE(vocab=vocab_ids, merges=merges, unk_token="<unk>",
                               fuse_unk=True, byte_fallback=True))
    tok.normalizer = normalizers.Sequence([normalizers.Prepend("▁"),
                                           normalizers.Replace(" ", "▁")])
    tok.pre_tokenizer = None
    tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(),
                                     decoders.Fuse(), decoders.Strip(content=" ", left=1, right=0)])
    tok.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in SPM_SPECIALS])
    tok.post_processor = processors.TemplateProcessing(
        single="<s>:0 $A:0", pair="<s>:0 $A:0 <s>:1 $B:1", special_tokens=[("<s>", 1)])
    for i, s in enumerate(SPM_SPECIALS):
        assert tok.token_to_id(s) == i
    return tok, vocab, scores


def build_qwen2_tokenizer(kjv_lines, vocab_size=600):
    """Byte-level BPE (GPT-2 style) trained on KJV; the three ChatML specials come last, as in
    Qwen2 (where they follow the 151643 BPE tokens)."""
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    t = Tokenizer(models.BPE())
    t.normalizer = None
    t.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=True)])
    t.decoder = decoders.ByteLevel(add_prefix_space=True, trim_offsets=True, use_regex=True)
    t.post_processor = processors.ByteLevel(add_prefix_space=False, trim_offsets=False,
                                            use_regex=True)
    tr = trainers.BpeTrainer(vocab_size=vocab_size - len(specials), special_tokens=[],
                             initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                             show_progress=False)
    t.train_from_iterator(kjv_lines, tr)
    assert t.get_vocab_size() == vocab_size - len(specials)
    t.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in specials])
    assert t.token_to_id("<|im_end|>") == vocab_size - 1
    return t


def gguf_field(reader, key):
    f = reader.fields.get(key)
    return None if f is None else f.contents()


def build_smollm2_tokenizer(reader):
    """Rebuilds SmolLM2's tokenizer.json from the GGUF vocab + merges, faithful to the
    original HuggingFaceTB/SmolLM2-135M-Instruct tokenizer.json (whose pre-tokenizer splits
    digits individually; llama.cpp calls it pre-type "smollm")."""
    tokens = gguf_field(reader, "tokenizer.ggml.tokens")
    types = gguf_field(reader, "tokenizer.ggml.token_type")
    merges = [tuple(m.split(" ", 1)) for m in gguf_field(reader, "tokenizer.ggml.merges")]
    vocab = {t: i for i, t in enumerate(tokens)}
    assert len(vocab) == len(tokens)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, dropout=None, unk_token=None,
                               continuing_subword_prefix="", end_of_word_suffix="",
                               fuse_unk=False, byte_fallback=False))
    tok.normalizer = None
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=True)])
    tok.decoder = decoders.ByteLevel(add_prefix_space=True, trim_offsets=True, use_regex=True)
    tok.post_processor = processors.ByteLevel(add_prefix_space=True, trim_offsets=False,
                                              use_regex=True)
    control = [tokens[i] for i, ty in enumerate(types) if ty == gguf.TokenType.CONTROL]
    tok.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in control])
    for s in control:
        assert tok.token_to_id(s) == vocab[s]
    return tok


# ----------------------------------------------------------------- llama.cpp SPM emulation

def spm_tokenize(text, vocab_ids, scores, add_space_prefix=True):
    """llama.cpp's llm_tokenizer_spm (highest score first, ties leftmost; pieces not in the
    vocab fall back to <0xXX> bytes). No special-token parsing."""
    import heapq
    if add_space_prefix and text:
        text = " " + text
    text = text.replace(" ", "▁")
    syms = [{"t": c, "prev": i - 1, "next": i + 1 if i + 1 < len(text) else -1}
            for i, c in enumerate(text)]
    heap, rev = [], {}

    def add(left, right):
        if left == -1 or right == -1:
            return
        s = syms[left]["t"] + syms[right]["t"]
        tid = vocab_ids.get(s)
        if tid is None:
            return
        heapq.heappush(heap, (-scores[tid], left, right, s))
        rev[s] = (left, right, syms[left]["t"], syms[right]["t"])

    for i in range(1, len(syms)):
        add(i - 1, i)
    while heap:
        _, left, right, s = heapq.heappop(heap)
        if not syms[left]["t"] or not syms[right]["t"] or syms[left]["t"] + syms[right]["t"] != s:
            continue
        syms[left]["t"] = s
        syms[right]["t"] = ""
        syms[left]["next"] = syms[right]["next"]
        if syms[right]["next"] != -1:
            syms[syms[right]["next"]]["prev"] = left
        add(syms[left]["prev"], left)
        add(left, syms[left]["next"])
    out = []
    i = 0 if syms else -1
    while i != -1:
        piece = syms[i]["t"]
        if piece in vocab_ids:
            out.append(vocab_ids[piece])
        else:
            out.extend(vocab_ids[f"<0x{b:02X}>"] for b in piece.encode("utf-8"))
        i = syms[i]["next"]
    return out


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


def write_json(path, obj, indent=2):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(obj, indent=indent, ensure_ascii=False) + "\n", encoding="utf-8")


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


# ================================================================================ references

@torch.no_grad()
def greedy_reference(model, prompt_ids, n=N_GREEDY, all_positions=True):
    """Greedy decoding with a full forward pass per step (no KV cache). Returns
    (greedy_ids, step info dict, logits ndarray [rows, vocab])."""
    seq = list(prompt_ids)
    steps = {"step_top1_id": [], "step_top1_logit": [], "step_top2_logit": [],
             "step_max_abs_logit": []}
    last_prompt_row = None
    min_margin = float("inf")
    for i in range(n):
        logits = model(torch.tensor([seq]), use_cache=False).logits[0, -1].float()
        if i == 0:
            last_prompt_row = logits.numpy().copy()
        top2 = torch.topk(logits, 2)
        tid = int(top2.indices[0])
        steps["step_top1_id"].append(tid)
        steps["step_top1_logit"].append(float(top2.values[0]))
        steps["step_top2_logit"].append(float(top2.values[1]))
        steps["step_max_abs_logit"].append(float(logits.abs().max()))
        min_margin = min(min_margin, float(top2.values[0] - top2.values[1]))
        seq.append(tid)
    greedy = seq[len(prompt_ids):]
    if all_positions:
        full = model(torch.tensor([seq]), use_cache=False).logits[0].float().numpy()
        # check the one-pass logits against the per-step ones
        for i in range(n):
            row = full[len(prompt_ids) - 1 + i]
            if int(row.argmax()) != greedy[i]:
                die(f"full-pass argmax differs from greedy step {i}")
        rows = full
    else:
        rows = last_prompt_row[None, :]
    return greedy, steps, rows.astype("<f4"), min_margin


def write_model_reference(name, model, cases, decode, meta, all_positions=True):
    """cases: list of (case name, prompt text, prompt ids)."""
    log(f"reference {name}: {len(cases)} prompts")
    out_cases, blobs, row = [], [], 0
    for cname, text, ids in cases:
        greedy, steps, rows, margin = greedy_reference(model, ids, all_positions=all_positions)
        gtext = decode(greedy)
        log(f"  {cname}: {len(ids)} prompt ids -> {greedy[:8]}... min top1-top2 margin "
            f"{margin:.4f}; text {gtext[:70]!r}")
        if margin < 1e-3:
            log(f"  WARNING: near tie in greedy decoding of {cname} (margin {margin:g})")
        out_cases.append({"name": cname, "prompt": text, "prompt_ids": list(ids),
                          "greedy_ids": greedy, "greedy_text": gtext, **steps,
                          "logits_first_row": row, "logits_rows": int(rows.shape[0])})
        blobs.append(rows)
        row += rows.shape[0]
    allrows = np.concatenate(blobs, axis=0).astype("<f4")
    assert allrows.shape[1] == meta["vocab_size"]
    binname = f"{name}.logits.bin"
    (REF / binname).write_bytes(allrows.tobytes())
    obj = {"schema": "thetaserve-logits-v1", "model": name, **meta,
           "logits_file": binname,
           "logits_scope": "all_positions" if all_positions else "last_prompt_position",
           "logits_rows_total": int(allrows.shape[0]),
           "logits_sha256": hashlib.sha256(allrows.tobytes()).hexdigest(),
           "versions": versions(), "cases": out_cases}
    write_json(REF / f"{name}.json", obj, indent=1)
    return obj


# -------------------------------------------------------------------------- tokenization

TRICKY = [
    "", " ", "  ", "   leading spaces", " leading space", "trailing space ", "trailing spaces   ",
    "\t", "\ttab\tseparated\tvalues\t", "\n", "\n\n", "line one\nline two\n", "  \n\n  ",
    "a\r\nb", "mixed \t \n whitespace \n\t", "Hello world", "Hello, world!", "hello  world",
    "1234567", "3.14159", "1,000,000", "2024-01-01T12:30:45Z", "v1.2.3-rc4", "0x7fffffff",
    "12345678901234567890", "-42 + 17 = -25",
    "I'm, you'll, they'd, WE'RE", "don't can't won't isn't", "it's It'S IT'S", "'tis 'twas",
    "Emoji: 😀 😃 👍🏽 ❤️", "Family 👨‍👩‍👧‍👦 and 🏳️‍🌈 flags 🇫🇷🇩🇪",
    "Skin tones: 👋🏻👋🏼👋🏽👋🏾👋🏿", "中文测试：你好，世界！", "日本語のテキスト、カタカナ", "한국어 텍스트",
    "العربية: مرحبا بالعالم", "עברית שלום", "Ελληνικά γράμματα", "Русский текст, ёлка",
    "हिन्दी देवनागरी लिपि", "ภาษาไทย", "Combining: e\u0301 a\u0308 n\u0303 vs é ä ñ",
    "Zalgo: Z\u0351\u036b\u0343a\u0352l\u0350g\u0344o", "ＦＵＬＬＷＩＤＴＨ ｔｅｘｔ", "ﬁ ﬂ ligatures",
    "math: ∀x∈ℝ, x² ≥ 0; ∑ᵢ aᵢ ≈ ∞", "currency: £5 €10 ¥100 ₹50 $3", "“smart” ‘quotes’ — dash … ellipsis",
    "NBSP:\u00a0here", "ZWSP:\u200bhere", "ZWJ alone:\u200d.", "BOM:\ufeffhere", "\ufffd replacement",
    "\ufffd\ufffd\ufffd", "control \u0007 bell and \u001b escape", "nul \u0000 byte",
    "<|im_start|", "<|im_start|>user", "<|im_start|>user\nHi<|im_end|>\n",
    "<|im_start|><|im_end|>", "<|endoftext|>", "text<|endoftext|>more", "< |im_end| >",
    "<s>", "</s>", "</s >", "<s>hello</s>", "<unk>", "<<SYS>>", "[INST] hi [/INST]",
    "<0x41>", "▁", "▁▁word", "Ġ", "Ċ", "<repo_name>", "<file_sep>",
    "    def f(x):\n\treturn x ** 2  # square\n", "if (a && b) { return c->d[0]; }",
    "https://example.com/path?q=1&r=2#frag", "user@example.com", "C:\\Windows\\System32",
    "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa", "!!!!!!!!!!??????......", "----====____",
    "antidisestablishmentarianism", "Supercalifragilisticexpialidocious",
    "The LORD is my shepherd; I shall not want.", "CAPITALS AND lower And Mixed",
    "X-ray xylophone", "jalapeño naïve café résumé coöperate", "\u2028line\u2029para",
]


def tokenization_cases(kjv_text, austen_text):
    cases = [("kjv", t) for t in every_nth_nonempty(kjv_text, 600)]
    cases += [("austen", t) for t in every_nth_nonempty(austen_text, 600)]
    long_kjv = " ".join(kjv_text.split("\n")[:12])
    cases += [("tricky", t) for t in TRICKY + [long_kjv]]
    return cases


def write_tokenization_reference(name, tok, source, cases, add_bos, bos_id, eos_id, impl):
    log(f"tokenization reference {name}: {len(cases)} texts")
    out = []
    for kind, text in cases:
        ids = tok.encode(text, add_special_tokens=False).ids
        ids_ws = tok.encode(text, add_special_tokens=True).ids
        c = {"kind": kind, "text": text, "ids": ids, "ids_with_special": ids_ws}
        if kind == "tricky":
            tok.encode_special_tokens = True
            c["ids_special_as_text"] = tok.encode(text, add_special_tokens=False).ids
            tok.encode_special_tokens = False
        c["decoded"] = tok.decode(ids, skip_special_tokens=False)
        out.append(c)
    head = {"schema": "thetaserve-tokenization-v1", "tokenizer": name, "source": source,
            "reference_impl": impl, "add_bos": add_bos, "bos_id": bos_id, "eos_id": eos_id,
            "vocab_size": tok.get_vocab_size(), "versions": versions()}
    # one case per line: compact yet diff-friendly
    lines = [json.dumps(head, ensure_ascii=False)[:-1] + ', "cases": [']
    lines += [json.dumps(c, ensure_ascii=False) + ("," if i + 1 < len(out) else "")
              for i, c in enumerate(out)]
    lines.append("]}")
    path = REF / f"tokenization_{name}.json"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    json.loads(path.read_text(encoding="utf-8"))  # sanity
    return out


# ====================================================================================== main

def tiny_prompts_llama(tok, kjv_text):
    chat = render_chat(LLAMA2_CHAT_TEMPLATE,
                       [{"role": "system", "content": "You answer in the style of the KJV."},
                        {"role": "user", "content": "Who made the heaven and the earth?"}],
                       bos_token="<s>", eos_token="</s>")
    texts = tiny_prompt_texts(kjv_text)
    cases = []
    for cname, text in texts:
        cases.append((cname, text, tok.encode(text, add_special_tokens=True).ids))
    cases.append(("chat", chat, tok.encode(chat, add_special_tokens=False).ids))
    return cases


def tiny_prompt_texts(kjv_text):
    verses = kjv_text.split("\n")
    long_text, i = "", 0
    while len(long_text) < 300:
        long_text = (long_text + " " + verses[i]).strip()
        i += 1
    return [
        ("short", "In the beginning"),
        ("verse_unicode", "And God said, Let there be light: and there was light. "
                          "(Genesis 1:3, 1611) \u2014 caf\u00e9 \u2728"),
        ("austen", "It is a truth universally acknowledged, that a single man in possession "
                   "of a good fortune, must be in want of a wife."),
        ("long_kjv", long_text),
    ]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--skip-smollm2", action="store_true",
                    help="skip everything that needs models/SmolLM2-135M-Instruct.Q4_1.gguf")
    args = ap.parse_args()
    os.chdir(REPO)
    torch.manual_seed(SEED)
    np.random.seed(SEED)
    log("versions: " + ", ".join(f"{k} {v}" for k, v in versions().items()))

    kjv_text, austen_text = read_corpus("kjv"), read_corpus("austen")
    kjv_lines = [ln for ln in kjv_text.split("\n") if ln]
    REF.mkdir(parents=True, exist_ok=True)
    tok_cases = tokenization_cases(kjv_text, austen_text)

    # ------------------------------------------------------------------ (a) tiny_llama
    log("training tiny_llama tokenizer (SPM-style BPE, byte fallback) on KJV")
    ltok, lvocab, lscores = build_llama_tokenizer(kjv_lines)
    lcfg, lsd = write_tiny_llama(TD / "tiny_llama", ltok, kjv_lines)
    ltok = Tokenizer.from_file(str(TD / "tiny_llama" / "tokenizer.json"))  # as C++ will see it

    # llama.cpp SPM (GGUF scores) must tokenize like the HF tokenizer.json
    vids = {t: i for i, t in enumerate(lvocab)}
    mism = [(t) for k, t in tok_cases
            if "<" not in t and spm_tokenize(t, vids, lscores)
            != ltok.encode(t, add_special_tokens=False).ids]
    log(f"llama.cpp-SPM emulation vs HF tokenizer.json: {len(mism)} mismatches "
        f"in {len(tok_cases)} texts (texts with '<' skipped: special-token parsing)")
    for t in mism[:5]:
        log(f"  mismatch: {t[:60]!r}")

    lmodel = hf_model_from_state_dict(str(TD / "tiny_llama"), load_file(
        str(TD / "tiny_llama" / "model.safetensors")))
    # cross-check: HF from_pretrained sees the same weights and config
    chk = transformers.AutoModelForCausalLM.from_pretrained(
        str(TD / "tiny_llama"), dtype=torch.float32, attn_implementation="eager").eval()
    assert chk.config.rope_parameters["rope_theta"] == 10000.0, chk.config.rope_parameters
    llama_cases = tiny_prompts_llama(ltok, kjv_text)
    with torch.no_grad():
        x = torch.tensor([llama_cases[2][2]])
        assert torch.equal(chk(x).logits, lmodel(x).logits)
    del chk
    dec_l = lambda ids: ltok.decode(ids, skip_special_tokens=False)  # noqa: E731
    write_model_reference("tiny_llama", lmodel, llama_cases, dec_l, {
        "model_path": "tests/data/tiny_llama", "format": "safetensors",
        "method": "transformers LlamaForCausalLM.from_pretrained, float32, eager attention",
        "vocab_size": lcfg["vocab_size"], "bos_id": 1, "eos_id": 2})

    # ------------------------------------------------------------------ (b) tiny_qwen2
    log("training tiny_qwen2 tokenizer (byte-level BPE) on KJV")
    qtok = build_qwen2_tokenizer(kjv_lines)
    qcfg, qsd = write_tiny_qwen2(TD / "tiny_qwen2", qtok)
    qtok = Tokenizer.from_file(str(TD / "tiny_qwen2" / "tokenizer.json"))
    qmodel = transformers.AutoModelForCausalLM.from_pretrained(
        str(TD / "tiny_qwen2"), dtype=torch.float32, attn_implementation="eager").eval()
    assert qmodel.lm_head.weight.data_ptr() == qmodel.model.embed_tokens.weight.data_ptr()
    assert torch.equal(qmodel.model.embed_tokens.weight,
                       qsd["model.embed_tokens.weight"].float())
    assert torch.equal(qmodel.model.layers[1].self_attn.k_proj.bias,
                       qsd["model.layers.1.self_attn.k_proj.bias"].float())
    qchat = render_chat(CHATML_TEMPLATE, [{"role": "user",
                                           "content": "Who made the heaven and the earth?"}])
    qcases = [(n, t, qtok.encode(t, add_special_tokens=False).ids)
              for n, t in tiny_prompt_texts(kjv_text)]
    qcases.append(("chat", qchat, qtok.encode(qchat, add_special_tokens=False).ids))
    write_model_reference("tiny_qwen2", qmodel, qcases,
                          lambda ids: qtok.decode(ids, skip_special_tokens=False), {
        "model_path": "tests/data/tiny_qwen2", "format": "safetensors",
        "method": "transformers Qwen2ForCausalLM.from_pretrained (BF16 weights upcast to "
                  "float32), float32 compute, eager attention",
        "vocab_size": qcfg["vocab_size"], "bos_id": None,
        "eos_id": qtok.token_to_id("<|im_end|>")})

    # ------------------------------------------------------------------ (c) tiny_llama_gguf
    gpath = TD / "tiny_llama_gguf" / "tiny_llama.gguf"
    deq, gtypes = write_tiny_llama_gguf(gpath, lcfg, lsd, lvocab, lscores)
    # (1) our own dequantize + un-permute into the HF model
    own = hf_model_from_state_dict(str(TD / "tiny_llama"), hf_sd_from_gguf_dequant(deq, lcfg))
    # (2) transformers' own GGUF loader
    method = ("dequantized GGUF tensors (gguf-py) with Q/K un-permuted, loaded into "
              "transformers LlamaForCausalLM, float32, eager attention")
    gmodel = own
    try:
        tfm = transformers.AutoModelForCausalLM.from_pretrained(
            str(gpath.parent), gguf_file=gpath.name, dtype=torch.float32,
            attn_implementation="eager").eval()
        with torch.no_grad():
            x = torch.tensor([llama_cases[4][2]])
            diff = (tfm(x).logits - own(x).logits).abs().max().item()
        log(f"transformers gguf_file load vs own dequantization: max |dlogit| = {diff:g}")
        if diff < 1e-5:
            gmodel = tfm
            method = ("transformers AutoModelForCausalLM.from_pretrained(gguf_file=...) "
                      "(dequantizes to float32, un-permutes Q/K), float32, eager attention; "
                      f"cross-checked against our own dequantization (max |dlogit| {diff:.2g})")
        else:
            log("WARNING: transformers' GGUF load disagrees; using own dequantization")
    except Exception as e:  # pragma: no cover
        log(f"transformers gguf_file load failed ({e!r}); using own dequantization")
    write_model_reference("tiny_llama_gguf", gmodel, llama_cases, dec_l, {
        "model_path": rel(gpath), "format": "gguf", "method": method,
        "vocab_size": lcfg["vocab_size"], "bos_id": 1, "eos_id": 2,
        "tensor_types": gtypes})

    # ------------------------------------------------------------------ (e) tokenization
    write_tokenization_reference(
        "tiny_llama", ltok, "tests/data/tiny_llama/tokenizer.json (same vocab in "
        "tests/data/tiny_llama_gguf/tiny_llama.gguf)", tok_cases, True, 1, 2,
        f"HF tokenizers {tokenizers.__version__}, Tokenizer.from_file(tokenizer.json)")
    write_tokenization_reference(
        "tiny_qwen2", qtok, "tests/data/tiny_qwen2/tokenizer.json", tok_cases, False, None,
        qtok.token_to_id("<|im_end|>"),
        f"HF tokenizers {tokenizers.__version__}, Tokenizer.from_file(tokenizer.json)")

    # ------------------------------------------------------------------ (d, e) SmolLM2
    if args.skip_smollm2:
        log("skipping SmolLM2 (--skip-smollm2)")
    else:
        smollm2(tok_cases)
    write_readme()
    total = sum(p.stat().st_size for p in TD.rglob("*") if p.is_file())
    log(f"done; tests/data is {total / 1e6:.2f} MB")
    for p in sorted(TD.rglob("*")):
        if p.is_file():
            log(f"  {rel(p):60s} {p.stat().st_size:>10,d}")


def smollm2(tok_cases):
    if not SMOLLM2_GGUF.is_file():
        die(f"{rel(SMOLLM2_GGUF)} missing: run scripts/fetch-model.sh first "
            "(or pass --skip-smollm2)")
    reader = gguf.GGUFReader(str(SMOLLM2_GGUF))
    stok = build_smollm2_tokenizer(reader)
    bos = int(gguf_field(reader, "tokenizer.ggml.bos_token_id"))
    eos = int(gguf_field(reader, "tokenizer.ggml.eos_token_id"))
    add_bos = bool(gguf_field(reader, "tokenizer.ggml.add_bos_token"))
    template = gguf_field(reader, "tokenizer.chat_template")
    del reader

    write_tokenization_reference(
        "smollm2", stok, rel(SMOLLM2_GGUF), tok_cases, add_bos, bos, eos,
        f"HF tokenizers {tokenizers.__version__}; tokenizer.json rebuilt from the GGUF's "
        "tokens+merges: BPE, pre_tokenizer Sequence[Digits(individual_digits=True), "
        "ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=True)], ByteLevel "
        "decoder, the 17 CONTROL tokens as special added tokens (as the original "
        "SmolLM2 tokenizer.json)")

    # compare with transformers' own GGUF tokenizer conversion (informational)
    try:
        ttok = transformers.AutoTokenizer.from_pretrained(str(MODELS), gguf_file=SMOLLM2_GGUF.name)
        diff = [t for _, t in tok_cases
                if ttok(t, add_special_tokens=False).input_ids
                != stok.encode(t, add_special_tokens=False).ids]
        log(f"transformers' GGUF-converted SmolLM2 tokenizer differs from the faithful one on "
            f"{len(diff)}/{len(tok_cases)} texts, e.g. {[d[:30] for d in diff[:4]]}")
    except Exception as e:  # pragma: no cover
        log(f"(transformers' GGUF tokenizer not comparable: {e!r})")

    log(f"loading {rel(SMOLLM2_GGUF)} with transformers (dequantizing to float32)")
    model = transformers.AutoModelForCausalLM.from_pretrained(
        str(MODELS), gguf_file=SMOLLM2_GGUF.name, dtype=torch.float32,
        attn_implementation="eager").eval()
    chat = render_chat(template, [{"role": "user", "content": "What is the capital of France?"}])
    prompts = [
        ("capital", "The capital of France is"),
        ("chat", chat),
        ("kjv", "In the beginning God created the heaven and the earth. And the earth was "
                "without form, and void;"),
        ("austen", "It is a truth universally acknowledged, that a single man in possession "
                   "of a good fortune, must be in want of a"),
        ("code", "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n"
                 "    if n < 2:\n        return n\n"),
    ]
    cases = []
    for n, t in prompts:
        ids = stok.encode(t, add_special_tokens=False).ids
        if add_bos:
            ids = [bos] + ids
        cases.append((n, t, ids))
    obj = write_model_reference(
        "smollm2", model, cases, lambda ids: stok.decode(ids, skip_special_tokens=False), {
            "model_path": rel(SMOLLM2_GGUF), "format": "gguf",
            "model_sha256": "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
            "method": "transformers AutoModelForCausalLM.from_pretrained(gguf_file=...) "
                      "(Q4_1/Q8_0 dequantized to float32 by gguf-py, Q/K un-permuted), float32, "
                      "eager attention; greedy by full recompute per step",
            "vocab_size": model.config.vocab_size, "bos_id": bos if add_bos else None,
            "eos_id": eos}, all_positions=False)
    for c in obj["cases"]:
        print(f"--- SmolLM2 greedy, {c['name']}: {c['prompt']!r}\n    -> {c['greedy_text']!r}")


README = """# Reference outputs for thetaserve's tests

Generated by `scripts/make_reference.py` (run from the repo root after
`scripts/fetch-corpora.sh` and `scripts/fetch-model.sh`; pinned Python packages in
`scripts/requirements-reference.txt`). Do not edit by hand: rerun the script.

## Models these refer to

| name | files | what |
|---|---|---|
| tiny_llama | `tests/data/tiny_llama/` | random LLaMA (hidden 64, 2 layers, 4 heads / 2 KV heads, head_dim 16, FFN 160, vocab 512, untied), F32 safetensors, Llama-2-style SPM BPE tokenizer with byte fallback |
| tiny_qwen2 | `tests/data/tiny_qwen2/` | random Qwen2 (hidden 64, 2 layers, 4 heads / 1 KV head, head_dim 16, FFN 128, vocab 600, QKV bias, tied embeddings, rope_theta 1e6, eps 1e-6), BF16, 2 shards + index, byte-level BPE tokenizer, ChatML |
| tiny_llama_gguf | `tests/data/tiny_llama_gguf/tiny_llama.gguf` | tiny_llama's weights as GGUF v3 (Q/K rows permuted like llama.cpp's converter, so RoPE is the interleaved/GPT-J form there), mixed tensor types (listed in `tiny_llama_gguf.json` "tensor_types": layer 0 F32, layer 1 Q8_0/Q4_0/Q4_1/BF16, token_embd F16, output Q8_0), SPM tokenizer metadata (same vocab as tiny_llama) |
| smollm2 | `models/SmolLM2-135M-Instruct.Q4_1.gguf` (not committed; `scripts/fetch-model.sh`) | the real model |

Because tiny_llama_gguf's tensors are quantized, its logits differ from tiny_llama's; its
reference is computed from the dequantized GGUF tensors.

## `<model>.json` + `<model>.logits.bin`

`<model>.logits.bin` is raw little-endian float32, `logits_rows_total` rows of `vocab_size`
floats (sha256 in `logits_sha256`).

```
{
  "schema": "thetaserve-logits-v1",
  "model": "tiny_llama",
  "model_path": "tests/data/tiny_llama",   // relative to the repo root (dir or .gguf)
  "format": "safetensors" | "gguf",
  "method": "...",                         // how the reference was computed
  "vocab_size": 512, "bos_id": 1 | null, "eos_id": 2,
  "logits_file": "tiny_llama.logits.bin",  // relative to this directory
  "logits_scope": "all_positions" | "last_prompt_position",
  "logits_rows_total": 400, "logits_sha256": "...",
  "tensor_types": {"blk.1.attn_v.weight": "Q4_0", ...},   // tiny_llama_gguf only
  "versions": {...},
  "cases": [{
    "name": "short",
    "prompt": "In the beginning",          // text; chat cases are already templated
    "prompt_ids": [1, ...],                // ids fed to the model (BOS included if the
                                           // tokenizer adds one: tiny_llama(_gguf) yes,
                                           // tiny_qwen2 and SmolLM2 no)
    "greedy_ids": [32 ids],                // argmax continuation; NOT stopped at EOS
    "greedy_text": "...",                  // decode(greedy_ids), for humans
    "step_top1_id": [32], "step_top1_logit": [32], "step_top2_logit": [32],
    "step_max_abs_logit": [32],            // per greedy step i (input = prompt_ids +
                                           // greedy_ids[:i]): argmax, its logit, the
                                           // runner-up logit, max |logit|
    "logits_first_row": 0, "logits_rows": 48
  }]
}
```

* `all_positions` (tiny models): a case has `len(prompt_ids) + 32` rows; row `r` is the
  logits after reading tokens `0..r` of `prompt_ids + greedy_ids`. Row
  `len(prompt_ids) - 1 + i` predicts `greedy_ids[i]`. (The last row predicts a 33rd token.)
* `last_prompt_position` (smollm2): one row per case, the logits at the last prompt position
  (predicting `greedy_ids[0]`).
* Byte offset of a case's first row: `logits_first_row * vocab_size * 4`.
* Computed with HF transformers in float32, eager attention, no KV cache (full recompute per
  greedy step). Cross-checked by `scripts/reference/numpy_forward.py`, an independent NumPy
  forward pass that reads the GGUF files as llama.cpp does (Q/K left permuted, RoPE on
  adjacent pairs): it agrees with every logits file to ~1e-5 (tiny models) and ~6e-5
  (SmolLM2, logits up to ~36). Suggested tolerance for an f32 CPU implementation: a few 1e-4 absolute
  (relative to `step_max_abs_logit`); greedy ids should match exactly wherever
  `step_top1_logit - step_top2_logit` is not tiny.

## `tokenization_<name>.json` (smollm2, tiny_llama, tiny_qwen2)

```
{
  "schema": "thetaserve-tokenization-v1",
  "tokenizer": "tiny_llama",
  "source": "...",                        // tokenizer.json path, or the GGUF (smollm2)
  "reference_impl": "...",                // HF tokenizers version / construction
  "add_bos": true, "bos_id": 1, "eos_id": 2, "vocab_size": 512, "versions": {...},
  "cases": [{
    "kind": "kjv" | "austen" | "tricky",
    "text": "...",                        // verbatim input (UTF-8)
    "ids": [...],                         // encode(text, add_special_tokens=False)
    "ids_with_special": [...],            // encode(text, add_special_tokens=True)
                                          // (= [bos] + ids for tiny_llama; = ids otherwise)
    "ids_special_as_text": [...],         // "tricky" cases only: special-token strings in
                                          // the text treated as plain text
    "decoded": "..."                      // decode(ids, skip_special_tokens=False)
  }]
}
```

* 600 KJV verses (every Nth line of `data/kjv.txt`) + 600 Austen lines (every Nth non-empty
  line of `data/austen.txt`) + a tricky set (whitespace runs, digits, contractions, emoji
  with ZWJ and skin tones, CJK, Arabic, Devanagari, combining marks, special-token
  look-alikes, empty string, U+FFFD, NUL, ...). Same texts in all three files.
* In `ids`, special tokens written in the text (e.g. `<|im_start|>`, `<s>`) ARE recognised,
  which is HF's default (`split_special_tokens=False`, llama.cpp's `parse_special=true`).
* smollm2: the tokenizer is rebuilt from the GGUF's `tokenizer.ggml.tokens/merges` to be
  faithful to SmolLM2's original tokenizer.json, whose pre-tokenizer splits every digit
  (llama.cpp pre-type "smollm"). transformers' own GGUF tokenizer conversion does NOT do
  that (it uses plain ByteLevel), so it differs on texts with multi-digit numbers.
* tiny_llama: the GGUF's scores are SentencePiece-style (`-(id - 259)` for pieces, 0 for
  specials and bytes) and tokenizer.json's merges are derived from them, so llama.cpp's
  score-driven SPM merging and HF's BPE give the same ids (make_reference.py checks this
  with an emulation of llama.cpp's algorithm).
* transformers 5.x quirk: `AutoTokenizer` does not always honour a tokenizer.json. The
  model-specific classes rebuild the pipeline (LlamaTokenizer forces a Metaspace
  pre-tokenizer; Qwen2Tokenizer forces Qwen2's split regex and an NFC normalizer, and
  AutoTokenizer picks Qwen2Tokenizer for any `model_type: qwen2` whatever
  tokenizer_config.json says). Our tokenizer_config.json files therefore name
  `PreTrainedTokenizerFast`; with that, AutoTokenizer reproduces these references exactly for
  tiny_llama, while for tiny_qwen2 it still differs on the 2 texts with combining marks (NFC).
  The references are defined by the `tokenizers` library on the tokenizer.json as written.
* Decoding note (tiny_llama): HF's decoder strips one leading space (`Strip(start=1)`), and
  incomplete UTF-8 from byte-fallback tokens decodes to U+FFFD.
"""


def write_readme():
    (REF / "README.md").write_text(README, encoding="utf-8")


if __name__ == "__main__":
    main()
