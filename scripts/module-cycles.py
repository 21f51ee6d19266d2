#!/usr/bin/env python3
"""Fails when the source files of a crate import each other in a loop.

weir keeps every dependency between the modules of a crate pointing one
way (docs/architecture.md). This check reads each crate's `src/` and builds
a graph with one node per source file and an edge from a file to every file
whose items it names in code: `use` declarations and paths written in full
(`crate::a::b::Item`, `super::Item`, `self::child::Item`, or a child module
named directly, `child::Item`). Declaring a child (`mod child;`) is not an
edge, and neither are comments (intra-doc links are not dependencies). An
inline `mod tests` or a `tests.rs` file may use its parent freely: tests
sit on top of what they test.

A cycle is reported with every file on it, and the script exits with 1.

Usage: scripts/module-cycles.py [crate-dir ...]  (default: crates/*)
"""

import os
import re
import sys
from pathlib import Path

IDENT = r"[A-Za-z_][A-Za-z0-9_]*"
PATH_RE = re.compile(rf"\b(crate|super|self)((?:::{IDENT})*)(::\{{)?")
MOD_DECL_RE = re.compile(rf"^\s*(?:pub(?:\([^)]*\))?\s+)?mod\s+({IDENT})\s*;", re.M)
INLINE_MOD_RE = re.compile(rf"^\s*(?:pub(?:\([^)]*\))?\s+)?mod\s+({IDENT})\s*\{{", re.M)


def strip_comments_and_strings(text: str) -> str:
    """Removes comments, string and char literals, keeping line structure."""
    out = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            i = n if j < 0 else j
        elif text.startswith("/*", i):
            depth, i = 1, i + 2
            while i < n and depth:
                if text.startswith("/*", i):
                    depth, i = depth + 1, i + 2
                elif text.startswith("*/", i):
                    depth, i = depth - 1, i + 2
                else:
                    if text[i] == "\n":
                        out.append("\n")
                    i += 1
        elif c == "r" and re.match(r'r#*"', text[i:i + 10] or ""):
            m = re.match(r'r(#*)"', text[i:])
            end = '"' + m.group(1)
            j = text.find(end, i + len(m.group(0)))
            j = n if j < 0 else j + len(end)
            out.append("\n" * text.count("\n", i, j))
            i = j
        elif c == '"':
            j = i + 1
            while j < n and text[j] != '"':
                j += 2 if text[j] == "\\" else 1
            out.append("\n" * text.count("\n", i, j))
            i = j + 1
        elif c == "'" and re.match(r"'(\\.|[^\\'])'", text[i:i + 4] or ""):
            m = re.match(r"'(\\.|[^\\'])'", text[i:])
            i += len(m.group(0))
        elif c == "'" and re.match(r"'\\u\{[0-9a-fA-F]+\}'", text[i:i + 12] or ""):
            i += len(re.match(r"'\\u\{[0-9a-fA-F]+\}'", text[i:]).group(0))
        else:
            out.append(c)
            i += 1
    return "".join(out)


def drop_test_modules(code: str) -> str:
    """Removes inline `mod tests { ... }` blocks (tests may use anything)."""
    while True:
        m = re.search(r"#\[cfg\(test\)\]\s*(?:pub(?:\([^)]*\))?\s+)?mod\s+\w+\s*\{", code)
        if not m:
            return code
        depth, j = 1, m.end()
        while j < len(code) and depth:
            if code[j] == "{":
                depth += 1
            elif code[j] == "}":
                depth -= 1
            j += 1
        code = code[: m.start()] + "\n" * code.count("\n", m.start(), j) + code[j:]


