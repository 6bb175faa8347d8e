"""YAML read with bounds: recipes, configs and parameter files are refused, in one line, before they can make a
command spin, run out of memory or recurse past Python's limit, or silently drop a duplicated key.

Limits (why each):
- size, MAX_BYTES (256 KiB): it bounds the time to read. The pure-Python loader (the one whose composing can be
  checked) composes ~30-60k nodes/s on two busy cores and a file spells at most one node per 2 bytes, so 256 KiB is
  a few seconds at worst (16 MB would be minutes); the largest real recipe is ~5 KB. WORKBOOK_YAML_MAX_KIB raises it.
- nesting, MAX_DEPTH (100 levels of collections, aliases expanded): a recipe nests ~5 deep; the composer spends 3-4
  Python frames a level, so 100 stays far below the recursion limit, for it and for any code that walks the result.
- aliases, MAX_ALIAS_NODES (100,000): an alias adds the whole tree it names to what a reader walks (the loader
  shares one object; code that walks the result, such as the importer's `leaves`, does not), so a few "billion
  laughs" lines spell 10^8 nodes. The nodes a file spells out are bounded by its size; aliases may add at most this
  many more, counted while composing from each anchor's size with its own aliases expanded.
- a recursive alias (one inside the collection it names) and a key given twice in one mapping are refused.
"""
from __future__ import annotations

import codecs
import math
import os
from typing import Any

import yaml
from yaml.events import AliasEvent, ScalarEvent
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

KIB = 1024  # bytes
MAX_BYTES = 256 * KIB  # default file size limit; WORKBOOK_YAML_MAX_KIB overrides it
MAX_DEPTH = 100  # levels of nesting, the top-level collection being 1
MAX_ALIAS_NODES = 100_000  # nodes that aliases may add to a document, all aliases together
SIZE_ENV = "WORKBOOK_YAML_MAX_KIB"
MERGE_TAG = "tag:yaml.org,2002:merge"  # `<<: *base`: its keys are overridden by the mapping's own on purpose


class YamlRefused(ValueError):
    """A file or text the bounded loader will not read. `problem` is a predicate that follows the file's name
    ("is not UTF-8 text ..."), `fix` what to do; str() is both as one line."""

    def __init__(self, problem: str, fix: str):
        super().__init__(f"{problem}; {fix}")
        self.problem = problem
        self.fix = fix


def _line(node_or_event: Any) -> int:
    return node_or_event.start_mark.line + 1


class BoundedLoader(yaml.SafeLoader):
    """SafeLoader that refuses, while composing, nesting past MAX_DEPTH, aliases adding more than MAX_ALIAS_NODES
    nodes, a recursive alias and a duplicated mapping key. One instance reads one stream."""

    def __init__(self, stream):
        super().__init__(stream)
        self._depth = 0  # collections open around the node being composed
        self._added = 0  # nodes aliases have added so far
        # per composed node (by id; the nodes stay alive in the tree): its size and height with aliases expanded.
        # A node not yet here is still being composed: an alias to it is inside it.
        self._size: dict[int, int] = {}
        self._height: dict[int, int] = {}

    def compose_node(self, parent, index):
        if self.check_event(AliasEvent):
            event = self.peek_event()
            node = super().compose_node(parent, index)  # an undefined alias raises ComposerError here
            self._count_alias(node, event)
            return node
        level = 0 if self.check_event(ScalarEvent) else 1  # a level is a collection: `a: 1` nests 1 deep
        self._depth += level
        if self._depth > MAX_DEPTH:
            raise YamlRefused(f"nests deeper than {MAX_DEPTH} levels at line {_line(self.peek_event())}",
                              "a recipe or config nests a few levels: check it is the right file")
        node = super().compose_node(parent, index)
        self._depth -= level
        children = _children(node)
        self._size[id(node)] = 1 + sum(self._size[id(c)] for c in children)
        self._height[id(node)] = level + max((self._height[id(c)] for c in children), default=0)
        return node

    def _count_alias(self, node: Node, event: AliasEvent) -> None:
        where = f"alias *{event.anchor} at line {_line(event)}"
        if id(node) not in self._size:
            raise YamlRefused(f"has a recursive {where}: it is inside the collection it names (line {_line(node)})",
                              "write the values out instead of through the alias")
        if self._depth + self._height[id(node)] > MAX_DEPTH:
            raise YamlRefused(f"nests deeper than {MAX_DEPTH} levels through {where}",
                              "a recipe or config nests a few levels: check it is the right file")
        self._added += self._size[id(node)]
        if self._added > MAX_ALIAS_NODES:
            raise YamlRefused(f"has aliases that expand to over {MAX_ALIAS_NODES:,} nodes by {where} (an alias "
                              f"bomb)", "write the values out, or alias fewer or smaller collections")

    def compose_mapping_node(self, anchor):
        node = super().compose_mapping_node(anchor)
        seen: dict[Any, tuple[str, int]] = {}  # key → its text and line
        for key_node, _ in node.value:
            if not isinstance(key_node, ScalarNode) or key_node.tag == MERGE_TAG:
                continue  # a collection key is refused by construction (unhashable)
            key = self.construct_object(key_node)  # as the mapping will hold it: `1` and `1.0` are one key
            if key in seen:
                text, line = seen[key]
                raise YamlRefused(f"has key {text!r} twice in the same mapping, at lines {line} and "
                                  f"{_line(key_node)}", "keep one")
            seen[key] = key_node.value, _line(key_node)
        return node


