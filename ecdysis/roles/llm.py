"""The LLM role backend: each role is a small class (prompt template, input rendering, output
extraction and validation) run on any configured model through the cached `ModelGateway`.

Each request asks the backend for the role's JSON shape natively (`generation_schema`: a
llama.cpp grammar for embedded models, `response_format` for OpenAI-compatible servers, a forced
tool call for Anthropic). A reply is still parsed tolerantly (the first JSON object anywhere in
it), validated against the role's full schema (and, for the Proposer, checked to turn into files);
a bad reply gets one repair request, and if that fails too the heuristic backend answers for that
role. The transcript records it all, each message labelled with the backend that produced it.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from ecdysis.budget import CallBudget
from ecdysis.errors import ModelError
from ecdysis.models.base import ModelBackend
from ecdysis.models.gateway import ModelGateway
from ecdysis.records import CompletionRequest, keys_sorted
from ecdysis.roles.base import SCHEMAS, CaseFile, RoleMessage, RoleName, RoleTurn, render_output, schema_errors
from ecdysis.roles.heuristic import HeuristicRoleBackend
from ecdysis.roles.drafting import ProposalError, closed_operators, materialize
from ecdysis.roles.ranking import Ranking
from ecdysis.roles.operators import OPERATORS
from ecdysis.store import Store

FILE_CHARS = 6000  # per harness file in a prompt; a longer harness.py is shown as an outline (`_outline`)
REPLY_CEILING = 3072  # the most reply tokens a Proposer gets for a whole-file edit


def extract_json(text: str) -> Any | None:
    """The first JSON object in `text` (code fences and chatter around it are ignored)."""
    decoder = json.JSONDecoder()
    start = text.find("{")
    while start != -1:
        try:
            value, _ = decoder.raw_decode(text, start)
        except json.JSONDecodeError:
            start = text.find("{", start + 1)
            continue
        if isinstance(value, dict):
            return value
        start = text.find("{", start + 1)
    return None


MAX_CHARS = 600  # per free-text field in constrained decoding
MAX_ITEMS = 8    # per list


def _bounded(schema: Any) -> Any:
    """`schema` with every string and array bounded, so a small model under a grammar cannot
    ramble until max_tokens and leave an unfinished object."""
    if isinstance(schema, list):
        return [_bounded(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: _bounded(v) for k, v in schema.items()}
    types = out.get("type")
    types = types if isinstance(types, list) else [types]
    if "string" in types and "enum" not in out:
        out.setdefault("maxLength", MAX_CHARS)
    if "array" in types:
        out.setdefault("maxItems", MAX_ITEMS)
    return out


def generation_schema(role: RoleName, case: CaseFile | None = None) -> dict[str, Any]:
    """The shape a backend is asked to produce for `role`: the role's schema made fit for
    constrained decoding (no bare `anyOf` of `required` lists, which grammar converters reject;
    the Proposer's operator is an enum of the catalogue less the operators closed to `case`
    (`closed_operators`), the cluster's ranked ones first, and "" for hand-written edits; strings
    and lists bounded). Replies are
    still validated against the full `SCHEMAS[role]`."""
    if role != "proposer":
        return _bounded(SCHEMAS[role])
    ranked, rest = open_operators(case)[:2] if case is not None else ([], list(OPERATORS))
    spec = {key: value for key, value in SCHEMAS["proposer"]["properties"]["spec"].items()}
    spec["properties"] = {k: v for k, v in spec["properties"].items() if k != "exemplars"}
    edit = SCHEMAS["proposer"]["properties"]["edits"]["items"]
    return _bounded({"type": "object", "required": ["operator", "spec", "replies"],
                     "properties": {"operator": {"enum": [*ranked, *rest, ""]},
                                    "spec": spec,
                                    "replies": {"type": "array", "items": {"type": "string", "minLength": 1}},
                                    "edits": {"type": "array", "items": edit}}})


def _cluster_text(case: CaseFile) -> str:
    c = case.cluster
    rates = "; ".join(f"{m}: {r.hit}/{r.ran} instances it ran" for m, r in sorted(c.rates.items()))
    lines = [f"Cluster {c.id}: {c.label}", f"failure type: {c.type}; {c.size} failures on "
             f"{len(c.instances)} instances", f"categories: {c.categories}", f"models: {c.models} ({rates})",
             f"systematicity: {c.systematicity} (components {c.components})",
             f"aggregation verdict: {c.verdict} — {c.reason}", "evidence:"]
    return "\n".join(lines + [f"- {e}" for e in c.evidence])


def _history_text(case: CaseFile) -> str:
    if not case.history:
        return "Earlier iterations: none."
    lines = ["Earlier iterations tried these changes (do not propose a rejected or rolled-back one again "
             "unless you say what is different; one screened out, not validated or not endorsed on an "
             "earlier batch may be tried again on this one):"]
    lines += [f"- iteration {h.get('iteration', '?')}: {h.get('operator') or 'hand-written edit'} — "
              f"{h.get('change', '')} → {h.get('outcome')}: {h.get('why', '')}" for h in case.history[-8:]]
    return "\n".join(lines)


def open_operators(case: CaseFile) -> tuple[list[str], list[str], dict[str, str], dict[str, str]]:
    """The catalogue for this case: the open operators the cluster's `Ranking` names (best first),
    the other open ones (declaration order), the ranking's reasons, and the closed ones with why."""
    closed = closed_operators(case)
    ranking = Ranking.for_cluster(case.cluster)
    ranked = [n for n in ranking.names if n in OPERATORS and n not in closed]
    rest = [n for n in OPERATORS if n not in closed and n not in ranked]
    return ranked, rest, ranking.reasons, closed


