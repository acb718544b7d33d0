"""Writes tests/fixtures/collabllm/multiturn_small.jsonl: a few rows in the published
CollabLLM multiturn schema (prompt, completion, conv_id, turn_id, score, single_turn_prompt,
single_turn_completion, single_turn_metadata, sessions, rewards), made up here, including a
conversation with several turns and candidates and a duplicated prompt."""
import json
import os

rows = []
def row(conv, turn, prompt, completion, score):
    rows.append({
        "prompt": prompt, "completion": completion, "conv_id": conv, "turn_id": turn, "score": score,
        "single_turn_prompt": f"full request {conv}", "single_turn_completion": f"answer {conv}",
        "single_turn_metadata": {"source": "test"}, "sessions": [], "rewards": {"accuracy": [score]},
    })

for c in range(12):
    u1 = {"role": "user", "content": f"help me with task {c}"}
    row(c, 0, [u1], f"what exactly for {c}?", 0.2)
    row(c, 0, [u1], f"guess for {c}", 0.1)
    a1 = {"role": "assistant", "content": f"what exactly for {c}?"}
    u2 = {"role": "user", "content": f"detail {c}"}
    row(c, 1, [u1, a1, u2], f"final {c} worse", 0.5)
    row(c, 1, [u1, a1, u2], f"final {c} best", 0.9)

here = os.path.dirname(os.path.abspath(__file__))
out = os.path.join(here, "..", "fixtures", "collabllm", "multiturn_small.jsonl")
with open(out, "w") as f:
    for r in rows:
        f.write(json.dumps(r) + "\n")
print(len(rows), "rows ->", out)
