"""Every MindFormers YAML of a mindspore-lab/mindformers checkout through `import-config`: as written, and with
`--scale nano` (the CPU try-out), one row per file: imported, or refused with the report's lines.

    python bench/mindformers_import_probe.py --tree PATH [--tree PATH …] [--out bench/records/mindformers_import.json]
    python bench/mindformers_import_probe.py --markdown     the record's tables

A tree is a folder holding the repository's configs/ and research/ (e.g. `git archive master configs research`
unpacked); its git commit is read from a file named COMMIT in it when present. The record names this commit too.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parent
sys.path[:0] = [str(BENCH.parent), str(BENCH)]

import yaml  # noqa: E402

from helpers.book.planner import config_plan  # noqa: E402
from helpers.config import ConfigError, from_dict  # noqa: E402
from helpers.mindformers import RecipeRefused, import_mindformers, scaled  # noqa: E402
from helpers.record import atomic_write_json  # noqa: E402
from provenance import RECORDS, Provenance  # noqa: E402


def _attempt(data: dict, source: str, scale: str) -> tuple[str, list[str], float | None]:
    """('imported' | 'refused', each refusal's 'key=value: why' line, full-size parameters in B or None)."""
    try:
        imported = import_mindformers(data, reduce=bool(scale), source=source)
        cfg = from_dict(imported.config)  # the full-size plan, reductions left out
        if scale:
            scaled(imported, scale)
    except RecipeRefused as exc:
        return "refused", [r.line() for r in exc.refusals], None
    except ConfigError as exc:
        return "refused", [str(exc)], None
    params = config_plan(cfg)[0].n_params / 1e9 if cfg.model.vocab_size else None
    return "imported", [], params


def probe(tree: Path) -> list[dict]:
    """One row per YAML under tree/configs and tree/research that is a model recipe (has a `model` section)."""
    rows = []
    for path in sorted([*tree.glob("configs/**/*.yaml"), *tree.glob("research/**/*.yaml")]):
        rel = str(path.relative_to(tree))
        try:
            data = yaml.safe_load(path.read_text(encoding="utf-8"))
        except (yaml.YAMLError, UnicodeDecodeError):
            rows.append({"file": rel, "kind": "not YAML"})
            continue
        if not isinstance(data, dict) or "model" not in data:
            rows.append({"file": rel, "kind": "not a model recipe"})
            continue
        written, lines, params = _attempt(data, rel, "")
        tryout, tryout_lines, full_params = _attempt(data, rel, "nano")
        rows.append({"file": rel, "kind": str(data.get("run_mode", "?")),
                     "schema": "mcore" if data.get("use_legacy") is False else "legacy",
                     "as_written": written, "as_written_lines": lines, "params_B": params or full_params,
                     "scale_nano": tryout, "scale_nano_lines": tryout_lines})
    return rows


def summary(rows: list[dict]) -> dict:
    """Counts per kind of file and outcome."""
    recipes = [r for r in rows if "as_written" in r]
    train = [r for r in recipes if r["kind"] in ("train", "finetune")]
    return {"files": len(rows), "recipes": len(recipes), "train_or_finetune": len(train),
            "as_written_imported": sum(r["as_written"] == "imported" for r in recipes),
            "scale_nano_imported": sum(r["scale_nano"] == "imported" for r in recipes),
            "train_as_written_imported": sum(r["as_written"] == "imported" for r in train),
            "train_scale_nano_imported": sum(r["scale_nano"] == "imported" for r in train)}


def markdown(record: dict, kinds: tuple[str, ...] = ("train", "finetune")) -> str:
    """The record as Markdown tables, one per tree: each training recipe, as written and under --scale nano (the
    first refusal and how many), and the planner's full-size parameter count."""
    def cell(outcome: str, lines: list[str]) -> str:
        if outcome == "imported":
            return "imports"
        return f"refused ({len(lines)}): `{lines[0].split(':')[0][:60]}`"
    out = []
    for tree in record["trees"]:
        s = tree["summary"]
        out += [f"**{tree['tree']}** ({(tree['mindformers_commit'] or '?')[:7]}): {s['train_or_finetune']} training "
                f"recipes, {s['train_as_written_imported']} import as written, {s['train_scale_nano_imported']} "
                f"under --scale nano", "", "| file | schema | as written | --scale nano | parameters (B) |",
                "|---|---|---|---|---|"]
        for row in tree["rows"]:
            if row.get("kind") in kinds:
                p = f"{row['params_B']:.3f}" if row.get("params_B") else "—"
                out.append(f"| {row['file']} | {row['schema']} | {cell(row['as_written'], row['as_written_lines'])} "
                           f"| {cell(row['scale_nano'], row['scale_nano_lines'])} | {p} |")
        out.append("")
    return "\n".join(out)


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tree", type=Path, action="append", help="a folder with configs/ and research/")
    p.add_argument("--out", type=Path, default=RECORDS / "mindformers_import.json")
    p.add_argument("--markdown", action="store_true", help="print the tables of the record at --out and exit")
    args = p.parse_args(argv)
    if args.markdown:
        print(markdown(json.loads(args.out.read_text(encoding="utf-8"))))
        return 0
    if not args.tree:
        p.error("--tree is required (or --markdown)")
    with Provenance(argv, script="bench/mindformers_import_probe.py") as prov:
        trees = []
        for tree in args.tree:
            commit = (tree / "COMMIT").read_text().strip() if (tree / "COMMIT").exists() else None
            rows = probe(tree)
            trees.append({"tree": tree.name, "mindformers_commit": commit, "summary": summary(rows), "rows": rows})
            print(tree.name, commit, summary(rows), flush=True)
    atomic_write_json(args.out, {"item": "mindformers_import", "provenance": prov.to_dict(), "trees": trees})
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
