"""`make bench` item `mutation` (not part of `all`): does each test catch the feature it is meant to guard? Each mutant
breaks one feature on purpose (one exact piece of text replaced, which must occur exactly once in its file, else the
mutant is "not applied") in a detached git worktree of HEAD under /tmp that holds this checkout's uncommitted
changes too, then runs the tests meant to catch it there:

    <repo>/.venv/bin/python -m pytest -q -x -rfE -n 0 -p no:cacheprovider TESTS

with the worktree first on PYTHONPATH (the venv's editable install points at this checkout; `import helpers` is
checked to resolve inside the worktree before any mutant runs). A mutant is killed when pytest exits 1 naming a
failed or erroring test; an exit for any other reason (collection or usage error, no test run, timeout) is not a
kill. Before the mutants, the same tests run once unmutated and must pass: a test that fails anyway kills nothing.
The worktree's file is restored (`git checkout --`, or the uncommitted copy) after each mutant.
"""
from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from registry import MET, MISSED, MUST, NOT_MEASURED, Check, Item, Judgement, known

REPO = Path(__file__).resolve().parent.parent
PYTHON = REPO / ".venv" / "bin" / "python"
MUTANT_TIMEOUT_S = 600


@dataclass(frozen=True)
class Mutant:
    """One feature broken on purpose (`name`: its short id; `feature`: what breaks): `old` (exactly once in `file`)
    becomes `new`; `tests`: the pytest node ids or files meant to catch it."""
    name: str
    feature: str
    file: str
    old: str
    new: str
    tests: tuple[str, ...]