def _catalogue_text(case: CaseFile) -> str:
    """The operators a Proposer may name. The ones the engine's ranking suggests for this cluster
    come first, in its order and with its reason: a small model given the catalogue in declaration
    order named whichever came first, so a closed operator taken out of the list changed its pick."""
    ranked, rest, reasons, closed = open_operators(case)
    parts = []
    if ranked:
        parts.append("Catalogue operators suggested for this cluster, best first (the engine's ranking from the "
                     "failure type and the evidence):\n" + "\n".join(f"{i}. {n} ({OPERATORS[n].title}): {reasons.get(n, 'ranked for this type')}"
                                         for i, n in enumerate(ranked, 1)))
    if rest:
        parts.append(("Other catalogue operators you may name instead of writing edits: " if ranked else
                      "Catalogue operators you may name instead of writing edits: ")
                     + "; ".join(f"{n} ({OPERATORS[n].title})" for n in rest))
    if closed:
        parts.append("Not available here (do not name them): " + "; ".join(f"{n} ({why})" for n, why in closed.items()))
    return "\n".join(parts)


def _operator_with_edits(output: Mapping[str, Any]) -> bool:
    """A Proposer output naming a catalogue operator and adding find/replace edits (no whole files)."""
    return bool(output.get("operator") and output.get("edits") and not output.get("files"))


IN_FORCE = ("solve", "build_messages", "extract_answer")  # the harness functions that decide an answer


def _files_text(files: dict[str, str], limit: int) -> str:
    parts = []
    for path in sorted(files):
        text = files[path]
        shown = text if len(text) <= limit else _outline(text, limit) if path.endswith(".py") else (
            text[:limit] + f"\n…({len(text) - limit} more characters not shown)")
        parts.append(f"=== {path} ===\n{shown}")
    return "\n".join(parts)


def _outline(code: str, limit: int) -> str:
    """A Python file too long to show whole: every top-level line that opens a definition or an
    operator block, with its line number, then the whole source of the definitions in force (the
    last `def solve`, `build_messages`, `extract_answer`), so an edit can quote them exactly."""
    lines = code.splitlines()
    heads = [f"{n:4d}: {line}" for n, line in enumerate(lines, 1)
             if re.match(r"(def |class |# --- ecdysis|_ecd_before_\w+ = )", line)]
    out = ["(outline: the file has " + str(len(lines)) + " lines; definitions and operator blocks:)", *heads]
    budget = max(0, limit - sum(len(h) + 1 for h in out))
    for name in IN_FORCE:
        starts = [n for n, line in enumerate(lines) if line.startswith(f"def {name}(")]
        if not starts:
            continue
        end = next((n for n in range(starts[-1] + 1, len(lines)) if lines[n] and not lines[n][0].isspace()),
                   len(lines))
        block = "\n".join(lines[starts[-1]:end]).rstrip()
        if len(block) + 40 > budget:
            break
        out += [f"(in force, lines {starts[-1] + 1}-{end}:)", block]
        budget -= len(block) + 40
    return "\n".join(out)


