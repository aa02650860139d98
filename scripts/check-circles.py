#!/usr/bin/env python3
"""No import circle in the workspace: within each library crate, the modules
(one per file) and the paths between them form a graph with no cycle.

A module's `use crate::a::b::Item` (or `super::…`, `self::…`), or a path
written in place (`crate::a::CONST`), is an edge to the deepest module file
the path names. A parent's `mod child;` is not an
edge (a folder holds its modules), and neither are imports under
`#[cfg(test)]` or `#[cfg(doc)]` (tests and doc links may look anywhere).
Prints each circle found and exits 1; `--self-test` checks that a circle
is found in a made-up crate.
"""

import pathlib
import re
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parent.parent
CRATES = [
    "core", "tower-layer", "reqwest-recovery", "redis-store", "wasm", "cli",
    "gateway", "python", "tests",
]


def module_of(src, path):
    """The module path (a tuple) of the file `path` under `src`."""
    rel = path.relative_to(src).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] in ("mod", "lib", "main"):
        parts = parts[:-1]
    return tuple(parts)


def use_paths(text):
    """The paths of the crate's own `use` items in `text`, outside test and
    doc-only code: one tuple of segments per imported item."""
    # The code before the test module; cfg(doc)/cfg(test) items dropped.
    text = text.split("#[cfg(test)]\nmod tests", 1)[0]
    text = re.sub(r"#\[cfg\((?:doc|test)\)\]\s*(?:pub(?:\([^)]*\))?\s+)?use [^;]*;", "", text)
    text = re.sub(r"//[^\n]*", "", text)
    out = []
    for m in re.finditer(r"\b(?:pub(?:\([^)]*\))?\s+)?use\s+([^;]+);", text):
        out.extend(expand(re.sub(r"\s+", "", m.group(1))))
    # Paths written in place (`crate::policy::NEVER_RETRYABLE`) count too.
    body = re.sub(r"\buse\s+[^;]+;", "", text)
    for m in re.finditer(r"\b((?:crate|super)(?:::\w+)+)", body):
        out.append(tuple(m.group(1).split("::")))
    return out


def expand(tree):
    """`a::{b,c::{d}}` -> [[a,b],[a,c,d]] (aliases and globs cut)."""
    tree = re.sub(r"\bas\w+", "", tree.replace(" as ", "as"))
    if "{" not in tree:
        return [tuple(p for p in tree.split("::") if p not in ("", "*"))]
    head, rest = tree.split("{", 1)
    inner = rest[: rest.rfind("}")]
    items, depth, cur = [], 0, ""
    for ch in inner:
        if ch == "," and depth == 0:
            items.append(cur)
            cur = ""
            continue
        depth += ch == "{"
        depth -= ch == "}"
        cur += ch
    if cur:
        items.append(cur)
    prefix = tuple(p for p in head.split("::") if p)
    out = []
    for item in items:
        for sub in expand(item):
            out.append(prefix + sub)
    return out


def resolve(module, path, modules):
    """The deepest module `path`, used from `module`, names; None outside
    the crate."""
    if not path:
        return None
    if path[0] == "crate":
        base, rest = (), path[1:]
    elif path[0] == "super":
        base, rest = module, path
        while rest and rest[0] == "super":
            base, rest = base[:-1], rest[1:]
    elif path[0] == "self":
        base, rest = module, path[1:]
    else:
        # A child module of this one, or another crate.
        base, rest = module, path
        if base + rest[:1] not in modules:
            return None
    best = base if base in modules else None
    for i in range(1, len(rest) + 1):
        if base + rest[:i] in modules:
            best = base + rest[:i]
    return best


def circles(src):
    files = sorted(p for p in src.rglob("*.rs") if "bin" not in p.relative_to(src).parts)
    modules = {module_of(src, p): p for p in files}
    graph = {m: set() for m in modules}
    for m, p in modules.items():
        for path in use_paths(p.read_text()):
            target = resolve(m, path, modules)
            # A parent reaching into its own folder is how a folder is
            # laid out; a child naming its parent is an edge.
            if target is not None and target != m and target[: len(m)] != m:
                graph[m].add(target)
    found, state, stack = [], {}, []

    def visit(m):
        state[m] = 1
        stack.append(m)
        for n in sorted(graph[m]):
            if state.get(n) == 1:
                found.append(stack[stack.index(n):] + [n])
            elif n not in state:
                visit(n)
        stack.pop()
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m)
    return found


def name(src, m):
    return str(src.relative_to(ROOT) / "/".join(m)) if m else str(src.relative_to(ROOT))


def self_test():
    with tempfile.TemporaryDirectory() as d:
        src = pathlib.Path(d) / "src"
        (src / "a").mkdir(parents=True)
        (src / "lib.rs").write_text("mod a;\nmod b;\n")
        (src / "a" / "mod.rs").write_text("mod x;\nuse crate::b::B;\n")
        (src / "a" / "x.rs").write_text("use super::super::b::{C, D as E};\n")
        (src / "b.rs").write_text("#[cfg(test)]\nuse crate::a::x::Y;\nuse crate::a::Z;\n")
        found = circles(src)
        assert any(("a",) in c and ("b",) in c for c in found), found
        (src / "b.rs").write_text("#[cfg(test)]\nuse crate::a::x::Y;\n")
        assert not circles(src), circles(src)


def main():
    self_test()
    status = 0
    for crate in CRATES:
        src = ROOT / crate / "src"
        if not src.is_dir():
            continue
        for c in circles(src):
            print("import circle: " + " -> ".join(name(src, m) for m in c), file=sys.stderr)
            status = 1
    if status == 0:
        print("no import circle in the workspace")
    return status


if __name__ == "__main__":
    sys.exit(main())
