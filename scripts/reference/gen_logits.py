"""make_reference.py's model references: greedy decoding by full recompute with the logits of
every step, written as tests/data/reference/<model>.json + <model>.logits.bin."""
import hashlib

import numpy as np
import torch

from .gen_common import N_GREEDY, REF, die, log, versions, write_json


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
