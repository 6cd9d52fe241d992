#!/usr/bin/env python3
"""Fails when the two store backends share more than LIMIT lines of copied logic.

Each function of at least 12 lines in src/store/redb/ is paired with the function in
src/store/postgres/ whose body is most like it, after normalising both: `.await` removed,
string literals blanked, the usual transaction and connection names (`t`, `tx`, `txn`,
`client`, ...) made one name, whitespace and comments dropped, and lines of punctuation only
left out. The signature is not compared: both backends implement the same seam traits, so
their signatures agree by construction.

A shared line counts when it is part of a run of at least RUN consecutive lines the pair has
in common: a lone `Ok(out)` or `let mut out = Vec::new();` is not a copied rule, two lines in
a row are where copies begin. With `--all` the script also prints the figure for runs of one.

A decision both backends need belongs in `src/store/rules/` (or as a vocabulary helper in
`src/store/seam/`), written once; when this check fails, the pairs it prints say where.
"""
import difflib
import pathlib
import re
import sys

LIMIT = 60
RUN = 2
MIN_LINES = 12

STORE = pathlib.Path("src/store")
FN = re.compile(r"^\s*(pub(\([^)]*\))?\s+)?(async\s+)?fn\s+(\w+)")
STRING = re.compile(r'"(\\.|[^"\\])*"')
HANDLE = re.compile(r"\b(tx|txn|transaction|write|read|client|conn|db|w|r|t)\b")
PUNCTUATION = re.compile(r"^[\s{}()\[\];,.?]*$")
TEST_FILE = re.compile(r"(^|_)tests\.rs$")


def code_of(line):
    return STRING.sub('""', line.split("//")[0])


def functions(path):
    """(name, lines) of each function of MIN_LINES or more before a file's test module."""
    lines = path.read_text().splitlines()
    i = 0
    while i < len(lines):
        if lines[i].strip().startswith("#[cfg(test)]"):
            return
        found = FN.match(lines[i])
        if not found:
            i += 1
            continue
        depth, end, opened = 0, i, False
        while end < len(lines):
            code = code_of(lines[end])
            depth += code.count("{") - code.count("}")
            opened = opened or "{" in code
            if (opened and depth <= 0) or (not opened and code.rstrip().endswith(";")):
                break
            end += 1
        if end - i + 1 >= MIN_LINES:
            yield f"{path.relative_to(STORE)}:{i + 1} {found.group(4)}", lines[i : end + 1]
        i = end + 1


def body_of(lines):
    """The normalised lines after the signature."""
    start = next((k for k, line in enumerate(lines) if "{" in code_of(line)), 0)
    out = []
    for line in lines[start + 1 :]:
        line = HANDLE.sub("H", STRING.sub('"S"', line.split("//")[0].replace(".await", "")))
        line = re.sub(r"\s+", "", line)
        if not PUNCTUATION.match(line):
            out.append(line)
    return out


def backend(name):
    return [
        (label, body_of(lines))
        for path in sorted((STORE / name).rglob("*.rs"))
        if not TEST_FILE.search(path.name)
        for label, lines in functions(path)
    ]


def shared(a, b, run):
    matcher = difflib.SequenceMatcher(None, a, b, autojunk=False)
    return sum(block.size for block in matcher.get_matching_blocks() if block.size >= run)


def pairs(redb, postgres, run):
    out = []
    for label, body in redb:
        best = max(((shared(body, other, run), other_label) for other_label, other in postgres), default=(0, ""))
        if best[0]:
            out.append((best[0], label, best[1]))
    return sorted(out, reverse=True)


def main():
    redb, postgres = backend("redb"), backend("postgres")
    found = pairs(redb, postgres, RUN)
    total = sum(n for n, _, _ in found)
    for n, a, b in found:
        print(f"{n:4}  {a}  ~  {b}")
    print(f"backend twins: {total} shared lines in runs of {RUN}+ (limit {LIMIT})")
    if "--all" in sys.argv:
        print(f"lines shared counting lone lines too: {sum(n for n, _, _ in pairs(redb, postgres, 1))}")
    if total > LIMIT:
        print("the backends repeat a decision: move it into src/store/rules/", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
