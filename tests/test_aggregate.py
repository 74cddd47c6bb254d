"""Cross-instance aggregation on the planted world (see tests/diagnosis_fixtures.py), whose truth is
known: the pattern planted across all categories and both models must come out as ONE
harness-level cluster, the one planted for `beta` only as model-specific, the single slip as noise.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from diagnosis_fixtures import M_REPLY, planted_batch
from ecdysis.aggregate import (AgglomerativeTfidf, BatchContext, Cluster, ClusterEvidence, HdbscanTfidf, ModelRate,
                               SystematicityScore, ThresholdVerdicts, aggregate)
from ecdysis.failures import Failure, extract_failures

BENCH = Path(__file__).resolve().parent.parent / "bench" / "cluster_scale.py"


@pytest.mark.parametrize("policy", [AgglomerativeTfidf(), HdbscanTfidf()], ids=lambda p: p.name)
def test_planted_patterns_get_the_true_verdicts(policy) -> None:
    failures, batch = planted_batch()
    clusters = aggregate(failures, batch, clustering=policy)
    assert [c.verdict for c in clusters] == ["harness-level", "model-specific", "noise"]
    shared, quirk, slip = clusters
    assert shared.id == "c1" and shared.size == 30
    assert set(shared.categories) == {"arithmetic", "dates", "word-sorting", "object-counting", "boolean"}
    assert shared.models == {"alpha": 15, "beta": 15}
    assert "2 of 2 models" in shared.reason
    assert quirk.models == {"beta": 10} and all(f.raw_output == M_REPLY for f in quirk.failures)
    assert "Specific to beta" in quirk.reason and "alpha ran 10 of them and showed it on 0" in quirk.reason
    assert quirk.rates["alpha"].passed == 10
    assert slip.size == 1 and slip.reason.startswith("Singleton")
    assert shared.systematicity > quirk.systematicity > slip.systematicity


def test_one_model_batch_says_cross_model_evidence_is_unavailable() -> None:
    failures, batch = planted_batch(models=("alpha",))
    clusters = aggregate(failures, batch)
    assert clusters[0].verdict == "harness-level"
    assert "Cross-model evidence unavailable (only one model was run: alpha)" in clusters[0].reason
    assert clusters[0].components["models"] is None  # dropped, not counted as zero


def test_systematicity_formula_and_prior_recurrence() -> None:
    failures, batch = planted_batch()
    first = aggregate(failures, batch)
    shared = first[0]
    parts = shared.components
    assert parts["prior"] is None
    weights = SystematicityScore()
    expected = (weights.instance * parts["instances"] + weights.category * parts["categories"]
                + weights.model * parts["models"] + weights.consistency * parts["consistency"]) / (
        weights.instance + weights.category + weights.model + weights.consistency)
    assert shared.systematicity == pytest.approx(expected, abs=1e-3)
    again = aggregate(failures, batch, previous_clusters=[first])
    assert again[0].components["prior"] == 1.0
    unrelated = aggregate(failures, batch, previous_clusters=[[first[2]]])  # only the wrong-answer slip
    assert unrelated[0].components["prior"] == 0.0
    assert again[0].systematicity > unrelated[0].systematicity
    for c in again:
        assert 0.0 <= c.systematicity <= 1.0


def evidence(**overrides) -> ClusterEvidence:
    base = dict(n_failures=6, n_instances=6, categories=3, batch_categories=5, batch_instances=20,
                batch_models=["a", "b"], rates={"a": ModelRate(3, 6, 3, 0), "b": ModelRate(3, 6, 3, 0)},
                consistency=0.9, prior=None)
    base.update(overrides)
    return ClusterEvidence(**base)


@pytest.mark.parametrize("ev, verdict, needle", [
    (evidence(n_failures=1, n_instances=1), "noise", "Singleton"),
    (evidence(n_failures=3, n_instances=3, consistency=0.2), "noise", "inconsistent"),
    (evidence(rates={"a": ModelRate(6, 6, 0, 0), "b": ModelRate(1, 6, 5, 0)}), "model-specific", "Specific to a"),
    (evidence(rates={"a": ModelRate(6, 6, 0, 0), "b": ModelRate(0, 6, 2, 0, kin=4)}), "harness-level",
     "worded differently"),
    (evidence(), "harness-level", "Shared by 2 of 2 models"),
    (evidence(batch_models=["a"], rates={"a": ModelRate(6, 6, 0, 0)}, categories=1), "noise", "too narrowly"),
    (evidence(batch_models=["a"], rates={"a": ModelRate(6, 6, 0, 0)}), "harness-level", "only one model was run"),
    # Well-formed wrong answers of one model agree only on an answer shape: not the harness's
    # without a second model or a probe that the replies hold the right answer.
    (evidence(batch_models=["a"], rates={"a": ModelRate(6, 6, 0, 0)}, failure_type="wrong_answer", recoverable=0.0),
     "noise", "Not attributable to the harness"),
    (evidence(batch_models=["a"], rates={"a": ModelRate(6, 6, 0, 0)}, failure_type="wrong_answer", recoverable=0.67),
     "harness-level", "only one model was run"),
    (evidence(failure_type="wrong_answer", recoverable=0.0), "harness-level", "Shared by 2 of 2 models"),
    # Model-specific needs another model that passes: b failed the same instances another way
    # (passed 0, failed 7 otherwise), so it cannot tell a's quirk from a harness fault.
    (evidence(rates={"a": ModelRate(6, 6, 0, 0), "b": ModelRate(0, 6, 0, 6)}), "noise", "no other model passes"),
    (evidence(rates={"a": ModelRate(6, 6, 0, 0), "b": ModelRate(0, 6, 2, 4)}), "noise", "passed 2 of the 6"),
    # A reply cut at max_tokens is the harness's (the budget is its setting), even for one model.
    (evidence(rates={"a": ModelRate(6, 6, 0, 0), "b": ModelRate(0, 6, 6, 0)}, failure_type="truncated"),
     "harness-level", "the budget is a harness setting"),
])
def test_verdict_policy_branches(ev: ClusterEvidence, verdict: str, needle: str) -> None:
    score, _ = SystematicityScore().score(ev)
    got, reason = ThresholdVerdicts().judge(ev, score)
    assert got == verdict and needle in reason, reason


def test_cluster_json_round_trip() -> None:
    failures, batch = planted_batch()
    for cluster in aggregate(failures, batch):
        data = cluster.to_json()
        assert {"id", "size", "label", "instances", "categories", "models", "systematicity", "verdict",
                "evidence", "reason"} <= set(data)
        assert Cluster.from_json(data).to_json() == data


def _bench():
    spec = importlib.util.spec_from_file_location("cluster_scale", BENCH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_clustering_scales_to_thousands_of_failures() -> None:
    bench = _bench()
    failures, batch = bench.synthetic_batch(3000, seed=1)
    clusters = aggregate(failures, batch)  # how long it takes is bench/cluster_scale.py's to measure
    assert sum(c.size for c in clusters) == 3000
    # The synthetic batch plants one shared pattern per failure type; each must dominate a cluster.
    assert {c.type for c in clusters if c.verdict == "harness-level"} >= {"off_format", "truncated"}


OPENERS = {"arithmetic": "Sure thing, happy to help.", "dates": "Let me see what I can find.",
           "word-sorting": "Okay! Working on it now.", "object-counting": "Here you go, friend:",
           "boolean": "Well, that is interesting."}


def varied_wording_batch() -> tuple[list[Failure], BatchContext]:
    """One mechanism (the answer sits on the reply's second line), worded differently per category:
    text similarity alone splits it into five small parts."""
    from diagnosis_fixtures import answer_form, planted_suite, result_for
    suite = planted_suite()
    by_id = {i.id: i for i in suite.instances}
    results = []
    for inst in suite.instances:
        if inst.split != "train":
            continue
        index = int(inst.id.rsplit("-", 1)[1])
        reply = f"{OPENERS[inst.category]}\n{answer_form(inst)}" if index <= 2 else answer_form(inst)
        results.append(result_for("run-alpha", "alpha", inst, reply))
    failures = extract_failures(results, by_id, suite=suite.name, harness_version="h")
    return failures, BatchContext.build([(suite.name, r) for r in results], failures)


def test_same_mechanism_in_different_words_is_merged_into_one_harness_level_cluster() -> None:
    failures, batch = varied_wording_batch()
    assert len(failures) == 15
    split = aggregate(failures, batch, merge=None)
    assert all(c.verdict != "harness-level" for c in split)  # without the merge: five small parts
    merged = aggregate(failures, batch)
    harness = [c for c in merged if c.verdict == "harness-level"]
    assert len(harness) == 1
    assert harness[0].size == 15 and len(harness[0].categories) == 5
    assert "merged from" in harness[0].reason and "well-formed answer is in the reply" in harness[0].label


def one_model_off_format_batch() -> tuple[list[Failure], BatchContext]:
    """alpha puts the answer on a second line after an opener worded per category, on two train
    instances of arithmetic and two of object counting; beta ran the same instances and answered them wrong
    (well-formed), so no model passes where alpha fails: cross-model evidence cannot attribute it.
    (Seen on BIG-Bench Hard, seed 13: SmolLM2's off-format answers in two tasks, 2 + 2 instances.)"""
    from diagnosis_fixtures import answer_form, planted_suite, result_for
    suite = planted_suite()
    picked: set[str] = set()
    for category in ("arithmetic", "object-counting"):
        picked |= set(sorted(i.id for i in suite.instances if i.split == "train" and i.category == category)[:2])
    results = []
    for inst in suite.instances:
        if inst.split != "train":
            continue
        alpha = f"{OPENERS[inst.category]}\n{answer_form(inst)}" if inst.id in picked else answer_form(inst)
        beta = str(int(inst.target) + 1) if inst.id in picked else answer_form(inst)
        results += [result_for("run-alpha", "alpha", inst, alpha), result_for("run-beta", "beta", inst, beta)]
    by_id = {i.id: i for i in suite.instances}
    failures = extract_failures(results, by_id, suite=suite.name, harness_version="h")
    return failures, BatchContext.build([(suite.name, r) for r in results], failures)


def test_a_one_model_union_too_small_in_parts_is_kept_for_the_probe() -> None:
    """Two sub-patterns of one mechanism, each on two instances, are each under the probe's size;
    their union (four instances, two categories, alpha alone) is not attributable on counts, but
    the recoverability probe can ask the harness about it, so it replaces its parts, as noise until
    a probe says otherwise."""
    from ecdysis.probe import wants_probe
    failures, batch = one_model_off_format_batch()
    split = [c for c in aggregate(failures, batch, merge=None) if c.type == "off_format"]
    assert len(split) == 2 and all(len(c.instances) == 2 for c in split)
    assert not any(wants_probe(c) for c in split)  # each too small to ask about
    [union] = [c for c in aggregate(failures, batch) if c.type == "off_format"]
    assert len(union.instances) == 4 and len(union.categories) == 2 and set(union.models) == {"alpha"}
    assert union.verdict == "noise" and "merged from 2 smaller sub-patterns" in union.reason, union.reason
    assert "well-formed answer is in the reply" in union.label and wants_probe(union)


def test_a_part_the_probe_can_see_is_not_diluted_in_a_union() -> None:
    """alpha's off-format answers: three arithmetic instances in one wording (a part the probe can
    ask about as it is) and one instance each of three other categories, each worded its own way.
    Only the three single-instance parts are joined for the probe; the arithmetic part stays
    itself. (On BIG-Bench Hard seed 15 a union that swallowed a three-instance part was probed on
    other members, and the repair the part alone would have led to was lost.)"""
    from diagnosis_fixtures import answer_form, planted_suite, result_for
    suite = planted_suite()
    train = [i for i in suite.instances if i.split == "train"]
    picked = set(sorted(i.id for i in train if i.category == "arithmetic")[:3])
    picked |= {sorted(i.id for i in train if i.category == c)[0] for c in ("object-counting", "dates", "boolean")}
    results = []
    for inst in train:
        alpha = f"{OPENERS[inst.category]}\n{answer_form(inst)}" if inst.id in picked else answer_form(inst)
        beta = "" if inst.id in picked else answer_form(inst)  # beta fails them too, another way
        results += [result_for("run-alpha", "alpha", inst, alpha), result_for("run-beta", "beta", inst, beta)]
    failures = extract_failures(results, {i.id: i for i in suite.instances}, suite=suite.name, harness_version="h")
    batch = BatchContext.build([(suite.name, r) for r in results], failures)
    off = sorted((c for c in aggregate(failures, batch) if c.type == "off_format"), key=lambda c: len(c.categories))
    assert [(len(c.instances), len(c.categories)) for c in off] == [(3, 1), (3, 3)], [c.label for c in off]
    assert "merged from 3 smaller sub-patterns" in off[1].reason and "merged" not in off[0].reason


def test_unrelated_slips_are_not_merged() -> None:
    failures, batch = planted_batch(patterns={"noise"})
    merged = aggregate(failures, batch)
    assert all(c.verdict == "noise" for c in merged)


def test_the_recoverability_probe_matches_whole_words_only() -> None:
    """The right answer counts as stated in a reply only as a whole word: "8" is not in "$288",
    nor "plausible" in "implausible"."""
    from ecdysis.aggregate import _recoverable

    def wrong(target: str, raw: str) -> Failure:
        return Failure(run_id="r", suite="s", instance_id=raw[:8], category="c", split="train", model="m",
                       harness_version="h", type="wrong_answer", excerpt="", signature="", answer="x",
                       target=target, shape="text", raw_output=raw)
    assert _recoverable([wrong("8", "It costs $288."), wrong("plausible", "The statement is implausible.")]) == 0.0
    assert _recoverable([wrong("8", "Maybe 7, or 8."), wrong("plausible", "Plausible, I think.")]) == 1.0


def test_replies_cut_at_the_same_limit_split_by_mechanism() -> None:
    """Two models cut at the same token limit on the same instances, one while reasoning and one
    while copying the question back: two clusters, each named by its mechanism, not one
    'truncated' cluster that mixes them."""
    from ecdysis.records import InstanceResult, ModelCall
    from ecdysis.runner import pick_instances
    from ecdysis.suites import load_suite
    suite = load_suite("reasoning-mix")
    chosen = pick_instances(suite, "train", 10)
    prose = "Let me think this through carefully, one step at a time, before I commit to anything final"
    results = []
    for inst in chosen:
        for model, text in (("alpha", prose), ("beta", inst.input)):
            call = ModelCall(seq=0, model=model, request={"max_tokens": 24}, text=text, prompt_tokens=60,
                             completion_tokens=24, latency_s=0.1, finish_reason="length", cache_hit=False)
            results.append(InstanceResult(run_id=f"r-{model}", instance_id=inst.id, category=inst.category,
                                          model=model, answer="", target=inst.target, correct=False, score=0.0,
                                          calls=[call]))
    failures = extract_failures(results, {i.id: i for i in chosen}, suite=suite.name, harness_version="h")
    assert {f.type for f in failures} == {"truncated"}
    assert {f.model: f.detail["mechanism"] for f in failures} == {"alpha": "prose without an answer",
                                                                  "beta": "echoes the task"}
    clusters = aggregate(failures, BatchContext.build([(suite.name, r) for r in results], failures))
    assert sorted((tuple(c.models), c.size) for c in clusters) == [(("alpha",), 10), (("beta",), 10)]
    labels = {next(iter(c.models)): c.label for c in clusters}
    assert "echoes the task" in labels["beta"] and "prose without an answer" in labels["alpha"]


def test_reply_mechanisms_read_from_the_text() -> None:
    from ecdysis.failures import reply_mechanism
    from ecdysis.records import Instance
    inst = Instance(id="i", input="Which city is the capital of France, Paris or Lyon?", target="Paris",
                    choices=("Paris", "Lyon"))
    assert reply_mechanism("", inst) == "blank reply"
    assert reply_mechanism("Which city is the capital of France, Paris or Lyon? Which city is", inst) == "echoes the task"
    assert reply_mechanism("I need to check.\nI need to check.\nI need to check.\nI need", inst) == "repeats itself"
    assert reply_mechanism("France has many cities; its government sits in the north, so", inst) == \
        "prose without an answer"
