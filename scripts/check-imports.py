#!/usr/bin/env python3
"""Check that the import graph between the modules of each crate is acyclic.

The equivalent of `cargo modules dependencies --acyclic` (cargo-modules), in the Python 3
standard library, from the source text alone: no build, no rust-analyzer.

Modules: the file modules found by following `mod name;` from each crate root (every
`#[cfg]` counts, x86_64 and aarch64 alike; `#[path]` is honoured). Inline `mod x { ... }`
blocks are folded into the file module that holds them (they keep their own names for
resolving paths).

Edges: module A depends on module B when code in A names an item that lives in B: `use`
paths (`crate::`, `super::`, `self::`, or a name in scope such as a child module), and paths
in expressions, types, attributes and macro bodies (`crate::x::f(..)`, `super::T`,
`$crate::x::Y`, `child::f(..)`). A path is resolved segment by segment through modules,
items defined in them and their imports (`use`, `pub use`, globs), so a name re-exported at
the root resolves to the module that defines it. A path whose last segments cannot be
resolved (an associated item, an enum variant, an item a macro generates) ends at the
deepest module or item that it names. `pub use`, `pub(crate) use`, `pub(super) use` lines
are a pass-through, not edges of their own module; but where that module's own code uses
a name it re-exports (`pub use codec::codec;` and `codec(ty)` in lib.rs), that use is an
edge. A `macro_rules!` macro called by its bare name where its textual scope reaches (a
parent file's macro defined above `mod child;`) is an edge to the defining module.
`mod child;` is not an edge; references to other crates, comments (doc comments'
intra-doc links included) and string literals are ignored. Self-edges (an inline
`mod tests { use super::*; }`) are dropped. Test code counts (CI builds it); evidence from
`#[cfg(test)]` code only is marked so, and `--no-tests` leaves it out.

Crates: by default every package under crates/ and the fuzz/ package (its lib/bin targets:
src/lib.rs, src/main.rs, src/bin/*, Cargo.toml's [lib] and [[bin]] paths), each target a
graph of its own. Limits: `super::`/`self::` in a macro body resolve where the macro is
defined, not where it expands; items that macros generate are unknown (a path to one ends
at its module); `#[macro_use]` on a `mod` is not followed.

Exit status: 0 and a one-line summary when every crate's graph is acyclic; 1 when a crate
has a cycle (each strongly connected component is named, with one concrete cycle and a
file:line for every edge of it); 2 on a usage error. `--dot` prints Graphviz and exits 0.
"""

import argparse
import os
import re
import sys
from collections import deque

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# --------------------------------------------------------------------------------------------
# Lexer: identifiers (keywords included), `::`, single-character punctuation, string
# values (kept for `#[path = "..."]`, never scanned for paths), lifetimes, `$crate` and
# macro metavariables. Comments vanish.

ID, PUNCT, STR, OTHER, META = "id", "p", "str", "o", "meta"


