"""An agent trajectory on the pages: the Tool calls view (the calls read from the final answer, each
marked whether the task lists its function; the expected calls; the checker's verdict) above the
turns, on the Runs page and in a cluster's drill-down, whose agent members show their mechanism and
the checker's detail.

The world is small and real: a BFCL-shaped JSONL suite (function docs in `fields["functions"]`, a
JSON list of expected calls as the target, scorer `bfcl_ast`) imported into the store, run by the
starter agent on a scripted model through the real runner, and diagnosed by the heuristic roles.
The scripted model's wrong replies are hostile: an argument and a function name full of Markdown,
HTML and `<script>`, which must reach the page as text and never as markup. Nothing here needs the
fetched BFCL data except the test that reads it, which skips without it.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

import hostile_world
from app import views
from app.tool_calls import expected_rows, tool_calls_view
from ecdysis.aggregate import Cluster
from ecdysis.failures import calls_target
from ecdysis.failures import FAILURE_TITLES
from ecdysis.models.registry import register_backend
from ecdysis.models.scripted import Rule, ScriptedBackend
from ecdysis.records import Instance
from ecdysis.service import RunRequest
from test_app_inert import _markdown_bodies, live_markup
from test_app_pages import assert_clean, by_label, open_page, open_service, texts

SCRIPT = "<script>alert('tool')</script>"
HOSTILE_ARGUMENT = f"{SCRIPT} {hostile_world.payload(9, 'argument')}"
HOSTILE_NAME = f"[steal](http://{hostile_world.BAIT_HOST}:9/name) <b>area</b> {SCRIPT}"


def doc(name: str, **properties: str) -> dict:
    return {"name": name, "description": f"{name} does its job.",
            "parameters": {"type": "dict", "properties": {p: {"type": t} for p, t in properties.items()},
                           "required": list(properties)}}


AREA = doc("triangle_area", base="integer", height="integer")
UNITS = {"type": "dict", "properties": {"base": {"type": "integer"}, "unit": {"type": "string"}},
         "required": ["base"]}
SCALED = {"name": "scaled_area", "description": "Area with a unit.", "parameters": UNITS}


def area_target(base: int) -> str:
    return json.dumps([{"triangle_area": {"base": [base], "height": [5]}}])


def instance(iid: str, target: str, functions: list[dict] | None = None) -> Instance:
    return Instance(id=iid, input=f"Area of a triangle ({iid})?", target=target, category="simple",
                    fields={"functions": functions if functions is not None else [AREA]})


def call(name: str, **arguments: object) -> dict:
    return {"name": name, "arguments": arguments}


# ---------------------------------------------------------------- the shaping, without Streamlit

def test_a_correct_answer_shows_its_calls_the_expected_ones_and_the_verdict() -> None:
    view = tool_calls_view(json.dumps([call("triangle_area", base=10, height=5)]), instance("a", area_target(10)))
    assert view is not None and view.correct and view.verdict == "correct"
    assert view.call_rows() == [{"#": 1, "function": "triangle_area", "listed by the task": "yes",
                                 "arguments": '{"base": 10, "height": 5}', "by position": ""}]
    assert view.expected_rows() == [
        {"#": 1, "function": "triangle_area", "parameter": "base", "allowed values": "[10]", "may be left out": "no"},
        {"#": 1, "function": "triangle_area", "parameter": "height", "allowed values": "[5]", "may be left out": "no"}]
    assert view.expected_calls == 1 and not view.positional


def test_an_invented_function_is_marked_and_the_checker_says_why() -> None:
    answer = json.dumps([call("area_of_triangle", base=10, height=5)])
    view = tool_calls_view(answer, instance("a", area_target(10)))
    assert view is not None and not view.correct
    assert [r["listed by the task"] for r in view.call_rows()] == ["no"]
    assert view.reason == "wrong_function"
    assert view.verdict == "wrong function: called 'area_of_triangle', expected 'triangle_area'"


def test_a_wrong_value_python_calls_and_arguments_by_position() -> None:
    two = json.dumps([{"triangle_area": {"base": [10], "height": [5]}},
                      {"scaled_area": {"base": [4], "unit": ["cm", ""]}}])
    inst = instance("p", two, [AREA, SCALED])
    view = tool_calls_view("[scaled_area(base=4, unit='m'), triangle_area(10, height=5)]", inst)
    assert view is not None and not view.correct and view.positional
    rows = view.call_rows()
    assert [(r["function"], r["arguments"], r["by position"]) for r in rows] == [
        ("scaled_area", '{"base": 4, "unit": "m"}', ""), ("triangle_area", '{"height": 5}', "[10]")]
    # "" among the allowed values is the mark of a parameter that may be left out, not a value.
    unit = next(r for r in view.expected_rows() if r["parameter"] == "unit")
    assert (unit["allowed values"], unit["may be left out"], unit["#"]) == ('["cm"]', "yes", 2)
    assert view.expected_calls == 2


def test_an_answer_that_is_not_calls_and_a_task_where_nothing_applies() -> None:
    prose = tool_calls_view("The area is half the base times the height.", instance("a", area_target(10)))
    assert prose is not None and prose.calls is None and prose.call_rows() == []
    assert prose.reason == "unparsable" and not prose.correct
    nothing = tool_calls_view("[]", instance("i", "[]"))
    assert nothing is not None and nothing.correct and nothing.calls == [] and nothing.expected == []
    invented = tool_calls_view(json.dumps([call("weather", city="Paris")]), instance("i", "[]"))
    assert invented is not None and invented.reason == "called_when_irrelevant"
    assert tool_calls_view(None, instance("a", area_target(10))).reason == "wrong_count"  # type: ignore[union-attr]


def test_a_text_answer_instance_has_no_tool_calls_view() -> None:
    plain = Instance(id="q", input="2+2?", target="4")
    assert tool_calls_view("4", plain) is None
    listed = Instance(id="q", input="Sort them", target='["a", "b"]')  # a JSON list, but no function docs
    assert tool_calls_view('["a", "b"]', listed) is None
    assert calls_target('[{"f": {"x": [1]}}]') and calls_target(" [] ")
    assert not calls_target("4") and not calls_target("[not json") and not calls_target(None)


def test_hostile_arguments_are_kept_verbatim_for_the_page_to_render_as_text() -> None:
    answer = json.dumps([call(HOSTILE_NAME, base=HOSTILE_ARGUMENT, height=5)])
    view = tool_calls_view(answer, instance("a", area_target(10)))
    assert view is not None
    row = view.call_rows()[0]
    assert row["function"] == HOSTILE_NAME and json.loads(row["arguments"])["base"] == HOSTILE_ARGUMENT
    assert HOSTILE_NAME in view.verdict


def test_expected_rows_of_a_call_without_parameters() -> None:
    rows = expected_rows([{"now": {}}])
    assert [(r.function, r.parameter, r.allowed, r.optional) for r in rows] == [("now", "", "", False)]


def first(allowed: object) -> object:
    return (allowed or [""])[0] if isinstance(allowed, list) else allowed


def test_the_view_holds_for_every_fetched_bfcl_entry() -> None:
    """Every real entry of the five suites shapes into rows, one per expected parameter, and the
    answer built from each entry's first allowed values is read back as that many calls."""
    from ecdysis.suites.bfcl import SUITES, is_fetched, load_bfcl
    if not is_fetched():
        pytest.skip("the BFCL data is not fetched here (scripts/fetch_bfcl.py)")
    for name in SUITES:
        for inst in load_bfcl(name).instances:
            expected = json.loads(inst.target)
            answer = json.dumps([{"name": f, "arguments": {p: first(v) for p, v in params.items() if first(v) != ""}}
                                 for want in expected for f, params in want.items()])
            view = tool_calls_view(answer, inst)
            assert view is not None and view.expected_calls == len(expected), inst.id
            assert len(view.call_rows()) == len(expected), inst.id
            assert len(view.expected_rows()) == sum(max(1, len(p)) for want in expected for p in want.values())