class Crate:
    def __init__(self, src: Path):
        self.src = src
        # module path (tuple) -> file
        self.files = {}
        for root in ("lib.rs", "main.rs"):
            if (src / root).exists():
                self._walk((), src / root, src)
        bins = src / "bin"
        if bins.is_dir():
            for f in sorted(bins.glob("*.rs")):
                self._walk(("<bin>", f.stem), f, bins / f.stem)

    def _walk(self, path, file, dir_for_children):
        if path in self.files:
            return
        self.files[path] = file
        code = strip_comments_and_strings(file.read_text())
        for name in MOD_DECL_RE.findall(code):
            for cand in (dir_for_children / f"{name}.rs", dir_for_children / name / "mod.rs"):
                if cand.exists():
                    self._walk(path + (name,), cand, dir_for_children / name)
                    break

    def resolve(self, segments):
        """The file of the longest prefix of `segments` that is a module."""
        for k in range(len(segments), -1, -1):
            if tuple(segments[:k]) in self.files:
                return tuple(segments[:k])
        return None

    def is_test_file(self, mod_path):
        return bool(mod_path) and mod_path[-1] in ("tests", "test")

    def edges(self):
        graph = {p: set() for p in self.files}
        for mod_path, file in self.files.items():
            if self.is_test_file(mod_path):
                continue
            raw = strip_comments_and_strings(file.read_text())
            code = drop_test_modules(raw)
            children = {c for c in MOD_DECL_RE.findall(code)}
            inline = set(INLINE_MOD_RE.findall(code))
            crate_root = mod_path[:2] if mod_path[:1] == ("<bin>",) else ()
            targets = []
            for m in PATH_RE.finditer(code):
                head, rest, brace = m.group(1), m.group(2), m.group(3)
                if not rest and not brace:
                    # `pub(crate)`, `pub(super)`, `&self`: not a path.
                    continue
                segs = [s for s in rest.split("::") if s]
                if head == "crate":
                    base = list(crate_root)
                elif head == "super":
                    base = list(mod_path[:-1])
                    while segs and segs[0] == "super":
                        base, segs = base[:-1], segs[1:]
                else:
                    base = list(mod_path)
                if brace:
                    # `crate::a::{b::X, c}`: each item of the group.
                    depth, j = 1, m.end()
                    while j < len(code) and depth:
                        depth += {"{": 1, "}": -1}.get(code[j], 0)
                        j += 1
                    group = code[m.end(): j - 1]
                    for item in split_group(group):
                        targets.append(base + segs + [s for s in item.split("::") if s])
                else:
                    targets.append(base + segs)
            for child in children - inline:
                if re.search(rf"(?<![:\w]){child}::", code):
                    targets.append(list(mod_path) + [child])
            for t in targets:
                r = self.resolve(t)
                if r is not None and r != mod_path and self.files[r] != file:
                    # A module's own descendants are reached through it;
                    # using a child is an edge to the child's file only.
                    graph[mod_path].add(r)
        return graph


def split_group(group):
    """Top-level comma-separated items of a `use` group, nested groups
    flattened (`a::{b, c::D}` -> `a::b`, `a::c::D`)."""
    items, depth, cur = [], 0, ""
    for ch in group:
        if ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
        if ch == "," and depth == 0:
            items.append(cur)
            cur = ""
        else:
            cur += ch
    items.append(cur)
    out = []
    for it in items:
        it = re.sub(r"\s+as\s+\w+", "", it).strip()
        if not it or it == "self":
            continue
        if "{" in it:
            prefix, inner = it.split("{", 1)
            for sub in split_group(inner.rsplit("}", 1)[0]):
                out.append(prefix + sub)
        else:
            out.append(it)
    return [re.sub(r"\s", "", o) for o in out]


def cycles(graph):
    """Strongly connected components with more than one node (Tarjan)."""
    index, low, stack, on, out = {}, {}, [], set(), []
    counter = [0]
    sys.setrecursionlimit(10000)

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(comp)

    for v in graph:
        if v not in index:
            visit(v)
    return out


def self_test():
    """Plants a cycle and a one-way pair in a scratch crate; the check must
    find the first and not the second."""
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        src = Path(d) / "src"
        (src / "egress").mkdir(parents=True)
        (src / "lib.rs").write_text("pub mod egress;\npub mod intake;\npub mod clock;\n")
        (src / "clock.rs").write_text("pub fn now() -> u64 { 0 }\n")
        (src / "intake.rs").write_text(
            "use crate::clock::now;\n/// [`crate::egress::Sink`] is only a doc link.\n"
            "pub(crate) fn f() -> u64 { now() }\n"
        )
        (src / "egress" / "mod.rs").write_text(
            "mod sink;\npub use sink::Sink;\npub struct Batch;\n"
        )
        (src / "egress" / "sink.rs").write_text(
            "use super::Batch;\npub trait Sink { fn f(&self, b: &Batch); }\n"
            "#[cfg(test)]\nmod tests { use crate::intake::f; }\n"
        )
        found = cycles(Crate(src).edges())
        names = sorted(sorted(p for p in comp) for comp in found)
        assert names == [[("egress",), ("egress", "sink")]], names
    print("module-cycles self-test: a planted cycle is found, one-way imports pass")


def main():
    if sys.argv[1:] == ["--self-test"]:
        self_test()
        return
    repo = Path(__file__).resolve().parent.parent
    dirs = [Path(a) for a in sys.argv[1:]] or sorted(
        p for p in (repo / "crates").iterdir() if (p / "Cargo.toml").exists()
    )
    if not sys.argv[1:] and (repo / "benches" / "Cargo.toml").exists():
        dirs.append(repo / "benches")
    failed = False
    for d in dirs:
        src = d / "src" if (d / "src").is_dir() else d
        crate = Crate(src)
        found = cycles(crate.edges())
        for comp in found:
            failed = True
            names = sorted(os.path.relpath(crate.files[p], repo) for p in comp)
            print(f"module cycle in {d.name}: " + " <-> ".join(names), file=sys.stderr)
        if not found:
            print(f"{d.name}: {len(crate.files)} files, no module cycle")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
