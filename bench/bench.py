"""`make bench`: the bench items (bench/*_item.py, bench/*_items.py; bench/registry.py) and the tables of
docs/benchmarks.md.

    python bench/bench.py ITEM|all [options]   measure; one record per item, <results>/<item>.json (default
                                               bench/records/, kept in git), holding the commit, the date, the
                                               command, the machine, the load before and during, every raw
                                               measurement, the table rows and each must's and goal's status
    python bench/bench.py table [--write]      the tables of docs/benchmarks.md from the committed records
                                               (--write: into that page)

Exit status: 0 when every must measured was met; 1 when one was missed, measured outside its condition (invalid), or
an item measured nothing, one line each on stderr; 2 for arguments that would measure nothing or name an unknown
condition, one line, before anything runs. Writing to bench/records/ also regenerates docs/benchmarks.md's tables.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parent
sys.path[:0] = [str(BENCH.parent), str(BENCH)]  # helpers, and the bench modules

import registry  # noqa: E402
import table  # noqa: E402
from helpers.record import atomic_write_json  # noqa: E402
from provenance import RECORDS, Provenance  # noqa: E402

PAGE = BENCH.parent / "docs" / "benchmarks.md"


def parser(registered: dict[str, registry.Item]) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("item", choices=["all", "table", *registered],
                   help="an item, all of them, or the tables of docs/benchmarks.md")
    p.add_argument("--results", type=Path, default=RECORDS, help="folder of the records (default bench/records)")
    p.add_argument("--write", action="store_true", help="table: write the tables into docs/benchmarks.md")
    registry.add_options(p, registered)
    return p


def measure(item: registry.Item, args: argparse.Namespace, argv: list[str]) -> dict:
    """Run one item inside its provenance; the record: item, provenance, result, rows, checks."""
    with Provenance(argv) as prov:
        result = item.run(args)
    return {"item": item.name, "provenance": prov.to_dict(), "result": result,
            "rows": [list(row) for row in item.rows(result)], "checks": registry.judge(item, result)}


def write_table(folder: Path, registered: dict[str, registry.Item]) -> str:
    """Put the tables generated from `folder` into docs/benchmarks.md; returns them."""
    block = table.generated(folder, registered)
    PAGE.write_text(table.with_block(PAGE.read_text(encoding="utf-8"), block), encoding="utf-8")
    return block


def main(argv: list[str]) -> int:
    registered = registry.items()
    args = parser(registered).parse_args(argv)
    if args.item == "table":
        print(write_table(args.results, registered) if args.write else table.generated(args.results, registered))
        return 0
    chosen = [i for i in registered.values() if i.in_all] if args.item == "all" else [registered[args.item]]
    for item in chosen:  # every item's arguments before any runs: a bad one costs nothing
        why = item.check_args(args)
        if why:
            print(f"bench: {item.name}: {why}", file=sys.stderr)
            return 2
    args.results.mkdir(parents=True, exist_ok=True)
    failed = []
    for item in chosen:
        print(f"[bench] {item.name} …", flush=True)
        record = measure(item, args, argv)
        atomic_write_json(args.results / f"{item.name}.json", record)
        for j in record["checks"]:
            print(f"  {j['kind']} {j['status']}: {j['line']}", flush=True)
        failed += registry.failures(item, record["checks"])
    if args.results.resolve() == RECORDS.resolve():
        print(write_table(RECORDS, registered))
    for line in failed:
        print(f"bench: {line}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
