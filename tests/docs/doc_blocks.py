#!/usr/bin/env python3
"""The code blocks of a Markdown file that CI runs as written, found by a marker comment on the
line before the block's fence:

    <!-- checked: c go/main.go -->

names the checks the block belongs to. NAME alone: the block is shell, a part of NAME's script;
NAME/FILE: the block is the file FILE of NAME's folder. Markers are invisible on a rendered page.

    doc_blocks.py DOC NAME FOLDER

writes NAME's files into FOLDER and prints NAME's script: its shell blocks in the order of the
document (nothing when it has files only). It fails when DOC has no block for NAME, so that a
check whose marker went missing cannot pass by running nothing.
"""
import os
import re
import sys

MARKER = re.compile(r"^<!-- checked: (.+?) -->$")
FENCE = re.compile(r"^```")


def blocks(lines):
    """(names the marker lists, the block's text) for each marked block."""
    i = 0
    while i < len(lines):
        marker = MARKER.match(lines[i])
        i += 1
        if not marker:
            continue
        if i >= len(lines) or not FENCE.match(lines[i]):
            raise SystemExit("line %d: a checked marker must stand right before a ``` fence" % i)
        end = i + 1
        while end < len(lines) and not FENCE.match(lines[end]):
            end += 1
        if end == len(lines):
            raise SystemExit("line %d: the block never closes" % (i + 1))
        yield marker.group(1).split(), "".join(lines[i + 1:end])
        i = end + 1


def main(doc, name, folder):
    with open(doc, encoding="utf-8") as f:
        lines = f.readlines()
    script, files = [], 0
    for names, text in blocks(lines):
        for entry in names:
            check, _, file = entry.partition("/")
            if check != name:
                continue
            if file:
                with open(os.path.join(folder, file), "w", encoding="utf-8") as out:
                    out.write(text)
                files += 1
            else:
                script.append(text)
    if not script and not files:
        raise SystemExit("%s: no block is marked for the check %r" % (doc, name))
    sys.stdout.write("".join(script))
    print("doc_blocks: %s: check %s, %d shell block(s), %d file(s)" % (doc, name, len(script), files),
          file=sys.stderr)


if __name__ == "__main__":
    if len(sys.argv) != 4:
        raise SystemExit(__doc__)
    main(*sys.argv[1:])
