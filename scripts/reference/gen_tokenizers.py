"""make_reference.py's tokenizers: tiny_llama's Llama-2-style SPM BPE with byte fallback and
tiny_qwen2's byte-level BPE (both trained on KJV), SmolLM2's rebuilt from its GGUF, and an
emulation of llama.cpp's SPM tokenizer to check that tiny_llama's GGUF scores and its
tokenizer.json agree."""
import json

import gguf
from tokenizers import Tokenizer, AddedToken, decoders, models, normalizers
from tokenizers import pre_tokenizers, processors, trainers


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
