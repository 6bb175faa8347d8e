"""`python -m helpers workbook`: every notebook run headless with papermill, then HTML reports and an index.

Output, under `reports/<timestamp>/` (or --out): one executed `.ipynb` and one `.html` per notebook, the
shared workbook folder the notebooks fill (`workbook/`), `index.html`, and a `latest` symlink next to it.
A failing notebook keeps its executed copy (papermill's error cell); the run goes on and the index says so.
"""
from __future__ import annotations

import ast
import difflib
import html
import os
import shutil
import sys
import tempfile
import time
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

import yaml

from helpers.bounded_yaml import YamlRefused, load_file
from helpers.paths import NOTEBOOKS_DIR, REPORTS_DIR
from helpers.tune.ledger import RoundError, WorkbookLock
from helpers.spawn import zygote
from helpers.spawn.runner import child_env

# Offline widget rendering: local copies of require.js and the widget HTML manager (`make widgets-js`).
WIDGETS_JS_DIR = Path(sys.prefix) / "share" / "workbook-js"
FAILED_PARAM = "failed_notebooks"  # a notebook declaring it gets {name: error line} of earlier failures
# Wall seconds one notebook may run before its cell is stopped and it is marked failed: without a limit a hung cell
# (an msrun whose rank never returns) stalls `make workbook` until CI kills it. The slowest default notebook takes
# minutes, several times that under load.
NOTEBOOK_TIMEOUT_S = 1200.0


class WorkbookError(ValueError):
    """Bad workbook input (parameters file, parameter type, notebooks folder); one actionable line."""


@dataclass
class NotebookResult:
    """How one notebook ran: status 'ok' or 'failed', wall seconds, the error line, output paths."""
    name: str
    status: str
    seconds: float
    error: str
    ipynb: Path
    html: Path | None


# ------------------------------------------------------------------------------------------ parameters

def notebook_parameters(path: Path) -> dict[str, Any]:
    """Defaults assigned in the notebook's cell tagged `parameters` ({} when it has none)."""
    import nbformat
    nb = nbformat.read(str(path), as_version=4)
    for cell in nb.cells:
        if cell.cell_type == "code" and "parameters" in cell.metadata.get("tags", []):
            out = {}
            for node in ast.parse(cell.source).body:
                if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
                    out[node.targets[0].id] = ast.literal_eval(node.value)
            return out
    return {}


_TYPE_WORDS = {bool: "true or false", int: "a whole number", float: "a number", str: "a string",
               list: "a list", dict: "a mapping"}
_PLURAL_WORDS = {bool: "true/false values", int: "whole numbers", float: "numbers", str: "strings",
                 list: "lists", dict: "mappings"}


def _fits(value: Any, default: Any) -> bool:
    if default is None:
        return True
    if isinstance(default, bool) or isinstance(value, bool):
        return isinstance(value, bool) and isinstance(default, bool)
    if isinstance(default, float):
        return isinstance(value, (int, float))
    if isinstance(default, list):
        return isinstance(value, list) and (not default or all(_fits(v, default[0]) for v in value))
    return isinstance(value, type(default))


def check_params(given: dict[str, Any], defaults: dict[str, dict[str, Any]]) -> None:
    """Raise a one-line WorkbookError for an unknown parameter or one whose type differs from its default.

    defaults: {notebook name: {parameter: default}}; a parameter must exist in at least one notebook.
    """
    known: dict[str, tuple[str, Any]] = {}
    for nb_name, params in defaults.items():
        for key, value in params.items():
            known.setdefault(key, (nb_name, value))
    for key, value in given.items():
        if key not in known:
            close = difflib.get_close_matches(key, list(known), n=1)
            hint = f"did you mean '{close[0]}'? " if close else ""
            raise WorkbookError(f"unknown notebook parameter '{key}'; {hint}known: {', '.join(sorted(known))}")
        nb_name, default = known[key]
        if not _fits(value, default):
            if isinstance(default, list) and default:
                what = f"a list of {_PLURAL_WORDS.get(type(default[0]), type(default[0]).__name__)}"
            else:
                what = _TYPE_WORDS.get(type(default), type(default).__name__)
            raise WorkbookError(f"notebook parameter {key}={value!r} must be {what} "
                                f"(default in {nb_name}: {key} = {default!r})")


