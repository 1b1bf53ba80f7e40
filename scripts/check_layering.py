#!/usr/bin/env python3
"""check_layering: every target includes only what it links, and core's layers point one way.

Two checks over the project's own `#include "..."` lines (issue 18, item 3):

1. Link check. The target graph comes from CMake itself: the script configures a scratch build
   of the tree with a file-api query and --graphviz (cmake -S SRC -B TMP, a few seconds, nothing
   compiled), takes each target's sources from the codemodel and its links from the graph's
   edges, closed transitively (the codemodel's `dependencies` alone lose edges inside link
   cycles such as estuary_backend <-> estuary_backend_cuda). A header
   belongs to the targets that compile its own .cc/.cu (same path, same stem); a header without
   one (header-only) belongs to every target with sources in its folder. An include passes when
   the including target, or one it links, owns the header. A header's own includes pass when
   one of its owners may make them. With nvcc present (or --cuda), the CUDA configuration
   (ESTUARY_CUDA=ON) is checked too, so core/kernels/cuda and core/model/cuda are covered.
2. One-way rules (docs/design.md, issue 18), by path, over every source and header:
   core knows no roles, wire formats or network; kvtransfer knows pools, not models; the router
   links no engine (its includes, and its targets' links); process plumbing knows no role.

Prints one line per violation (file, include, target, why) and exits 1; 0 when clean.
--self-test runs the checker on tiny fixture trees (one clean, one with a bad include, one
breaking a one-way rule) and fails unless it passes and fails them as it should.
Run by scripts/test.sh early and by ctest (label lint: tests/lint/CMakeLists.txt).
"""

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

INCLUDE_RE = re.compile(r'^\s*#\s*include\s*"([^"]+)"', re.MULTILINE)
EDGE_RE = re.compile(r'//\s*(\S+)\s*->\s*(\S+)\s*$')  # graphviz: "// from -> to"
SOURCE_EXTS = (".cc", ".cu", ".cpp", ".c")
HEADER_EXTS = (".h", ".cuh", ".hpp", ".inc")
SKIP_DIRS = {".git", "third_party", "node_modules"}

# (path prefix of the including file, forbidden include prefixes, why).
ONE_WAY_RULES = [
    ("core/", ("rpc/", "proto/", "router/", "decode/", "prefill/", "worker/", "kvtransfer/"),
     "core knows no roles, wire formats or network"),
    ("kvtransfer/", ("core/model/",), "kvtransfer knows pools, not models"),
    ("router/", ("decode/", "prefill/", "core/model/"), "the router links no engine"),
    ("process/", ("decode/", "prefill/", "router/", "worker/", "kvtransfer/"),
     "process plumbing knows no role"),
]
# Targets under these folders must not link targets whose sources all lie under the given
# folders, nor the named ones (the forward pass; core/model's config target is not an engine).
ONE_WAY_LINKS = [
    ("router/", ("decode/", "prefill/"), {"estuary_model", "estuary_device_step",
                                          "estuary_model_cuda"}, "the router links no engine"),
]
# Rules that tests are exempt from: the router's integration tests (router_service_test) start
# real decode and prefill services in-process, so they include and link the engines.
TESTS_EXEMPT = {"the router links no engine"}


def is_test(path_or_target):
    base = os.path.splitext(os.path.basename(path_or_target))[0]
    return base.endswith("_test") or base.endswith("_test_util")


def configure(src, options):
    """Configures a scratch build of `src`; returns (scratch dir, codemodel configuration)."""
    scratch = tempfile.mkdtemp(prefix="estuary-layering-")
    query = os.path.join(scratch, ".cmake", "api", "v1", "query")
    os.makedirs(query)
    open(os.path.join(query, "codemodel-v2"), "w").close()
    graph = os.path.join(scratch, "graph.dot")
    cmd = ["cmake", "-S", src, "-B", scratch, "-DCMAKE_BUILD_TYPE=Release",
           f"--graphviz={graph}"] + options
    if shutil.which("ninja"):
        cmd += ["-G", "Ninja"]
    run = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if run.returncode != 0:
        shutil.rmtree(scratch, ignore_errors=True)
        raise RuntimeError("cmake configure failed:\n" + run.stdout[-4000:])
    reply = os.path.join(scratch, ".cmake", "api", "v1", "reply")
    index = [f for f in os.listdir(reply) if f.startswith("codemodel-v2-")]
    with open(os.path.join(reply, index[0])) as f:
        codemodel = json.load(f)
    config = codemodel["configurations"][0]
    targets = {}
    for t in config["targets"]:
        with open(os.path.join(reply, t["jsonFile"])) as f:
            targets[t["id"]] = json.load(f)
    edges = {}
    with open(graph) as f:
        for line in f:
            m = EDGE_RE.search(line)
            if m:
                edges.setdefault(m.group(1), set()).add(m.group(2))
    return scratch, targets, edges