MUTANTS = (
    Mutant("recompute", "recompute ignored (recompute=blocks builds no recompute cells)", "helpers/run/build.py",
           '    if cfg.recompute == "blocks":\n', '    if False:\n',
           ("tests/tune/test_rounds.py::test_profiled_paired_round_profiles_each_arm_alone_in_its_warm_up",)),
    Mutant("qkv", "model.qkv ignored (fused builds three separate projections)", "helpers/run/model.py",
           '        if cfg.qkv != "separate":\n', '        if cfg.qkv == "fused_slice":\n',
           ("tests/run/test_model.py::test_multi_head_attention_is_n_kv_head_0_or_n_head",)),
    Mutant("writer_lock", "writer lock never taken (folder_lock.hold)", "helpers/folder_lock.py",
           "        fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)\n", "        pass\n",
           ("tests/test_folder_lock.py::test_a_second_writer_is_refused_naming_the_live_one_and_the_lock_ends_"
            "with_it",)),
    Mutant("loss_gate", "speed round verdict ignores the loss gate (worse loss kept)", "helpers/tune/rules.py",
           'verdict = "reject" if over_memory or worse_loss else speed.decision',
           'verdict = "reject" if over_memory else speed.decision',
           ("tests/tune/test_rules.py::test_loss_and_memory_gates_override_the_speed_decision_and_each_verdict_"
            "names_its_gate",)),
    Mutant("speed_flip", "speed decision flipped (an interval above +floor rejected)", "helpers/paired.py",
           '    if interval.low > f:\n        return "keep"\n', '    if interval.low > f:\n        return "reject"\n',
           ("tests/test_paired.py::test_thresholds_keep_reject_no_change_and_undecided",)),
    Mutant("metric_column", "metric column loss_ema dropped (record.METRIC_COLUMNS)", "helpers/record.py",
           '"tokens_per_s", "loss", "loss_ema",', '"tokens_per_s", "loss",',
           ("tests/test_derived.py::test_every_list_of_metric_or_summary_keys_is_drawn_from_the_declared_ones",)),
    Mutant("ckpt_hash", "checkpoint SHA-256 never checked (checkpoints.damage)", "helpers/run/checkpoints.py",
           "        digest = path.with_name(path.name + DIGEST_SUFFIX)\n        if digest.is_file():\n",
           "        digest = path.with_name(path.name + DIGEST_SUFFIX)\n        if False:\n",
           ("tests/test_fault_suite.py::test_resume_from_a_damaged_newest_checkpoint_names_the_intact_one_and_"
            "changes_nothing[_overwrite_middle]",)),
    Mutant("ckpt_identity", "checkpoint identity never checked (checkpoints.identity_damage)",
           "helpers/run/checkpoints.py",
           "        entries = read_entries(ckpt, frozenset({STEP, RUN}))\n", '        return ""\n',
           ("tests/test_checkpoint_identity.py::test_resume_refuses_a_checkpoint_that_is_not_what_its_name_and_"
            "folder_say",)),
    Mutant("mf_key", "MindFormers num_layers mapped onto model.n_head", "helpers/mindformers/model_keys.py",
           '"num_layers": (to("model.n_layer", int), "")', '"num_layers": (to("model.n_head", int), "")',
           ("tests/test_mindformers.py::test_the_legacy_llama2_7b_recipe_imports_and_the_planner_sizes_it",)),
    Mutant("data_stall", "speed estimator drops each reference block's slowest step (a data stall)",
           "helpers/paired.py",
           "    ref = [statistics.fmean(r) for (r, _), k in zip(m.pairs, keep) if k]\n",
           "    ref = [statistics.fmean(sorted(r)[:-1]) for (r, _), k in zip(m.pairs, keep) if k]\n",
           ("tests/test_paired.py::test_every_step_counts_stalls_and_waits_included",)),
    Mutant("cache_key", "token cache key ignores the corpus's size and mtime (corpus.fingerprint)",
           "helpers/run/corpus.py",
           '"bytes": stat.st_size, "mtime_ns": stat.st_mtime_ns,', "",
           ("tests/run/test_token_file.py::test_reused_while_unchanged_rebuilt_when_changed",)),
    Mutant("vocab_check", "tokenizer vocabulary never checked against model.vocab_size (data._check_vocabulary)",
           "helpers/run/data.py",
           "    if cfg.model.vocab_size and tokenizer.vocab_size > cfg.model.vocab_size:\n", "    if False:\n",
           ("tests/run/test_token_file.py::test_a_tokenizer_larger_than_the_model_vocabulary_is_refused",)),
    Mutant("yaml_alias", "YAML alias bound off (bounded_yaml MAX_ALIAS_NODES)", "helpers/bounded_yaml.py",
           "        if self._added > MAX_ALIAS_NODES:\n", "        if False:\n",
           ("tests/test_yaml_bounds.py::test_the_loader_refuses_each_hostile_file_within_a_second[alias bomb]",)),
    Mutant("hf_finite", "Hugging Face weights' NaN/inf check skipped (hf_files.load)", "helpers/run/hf_files.py",
           "    if not finite.all():\n", "    if False:\n",
           ("tests/run/test_hf_import_checks.py::test_a_weight_holding_a_nan_is_refused_naming_it_and_its_file",)),
    Mutant("check_device", "check_device a no-op (devices.check_device)", "helpers/run/devices.py",
           "    missing = absent(cfg.device_target)\n    if missing:\n",
           "    missing = absent(cfg.device_target)\n    if False:\n",
           ("tests/run/test_devices.py::test_cpu_is_always_here_and_a_device_without_signs_is_refused_naming_the_"
            "fix",)),
    Mutant("wait_share", "unmeasured data-wait share reads 0.0, not None (record.data_wait_share)", "helpers/record.py",
           "    if total <= 0 or not np.isfinite(waits[timed]).all():\n        return None\n",
           "    if total <= 0 or not np.isfinite(waits[timed]).all():\n        return 0.0\n",
           ("tests/test_derived.py::test_data_wait_share_is_unknown_not_zero_when_a_wait_was_not_measured",)),
    Mutant("cut_line", "a cut last line of metrics.csv read as a row (record._complete_lines)", "helpers/record.py",
           '        if not line.endswith("\\n"):\n            return\n', "        if False:\n            return\n",
           ("tests/test_record_append.py::test_a_line_cut_short_by_a_kill_is_no_row_and_a_resume_goes_on_cleanly",)),
    Mutant("peak_raise", "hardware peak not raised to a MatMul rate reached (peaks.hardware_peak)",
           "helpers/run/peaks.py",
           '    if reached and reached["flops"] > derived:\n', "    if False:\n",
           ("tests/run/test_env.py::test_a_base_clock_is_a_lower_bound_and_a_peak_below_a_reached_rate_is_raised_"
            "to_it",)),
)
NAMES = [m.name for m in MUTANTS]
MIN_MUTANTS = 15


# ---------------------------------------------------------------------------------------------------- worktree

def _git(*args: str, cwd: Path = REPO, check: bool = True) -> str:
    proc = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True)
    if check and proc.returncode != 0:
        raise RuntimeError(f"git {' '.join(args)} failed: {proc.stderr.strip()[-500:]}")
    return proc.stdout