@dataclass(frozen=True)
class RolePrompt:
    """One role: what it is asked, which inputs it gets, how its reply is validated."""

    role: RoleName
    duty: str
    inputs: tuple[str, ...]

    def system(self) -> str:
        schema = json.dumps(SCHEMAS[self.role], ensure_ascii=False)
        return (f"You are the {self.role.capitalize()} in Ecdysis, which repairs the runtime harness of an "
                f"LLM agent from clusters of failures. {self.duty}\nReply with ONE JSON object, nothing else, "
                f"matching this JSON schema:\n{schema}")

    def user(self, case: CaseFile, file_chars: int = FILE_CHARS) -> str:
        sections = {
            "cluster": lambda: _cluster_text(case),
            "harness": lambda: (f"Harness files (version {case.harness_version}):\n"
                                f"{_files_text(case.files, file_chars)}"),
            "investigation": lambda: f"Investigator said: {json.dumps(case.investigation, ensure_ascii=False)}",
            "attribution": lambda: f"Attributor said: {json.dumps(case.attribution, ensure_ascii=False)}",
            "catalogue": lambda: _catalogue_text(case),
            "objections": lambda: ("Critic objections to answer this round:\n" + "\n".join(
                f"- {o}" for o in case.objections)) if case.objections else "No objections yet.",
            "draft": lambda: self._draft_text(case),
            "history": lambda: _history_text(case),
            "concerns": lambda: ("Review pass: the engine measured these concerns about the accepted specification "
                                 "(regressions on passing instances, cost, generality). Accept the specification "
                                 "with them as known risks, or revise:\n"
                                 + "\n".join(f"- {c['text']}" for c in case.concerns)) if case.concerns else "",
        }
        return "\n\n".join(text for name in self.inputs if (text := sections[name]()))

    @staticmethod
    def _draft_text(case: CaseFile) -> str:
        if case.draft is None:
            return "No draft."
        from ecdysis.diffs import diff_files
        diff = "".join(d.unified for d in diff_files(case.files, case.draft.files))
        checks = "\n".join(f"- {c.name}: {'ok' if c.ok else 'FAILED'} — {c.detail}" for c in case.draft.checks)
        return (f"Proposed spec: {json.dumps(case.draft.spec.to_json(), ensure_ascii=False)}\n"
                f"Patch:\n{diff}\nHard checks:\n{checks}")

    def messages(self, case: CaseFile, file_chars: int = FILE_CHARS) -> list[dict[str, str]]:
        return [{"role": "system", "content": self.system()},
                {"role": "user", "content": self.user(case, file_chars)}]

    def parse(self, text: str, case: CaseFile) -> tuple[dict[str, Any] | None, list[str]]:
        """The validated output, or None and every reason it is unusable."""
        value = extract_json(text)
        if value is None:
            return None, ["the reply contains no JSON object"]
        errors = schema_errors(self.role, value)
        if errors:
            return None, errors
        if self.role == "proposer" and not value.get("give_up"):
            name = value.get("operator")
            closed = closed_operators(case)
            if name and name in closed:  # a backend that ignores the schema's enum may still name one
                return None, [f"operator {name} is not available: {closed[name]}; name another operator, or "
                              f"none and give edits"]
            try:
                materialize(value, case)
            except (ProposalError, ValueError, KeyError) as exc:
                hint = (f" (or leave `edits` out to apply {name} as the catalogue writes it)"
                        if _operator_with_edits(value) else "")
                return None, [f"the proposal cannot be applied: {exc}{hint}"]
        return value, []

    def operator_alone(self, text: str, case: CaseFile) -> dict[str, Any] | None:
        """A Proposer reply that names an open catalogue operator and adds `edits` that do not
        apply, less those edits, if that is a usable proposal; else None. Small models given an
        operator's title often add edits quoting file names as text to find; the operator they
        named is still their choice, and it is kept rather than replaced by the heuristic's."""
        value = extract_json(text)
        if self.role != "proposer" or not isinstance(value, dict) or not _operator_with_edits(value):
            return None
        return self.parse(json.dumps({k: v for k, v in value.items() if k != "edits"}), case)[0]


