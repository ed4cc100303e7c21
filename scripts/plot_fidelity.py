#!/usr/bin/env python3
"""Plots a Top-θ fidelity sweep (JSON lines from `thetaserve eval --out`).

    python3 scripts/plot_fidelity.py out/fidelity/fidelity.jsonl docs/plots

Writes fidelity_ppl_vs_rows.png (perplexity change vs V rows read per L, one point per
configuration) and fidelity_by_k.png (perplexity change and V rows read/stored against k, one
row of panels per context). Also prints a Markdown table of every configuration.
"""
import json
import pathlib
import sys


def policy_label(r):
    if r["policy"] != "sparse":
        return r["policy"]
    if r.get("keep_fraction"):
        return f"sparse, window {r['local_window']} + F={r['keep_fraction']:g}"
    return "sparse, recency" if "local_window" in r else "sparse (design rule)"


def label(r):
    parts = [r["mode"], r["policy"]]
    if r["sdc"] != "exact" or not r["vmc"]:
        parts.append(f"sdc={r['sdc']}" + ("" if r["vmc"] else ",no-vmc"))
    return " ".join(parts)


def main():
    src, out_dir = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
    rows = [json.loads(l) for l in src.read_text().splitlines() if l.strip()]
    rows = [r for r in rows if "dense_perplexity" in r]
    rows.sort(key=lambda r: (r["context"], r.get("matmul", "?"), r["mode"] != "top-theta-post", r["mode"], r["k"],
                             r["policy"], r.get("keep_fraction", 0), r["sdc"] != "exact", not r["vmc"]))
    print("| context | matmul | k | mode | policy | SDC | VMC | ppl | dense ppl | Δppl % | Δppl %, decoded half "
          "| agreement | mean KL | V rows read / L (decode) | V rows stored / L | prefill elements kept |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        dec = f"{r['decode_ppl_change_pct']:+.2f}" if "decode_ppl_change_pct" in r else "—"
        print(f"| {r['context']} | {r.get('matmul', '?')} | {r['k']} | {r['mode']} | {policy_label(r)} | {r['sdc']} | "
              f"{'on' if r['vmc'] else 'off'} | {r['perplexity']:.3f} | {r['dense_perplexity']:.3f} | "
              f"{r['ppl_change_pct']:+.2f} | {dec} | {r['agreement']:.3f} | {r['mean_kl']:.4f} | "
              f"{r['decode_v_rows_read_per_L']:.3f} | {r['v_rows_stored_per_L']:.3f} | "
              f"{r['prefill_elements_kept']:.3f} |")
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed: table only", file=sys.stderr)
        return 0
    out_dir.mkdir(parents=True, exist_ok=True)

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for r in rows:
        marker = "o" if r["policy"] == "full" else "s"
        color = {"top-theta-post": "C0", "top-theta-pre": "C1", "top-k": "C2"}.get(r["mode"], "C3")
        ax.scatter(r["decode_v_rows_read_per_L"], r["ppl_change_pct"], marker=marker, color=color)
        comp = "" if (r["sdc"] == "exact" and r["vmc"]) else f" sdc={r['sdc']}{'' if r['vmc'] else ' no-vmc'}"
        ax.annotate(f"k={r['k']} L={r['context']}{comp}", (r["decode_v_rows_read_per_L"], r["ppl_change_pct"]),
                    fontsize=6, xytext=(3, 2), textcoords="offset points")
    ax.set_yscale("symlog", linthresh=1.0)
    ax.axhline(1.0, color="gray", lw=0.8, ls="--")
    ax.axvline(1 / 3, color="gray", lw=0.8, ls=":")
    ax.set_xlabel("V rows read per decode step / L")
    ax.set_ylabel("perplexity change vs dense (%, symlog)")
    ax.set_title("SmolLM2-135M, calibrated on KJV, evaluated on Austen\n"
                 "blue: Top-θ post, orange: pre, green: exact top-k; squares: policy sparse")
    fig.tight_layout()
    fig.savefig(out_dir / "fidelity_ppl_vs_rows.png", dpi=120)

    contexts = sorted({r["context"] for r in rows})
    fig, axes = plt.subplots(len(contexts), 2, figsize=(10, 3.6 * len(contexts)), squeeze=False)
    curves = [("top-theta-post", "full", "C0"), ("top-theta-post", "sparse", "C4"),
              ("top-theta-pre", "full", "C1")]
    for row, ctx in zip(axes, contexts):
        for mode, policy, color in curves:
            # policy sparse: the mass-budget rows (one configuration at every k)
            sel = sorted((r for r in rows if r["mode"] == mode and r["policy"] == policy
                          and r["sdc"] == "exact" and r["vmc"] and r["context"] == ctx
                          and (policy == "full" or r.get("keep_fraction"))), key=lambda r: r["k"])
            if not sel:
                continue
            matmuls = sorted({r.get("matmul", "?") for r in sel})
            name = f"{mode} {policy_label(sel[0])} ({'/'.join(matmuls)} matmul)"
            ks = [r["k"] for r in sel]
            row[0].plot(ks, [r["ppl_change_pct"] for r in sel], "o-", color=color, label=name)
            row[1].plot(ks, [r["decode_v_rows_read_per_L"] for r in sel], "o-", color=color,
                        label=f"read, {name}")
            if policy == "sparse":
                row[1].plot(ks, [r["v_rows_stored_per_L"] for r in sel], "s--", color=color,
                            label=f"stored, {name}")
        for ax in row:
            ax.set_xscale("log", base=2)
            ax.set_xlabel("k")
            ax.legend(fontsize=7)
        row[0].set_ylabel(f"context {ctx}: perplexity change (%)")
        row[1].set_ylabel("V rows / L")
    fig.suptitle("Top-θ on SmolLM2 by k (SDC exact + VMC; θ calibrated at 2048 on KJV, Austen)")
    fig.tight_layout()
    fig.savefig(out_dir / "fidelity_by_k.png", dpi=120)
    return 0


if __name__ == "__main__":
    sys.exit(main())
