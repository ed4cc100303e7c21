#!/usr/bin/env python3
"""Decode the public-domain corpora shipped in Debian packages into plain UTF-8 text.

Used by scripts/fetch-corpora.sh; needs only the Python standard library (no R, no bible-kjv).

  kjv      /usr/lib/bible.data (package bible-kjv-text). Format "EC02 Compressed Data File":
           32-byte magic, zero padding, then at 0x50 three big-endian u32 (0, block size 65536,
           number of blocks n) and n+1 absolute file offsets; every block is an independent
           Unix-compress (LZW, 16 bit, block mode) stream whose 3-byte .Z header (1f 9d 90)
           is stored once only. Decoded text is one verse per line, "Ge1:1 In the beginning..."
           after a title line. We write the verse text only, one verse per line, without the
           "Ge1:1 " reference and without the title line.
  austen   /usr/lib/R/site-library/janeaustenr/data/Rdata.{rdx,rdb}: an R lazy-load database.
           The .rdx is a gzip'd R serialization (XDR) of list(variables=, references=,
           compressed=); each variable maps to (offset, length) in the .rdb, where the record
           is a 4-byte big-endian uncompressed length followed by a zlib stream (compressed=
           TRUE/1; for 2/3 a type byte 'Z'/'2'/'X'/'0' follows the length). Each novel is a
           character vector of lines; we join lines with "\n", novels in publication-set order.
  fortunes /usr/share/games/fortunes/* (packages fortunes, fortunes-min): regular files only
           (not the .dat indices or .u8 symlinks), sorted by name; terminal overstriking
           ("c\\bc", "_\\bc") and other control characters (BEL) are removed, UTF-8 that
           upstream double-encoded (mojibake like "donÃ¢Â\x80Â\x99t") is repaired, and "%"
           separator lines become blank lines.
"""
import bz2
import gzip
import lzma
import os
import re
import struct
import sys
import zlib

# ----------------------------------------------------------------------------------- KJV

def lzw_decompress(data: bytes, maxbits: int = 16) -> bytes:
    """Unix compress(1) decoder, block mode (CLEAR code 256), no .Z header."""
    out = bytearray()
    n_bits = 9
    maxmaxcode = 1 << maxbits
    # Codes are read in groups of n_bits*8 bits (8 codes); when the code width changes or a
    # CLEAR arrives, the rest of the current group is skipped (classic compress quirk).
    dict_prefix = [0] * maxmaxcode
    dict_suffix = bytearray(maxmaxcode)
    for i in range(256):
        dict_suffix[i] = i
    free_ent = 257
    maxcode = (1 << n_bits) - 1
    bitpos = 0
    nbitsdata = len(data) * 8
    oldcode = -1
    finchar = 0
    group_start = 0

    def entry(code):
        s = bytearray()
        while code >= 256:
            s.append(dict_suffix[code])
            code = dict_prefix[code]
        s.append(code)
        s.reverse()
        return s

    cache = {}
    while True:
        if bitpos + n_bits > nbitsdata:
            break
        byte = bitpos >> 3
        chunk = int.from_bytes(data[byte:byte + 4].ljust(4, b"\0"), "little")
        code = (chunk >> (bitpos & 7)) & ((1 << n_bits) - 1)
        bitpos += n_bits
        if oldcode == -1:
            if code >= 256:
                raise ValueError("bad first LZW code")
            oldcode = code
            finchar = code
            out.append(code)
            continue
        if code == 256:  # CLEAR
            # skip to the end of the current group of n_bits*8 bits
            grp = n_bits * 8
            used = (bitpos - group_start) % grp
            if used:
                bitpos += grp - used
            free_ent = 256
            n_bits = 9
            maxcode = (1 << n_bits) - 1
            group_start = bitpos
            cache.clear()
            oldcode = -2  # next code is literal-ish: handled below
            continue
        if oldcode == -2:
            oldcode = code
            finchar = code
            out.append(code)
            # free_ent stays at 256 after CLEAR; original compress sets free_ent = FIRST-1 then
            # the first code after clear adds no entry.
            free_ent = 257
            continue
        incode = code
        if code >= free_ent:
            if code > free_ent:
                raise ValueError("corrupt LZW stream")
            s = entry(oldcode)
            s.append(finchar)
        else:
            s = entry(code)
        finchar = s[0]
        out += s
        if free_ent < maxmaxcode:
            dict_prefix[free_ent] = oldcode
            dict_suffix[free_ent] = finchar
            free_ent += 1
            if free_ent > maxcode and n_bits < maxbits:
                grp = n_bits * 8
                used = (bitpos - group_start) % grp
                if used:
                    bitpos += grp - used
                n_bits += 1
                maxcode = (1 << n_bits) - 1 if n_bits < maxbits else maxmaxcode
                group_start = bitpos
        oldcode = incode
    return bytes(out)