def lex(src):
    toks = []
    i, n, line = 0, len(src), 1
    isspace = str.isspace
    while i < n:
        c = src[i]
        if c == "\n":
            line += 1
            i += 1
        elif isspace(c):
            i += 1
        elif c == "/" and src.startswith("//", i):
            j = src.find("\n", i)
            i = n if j < 0 else j
        elif c == "/" and src.startswith("/*", i):
            depth, j = 1, i + 2
            while j < n and depth:
                if src.startswith("/*", j):
                    depth, j = depth + 1, j + 2
                elif src.startswith("*/", j):
                    depth, j = depth - 1, j + 2
                else:
                    j += 1
            line += src.count("\n", i, j)
            i = j
        elif c.isalpha() or c == "_":
            j = i + 1
            while j < n and (src[j].isalnum() or src[j] == "_"):
                j += 1
            word = src[i:j]
            nxt = src[j] if j < n else ""
            if word in ("r", "br", "cr") and nxt in ('"', "#"):
                k = j
                while k < n and src[k] == "#":
                    k += 1
                if k < n and src[k] == '"':  # raw string r#"..."#
                    close = '"' + "#" * (k - j)
                    e = src.find(close, k + 1)
                    e = n if e < 0 else e
                    toks.append((STR, src[k + 1 : e], line))
                    line += src.count("\n", i, e)
                    i = e + len(close)
                    continue
                if word == "r" and k == j + 1 and k < n and (src[k].isalpha() or src[k] == "_"):
                    e = k + 1  # raw identifier r#type
                    while e < n and (src[e].isalnum() or src[e] == "_"):
                        e += 1
                    toks.append((ID, src[k:e], line))
                    i = e
                    continue
            if word in ("b", "c") and nxt == '"':
                i = j  # byte or C string: lexed as a string below
                continue
            if word == "b" and nxt == "'":
                i = j  # byte literal: lexed as a char below
                continue
            toks.append((ID, word, line))
            i = j
        elif c.isdigit():
            j = i + 1
            while j < n and (
                src[j].isalnum() or src[j] == "_" or (src[j] == "." and j + 1 < n and src[j + 1].isdigit())
            ):
                j += 1
            toks.append((OTHER, src[i:j], line))
            i = j
        elif c == '"':
            j = i + 1
            while j < n and src[j] != '"':
                j += 2 if src[j] == "\\" else 1
            toks.append((STR, src[i + 1 : j], line))
            line += src.count("\n", i, j)
            i = j + 1
        elif c == "'":
            if i + 1 < n and src[i + 1] == "\\":  # '\n', '\'', '\u{..}'
                j = src.find("'", i + 3)
                j = n if j < 0 else j
                toks.append((OTHER, src[i : j + 1], line))
                i = j + 1
            elif i + 2 < n and src[i + 2] == "'":  # 'x'
                toks.append((OTHER, src[i : i + 3], line))
                i += 3
            else:  # a lifetime or label
                j = i + 1
                while j < n and (src[j].isalnum() or src[j] == "_"):
                    j += 1
                toks.append((OTHER, src[i:j], line))
                i = max(j, i + 1)
        elif c == ":" and src.startswith("::", i):
            toks.append((PUNCT, "::", line))
            i += 2
        elif c == "$":
            j = i + 1
            while j < n and (src[j].isalnum() or src[j] == "_"):
                j += 1
            word = src[i:j]
            toks.append((ID if word == "$crate" else META, word, line))
            i = max(j, i + 1)
        else:
            toks.append((PUNCT, c, line))
            i += 1
    toks += [(PUNCT, "<eof>", line)] * 4
    return toks


# --------------------------------------------------------------------------------------------
# The module tree. A Namespace is a module (file or inline); its `filemod` is the file
# module it is folded into, the node of the graph.

PATH_ROOTS = ("crate", "$crate", "super", "self")
NOT_PATH_START = {
    "Self", "as", "async", "await", "break", "const", "continue", "dyn", "else", "enum",
    "extern", "false", "fn", "for", "if", "impl", "in", "let", "loop", "match", "mod", "move",
    "mut", "pub", "ref", "return", "static", "struct", "trait", "true", "type", "unsafe",
    "use", "where", "while",
}
ITEM_KW = ("fn", "struct", "enum", "union", "trait", "type", "const", "static")


class Namespace:
    def __init__(self, name, parent, filemod=None, file=None, mod_rs=False, test=False):
        self.name = name
        self.parent = parent
        self.path = name if parent is None else parent.path + "::" + name
        self.filemod = filemod or self
        self.file = file  # file modules only
        self.mod_rs = mod_rs
        self.test = test  # the whole file module is cfg(test)
        self.children = {}  # name -> Namespace
        self.defs = set()  # names of items defined here
        self.imports = {}  # name -> (segments, origin Namespace)
        self.globs = []  # (segments, origin Namespace)
        self.reexports = set()  # names bound by `pub use` (not globs)
        self.bare = {}  # identifier -> [(line, test)]: plain uses, to find re-exported names used here
        self.inline = [] if parent is None or self.filemod is self else parent.inline + [name]


class Ref:
    """One reference: a path `segs` written in module `ns` at `line`."""

    __slots__ = ("ns", "locals", "segs", "line", "test", "target", "glob")

    def __init__(self, ns, locals_, segs, line, test, target=None, glob=False):
        self.ns, self.locals, self.segs, self.line, self.test = ns, locals_, segs, line, test
        self.target = target  # set for a macro found by textual scope, not by path
        self.glob = glob

    def text(self):
        return "::".join(self.segs) + ("::*" if self.glob else "")


