"""Extract facts: the sentences of each document that mention a keyword.

Progress goes out as events, one JSON line per document on file descriptor 3
(`steadfast watch ID` shows them as they come); stdout is the update.
"""
import json
import os
import re
import sys

KEYWORDS = ("checkpoint", "crash", "resume", "idempotent", "fsync", "durable")


def emit(value):
    """One event; a run without an events pipe (fd 3 closed) has none."""
    try:
        os.write(3, (json.dumps(value) + "\n").encode())
    except OSError:
        pass


state = json.load(sys.stdin)
facts = []
for doc in state["docs"]:
    found = 0
    for sentence in re.split(r"(?<=[.!?])\s+", doc["text"].strip()):
        if any(k in sentence.lower() for k in KEYWORDS):
            facts.append({"source": doc["name"], "sentence": sentence.strip()})
            found += 1
    emit({"document": doc["name"], "facts": found})
print(json.dumps({"facts": facts, "fact_count": len(facts)}))
