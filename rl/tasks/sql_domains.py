"""More SQL databases, each a parent table and a child table that refers
to it, described in a few lines and questioned by one set of templates.

The three hand-written schemas (rl.tasks.sql_schemas) have their own
templates; these domains share twelve template shapes at three levels, so
that whole databases can be held out (`sarl tasks split --by family`) and a
model is measured on tables and columns it never queried:

  1  a count or a list filtered on one column of the parent
  2  grouping, averages and a top-n over the parent; a filtered count of the child
  3  a join with a sum, a filter, HAVING, or NOT IN

A question names its tables' words (a doctor, a visit), not the SQL names,
as the hand-written ones do; the `sql` tool lets the policy read the schema.
Not covered: a domain's template shapes are the same across domains, so a
held-out database is new data and vocabulary, not a new kind of question.
"""

from __future__ import annotations

import random
import sqlite3
from collections.abc import Callable
from dataclasses import dataclass

from rl.tasks.sql_schemas import FIRST, LAST, _script

Params = Callable[[sqlite3.Connection], list[dict[str, object]]]


@dataclass(frozen=True)
class Domain:
    """A parent table of people (id, name, a category, a number, a year) and
    a child table of their records (id, parent id, an amount)."""

    name: str
    parent: str
    """The parent table, plural: `doctors`."""
    category: str
    categories: tuple[str, ...]
    number: str
    number_range: tuple[int, int]
    year: str
    """A year column: when a person joined, was hired, debuted."""
    child: str
    """The child table, plural: `visits`."""
    amount: str
    amount_range: tuple[float, float]
    parents: int = 28
    children: int = 75


DOMAINS = (
    Domain(
        "clinic",
        "doctors",
        "specialty",
        ("cardio", "derma", "neuro", "ortho", "pedia"),
        "salary",
        (40, 160),
        "hired",
        "visits",
        "cost",
        (20.0, 400.0),
    ),
    Domain(
        "hotel",
        "guests",
        "country",
        ("Chile", "Kenya", "Japan", "Peru", "Spain", "Wales"),
        "age",
        (18, 90),
        "first_stay",
        "stays",
        "nights",
        (1.0, 21.0),
    ),
    Domain(
        "league",
        "players",
        "team",
        ("Falcons", "Otters", "Ravens", "Wolves"),
        "height",
        (160, 210),
        "debut",
        "matches",
        "points",
        (0.0, 40.0),
    ),
    Domain(
        "farm",
        "farmers",
        "region",
        ("north", "south", "east", "west", "coast"),
        "acres",
        (5, 300),
        "since",
        "harvests",
        "tons",
        (0.5, 60.0),
    ),
    Domain(
        "studio",
        "artists",
        "genre",
        ("jazz", "folk", "metal", "soul", "techno"),
        "fee",
        (100, 2000),
        "signed",
        "tracks",
        "minutes",
        (1.5, 12.0),
    ),
    Domain(
        "museum",
        "curators",
        "wing",
        ("east", "modern", "antique", "science"),
        "budget",
        (10, 500),
        "joined",
        "exhibits",
        "visitors",
        (100.0, 9000.0),
    ),
)
"""Each domain's tables, by name; the tasks' family is `sql-{name}`."""


def _single(table: str) -> str:
    return table[:-1]


def script(d: Domain, rng: random.Random) -> str:
    """The domain's database, drawn from `rng`."""
    people = [
        (
            i,
            f"{rng.choice(FIRST)} {rng.choice(LAST)}",
            rng.choice(d.categories),
            rng.randint(*d.number_range),
            rng.randint(2005, 2024),
        )
        for i in range(1, d.parents + 1)
    ]
    low, high = d.amount_range
    records = [(i, rng.randint(1, d.parents), round(rng.uniform(low, high), 1)) for i in range(1, d.children + 1)]
    fk = f"{_single(d.parent)}_id"
    return _script(
        {
            d.parent: (
                f"CREATE TABLE {d.parent} (id INTEGER PRIMARY KEY, name TEXT, {d.category} TEXT, "
                f"{d.number} INTEGER, {d.year} INTEGER)",
                people,
            ),
            d.child: (
                f"CREATE TABLE {d.child} (id INTEGER PRIMARY KEY, {fk} INTEGER REFERENCES {d.parent}(id), "
                f"{d.amount} REAL)",
                records,
            ),
        }
    )


def _distinct(col: str, table: str) -> Params:
    return lambda db: [{"v": r[0]} for r in db.execute(f"SELECT DISTINCT {col} FROM {table} ORDER BY 1")]