class Frame:
    __slots__ = ("ns", "is_mod", "test", "imports", "globs", "macros")

    def __init__(self, ns, is_mod, test):
        self.ns, self.is_mod, self.test = ns, is_mod, test
        self.imports, self.globs = {}, []
        self.macros = {}  # macro_rules name -> defining Namespace, in textual scope from here


def attr_info(attrs):
    """(path attribute value or None, cfg(test) or #[test]) from outer attributes."""
    path, test = None, False
    for a in attrs:
        texts = [t[1] for t in a]
        if len(a) >= 3 and texts[0] == "path" and texts[1] == "=" and a[2][0] == STR:
            path = a[2][1]
        if texts[:1] == ["test"] and len(texts) == 1:
            test = True
        if texts[:1] == ["cfg"] and "test" in texts and "not" not in texts:
            test = True
    return path, test


def parse_use_tree(toks, i, prefix):
    """Parse one use tree at toks[i]; return ([(segments, binding or None, glob)], next i)."""
    segs = list(prefix)
    if toks[i][1] == "::":  # `use ::std::...`: another crate
        segs.append("::")
        i += 1
    while True:
        kind, text, _ = toks[i]
        if text == "{" and kind == PUNCT:
            i += 1
            leaves = []
            while not (toks[i][1] == "}" or toks[i][1] in (";", "<eof>")):
                before = i
                sub, i = parse_use_tree(toks, i, segs)
                leaves += sub
                if i == before:
                    break
                if toks[i][1] == ",":
                    i += 1
            return leaves, i + 1 if toks[i][1] == "}" else i
        if text == "*" and kind == PUNCT:
            return [(segs, None, True)], i + 1
        if kind in (ID, META):
            i += 1
            if text == "self" and segs:
                full, binding = segs, segs[-1]
            else:
                full, binding = segs + [text], text
            if toks[i][1] == "::":
                segs = full
                i += 1
                continue
            if toks[i][1] == "as" and toks[i + 1][0] == ID:
                alias = toks[i + 1][1]
                binding = None if alias == "_" else alias
                i += 2
            return [(full, binding, False)], i
        return [], i  # malformed: the caller skips to `;`


