"""The heuristic role backend: deterministic and offline, the default when no capable model is
configured. The failure taxonomy plus the repair-operator catalogue stand in for the four roles.

Investigator reads the cluster's evidence and the harness source; Attributor restates the
aggregation verdict with its cross-instance and cross-model counts; Proposer picks the best
catalogue operator not yet objected to; Critic turns failed hard checks into objections.
"""

from __future__ import annotations

import re
from collections import Counter
from typing import Any, Callable

from ecdysis.aggregate import Cluster
from ecdysis.failures import AGENT_TYPES, MULTI_TURN_TYPES
from ecdysis.roles.base import CaseFile, RoleMessage, RoleName, RoleTurn, render_output, schema_errors
from ecdysis.roles.drafting import repair_input
from ecdysis.roles.operators import OPERATORS
from ecdysis.roles.ranking import Ranking
from ecdysis.roles.repairs import params_of

BACKEND = "heuristic"


def _share(n: int, total: int) -> str:
    return f"{n} of {total}"


def _function_source(code: str, name: str) -> str:
    """The last top-level definition of `name` (the one in force), up to the next top-level line."""
    starts = [m.start() for m in re.finditer(rf"^def {name}\(", code, re.M)]
    if not starts:
        return ""
    body = code[starts[-1]:]
    first_newline = body.find("\n") + 1 or len(body)
    end = re.search(r"^\S", body[first_newline:], re.M)
    return body[: first_newline + end.start()] if end else body


def _harness_facts(files: dict[str, str]) -> dict[str, Any]:
    code = files.get("harness.py", "")
    extractor = _function_source(code, "extract_answer")
    prompts = (files.get("system.md", "") + files.get("user.md", "")).lower()
    params = params_of(files)
    return {
        "first_line": "splitlines" in extractor and "ecd_find_answer" not in extractor,
        "answer_line": '"answer"' in extractor.lower(),
        "format_instruction": any(w in prompts for w in ("first line", "only the", "answer with", "final answer")),
        "max_tokens": int(params.get("max_tokens", 0) or 0),
        "samples": int(params.get("samples", 1) or 1),
        "temperature": params.get("temperature", 0.0),
        "retries": int(params.get("retries", 0) or 0),
        "few_shot": "fewshot.jsonl" in files,
    }


def _top_signature(cluster: Cluster) -> str:
    return Counter(f.signature for f in cluster.failures).most_common(1)[0][0]


def _agent_cause(c: Cluster, files: dict[str, str]) -> tuple[str, str]:
    """Root cause and component for a cluster of function-call failures, from the mechanisms the
    checker found (`failures.agent_failure`) and what the harness does with a reply."""
    n = c.size
    mechanisms = Counter(str(f.detail.get("mechanism", "")) for f in c.failures).most_common(3)
    seen = "; ".join(f"{m} in {_share(k, n)}" for m, k in mechanisms)
    checks = [str(f.detail.get("check", "")) for f in c.failures if f.detail.get("check")][:2]
    example = f" The checker says: {' / '.join(checks)}." if checks else ""
    code = files.get("harness.py", "")
    if c.type == "unparsable_call":
        retry = "call_parse_retry" in code or "parse_retries" in files.get("harness.toml", "")
        cause = (f"Replies are not function calls the harness can read ({seen}); solve() returns the reply "
                 f"as is{' after one re-ask' if retry else ' and never asks again'}, and the prompt gives no "
                 f"example of the reply format.")
        component = "user.md"
    elif c.type == "wrong_argument":
        cause = (f"The right function is called with an argument the checker rejects ({seen}); solve() passes "
                 f"the arguments through without reading the schema's declared types.{example}")
        component = "harness.py:solve"
    elif c.type == "wrong_function":
        cause = f"Calls go to the wrong function ({seen}); nothing checks a call against the listed functions.{example}"
        component = "system.md"
    elif c.type == "call_count":
        cause = f"The number of calls is wrong ({seen}); the prompt does not show how several calls are listed.{example}"
        component = "user.md"
    elif c.type == "irrelevant_call":
        cause = (f"A function is called although none of the listed ones does what is asked ({seen}); the "
                 f"prompt's rule for calling nothing is easy to miss.")
        component = "system.md"
    elif c.type == "step_limit":
        steps = params_of(files).get("max_steps")
        cause = (f"Turns are cut off at the step limit (max_steps={steps} in harness.toml) while the model "
                 f"still calls ({seen}).{example}")
        component = "harness.toml:max_steps"
    elif c.type == "stopped_early":
        cause = (f"Turns end before the task is done ({seen}): a reply without calls ends the turn in "
                 f"solve_turns(), and nothing asks whether the request is met.{example}")
        component = "harness.py:solve_turns"
    else:  # env_error
        cause = (f"Calls fail in the environment ({seen}); the prompt lists each function as one signature "
                 f"line and shows no example of a call.{example}")
        component = "user.md"
    return cause, component


