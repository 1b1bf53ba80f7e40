#!/usr/bin/env python3
"""Helpers for the GPU checks (scripts/gpu_bundle.sh, tests/gpu/run.sh).

  manifest.py tests --ctest-json FILE --source-dir DIR [--bundle]
      Turns `ctest --show-only=json-v1 -L gpu` into tests.tsv: one line per test binary for
      gtest_discover_tests cases (the binary runs once, whole), one line per plain test.
      Columns (tab-separated): name, path, kind (gtest|plain), cases, timeout (s, 0: default),
      workdir, env (KEY=VALUE;... or -), then one column per argument. Paths under the source
      directory become @root/...; with --bundle, executables become bin/<basename>.

  manifest.py executables --ctest-json FILE
      The test executables, one per line.

  manifest.py models --build-dir DIR --source-dir DIR EXECUTABLE...
      Names of the ../shared/models folders that the executables' own test sources read: one per
      line, or every shipped model when a source builds the path at run time.
"""

import argparse
import json
import os
import re
import subprocess
import sys

GTEST_ONLY_ARGS = ("--gtest_filter=", "--gtest_also_run_disabled_tests")


def warn(message):
    print(f"manifest.py: {message}", file=sys.stderr)


def relative_to_root(value, source_dir):
    """Rewrites the source directory prefix of `value` as @root."""
    if value == source_dir:
        return "@root"
    if value.startswith(source_dir + "/"):
        return "@root/" + value[len(source_dir) + 1:]
    return value.replace(source_dir + "/", "@root/")


def test_properties(test):
    return {p["name"]: p["value"] for p in test.get("properties", [])}


def cmd_tests(args):
    with open(args.ctest_json) as f:
        tests = json.load(f).get("tests", [])
    source_dir = os.path.realpath(args.source_dir)
    rows = {}  # key -> row, in first-seen order
    basenames = {}
    for test in tests:
        command = test.get("command")
        if not command:
            warn(f"{test.get('name')}: no command (not built?), left out")
            continue
        exe = command[0]
        props = test_properties(test)
        workdir = props.get("WORKING_DIRECTORY")
        if workdir is None:
            warn(f"{test['name']}: no WORKING_DIRECTORY, using the repository root")
            workdir = "@root"
        else:
            workdir = relative_to_root(os.path.realpath(workdir), source_dir)
            if not workdir.startswith("@root"):
                warn(f"{test['name']}: working directory {workdir} is outside the source tree")
        env = [relative_to_root(e, source_dir) for e in props.get("ENVIRONMENT", [])]
        timeout = int(float(props.get("TIMEOUT", 0) or 0))
        is_gtest = any(a.startswith("--gtest_filter=") for a in command[1:])
        extra = [relative_to_root(a, source_dir) for a in command[1:]
                 if not (is_gtest and a.startswith(GTEST_ONLY_ARGS))]

        name = os.path.basename(exe)
        other = basenames.setdefault(name, exe)
        if other != exe:
            sys.exit(f"manifest.py: two test binaries named {name}: {other} and {exe}")
        path = f"bin/{name}" if args.bundle else relative_to_root(exe, source_dir)

        key = (exe, "gtest") if is_gtest else (exe, test["name"])
        row = rows.get(key)
        if row is None:
            rows[key] = {"name": name if is_gtest else f"{name}:{test['name']}", "path": path,
                         "kind": "gtest" if is_gtest else "plain", "cases": 1,
                         "timeout": timeout, "workdir": workdir, "env": env, "args": extra}
            continue
        row["cases"] += 1
        row["timeout"] = max(row["timeout"], timeout)
        if (row["workdir"], row["env"], row["args"]) != (workdir, env, extra):
            warn(f"{test['name']}: working directory, environment or arguments differ from "
                 f"the other cases of {name}; the binary runs once with the first case's")

    print("# name\tpath\tkind\tcases\ttimeout\tworkdir\tenv\targs...")
    for row in rows.values():
        fields = [row["name"], row["path"], row["kind"], str(row["cases"]),
                  str(row["timeout"]), row["workdir"], ";".join(row["env"]) or "-"]
        fields += row["args"]
        if any("\t" in f or "\n" in f for f in fields):
            sys.exit(f"manifest.py: {row['name']}: a tab or newline in its command line")
        print("\t".join(fields))