class FileParse:
    """One pass over a file module: its inline modules, item names, imports, `mod x;`
    declarations and every path reference (resolved later, once all modules are known)."""

    def __init__(self, ns, src, refs, mod_decls, all_ns, macros):
        self.toks = lex(src)
        self.refs = refs
        self.mod_decls = mod_decls
        self.all_ns = all_ns
        self.frames = [Frame(ns, True, ns.test)]
        self.frames[0].macros = dict(macros)  # the parent file's macro_rules before `mod x;`
        self.run()

    def visible_macros(self):
        out = {}
        for f in self.frames:
            out.update(f.macros)
        return out

    def macro_source(self, name):
        for f in reversed(self.frames):
            if name in f.macros:
                return f.macros[name]
        return None

    def local_scopes(self):
        out = []
        for f in reversed(self.frames):
            if f.is_mod:
                break
            out.append(f)
        return tuple(out)

    def visibility_before(self, i):
        """'pub' (any re-exporting visibility) or None, for the item keyword at toks[i]."""
        toks = self.toks
        j = i - 1
        while j >= 0 and toks[j][1] in ("unsafe", "async", "extern", "const"):
            j -= 1
        if j >= 0 and toks[j][1] == "pub":
            return "pub"
        if j >= 0 and toks[j][1] == ")":
            k, depth = j, 0
            while k >= 0:
                if toks[k][1] == ")":
                    depth += 1
                elif toks[k][1] == "(":
                    depth -= 1
                    if depth == 0:
                        break
                k -= 1
            if k > 0 and toks[k - 1][1] == "pub":
                inner = [t[1] for t in toks[k + 1 : j]]
                return None if inner == ["self"] else "pub"
        return None

    def run(self):
        toks = self.toks
        pending_attrs = []
        attr_end = -1  # inside an attribute until this index: its names are not plain uses
        i, n = 0, len(toks) - 4
        while i < n:
            kind, text, line = toks[i]
            frame = self.frames[-1]
            ns = frame.ns
            pending_test = attr_info(pending_attrs)[1] if pending_attrs else False
            test = frame.test or pending_test
            if kind == PUNCT:
                if text == "#" and (toks[i + 1][1] == "[" or (toks[i + 1][1] == "!" and toks[i + 2][1] == "[")):
                    inner = toks[i + 1][1] == "!"
                    j = i + (2 if inner else 1)
                    depth, k = 0, j
                    while k < n:
                        if toks[k][1] == "[":
                            depth += 1
                        elif toks[k][1] == "]":
                            depth -= 1
                            if depth == 0:
                                break
                        k += 1
                    if not inner:
                        pending_attrs.append(toks[j + 1 : k])
                    attr_end = k
                    i = j + 1  # the attribute's own paths are scanned like any code
                    continue
                if text == "{":
                    self.frames.append(Frame(ns, False, test))
                    pending_attrs = []
                elif text == "}":
                    if len(self.frames) > 1:
                        self.frames.pop()
                    pending_attrs = []
                elif text == ";":
                    pending_attrs = []
                i += 1
                continue
            if kind != ID:
                i += 1
                continue
            at_mod_level = frame.is_mod
            nxt = toks[i + 1]
            if text == "use" and toks[i - 1][1] != "::":
                i = self.parse_use(i, frame, test)
                pending_attrs = []
                continue
            if text == "mod" and at_mod_level and nxt[0] == ID and toks[i + 2][1] in (";", "{"):
                path_attr, mod_test = attr_info(pending_attrs)
                name = nxt[1]
                if toks[i + 2][1] == ";":
                    self.mod_decls.append((ns, name, path_attr, test or mod_test, line, self.visible_macros()))
                    pending_attrs = []
                    i += 3
                else:
                    child = Namespace(name, ns, filemod=ns.filemod)
                    ns.children[name] = child
                    self.all_ns.append(child)
                    self.frames.append(Frame(child, True, test or mod_test))
                    pending_attrs = []
                    i += 3
                continue
            if text == "macro_rules" and nxt[1] == "!" and toks[i + 2][0] == ID:
                if at_mod_level:
                    ns.defs.add(toks[i + 2][1])
                frame.macros[toks[i + 2][1]] = ns
                i += 3
                continue
            if nxt[1] == "!" and toks[i - 1][1] not in ("::", ".", "$") and toks[i + 2][1] in ("(", "[", "{"):
                src_ns = self.macro_source(text)  # `name!(..)` of a macro_rules in textual scope
                if src_ns is not None:
                    self.refs.append(Ref(ns, (), [text + "!"], line, test, target=src_ns))
            if at_mod_level and text in ITEM_KW and toks[i - 1][1] not in ("::", "<", ",", "*"):
                j = i + 1
                if toks[j][1] == "mut":
                    j += 1
                if toks[j][0] == ID and toks[j][1] not in ("fn", "unsafe", "extern", "async", "_"):
                    if text != "union" or toks[j + 1][1] in ("{", "<"):
                        ns.defs.add(toks[j][1])
                        i = j + 1
                        continue
            if self.path_start(i):
                j, segs = i, [text]
                while toks[j + 1][1] == "::" and toks[j + 2][0] == ID:
                    segs.append(toks[j + 2][1])
                    j += 2
                self.refs.append(Ref(ns, self.local_scopes(), segs, line, test))
                i = j + 1
                continue
            if i > attr_end and toks[i - 1][1] not in (".", "::") and nxt[1] != ":" and text not in NOT_PATH_START:
                ns.bare.setdefault(text, []).append((line, test))
            i += 1

    def path_start(self, i):
        toks = self.toks
        kind, text, _ = toks[i]
        if toks[i + 1][1] != "::" or toks[i + 2][0] != ID:
            return False
        prev = toks[i - 1][1] if i else ""
        if prev in ("::", "."):
            return False
        if prev == "in" and i >= 3 and toks[i - 2][1] == "(" and toks[i - 3][1] == "pub":
            return False  # pub(in crate::x): a visibility, not a use
        if text in PATH_ROOTS:
            return True
        return text not in NOT_PATH_START

    def parse_use(self, i, frame, test):
        toks = self.toks
        line = toks[i][2]
        reexport = self.visibility_before(i) == "pub"
        leaves, j = parse_use_tree(toks, i + 1, [])
        while toks[j][1] not in (";", "<eof>"):
            j += 1
        ns = frame.ns
        locals_ = self.local_scopes()
        for segs, binding, glob in leaves:
            if not segs:
                continue
            if frame.is_mod:
                if glob:
                    ns.globs.append((segs, ns))
                elif binding:
                    ns.imports.setdefault(binding, (segs, ns))
                    if reexport:
                        ns.reexports.add(binding)
            else:
                if glob:
                    frame.globs.append((segs, ns))
                elif binding:
                    frame.imports.setdefault(binding, (segs, ns))
            if not reexport:
                self.refs.append(Ref(ns, locals_, segs, line, test, glob=glob))
        return j + 1


