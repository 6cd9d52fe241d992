#!/usr/bin/env python3
"""Checks that client generators can use the served OpenAPI document.

Usage: check-openapi-generators.py DOCUMENT VENV

- openapi-spec-validator (the reference validator) must accept it;
- openapi-python-client must generate a client from it with no warning but the one
  allowed below, and a module for every operation of the document: the generator skips
  an operation it cannot represent (a repeated operation id, two schemas of one name)
  with only a warning, so the check counts the operations it kept.
"""
import json
import pathlib
import re
import subprocess
import sys
import tempfile

# The export streams NDJSON, a content type the generator does not model: it keeps
# `GET /v1/export` (its parameters, its errors) and leaves the streamed body to the caller.
ALLOWED_WARNINGS = [
    re.compile(r"WARNING parsing GET /v1/export within \w+\.\s+Cannot parse response for status code .*"
               r"Unsupported content_type application/x-ndjson", re.S),
]


def snake(operation_id):
    return re.sub(r"[^0-9a-z]+", "_", re.sub(r"([a-z0-9])([A-Z])", r"\1_\2", operation_id).lower()).strip("_")


def main():
    document, venv = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
    if subprocess.run([venv / "bin" / "openapi-spec-validator", document]).returncode != 0:
        sys.exit("openapi-spec-validator refused the document")

    spec = json.loads(document.read_text())
    operations = {
        op["operationId"]: f"{method.upper()} {path}"
        for path, item in spec["paths"].items()
        for method, op in item.items()
        if isinstance(op, dict) and "operationId" in op
    }
    with tempfile.TemporaryDirectory() as work:
        config = pathlib.Path(work, "config.json")
        # No formatter hooks: ruff is not installed, and its absence would be a warning.
        config.write_text(json.dumps({"post_hooks": [], "project_name_override": "generated"}))
        out = pathlib.Path(work, "out")
        run = subprocess.run(
            [venv / "bin" / "openapi-python-client", "generate", "--path", document, "--output-path", out,
             "--config", config, "--meta", "none"],
            capture_output=True, text=True,
        )
        text = run.stdout + run.stderr
        if run.returncode != 0:
            sys.exit(f"openapi-python-client failed:\n{text}")
        # Each warning is a block that starts with "WARNING" and ends at the next blank-line-separated header.
        warnings = [w.strip() for w in re.split(r"\n(?=WARNING )", text) if w.strip().startswith("WARNING")]
        unexpected = [w for w in warnings if not any(p.search(w) for p in ALLOWED_WARNINGS)]
        # A name Python reserves gets a trailing underscore (`list_`).
        generated = {p.stem.rstrip("_") for p in out.rglob("api/*/*.py") if p.stem != "__init__"}
        dropped = sorted(f"{route} ({op})" for op, route in operations.items() if snake(op) not in generated)
    print(f"openapi-python-client: {len(generated)} of {len(operations)} operations generated, "
          f"{len(warnings)} warning(s), {len(warnings) - len(unexpected)} allowed")
    failed = False
    if unexpected:
        print("unexpected generator warnings:\n" + "\n\n".join(unexpected), file=sys.stderr)
        failed = True
    if dropped:
        print("operations the generator dropped: " + ", ".join(dropped), file=sys.stderr)
        failed = True
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