def rel(path, src, build):
    """`path` relative to the source tree (or, for generated files, to the build tree)."""
    full = path if os.path.isabs(path) else os.path.join(src, path)
    full = os.path.normpath(full)
    for root in (build, src):
        root = os.path.normpath(root)
        if full.startswith(root + os.sep):
            return os.path.relpath(full, root)
    return None


def closure(name, edges):
    seen, todo = set(), [name]
    while todo:
        for nxt in edges.get(todo.pop(), ()):
            if nxt not in seen:
                seen.add(nxt)
                todo.append(nxt)
    seen.discard(name)
    return seen


def build_graph(src, build, targets, edges):
    """Returns (sources: target -> [rel path], deps: target -> set, owners: header -> set)."""
    names = {tid: t["name"] for tid, t in targets.items()}
    sources, deps = {}, {}
    for tid, t in targets.items():
        if t["type"] == "UTILITY":
            continue
        name = names[tid]
        files = []
        for s in t.get("sources", []):
            r = rel(s["path"], src, build)
            if r is not None and r.endswith(SOURCE_EXTS + HEADER_EXTS):
                files.append(r)
        sources[name] = files
        deps[name] = {names[d["id"]] for d in t.get("dependencies", []) if d["id"] in names}
        deps[name] |= closure(name, edges)
    # Owners: by stem (foo.h <- foo.cc / foo.cu / foo.pb.cc), else by folder.
    by_stem, by_dir = {}, {}
    for name, files in sources.items():
        for f in files:
            by_stem.setdefault(os.path.splitext(f)[0], set()).add(name)
            if f.endswith(HEADER_EXTS):
                by_stem.setdefault(f, set()).add(name)
            by_dir.setdefault(os.path.dirname(f), set()).add(name)
    def owners(header):
        listed = by_stem.get(header)
        if listed:
            return listed
        stem = by_stem.get(os.path.splitext(header)[0])
        if stem:
            return stem
        return by_dir.get(os.path.dirname(header), set())
    return sources, deps, owners


def includes_of(path):
    try:
        with open(path, errors="replace") as f:
            return INCLUDE_RE.findall(f.read())
    except OSError:
        return []


def resolve(include, including, src, build):
    """The repo-relative path of a quoted include, or None (a system or third-party header)."""
    for base in (src, os.path.join(src, os.path.dirname(including)), build):
        full = os.path.normpath(os.path.join(base, include))
        if os.path.isfile(full):
            return rel(full, src, build)
    return None


def check_links(src, build, targets, edges):
    sources, deps, owners = build_graph(src, build, targets, edges)
    problems = set()

    def allowed(target, header):
        own = owners(header)
        return not own or target in own or bool(own & deps.get(target, set()))

    def check_file(path, as_targets):
        full = os.path.join(src, path)
        if not os.path.isfile(full):
            full = os.path.join(build, path)
        for inc in includes_of(full):
            header = resolve(inc, path, src, build)
            if header is None or header == path:
                continue
            if not any(allowed(t, header) for t in as_targets):
                own = ", ".join(sorted(owners(header)))
                problems.add(f"{path}: includes \"{inc}\" (of {own}), which target "
                             f"{'/'.join(sorted(as_targets))} does not link")

    for name, files in sorted(sources.items()):
        for f in files:
            if f.endswith(SOURCE_EXTS):
                check_file(f, {name})
    # Headers: their includes must be allowed for one of their owners.
    for header in sorted(all_files(src, HEADER_EXTS)):
        own = owners(header)
        if own:
            check_file(header, own)
    for prefix, folders, named, why in ONE_WAY_LINKS:
        for name, files in sources.items():
            if not files or not all(f.startswith(prefix) for f in files):
                continue
            if why in TESTS_EXEMPT and is_test(name):
                continue
            for dep in sorted(deps[name]):
                dep_files = sources.get(dep, [])
                under = [p for p in folders
                         if dep_files and all(f.startswith(p) for f in dep_files)]
                if under or dep in named:
                    problems.add(f"target {name} ({prefix}) links {dep}: {why}")
    return problems