def test_agent_members_show_mechanism_and_check_where_text_members_show_evidence() -> None:
    agent = {"instance_id": "t1", "model": "m", "category": "simple", "type": "wrong_argument", "run_id": "r",
             "answer": "[...]", "target": "[...]", "excerpt": "long excerpt",
             "detail": {"mechanism": "wrong type", "check": "triangle_area.base is str '10', expected integer"}}
    text = {"instance_id": "q1", "model": "m", "category": "math", "type": "wrong_answer", "run_id": "r",
            "answer": "5", "target": "4", "excerpt": "said 5"}
    agent_row, text_row = views.member_rows(Cluster.from_json({"id": "c1", "members": [agent, text]}))
    check = "triangle_area.base is str '10', expected integer"
    assert (agent_row["mechanism"], agent_row["check"]) == ("wrong type", check)
    assert "evidence" not in agent_row and "mechanism" not in text_row and text_row["evidence"] == "said 5"
    assert views.member_evidence(agent_row) == f"wrong type; checker: {check}"
    assert views.member_evidence(text_row) == "said 5"
    assert views.filter_members([agent_row, text_row], text="EXPECTED INTEGER") == [agent_row]


# ---------------------------------------------------------------- the pages, on a stored run

CORRECT = json.dumps([call("triangle_area", base=10, height=5)])
WRONG_TYPE = json.dumps([call("triangle_area", base=HOSTILE_ARGUMENT, height=5)])
INVENTED = json.dumps([call(HOSTILE_NAME, base=13, height=5)])