CONFIG_PARAM = "config"  # the notebooks' config file parameter (relative: to the notebooks' folder)
SHORTCUTS = ("preset", "steps", "corpus")


def split_params(given: dict[str, Any], defaults: dict[str, dict[str, Any]]) -> tuple[dict[str, Any],
                                                                                      dict[str, dict[str, Any]]]:
    """(parameters for every notebook, {notebook: its own parameters}) of a parameters file: a key naming a
    notebook (its stem, e.g. 14_time_to_quality) holds a mapping for that notebook alone, over the shared ones.
    Each part is checked (`check_params`) against the notebooks it goes to; a key shaped like a notebook's name that
    names none, or a notebook's entry that is not a mapping, is one WorkbookError line."""
    import re
    shared, own = {}, {}
    for key, value in given.items():
        if key in defaults or re.fullmatch(r"\d\d_\w+", str(key)):
            if key not in defaults:
                close = difflib.get_close_matches(str(key), list(defaults), n=1)
                hint = f"did you mean '{close[0]}'? " if close else ""
                raise WorkbookError(f"parameters for notebook '{key}', which is not one; {hint}notebooks: "
                                    f"{', '.join(defaults)}")
            if not isinstance(value, dict):
                raise WorkbookError(f"parameters for notebook '{key}' must be a mapping of name: value, "
                                    f"e.g. '{key}: {{steps: 100}}'")
            check_params(value, {key: defaults[key]})
            own[key] = dict(value)
        else:
            shared[key] = value
    check_params(shared, defaults)
    return shared, own