PROMPTS: dict[str, RolePrompt] = {p.role: p for p in (
    RolePrompt("investigator", "Find the root cause of the cluster in the harness source: which file and "
               "function, and why, citing the evidence.", ("cluster", "harness")),
    RolePrompt("attributor", "Decide whether the cluster is a harness-level deficiency, a model-specific "
               "quirk or noise, citing cross-instance and cross-model evidence (counts).",
               ("cluster", "investigation")),
    RolePrompt("proposer", "Write a harness modification specification and the change itself: name a "
               "catalogue operator, or give exact find/replace edits. The change must be general: never "
               "mention an instance, its id, its text or its answer. Answer every objection in `replies`.",
               ("cluster", "investigation", "attribution", "catalogue", "history", "objections", "harness")),
    RolePrompt("critic", "Review the proposal for generality, leakage of task data, regressions and whether it "
               "addresses the root cause. Accept it, or list concrete objections the Proposer must answer.",
               ("cluster", "investigation", "draft", "concerns")),
)}


class LLMRoleBackend:
    """Roles played by a model; see the module docstring. Never raises for a bad reply."""

    def __init__(self, backend: ModelBackend, *, store: Store | None = None, max_tokens: int = 1024,
                 file_chars: int = FILE_CHARS, fallback: HeuristicRoleBackend | None = None,
                 structured: bool = True, budget: CallBudget | None = None) -> None:
        self.gateway = ModelGateway(backend, store, budget=budget)
        self.max_tokens = max_tokens
        self.structured = structured
        self.file_chars = file_chars  # small local models read prompts slowly: keep them short there
        self.fallback = fallback or HeuristicRoleBackend()
        self.name = f"llm:{backend.model_id}"

    def run(self, role: RoleName, case: CaseFile, round: int) -> RoleTurn:
        prompt = PROMPTS[role]
        messages = prompt.messages(case, self.file_chars)
        log = [self._msg(round, role, "prompt", messages[-1]["content"])]
        errors: list[str] = []
        # In sorted key order, as every role was measured with (before 2026-12-07 every schema was
        # sorted on its way to the backend); a harness's schema keeps its own order.
        schema = keys_sorted(generation_schema(role, case)) if self.structured else None
        for attempt in range(2):
            try:
                reply = self.gateway.complete(CompletionRequest.make(messages, max_tokens=self._budget(role, case),
                                                                     json_schema=schema))
            except ModelError as exc:
                errors = [f"model call failed: {exc}"]
                break
            log.append(self._msg(round, role, "reply", reply.text))
            output, errors = prompt.parse(reply.text, case)
            if output is not None:
                log.append(RoleMessage(round, role, "output", self.name, render_output(role, output), output))
                return RoleTurn(output, log)
            bare = prompt.operator_alone(reply.text, case) if attempt == 1 else None
            if bare is not None:
                log.append(self._msg(round, role, "check", f"The edits did not apply ({errors[0]}); "
                                     f"{bare['operator']} is taken as the catalogue writes it, without them."))
                log.append(RoleMessage(round, role, "output", self.name, render_output(role, bare), bare))
                return RoleTurn(bare, log)
            if attempt == 0:
                repair = self._repair_request(errors)
                messages = messages + [{"role": "assistant", "content": reply.text},
                                       {"role": "user", "content": repair}]
                log.append(self._msg(round, role, "repair", repair))
        return self._fall_back(role, case, round, log, errors)

    def _budget(self, role: RoleName, case: CaseFile) -> int:
        """Reply tokens: the Proposer may rewrite a whole file, so its budget grows with the largest
        file it sees (about 3 characters a token) up to REPLY_CEILING; other roles get max_tokens."""
        if role != "proposer":
            return self.max_tokens
        largest = max((len(t) for t in case.files.values()), default=0)
        return max(self.max_tokens, min(REPLY_CEILING, largest // 3 + 256))

    @staticmethod
    def _repair_request(errors: Sequence[str]) -> str:
        return ("Your reply could not be used: " + "; ".join(errors[:5])
                + ". Reply again with ONE JSON object that matches the schema, and nothing else.")

    def _fall_back(self, role: RoleName, case: CaseFile, round: int, log: list[RoleMessage],
                   errors: Sequence[str]) -> RoleTurn:
        note = (f"{self.name} gave no usable {role} output ({'; '.join(errors[:3])}); "
                f"the heuristic backend answers for this role.")
        log.append(self._msg(round, role, "fallback", note))
        turn = self.fallback.run(role, case, round)
        for message in turn.messages:
            message.backend = f"{self.fallback.name} (fallback)"
        return RoleTurn(turn.output, log + turn.messages)

    def _msg(self, round: int, role: RoleName, kind: str, text: str) -> RoleMessage:
        return RoleMessage(round=round, role=role, kind=kind, backend=self.name, text=text)  # type: ignore[arg-type]