def suite_jsonl() -> bytes:
    """t0 answered right, t1-t3 with a hostile string for an integer, t4 with a hostile invented
    function; i0 offers a function that does not apply, and the model rightly calls none."""
    lines: list[dict] = [{"ecdysis_suite": {"name": "tools", "scorer": {"kind": "bfcl_ast"}}}]
    lines += [{"id": f"t{n}", "input": f"Area of a triangle with base {10 + n} and height 5 (t{n})?",
               "target": area_target(10 + n), "category": "simple", "split": "train",
               "fields": {"functions": [AREA]}} for n in range(5)]
    lines.append({"id": "i0", "input": "What is the weather in Paris (i0)?", "target": "[]",
                  "category": "irrelevance", "split": "train", "fields": {"functions": [AREA]}})
    return "\n".join(json.dumps(line) for line in lines).encode()


def register_caller() -> None:
    register_backend(ScriptedBackend([Rule(CORRECT, "(t0)"), Rule(INVENTED, "(t4)"), Rule("[]", "(i0)")],
                                     model_id="caller", default=WRONG_TYPE))


@pytest.fixture
def agent_run(ecdysis_home: Path) -> tuple[str, str]:
    """(run id, diagnosis id) of the caller model on the tools suite, in this test's store."""
    svc = open_service()
    try:
        svc.import_suite(suite_jsonl(), name="tools", filename="tools.jsonl")
        register_caller()
        run_id = svc.run(RunRequest(suite="tools", model="caller")).run_id
        return run_id, svc.diagnose([run_id]).id
    finally:
        svc.store.close()  # type: ignore[attr-defined]


def outside_code(markdown: str) -> str:
    """What of `markdown` is read as Markdown: backslash escapes and code spans set aside."""
    return re.sub(r"`[^`]*`", "", re.sub(r"\\.", "", markdown, flags=re.S))


def frames(at) -> list:  # type: ignore[no-untyped-def]
    return [d.value for d in at.dataframe]


def test_the_runs_page_shows_an_agent_trajectory_as_tool_calls_and_turns(agent_run: tuple[str, str]) -> None:
    run_id, _ = agent_run
    svc = open_service()
    try:
        results = {r.instance_id: r for r in svc.results(run_id)}
    finally:
        svc.store.close()  # type: ignore[attr-defined]
    assert [results[i].correct for i in ("t0", "t1", "t4", "i0")] == [True, False, False, True]
    at = open_page("1_runs")
    assert by_label(at.selectbox, "Run").value == run_id
    pick = by_label(at.selectbox, "Trajectory of instance")
    pick.set_value("t0").run()
    assert_clean(at)
    words = texts(at)
    assert "**Tool calls**" in words and "**checker**: correct" in words
    assert "**Expected** · 1 call, in any order" in words
    assert "**Turns** · 1 model call" in words and any(m.name == "assistant" for m in at.chat_message)
    calls = next(f for f in frames(at) if "listed by the task" in f.columns)
    assert list(calls["function"]) == ["triangle_area"] and list(calls["listed by the task"]) == ["yes"]
    assert json.loads(calls["arguments"][0]) == {"base": 10, "height": 5}
    expected = next(f for f in frames(at) if "allowed values" in f.columns)
    assert list(expected["parameter"]) == ["base", "height"] and list(expected["allowed values"]) == ["[10]", "[5]"]

    by_label(at.selectbox, "Trajectory of instance").set_value("t4").run()
    assert_clean(at)
    calls = next(f for f in frames(at) if "listed by the task" in f.columns)
    assert list(calls["function"]) == [HOSTILE_NAME] and list(calls["listed by the task"]) == ["no"]
    assert f"**checker**: wrong function: called {HOSTILE_NAME!r}, expected 'triangle_area'" in texts(at)

    by_label(at.selectbox, "Trajectory of instance").set_value("i0").run()
    assert_clean(at)
    assert "The answer holds no call." in texts(at)
    assert "No function applies here: the right answer is no call at all." in texts(at)


