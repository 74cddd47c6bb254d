"""The start forms: a batch (`RunRequest`s), a diagnosis (runs + role backend), an evolution
(`EvolveConfig`s). Each returns what to submit, or None; the page hands it to the service."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import streamlit as st

from app import views
from ecdysis.evolve import EvolveConfig
from ecdysis.gate import DEFAULT_K
from ecdysis.models import registry
from ecdysis.records import RunRecord
from ecdysis.service import RunRequest
from ecdysis.store import HarnessVersion

LOCAL_MODELS = list(registry.LOCAL_NAMES)
MODEL_HELP = ("All four are embedded (no key, no network). The default pair: qwen2.5-coder-0.5b is the subject, "
              "smollm2 the second model whose passes on the same instances tell a harness fault from a model quirk. "
              "Type openai:NAME or anthropic:NAME for a remote model (key from the environment)")
ROLE_HELP = ("heuristic: deterministic, offline (failure taxonomy + repair operators). qwen2.5-coder-1.5b plays "
             "the roles offline (slow on 2 cores: minutes per cluster), or type a model name "
             "(e.g. openai:gpt-4o-mini) to let another LLM play them")
ROLE_CHOICES = ["heuristic", "qwen2.5-coder-1.5b"]
SUITE_HELP = ("Type to search: built-in suites, imported JSONL, the fetched BFCL function-calling suites "
              "(bfcl-...), every fetched BIG-bench task (bigbench:TASK) and BIG-Bench Hard task (bbh:TASK), "
              "each with its size and answer form")


def _suite_select(suites: Sequence[dict[str, Any]], key: str, container: Any) -> str:
    names = [s["name"] for s in suites]
    sizes = {s["name"]: s for s in suites}
    default = names.index("reasoning-mix") if "reasoning-mix" in names else 0
    return container.selectbox(
        "Suite", names, index=default, key=key, help=SUITE_HELP,
        format_func=lambda n: (f"{n} ({views.count(sizes[n]['size'], 'instance')}, "
                               f"{views.count(len(sizes[n]['categories']), 'category', 'categories')}"
                               f"{views.forms_text(sizes[n])})"))


def _models(default_models: Sequence[str], key: str, container: Any) -> list[str]:
    options = list(dict.fromkeys([*default_models, *LOCAL_MODELS]))
    return container.multiselect("Model(s)", options, default=list(default_models), key=key,
                                 accept_new_options=True, help=MODEL_HELP)


def _harness_select(harnesses: Sequence[HarnessVersion], key: str, container: Any) -> str | None:
    ordered = sorted(harnesses, key=lambda h: h.created_at, reverse=True)
    labels = {h.id: views.harness_label(h) for h in ordered}
    starter = next((h.id for h in ordered if h.status == "starter"), None)
    ids = [h.id for h in ordered]
    return container.selectbox("Harness version", ids, index=ids.index(starter) if starter in ids else 0,
                               key=key, format_func=lambda i: labels.get(i, i))


def batch_form(suites: Sequence[dict[str, Any]], harnesses: Sequence[HarnessVersion],
               default_models: Sequence[str]) -> list[RunRequest] | None:
    """One request per chosen model (the same instances for each), or None until submitted."""
    with st.form("start-batch", border=True):
        c1, c2, c3 = st.columns([3, 3, 4])
        suite = _suite_select(suites, "batch:suite", c1)
        models = _models(default_models, "batch:models", c2)
        harness = _harness_select(harnesses, "batch:harness", c3)
        c4, c5, c6, c7 = st.columns([2, 2, 2, 3], vertical_alignment="bottom")
        split = c4.selectbox("Split", ["train", "validation", "test"], key="batch:split")
        limit = c5.number_input("Batch size", min_value=1, max_value=5000, value=12, key="batch:limit",
                                help="instances, taken round-robin over the suite's categories")
        concurrency = c6.number_input("Concurrency", min_value=1, max_value=64, value=1, key="batch:concurrency",
                                      help="instances in parallel (within each backend's own limit)")
        use_cache = c7.toggle("Reuse cached responses", value=True, key="batch:cache",
                              help="an identical call is served from the persistent response cache")
        label = st.text_input("Label (optional)", key="batch:label", placeholder="e.g. baseline before edits")
        submitted = st.form_submit_button("Start batch", type="primary", icon=":material/play_arrow:")
    if not submitted:
        return None
    if not models:
        st.error("Pick at least one model.", icon=":material/error:")
        return None
    return [RunRequest(suite=suite, model=m, harness=harness, split=split, limit=int(limit),
                       concurrency=int(concurrency), use_cache=use_cache, label=label) for m in models]


@dataclass(frozen=True)
class DiagnosisRequest:
    run_ids: list[str]
    role_backend: str


def diagnosis_form(runs: Sequence[RunRecord], preselected: Sequence[str] = ()) -> DiagnosisRequest | None:
    """Pick the runs that form one batch (several models of one suite give cross-model evidence)."""
    done = [r for r in runs if r.status == "done"]
    labels = {r.id: views.run_label(r) for r in done}
    default = [r for r in preselected if r in labels] or [r.id for r in done[:1]]
    with st.form("start-diagnosis", border=True):
        chosen = st.multiselect("Runs in the batch", list(labels), default=default, key="diag:runs",
                                format_func=lambda i: labels.get(i, i),
                                help="one or several finished runs; their failures are clustered together")
        backend = st.selectbox("Role backend", ROLE_CHOICES, key="diag:backend", accept_new_options=True,
                               help=ROLE_HELP)
        submitted = st.form_submit_button("Cluster and diagnose", type="primary", icon=":material/hub:")
    if not submitted:
        return None
    if not chosen:
        st.error("Pick at least one finished run.", icon=":material/error:")
        return None
    return DiagnosisRequest(list(chosen), backend or "heuristic")


GATE_HELP = ("The paired validation gate keeps a patched version only when, on the same validation instances, its "
             "net wins over its parent (instances it gets right and the parent wrong, minus the reverse) reach the "
             "minimum AND exceed that many standard errors of no change (√(wins + losses) with one model; with "
             "several, each question is one unit: √ of the sum of each question's net squared, since a change that "
             "wins a question for every model is one piece of evidence, not several). Small models flip "
             "answers from run to run; lower values accept noise.")
STRATEGY_CHOICES = {"ecdysis": "ecdysis (batch clusters)", "per-instance": "per-instance search",
                    "self-evolution": "self-evolution (the paper's baseline)", "both": "both, side by side"}


def evolution_form(suites: Sequence[dict[str, Any]], harnesses: Sequence[HarnessVersion],
                   default_models: Sequence[str]) -> list[EvolveConfig] | None:
    """One config per strategy ("both" gives two evolutions with identical settings)."""
    with st.form("start-evolution", border=True):
        c1, c2, c3 = st.columns([3, 3, 4])
        suite = _suite_select(suites, "evo:suite", c1)
        models = _models(default_models, "evo:models", c2)
        harness = _harness_select(harnesses, "evo:harness", c3)
        c4, c5 = st.columns(2)
        strategy = c4.radio("Strategy", list(STRATEGY_CHOICES), index=0, horizontal=True, key="evo:strategy",
                            format_func=STRATEGY_CHOICES.__getitem__)
        gate = c5.radio("Gate", ["human", "auto"], horizontal=True, key="evo:gate",
                        format_func={"human": "human gate (decide on Review)", "auto": "auto-approve"}.__getitem__)
        n1, n2, n3, n4, n5 = st.columns(5)
        iterations = n1.number_input("Iterations", 1, 50, 2, key="evo:iterations")
        batch = n2.number_input("Train batch", 1, 5000, 12, key="evo:batch")
        val = n3.number_input("Validation", 1, 5000, 12, key="evo:val", help="validation instances for the paired gate")
        test = n4.number_input("Test", 0, 5000, 12, key="evo:test", help="sealed test instances (0 = the whole split)")
        calls = n5.number_input("Max model calls", 0, 10_000_000, 0, key="evo:calls", help="0 = no budget")
        r1, r2, r3, r4 = st.columns([3, 2, 2, 2])
        role = r1.selectbox("Role backend", ROLE_CHOICES, key="evo:role", accept_new_options=True, help=ROLE_HELP)
        concurrency = r2.number_input("Concurrency", 1, 64, 1, key="evo:concurrency")
        min_net = r3.number_input("Gate: minimum net wins", 0, 5000, 2, key="evo:min_net", help=GATE_HELP)
        k = r4.number_input("Gate: standard errors", 0.0, 10.0, DEFAULT_K, step=0.5, key="evo:gate_k", help=GATE_HELP)
        submitted = st.form_submit_button("Start evolution", type="primary", icon=":material/rocket_launch:")
    if not submitted:
        return None
    if not models:
        st.error("Pick at least one model.", icon=":material/error:")
        return None
    strategies = ["ecdysis", "per-instance"] if strategy == "both" else [strategy]
    return [EvolveConfig(suite=suite, models=list(models), strategy=s, iterations=int(iterations),
                         batch_size=int(batch), val_limit=int(val), test_limit=int(test) or None, harness=harness,
                         auto_approve=gate == "auto", role_backend=role or "heuristic",
                         concurrency=int(concurrency), max_model_calls=int(calls) or None,
                         gate_min_net=int(min_net), gate_k=float(k),
                         # side by side they share one cache: each is charged for cached answers too
                         charge_cached=strategy == "both", label=f"ui-{s}") for s in strategies]