def _cuts(col: str, table: str, key: str = "x") -> Params:
    """Thresholds between the column's quartiles: never an empty or a whole answer."""

    def params(db: sqlite3.Connection) -> list[dict[str, object]]:
        values = sorted(r[0] for r in db.execute(f"SELECT {col} FROM {table}"))
        picks = {values[len(values) * q // 8] for q in range(1, 8)}
        return [{key: int(v) if float(v).is_integer() else v} for v in sorted(picks)]

    return params


def _counts(k: list[int]) -> Params:
    return lambda db: [{"k": v} for v in k]


NONE: Params = lambda db: [{}]  # noqa: E731


@dataclass(frozen=True)
class QuestionShape:
    """A question and its query over any domain: `{P}` the parent table,
    `{C}` the category, `{N}` the number, `{Y}` the year, `{K}` the child
    table, `{A}` the amount, `{fk}` the child's key to the parent."""

    key: str
    level: int
    question: str
    query: str
    params: Callable[[Domain], Params]
    ordered: bool = False


SHAPES = (
    QuestionShape(
        "count-cat",
        1,
        "How many {P} have the {C} {v}?",
        "SELECT COUNT(*) FROM {P} WHERE {C} = '{v}'",
        lambda d: _distinct(d.category, d.parent),
    ),
    QuestionShape(
        "names-cat",
        1,
        "List the names of the {P} whose {C} is {v}.",
        "SELECT name FROM {P} WHERE {C} = '{v}'",
        lambda d: _distinct(d.category, d.parent),
    ),
    QuestionShape(
        "names-above",
        1,
        "Which {P} have {N} above {x}? Give their names.",
        "SELECT name FROM {P} WHERE {N} > {x}",
        lambda d: _cuts(d.number, d.parent),
    ),
    QuestionShape(
        "count-after",
        1,
        "How many {P} have a `{Y}` year after {x}?",
        "SELECT COUNT(*) FROM {P} WHERE {Y} > {x}",
        lambda d: _cuts(d.year, d.parent),
    ),
    QuestionShape(
        "per-cat",
        2,
        "For each {C}, how many {P} are there? Give the {C} and the count.",
        "SELECT {C}, COUNT(*) FROM {P} GROUP BY {C}",
        lambda d: NONE,
    ),
    QuestionShape(
        "avg-cat",
        2,
        "What is the average {N} of the {P} whose {C} is {v}, rounded to 1 decimal?",
        "SELECT ROUND(AVG({N}), 1) FROM {P} WHERE {C} = '{v}'",
        lambda d: _distinct(d.category, d.parent),
    ),
    QuestionShape(
        "top",
        2,
        "List the {k} {P} with the highest {N}, highest first (ties by name): name and {N}.",
        "SELECT name, {N} FROM {P} ORDER BY {N} DESC, name LIMIT {k}",
        lambda d: _counts([2, 3, 4, 5]),
        ordered=True,
    ),
    QuestionShape(
        "child-above",
        2,
        "How many {K} have {A} above {x}?",
        "SELECT COUNT(*) FROM {K} WHERE {A} > {x}",
        lambda d: _cuts(d.amount, d.child),
    ),
    QuestionShape(
        "sum-cat",
        3,
        "What is the total {A} of the {K} of {P} whose {C} is {v}, rounded to 1 decimal?",
        "SELECT ROUND(SUM(k.{A}), 1) FROM {K} k JOIN {P} p ON p.id = k.{fk} WHERE p.{C} = '{v}'",
        lambda d: _distinct(d.category, d.parent),
    ),
    QuestionShape(
        "names-child-above",
        3,
        "Which {P} (names, each once) have one of their {K} with {A} above {x}?",
        "SELECT DISTINCT p.name FROM {P} p JOIN {K} k ON k.{fk} = p.id WHERE k.{A} > {x}",
        lambda d: _cuts(d.amount, d.child),
    ),
    QuestionShape(
        "at-least",
        3,
        "Which {P} have at least {k} {K}? Give their names and the number of their {K}.",
        "SELECT p.name, COUNT(*) FROM {P} p JOIN {K} k ON k.{fk} = p.id GROUP BY p.id HAVING COUNT(*) >= {k}",
        lambda d: _counts([2, 3, 4, 5]),
    ),
    QuestionShape(
        "without",
        3,
        "Which {P} have no {K}? Give their names.",
        "SELECT name FROM {P} WHERE id NOT IN (SELECT {fk} FROM {K})",
        lambda d: NONE,
    ),
)


def words(d: Domain) -> dict[str, str]:
    """What a shape's placeholders stand for in a domain."""
    return {
        "P": d.parent, "C": d.category, "N": d.number, "Y": d.year,
        "K": d.child, "A": d.amount, "fk": f"{_single(d.parent)}_id",
    }  # fmt: skip


def templates(d: Domain) -> list[tuple[str, int, str, str, Params, bool]]:
    """(key, level, question, query, params, ordered) of every shape in the
    domain: its words filled in, the instance's parameters left to fill."""
    fill = {**words(d), "v": "{v}", "x": "{x}", "k": "{k}"}
    return [(s.key, s.level, s.question.format(**fill), s.query.format(**fill), s.params(d), s.ordered) for s in SHAPES]
