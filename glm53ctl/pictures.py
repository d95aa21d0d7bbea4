"""The pictures `bench --save` draws beside its JSON (SVG, no plotting library): where a step's time goes
(`step_picture`), and the step over the matrix of TP widths and row counts (`matrix_picture`)."""

from __future__ import annotations

from html import escape

from glm53ctl.kernels.kinds import KINDS


def key_label(r: dict) -> str:
    """A benched key in words: 'sparse TP4 r1 32K' (the context, for the kinds that read caches)."""
    c = r.get("context")
    return f"{r['kind']} TP{r['tp']} r{r['rows']}" + ("" if c is None else f" {_tokens(c)}")


def _tokens(n: int) -> str:
    return f"{n // 1024}K" if n >= 1024 and n % 1024 == 0 else str(n)


def _colour(kind: str) -> str:
    """A part's colour in a step's picture: its kind's (the registry's); the gaps' yellow for what is no kind."""

    return KINDS[kind].colour if kind in KINDS else "#f0e442"


def step_picture(r: dict) -> str:
    """Where a step's time goes, as an SVG: the step as one bar, each part's launch (timed alone) a segment in
    step order coloured by its kind, then the gaps; below it the floor (every byte at the copy bandwidth) on the
    same scale; a legend with each kind's sum and share."""
    width, left, bar = 900, 10, 28
    scale = (width - 2 * left) / max(r["us"], r["parts_us"], r.get("floor_us", 0))
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{130 + 18 * len(r["by_kind"])}" '
        'font-family="sans-serif" font-size="12">',
        f'<text x="{left}" y="16">{key_label(r)}: {r["us"]:.0f} µs per step ({r["tokens_per_s"]:.0f} tokens/s per '
        f"rank), {r.get('pct_copy', 0):.1f}% of the copy bandwidth</text>",
    ]
    x = left
    for p in r["parts"]:
        w = p["us"] * scale
        colour = _colour(p["kind"])
        out.append(
            f'<rect x="{x:.2f}" y="26" width="{w:.2f}" height="{bar}" fill="{colour}" stroke="white" '
            f'stroke-width="0.3"><title>{p["part"]} ({p["kind"]}): {p["us"]:.1f} µs</title></rect>'
        )
        x += w
    if r["gaps_us"] > 0:
        out.append(
            f'<rect x="{x:.2f}" y="26" width="{r["gaps_us"] * scale:.2f}" height="{bar}" fill="#f0e442">'
            f"<title>gaps: {r['gaps_us']:.1f} µs</title></rect>"
        )
    if "floor_us" in r:
        out.append(f'<rect x="{left}" y="{34 + bar}" width="{r["floor_us"] * scale:.2f}" height="10" fill="#333"/>')
        out.append(
            f'<text x="{left}" y="{60 + bar}">floor: {r["floor_us"]:.0f} µs (the step\'s bytes at the copy '
            "bandwidth)</text>"
        )
    y = 84 + bar
    for kind, s in list(r["by_kind"].items()) + [("gaps", {"us": r["gaps_us"], "share": r["gaps_us"] / r["us"]})]:
        colour = _colour(kind)
        n = f"{s['parts']} × " if "parts" in s else ""
        out.append(f'<rect x="{left}" y="{y - 10}" width="10" height="10" fill="{colour}"/>')
        out.append(f'<text x="{left + 16}" y="{y}">{n}{kind}: {s["us"]:.0f} µs ({100 * s["share"]:.1f}%)</text>')
        y += 18
    return "\n".join(out + ["</svg>"]) + "\n"


def _fmt_us(us: float) -> str:
    return f"{us / 1000:.3g} ms" if us >= 1000 else f"{us:.0f} µs"


def _heat(pct: float) -> str:
    """A cell's colour by % of the copy bandwidth: pale at 0, deep blue at 100 (the text stays readable)."""
    f = max(0.0, min(1.0, pct / 100))
    r, g, b = (int(a + (z - a) * f) for a, z in ((240, 33), (244, 102), (250, 172)))
    return f"#{r:02x}{g:02x}{b:02x}"


