"""make_reference.py's driver: everything it writes, in order (tiny_llama, tiny_qwen2,
tiny_llama_gguf, the tokenization references, SmolLM2, the README); the script imports it only
once its arguments are parsed, so that --help works without torch and the rest."""
import os

# gen_common goes first: it sets the environment the libraries read and torch's threads and
# determinism.
from .gen_common import (MODELS, REF, REPO, SEED, SMOLLM2_GGUF, TD, die, log, read_corpus,
                         rel, versions)
from .gen_chat import CHATML_TEMPLATE, LLAMA2_CHAT_TEMPLATE, render_chat
from .gen_gguf import hf_sd_from_gguf_dequant, write_tiny_llama_gguf
from .gen_logits import write_model_reference
from .gen_models import hf_model_from_state_dict, write_tiny_llama, write_tiny_qwen2
from .gen_readme import write_readme
from .gen_tokenization import tokenization_cases, write_tokenization_reference
from .gen_tokenizers import (build_llama_tokenizer, build_qwen2_tokenizer,
                             build_smollm2_tokenizer, gguf_field, spm_tokenize)

import numpy as np
import torch
import gguf
import tokenizers
import transformers
from safetensors.torch import load_file
from tokenizers import Tokenizer


# ============================================================================= everything

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


def generate_all(skip_smollm2):
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
    if skip_smollm2:
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