def all_files(src, exts):
    for root, dirs, files in os.walk(src):
        dirs[:] = [d for d in dirs if d not in SKIP_DIRS and not d.startswith("build")
                   and not os.path.isfile(os.path.join(root, d, "CMakeCache.txt"))]
        for f in files:
            if f.endswith(exts):
                yield os.path.relpath(os.path.join(root, f), src)


def check_one_way(src):
    problems = set()
    for path in all_files(src, SOURCE_EXTS + HEADER_EXTS):
        for prefix, forbidden, why in ONE_WAY_RULES:
            if not path.startswith(prefix) or (why in TESTS_EXEMPT and is_test(path)):
                continue
            for inc in includes_of(os.path.join(src, path)):
                if inc.startswith(forbidden):
                    problems.add(f"{path}: includes \"{inc}\": {why}")
    return problems


def check(src, cuda):
    """All problems of the tree at `src` (one configuration, or two with `cuda`)."""
    configurations = [[]]
    if cuda:
        nvcc = shutil.which("nvcc") or "/usr/local/cuda/bin/nvcc"
        configurations.append(["-DESTUARY_CUDA=ON", f"-DCMAKE_CUDA_COMPILER={nvcc}",
                               "-DESTUARY_BENCHMARKS=OFF"])
    problems = check_one_way(src)
    for options in configurations:
        scratch, targets, edges = configure(src, options)
        try:
            problems |= check_links(src, scratch, targets, edges)
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
    return sorted(problems)


FIXTURE_CMAKE = """cmake_minimum_required(VERSION 3.20)
project(fixture LANGUAGES CXX)
add_library(a STATIC a/a.cc)
add_library(b STATIC b/b.cc)
add_library(core_x STATIC core/x.cc)
target_include_directories(a PUBLIC ${PROJECT_SOURCE_DIR})
target_link_libraries(b PUBLIC LINK_B)
"""


def write_fixture(root, link_b, x_includes):
    files = {
        "CMakeLists.txt": FIXTURE_CMAKE.replace("LINK_B", "a" if link_b else ""),
        "a/a.h": "#pragma once\nint A();\n",
        "a/a.cc": '#include "a/a.h"\nint A() { return 1; }\n',
        "b/b.cc": '#include "a/a.h"\nint B() { return A(); }\n',
        "core/x.cc": x_includes + "int X() { return 0; }\n",
        "decode/engine.h": "#pragma once\n",
    }
    for path, text in files.items():
        full = os.path.join(root, path)
        os.makedirs(os.path.dirname(full), exist_ok=True)
        with open(full, "w") as f:
            f.write(text)


def self_test():
    cases = [
        # (name, b links a, core/x.cc's includes, substrings every problem list must have)
        ("clean", True, "", []),
        ("unlinked include", False, "", ['b/b.cc: includes "a/a.h" (of a), which target b']),
        ("one-way rule", True, '#include "decode/engine.h"\n',
         ['core/x.cc: includes "decode/engine.h": core knows no roles']),
    ]
    failed = 0
    for name, link_b, x_includes, expected in cases:
        root = tempfile.mkdtemp(prefix="estuary-layering-fixture-")
        try:
            write_fixture(root, link_b, x_includes)
            problems = check(root, cuda=False)
        finally:
            shutil.rmtree(root, ignore_errors=True)
        ok = (not problems) if not expected else all(
            any(e in p for p in problems) for e in expected) and len(problems) == len(expected)
        print(f"self-test {name}: {'ok' if ok else 'FAILED'}" +
              ("" if ok else f" (got {problems}, want {expected})"))
        failed += not ok
    return 1 if failed else 0


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--source-dir", default=os.path.dirname(os.path.dirname(
        os.path.abspath(__file__))))
    cuda = parser.add_mutually_exclusive_group()
    cuda.add_argument("--cuda", dest="cuda", action="store_true", default=None,
                      help="also check the ESTUARY_CUDA=ON configuration (default: when nvcc "
                           "is found)")
    cuda.add_argument("--no-cuda", dest="cuda", action="store_false")
    parser.add_argument("--self-test", action="store_true")
    args = parser.parse_args()
    if args.self_test:
        return self_test()
    use_cuda = args.cuda
    if use_cuda is None:
        use_cuda = bool(shutil.which("nvcc")) or os.access("/usr/local/cuda/bin/nvcc", os.X_OK)
    problems = check(os.path.abspath(args.source_dir), use_cuda)
    for p in problems:
        print(p)
    if problems:
        print(f"check_layering: {len(problems)} problem(s)", file=sys.stderr)
        return 1
    print("check_layering: ok" + (" (CPU and CUDA configurations)" if use_cuda else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