# --------------------------------------------------------------------------------------------
# Name resolution.

MOD, ITEM, EXTERN = "mod", "item", "extern"


def lookup(ns, name, final, seen):
    """What `name` names in module `ns`: (MOD, module), (ITEM, module it lives in),
    (EXTERN, None), or None when unknown."""
    key = (id(ns), name, final)
    if key in seen:  # a loop of imports or globs
        return None
    seen.add(key)
    try:
        return lookup_once(ns, name, final, seen)
    finally:
        seen.discard(key)


def lookup_once(ns, name, final, seen):
    if not final and name in ns.children:
        return (MOD, ns.children[name])
    if name in ns.defs:
        return (ITEM, ns)
    if name in ns.imports:
        segs, origin = ns.imports[name]
        # An import whose path resolves to nothing here names another crate's item.
        return resolve(origin, segs, (), seen) or (EXTERN, None)
    if name in ns.children:
        return (MOD, ns.children[name])
    for segs, origin in ns.globs:
        g = resolve(origin, segs, (), seen)
        if g is not None and g[0] == MOD:
            r = lookup(g[1], name, final, seen)
            if r is not None:
                return r
    return None


def lookup_scope(ns, locals_, name, final, seen):
    for f in locals_:
        if name in f.imports:
            segs, origin = f.imports[name]
            return resolve(origin, segs, (), seen) or (EXTERN, None)
        for segs, origin in f.globs:
            g = resolve(origin, segs, (), seen)
            if g is not None and g[0] == MOD:
                r = lookup(g[1], name, final, seen)
                if r is not None:
                    return r
    return lookup(ns, name, final, seen)


def resolve(ns, segs, locals_, seen=None):
    """Resolve a path written in module `ns`; None for another crate's path or an unknown
    first segment (a local name, a generic parameter, the prelude)."""
    if seen is None:
        seen = set()
    first = segs[0]
    if first == "::":
        return (EXTERN, None)
    if first in ("crate", "$crate"):
        cur = ns
        while cur.parent is not None:
            cur = cur.parent
    elif first == "self":
        cur = ns
    elif first == "super":
        cur = ns.parent
        if cur is None:
            return None
    else:
        if first.startswith("$"):
            return None
        r = lookup_scope(ns, locals_, first, len(segs) == 1, seen)
        if r is None or r[0] != MOD:
            return r
        cur = r[1]
    for k in range(1, len(segs)):
        seg = segs[k]
        if seg == "super":
            if cur.parent is None:
                return (MOD, cur)
            cur = cur.parent
            continue
        if seg == "self":
            continue
        if seg.startswith("$"):
            return (MOD, cur)
        r = lookup(cur, seg, k == len(segs) - 1, seen)
        if r is None:
            return (MOD, cur)  # the deepest module the path names
        if r[0] != MOD:
            return r
        cur = r[1]
    return (MOD, cur)


# --------------------------------------------------------------------------------------------
# Crates.


def rel(path):
    p = os.path.relpath(path, REPO)
    return path if p.startswith("..") else p


