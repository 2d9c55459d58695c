#!/usr/bin/env python3
"""Keeps the code in the guides honest.

    check_docs.py code <source-root> <file.md>...
        Every fenced block that follows a `<!-- code: <path> -->` line must appear in <path>
        (relative to the source root) as consecutive lines, leading whitespace aside; a
        `cpp` block without such a line is an error. The files named are compiled by the build,
        so the guides' code compiles.
    check_docs.py output <file.md> <program> [args...]
        Runs the program; its standard output must equal the fenced block that follows the
        `<!-- output: <name> -->` line of the guide, where <name> is the program's file name.
"""
import os
import re
import subprocess
import sys

MARK = re.compile(r"^<!-- (code|output): (\S+) -->\s*$")


def blocks(path):
    """(marker kind, marker argument, language, lines, line number) for each fenced block."""
    with open(path, encoding="utf-8") as f:
        lines = f.read().split("\n")
    result, mark, i = [], None, 0
    while i < len(lines):
        m = MARK.match(lines[i])
        if m:
            mark = (m.group(1), m.group(2))
        elif lines[i].startswith("```"):
            language, start, body = lines[i][3:].strip(), i + 1, []
            i += 1
            while i < len(lines) and not lines[i].startswith("```"):
                body.append(lines[i])
                i += 1
            kind, argument = mark if mark else (None, None)
            result.append((kind, argument, language, body, start))
            mark = None
        elif lines[i].strip():
            mark = None  # a marker applies to the block right after it
        i += 1
    return result


def contains(haystack, needle):
    hay = [line.strip() for line in haystack]
    need = [line.strip() for line in needle]
    return any(hay[k:k + len(need)] == need for k in range(len(hay) - len(need) + 1))


def check_code(root, documents):
    problems = 0
    for document in documents:
        for kind, argument, language, body, line in blocks(os.path.join(root, document)):
            where = f"{document}:{line}"
            if kind == "code":
                with open(os.path.join(root, argument), encoding="utf-8") as f:
                    source = f.read().split("\n")
                if not contains(source, body):
                    print(f"{where}: this block is not in {argument} (as consecutive lines)")
                    problems += 1
            elif language == "cpp":
                print(f"{where}: a cpp block needs a '<!-- code: <file> -->' line naming where it compiles")
                problems += 1
    print(f"{problems} problems in {len(documents)} documents")
    return 1 if problems else 0


def check_output(document, program):
    name = os.path.basename(program[0])
    expected = [body for kind, argument, _, body, _ in blocks(document) if kind == "output" and argument == name]
    if len(expected) != 1:
        print(f"{document}: expected one '<!-- output: {name} -->' block, found {len(expected)}")
        return 1
    run = subprocess.run(program, stdout=subprocess.PIPE, timeout=120, check=False)
    actual = run.stdout.decode().rstrip("\n").split("\n")
    if run.returncode != 0 or actual != expected[0]:
        print(f"{name} exited {run.returncode}; the guide shows:")
        print("\n".join(expected[0]))
        print("it printed:")
        print("\n".join(actual))
        return 1
    print(f"{name}: output as {document} shows it")
    return 0


def main(argv):
    if len(argv) >= 3 and argv[1] == "code":
        return check_code(argv[2], argv[3:])
    if len(argv) >= 4 and argv[1] == "output":
        return check_output(argv[2], argv[3:])
    print(__doc__)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
