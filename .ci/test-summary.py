#!/usr/bin/env python3
"""One summary line for every test step of .ci/run.

Each argument is a log of one step (cargo test's output). A test is one name in one test
binary: run on redb and again on PostgreSQL, or under two torture seeds, it is counted
once, as passed only if it passed every time. A step whose command failed without naming a
failing test (a build error, a crash of the harness) counts as one failure, so that the
failed count can always show what went wrong. Prints "tests: N passed, M failed" and exits
1 when M > 0.
"""

import re
import sys

RUNNING = re.compile(r"^\s*Running (?:unittests )?(\S+)")
RESULT = re.compile(r"^test (\S+) \.\.\. (ok|FAILED|ignored)\b")
SUMMARY = re.compile(r"^test result: \S+\. (\d+) passed; (\d+) failed")


def read(path):
    """(statuses by (binary, name), failures no line named) of one log. The step's exit
    status is on the log's last line as `== exit N` (written by .ci/run); a failure whose
    `test … FAILED` line was torn by a test's own output (--nocapture) still counts, from
    cargo's `test result:` line."""
    statuses = {}
    binary = "?"
    reported_failures = 0
    exit_status = None
    with open(path, encoding="utf-8", errors="replace") as log:
        for line in log:
            line = line.rstrip("\n")
            if m := RUNNING.match(line):
                binary = m.group(1)
                continue
            if m := RESULT.match(line):
                statuses.setdefault((binary, m.group(1)), []).append(m.group(2))
                continue
            if m := SUMMARY.match(line):
                reported_failures += int(m.group(2))
                continue
            if m := re.match(r"^== exit (\d+)$", line):
                exit_status = int(m.group(1))
    named_failures = sum(1 for s in statuses.values() if "FAILED" in s)
    unnamed = max(reported_failures - named_failures, 0)
    if exit_status not in (None, 0) and named_failures + unnamed == 0:
        unnamed = 1
    return statuses, unnamed


def main(paths):
    tests = {}
    unexplained = []
    for path in paths:
        statuses, unnamed = read(path)
        for key, seen in statuses.items():
            tests.setdefault(key, []).extend(seen)
        unexplained.extend([path] * unnamed)
    passed = sum(1 for s in tests.values() if "FAILED" not in s and "ok" in s)
    failed = sum(1 for s in tests.values() if "FAILED" in s) + len(unexplained)
    for (binary, name), seen in sorted(tests.items()):
        if "FAILED" in seen:
            print(f"FAILED: {binary} {name}")
    for path in unexplained:
        print(f"FAILED: a failure in {path} that no test line names (a build error, or torn output)")
    print()
    print(f"tests: {passed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