def notebook_params(stem: str, declared: dict[str, Any], shared: dict[str, Any],
                    own: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """What one notebook is given: the shared parameters it declares, then its own entry's over them."""
    return {**{k: v for k, v in shared.items() if k in declared}, **own.get(stem, {})}


def preflight(given: dict[str, Any], defaults: dict[str, dict[str, Any]],
              own: dict[str, dict[str, Any]] | None = None, notebooks_dir: str | os.PathLike = NOTEBOOKS_DIR) -> None:
    """Build each notebook's base config from config + preset/steps/corpus (given over defaults, a notebook's own
    entry over both), so an impossible value (preset: huge, a missing or invalid config file) fails in one line
    before the first notebook runs. A relative config is read from `notebooks_dir`, where
    the notebooks run."""
    from helpers.config import ConfigError
    from helpers.tune.study import base_config, config_path
    tried = set()
    for stem, declared in defaults.items():
        if not all(k in declared for k in SHORTCUTS):
            continue
        params = {**{k: declared[k] for k in (*SHORTCUTS, CONFIG_PARAM) if k in declared},
                  **notebook_params(stem, declared, given, own or {})}
        cfg_file = config_path(params.pop(CONFIG_PARAM, ""), notebooks_dir)
        merged = (*(params.get(k) for k in SHORTCUTS), str(cfg_file or ""))
        if repr(merged) in tried:
            continue
        tried.add(repr(merged))
        try:
            base_config(*merged[:3], config=merged[3])
        except ConfigError as exc:
            raise WorkbookError(f"notebook parameters give an invalid config{f' ({stem})' if own else ''}: "
                                f"{exc}") from None


def load_params(path: str | os.PathLike | None) -> dict[str, Any]:
    """Parameters from a YAML mapping file (papermill -f semantics); {} when path is None."""
    if path is None:
        return {}
    p = Path(path)
    if not p.is_file():
        raise WorkbookError(f"parameters file {str(p)!r} does not exist; pass an existing YAML file to --params")
    try:
        data = load_file(p)
    except YamlRefused as exc:
        raise WorkbookError(f"parameters file {str(p)!r} {exc}") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        raise WorkbookError(f"parameters file {str(p)!r} is not valid YAML"
                            f"{f' at line {mark.line + 1}' if mark else ''}; fix its syntax") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise WorkbookError(f"parameters file {str(p)!r} must be a mapping of name: value, e.g. 'steps: 50'")
    return data


def discover(notebooks_dir: Path) -> list[Path]:
    """Notebooks named NN_*.ipynb, in order."""
    if not Path(notebooks_dir).is_dir():
        raise WorkbookError(f"notebooks folder {str(notebooks_dir)!r} does not exist; pass the workbook's notebooks "
                            f"folder")
    found = sorted(Path(notebooks_dir).glob("[0-9][0-9]_*.ipynb"))
    if not found:
        raise WorkbookError(f"no NN_*.ipynb notebooks in {str(notebooks_dir)!r}; pass the workbook's notebooks folder")
    return found


# --------------------------------------------------------------------------------------------- running

@contextmanager
def kernel_env():
    """Kernels started inside inherit the training child's environment (repo importable, quiet C++ log)."""
    saved = dict(os.environ)
    os.environ.update(child_env())
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


def start_kernel(kernel: str, cwd: Path):
    """A started kernel (a jupyter_client AsyncKernelManager) for the notebook in `cwd`, with the training child's
    environment; None if it cannot start (papermill then starts its own). `run_workbook` starts the next notebook's
    kernel while the current one runs: a kernel took ~1 s to start here, 14 times per workbook."""
    from jupyter_client.manager import AsyncKernelManager  # nbclient's own kind: it polls whether the kernel lives
    from jupyter_core.utils import run_sync
    # IPC: Unix sockets in a private folder instead of TCP ports on localhost (no port to find, nothing reachable
    # from the network, and no "Kernel is running over TCP without encryption" warning from each kernel)
    ipc_dir = tempfile.mkdtemp(prefix="wb-kernel-")
    km = AsyncKernelManager(kernel_name=kernel, transport="ipc", ip=os.path.join(ipc_dir, "kernel"))
    km.ipc_dir = ipc_dir
    try:
        with kernel_env():
            run_sync(km.start_kernel)(cwd=str(cwd))
    except Exception:  # noqa: BLE001  (no such kernel, no resources): papermill's own start says why
        shutil.rmtree(ipc_dir, ignore_errors=True)
        return None
    try:
        km.warm_client = warm_imports(km)
    except Exception:  # noqa: BLE001  a speed-up only: the notebook's own cells import what they need
        km.warm_client = None
    return km


# What every notebook's first cells import (~0.9 s in a kernel here). A compile or an msrun wait in the notebook
# before leaves a core idle: the next kernel imports them then, so its first cell finds them loaded.
WARM_IMPORTS = "import matplotlib.pyplot, pandas, helpers.tune.rounds, helpers.book.plots, helpers.book.report"


def warm_imports(km):
    """Send WARM_IMPORTS to the started kernel and return its client at once (the message goes out when the kernel
    listens; `close_warm` closes the client before the notebook runs): silent, so no execution count, history or
    output in the notebook; a failure there is the notebook's own import cell's to report."""
    client = km.client()
    client.start_channels(iopub=False, stdin=False, hb=False, control=False)  # sends only: no reader threads
    client.execute(WARM_IMPORTS, silent=True, store_history=False)
    return client


def close_warm(km) -> None:
    """Close the warm-up client of a kernel from `start_kernel` (if any)."""
    client = getattr(km, "warm_client", None)
    if client is not None:
        km.warm_client = None
        client.stop_channels()


def stop_kernel(km) -> None:
    """Shut a kernel from `start_kernel` down, with what it started (its process group)."""
    if km is not None:
        from jupyter_core.utils import run_sync
        close_warm(km)
        try:
            run_sync(km.shutdown_kernel)(now=True)
        except Exception:  # noqa: BLE001  already dead or gone: nothing left to stop
            pass
        shutil.rmtree(getattr(km, "ipc_dir", ""), ignore_errors=True)


def execute(src: Path, dst: Path, params: dict[str, Any], kernel: str = "python3",
            timeout_s: float = NOTEBOOK_TIMEOUT_S, km=None) -> tuple[str, str]:
    """Run one notebook with papermill (cwd = its folder); returns (status, error line).

    timeout_s: wall seconds for the whole notebook; each cell may run for what is left of them, then it is stopped,
    the kernel (and what it started) is shut down, and the notebook fails with one line naming the cell.
    km: a kernel already started for it (`start_kernel`); this call shuts it down when the notebook ends.
    """
    import papermill as pm
    from nbclient.exceptions import CellTimeoutError, DeadKernelError
    deadline = time.monotonic() + timeout_s
    try:
        with ExitStack() as stack:
            stack.callback(stop_kernel, km)
            pm.execute_notebook(str(src), str(dst), parameters=params, kernel_name=kernel, cwd=str(src.parent),
                                progress_bar=False, log_output=False, km=km,
                                timeout_func=lambda cell: max(1.0, deadline - time.monotonic()))
    except pm.PapermillExecutionError as exc:
        return "failed", f"{exc.ename}: {str(exc.evalue).splitlines()[0] if exc.evalue else ''}"
    except CellTimeoutError:
        return "failed", mark_stopped_cell(dst, f"NotebookTimeout: the notebook ran past its {timeout_s:g} s limit "
                                                f"(--notebook-timeout)", "it was stopped and its kernel shut down")
    except Exception as exc:  # kernel death, bad notebook JSON: still a failed notebook, not a failed run
        error = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
        return "failed", mark_stopped_cell(dst, error, "the kernel process was killed: a signal or out of "
                                                       "memory?") if isinstance(exc, DeadKernelError) else error
    return "ok", ""


def mark_stopped_cell(ipynb: Path, error: str, why: str) -> str:
    """Put the error of a notebook that stopped mid-cell (its kernel died, or it ran out of time) on the cell it
    stopped in (the last one papermill started); returns the error line, naming the cell and `why`.

    papermill keeps the executed copy but records no error in it when the kernel process is killed
    (a signal, or the OOM killer) or a cell times out, so without this the copy looks as if its cells just stopped.
    """
    import nbformat
    try:
        nb = nbformat.read(str(ipynb), as_version=4)
    except (OSError, ValueError):
        return error
    started = [i for i, c in enumerate(nb.cells)
               if c.cell_type == "code" and c.metadata.get("papermill", {}).get("start_time")]
    if not started:
        return error
    error = f"{error} while running cell {started[-1] + 1} ({why}); the executed copy shows the cell"
    cell = nb.cells[started[-1]]
    cell.outputs.append(nbformat.v4.new_output("error", ename=error.split(":")[0], evalue=error, traceback=[error]))
    cell.metadata["papermill"]["exception"] = True
    nbformat.write(nb, str(ipynb))
    return error


@contextmanager
def one_run_per_folder(out: Path) -> Iterator[None]:
    """Hold <out>/.run.lock for a whole workbook run: a second run into the same folder is refused in one
    line, instead of interleaving its rounds with the first's in the shared ledger."""
    with ExitStack() as stack:
        try:
            stack.enter_context(WorkbookLock(out / ".run.lock", "runs the workbook into it").hold())
        except RoundError as exc:
            raise WorkbookError(str(exc)) from None
        yield


def _link_or_copy(src: str, dst: str) -> None:
    """Hard link (the JS is ~16 MB with its fonts) or, across file systems, copy."""
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)