def make_worktree(where: Path) -> dict:
    """A detached worktree of HEAD at `where`, overlaid with this checkout's uncommitted tracked changes and its
    untracked (not ignored) files, and with native/build copied (the kernels' library is an ignored build output).
    Returns {commit, overlaid: [paths]}."""
    _git("worktree", "add", "--detach", str(where), "HEAD")
    overlaid = []
    changed = _git("status", "--porcelain", "-z", "--untracked-files=all").split("\0")
    for entry in changed:
        if len(entry) < 4:
            continue
        status, path = entry[:2], entry[3:]
        if "R" in status or "C" in status:  # a rename's source follows as its own entry: skip that
            continue
        src, dst = REPO / path, where / path
        if src.is_file():
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dst)
            overlaid.append(path)
        elif not src.exists() and dst.exists():
            dst.unlink()
            overlaid.append(path)
    if (REPO / "native" / "build").is_dir():
        shutil.copytree(REPO / "native" / "build", where / "native" / "build", dirs_exist_ok=True)
    return {"commit": _git("rev-parse", "HEAD").strip(), "overlaid": sorted(set(overlaid))}


def _env(worktree: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "WORKBOOK_ZYGOTE_SOCKET"}  # no shared zygote of this checkout
    env["PYTHONPATH"] = os.pathsep.join([str(worktree), *(p for p in [os.environ.get("PYTHONPATH", "")] if p)])
    return env


def imported_from(worktree: Path) -> str:
    """Where `import helpers` and `import tests` resolve under the worktree's environment (must be inside it)."""
    proc = subprocess.run([str(PYTHON), "-c", "import helpers, tests; print(helpers.__file__); print(tests.__file__)"],
                          cwd=worktree, env=_env(worktree), capture_output=True, text=True, timeout=120)
    return proc.stdout.strip() or proc.stderr.strip()[-300:]


_FAILED = re.compile(r"^(FAILED|ERROR) (\S.*?)(?: - .*)?$", re.MULTILINE)


def run_tests(worktree: Path, tests: list[str], stop_first: bool = True, timeout: float = MUTANT_TIMEOUT_S) -> dict:
    """pytest on `tests` in the worktree: {rc, failed (the first failing test, or None), why (its first `E` lines),
    collect_error, seconds, tail}."""
    cmd = [str(PYTHON), "-m", "pytest", "-q", *(["-x"] if stop_first else []), "-rfE", "-n", "0",
           "-p", "no:cacheprovider", *tests]
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(cmd, cwd=worktree, env=_env(worktree), capture_output=True, text=True, timeout=timeout)
        rc, out = proc.returncode, proc.stdout + proc.stderr
    except subprocess.TimeoutExpired as exc:
        rc, out = None, (exc.stdout or b"").decode(errors="replace") if isinstance(exc.stdout, bytes) else \
            (exc.stdout or "")
    seconds = time.perf_counter() - t0
    hit = next((m for m in _FAILED.finditer(out) if not m.group(2).startswith("collecting")), None)
    collect_error = "ERROR collecting" in out or "errors during collection" in out
    why = [line[1:].strip() for line in out.splitlines() if line.startswith("E ")][:3]
    return {"rc": rc, "failed": hit.group(2) if hit else None, "why": why, "collect_error": collect_error,
            "seconds": round(seconds, 2), "tail": out[-1200:]}


def apply(worktree: Path, m: Mutant) -> int:
    """Replace m.old by m.new in the worktree's copy of m.file when it occurs exactly once; the count found."""
    path = worktree / m.file
    text = path.read_text(encoding="utf-8")
    count = text.count(m.old)
    if count == 1:
        path.write_text(text.replace(m.old, m.new), encoding="utf-8")
    return count


