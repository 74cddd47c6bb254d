"""The recoverability probe: evidence that a cluster one model shows is the harness's to repair.

Aggregation calls a cluster harness-level when two models show it. A cluster only one model shows
is, on that evidence alone, the model's quirk or unattributable, and gets no patch. But the
harness may still be what fails there: on a mixture of four BIG-bench tasks, Qwen 0.5B's wrong
answers formed clusters SmolLM2 did not share, and worked examples in the prompt took validation
from 0.43 to 0.82. The probe asks the harness itself. The cluster's first catalogue repairs that
add no model call are applied in turn and run on a few of its failures, with the model that
failed them; when one repair gets most of them right, the cluster is harness-level on that
evidence, and its reason says which repair, how many, on which model (a person can rerun it).

The probe runs on train failures only, never on validation or test instances, and each of its
calls goes through the cache and the budget like any smoke run."""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Mapping, Sequence

from ecdysis.aggregate import MECHANISM_TYPES, PROBE_MIN_INSTANCES, Cluster, PriorityOrder, evidence_key
from ecdysis.errors import EcdysisError
from ecdysis.failures import AGENT_TYPES, MULTI_TURN_TYPES
from ecdysis.records import Instance
from ecdysis.refine import SmokeRunner, expected_calls, spread, train_failures
from ecdysis.roles.base import Exemplar
from ecdysis.roles.drafting import ProposalError
from ecdysis.roles.operators import OPERATORS
from ecdysis.roles.ranking import Ranking
from ecdysis.roles.repairs import RepairInput

PROBE_SIZE = 3        # failures of the cluster each repair is run on
PROBE_OPERATORS = 2   # catalogue repairs tried per cluster, best ranked first
MIN_INSTANCES = PROBE_MIN_INSTANCES  # a smaller cluster is noise whatever a probe says
PROBED_TYPES = frozenset({"off_format", "invalid_choice", "truncated", "empty_output", "wrong_answer",
                          *AGENT_TYPES, *MULTI_TURN_TYPES})


def wants_probe(cluster: Cluster) -> bool:
    """A cluster that recurs but that one model alone shows: not harness-level, at least
    `MIN_INSTANCES` instances, a failure type a catalogue repair addresses."""
    showing = [m for m, r in cluster.rates.items() if r.ran and r.hit]
    return (cluster.verdict != "harness-level" and cluster.type in PROBED_TYPES
            and len(cluster.instances) >= MIN_INSTANCES and len(showing) <= 1)


def probe_clusters(clusters: Sequence[Cluster], files: Mapping[str, str], exemplars: Sequence[Exemplar],
                   instances: Mapping[str, Instance], runner_for: Callable[[str], SmokeRunner],
                   earlier: Sequence[Cluster] = ()) -> list[Cluster]:
    """`clusters` with each one that `wants_probe` probed (promoted to harness-level when a repair
    recovers most of the failures probed), in priority order again. `earlier`: clusters of earlier
    iterations, whose probes' members each repair is not run on again while others are left."""
    asked = asked_before(earlier)
    out = [probe(c, files, exemplars, instances, runner_for, asked) if wants_probe(c) else c for c in clusters]
    return PriorityOrder().order(out)


def asked_before(clusters: Sequence[Cluster]) -> dict[str, set[str]]:
    """Per repair, the instance keys earlier probes ran it on (a cluster's `probe["probed"]`)."""
    asked: dict[str, set[str]] = {}
    for cluster in clusters:
        for name, keys in (cluster.probe or {}).get("probed", {}).items():
            asked.setdefault(name, set()).update(keys)
    return asked