def kjv(path="/usr/lib/bible.data") -> str:
    d = open(path, "rb").read()
    if not d.startswith(b"EC02"):
        raise ValueError(f"{path}: not an EC02 compressed data file")
    _zero, blocksize, n = struct.unpack(">3I", d[0x50:0x5C])
    offs = struct.unpack(">%dI" % (n + 1), d[0x5C:0x5C + 4 * (n + 1)])
    if offs[-1] != len(d):
        raise ValueError(f"{path}: block table does not end at file end")
    raw = bytearray()
    for i in range(n):
        blk = lzw_decompress(d[offs[i]:offs[i + 1]])
        if i < n - 1 and len(blk) != blocksize:
            raise ValueError(f"{path}: block {i} decoded to {len(blk)} bytes, want {blocksize}")
        raw += blk
    lines = raw.decode("ascii").split("\n")
    verse = re.compile(r"^([1-3]?[A-Za-z]+)(\d+):(\d+) (.*)$")
    out = []
    for ln in lines[1:]:
        if not ln:
            continue
        m = verse.match(ln)
        if not m:
            raise ValueError(f"{path}: unexpected line {ln[:60]!r}")
        out.append(m.group(4).strip())
    return "\n".join(out) + "\n"

# -------------------------------------------------------------------------------- Austen