def cmd_executables(args):
    with open(args.ctest_json) as f:
        tests = json.load(f).get("tests", [])
    seen = []
    for test in tests:
        exe = (test.get("command") or [None])[0]
        if exe and exe not in seen:
            seen.append(exe)
    for exe in seen:
        print(exe)


def ninja_lines(build_dir, *tool_args):
    result = subprocess.run(["ninja", "-C", build_dir, "-t", *tool_args],
                            capture_output=True, text=True, check=True)
    return [line.strip() for line in result.stdout.splitlines()]


def own_sources(build_dir, exe):
    """The executable's own sources (not its libraries') and the in-tree headers they include."""
    target = os.path.relpath(os.path.realpath(exe), os.path.realpath(build_dir))
    objects = [l for l in ninja_lines(build_dir, "query", target) if l.endswith(".o")]
    files = set()
    for obj in objects:
        lines = ninja_lines(build_dir, "query", obj)
        if "input:" in " ".join(lines):
            # "input: RULE" then the explicit inputs until "outputs:".
            start = next(i for i, l in enumerate(lines) if l.startswith("input:"))
            for l in lines[start + 1:]:
                if l.startswith(("outputs:", "|", "||")):
                    break
                files.add(l)
        for l in ninja_lines(build_dir, "deps", obj)[1:]:
            if l and not l.startswith(obj):
                files.add(l)
    return files


MODEL_LITERAL = re.compile(r'(?:shared/)?models/([A-Za-z0-9_.\-]*)')
GOLDEN_HELPERS = re.compile(r'golden_cases\.h|inprocess_workers\.h|GoldenModels\(')
BUILD_PATHS = re.compile(r'ESTUARY_(SOURCE|BINARY)_DIR')


def cmd_models(args):
    source_dir = os.path.realpath(args.source_dir)
    models_dir = os.path.join(os.path.dirname(source_dir), "shared", "models")
    shipped = sorted(os.listdir(models_dir)) if os.path.isdir(models_dir) else []
    needed = set()
    for exe in args.executables:
        for path in own_sources(args.build_dir, exe):
            path = os.path.realpath(os.path.join(args.build_dir, path))
            if not path.startswith(source_dir + "/") or path.startswith(
                    os.path.realpath(args.build_dir) + "/"):
                continue
            with open(path, errors="replace") as f:
                code = "\n".join(l.split("//")[0] for l in f)
            for name in MODEL_LITERAL.findall(code):
                needed.update([name] if name else shipped)
            if GOLDEN_HELPERS.search(code):
                needed.update(shipped)
            if BUILD_PATHS.search(code):
                warn(f"{os.path.relpath(path, source_dir)} uses the build machine's absolute "
                     f"paths (ESTUARY_SOURCE_DIR / ESTUARY_BINARY_DIR): they do not exist on the "
                     f"GPU machine")
    for name in sorted(needed):
        if name in shipped:
            print(name)
        else:
            warn(f"no ../shared/models/{name} here: not bundled")


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    tests = sub.add_parser("tests")
    tests.add_argument("--ctest-json", required=True)
    tests.add_argument("--source-dir", required=True)
    tests.add_argument("--bundle", action="store_true")
    executables = sub.add_parser("executables")
    executables.add_argument("--ctest-json", required=True)
    models = sub.add_parser("models")
    models.add_argument("--build-dir", required=True)
    models.add_argument("--source-dir", required=True)
    models.add_argument("executables", nargs="*")
    args = parser.parse_args()
    {"tests": cmd_tests, "executables": cmd_executables, "models": cmd_models}[args.command](args)


if __name__ == "__main__":
    main()
