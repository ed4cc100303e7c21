#!/usr/bin/env python3
"""Plots a Top-θ fidelity sweep (JSON lines from `thetaserve eval --out`).

    python3 scripts/plot_fidelity.py out/fidelity/fidelity.jsonl docs/plots

Writes fidelity_ppl_vs_rows.png (perplexity change vs V rows read per L, one point per
configuration) and fidelity_by_k.png (perplexity change and V rows read/stored against k).
Also prints a Markdown table of every configuration.
"""
import json
import pathlib
import sys


def label(r):
    parts = [r["mode"], r["policy"]]
    if r["sdc"] != "exact" or not r["vmc"]:
        parts.append(f"sdc={r['sdc']}" + ("" if r["vmc"] else ",no-vmc"))
    return " ".join(parts)


def main():
    src, out_dir = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
    rows = [json.loads(l) for l in src.read_text().splitlines() if l.strip()]
    rows = [r for r in rows if "dense_perplexity" in r]
    print("| context | k | mode | policy | SDC | VMC | ppl | dense ppl | Δppl % | agreement | mean KL "
          "| V rows read / L (decode) | V rows stored / L | prefill elements kept |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['context']} | {r['k']} | {r['mode']} | {r['policy']} | {r['sdc']} | "
              f"{'on' if r['vmc'] else 'off'} | {r['perplexity']:.3f} | {r['dense_perplexity']:.3f} | "
              f"{r['ppl_change_pct']:+.2f} | {r['agreement']:.3f} | {r['mean_kl']:.4f} | "
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

    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for mode, policy, color in [("top-theta-post", "full", "C0"), ("top-theta-post", "sparse", "C4"),
                                ("top-theta-pre", "full", "C1")]:
        sel = sorted((r for r in rows if r["mode"] == mode and r["policy"] == policy and r["sdc"] == "exact"
                      and r["vmc"] and r["context"] == 2048), key=lambda r: r["k"])
        if not sel:
            continue
        ks = [r["k"] for r in sel]
        axes[0].plot(ks, [r["ppl_change_pct"] for r in sel], "o-", color=color, label=f"{mode} {policy}")
        axes[1].plot(ks, [r["decode_v_rows_read_per_L"] for r in sel], "o-", color=color,
                     label=f"read, {mode} {policy}")
        if policy == "sparse":
            axes[1].plot(ks, [r["v_rows_stored_per_L"] for r in sel], "s--", color=color,
                         label=f"stored, {mode} {policy}")
    axes[0].set_xscale("log", base=2)
    axes[1].set_xscale("log", base=2)
    axes[0].set_xlabel("k")
    axes[1].set_xlabel("k")
    axes[0].set_ylabel("perplexity change (%)")
    axes[1].set_ylabel("V rows / L")
    axes[0].legend(fontsize=7)
    axes[1].legend(fontsize=7)
    fig.suptitle("Top-θ at context 2048 (SDC exact + VMC)")
    fig.tight_layout()
    fig.savefig(out_dir / "fidelity_by_k.png", dpi=120)
    return 0


if __name__ == "__main__":
    sys.exit(main())
