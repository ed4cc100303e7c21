"""make_reference.py's common part: the repository paths and fixed constants, the environment
and torch settings (threads, deterministic algorithms) made before anything runs, logging,
versions of the libraries, write_json, and the corpora (data/*.txt)."""
import json
import os
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
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
import safetensors  # noqa: E402
import tokenizers  # noqa: E402
import transformers  # noqa: E402

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


def write_json(path, obj, indent=2):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(obj, indent=indent, ensure_ascii=False) + "\n", encoding="utf-8")