def test_a_text_answer_trajectory_has_no_tool_calls_view(ecdysis_home: Path) -> None:
    register_backend(ScriptedBackend(model_id="plain", default="42"))
    svc = open_service()
    try:
        svc.run(RunRequest(suite="reasoning-mix", model="plain", limit=2))
    finally:
        svc.store.close()  # type: ignore[attr-defined]
    at = open_page("1_runs")
    assert "call 1" in texts(at) and "Tool calls" not in texts(at) and "**Turns**" not in texts(at)


def test_an_agent_cluster_drills_down_to_mechanism_check_and_tool_calls(agent_run: tuple[str, str]) -> None:
    run_id, diagnosis_id = agent_run
    svc = open_service()
    try:
        report = svc.get_diagnosis(diagnosis_id).report
    finally:
        svc.store.close()  # type: ignore[attr-defined]
    typed = next(c for c in report["clusters"] if {m["type"] for m in c["members"]} == {"wrong_argument"})
    assert typed["label"].startswith(FAILURE_TITLES["wrong_argument"])
    at = open_page("2_clusters")
    by_label(at.selectbox, "Cluster").set_value(typed["id"]).run()
    assert_clean(at)
    assert FAILURE_TITLES["wrong_argument"] in texts(at), "the cluster card names the agent failure type"
    members = next(f for f in frames(at) if "mechanism" in f.columns)
    assert "evidence" not in members.columns and set(members["mechanism"]) == {"wrong type"}
    assert all(c.startswith("triangle_area.base is str") and "<script>alert(" in c for c in members["check"])
    assert by_label(at.multiselect, "Failure types").options == [FAILURE_TITLES["wrong_argument"]]
    words = texts(at)
    title = FAILURE_TITLES["wrong_argument"]
    assert f"failure type: {title} — wrong type; checker: triangle_area.base is str" in words
    assert "**Tool calls**" in words and "**checker**: wrong type: triangle_area.base is str" in words
    calls = next(f for f in frames(at) if "listed by the task" in f.columns)
    assert json.loads(calls["arguments"][0])["base"] == HOSTILE_ARGUMENT


@pytest.mark.parametrize("page", ["1_runs", "2_clusters"])
def test_hostile_calls_reach_the_page_as_text_never_as_markup(agent_run: tuple[str, str], page: str) -> None:
    """What the model wrote in a function's name and arguments shows verbatim in the tables (text
    cells), in the checker's verdict (escaped Markdown) and in the turns (`st.text`); nothing of it
    is live Markdown or HTML, and no element takes HTML at all."""
    at = open_page(page)
    if page == "1_runs":
        picks = ["t1", "t4"]
    else:
        picks = [by_label(at.selectbox, "Trajectory of instance").value.partition("/")[2]]
    for chosen in picks:
        if page == "1_runs":
            by_label(at.selectbox, "Trajectory of instance").set_value(chosen).run()
        assert_clean(at)
        bodies = _markdown_bodies(at)
        assert not [b for b in bodies if live_markup(b)], [b for b in bodies if live_markup(b)][:3]
        assert not at.get("html"), "no model text goes through st.html"
        assert any("script" in b and "alert" in b for b in bodies), "the verdict quotes the hostile value, escaped"
        # A code span (`app.text.code`, the answer in the header) shows <script> literally too.
        assert not [b for b in bodies if SCRIPT in outside_code(b)], "no raw <script> reaches Markdown"
        cells = "\n".join(str(v) for f in frames(at) for col in f.columns for v in f[col])
        assert SCRIPT in cells, "the argument is shown as it was written, as text"
        plain = "\n".join(str(t.value) for t in at.text)
        assert SCRIPT in plain, "the model's reply is shown verbatim in the turns"
