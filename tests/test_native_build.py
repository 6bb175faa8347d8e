"""The native kernels' make rule on other machines: it builds for an Ascend host's aarch64 CPU with the flags of
that target (here with Debian's cross compiler), and a compiler that fails leaves `make` green with a note."""
from __future__ import annotations

import shutil
import subprocess

import pytest

from tests.conftest import REPO

AARCH64_CXX = "aarch64-linux-gnu-g++"
EM_AARCH64, EM_X86_64 = 183, 62  # the ELF header's e_machine


def _make(tmp_path, *overrides: str) -> subprocess.CompletedProcess:
    return subprocess.run(["make", "--no-print-directory", "kernels", f"NATIVE_LIB={tmp_path}/lib.so", *overrides],
                          cwd=REPO, capture_output=True, text=True, timeout=300)


def _machine(path) -> int:
    return int.from_bytes(path.read_bytes()[18:20], "little")


@pytest.mark.ci_required  # `make test` installs the cross compiler (the `cross` target): a skip in CI is a failure
def test_the_rule_cross_compiles_for_aarch64(tmp_path):
    if shutil.which(AARCH64_CXX) is None:
        pytest.skip(f"{AARCH64_CXX} is not installed (Debian package g++-aarch64-linux-gnu; `make cross`)")
    proc = _make(tmp_path, f"CXX={AARCH64_CXX}")
    assert proc.returncode == 0, proc.stderr
    assert "built" in proc.stdout and "aarch64-linux-gnu" in proc.stdout and "x86-64" not in proc.stdout
    assert _machine(tmp_path / "lib.so") == EM_AARCH64
    assert (tmp_path / "sources.sha256").is_file()


def test_the_native_build_is_for_this_compilers_target(tmp_path):
    if shutil.which("g++") is None:
        pytest.skip("g++ is not installed")
    proc = _make(tmp_path, "CXX=g++")
    assert proc.returncode == 0, proc.stderr
    target = subprocess.run(["g++", "-dumpmachine"], capture_output=True, text=True).stdout
    assert _machine(tmp_path / "lib.so") == (EM_X86_64 if target.startswith("x86_64") else EM_AARCH64)


@pytest.mark.parametrize("cxx, said", [("false", "could not compile"), ("no-such-compiler-here", "not found")])
def test_a_failing_or_missing_compiler_leaves_make_green_with_a_note(tmp_path, cxx, said):
    proc = _make(tmp_path, f"CXX={cxx}")
    assert proc.returncode == 0, proc.stderr
    assert f"note: {cxx} {said}" in proc.stdout and "model.kernels=auto uses MindSpore's ops" in proc.stdout
    assert not (tmp_path / "lib.so").exists() and not list(tmp_path.glob("*.tmp"))


def test_notebook_12_sets_a_native_round_aside_where_the_library_is_missing(monkeypatch):
    from helpers.run import kernels
    from helpers.tune.fusion import WITHOUT_NATIVE, runnable_rounds
    rounds = {"kernels_native": {"model.kernels": "native"}, "dense_act": {"model.dense_act": True}}
    if kernels.library_problem() == "":
        assert runnable_rounds(rounds) == (rounds, "")
    missing = "the native kernel library native/build/libwbkernels.so is not built; run `make kernels` (needs g++)"
    monkeypatch.setattr(kernels, "library_problem", lambda: missing)  # as on a machine without a compiler
    here, why = runnable_rounds(rounds)
    assert here == {"dense_act": {"model.dense_act": True}, **WITHOUT_NATIVE}
    assert why.startswith("round kernels_native set aside: the native kernel library") and "instead" in why
