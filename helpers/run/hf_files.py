"""The safetensors files of a Hugging Face checkpoint, found and read as transformers reads them.

A folder's weights are its model.safetensors, else the shards its model.safetensors.index.json names (transformers
looks in that order); other .safetensors files beside them are left out and named (`Files.ignored`), never merged.
Each file's header is read before any data: only float tensors (F32, F16, BF16) are weights; each tensor is read as
float32 and refused, by name and file, when it holds a NaN or an infinity. The format (an 8-byte little-endian header
length, a JSON header of dtype, shape and byte range per tensor, then the data) is read here directly because
safetensors' NumPy reader cannot return bfloat16, the dtype most hub checkpoints are stored in.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from helpers.run.weights_error import WeightsError

WEIGHTS_FILE, INDEX_FILE = "model.safetensors", "model.safetensors.index.json"
# how each float dtype is stored: bfloat16 as the upper 16 bits of a float32, read as uint16 and shifted
FLOATS = {"F32": np.dtype("<f4"), "F16": np.dtype("<f2"), "BF16": np.dtype("<u2")}
HEADER_LIMIT = 100_000_000  # safetensors' own bound on the JSON header, against a length field that is garbage


@dataclass(frozen=True)
class Stored:
    """One tensor as its file's header describes it: the file, dtype, shape and absolute byte range."""
    file: Path
    dtype: str
    shape: tuple[int, ...]
    begin: int
    end: int


@dataclass(frozen=True)
class Files:
    """The files transformers reads at a path (`read`), the other .safetensors files beside them (`ignored`, by
    name), and the index's tensor → shard map when the weights are sharded."""
    read: tuple[Path, ...]
    ignored: tuple[str, ...] = ()
    weight_map: dict[str, str] = field(default_factory=dict)


def files_of(path: Path, where: str) -> Files:
    """The weights files at `path`: the file itself, or a folder's model.safetensors or indexed shards."""
    if path.is_file():
        return Files((path,))
    if not path.is_dir():
        raise WeightsError(f"init_from={where!r} does not exist; pass a .safetensors file or a folder holding "
                           f"{WEIGHTS_FILE}")
    present = sorted(p.name for p in path.glob("*.safetensors"))
    weight_map: dict[str, str] = {}
    if (path / WEIGHTS_FILE).is_file():
        read = (path / WEIGHTS_FILE,)
    elif (path / INDEX_FILE).is_file():
        weight_map = _weight_map(path / INDEX_FILE, where)
        read = tuple(path / shard for shard in sorted(set(weight_map.values())))
        missing = [p.name for p in read if not p.is_file()]
        if missing:
            raise WeightsError(f"init_from={where!r} cannot be imported: its {INDEX_FILE} names shards the folder "
                               f"lacks ({', '.join(missing)}); fetch them beside it")
    else:
        held = f"it holds {', '.join(present)}" if present else "it holds no .safetensors file"
        raise WeightsError(f"init_from={where!r} has neither {WEIGHTS_FILE} nor {INDEX_FILE}, the files transformers "
                           f"reads, and {held}; pass the weights file itself (init_from=FOLDER/NAME.safetensors)")
    return Files(read, tuple(n for n in present if path / n not in read), weight_map)


def _weight_map(index: Path, where: str) -> dict[str, str]:
    try:
        weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
        ok = isinstance(weight_map, dict) and all(isinstance(v, str) and Path(v).name == v and v.endswith(
            ".safetensors") for v in weight_map.values())
    except (OSError, ValueError, TypeError, KeyError):
        ok = False
    if not ok:
        raise WeightsError(f"init_from={where!r} cannot be imported: {INDEX_FILE} is not an index transformers reads "
                           f"(JSON with a weight_map of tensor name → shard file beside it); restore the file")
    return weight_map