class RUnserializer:
    """Minimal reader for R's XDR serialization (format 2 and 3), enough for data objects:
    character/logical/integer/double vectors, lists, pairlists, symbols, environments refs."""

    NILVALUE_SXP, REFSXP, EMPTYENV_SXP, BASEENV_SXP, GLOBALENV_SXP = 254, 255, 242, 241, 253
    UNBOUNDVALUE_SXP, MISSINGARG_SXP, BASENAMESPACE_SXP = 252, 251, 247
    NAMESPACESXP, PACKAGESXP, PERSISTSXP = 249, 248, 247
    ALTREP_SXP, ATTRLISTSXP, ATTRLANGSXP = 238, 239, 240

    def __init__(self, data: bytes):
        self.d = data
        self.p = 0
        self.refs = []

    def _int(self):
        v = struct.unpack_from(">i", self.d, self.p)[0]
        self.p += 4
        return v

    def _len(self):
        n = self._int()
        if n == -1:
            hi, lo = self._int(), self._int()
            n = (hi << 32) + (lo & 0xFFFFFFFF)
        return n

    def _bytes(self, n):
        b = self.d[self.p:self.p + n]
        self.p += n
        return b

    def run(self):
        if self._bytes(2) != b"X\n":
            raise ValueError("not an XDR R serialization")
        version = self._int()
        self._int()  # writer R version
        self._int()  # min reader version
        if version == 3:
            n = self._int()
            self._bytes(n)  # native encoding
        elif version != 2:
            raise ValueError(f"unsupported serialization version {version}")
        return self.item()

    def _strvec(self):
        if self._int() != 0:
            raise ValueError("bad string vector")
        return [self.item() for _ in range(self._len())]

    def item(self):
        flags = self._int()
        t = flags & 0xFF
        has_attr = bool(flags & (1 << 9))
        has_tag = bool(flags & (1 << 10))
        levels = flags >> 12
        if t == self.REFSXP:
            idx = flags >> 8
            if idx == 0:
                idx = self._int()
            return self.refs[idx - 1]
        if t in (self.NILVALUE_SXP, self.EMPTYENV_SXP, self.BASEENV_SXP, self.GLOBALENV_SXP,
                 self.UNBOUNDVALUE_SXP, self.MISSINGARG_SXP, self.BASENAMESPACE_SXP):
            return None
        if t == self.PERSISTSXP or t in (self.NAMESPACESXP, self.PACKAGESXP):
            v = ("ns", self._strvec())
            self.refs.append(v)
            return v
        if t == 1:  # SYMSXP
            v = ("sym", self.item())
            self.refs.append(v)
            return v
        if t == 4:  # ENVSXP
            env = {"type": "env"}
            self.refs.append(env)
            self._int()  # locked
            env["enclos"] = self.item()
            env["frame"] = self.item()
            env["hashtab"] = self.item()
            env["attr"] = self.item()
            return env
        if t in (2, 6, 3, 5, 17, self.ATTRLISTSXP, self.ATTRLANGSXP):  # pairlist-like
            attr = self.item() if has_attr else None
            tag = self.item() if has_tag else None
            car = self.item()
            cdr = self.item()
            node = {"type": "pairlist", "tag": tag, "car": car, "cdr": cdr, "attr": attr}
            return node
        if t == self.ALTREP_SXP:
            info = self.item()
            state = self.item()
            attr = self.item()
            return {"type": "altrep", "info": info, "state": state, "attr": attr}
        if t == 9:  # CHARSXP
            n = self._int()
            if n == -1:
                v = None
            else:
                raw = self._bytes(n)
                if levels & (1 << 2):  # LATIN1
                    v = raw.decode("latin-1")
                elif levels & (1 << 1):  # BYTES
                    v = raw
                else:
                    v = raw.decode("utf-8")
            if has_attr:
                self.item()
            return v
        if t in (10, 13):  # LGLSXP, INTSXP
            n = self._len()
            v = list(struct.unpack_from(">%di" % n, self.d, self.p))
            self.p += 4 * n
        elif t == 14:  # REALSXP
            n = self._len()
            v = list(struct.unpack_from(">%dd" % n, self.d, self.p))
            self.p += 8 * n
        elif t == 16:  # STRSXP
            v = [self.item() for _ in range(self._len())]
        elif t in (19, 20):  # VECSXP, EXPRSXP
            v = [self.item() for _ in range(self._len())]
        elif t == 24:  # RAWSXP
            v = self._bytes(self._len())
        else:
            raise ValueError(f"unsupported SEXP type {t}")
        attr = self.item() if has_attr else None
        if attr is not None:
            return {"type": "vector", "sexptype": t, "value": v, "attr": attr}
        return v


def _pairlist_to_dict(node):
    out = {}
    while isinstance(node, dict) and node.get("type") == "pairlist":
        tag = node["tag"]
        name = tag[1] if isinstance(tag, tuple) else tag
        out[name] = node["car"]
        node = node["cdr"]
    return out


def _named_list(obj):
    if isinstance(obj, dict) and obj.get("type") == "vector":
        names = _pairlist_to_dict(obj["attr"]).get("names")
        return dict(zip(names, obj["value"]))
    raise ValueError("expected a named list")


