"""Which catalogue repairs to try for a cluster, best first: a table by failure type, adjusted by
the cluster's evidence (what the prompt leaves out, where the answer sits, closed answers, the
recoverability probe's pick). The table and the rules are the ranking policy; the repairs
themselves are in `operators.py` and `agent_operators.py`."""

from __future__ import annotations

from dataclasses import dataclass, field

from ecdysis.aggregate import Cluster
from ecdysis.roles.agent_operators import AGENT_RANKING


# Which operators address which failure type, best first. Errors in harness code, timeouts and
# model-call errors have no generic repair: they need a hand-written (LLM or human) change.
RANKING: dict[str, tuple[str, ...]] = {
    "off_format": ("answer_extraction", "answer_format_instruction", "retry_unparsable", "few_shot",
                   "choice_matching"),
    "invalid_choice": ("choice_matching", "answer_format_instruction", "answer_extraction", "few_shot"),
    "truncated": ("output_budget", "answer_format_instruction", "answer_extraction", "retry_unparsable"),
    "empty_output": ("retry_unparsable", "answer_format_instruction", "output_budget", "few_shot"),
    "wrong_answer": ("few_shot", "self_consistency", "answer_format_instruction"),
    **AGENT_RANKING,
}


CLOSED_FORM_TYPES = frozenset({"off_format", "invalid_choice", "truncated", "empty_output", "wrong_answer"})


@dataclass
class Ranking:
    """The operators to try for a cluster, best first, adjusted by its evidence, each with why it
    stands where it does (shown to an LLM Proposer, which otherwise sees only a catalogue)."""

    names: list[str] = field(default_factory=list)
    reasons: dict[str, str] = field(default_factory=dict)

    def first(self, name: str, why: str, at: int = 0) -> None:
        """Move (or insert) `name` to position `at`, for the reason `why`."""
        if name in self.names:
            self.names.remove(name)
        self.names.insert(min(at, len(self.names)), name)
        self.reasons[name] = why

    @staticmethod
    def for_cluster(cluster: Cluster) -> "Ranking":
        table = RANKING.get(cluster.type, ())
        out = Ranking(list(table), {n: f"a usual repair for {cluster.type} failures" for n in table})
        names, n = out.names, len(cluster.failures)
        omitted = sum(1 for f in cluster.failures if f.detail.get("prompt_omits"))
        if cluster.failures and omitted * 2 >= n:
            # The model was not asked the whole task: no extraction or budget fixes that.
            out.first("whole_task_in_prompt", f"the prompt left part of the task out on {omitted} of {n} failures")
        if cluster.type == "off_format" and names:
            found = sum(1 for f in cluster.failures if f.detail.get("shape_in_reply"))
            # Extraction cannot find an answer the reply does not contain; then ask for the form first.
            if found * 2 < n:
                out.first("answer_format_instruction", f"only {found} of {n} replies hold an answer of the "
                          "expected form, so there is little for extraction to find")
        if cluster.type == "unparsable_call" and names:
            cut = sum(1 for f in cluster.failures if f.detail.get("mechanism") == "cut at the token limit")
            # Calls cut off at the token limit need room to finish before they need a format.
            if cut * 2 > n:
                out.first("output_budget", f"{cut} of {n} calls were cut off at the token limit")
        if cluster.type == "call_count" and names:
            silent = sum(1 for f in cluster.failures if f.detail.get("mechanism") == "no call")
            # Calls that are never made need a second look at the functions, not a format.
            if silent * 2 > n:
                out.first("abstain_check", f"{silent} of {n} failures made no call at all")
        if cluster.type == "truncated" and names:
            short = sum(1 for f in cluster.failures if f.shape in ("number", "boolean", "choice"))
            # A reply cut off before a one-word answer is prose, not a long answer: a bigger
            # budget buys more prose (and doubles the cost); asking for the answer's form first
            # is the general repair. Long answers (word lists, text) do need the budget.
            if short * 2 > n:
                out.first("answer_format_instruction", f"{short} of {n} replies were cut off before a "
                          "one-word answer: more room buys more prose")
        closed = sum(1 for f in cluster.failures if f.shape in ("choice", "boolean"))
        if names and cluster.failures and closed * 2 > n and cluster.type in CLOSED_FORM_TYPES:
            # Mostly closed answers (options, yes/no, true/false). With no usable reply at all (cut
            # off, empty), scoring the options needs none and is tried first; where the reply was
            # written but off-format, the cheaper fixes that keep the model's own answer come first
            # and scoring second. A wrong option picked in writing is not what the model ranks
            # highest when asked (Qwen 0.5B on temporal_sequences: 0.000 written, 0.533 scored):
            # scoring comes after worked examples and before 5-sample voting, which costs 4 calls more.
            place = {"truncated": 0, "empty_output": 0, "wrong_answer": 1}.get(cluster.type, 1)
            out.first("option_scoring", f"{closed} of {n} answers are closed (options, yes/no): scoring "
                      "each option needs no usable written reply", at=place)
        probed = (cluster.probe or {}).get("operator")
        if probed:
            # The repair the recoverability probe saw bring these failures back comes first.
            right = len((cluster.probe.get("right") or {}).get(probed) or ())
            members = len((cluster.probe.get("probed") or {}).get(probed) or cluster.probe.get("members") or ())
            pooled = len(cluster.probe.get("recovered") or ()) - right
            also = f" (and {pooled} more in earlier probes)" if pooled > 0 else ""
            out.first(probed, f"the recoverability probe brought {right} of {members} of these failures back "
                      f"right with it on {cluster.probe.get('model', 'the probed model')}{also}")
        return out
