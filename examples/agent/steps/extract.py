"""Extract facts: the sentences of each document that mention a keyword."""
import json
import re
import sys

KEYWORDS = ("checkpoint", "crash", "resume", "idempotent", "fsync", "durable")

state = json.load(sys.stdin)
facts = []
for doc in state["docs"]:
    for sentence in re.split(r"(?<=[.!?])\s+", doc["text"].strip()):
        if any(k in sentence.lower() for k in KEYWORDS):
            facts.append({"source": doc["name"], "sentence": sentence.strip()})
print(json.dumps({"facts": facts, "fact_count": len(facts)}))
