"""Batch-level cross-instance failure aggregation: the failures of a whole batch (several runs and
models at once) are clustered by type and text similarity, scored for systematicity and judged.

Verdicts are `harness-level` (recurs across instances, categories and models: repair the harness),
`model-specific` (one model's quirk, contrasted with another model on the same instances: no patch)
or `noise` (too small or inconsistent to act on). Every policy here is a small named class.

scikit-learn and SciPy are imported where a batch is clustered, not at the top: they take about a
second to import, which every light CLI command and the app's first page would pay otherwise.
"""

from __future__ import annotations

import math
import re
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING, Any, Iterable, Literal, Mapping, Protocol, Sequence

import numpy as np

if TYPE_CHECKING:
    from scipy import sparse

from ecdysis.failures import AGENT_TYPES, FAILURE_TITLES, MULTI_TURN_TYPES, Failure
from ecdysis.records import InstanceResult

Verdict = Literal["harness-level", "model-specific", "noise"]
VERDICT_RANK: dict[str, int] = {"harness-level": 0, "model-specific": 1, "noise": 2}


# ---------------------------------------------------------------- the batch

def load_clustering_stack() -> None:
    """Import scikit-learn and SciPy now. A long-lived process that clusters from several threads
    (the app) calls this once up front: two threads importing one module at the same moment can
    see it half-built."""
    import scipy.sparse  # noqa: F401
    import sklearn.cluster  # noqa: F401
    import sklearn.decomposition  # noqa: F401
    import sklearn.feature_extraction.text  # noqa: F401
    import sklearn.preprocessing  # noqa: F401


@dataclass(frozen=True)
class BatchContext:
    """What the batch attempted, so a cluster's spread and contrast are measured against it.

    `outcomes[model][instance_key]` is "pass" or the failure type that model showed there."""

    outcomes: Mapping[str, Mapping[str, str]]
    categories: Mapping[str, str]

    @cached_property
    def models(self) -> list[str]:
        return sorted(self.outcomes)

    @cached_property
    def instance_keys(self) -> frozenset[str]:
        return frozenset(self.categories)

    @cached_property
    def category_names(self) -> frozenset[str]:
        return frozenset(self.categories.values())

    @cached_property
    def _attempted(self) -> dict[str, frozenset[str]]:
        return {m: frozenset(o) for m, o in self.outcomes.items()}

    def attempted(self, model: str) -> frozenset[str]:
        return self._attempted.get(model, frozenset())

    @staticmethod
    def build(results: Iterable[tuple[str, InstanceResult]], failures: Sequence[Failure]) -> "BatchContext":
        """From (suite name, result) pairs of every run in the batch and their failures."""
        failed = {(f.model, f.key): f.type for f in failures}
        outcomes: dict[str, dict[str, str]] = defaultdict(dict)
        categories: dict[str, str] = {}
        for suite, result in results:
            key = f"{suite}/{result.instance_id}"
            categories[key] = result.category
            outcomes[result.model][key] = "pass" if result.correct else failed.get((result.model, key), "failed")
        return BatchContext(outcomes=dict(outcomes), categories=categories)

    @staticmethod
    def from_failures(failures: Sequence[Failure], passes: Iterable[tuple[str, str, str]] = ()) -> "BatchContext":
        """For tests and benchmarks: the failures plus (model, instance key, category) passes."""
        outcomes: dict[str, dict[str, str]] = defaultdict(dict)
        categories: dict[str, str] = {}
        for f in failures:
            outcomes[f.model][f.key] = f.type
            categories[f.key] = f.category
        for model, key, category in passes:
            outcomes[model].setdefault(key, "pass")
            categories.setdefault(key, category)
        return BatchContext(outcomes=dict(outcomes), categories=categories)


# ---------------------------------------------------------------- clustering policies

# Types whose reply text says nothing about the cause: a reply cut at the token limit, an empty
# answer, or no reply at all. Their text is whatever the model was saying when it stopped, so
# splitting them by text would scatter one systematic cause into many "small" clusters.
TYPE_ONLY: frozenset[str] = frozenset({"truncated", "empty_output", "timeout", "crash", "model_error"})


class ClusteringPolicy(Protocol):
    """Groups the distinct signature texts of one failure type.

    `labels(matrix, counts)` gets l2-normalised TF-IDF rows (one per distinct signature) and how
    many failures share each row, and returns one integer label per row; rows with equal labels
    form one cluster. Deterministic for equal input. Failure types in `type_only` are not split by
    text at all (see `TYPE_ONLY`)."""

    @property
    def name(self) -> str: ...

    @property
    def type_only(self) -> frozenset[str]: ...

    def labels(self, matrix: sparse.csr_matrix, counts: np.ndarray) -> np.ndarray: ...