def probe(cluster: Cluster, files: Mapping[str, str], exemplars: Sequence[Exemplar],
          instances: Mapping[str, Instance], runner_for: Callable[[str], SmokeRunner],
          asked: Mapping[str, set[str]] | None = None) -> Cluster:
    model = max(cluster.models.items(), key=lambda kv: (kv[1], kv[0]))[0]
    failures = train_failures(cluster, instances, model)
    asked = asked or {}
    members = spread(failures, PROBE_SIZE)
    if len(members) < 2:
        return cluster
    try:
        runner = runner_for(model)
    except EcdysisError:  # a model this process cannot reach (a stored run of a remote model, no key)
        return cluster
    tried: list[str] = []
    record: dict[str, Any] = {"model": model, "members": [k for k, _ in members], "right": {}}
    unread = _answer_in_reply(cluster)
    for name, patched in _repairs(cluster, files, exemplars):
        # A repair of reading asks the model what the batch asked: it is probed on every failure of
        # the cluster's model, replaying requests paid for already; another on `PROBE_SIZE` of them.
        members = failures if reads_only(name) else spread(failures, PROBE_SIZE, asked.get(name, set()))
        right, read = runner.right_and_read(patched, members)
        tried.append(f"{name} {len(right)}/{len(members)}")
        record["right"][name] = right
        record.setdefault("probed", {})[name] = [k for k, _ in members]
        if unread and reads_only(name):
            record.setdefault("read", {})[name] = read
            if len(read) >= 2 and 2 * len(read) > len(members):
                # The fault is the harness's reading of a well-formed answer the reply holds: that it
                # can read it is the evidence. Whether the answer is right is the model's, and
                # screening and the gate weigh what reading it is worth.
                reason = (f"Readable by the harness: with {name}, {len(read)} of {len(members)} of these failures "
                          f"on {model} now give an answer of the task's form, {len(right)} of them right "
                          f"(probe). Before the probe: {cluster.reason}")
                evidence = [f"probe: {name} on {model}: {', '.join(read)} read"] + list(cluster.evidence)
                return dataclasses.replace(cluster, verdict="harness-level", reason=reason, evidence=evidence,
                                           probe={**record, "operator": name})
        if len(right) >= 2 and 2 * len(right) > len(members):
            reason = (f"Recoverable by the harness: with {name}, {len(right)} of {len(members)} of these failures "
                      f"on {model} come back right (probe). Before the probe: {cluster.reason}")
            evidence = [f"probe: {name} on {model}: {', '.join(right)} right"] + list(cluster.evidence)
            return dataclasses.replace(cluster, verdict="harness-level", reason=reason, evidence=evidence,
                                       probe={**record, "operator": name})
    if not tried:
        return cluster
    return dataclasses.replace(cluster, probe=record, reason=f"{cluster.reason} Probe on {model}'s failures: "
                               f"{'; '.join(tried)} came back right, too few to call it the harness's.")


def _answer_in_reply(cluster: Cluster) -> bool:
    """Whether most of an off-format (or invalid-choice) cluster's replies hold a well-formed answer
    that the harness did not read (`aggregate.evidence_key`)."""
    if cluster.type not in MECHANISM_TYPES or not cluster.failures:
        return False
    held = sum(evidence_key(f) == "a well-formed answer is in the reply" for f in cluster.failures)
    return 2 * held > len(cluster.failures)


def reads_only(name: str | None) -> bool:
    """A repair that rebinds only `extract_answer`: it cannot change what the model is asked, only
    how its reply is read (answer extraction, choice matching)."""
    return tuple(getattr(OPERATORS.get(name), "needs", ())) == ("extract_answer",)


def _repairs(cluster: Cluster, files: Mapping[str, str],
             exemplars: Sequence[Exemplar]) -> list[tuple[str, dict[str, str]]]:
    """The cluster's first `PROBE_OPERATORS` catalogue repairs that apply, are not in the harness
    yet and add no model call (a probe of voting would cost five calls a member), with their files;
    then every other repair of reading that applies (`reads_only`): it asks the model nothing the
    batch did not ask, so probing it costs no call."""
    out: list[tuple[str, dict[str, str]]] = []
    calls = expected_calls(files)
    for name in Ranking.for_cluster(cluster).names:
        if len(out) >= PROBE_OPERATORS and not reads_only(name):
            continue
        op = OPERATORS.get(name)
        inp = RepairInput(files, cluster, exemplars)
        if op is None or op.present(files) or op.unavailable(inp):
            continue
        try:
            patched = {**files, **op.apply(inp).files}
        except (ProposalError, KeyError, ValueError):
            continue
        if expected_calls(patched) > calls:
            continue
        out.append((name, patched))
    return out