def widget_assets(out: Path) -> dict[str, str]:
    """Copy the vendored widget JS next to the reports; HTMLExporter options pointing at it ({} if absent)."""
    manager, require = WIDGETS_JS_DIR / "html-manager" / "embed-amd.js", WIDGETS_JS_DIR / "require.js"
    if not (manager.is_file() and require.is_file()):
        return {}
    shutil.copytree(WIDGETS_JS_DIR, out / "_static", dirs_exist_ok=True, copy_function=_link_or_copy,
                    ignore=shutil.ignore_patterns("embed.js", "*.LICENSE.txt", ".installed"))
    return {"widget_renderer_url": "_static/html-manager/embed-amd.js", "require_js_url": "_static/require.js"}


def to_html(ipynb: Path, options: dict[str, str]) -> Path | None:
    """HTML next to the executed notebook (None if the notebook cannot be read, e.g. never written)."""
    import nbformat
    from nbconvert import HTMLExporter
    try:
        nb = nbformat.read(str(ipynb), as_version=4)
    except (OSError, ValueError):
        return None
    body, _ = HTMLExporter(**options).from_notebook_node(nb)
    target = ipynb.with_suffix(".html")
    target.write_text(body, encoding="utf-8")
    return target


def point_latest(out: Path) -> Path:
    """Make `<out.parent>/latest` a relative symlink to out (replaced atomically)."""
    link = out.parent / "latest"
    tmp = out.parent / f".latest.{os.getpid()}"
    tmp.unlink(missing_ok=True)
    tmp.symlink_to(out.name, target_is_directory=True)
    os.replace(tmp, link)
    return link