class Crate:
    def __init__(self, label, root_file):
        self.label = label
        self.root_file = root_file
        self.modules = []  # file modules, in discovery order
        self.warnings = []
        self.edges = {}  # (src, dst) -> [(Ref, ...)]
        self.load()
        self.link()

    def load(self):
        root = Namespace("crate", None, file=self.root_file, mod_rs=True)
        self.root = root
        self.refs = []
        self.all_ns = []
        inherited = {}  # file module -> macro_rules in textual scope where it is declared
        seen_files = {}
        queue = deque([root])
        while queue:
            fm = queue.popleft()
            self.modules.append(fm)
            self.all_ns.append(fm)
            try:
                with open(fm.file, encoding="utf-8") as f:
                    src = f.read()
            except OSError as e:
                self.warnings.append(f"{rel(fm.file)}: {e.strerror}")
                continue
            decls = []
            FileParse(fm, src, self.refs, decls, self.all_ns, inherited.get(fm, {}))
            for ns, name, path_attr, test, line, macros in decls:
                owner = ns.filemod
                d = os.path.dirname(owner.file)
                base = d if owner.mod_rs else os.path.join(d, os.path.splitext(os.path.basename(owner.file))[0])
                inline = ns.inline
                if path_attr:
                    cands = [os.path.join(d if not inline else os.path.join(base, *inline), path_attr)]
                else:
                    b = os.path.join(base, *inline)
                    cands = [os.path.join(b, name + ".rs"), os.path.join(b, name, "mod.rs")]
                file = next((c for c in cands if os.path.isfile(c)), None)
                if file is None:
                    self.warnings.append(
                        f"{rel(owner.file)}:{line}: `mod {name};` has no file ({', '.join(rel(c) for c in cands)})"
                    )
                    continue
                file = os.path.normpath(file)
                if file in seen_files:
                    continue
                seen_files[file] = True
                child = Namespace(
                    name, ns, file=file,
                    mod_rs=bool(path_attr) or os.path.basename(file) == "mod.rs",
                    test=test or ns.filemod.test,
                )
                if name in ns.children:  # the same name for another cfg: a node of its own
                    child.path += f"[{rel(file)}]"
                else:
                    ns.children[name] = child
                inherited[child] = macros
                queue.append(child)

    def link(self):
        # A name that a module re-exports and also uses itself (`pub use model::State;` and
        # `fn f(s: &State)` in the same module) is a use of it there, seen at its first use.
        for ns in self.all_ns:
            for name in sorted(ns.reexports):
                for line, test in ns.bare.get(name, ()):
                    self.refs.append(Ref(ns, (), [name], line, test))
        for r in self.refs:
            res = (MOD, r.target) if r.target is not None else resolve(r.ns, r.segs, r.locals)
            if res is None or res[0] == EXTERN or res[1] is None:
                continue
            src, dst = r.ns.filemod, res[1].filemod
            if src is dst:
                continue
            self.edges.setdefault((src, dst), []).append(r)
        self.succ = {m: [] for m in self.modules}
        for (a, b) in sorted(self.edges, key=lambda e: (e[0].path, e[1].path)):
            self.succ[a].append(b)

    def evidence(self, a, b):
        refs = self.edges[(a, b)]
        best = min(refs, key=lambda r: (r.test, r.line))
        more = len(refs) - 1
        s = f"{rel(a.file)}:{best.line} `{best.text()}`"
        if best.test:
            s += " (test code only)"
        if more:
            s += f" (+{more} more)"
        return s

    def sccs(self):
        index, low, on, stack, out = {}, {}, set(), [], []
        counter = [0]

        def strong(v):
            index[v] = low[v] = counter[0]
            counter[0] += 1
            stack.append(v)
            on.add(v)
            for w in self.succ[v]:
                if w not in index:
                    strong(w)
                    low[v] = min(low[v], low[w])
                elif w in on:
                    low[v] = min(low[v], index[w])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on.discard(w)
                    comp.append(w)
                    if w is v:
                        break
                if len(comp) > 1:
                    out.append(sorted(comp, key=lambda m: m.path))

        sys.setrecursionlimit(max(1000, 4 * len(self.modules) + 100))
        for v in self.modules:
            if v not in index:
                strong(v)
        return sorted(out, key=lambda c: c[0].path)

    def shortest_cycle(self, comp):
        members = set(comp)
        best = None
        for s in comp:
            prev = {s: None}
            q = deque([s])
            found = None
            while q and found is None:
                v = q.popleft()
                for w in self.succ[v]:
                    if w not in members:
                        continue
                    if w is s:
                        found = v
                        break
                    if w not in prev:
                        prev[w] = v
                        q.append(w)
            if found is None:
                continue
            path = [found]
            while path[-1] is not s:
                path.append(prev[path[-1]])
            path.reverse()  # s ... found, then back to s
            if best is None or len(path) < len(best):
                best = path
        return best


