"""Write the report. Writing the same file again is harmless, so the step is
idempotent: a crash after it ran and before its checkpoint landed costs nothing."""
import json
import os
import sys

state = json.load(sys.stdin)
run_id = os.environ["STEADFAST_RUN_ID"]
review = state.get("review") or {}
os.makedirs("out", exist_ok=True)
path = os.path.join("out", f"report-{run_id.replace('/', '_')}.md")
lines = [f"# Findings ({state['fact_count']} facts)", ""]
lines += [f"- {f['sentence']} ({f['source']})" for f in state["facts"]]
if review.get("note"):
    lines += ["", f"Reviewer's note: {review['note']}"]
with open(path, "w", encoding="utf-8") as f:
    f.write("\n".join(lines) + "\n")
print(json.dumps({"report": os.path.join("examples", "agent", path)}))
