"""make_reference.py's tokenization references: the texts (KJV and Austen lines, a tricky set)
and tests/data/reference/tokenization_<name>.json."""
import json

from .gen_common import REF, every_nth_nonempty, log, versions


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