def read_manifest(crate_dir):
    """The package name and its [lib] and [[bin]] paths from Cargo.toml (tomllib where there
    is one, Python 3.11+; a plain reading of those keys otherwise)."""
    try:
        with open(os.path.join(crate_dir, "Cargo.toml"), encoding="utf-8") as f:
            text = f.read()
    except OSError:
        return None, None, []
    try:
        import tomllib

        doc = tomllib.loads(text)
        lib = (doc.get("lib") or {}).get("path")
        bins = [(b.get("name"), b["path"]) for b in doc.get("bin", []) if "path" in b]
        return (doc.get("package") or {}).get("name"), lib, bins
    except (ImportError, ValueError):
        pass
    name, lib, bins, section, cur = None, None, [], None, {}
    for raw in text.splitlines():
        line = raw.split("#", 1)[0].strip()
        m = re.match(r"^\[\[?\s*([\w.-]+)\s*\]\]?$", line)
        if m:
            if section == "bin" and "path" in cur:
                bins.append((cur.get("name"), cur["path"]))
            section, cur = m.group(1), {}
            continue
        m = re.match(r'^([\w-]+)\s*=\s*"([^"]*)"', line)
        if m:
            cur[m.group(1)] = m.group(2)
            if section == "package" and m.group(1) == "name":
                name = m.group(2)
            if section == "lib" and m.group(1) == "path":
                lib = m.group(2)
    if section == "bin" and "path" in cur:
        bins.append((cur.get("name"), cur["path"]))
    return name, lib, bins


def crate_roots(crate_dir):
    """(label, root file) for each lib and bin target of a package directory: src/lib.rs,
    src/main.rs, src/bin/*, and the paths its Cargo.toml gives [lib] and [[bin]]."""
    name, lib, bins = read_manifest(crate_dir)
    name = name or os.path.basename(os.path.abspath(crate_dir))
    src = os.path.join(crate_dir, "src")
    roots = []
    if lib:
        roots.append(("lib", os.path.join(crate_dir, lib)))
    elif os.path.isfile(os.path.join(src, "lib.rs")):
        roots.append(("lib", os.path.join(src, "lib.rs")))
    if os.path.isfile(os.path.join(src, "main.rs")):
        roots.append(("bin", os.path.join(src, "main.rs")))
    bindir = os.path.join(src, "bin")
    if os.path.isdir(bindir):
        for e in sorted(os.listdir(bindir)):
            p = os.path.join(bindir, e)
            if e.endswith(".rs") and os.path.isfile(p):
                roots.append((f"bin {e[:-3]}", p))
            elif os.path.isfile(os.path.join(p, "main.rs")):
                roots.append((f"bin {e}", os.path.join(p, "main.rs")))
    for bname, path in bins:
        bname = bname or os.path.splitext(os.path.basename(path))[0]
        roots.append((f"bin {bname}", os.path.join(crate_dir, path)))
    out, seen = [], set()
    for k, p in roots:
        p = os.path.normpath(p)
        if p not in seen and os.path.isfile(p):
            seen.add(p)
            out.append((k, p))
    multi = len(out) > 1
    return [(f"{name} ({k})" if multi else name, p) for k, p in out]


def dot_id(s):
    return '"' + s.replace("\\", "\\\\").replace('"', '\\"') + '"'