def item_mutation(names: list[str] | None) -> dict:
    chosen = [m for m in MUTANTS if not names or m.name in names]
    t_start = time.perf_counter()
    where = Path(tempfile.mkdtemp(prefix="mut-", dir="/tmp")) / "wt"
    try:
        tree = make_worktree(where)
        resolved = imported_from(where)
        inside = all(line.startswith(str(where) + os.sep) for line in resolved.splitlines()) and \
            len(resolved.splitlines()) == 2
        print(f"  worktree {where} at {tree['commit'][:12]} (+{len(tree['overlaid'])} uncommitted files); helpers "
              f"from {'the worktree' if inside else resolved}", flush=True)
        every_test = list(dict.fromkeys(t for m in chosen for t in m.tests))
        baseline = run_tests(where, every_test, stop_first=False, timeout=1800) if inside else None
        if baseline:
            print(f"  unmutated: rc {baseline['rc']} in {baseline['seconds']:.0f} s", flush=True)
        mutants = []
        for m in chosen:
            row = {"name": m.name, "feature": m.feature, "file": m.file, "tests": list(m.tests), "old": m.old,
                   "new": m.new}
            if not inside or not baseline or baseline["rc"] != 0:
                mutants.append({**row, "status": "not run"})
                continue
            originals = {m.file: (where / m.file).read_text(encoding="utf-8")}
            count = apply(where, m)
            if count != 1:
                mutants.append({**row, "status": "not applied", "occurrences": count})
                print(f"  {m.name}: NOT APPLIED (old text found {count} times)", flush=True)
                continue
            try:
                res = run_tests(where, list(m.tests))
            finally:
                (where / m.file).write_text(originals[m.file], encoding="utf-8")
            killed = res["rc"] == 1 and res["failed"] is not None and not res["collect_error"]
            status = "killed" if killed else ("survived" if res["rc"] == 0 else "error")
            mutants.append({**row, "status": status, "occurrences": 1, **res})
            print(f"  {m.name}: {status} by {res['failed']} in {res['seconds']:.1f} s (rc {res['rc']})", flush=True)
    finally:
        _git("worktree", "remove", "--force", str(where), check=False)
        shutil.rmtree(where.parent, ignore_errors=True)
    return {"commit": tree["commit"], "overlaid": tree["overlaid"], "imported_from": resolved,
            "imports_inside_worktree": inside, "baseline": baseline, "mutants": mutants,
            "wall_s": round(time.perf_counter() - t_start, 1)}


# ---------------------------------------------------------------------------------------------------- judging

def rows(r: dict) -> list[tuple[str, str]]:
    out = []
    for m in r["mutants"]:
        test = (m.get("failed") or "").split("::")[-1] or "—"
        took = f" by `{test}` in {m['seconds']:.1f} s" if m.get("seconds") is not None else ""
        out.append((f"{m['name']}: {m.get('feature', '')}", f"{m['status']}{took}"))
    base = r.get("baseline") or {}
    out.append(("all mutants, with the unmutated run of their tests",
                f"{r['wall_s']:.0f} s (unmutated tests: rc {base.get('rc')}, {base.get('seconds', 0):.0f} s)"))
    return out


def _every_killed(r: dict) -> Judgement:
    mutants = r.get("mutants") or []
    if not mutants:
        return Judgement(NOT_MEASURED, "no mutant ran")
    if not r.get("imports_inside_worktree"):
        return Judgement(MISSED, f"the tests did not import the worktree's helpers ({r.get('imported_from')})")
    base = r.get("baseline") or {}
    if base.get("rc") != 0:
        return Judgement(MISSED, f"the unmutated tests did not pass (rc {base.get('rc')}, first failure "
                                 f"{base.get('failed')}): a test that fails anyway kills nothing")
    alive = [f"{m['name']} ({m['status']})" for m in mutants if m["status"] != "killed"]
    killed = len(mutants) - len(alive)
    if len(mutants) < MIN_MUTANTS and not alive:
        return Judgement(MISSED, f"{killed} of {len(mutants)} killed, but fewer than {MIN_MUTANTS} mutants ran")
    return Judgement(MISSED if alive else MET, f"{killed} of {len(mutants)} mutants killed"
                     + (f"; not killed: {'; '.join(alive)}" if alive else ""))


CHECKS = (Check(MUST, f"every mutant killed (≥ {MIN_MUTANTS} features broken on purpose, each caught by the test "
                      "meant to catch it; the unmutated tests pass)", _every_killed,
                miss={"imports_inside_worktree": True, "baseline": {"rc": 0},
                      "mutants": [{"name": "writer lock never taken", "status": "survived"}]}),)


def _check_args(a: argparse.Namespace) -> str:
    return known("mutant", a.mutants or [], NAMES)


ITEMS = [Item("mutation", "each feature broken on purpose is caught by the tests meant to catch it",
              lambda a: item_mutation(a.mutants), rows, CHECKS,
              options=((("--mutants",), {"nargs": "*", "default": None,
                                         "help": "mutation: only these mutants (by name; default: all)"}),),
              check_args=_check_args, in_all=False)]
