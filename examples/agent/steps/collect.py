"""Collect the documents: every .txt file in the directory given."""
import json
import os
import sys

folder = sys.argv[1]
docs = []
for name in sorted(os.listdir(folder)):
    if name.endswith(".txt"):
        with open(os.path.join(folder, name), encoding="utf-8") as f:
            docs.append({"name": name, "text": f.read()})
print(json.dumps({"docs": docs}))