def _children(node: Node) -> list[Node]:
    if isinstance(node, SequenceNode):
        return node.value
    if isinstance(node, MappingNode):
        return [n for pair in node.value for n in pair]
    return []


def load_text(text: str) -> Any:
    """YAML text (a command-line value, a decoded file) as Python data, within MAX_DEPTH and MAX_ALIAS_NODES.

    Raises YamlRefused past a bound, yaml.YAMLError when it is not YAML."""
    loader = BoundedLoader(text)
    try:
        return loader.get_single_data()
    finally:
        loader.dispose()


def _max_bytes() -> int:
    """The file size limit in bytes: MAX_BYTES, or WORKBOOK_YAML_MAX_KIB KiB when set."""
    raw = os.environ.get(SIZE_ENV, "").strip()
    if not raw:
        return MAX_BYTES
    if not raw.isdecimal() or int(raw) == 0:
        raise YamlRefused(f"cannot be read: {SIZE_ENV}={raw!r} is not a whole number of KiB",
                          f"set it to one, e.g. {SIZE_ENV}=1024, or unset it")
    return int(raw) * KIB


def load_file(path: str | os.PathLike) -> Any:
    """A YAML file as Python data (None when empty), read only if it is at most MAX_BYTES bytes (WORKBOOK_YAML_MAX_KIB
    KiB when set), UTF-8 text, and within load_text's bounds.

    Raises YamlRefused for any of those, OSError when it cannot be opened, yaml.YAMLError when it is not YAML."""
    limit = _max_bytes()
    with open(path, "rb") as fh:
        size = os.fstat(fh.fileno()).st_size
        data = b"" if size > limit else fh.read(limit + 1)  # not its size alone: a pipe or device says 0
    size = max(size, len(data))
    if size > limit:
        raise YamlRefused(f"is {math.ceil(size / KIB):,} KiB, over the {limit // KIB:,} KiB limit on a YAML file "
                          f"read here (a recipe or config is a few KiB)",
                          f"check it is the right file; if it is, rerun with {SIZE_ENV}={math.ceil(size / KIB)}")
    if data.startswith((codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE)):
        raise YamlRefused("is UTF-16 text", "save it as UTF-8")
    nul = data.find(b"\0")
    if nul >= 0:
        raise YamlRefused(f"is binary (a NUL byte at offset {nul}), not YAML text", "pass the YAML file itself")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise YamlRefused(f"is not UTF-8 text (byte 0x{data[exc.start]:02x} at offset {exc.start})",
                          "save it as UTF-8") from None
    return load_text(text)
