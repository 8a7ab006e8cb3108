"""The Python lines of docs/bindings.md (quoted by the README) run as written."""
import contextlib
import io
import re
from pathlib import Path

DOCS = Path(__file__).resolve().parents[3] / "docs" / "bindings.md"


def test_the_documented_lines_run():
    block = re.search(r"```python\n(.*?)```", DOCS.read_text(), re.S).group(1)
    assert len(block.strip().splitlines()) == 5
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        exec(compile(block, str(DOCS), "exec"), {})
    assert printed.getvalue().startswith("(1, 16, 2, 8) ")


def test_the_documented_variants_run():
    section = DOCS.read_text().split("## Variants", 1)[1]
    block = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        exec(compile(block, str(DOCS), "exec"), {})
    assert printed.getvalue() == "(10, 2, 4) (2, 10) (2,)\n"


def test_the_documented_merge_runs():
    section = DOCS.read_text().split("## Merging partial results", 1)[1]
    block = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        exec(compile(block, str(DOCS), "exec"), {})
    assert printed.getvalue() == "True (1, 16, 2, 8) (1, 2, 16)\n"


def test_the_documented_kv_cache_runs():
    # The section's first Python block (the Go and Rust ones follow it).
    section = DOCS.read_text().split("## KV cache", 1)[1]
    block = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    assert "attention_with_kvcache" in block
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        exec(compile(block, str(DOCS), "exec"), {})
    assert printed.getvalue() == "(2, 1, 2, 16) True\n"
