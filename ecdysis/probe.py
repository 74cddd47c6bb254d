"""The recoverability probe: evidence that a cluster one model shows is the harness's to repair.

Aggregation calls a cluster harness-level when two models show it. A cluster only one model shows
is, on that evidence alone, the model's quirk or unattributable, and gets no patch. But the
harness may still be what fails there: on a mixture of four BIG-bench tasks, Qwen 0.5B's wrong
answers formed clusters SmolLM2 did not share, and worked examples in the prompt took validation
from 0.43 to 0.82. The probe asks the harness itself. The cluster's first catalogue repairs that
add no model call are applied in turn and run on a few of its failures, with the model that
failed them; when one repair brings failures back and loses far fewer of the model's passing
instances, the cluster is harness-level on that evidence, and its reason says which repair, which
instances, on which model (a person can rerun it).

What counts as evidence is two things a person can rerun. The repair brings back at least
`MIN_RECOVERED` distinct failures of that model: on this probe, or pooled with earlier probes of the
very same patched harness on the same model (a cached, deterministic model answers a failure the
same way on every batch, so those results still hold). A repair that has brought back some
failures, but fewer than that, is run at once on up to `PROBE_MORE` further failures of the cluster
not asked about before: a sequential sample, which spends a few calls of this batch on a signal
instead of waiting batches for the draw to come back to it. And the repair is also run on `GUARDS`
of the model's passing train instances (pooled the same way), and must bring back more than twice
as many failures as it loses of those, the gate's own rule: a repair that scrambles answers loses passing
ones as readily as it brings back failing ones, and is not the harness's fix. How much the repair
is worth is not the probe's question: screening on the batch and the paired gate on validation
weigh that. Asking for "most of three" instead measured how often a repair helps, not whether it
can: on BFCL it passed a call-format instruction that lost 17 validation instances for 4 (it loses
all three of Qwen's passing guards) and missed, by the draw, a schema check that won 11 for none,
which brought back one SmolLM2 failure in ten.

The probe runs on train instances only, never on validation or test instances, and each of its
calls goes through the cache and the budget like any smoke run."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

from ecdysis.aggregate import MECHANISM_TYPES, PROBE_MIN_INSTANCES, Cluster, PriorityOrder, evidence_key
from ecdysis.errors import EcdysisError
from ecdysis.failures import AGENT_TYPES, MULTI_TURN_TYPES
from ecdysis.harness import harness_id
from ecdysis.records import Instance
from ecdysis.refine import SmokeRunner, expected_calls, spread, train_failures
from ecdysis.roles.base import Exemplar
from ecdysis.roles.drafting import ProposalError
from ecdysis.roles.operators import OPERATORS
from ecdysis.roles.ranking import Ranking
from ecdysis.roles.repairs import RepairInput

PROBE_SIZE = 3        # failures of the cluster each repair is run on
PROBE_MORE = 3        # further failures it is run on when the first bring back some, but too few
MIN_RECOVERED = 2     # distinct failures a repair must bring back, this probe and earlier ones pooled
GUARDS = 3            # passing train instances of the model a repair is also run on before it is promoted
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
                   earlier: Sequence[Cluster] = (),
                   passed: Mapping[str, Sequence[str]] | None = None) -> list[Cluster]:
    """`clusters` with each one that `wants_probe` probed (promoted to harness-level when a repair
    brings back enough failures and few enough guards are lost), in priority order again. `earlier`: clusters
    of earlier iterations, whose probes' members each repair is not run on again while others are
    left, and whose results pool with this one's for the same patched harness and model. `passed`:
    per model, the keys of the batch's instances it got right (the guards are drawn from them)."""
    asked = asked_before(earlier)
    pooled = pooled_evidence(earlier)
    out: list[Cluster] = []
    for cluster in clusters:
        if wants_probe(cluster):
            cluster = probe(cluster, files, exemplars, instances, runner_for, asked, pooled, passed)
            for key, found in pooled_evidence([cluster]).items():  # a later cluster of this batch pools it too
                pooled.setdefault(key, Pooled()).add(found)
        out.append(cluster)
    return PriorityOrder().order(out)


def asked_before(clusters: Sequence[Cluster]) -> dict[str, set[str]]:
    """Per repair, the instance keys earlier probes ran it on (a cluster's `probe["probed"]`)."""
    asked: dict[str, set[str]] = {}
    for cluster in clusters:
        for name, keys in (cluster.probe or {}).get("probed", {}).items():
            asked.setdefault(name, set()).update(keys)
    return asked


@dataclass
class Pooled:
    """What probes of one patched harness on one model found: the failures it brought back, and
    the passing instances it kept right or lost."""

    right: set[str] = field(default_factory=set)
    kept: set[str] = field(default_factory=set)
    lost: set[str] = field(default_factory=set)

    def add(self, other: "Pooled") -> None:
        self.right |= other.right
        self.kept |= other.kept
        self.lost |= other.lost


def pooled_evidence(clusters: Sequence[Cluster]) -> dict[tuple[str, str], Pooled]:
    """The probes' results per (model, `harness_id` of the patched harness's files)."""
    out: dict[tuple[str, str], Pooled] = {}
    for cluster in clusters:
        record = cluster.probe or {}
        for name, digest in (record.get("patched") or {}).items():
            guards = (record.get("guards") or {}).get(name) or {}
            out.setdefault((str(record.get("model")), digest), Pooled()).add(Pooled(
                right=set((record.get("right") or {}).get(name) or ()),
                kept=set(guards.get("kept") or ()), lost=set(guards.get("lost") or ())))
    return out


