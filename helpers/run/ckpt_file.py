"""What a MindSpore .ckpt file holds, read without MindSpore (its import costs seconds, and a refusal should not):
each entry's name and shape, and the values of the few small entries a caller asks for.

The file is a run of protobuf records (`Checkpoint.value`, mindspore/train/checkpoint.proto): a field-1 record per
entry, each a `Value` of a `tag` (the name) and a `TensorProto` of `dims`, `tensor_type` and `tensor_content`. A
tensor larger than MindSpore's slice size is written as several records of one tag, each with the whole dims.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

SMALL_BYTES = 1 << 16  # an entry whose value is read must be this small: a step or a short text, not a weight
_TAG, _TENSOR = 1, 2  # Value's fields
_DIMS, _TYPE, _CONTENT = 1, 2, 3  # TensorProto's fields
_VARINT, _LENGTH = 0, 2  # the protobuf wire types these messages use


@dataclass(frozen=True)
class Entry:
    """One named entry of a checkpoint: its shape, MindSpore dtype name ('Float32', 'Int64', 'str', …) and, when
    it was asked for (and small), its bytes."""
    shape: tuple[int, ...]
    dtype: str
    content: bytes | None = None

    def integer(self) -> int | None:
        """The value of a one-element integer entry (a step), None when it is not one."""
        size = {"Int64": 8, "Int32": 4}.get(self.dtype)
        if self.content is None or size is None or len(self.content) != size:
            return None
        return int.from_bytes(self.content, "little", signed=True)

    def text(self) -> str | None:
        """The text of a string entry (MindSpore writes a str of `append_dict` as UTF-32 code units), None when it
        is not one."""
        if self.content is None or self.dtype != "str":
            return None
        return self.content.decode("utf-32-le", "replace")


def _varint(fh) -> int | None:
    """A protobuf varint read from `fh`, None at a clean end of file (ValueError when cut inside one)."""
    value, shift = 0, 0
    while True:
        byte = fh.read(1)
        if not byte:
            if shift:
                raise ValueError("cut inside a length")
            return None
        value |= (byte[0] & 0x7F) << shift
        if byte[0] < 0x80:
            return value
        shift += 7
        if shift > 63:
            raise ValueError("a length longer than 64 bits")


def _field(fh, end: int) -> tuple[int, int, int] | None:
    """(field number, wire type, its varint value or length) of the next field before `end`, None at `end`."""
    if fh.tell() >= end:
        return None
    key = _varint(fh)
    value = _varint(fh)
    if key is None or value is None:
        raise ValueError("cut inside a field")
    if key & 7 not in (_VARINT, _LENGTH):
        raise ValueError(f"a field of wire type {key & 7} at byte {fh.tell()}, which no checkpoint holds")
    if key & 7 == _LENGTH and fh.tell() + value > end:
        raise ValueError(f"a field at byte {fh.tell()} runs past its record")
    return key >> 3, key & 7, value


def _dims(fh, wire: int, value: int) -> list[int]:
    """TensorProto.dims: one varint (proto2's unpacked form, what MindSpore writes) or a packed run of them."""
    if wire == _VARINT:
        return [value]
    end, out = fh.tell() + value, []
    while fh.tell() < end:
        out.append(_varint(fh))
    return out


def _tensor(fh, end: int, keep: bool) -> Entry:
    """The TensorProto that ends at `end`; its content is read only with `keep` and when small."""
    dims, dtype, content = [], "", None
    while (got := _field(fh, end)) is not None:
        number, wire, value = got
        if number == _DIMS:
            dims += _dims(fh, wire, value)
        elif wire != _LENGTH:
            continue
        elif number == _TYPE:
            dtype = fh.read(value).decode("utf-8", "replace")
        elif number == _CONTENT and keep and value <= SMALL_BYTES:
            content = fh.read(value)
        else:
            fh.seek(value, 1)
    return Entry(tuple(dims), dtype, content)


def read_entries(path: str | Path, values: frozenset[str] = frozenset()) -> dict[str, Entry]:
    """Every entry of the checkpoint at `path` by name, with the content of those named in `values`; ValueError
    when the file is cut short or is not a MindSpore checkpoint."""
    path = Path(path)
    size, entries = path.stat().st_size, {}
    with open(path, "rb") as fh:
        while (got := _field(fh, size)) is not None:
            number, wire, length = got
            if number != 1 or wire != _LENGTH:
                raise ValueError(f"the record before byte {fh.tell()} is not a checkpoint entry")
            end, tag, entry = fh.tell() + length, None, None
            while (inner := _field(fh, end)) is not None:
                number, wire, value = inner
                if number == _TAG and wire == _LENGTH:
                    tag = fh.read(value).decode("utf-8", "replace")
                elif number == _TENSOR and wire == _LENGTH:
                    entry = _tensor(fh, fh.tell() + value, tag in values)
                elif wire == _LENGTH:
                    fh.seek(value, 1)
            if tag is None:
                raise ValueError(f"the entry ending at byte {end} has no name")
            if entry is not None and (tag not in entries or entries[tag].content is None):
                entries[tag] = entry
            fh.seek(end)
    return entries
