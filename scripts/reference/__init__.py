"""Reference tooling for thetaserve's tests (tests/data/).

The gen_* modules are the parts of scripts/make_reference.py, which imports gen_all once it
has parsed its arguments (as reference.gen_all: running the script puts scripts/ on sys.path);
gen_all imports the rest, gen_common first, since it sets the environment the libraries read
and torch's threads and determinism:

  gen_all           the driver: everything, in order (tiny models, GGUF, tokenization
                    references, SmolLM2, README)
  gen_common        paths, library imports and settings, log/die/rel/versions, write_json,
                    the corpora (data/*.txt)
  gen_chat          the Llama-2 and ChatML chat templates and render_chat
  gen_tokenizers    the tiny_llama (SPM-style), tiny_qwen2 (byte-level) and SmolLM2 (from the
                    GGUF) tokenizers, and an emulation of llama.cpp's SPM tokenizer
  gen_models        the random tiny_llama and tiny_qwen2 models in HF format
  gen_gguf          tiny_llama as GGUF (Q/K permutation, mixed tensor types) and back
  gen_logits        the model references: greedy decoding and <model>.json + .logits.bin
  gen_tokenization  the tokenization references: texts and tokenization_<name>.json
  gen_readme        tests/data/reference/README.md

corpora.py (used by scripts/fetch-corpora.sh) and numpy_forward.py (an independent NumPy
forward pass that cross-checks the logits) are standalone scripts.
"""