def investigate(case: CaseFile) -> dict[str, Any]:
    """Root cause from the cluster's typed evidence, located in the harness source."""
    c, facts = case.cluster, _harness_facts(case.files)
    n = c.size
    found = sum(1 for f in c.failures if f.detail.get("shape_in_reply"))
    right = sum(1 for f in c.failures if f.detail.get("target_in_reply"))
    shapes = ", ".join(c.shapes)
    if c.type == "off_format":
        where = ("extract_answer in harness.py returns the reply's first non-empty line verbatim"
                 + (" when the reply has no final \"Answer:\" line" if facts["answer_line"] else "")
                 if facts["first_line"] else "extract_answer in harness.py does not isolate the answer")
        prompt = "" if facts["format_instruction"] else "; the prompts never say what form the answer takes"
        cause = (f"{where}, but replies open with prose (“{_top_signature(c)}”); in {_share(found, n)} failures "
                 f"an answer of the expected form ({shapes}) appears later in the reply, the right one in "
                 f"{right}{prompt}.")
        component = "harness.py:extract_answer" if found * 2 >= n else "system.md"
    elif c.type == "truncated":
        cause = (f"{_share(n, n)} replies stop at max_tokens={facts['max_tokens']} (harness.toml [params]) before "
                 f"an answer of the expected form ({shapes}) is written.")
        component = "harness.toml:max_tokens"
    elif c.type == "empty_output":
        cause = (f"The extracted answer is empty in {n} failures and solve retries only {facts['retries']} "
                 f"time(s) with the same messages, so an empty reply stays final.")
        component = "harness.py:solve"
    elif c.type == "invalid_choice":
        answers = Counter((f.answer or "").strip() for f in c.failures).most_common(3)
        cause = (f"Answers on multiple-choice tasks are passed through without matching them to the options: "
                 f"{', '.join(repr(a) for a, _ in answers)} are not option letters or texts.")
        component = "harness.py:extract_answer"
    elif c.type == "wrong_answer":
        cause = (f"Answers are well formed but wrong on {len(c.instances)} instances; the harness shows no "
                 f"worked example{' (no fewshot.jsonl)' if not facts['few_shot'] else ''} and takes "
                 f"{facts['samples']} sample(s) at temperature {facts['temperature']}.")
        component = "user.md" if not facts["few_shot"] else "harness.toml:samples"
    elif c.type in AGENT_TYPES or c.type in MULTI_TURN_TYPES:
        cause, component = _agent_cause(c, case.files)
    else:
        frame = next((f.detail["location"] for f in c.failures if f.detail.get("location")), None)
        loc = f" at {frame[0]}:{frame[1]} in {frame[2]}()" if frame else ""
        cause = f"Harness execution fails ({c.type}){loc} on {n} instances: {c.failures[0].excerpt}"
        component = f"{frame[0]}:{frame[2]}" if frame else "harness.py:solve"
    omitted = Counter(item for f in c.failures for item in f.detail.get("prompt_omits") or ())
    if omitted:
        what, count = omitted.most_common(1)[0]
        cause += (f" The rendered prompt leaves out {what} in {_share(count, n)} failures, although the suite "
                  f"states it: the model is never asked the whole task.")
        if count * 2 >= n:
            component = "user.md"
    stats = [f"{n} failures on {len(c.instances)} instances; categories {c.categories}; models {c.models}"]
    return {"root_cause": cause, "component": component, "evidence": stats + c.evidence[:3],
            "confidence": round(min(1.0, 0.5 + 0.5 * c.consistency * c.systematicity), 2)}