def main():
    ap = argparse.ArgumentParser(
        description="Check that the import graph between each crate's modules is acyclic "
        "(like `cargo modules dependencies --acyclic`)."
    )
    ap.add_argument("--crate", action="append", metavar="PATH",
                    help="a package directory or a crate root .rs file (repeatable); default: "
                    "every package under crates/, and fuzz/ (its [[bin]] targets)")
    ap.add_argument("--dot", action="store_true", help="print the module graph in Graphviz format "
                    "(edges inside a cycle in red, test-only edges dashed) and exit 0")
    ap.add_argument("--verbose", "-v", action="store_true", help="list every edge with one reference")
    ap.add_argument("--no-tests", action="store_true",
                    help="ignore references from cfg(test) code (not what CI checks)")
    args = ap.parse_args()

    targets = []
    if args.crate:
        for p in args.crate:
            if os.path.isfile(p) and p.endswith(".rs"):
                targets.append((rel(os.path.abspath(p)), os.path.abspath(p)))
            elif os.path.isdir(p):
                roots = crate_roots(p)
                if not roots:
                    print(f"check-imports: {p}: no lib or bin target (src/lib.rs, src/main.rs, "
                          "src/bin, Cargo.toml's [lib] or [[bin]] path)", file=sys.stderr)
                    return 2
                targets += roots
            else:
                print(f"check-imports: {p}: not a directory or .rs file", file=sys.stderr)
                return 2
    else:
        cdir = os.path.join(REPO, "crates")
        for e in sorted(os.listdir(cdir)):
            if os.path.isfile(os.path.join(cdir, e, "Cargo.toml")):
                targets += crate_roots(os.path.join(cdir, e))
        if os.path.isfile(os.path.join(REPO, "fuzz", "Cargo.toml")):
            targets += crate_roots(os.path.join(REPO, "fuzz"))
        if not targets:
            print("check-imports: no crates found under crates/", file=sys.stderr)
            return 2

    crates = []
    for label, root in targets:
        c = Crate(label, os.path.abspath(root))
        if args.no_tests:
            c.edges = {e: [r for r in rs if not r.test] for e, rs in c.edges.items()}
            c.edges = {e: rs for e, rs in c.edges.items() if rs}
            c.succ = {m: [] for m in c.modules}
            for (a, b) in sorted(c.edges, key=lambda e: (e[0].path, e[1].path)):
                c.succ[a].append(b)
        for w in c.warnings:
            print(f"check-imports: warning: {w}", file=sys.stderr)
        crates.append(c)

    if args.dot:
        for c in crates:
            in_scc = {}
            for k, comp in enumerate(c.sccs()):
                for m in comp:
                    in_scc[m] = k
            print(f"digraph {dot_id(c.label)} {{")
            print("  rankdir=LR;\n  node [shape=box, fontname=monospace, fontsize=10];")
            for m in c.modules:
                print(f"  {dot_id(m.path)};")
            for (a, b), refs in sorted(c.edges.items(), key=lambda e: (e[0][0].path, e[0][1].path)):
                style = []
                if a in in_scc and in_scc.get(b) == in_scc[a]:
                    style.append("color=red")
                if all(r.test for r in refs):
                    style.append("style=dashed")
                attrs = f" [{', '.join(style)}]" if style else ""
                print(f"  {dot_id(a.path)} -> {dot_id(b.path)}{attrs};")
            print("}")
        return 0

    failed = 0
    n_mods = n_edges = 0
    for c in crates:
        n_mods += len(c.modules)
        n_edges += len(c.edges)
        comps = c.sccs()
        if args.verbose:
            in_comp = {m: k for k, comp in enumerate(comps) for m in comp}
            print(f"{c.label}: {len(c.modules)} modules, {len(c.edges)} edges ({rel(c.root_file)})")
            for (a, b) in sorted(c.edges, key=lambda e: (e[0].path, e[1].path)):
                mark = " [cycle]" if a in in_comp and in_comp.get(b) == in_comp[a] else ""
                print(f"  {a.path} -> {b.path}{mark}   {c.evidence(a, b)}")
        for comp in comps:
            failed += 1
            members = set(comp)
            inner = sum(1 for (a, b) in c.edges if a in members and b in members)
            names = ", ".join(m.path for m in comp)
            print(f"{c.label}: import cycle among {len(comp)} modules: {names}")
            cyc = c.shortest_cycle(comp)
            shown = cyc if len(cyc) <= 8 else cyc[:7]
            for k, a in enumerate(shown):
                b = cyc[(k + 1) % len(cyc)]
                print(f"  {a.path} -> {b.path}   {c.evidence(a, b)}")
            if len(shown) < len(cyc):
                print(f"  ... ({len(cyc) - len(shown)} more edges close this cycle)")
            if inner > len(cyc):
                print(f"  ({inner} edges inside this component in all; --verbose lists them)")
    if failed:
        sys.stdout.flush()
        print(f"check-imports: {failed} import cycle(s) in {sum(1 for c in crates if c.sccs())} "
              f"of {len(crates)} crate(s)", file=sys.stderr)
        return 1
    print(f"check-imports: {len(crates)} crates, {n_mods} modules, {n_edges} edges: no import cycles")
    return 0


if __name__ == "__main__":
    sys.exit(main())
