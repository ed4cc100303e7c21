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


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--skip-smollm2", action="store_true",
                    help="skip everything that needs models/SmolLM2-135M-Instruct.Q4_1.gguf")
    args = ap.parse_args()
    # The parts are in scripts/reference/ (gen_*.py). Imported only now: they need torch and
    # the rest, parsing the arguments (--help) does not.
    from reference.gen_all import generate_all
    generate_all(args.skip_smollm2)


if __name__ == "__main__":
    main()