def probe(cluster: Cluster, files: Mapping[str, str], exemplars: Sequence[Exemplar],
          instances: Mapping[str, Instance], runner_for: Callable[[str], SmokeRunner],
          asked: Mapping[str, set[str]] | None = None, pooled: Mapping[tuple[str, str], Pooled] | None = None,
          passed: Mapping[str, Sequence[str]] | None = None) -> Cluster:
    model = max(cluster.models.items(), key=lambda kv: (kv[1], kv[0]))[0]
    failures = train_failures(cluster, instances, model)
    asked, pooled = asked or {}, pooled or {}
    members = spread(failures, PROBE_SIZE)
    if len(members) < 2:
        return cluster
    try:
        runner = runner_for(model)
    except EcdysisError:  # a model this process cannot reach (a stored run of a remote model, no key)
        return cluster
    guards = [(k, instances[k]) for k in dict.fromkeys((passed or {}).get(model, ()))
              if k in instances and instances[k].split == "train"]
    tried: list[str] = []
    record: dict[str, Any] = {"model": model, "members": [k for k, _ in members], "right": {}}
    unread = _answer_in_reply(cluster)
    for name, patched in _repairs(cluster, files, exemplars):
        # A repair of reading asks the model what the batch asked: it is probed on every failure of
        # the cluster's model, replaying requests paid for already; another on `PROBE_SIZE` of them.
        members = failures if reads_only(name) else spread(failures, PROBE_SIZE, asked.get(name, set()))
        right, read = runner.right_and_read(patched, members)
        digest = harness_id(patched)
        before = pooled.get((model, digest), Pooled())
        if not reads_only(name) and 0 < len(right) + len(before.right - set(right)) < MIN_RECOVERED:
            # One failure brought back is a signal short of evidence: ask the batch's other failures
            # of the cluster now, once, rather than wait for later batches to draw them.
            seen = asked.get(name, set()) | {k for k, _ in members}
            more = spread([f for f in failures if f[0] not in seen], PROBE_MORE)
            if more:
                also, _ = runner.right_and_read(patched, more)
                right, members = [*right, *also], [*members, *more]
        record["right"][name] = right
        record.setdefault("probed", {})[name] = [k for k, _ in members]
        record.setdefault("patched", {})[name] = digest
        earlier = sorted(before.right - set(right))
        readable = unread and reads_only(name) and len(read) >= 2 and 2 * len(read) > len(members)
        if unread and reads_only(name):
            record.setdefault("read", {})[name] = read
        shown = f"{name} {len(right)}/{len(members)}" + (f" (+{len(earlier)} earlier)" if earlier else "")
        if not readable and len(right) + len(earlier) < MIN_RECOVERED:
            tried.append(shown)
            continue
        kept, lost = _guard(runner, patched, guards, before)
        record.setdefault("guards", {})[name] = {"kept": kept, "lost": lost}
        brought = len(read) if readable else len(right) + len(earlier)
        if brought <= 2 * len(lost):
            tried.append(f"{shown}, but it lost {len(lost)} of {len(kept) + len(lost)} passing instances "
                         f"({', '.join(lost)})")
            continue
        held = (f", and {len(kept)} of the {len(kept) + len(lost)} passing train instances of {model} it was "
                f"also run on stay right" if kept or lost else
                f"; no passing train instance of {model} was there to check it against")
        if readable:
            # The fault is the harness's reading of a well-formed answer the reply holds: that it
            # can read it is the evidence. Whether the answer is right is the model's, and
            # screening and the gate weigh what reading it is worth.
            reason = (f"Readable by the harness: with {name}, {len(read)} of {len(members)} of these failures "
                      f"on {model} now give an answer of the task's form, {len(right)} of them right{held} "
                      f"(probe). Before the probe: {cluster.reason}")
            evidence = [f"probe: {name} on {model}: {', '.join(read)} read"]
        else:
            also = (f", and {len(earlier)} more in earlier probes of the same patched harness "
                    f"({', '.join(earlier)})" if earlier else "")
            reason = (f"Recoverable by the harness: with {name}, {len(right)} of {len(members)} of these failures "
                      f"on {model} come back right{also}{held} (probe). Before the probe: {cluster.reason}")
            evidence = [f"probe: {name} on {model}: {', '.join(sorted(set(right) | set(earlier)))} right"]
        if kept:
            evidence.append(f"probe: {name} on {model}: {', '.join(kept)} still right")
        return dataclasses.replace(cluster, verdict="harness-level", reason=reason,
                                   evidence=evidence + list(cluster.evidence),
                                   probe={**record, "operator": name, "recovered": sorted(set(right) | set(earlier))})
    if not tried:
        return cluster
    return dataclasses.replace(cluster, probe=record, reason=f"{cluster.reason} Probe on {model}'s failures: "
                               f"{'; '.join(tried)} came back right: not the harness's on that evidence "
                               f"({MIN_RECOVERED} failures brought back, and more than twice as many as the "
                               f"passing instances it loses, would be).")


def _guard(runner: SmokeRunner, patched: Mapping[str, str], passing: Sequence[tuple[str, Instance]],
           before: Pooled) -> tuple[list[str], list[str]]:
    """(kept, lost): of up to `GUARDS` passing train instances of the model (fewer where the batch
    has fewer), those the patched harness still gets right and those it loses, counting what earlier
    probes of the same patched harness found: only the guards still missing are run."""
    done = before.kept | before.lost
    fresh = spread([g for g in passing if g[0] not in done], max(0, GUARDS - len(done)))
    right, _ = runner.right_and_read(dict(patched), fresh) if fresh else ([], [])
    return sorted(before.kept | set(right)), sorted(before.lost | ({k for k, _ in fresh} - set(right)))


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