def header(file: Path) -> dict[str, Stored]:
    """The tensors a .safetensors file's header describes, checked against the file's size; a damaged file is one
    WeightsError line naming it."""
    try:
        size = file.stat().st_size
        with open(file, "rb") as fh:
            length = int.from_bytes(fh.read(8), "little")
            if size < 8 or length > min(size - 8, HEADER_LIMIT):
                raise ValueError(f"a header of {length} bytes in a file of {size}")
            raw = json.loads(fh.read(length).decode("utf-8"))
        if not isinstance(raw, dict):
            raise ValueError("its header is not a JSON object")
        start, data = 8 + length, size - 8 - length
        return {name: _entry(file, name, info, start, data) for name, info in raw.items() if name != "__metadata__"}
    except (OSError, ValueError, TypeError, KeyError) as exc:
        why = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise WeightsError(f"cannot read {str(file)!r} as safetensors ({why}); restore the file: it is damaged or not "
                           f"a safetensors file") from None


def _entry(file: Path, name: str, info: dict, start: int, data: int) -> Stored:
    begin, end = (int(o) for o in info["data_offsets"])
    shape = tuple(int(d) for d in info["shape"])
    dtype = str(info["dtype"])
    if not 0 <= begin <= end <= data or any(d < 0 for d in shape):
        raise ValueError(f"tensor {name!r} lies outside the file's data")
    if dtype in FLOATS and end - begin != math.prod(shape) * FLOATS[dtype].itemsize:
        raise ValueError(f"tensor {name!r} holds {end - begin} bytes for shape {list(shape)} of {dtype}")
    return Stored(file, dtype, shape, start + begin, start + end)


def stored(files: Files, where: str) -> dict[str, Stored]:
    """Every tensor of the files by name: a name in two files or a tensor the index places in a shard that lacks it
    is refused in one line."""
    tensors: dict[str, Stored] = {}
    for file in files.read:
        for name, entry in header(file).items():
            if name in tensors:
                raise WeightsError(f"init_from={where!r} cannot be imported: tensor {name!r} is in both "
                                   f"{tensors[name].file.name} and {file.name}; keep one copy")
            tensors[name] = entry
    astray = [n for n, shard in files.weight_map.items() if n not in tensors or tensors[n].file.name != shard]
    if astray:
        raise WeightsError(f"init_from={where!r} cannot be imported: its {INDEX_FILE} places {few(astray)} in shards "
                           f"that do not hold them; restore the index or the shards")
    return tensors


def floats_only(tensors: dict[str, Stored], where: str) -> dict[str, Stored]:
    """`tensors`, refused in one line naming each that is not F32, F16 or BF16 and its file."""
    other = [f"{n} ({e.dtype}, {e.file.name})" for n, e in tensors.items() if e.dtype not in FLOATS]
    if other:
        verb = "is" if len(other) == 1 else "are"
        raise WeightsError(f"init_from={where!r} cannot be imported: {few(other)} {verb} not float; weights must be "
                           f"F32, F16 or BF16 tensors (dequantize or convert the checkpoint first)")
    return tensors


def load(name: str, entry: Stored, where: str) -> np.ndarray:
    """One tensor's values as float32; a NaN or infinity in it is one WeightsError line naming it and its file."""
    stored_as = FLOATS[entry.dtype]
    raw = np.fromfile(entry.file, dtype=stored_as, count=(entry.end - entry.begin) // stored_as.itemsize,
                      offset=entry.begin)
    value = (raw.astype(np.uint32) << 16).view(np.float32) if entry.dtype == "BF16" else raw.astype(np.float32)
    finite = np.isfinite(value)
    if not finite.all():
        nan, inf = int(np.isnan(value).sum()), int(np.isinf(value).sum())
        raise WeightsError(f"init_from={where!r} cannot be imported: tensor {name!r} in {entry.file.name} holds "
                           f"{nan} NaN and {inf} infinite values (the first at flat index {int(np.argmin(finite))}); "
                           f"the file is damaged or was saved from a diverged run: use another checkpoint")
    return value.reshape(entry.shape)


def few(items: list[str], show: int = 4) -> str:
    """The first `show` items, comma-separated, and how many more there are."""
    more = f" (+{len(items) - show} more)" if len(items) > show else ""
    return ", ".join(items[:show]) + more