def run_workbook(params_file: str | os.PathLike | None = None, out: str | os.PathLike | None = None,
                 notebooks_dir: str | os.PathLike = NOTEBOOKS_DIR, kernel: str = "python3",
                 log: Callable[[str], None] = print, timeout_s: float = NOTEBOOK_TIMEOUT_S,
                 config: str | os.PathLike | None = None) -> list[NotebookResult]:
    """Run every notebook in order into `out` (default reports/<timestamp>); write HTML and index.html.

    Parameters are checked against the notebooks' defaults before anything runs; each notebook gets the shared
    ones it declares, then its own entry's (a key naming the notebook, `split_params`), plus
    workbook_dir = <out>/workbook. config: a config YAML (relative: to the working directory) given to every
    notebook as its `config` parameter, over the parameters file's. timeout_s: wall seconds per notebook
    (`execute`).
    """
    if isinstance(timeout_s, bool) or not isinstance(timeout_s, (int, float)) or not timeout_s > 0:
        raise WorkbookError(f"notebook timeout {timeout_s!r} must be a positive number of seconds, e.g. 1200")
    notebooks = discover(Path(notebooks_dir))
    defaults = {nb.stem: notebook_parameters(nb) for nb in notebooks}
    given, own = split_params(load_params(params_file), defaults)
    if config:
        if not Path(config).is_file():
            raise WorkbookError(f"config file {str(config)!r} does not exist; pass an existing YAML file to --config")
        if not any(CONFIG_PARAM in d for d in defaults.values()):
            raise WorkbookError(f"no notebook in {str(notebooks_dir)!r} declares a '{CONFIG_PARAM}' parameter")
        given[CONFIG_PARAM] = str(Path(config).resolve())
    preflight(given, defaults, own, notebooks_dir)
    out = Path(out) if out else REPORTS_DIR / time.strftime("%Y%m%d-%H%M%S")
    out = out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    with one_run_per_folder(out), ExitStack() as stack:
        shared = {**given, "workbook_dir": str(out / "workbook")}
        html_options = widget_assets(out)
        if not html_options:
            log(f"note: no widget JS in {WIDGETS_JS_DIR} (`make workbook` vendors it with npm); "
                "widgets in the HTML reports need internet to render")
        results: list[NotebookResult] = []
        stack.enter_context(zygote.shared(child_env()))  # one zygote (MindSpore imported once) for all kernels
        ready = start_kernel(kernel, notebooks[0].parent)
        stack.callback(lambda: stop_kernel(ready))  # a kernel started for a notebook that never ran
        for i, nb in enumerate(notebooks):
            declared = defaults[nb.stem]
            params = notebook_params(nb.stem, declared, shared, own)
            if FAILED_PARAM in declared:
                params[FAILED_PARAM] = {r.name: r.error for r in results if r.status == "failed"}
            dst = out / nb.name
            t0 = time.perf_counter()
            km, ready = ready, None
            if i + 1 < len(notebooks):  # the next one's kernel boots while this notebook runs
                ready = start_kernel(kernel, notebooks[i + 1].parent)
            close_warm(km)  # its imports were sent while the notebook before ran
            with kernel_env():
                status, error = execute(nb, dst, params, kernel, timeout_s, km=km)
            seconds = time.perf_counter() - t0
            page = to_html(dst, html_options)
            results.append(NotebookResult(nb.stem, status, seconds, error, dst, page))
            log(f"{nb.stem:<22} {status:<6} {seconds:6.1f} s{f'  {error}' if error else ''}")
        final_cumulative(out / "workbook", log)
        index = out / "index.html"
        index.write_text(index_page(results, out / "workbook", config_line(given.get(CONFIG_PARAM), Path(notebooks_dir))),
                         encoding="utf-8")
        point_latest(out)
        log(f"report: {index}")
        return results