def matrix_picture(rows: list[dict], title: str = "model", tps=(), counts=()) -> str:
    """The step across TP widths (a row each) and row counts (a column each), a panel per context: each cell its
    µs per step and % of the copy bandwidth (its colour), tokens/s per rank, and beside it the compiled step's µs
    and how many times slower it is, where that baseline was timed. `rows`: bench's rows of `model` keys; `tps`,
    `counts`: the widths and row counts drawn besides theirs (a key not timed is a grey cell that says so)."""
    contexts = sorted({r.get("context") or 0 for r in rows})
    tps = sorted({r["tp"] for r in rows} | set(tps))
    counts = sorted({r["rows"] for r in rows} | set(counts))
    cell_w, cell_h, left, top, gap = 180, 64, 50, 56, 34
    panel_h = 24 + cell_h * len(tps)
    width = max(left + cell_w * len(counts) + 20, 860)
    height = top + (panel_h + gap) * len(contexts) + 40
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-family="sans-serif" '
        'font-size="11">',
        f'<text x="10" y="18" font-size="13" font-weight="bold">{escape(title)}</text>',
        '<text x="10" y="36" font-size="12">each cell: µs per step · % of the copy bandwidth (its colour); tokens/s '
        "per rank; the compiled step (torch.compile) and ×, where timed</text>",
    ]
    by_key = {(r.get("context") or 0, r["tp"], r["rows"]): r for r in rows}
    y0 = top
    for c in contexts:
        label = f"context {c // 1024}K" if c and c % 1024 == 0 else (f"context {c}" if c else "")
        out.append(f'<text x="10" y="{y0 + 12}" font-weight="bold">{label}</text>')
        for j, n in enumerate(counts):
            out.append(f'<text x="{left + j * cell_w + cell_w / 2}" y="{y0 + 12}" text-anchor="middle">rows {n}</text>')
        for i, tp in enumerate(tps):
            y = y0 + 20 + i * cell_h
            out.append(f'<text x="10" y="{y + cell_h / 2 + 4}">TP{tp}</text>')
            for j, n in enumerate(counts):
                x = left + j * cell_w
                r = by_key.get((c, tp, n))
                if r is None:
                    out.append(f'<rect x="{x}" y="{y}" width="{cell_w - 4}" height="{cell_h - 4}" fill="#f4f4f4"/>')
                    out.append(f'<text x="{x + 8}" y="{y + 20}" fill="#999">not timed</text>')
                    continue
                pct = r.get("pct_copy", 0.0)
                dark = pct > 55
                ink = "white" if dark else "black"
                out.append(
                    f'<rect x="{x}" y="{y}" width="{cell_w - 4}" height="{cell_h - 4}" fill="{_heat(pct)}">'
                    f"<title>TP{tp} rows {n}: {r['us']:.1f} µs per step, floor {r.get('floor_us', 0):.1f} µs"
                    f"</title></rect>"
                )
                lines = [f"{_fmt_us(r['us'])} · {pct:.1f}%"]
                if "tokens_per_s" in r:
                    lines.append(f"{r['tokens_per_s']:.0f} tokens/s per rank")
                comp = r.get("baselines", {}).get("compile")
                if comp:
                    lines.append(f"compiled {_fmt_us(comp['us'])}: {comp['ratio']:.2f}×")
                for k, line in enumerate(lines):
                    weight = ' font-weight="bold"' if k == 0 else ""
                    out.append(f'<text x="{x + 8}" y="{y + 17 + 15 * k}" fill="{ink}"{weight}>{line}</text>')
        y0 += panel_h + gap
    # the colour scale
    for k in range(11):
        out.append(f'<rect x="{10 + 24 * k}" y="{height - 30}" width="24" height="10" fill="{_heat(10 * k)}"/>')
    out.append(f'<text x="{10 + 24 * 11 + 8}" y="{height - 21}">0 → 100% of the copy bandwidth</text>')
    return "\n".join(out + ["</svg>"]) + "\n"


def saved_steps(folder, model: str) -> tuple[list[dict], list[str]]:
    """Every `model` key timed in the bench JSONs of `folder` for `model`, the newest file's row per key (TP,
    rows, context), and the files that could not be read (skipped: a picture is no reason to fail a run)."""
    import json
    from pathlib import Path

    rows, skipped = {}, []
    for path in sorted(Path(folder).glob(f"bench-{model}-*.json")):  # the stamp sorts them oldest first
        try:
            doc = json.loads(path.read_text())
            keys = [r for r in doc["keys"] if r.get("kind") == "model"]
            for r in keys:
                rows[(r["tp"], r["rows"], r.get("context"))] = r
        except (OSError, ValueError, KeyError, TypeError):
            skipped.append(path.name)
    return list(rows.values()), skipped
