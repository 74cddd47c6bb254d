"""Built-in suites, generated rather than stored: the first source `load_suite` consults, feeding the
runner five reasoning categories whose answers a program can check exactly.

Generation is deterministic and needs no global random state: instance N of category C comes from
`random.Random("ecdysis:C:N")` (string seeds hash the same in every process; a question equal to an
earlier one is redrawn from "ecdysis:C:N:1", ...). So an id such as `arithmetic-0007` always names
the same problem, and the mix holds exactly the instances of the per-category suites. Templates vary
within each category, so a harness weakness (answer format, arithmetic slips, reading the options)
shows up across templates and categories rather than on one phrasing.

Mixed scorers: `reasoning-mix` uses the `by_category` scorer, whose options map each category to
the scorer of its own suite (arithmetic and object-counting `numeric`, dates `multiple_choice`,
word-sorting and boolean `exact`). The scorer of an instance is therefore a function of its category
alone, it is the same in the mix as in the single-category suite, and it lives in the suite's
`ScorerSpec`, not in `Instance.fields` (which the harness sees).
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from datetime import date, timedelta

from ecdysis.errors import NotFound
from ecdysis.records import Instance, ScorerSpec, Suite
from ecdysis.suites.scorers import spec_to_json

PER_CATEGORY = 60
MIX_NAME = "reasoning-mix"


@dataclass(frozen=True)
class Problem:
    input: str
    target: str
    choices: tuple[str, ...] | None = None


Maker = Callable[[random.Random, int], Problem]

# ---------------------------------------------------------------- shared vocabulary

_NAMES = [("Maria", "she", "her"), ("Tom", "he", "his"), ("Aisha", "she", "her"), ("Kenji", "he", "his"),
          ("Lucia", "she", "her"), ("Omar", "he", "his"), ("Priya", "she", "her"), ("Lars", "he", "his"),
          ("Nadia", "she", "her"), ("Diego", "he", "his")]
_MONTHS = ["January", "February", "March", "April", "May", "June", "July", "August", "September",
           "October", "November", "December"]
_SMALL_NUMBERS = ["zero", "one", "two", "three", "four", "five"]


def _person(rng: random.Random) -> tuple[str, str, str]:
    return rng.choice(_NAMES)


# ---------------------------------------------------------------- arithmetic word problems

def _arith_change(rng: random.Random) -> Problem:
    name, he, _ = _person(rng)
    items = rng.choice(["notebooks", "pens", "sandwiches", "tickets", "candles", "mugs", "batteries"])
    n, price = rng.randint(3, 9), rng.randint(2, 12)
    bill = next(b for b in (20, 50, 100, 200) if b > n * price)
    return Problem(f"{name} buys {n} {items} at ${price} each and pays with a ${bill} bill. "
                   f"How much change, in dollars, does {he} get back?", str(bill - n * price))


def _arith_collect(rng: random.Random) -> Problem:
    name, he, _ = _person(rng)
    thing = rng.choice(["stickers", "marbles", "cards", "stamps", "shells"])
    have, packs, per = rng.randint(5, 40), rng.randint(2, 6), rng.randint(3, 12)
    give = rng.randint(1, have + packs * per - 1)
    friend = rng.choice(["a friend", "a cousin", "a neighbour", "a classmate"])
    return Problem(f"{name} has {have} {thing}. {he.capitalize()} buys {packs} packs with {per} {thing} in "
                   f"each pack, then gives {give} {thing} to {friend}. How many {thing} does {name} have now?",
                   str(have + packs * per - give))


def _arith_travel(rng: random.Random) -> Problem:
    vehicle = rng.choice(["A train", "A bus", "A truck", "A ferry"])
    v1, t1, v2, t2 = rng.randint(3, 12) * 5, rng.randint(2, 5), rng.randint(3, 12) * 5, rng.randint(1, 4)
    return Problem(f"{vehicle} travels at {v1} km per hour for {t1} hours and then at {v2} km per hour for "
                   f"{t2} hours. How many kilometres does it travel in total?", str(v1 * t1 + v2 * t2))


def _arith_share(rng: random.Random) -> Problem:
    boxes, per, families = rng.randint(3, 9), rng.choice([6, 10, 12]), rng.randint(2, 6)
    total = boxes * per
    broken = total % families + families * rng.randint(0, 2)
    if broken == 0 or broken >= total:
        broken = total % families or families
    return Problem(f"There are {boxes} boxes with {per} eggs in each box. {broken} eggs break, and the rest "
                   f"are shared equally among {families} families. How many eggs does each family get?",
                   str((total - broken) // families))


def _arith_age(rng: random.Random) -> Problem:
    name, _, his = _person(rng)
    relative = rng.choice(["son", "daughter", "nephew", "niece"])
    times, age, years = rng.randint(2, 5), rng.randint(4, 12), rng.randint(2, 15)
    return Problem(f"{name} is {times} times as old as {his} {relative}, who is {age} years old. "
                   f"How old will {name} be in {years} years?", str(times * age + years))


def _arith_discount(rng: random.Random) -> Problem:
    item = rng.choice(["jacket", "lamp", "backpack", "pair of shoes", "bicycle helmet"])
    price, pct = 20 * rng.randint(2, 15), rng.choice([10, 20, 25, 50, 75])
    return Problem(f"A {item} costs ${price}. During a sale its price is reduced by {pct}%. "
                   f"What is the sale price in dollars?", str(price - price * pct // 100))


def _arith_savings(rng: random.Random) -> Problem:
    name, he, _ = _person(rng)
    weekly, has, weeks = rng.randint(3, 20), rng.randint(1, 60), rng.randint(3, 12)
    goal = has + weekly * weeks
    return Problem(f"{name} already has ${has} and saves ${weekly} every week. After how many weeks will "
                   f"{he} have exactly ${goal}?", str(weeks))


def _arith_library(rng: random.Random) -> Problem:
    start, mon, tue = rng.randint(120, 400), rng.randint(10, 60), rng.randint(10, 60)
    back = rng.randint(5, mon + tue)
    return Problem(f"A library had {start} books. It lent out {mon} books on Monday and {tue} books on "
                   f"Tuesday, and {back} books were returned on Wednesday. How many books are in the "
                   f"library now?", str(start - mon - tue + back))


_ARITHMETIC = [_arith_change, _arith_collect, _arith_travel, _arith_share, _arith_age, _arith_discount,
               _arith_savings, _arith_library]


def make_arithmetic(rng: random.Random, index: int) -> Problem:
    return _ARITHMETIC[index % len(_ARITHMETIC)](rng)


# ---------------------------------------------------------------- date arithmetic (multiple choice)

def mdy(day: date) -> str:
    return f"{day.month:02d}/{day.day:02d}/{day.year}"


def _prose(day: date) -> str:
    # Month names come from our own list: strftime("%B") depends on the locale.
    return f"{_MONTHS[day.month - 1]} {day.day}, {day.year}"


def _random_day(rng: random.Random, first_year: int = 1990, last_year: int = 2030) -> date:
    start, end = date(first_year, 1, 1), date(last_year, 12, 31)
    return start + timedelta(days=rng.randint(0, (end - start).days))


def _shift_months(day: date, months: int) -> date:
    month0 = day.month - 1 + months
    year, month = day.year + month0 // 12, month0 % 12 + 1
    return date(year, month, min(day.day, 28))


def _shift_years(day: date, years: int) -> date:
    return date(day.year + years, day.month, min(day.day, 28) if day.month == 2 else day.day)


def _distractors(rng: random.Random, answer: date, wrong_way: date | None) -> list[str]:
    near = [answer + timedelta(days=d) for d in (-1, 1, -7, 7)]
    near += [_shift_months(answer, -1), _shift_months(answer, 1), _shift_years(answer, -1),
             _shift_years(answer, 1)]
    if answer.day <= 12 and answer.day != answer.month:
        near.append(date(answer.year, answer.day, answer.month))  # day and month swapped
    # The date reached by going the wrong way, when there is one, is always among the options.
    picks = [mdy(wrong_way)] if wrong_way is not None and wrong_way != answer else []
    pool = sorted({mdy(d) for d in near} - {mdy(answer), *picks})
    return picks + rng.sample(pool, 3 - len(picks))


def _date_question(rng: random.Random, text: str, answer: date, wrong_way: date | None = None) -> Problem:
    choices = [mdy(answer), *_distractors(rng, answer, wrong_way)]
    rng.shuffle(choices)
    return Problem(text, mdy(answer), tuple(choices))


def _written(rng: random.Random, day: date) -> str:
    return _prose(day) if rng.random() < 0.6 else mdy(day)


def _dates_offset(rng: random.Random) -> Problem:
    today, n = _random_day(rng), rng.choice([3, 5, 10, 12, 15, 20, 24, 30, 45, 60])
    if rng.random() < 0.5:
        return _date_question(rng, f"Today is {_written(rng, today)}. What is the date {n} days from now "
                                   f"in MM/DD/YYYY?", today + timedelta(days=n), today - timedelta(days=n))
    return _date_question(rng, f"Today is {_written(rng, today)}. What was the date {n} days ago in "
                               f"MM/DD/YYYY?", today - timedelta(days=n), today + timedelta(days=n))


def _dates_neighbours(rng: random.Random) -> Problem:
    day = _random_day(rng)
    if rng.random() < 0.5:
        return _date_question(rng, f"Yesterday was {_written(rng, day)}. What is the date tomorrow in "
                                   f"MM/DD/YYYY?", day + timedelta(days=2), day)
    return _date_question(rng, f"The day before yesterday was {_written(rng, day)}. What is the date "
                               f"today in MM/DD/YYYY?", day + timedelta(days=2), day + timedelta(days=1))


def _dates_weeks(rng: random.Random) -> Problem:
    event, weeks = _random_day(rng), rng.randint(1, 6)
    what = rng.choice(["The concert", "Our meeting", "The exam", "My flight"])
    return _date_question(rng, f"{what} is on {_written(rng, event)}, which is exactly {weeks} week"
                               f"{'s' if weeks > 1 else ''} from today. What is the date today in MM/DD/YYYY?",
                          event - timedelta(weeks=weeks), event + timedelta(weeks=weeks))


def _dates_february(rng: random.Random) -> Problem:
    year = rng.randint(1995, 2030)
    last = date(year, 3, 1) - timedelta(days=1)
    n = rng.randint(1, 10)
    leap = last.day == 29
    misread = last + timedelta(days=n - 1 if leap else n + 1)  # the answer with the leap year misjudged
    return _date_question(rng, f"Today is the last day of February {year}. What is the date {n} day"
                               f"{'s' if n > 1 else ''} later in MM/DD/YYYY?", last + timedelta(days=n), misread)


def _dates_birthday(rng: random.Random) -> Problem:
    name, _, his = _person(rng)
    born = _random_day(rng, 1950, 2005)
    if born.month == 2 and born.day == 29:  # a birthday that most years lack has no well-defined answer
        born = born.replace(day=28)
    age = rng.randint(5, 40)
    return _date_question(rng, f"{name} was born on {_written(rng, born)}. What is the date of {his} "
                               f"{_ordinal(age)} birthday in MM/DD/YYYY?", born.replace(year=born.year + age))


def _dates_month(rng: random.Random) -> Problem:
    today = _random_day(rng)
    today = today.replace(day=min(today.day, 28))
    return _date_question(rng, f"Today is {_written(rng, today)}. What is the date one month ago in "
                               f"MM/DD/YYYY?", _shift_months(today, -1), _shift_months(today, 1))


def _ordinal(n: int) -> str:
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


_DATES = [_dates_offset, _dates_neighbours, _dates_weeks, _dates_february, _dates_birthday, _dates_month]


def make_dates(rng: random.Random, index: int) -> Problem:
    return _DATES[index % len(_DATES)](rng)


# ---------------------------------------------------------------- word sorting

# Clusters of shared prefixes make the order depend on more than the first letter.
_WORD_CLUSTERS = [
    "car card care career carpet cart cartoon", "sun sunday sunflower sunny sunset",
    "star start starve stare", "pan panda panel panic pants", "port portal porter portion",
    "tea teach team tear teapot", "man mango manner mantle manual", "bat batch bath baton battle",
]
_WORDS = """apple bridge candle desert engine falcon garden harbor island jacket kettle lemon meadow
needle orange pepper quartz river saddle tunnel umbrella valley window yellow zebra anchor blossom
cactus dolphin emerald feather glacier hammer igloo jungle koala ladder magnet nectar oyster pillow
quiver rocket silver timber uniform velvet walnut xylophone yogurt zipper almond basket cobalt donkey
ember fossil granite hollow insect jigsaw kernel lantern marble nutmeg orchid pebble quill ribbon
spider thistle urchin violet willow yacht zenith""".split()

_SORT_TEMPLATES = [
    "Sort the following words alphabetically: List: {words}\nAnswer with the sorted words separated by spaces.",
    "Put these words in alphabetical order and write them separated by spaces: {words}",
    "Arrange the words below in dictionary order (A to Z). Reply with the words separated by single "
    "spaces.\n{commas}",
    "Alphabetize: {commas}. Give the result as space-separated words.",
]


def make_word_sorting(rng: random.Random, index: int) -> Problem:
    size = rng.randint(4, 9)
    cluster = rng.choice(_WORD_CLUSTERS).split()
    from_cluster = rng.sample(cluster, min(len(cluster), rng.randint(2, 4)))
    others = rng.sample([w for w in _WORDS if w not in from_cluster], size - len(from_cluster))
    words = from_cluster + others
    rng.shuffle(words)
    template = _SORT_TEMPLATES[index % len(_SORT_TEMPLATES)]
    return Problem(template.format(words=" ".join(words), commas=", ".join(words)), " ".join(sorted(words)))


# ---------------------------------------------------------------- object counting

# (singular with article, plural) per kind; plurals are spelled out because English is irregular.
_THINGS: dict[str, list[tuple[str, str]]] = {
    "fruits": [("an apple", "apples"), ("a banana", "bananas"), ("a peach", "peaches"), ("a plum", "plums"),
               ("an orange", "oranges"), ("a strawberry", "strawberries"), ("a nectarine", "nectarines"),
               ("a raspberry", "raspberries"), ("a grape", "grapes")],
    "vegetables": [("a carrot", "carrots"), ("a potato", "potatoes"), ("an onion", "onions"),
                   ("a cabbage", "cabbages"), ("a yam", "yams"), ("a cauliflower", "cauliflowers"),
                   ("a stalk of celery", "stalks of celery"), ("a lettuce head", "lettuce heads")],
    "animals": [("a cat", "cats"), ("a dog", "dogs"), ("a rabbit", "rabbits"), ("a goat", "goats"),
                ("a mouse", "mice"), ("a fish", "fish"), ("a donkey", "donkeys"), ("a snail", "snails"),
                ("a frog", "frogs"), ("a chicken", "chickens")],
    "musical instruments": [("a piano", "pianos"), ("a violin", "violins"), ("a flute", "flutes"),
                            ("a drum", "drums"), ("a trumpet", "trumpets"), ("a clarinet", "clarinets"),
                            ("an accordion", "accordions"), ("a trombone", "trombones")],
}


@dataclass(frozen=True)
class _Held:
    kind: str
    singular: str
    plural: str
    count: int

    def phrase(self) -> str:
        return self.singular if self.count == 1 else f"{_SMALL_NUMBERS[self.count]} {self.plural}"

    def bare(self) -> str:
        return self.singular.split(" ", 1)[1]


def _pick_held(rng: random.Random, asked: str) -> list[_Held]:
    kinds = list(_THINGS)
    chosen: list[_Held] = []
    for i in range(rng.randint(3, 7)):
        kind = asked if i < 2 else rng.choice(kinds)  # at least two items of the asked kind
        taken = {h.singular for h in chosen}
        singular, plural = rng.choice([t for t in _THINGS[kind] if t[0] not in taken])
        chosen.append(_Held(kind, singular, plural, rng.choice([1, 1, 2, 3, 4, 5])))
    rng.shuffle(chosen)
    return chosen


def _listing(rng: random.Random, held: list[_Held]) -> str:
    parts = [h.phrase() for h in held]
    comma = "," if rng.random() < 0.5 else ""
    return ", ".join(parts[:-1]) + f"{comma} and {parts[-1]}"


# (opening, question) pairs for the plain variant; {kind} is the asked kind.
_COUNT_FRAMES = [
    ("I have {listing}.", "How many {kind} do I have?"),
    ("My neighbour gave me {listing}.", "How many {kind} did my neighbour give me?"),
    ("Yesterday I bought {listing}.", "How many {kind} did I buy?"),
    ("In my house there are {listing}.", "How many {kind} are in my house?"),
]


def make_object_counting(rng: random.Random, index: int) -> Problem:
    asked = rng.choice(list(_THINGS))
    held = _pick_held(rng, asked)
    count = sum(h.count for h in held if h.kind == asked)
    listing = _listing(rng, held)
    variant = index % 4
    if variant in (0, 1):
        opening, question = rng.choice(_COUNT_FRAMES)
        return Problem(f"{opening.format(listing=listing)} {question.format(kind=asked)}", str(count))
    changed = rng.choice([h for h in held if h.kind == asked])
    if variant == 2:
        return Problem(f"I have {listing}. Then I give away one {changed.bare()}. How many {asked} do I have "
                       f"now?", str(count - 1))
    more = rng.randint(2, 4)
    return Problem(f"I own {listing}. Later I get {_SMALL_NUMBERS[more]} more {changed.plural}. How many "
                   f"{asked} do I own in total?", str(count + more))


# ---------------------------------------------------------------- boolean expressions

_PRECEDENCE = {"or": 1, "and": 2, "not": 3}


@dataclass(frozen=True)
class BoolExpr:
    """A tree of `not` / `and` / `or` over True and False; `op` is None for a constant."""

    op: str | None
    args: tuple["BoolExpr", ...] = ()
    value: bool = False

    def evaluate(self) -> bool:
        if self.op is None:
            return self.value
        if self.op == "not":
            return not self.args[0].evaluate()
        left, right = (a.evaluate() for a in self.args)
        return (left and right) if self.op == "and" else (left or right)

    def precedence(self) -> int:
        return _PRECEDENCE[self.op] if self.op else 4


def _random_expr(rng: random.Random, ops: int) -> BoolExpr:
    if ops == 0:
        return BoolExpr(None, value=rng.random() < 0.5)
    if rng.random() < 0.3:
        return BoolExpr("not", (_random_expr(rng, ops - 1),))
    left_ops = rng.randint(0, ops - 1)
    return BoolExpr(rng.choice(["and", "or"]), (_random_expr(rng, left_ops), _random_expr(rng, ops - 1 - left_ops)))


def render(expr: BoolExpr, rng: random.Random) -> str:
    """Python syntax with the parentheses precedence needs, plus a few redundant ones."""
    if expr.op is None:
        return str(expr.value)
    if expr.op == "not":
        return f"not {_child(expr.args[0], expr, rng)}"
    return f" {expr.op} ".join(_child(a, expr, rng) for a in expr.args)


def _child(child: BoolExpr, parent: BoolExpr, rng: random.Random) -> str:
    text = render(child, rng)
    needed = child.precedence() < parent.precedence()
    optional = child.op in ("and", "or") and rng.random() < 0.3
    return f"( {text} )" if needed or optional else text


_BOOL_TEMPLATES = [
    "{expr} is",
    "Evaluate the boolean expression: {expr}",
    "What is the value of the Python expression `{expr}`? Answer True or False.",
    "Is the following expression True or False? {expr}",
]


def make_boolean(rng: random.Random, index: int) -> Problem:
    wanted = index % 2 == 0  # alternate the answer so always guessing one value scores 50%
    while True:
        expr = _random_expr(rng, rng.randint(2, 5))
        if expr.evaluate() == wanted:
            break
    text = render(expr, rng)
    return Problem(_BOOL_TEMPLATES[index % len(_BOOL_TEMPLATES)].format(expr=text), str(wanted))


# ---------------------------------------------------------------- the suites

@dataclass(frozen=True)
class Category:
    name: str
    scorer: ScorerSpec
    description: str
    make: Maker

    def instance(self, index: int, attempt: int = 0) -> Instance:
        seed = f"ecdysis:{self.name}:{index}" + (f":{attempt}" if attempt else "")
        problem = self.make(random.Random(seed), index)
        return Instance(id=f"{self.name}-{index:04d}", input=problem.input, target=problem.target,
                        category=self.name, choices=problem.choices)

    def instances(self, count: int = PER_CATEGORY) -> list[Instance]:
        """Instances 0..count-1; a repeated question is redrawn, so no problem sits in two splits."""
        seen: set[str] = set()
        out: list[Instance] = []
        for index in range(count):
            inst, attempt = self.instance(index), 0
            while inst.input in seen:
                attempt += 1
                inst = self.instance(index, attempt)
            seen.add(inst.input)
            out.append(inst)
        return out


CATEGORIES: dict[str, Category] = {c.name: c for c in [
    Category("arithmetic", ScorerSpec("numeric"), "Multi-step arithmetic word problems (money, rates, "
             "sharing, ages); the answer is one number.", make_arithmetic),
    Category("dates", ScorerSpec("multiple_choice"), "Date arithmetic (days, weeks, months, leap years, "
             "birthdays); pick the right MM/DD/YYYY date of four.", make_dates),
    Category("word-sorting", ScorerSpec("exact"), "Sort 4-9 words alphabetically, many sharing a prefix; "
             "answer the words separated by spaces.", make_word_sorting),
    Category("object-counting", ScorerSpec("numeric"), "Count the items of one kind (fruits, vegetables, "
             "animals, instruments) among distractors, sometimes after a change.", make_object_counting),
    Category("boolean", ScorerSpec("exact"), "Evaluate a Python boolean expression with not/and/or and "
             "parentheses; answer True or False.", make_boolean),
]}


def builtin_suite_names() -> list[str]:
    return [MIX_NAME, *CATEGORIES]


def mix_scorer() -> ScorerSpec:
    return ScorerSpec("by_category", {"categories": {c.name: spec_to_json(c.scorer) for c in CATEGORIES.values()}})


def builtin_suite(name: str) -> Suite:
    """A built-in suite with splits unassigned (`load_suite` assigns them)."""
    if name == MIX_NAME:
        instances = [inst for c in CATEGORIES.values() for inst in c.instances()]
        return Suite(name=MIX_NAME, instances=instances, scorer=mix_scorer(), source="builtin",
                     description=f"All five built-in reasoning categories, {PER_CATEGORY} instances each.")
    category = CATEGORIES.get(name)
    if category is None:
        raise NotFound(f"no built-in suite {name!r}", hint=f"built-in suites: {', '.join(builtin_suite_names())}")
    return Suite(name=name, instances=category.instances(), scorer=category.scorer, source="builtin",
                 description=category.description)