def final_cumulative(workbook_dir: Path, log: Callable[[str], None]) -> None:
    """The baseline against the best, side by side (`Workbook.cumulative`), for the index's before/after: measured
    here only when a notebook after 08 moved the best (12's kernels round); a workbook that is missing or cannot
    be measured gets a log line, and the index is written all the same."""
    from helpers.tune.folders import MARKER
    from helpers.tune.rounds import Workbook
    if not (workbook_dir / MARKER).is_file():
        return
    try:
        result = Workbook.open(workbook_dir).cumulative(progress=False)
    except Exception as exc:  # a failed measurement must not cost the report its index
        log(f"cumulative: not measured: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}")
        return
    log(result.text() if result is not None else "cumulative: no round kept, the best is the baseline")


def config_line(config: str | None, notebooks_dir: Path) -> str:
    """What the workbook started from, for the index: the config file's path (relative: to `notebooks_dir`, as the
    notebooks read it) and the first 12 hex digits of its SHA-256, or the notebooks' own defaults."""
    if not config:
        return "config: none given (the notebooks' defaults; 01's start_from)"
    import hashlib
    path = Path(config) if Path(config).is_absolute() else notebooks_dir / config
    digest = hashlib.sha256(path.read_bytes()).hexdigest()[:12]
    return f"config: {path.resolve()} (sha256 {digest})"


# ---------------------------------------------------------------------------------------------- index

def index_page(results: list[NotebookResult], workbook_dir: Path, config: str = "") -> str:
    """index.html: the config line (`config_line`), one row per notebook (status, time, links) and the final
    before/after and rounds tables; every link and path relative to the report folder (workbook_dir's parent), so
    the folder can be zipped and shared."""
    from helpers.book.report import comparison_html, relative_text
    base = Path(workbook_dir).parent
    rows = []
    for r in results:
        links = " · ".join(f'<a href="{html.escape(p.name)}">{p.suffix[1:]}</a>' for p in (r.html, r.ipynb)
                           if p is not None and p.exists())
        rows.append(f'<tr class="{r.status}"><td>{html.escape(r.name)}</td><td>{r.status}</td>'
                    f"<td>{r.seconds:.1f} s</td><td>{links}</td><td>{html.escape(relative_text(r.error, base))}</td></tr>")
    failed = {r.name: r.error for r in results if r.status == "failed"}
    total = sum(r.seconds for r in results)
    return f"""<!DOCTYPE html>
<html><head><meta charset="utf-8"><title>Tuning workbook report</title>
<style>body{{font-family:sans-serif;margin:2em;max-width:75em}} table{{border-collapse:collapse;margin:1em 0}}
td,th{{border:1px solid #ccc;padding:.3em .6em;text-align:left;vertical-align:top}} tr.failed td{{background:#fde2e2}}
tr.ok td:nth-child(2){{color:#17702d}} table.rounds{{table-layout:fixed;width:100%}}
table.rounds td{{overflow-wrap:anywhere}} details summary{{cursor:pointer;color:#1f5fa8}}
tr.keep td:nth-child(4) b{{color:#17702d}} tr.reject td:nth-child(4) b{{color:#a01818}}</style></head><body>
<h1>Tuning workbook report</h1>
<p>{html.escape(config)}</p>
<p>{len(results) - len(failed)} of {len(results)} notebooks ran; {len(failed)} failed; {total:.0f} s in all.</p>
<table><tr><th>notebook</th><th>status</th><th>time</th><th>report</th><th>error</th></tr>
{''.join(rows)}</table>
<h2>Before / after</h2>
{comparison_html(workbook_dir, failed, base)}
</body></html>
"""
