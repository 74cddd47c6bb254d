"""Starter harness: build the messages from the templates, call the model, extract the answer.

Entry point: solve(task, model, harness) -> str. `task` has input, choices, category, fields
(never the target). `model.generate(messages, ...)` returns a reply with .text and
.finish_reason. `harness.params` holds [params] from harness.toml; `harness.render(name, **vars)`
fills a template.
"""

from collections import Counter


def build_messages(task, harness):
    variables = harness.task_variables(task)
    return [
        {"role": "system", "content": harness.render("system.md", **variables).strip()},
        {"role": "user", "content": harness.render("user.md", **variables).strip()},
    ]


def extract_answer(text, task):
    """What follows the reply's last "Answer:" line (the form the system prompt asks for), else
    the reply's first non-empty line."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    for line in reversed(lines):
        head, colon, rest = line.strip("*# ").partition(":")
        if colon and head.strip("* ").lower() == "answer" and rest.strip("* "):
            return rest.strip("* ")
    return lines[0] if lines else ""


def solve(task, model, harness):
    p = harness.params
    messages = build_messages(task, harness)
    answers = []
    for sample in range(max(1, int(p.get("samples", 1)))):
        for attempt in range(1 + int(p.get("retries", 0))):
            reply = model.generate(messages, temperature=float(p.get("temperature", 0.0)),
                                   max_tokens=int(p.get("max_tokens", 96)),
                                   stop=list(p.get("stop", [])), seed=sample * 100 + attempt)
            answer = extract_answer(reply.text, task)
            if answer:
                answers.append(answer)
                break
    if not answers:
        return ""
    return Counter(answers).most_common(1)[0][0]