def r_lazyload(dbbase):
    """Returns {name: python value} for every variable in an R lazy-load DB (base path
    without .rdx/.rdb)."""
    idx = RUnserializer(gzip.decompress(open(dbbase + ".rdx", "rb").read())).run()
    idx = _named_list(idx)
    compressed = idx.get("compressed")
    ctype = int(compressed[0]) if isinstance(compressed, list) else 1
    variables = _named_list(idx["variables"])
    rdb = open(dbbase + ".rdb", "rb").read()
    out = {}
    for name, (off, ln) in variables.items():
        rec = rdb[int(off):int(off) + int(ln)]
        ulen = struct.unpack(">I", rec[:4])[0]
        if ctype in (2, 3):
            kind, body = rec[4:5], rec[5:]
            if kind == b"Z":
                raw = zlib.decompress(body)
            elif kind == b"2":
                raw = bz2.decompress(body)
            elif kind == b"X":
                raw = lzma.decompress(body)
            elif kind == b"0":
                raw = body
            else:
                raise ValueError(f"unknown lazy-load compression {kind!r}")
        else:
            raw = zlib.decompress(rec[4:])
        if len(raw) != ulen:
            raise ValueError(f"{name}: length mismatch")
        out[name] = RUnserializer(raw).run()
    return out


AUSTEN_ORDER = ["sensesensibility", "prideprejudice", "mansfieldpark", "emma",
                "northangerabbey", "persuasion"]


def austen(pkgdir="/usr/lib/R/site-library/janeaustenr") -> str:
    objs = r_lazyload(os.path.join(pkgdir, "data", "Rdata"))
    novels = []
    for name in AUSTEN_ORDER:
        v = objs[name]
        if isinstance(v, dict):
            v = v["value"]
        if not all(isinstance(s, str) for s in v):
            raise ValueError(f"{name}: not a plain character vector")
        novels.append("\n".join(s.rstrip() for s in v).strip("\n"))
    return "\n\n".join(novels) + "\n"

# ------------------------------------------------------------------------------ fortunes

def _fix_mojibake(m):
    """A few fortune files hold UTF-8 that was decoded as Latin-1 and re-encoded (once or
    twice): undo that while it round-trips."""
    s = m.group(0)
    for _ in range(3):
        try:
            t = s.encode("latin-1").decode("utf-8")
        except (UnicodeEncodeError, UnicodeDecodeError):
            break
        s = t
    return s


def fortunes(fdir="/usr/share/games/fortunes") -> str:
    parts = []
    for name in sorted(os.listdir(fdir)):
        p = os.path.join(fdir, name)
        if os.path.islink(p) or not os.path.isfile(p) or "." in name:
            continue
        raw = open(p, "rb").read()
        try:
            txt = raw.decode("utf-8")
        except UnicodeDecodeError:
            txt = raw.decode("latin-1")
        txt = txt.replace("\r\n", "\n")
        # remove overstriking: "x\bx" (bold) and "_\bx" (underline) -> "x"
        while "\b" in txt:
            new = re.sub(r"[^\n]\x08", "", txt)
            new = new.replace("\x08", "")
            if new == txt:
                break
            txt = new
        txt = re.sub(r"[^\x00-\x7f]+", _fix_mojibake, txt)
        txt = re.sub(r"[\x00-\x08\x0b-\x1f\x7f]", "", txt)  # BEL etc.; keep \t \n
        out_lines = []
        for ln in txt.split("\n"):
            out_lines.append("" if ln == "%" else ln.rstrip())
        parts.append("\n".join(out_lines).strip("\n"))
    text = "\n\n".join(parts) + "\n"
    text = re.sub(r"\n{3,}", "\n\n", text)
    return text


def main(argv):
    if len(argv) != 3 or argv[1] not in ("kjv", "austen", "fortunes"):
        print("usage: corpora.py {kjv|austen|fortunes} OUT.txt", file=sys.stderr)
        return 2
    text = {"kjv": kjv, "austen": austen, "fortunes": fortunes}[argv[1]]()
    tmp = argv[2] + ".tmp"
    with open(tmp, "w", encoding="utf-8", newline="\n") as f:
        f.write(text)
    os.replace(tmp, argv[2])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