def attribute(case: CaseFile) -> dict[str, Any]:
    """The aggregation verdict, restated with the counts behind it."""
    c, batch = case.cluster, case.batch
    cats = f"{len(c.categories)} of {len(batch.category_names)} categories ({', '.join(c.categories)})"
    ran = {m: r for m, r in c.rates.items() if r.ran}
    if len(ran) >= 2:
        cross_model = "; ".join(f"{m}: {r.hit} of {r.ran} instances it ran"
                                + (f" (+{r.kin} worded differently)" if r.kin else "") for m, r in sorted(ran.items()))
    else:
        cross_model = (f"cross-model evidence unavailable: only {', '.join(ran) or 'one model'} ran these instances")
    return {"verdict": c.verdict, "reason": c.reason,
            "cross_instance": f"{c.size} failures on {len(c.instances)} instances across {cats}",
            "cross_model": cross_model}


def propose(case: CaseFile) -> dict[str, Any]:
    """The best-ranked catalogue operator for this cluster not yet objected to, nor tried in an
    earlier iteration without being kept; one the Critic refused on another batch comes after
    every untried one."""
    skipped: list[str] = []
    inp = repair_input(case)
    only = case.only_operators
    ranked = [n for n in Ranking.for_cluster(case.cluster).names if not only or n in only]
    refused = case.refused_elsewhere
    for name in [n for n in ranked if n not in refused] + [n for n in ranked if n in refused]:
        if name in case.tried_operators:
            skipped.append(f"{name}: objected to in an earlier round")
            continue
        if name in case.ruled_out:
            skipped.append(f"{name}: {case.ruled_out[name]}")
            continue
        reason = OPERATORS[name].unavailable(inp)
        if reason:
            skipped.append(f"{name}: {reason}")
            continue
        result = OPERATORS[name].apply(inp)
        changed = {p: t for p, t in result.files.items() if case.files.get(p) != t}
        replies = [f"Objection “{o}” answered by proposing {name} instead." for o in case.objections]
        replies += [f"Not proposed again: {why}." for why in skipped if any(why.startswith(f"{op}:") for op in case.ruled_out)]
        if name in refused:
            replies.append(f"Proposed again, after every untried repair: {refused[name]}.")
        if name in case.screened_elsewhere:
            replies.append(f"Proposed again, not as new: {case.screened_elsewhere[name]}; "
                           "this batch's screening decides.")
        return {"operator": name, "spec": result.spec.to_json(), "files": changed, "replies": replies}
    options = "; ".join(skipped) or f"the catalogue has no generic repair for {case.cluster.type}"
    return {"give_up": f"No catalogue operator is left for this cluster ({options})."}


def critique(case: CaseFile) -> dict[str, Any]:
    """Objections from the hard checks and the spec's own consistency; accept when there are none."""
    draft = case.draft
    if draft is None:
        return {"decision": "revise", "objections": ["there is no proposal to review"]}
    if case.concerns:
        # A review pass: a regression on passing instances demands a revision; cost and
        # generality are the change's known risks, recorded as disputed and left to screening.
        regressions = [c["text"] for c in case.concerns if c["kind"] == "regression"]
        if regressions:
            return {"decision": "revise", "objections": regressions}
        return {"decision": "accept", "objections": [],
                "notes": "no regression on passing instances; the remaining concerns are left to screening"}
    objections = [c.detail for c in draft.checks if not c.ok]
    changed = sorted(p for p, t in draft.files.items() if case.files.get(p) != t)
    missing = sorted(set(changed) - set(draft.spec.target_files))
    if missing:
        objections.append(f"the patch changes {', '.join(missing)}, which the spec does not list as targets")
    if not draft.spec.scope.strip():
        objections.append("the spec does not say why the change is general rather than fitted to these instances")
    if objections:
        return {"decision": "revise", "objections": objections}
    return {"decision": "accept", "objections": [],
            "notes": "applies cleanly, loads and passes the smoke run, quotes no instance data"}


_ROLES: dict[str, Callable[[CaseFile], dict[str, Any]]] = {
    "investigator": investigate, "attributor": attribute, "proposer": propose, "critic": critique}


class HeuristicRoleBackend:
    """Deterministic roles; see the module docstring. `run` never calls a model."""

    name = BACKEND

    def run(self, role: RoleName, case: CaseFile, round: int) -> RoleTurn:
        output = _ROLES[role](case)
        errors = schema_errors(role, output)
        if errors:  # a defect in this module, not a model reply: fail loudly in tests
            raise AssertionError(f"heuristic {role} output breaks its schema: {errors}")
        message = RoleMessage(round=round, role=role, kind="output", backend=self.name,
                              text=render_output(role, output), data=output)
        return RoleTurn(output=output, messages=[message])