def _agglomerate(matrix: Any, threshold: float) -> np.ndarray:
    """Average-linkage clustering cut at `threshold`, on distance 1 - (row . row). For unit rows
    that is cosine distance; for raw group centroids it is exactly the average pairwise cosine
    distance between the groups' members, so groups merge as their members would."""
    from scipy import sparse
    from sklearn.cluster import AgglomerativeClustering
    n = matrix.shape[0]
    if n == 1:
        return np.zeros(1, dtype=int)
    sims = matrix @ matrix.T
    dense = sims.toarray() if sparse.issparse(sims) else np.asarray(sims)
    distance = np.clip(1.0 - dense, 0.0, 2.0)
    np.fill_diagonal(distance, 0.0)
    model = AgglomerativeClustering(n_clusters=None, metric="precomputed", linkage="average",
                                    distance_threshold=threshold)
    return model.fit_predict(distance)


def _centroids(matrix: Any, labels: np.ndarray, weights: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Weighted raw centroid per label (rows of the returned array follow `np.unique(labels)`)."""
    from scipy import sparse
    ids, inverse = np.unique(labels, return_inverse=True)
    member = sparse.csr_matrix((weights.astype(float), (inverse, np.arange(len(labels)))),
                               shape=(len(ids), len(labels)))
    totals = np.asarray(member.sum(axis=1)).ravel()
    return ids, np.asarray((sparse.diags(1.0 / totals) @ member @ matrix).todense())


def _explode_loose(labels: np.ndarray, centroids: np.ndarray, ids: np.ndarray, threshold: float) -> np.ndarray:
    """Split groups whose members are on average farther apart than `threshold` back into
    singletons: such a group is an artefact of the summarising step, not a shared pattern."""
    out = labels.copy()
    next_label = int(labels.max()) + 1
    loose = {int(k) for k, c in zip(ids, centroids, strict=True) if 1.0 - float(c @ c) > threshold}
    for i in np.flatnonzero(np.isin(labels, list(loose))):
        out[i], next_label = next_label, next_label + 1
    return out


@dataclass(frozen=True)
class AgglomerativeTfidf:
    """The default: average-linkage agglomerative clustering of TF-IDF vectors, cut at a cosine
    distance. Above `max_exact` distinct signatures the rows are first summarised by mini-batch
    k-means into `max_exact // 2` micro-clusters; loose micro-clusters are split back into
    singletons and the rest are agglomerated by their raw centroids (average linkage between
    groups), so memory stays O(max_exact^2) and 10,000 failures cluster in seconds."""

    distance_threshold: float = 0.6
    max_exact: int = 3000
    type_only: frozenset[str] = TYPE_ONLY
    name: str = "agglomerative-tfidf"

    def labels(self, matrix: sparse.csr_matrix, counts: np.ndarray) -> np.ndarray:
        from sklearn.cluster import MiniBatchKMeans
        n = matrix.shape[0]
        if n <= self.max_exact:
            return _agglomerate(matrix, self.distance_threshold)
        micro = MiniBatchKMeans(n_clusters=self.max_exact // 2, init="random", random_state=0, n_init=1,
                                batch_size=4096, max_iter=10).fit(matrix, sample_weight=counts)
        labels = micro.labels_.astype(int)
        ids, centroids = _centroids(matrix, labels, counts)
        labels = _explode_loose(labels, centroids, ids, self.distance_threshold)
        ids, centroids = _centroids(matrix, labels, counts)
        merged = _agglomerate(centroids, self.distance_threshold)
        return merged[np.searchsorted(ids, labels)]


@dataclass(frozen=True)
class HdbscanTfidf:
    """Density-based option: TF-IDF reduced by truncated SVD, then scikit-learn's HDBSCAN. Density
    needs multiplicity, so each distinct signature is repeated as often as failures share it (up to
    `max_repeat`). Loose HDBSCAN clusters are split into singletons, and clusters whose members are
    on average within `merge_distance` (cosine) are merged by average linkage; scikit-learn's own
    `cluster_selection_epsilon` is not used because it raises on NumPy 2.x (scikit-learn #33219).
    Points HDBSCAN calls noise become singletons (the verdict policy then calls them noise)."""

    min_cluster_size: int = 3
    components: int = 50
    merge_distance: float = 0.6
    max_repeat: int = 20
    type_only: frozenset[str] = TYPE_ONLY
    name: str = "hdbscan-tfidf"

    def labels(self, matrix: sparse.csr_matrix, counts: np.ndarray) -> np.ndarray:
        from sklearn.cluster import HDBSCAN
        from sklearn.decomposition import TruncatedSVD
        from sklearn.preprocessing import normalize
        n, features = matrix.shape
        repeats = np.minimum(np.maximum(counts, 1), self.max_repeat).astype(int)
        if int(repeats.sum()) <= self.min_cluster_size or n < 2 or features < 2:
            return _agglomerate(matrix, self.merge_distance)
        dims = max(1, min(self.components, features - 1, n - 1))
        reduced = normalize(TruncatedSVD(n_components=dims, random_state=0).fit_transform(matrix))
        rows = np.repeat(np.arange(n), repeats)
        point_labels = HDBSCAN(min_cluster_size=self.min_cluster_size, copy=True).fit_predict(reduced[rows])
        # A signature's repeated points are identical, so its first point speaks for all of them.
        labels = point_labels[np.searchsorted(rows, np.arange(n))].astype(int)
        next_label = int(labels.max()) + 1
        for i in np.flatnonzero(labels < 0):
            labels[i], next_label = next_label, next_label + 1
        ids, centroids = _centroids(matrix, labels, counts)
        labels = _explode_loose(labels, centroids, ids, self.merge_distance)
        ids, centroids = _centroids(matrix, labels, counts)
        return _agglomerate(centroids, self.merge_distance)[np.searchsorted(ids, labels)]


CLUSTERING_POLICIES: dict[str, type] = {"agglomerative": AgglomerativeTfidf, "hdbscan": HdbscanTfidf}


# ---------------------------------------------------------------- evidence and scores

@dataclass(frozen=True)
class ModelRate:
    """How often one model shows the pattern on the cluster's instances that it ran."""

    hit: int
    ran: int
    passed: int
    failed_otherwise: int
    kin: int = 0  # same failure type on these instances, but worded differently (another cluster)

    @property
    def rate(self) -> float:
        """Share of the instances it ran on which the model shows this failure type."""
        return (self.hit + self.kin) / self.ran if self.ran else 0.0

    @property
    def strict_rate(self) -> float:
        return self.hit / self.ran if self.ran else 0.0


@dataclass(frozen=True)
class ClusterEvidence:
    """Counts a verdict is reached from (everything measurable, nothing judged yet)."""

    n_failures: int
    n_instances: int
    categories: int
    batch_categories: int
    batch_instances: int
    batch_models: list[str]
    rates: dict[str, ModelRate]
    consistency: float
    prior: float | None
    failure_type: str = ""
    # The probe for well-formed wrong answers: the share of members whose reply states the right
    # answer somewhere (as a whole word), i.e. that a harness could recover. None: not measured.
    recoverable: float | None = None


@dataclass(frozen=True)
class SystematicityScore:
    """How systematic a cluster is, in [0, 1]:

        S = sum(w_k * x_k) / sum(w_k), over the components k that are available, where
        I (instance coverage) = min(1, n_instances / max(min_instances_full, coverage_full * N_instances))
        C (category spread)   = n_categories / N_categories attempted in the batch
        M (model spread)      = mean over models that ran any of the cluster's instances of the share
                                of those instances on which the model showed this failure type (in
                                this cluster's wording or another's); unavailable when fewer than
                                two models ran them
        P (prior recurrence)  = share of earlier iterations that had a matching cluster;
                                unavailable when no earlier iterations are given
        E (consistency)       = |mean of the members' unit TF-IDF vectors|, i.e. the mean cosine
                                similarity of the members to the cluster's centroid direction;
                                for the text-free types (`TYPE_ONLY`), the share of members with
                                the commonest evidence key (e.g. the same max_tokens limit)
    Unavailable components are dropped and the weights renormalised, so a one-model batch is not
    penalised for evidence it could not have."""

    instance: float = 0.30
    category: float = 0.20
    model: float = 0.25
    prior: float = 0.10
    consistency: float = 0.15
    coverage_full: float = 0.3
    min_instances_full: int = 3

    def components(self, ev: ClusterEvidence) -> dict[str, float | None]:
        full = max(self.min_instances_full, self.coverage_full * ev.batch_instances)
        ran = [r for r in ev.rates.values() if r.ran]
        return {
            "instances": min(1.0, ev.n_instances / full) if full else 0.0,
            "categories": ev.categories / ev.batch_categories if ev.batch_categories else 0.0,
            "models": sum(r.rate for r in ran) / len(ran) if len(ran) >= 2 else None,
            "prior": ev.prior,
            "consistency": ev.consistency,
        }

    def score(self, ev: ClusterEvidence) -> tuple[float, dict[str, float | None]]:
        parts = self.components(ev)
        weights = {"instances": self.instance, "categories": self.category, "models": self.model,
                   "prior": self.prior, "consistency": self.consistency}
        used = {k: v for k, v in parts.items() if v is not None}
        total = sum(weights[k] for k in used)
        value = sum(weights[k] * v for k, v in used.items()) / total if total else 0.0
        return round(min(1.0, max(0.0, value)), 4), {k: (round(v, 4) if v is not None else None)
                                                    for k, v in parts.items()}


class VerdictPolicy(Protocol):
    """Judges one cluster from its evidence and systematicity; returns the verdict and one
    sentence saying why, with the counts that make it checkable."""

    def judge(self, ev: ClusterEvidence, systematicity: float) -> tuple[Verdict, str]: ...


def _rate_text(model: str, r: ModelRate) -> str:
    kin = f" (+{r.kin} worded differently)" if r.kin else ""
    return f"{model} {r.hit}/{r.ran}{kin}"


@dataclass(frozen=True)
class ThresholdVerdicts:
    """The default verdict policy, in this order:

    1. noise — fewer than `min_instances` distinct instances, or at most `small_size` failures whose
       evidence consistency is below `min_consistency`;
    2. harness-level when the replies were cut at the harness's token limit (`truncated`, at least
       `min_instances_harness` instances): the budget is a harness setting, whoever hits it;
    3. model-specific — at least `min_instances_specific` instances, at least two models ran them,
       one shows the pattern on at least `dominant_rate` of those it ran, every other on at most
       `other_rate`, and some other model *passed* at least `contrast_pass_rate` of them (a model
       that fails them another way is no contrast);
    4. harness-level — at least `min_instances_harness` instances, systematicity at least
       `min_systematicity`, evidence consistency at least `min_consistency_harness` (members that
       do not resemble each other do not name one cause), and either at least two models show it
       on `shared_rate` or more of the instances they ran, or (cross-model evidence unavailable)
       it spans `min_categories` categories (or the batch has only one) and, for well-formed wrong
       answers, at least `min_recoverable` of the replies state the right answer (a probe that the
       harness could recover it; without it they agree only on an answer shape);
    5. otherwise noise: it recurs, but too narrowly or too unevenly to justify a harness change (or
       one model shows it and no other passes these instances: nothing can be attributed)."""

    min_instances: int = 2
    small_size: int = 3
    min_consistency: float = 0.35
    min_instances_specific: int = 3
    dominant_rate: float = 0.5
    other_rate: float = 0.2
    shared_rate: float = 0.3
    min_instances_harness: int = 3
    min_categories: int = 2
    min_systematicity: float = 0.4
    min_consistency_harness: float = 0.5
    min_recoverable: float = 0.5
    contrast_pass_rate: float = 0.5

    def judge(self, ev: ClusterEvidence, systematicity: float) -> tuple[Verdict, str]:
        ran = {m: r for m, r in ev.rates.items() if r.ran}
        if ev.n_instances < self.min_instances:
            who = ", ".join(f"{m}" for m, r in ran.items() if r.hit)
            return "noise", (f"Singleton: {ev.n_failures} failure(s) on one instance ({who}); "
                             f"one odd instance does not justify a harness change.")
        if ev.n_failures <= self.small_size and ev.consistency < self.min_consistency:
            return "noise", (f"Tiny and inconsistent: {_count(ev.n_failures, 'failure')} whose evidence agrees "
                             f"only {ev.consistency:.2f} (below {self.min_consistency}).")
        if ev.failure_type == "truncated" and ev.n_instances >= self.min_instances_harness:
            # The token budget is a harness setting: a reply cut at it is the harness's to fix
            # (a larger budget, or asking for the answer first), whichever model ran into it.
            who = ", ".join(_rate_text(m, r) for m, r in sorted(ran.items()) if r.hit)
            return "harness-level", (f"Cut at the harness's own token limit (max_tokens) on "
                                     f"{_count(ev.n_instances, 'instance')} ({who}); the budget is a harness "
                                     f"setting, so the harness owns the repair whichever model hits it.")
        specific = self._model_specific(ran) if ev.n_instances >= self.min_instances_specific else None
        if specific:
            return "model-specific", specific
        hit_models = [m for m, r in ran.items() if r.rate >= self.shared_rate]
        spread = (f"{_count(ev.n_instances, 'instance')} across {ev.categories} of "
                  f"{_count(ev.batch_categories, 'category', 'categories')}")
        if ev.consistency < self.min_consistency_harness:
            return "noise", (f"Widespread but incoherent: {_count(ev.n_failures, 'failure')} whose evidence agrees only "
                             f"{ev.consistency:.2f} (below {self.min_consistency_harness}); no single cause to repair.")
        if ev.n_instances >= self.min_instances_harness and systematicity >= self.min_systematicity:
            if len(ran) >= 2 and len(hit_models) >= 2:
                rates = ", ".join(_rate_text(m, ran[m]) for m in sorted(ran))
                return "harness-level", (f"Shared by {len(hit_models)} of {len(ran)} models that ran these "
                                         f"instances ({rates}) on {spread}; systematicity {systematicity:.2f}.")
            if len(ran) < 2 and (ev.categories >= self.min_categories or ev.batch_categories < 2):
                alone = next(iter(ran), "one model")
                why = ("only one model was run" if len(ev.batch_models) < 2
                       else "no other model ran these instances")
                if ev.failure_type == "wrong_answer" and (ev.recoverable or 0.0) < self.min_recoverable:
                    # Well-formed wrong answers from one model agree only on an answer shape: that is
                    # the model's knowledge, not the harness, unless the replies hold the right answer.
                    return "noise", (f"Not attributable to the harness: {alone} gave well-formed but wrong "
                                     f"answers on {spread}, and {why}; the right answer appears in "
                                     f"{100 * (ev.recoverable or 0.0):.0f} % of the replies, below the "
                                     f"{100 * self.min_recoverable:.0f} % that would show the harness could recover it.")
                return "harness-level", (f"Cross-model evidence unavailable ({why}: {alone}); recurs on "
                                         f"{spread}; systematicity {systematicity:.2f}.")
        rates = ", ".join(_rate_text(m, r) for m, r in sorted(ran.items()))
        if len(ran) >= 2 and len(hit_models) == 1 and ev.n_instances >= self.min_instances_specific:
            contrast = "; ".join(f"{m} passed {r.passed} of the {r.ran} it ran" for m, r in sorted(ran.items())
                                 if m not in hit_models)
            return "noise", (f"Not attributable: only {hit_models[0]} shows the pattern on {spread}, but no other "
                             f"model passes these instances ({contrast}), so nothing shows whether the model or "
                             f"the harness is at fault.")
        return "noise", (f"Recurs too narrowly or unevenly to act on: {spread}"
                         f"{f' ({rates})' if rates else ''}; systematicity {systematicity:.2f}.")

    def _model_specific(self, ran: dict[str, ModelRate]) -> str | None:
        if len(ran) < 2:
            return None
        top_model, top = max(ran.items(), key=lambda kv: (kv[1].rate, kv[0]))
        others = {m: r for m, r in ran.items() if m != top_model}
        if top.rate < self.dominant_rate or any(r.rate > self.other_rate for r in others.values()):
            return None
        # Only a model that *passes* these instances shows the fault is the first model's: one that
        # fails them another way says nothing about where this pattern comes from.
        if not any(r.ran and r.passed / r.ran >= self.contrast_pass_rate for r in others.values()):
            return None
        contrast = "; ".join(f"{m} ran {r.ran} of them and showed it on {r.hit + r.kin} "
                             f"(passed {r.passed}, failed {r.failed_otherwise} otherwise)"
                             for m, r in sorted(others.items()))
        return (f"Specific to {top_model}: it shows the pattern on {top.hit + top.kin} of the {top.ran} "
                f"instances it ran; {contrast}.")


def _count(n: int, one: str, many: str | None = None) -> str:
    """'1 category', '3 categories': verdict reasons are read on the clusters page."""
    return f"{n} {one if n == 1 else (many or one + 's')}"


@dataclass(frozen=True)
class PriorityOrder:
    """Which cluster to repair first: harness-level before model-specific before noise, then higher
    systematicity, then more failures, then the id (a stable tie-break)."""

    def key(self, cluster: "Cluster") -> tuple[int, float, int, str]:
        return (VERDICT_RANK[cluster.verdict], -cluster.systematicity, -cluster.size, cluster.type + cluster.label)

    def order(self, clusters: Sequence["Cluster"]) -> list["Cluster"]:
        return sorted(clusters, key=self.key)


# ---------------------------------------------------------------- the cluster record

@dataclass
class Cluster:
    """One recurring failure pattern of a batch, with its verdict and the evidence for it."""

    id: str
    type: str
    label: str
    failures: list[Failure]
    terms: list[str]
    systematicity: float
    components: dict[str, float | None]
    verdict: Verdict
    reason: str
    evidence: list[str]
    rates: dict[str, ModelRate] = field(default_factory=dict)
    consistency: float = 0.0
    # The recoverability probe's record (`ecdysis.probe`): model, members, and per repair tried how
    # many came back right; "operator" names the repair that made the cluster harness-level.
    probe: dict[str, Any] = field(default_factory=dict)

    @property
    def size(self) -> int:
        return len(self.failures)

    @property
    def instances(self) -> list[str]:
        return sorted({f.instance_id for f in self.failures})

    @property
    def instance_keys(self) -> list[str]:
        return sorted({f.key for f in self.failures})

    @property
    def categories(self) -> dict[str, int]:
        return dict(sorted(Counter(f.category for f in self.failures).items()))

    @property
    def models(self) -> dict[str, int]:
        return dict(sorted(Counter(f.model for f in self.failures).items()))

    @property
    def shapes(self) -> dict[str, int]:
        return dict(Counter(f.shape for f in self.failures).most_common())

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id, "size": self.size, "label": self.label, "type": self.type,
            "instances": self.instances, "categories": self.categories, "models": self.models,
            "systematicity": self.systematicity, "components": self.components,
            "verdict": self.verdict, "reason": self.reason, "evidence": self.evidence,
            "terms": self.terms, "consistency": self.consistency,
            "model_rates": {m: {"hit": r.hit, "ran": r.ran, "passed": r.passed,
                                "failed_otherwise": r.failed_otherwise, "kin": r.kin}
                            for m, r in self.rates.items()},
            "members": [f.to_json() for f in self.failures],
            **({"probe": self.probe} if self.probe else {}),
        }

    @staticmethod
    def from_json(data: Mapping[str, Any]) -> "Cluster":
        return Cluster(
            id=data["id"], type=data.get("type", ""), label=data.get("label", ""),
            failures=[Failure.from_json(f) for f in data.get("members", [])], terms=list(data.get("terms", [])),
            systematicity=float(data.get("systematicity") or 0.0), components=dict(data.get("components", {})),
            verdict=data.get("verdict", "noise"), reason=data.get("reason", ""),
            evidence=list(data.get("evidence", [])),
            rates={m: ModelRate(**r) for m, r in data.get("model_rates", {}).items()},
            consistency=float(data.get("consistency", 0.0)), probe=dict(data.get("probe") or {}))


# ---------------------------------------------------------------- aggregation

def _rates(members: Sequence[Failure], batch: BatchContext) -> dict[str, ModelRate]:
    keys = {f.key for f in members}
    type_ = members[0].type
    hits: dict[str, set[str]] = defaultdict(set)
    for f in members:
        hits[f.model].add(f.key)
    rates: dict[str, ModelRate] = {}
    for model in batch.models:
        outcomes = batch.outcomes[model]
        ran = keys & batch.attempted(model)
        if not ran and model not in hits:
            continue
        hit = hits.get(model, set())
        passed = sum(1 for k in ran if outcomes[k] == "pass")
        kin = sum(1 for k in ran - hit if outcomes[k] == type_)
        rates[model] = ModelRate(hit=len(hit), ran=max(len(ran), len(hit)), passed=passed,
                                 failed_otherwise=len(ran) - len(hit & ran) - passed - kin, kin=kin)
    return rates


def _prior(type_: str, terms: Sequence[str], previous: Sequence[Sequence["Cluster"]]) -> float | None:
    """Share of earlier iterations with a cluster of the same type whose top terms overlap."""
    if not previous:
        return None
    mine = set(terms)

    def matches(other: Cluster) -> bool:
        theirs = set(other.terms)
        if other.type != type_:
            return False
        if not mine and not theirs:
            return True
        return len(mine & theirs) / max(1, len(mine | theirs)) >= 0.3

    return sum(1 for iteration in previous if any(matches(c) for c in iteration)) / len(previous)


def _evidence(members: Sequence[Failure], similarity: np.ndarray, limit: int = 4) -> list[str]:
    """Representative excerpts: most central first, preferring unseen (model, category) pairs."""
    order = list(np.argsort(-similarity, kind="stable"))
    chosen: list[int] = []
    seen: set[tuple[str, str]] = set()
    for i in order:
        pair = (members[i].model, members[i].category)
        if pair not in seen:
            chosen.append(int(i))
            seen.add(pair)
        if len(chosen) == limit:
            break
    for i in order:
        if len(chosen) >= min(limit, len(members)):
            break
        if int(i) not in chosen:
            chosen.append(int(i))
    return [f"[{members[i].model} · {members[i].category} · {members[i].instance_id}] {members[i].excerpt}"
            for i in chosen]


def _top_terms(centroid: np.ndarray, vocabulary: np.ndarray, limit: int = 6) -> list[str]:
    order = np.argsort(-centroid, kind="stable")[:limit]
    return [str(vocabulary[i]) for i in order if centroid[i] > 0]


def _label(type_: str, members: Sequence[Failure]) -> str:
    signature, _ = Counter(f.signature for f in members).most_common(1)[0]
    shown = signature if len(signature) <= 48 else signature[:47] + "…"
    shapes = "/".join(s for s, _ in Counter(f.shape for f in members).most_common(3))
    return f"{FAILURE_TITLES.get(type_, type_)}: “{shown}” ({shapes} answers)"


def evidence_key(f: Failure) -> str:
    """What a failure of a text-free type has in common with others of its kind."""
    if f.type == "truncated":
        return f"cut at max_tokens={f.detail.get('max_tokens') or '?'}" + _mechanism_text(f)
    if f.type == "empty_output":
        return "empty answer" + _mechanism_text(f)
    if f.type in AGENT_TYPES or f.type in MULTI_TURN_TYPES:
        # How the calls went wrong (`failures.agent_failure`): prose, broken syntax, no call, wrong type...
        return str(f.detail.get("mechanism") or f.type)
    if f.type in MECHANISM_TYPES:
        # Above the wording: the mechanism is whether a well-formed answer was there to extract.
        return ("a well-formed answer is in the reply" if f.detail.get("shape_in_reply")
                else "no well-formed answer in the reply")
    return f.signature


def _mechanism_text(f: Failure) -> str:
    mechanism = f.detail.get("mechanism")
    return f", {mechanism}" if mechanism else ""


# Text-free types whose replies still say how they went wrong (`failures.reply_mechanism`): each
# mechanism is its own cluster, so one model's echo of the prompt is not lumped with another's
# reasoning cut off at the same limit.
MECHANISM_SPLIT: frozenset[str] = frozenset({"truncated", "empty_output"})


def _key_share(members: Sequence[Failure]) -> float:
    """Consistency of a type-only cluster: the share of members with the commonest evidence key."""
    return Counter(evidence_key(f) for f in members).most_common(1)[0][1] / len(members)


def _type_label(type_: str, members: Sequence[Failure]) -> str:
    key, n = Counter(evidence_key(f) for f in members).most_common(1)[0]
    shapes = "/".join(s for s, _ in Counter(f.shape for f in members).most_common(3))
    share = "" if n == len(members) else f" ({n} of {len(members)})"
    return f"{FAILURE_TITLES.get(type_, type_)}: {key}{share} ({shapes} answers)"


@dataclass
class _Group:
    """One cluster in the making: its failures, and its distinct signature rows with counts."""

    type: str
    members: list[Failure]
    rows: Any  # unit TF-IDF rows of the distinct signatures (sparse)
    weights: np.ndarray  # failures per row
    member_rows: np.ndarray  # row index (into `rows`) of each member
    vocabulary: np.ndarray
    type_only: bool = False


def _cluster_type(type_: str, failures: Sequence[Failure], policy: ClusteringPolicy) -> list[_Group]:
    from sklearn.feature_extraction.text import TfidfVectorizer
    from sklearn.preprocessing import normalize
    distinct = sorted({f.signature for f in failures})
    vectorizer = TfidfVectorizer(sublinear_tf=True, token_pattern=r"(?u)\b\w+\b", dtype=np.float64)
    matrix = normalize(vectorizer.fit_transform(distinct)).tocsr()
    row = {s: i for i, s in enumerate(distinct)}
    counts = np.bincount([row[f.signature] for f in failures], minlength=len(distinct))
    type_only = type_ in getattr(policy, "type_only", frozenset())
    labels = np.zeros(len(distinct), dtype=int) if type_only else policy.labels(matrix, counts)
    groups: dict[Any, list[Failure]] = defaultdict(list)
    by_mechanism = type_only and type_ in MECHANISM_SPLIT and not isinstance(policy, _TypeOnly)
    for f in failures:
        groups[evidence_key(f) if by_mechanism else int(labels[row[f.signature]])].append(f)
    vocabulary = vectorizer.get_feature_names_out()
    out: list[_Group] = []
    for _, members in sorted(groups.items()):
        local = sorted({row[f.signature] for f in members})
        position = {r: i for i, r in enumerate(local)}
        member_rows = np.array([position[row[f.signature]] for f in members])
        weights = np.bincount(member_rows, minlength=len(local))
        out.append(_Group(type_, members, matrix[local], weights, member_rows, vocabulary, type_only))
    return out


MECHANISM_TYPES: frozenset[str] = frozenset({"off_format", "invalid_choice"})
# The fewest instances a cluster needs before the recoverability probe (`ecdysis.probe`) asks the
# harness about it: a smaller one is noise whatever a probe says.
PROBE_MIN_INSTANCES = 3


@dataclass(frozen=True)
class TypeLevelMerge:
    """Cross-instance aggregation above the wording. Text similarity splits one failure type into
    sub-patterns ("quoted", "to solve this problem…"); when at least `min_parts` of them are each
    too small to act on, their union is judged again as one type-level cluster keyed by its
    mechanism (`evidence_key`). A union judged harness-level replaces its parts. Otherwise the
    parts under the probe's size (`probe_instances`), which the recoverability probe would never
    ask about, are joined alone, and their union replaces them when the probe can judge it
    (`for_probe`): one model alone shows it, on at least `probe_instances` instances, most of them
    by one mechanism. A part the probe can see on its own is left to it. The probe promotes a
    union only when a repair recovers most of its failures, so a scatter of unrelated slips stays
    noise."""

    min_parts: int = 2
    types: frozenset[str] = MECHANISM_TYPES | frozenset(AGENT_TYPES) | frozenset(MULTI_TURN_TYPES)
    probe_instances: int = PROBE_MIN_INSTANCES
    probe_consistency: float = 0.5

    def applies(self, type_: str, parts: Sequence["Cluster"]) -> bool:
        return type_ in self.types and sum(c.verdict == "noise" for c in parts) >= self.min_parts

    def for_probe(self, union: "Cluster") -> bool:
        showing = [m for m, r in union.rates.items() if r.ran and r.hit]
        return (len(union.instances) >= self.probe_instances and len(showing) <= 1
                and union.consistency >= self.probe_consistency)


class _TypeOnly:
    """A clustering policy that keeps one type's failures together (used for merged unions)."""

    def __init__(self, type_: str) -> None:
        self.type_only = frozenset({type_})

    def labels(self, matrix: Any, counts: Any = None) -> np.ndarray:
        return np.zeros(matrix.shape[0], dtype=int)


def aggregate(failures: Sequence[Failure], batch: BatchContext, *,
              clustering: ClusteringPolicy | None = None, verdicts: VerdictPolicy | None = None,
              scoring: SystematicityScore | None = None, priority: PriorityOrder | None = None,
              previous_clusters: Sequence[Sequence[Cluster]] = (),
              merge: TypeLevelMerge | None = TypeLevelMerge()) -> list[Cluster]:
    """Cluster a batch's failures (hard partition by failure type, then text similarity within a
    type, then `merge` of small same-type parts), score and judge each cluster, and return them in
    priority order with ids c1, c2, ..."""
    clustering = clustering or AgglomerativeTfidf()
    verdicts = verdicts or ThresholdVerdicts()
    scoring = scoring or SystematicityScore()
    priority = priority or PriorityOrder()
    by_type: dict[str, list[Failure]] = defaultdict(list)
    for f in failures:
        by_type[f.type].append(f)
    clusters: list[Cluster] = []
    for type_ in sorted(by_type):
        parts = [_judge(group, batch, verdicts, scoring, previous_clusters)
                 for group in _cluster_type(type_, by_type[type_], clustering)]
        if merge is not None and merge.applies(type_, parts):
            small = [c for c in parts if c.verdict == "noise"]
            merged: Cluster | None = _union(type_, small, batch, verdicts, scoring, previous_clusters)
            if merged.verdict != "harness-level":
                # For the probe, only the parts it could not ask about on their own: a part of its
                # size is probed as it is, not diluted in a union whose probed members differ.
                tiny = [c for c in small if len(c.instances) < merge.probe_instances]
                if len(tiny) < merge.min_parts:
                    merged = None
                elif len(tiny) < len(small):  # else the union of `small` is already this one
                    merged = _union(type_, tiny, batch, verdicts, scoring, previous_clusters)
                small = tiny
                if merged is not None and not merge.for_probe(merged):
                    merged = None
            if merged is not None:
                merged.reason += f" (merged from {len(small)} smaller sub-patterns of this failure type)"
                parts = [c for c in parts if not any(c is part for part in small)] + [merged]
        clusters.extend(parts)
    ordered = priority.order(clusters)
    for i, cluster in enumerate(ordered, start=1):
        cluster.id = f"c{i}"
    return ordered


def _union(type_: str, parts: Sequence[Cluster], batch: BatchContext, verdicts: VerdictPolicy,
           scoring: SystematicityScore, previous: Sequence[Sequence[Cluster]]) -> Cluster:
    """The parts' failures judged again as one type-level cluster (`TypeLevelMerge`)."""
    group = _cluster_type(type_, [f for c in parts for f in c.failures], _TypeOnly(type_))[0]
    return _judge(group, batch, verdicts, scoring, previous)


def _judge(group: _Group, batch: BatchContext, verdicts: VerdictPolicy, scoring: SystematicityScore,
           previous: Sequence[Sequence[Cluster]]) -> Cluster:
    members = group.members
    centroid = np.asarray(group.rows.T @ group.weights).ravel() / group.weights.sum()
    norm = float(np.linalg.norm(centroid))
    consistency = round(_key_share(members) if group.type_only else min(1.0, norm), 4)
    row_similarity = np.asarray(group.rows @ (centroid / norm if norm else centroid)).ravel()
    similarity = row_similarity[group.member_rows]
    terms = _top_terms(centroid, group.vocabulary)
    rates = _rates(members, batch)
    ev = ClusterEvidence(
        n_failures=len(members), n_instances=len({f.key for f in members}),
        categories=len({f.category for f in members}), batch_categories=len(batch.category_names) or 1,
        batch_instances=len(batch.instance_keys) or len({f.key for f in members}), batch_models=batch.models,
        rates=rates, consistency=consistency, prior=_prior(group.type, terms, previous),
        failure_type=group.type, recoverable=_recoverable(members) if group.type == "wrong_answer" else None)
    systematicity, components = scoring.score(ev)
    verdict, reason = verdicts.judge(ev, systematicity)
    label = _type_label(group.type, members) if group.type_only else _label(group.type, members)
    return Cluster(id="", type=group.type, label=label, failures=list(members),
                   terms=terms, systematicity=systematicity, components=components, verdict=verdict,
                   reason=reason, evidence=_evidence(members, similarity), rates=rates,
                   consistency=consistency)


def _recoverable(members: Sequence[Failure]) -> float:
    """Share of members whose raw reply contains the target as a whole word (so "8" is not found
    in "$288", nor "plausible" in "implausible")."""
    def found(f: Failure) -> bool:
        target = f.target.strip()
        return bool(target) and re.search(rf"(?<!\w){re.escape(target)}(?!\w)", f.raw_output, re.IGNORECASE) is not None
    return round(sum(found(f) for f in members) / len(members), 4) if members else 0.0


def priority_value(cluster: Cluster) -> float:
    """A single number for display: systematicity weighted by how many failures a repair could fix."""
    return round(cluster.systematicity * math.log1p(cluster.size), 4)
