"""SQL tasks made by sarl: questions over small SQLite databases.

Three schemas (a shop, a school, a library), each filled with rows drawn
from a fixed seed, and question templates at three levels:

  1  one table: a count, a filter, a lookup
  2  grouping, ordering, aggregates over one table
  3  joins of two or three tables, with grouping or HAVING

Each template is instantiated with a few parameters drawn from the data, so
the answer is never empty and never a trivial constant. The reference is
the template's query; the hidden check compares rows (rl.verify.sql_runner).
Run `sarl tasks generate --family sql` for the 120 shipped tasks.
"""

from __future__ import annotations

import json
import random
import sqlite3
from collections.abc import Callable
from dataclasses import dataclass

from rl.tasks.format import Task, TaskLimits
from rl.tasks.sql_domains import DOMAINS
from rl.tasks.sql_domains import script as domain_script
from rl.tasks.sql_domains import templates as domain_templates
from rl.tasks.sql_schemas import SCHEMAS


@dataclass(frozen=True)
class Template:
    key: str
    level: int
    question: str
    query: str
    params: Callable[[sqlite3.Connection], list[dict[str, object]]]
    ordered: bool = False


def _distinct(col: str, table: str) -> Callable[[sqlite3.Connection], list[dict[str, object]]]:
    name = col.split(".")[-1]
    return lambda db: [{name: r[0]} for r in db.execute(f"SELECT DISTINCT {col} FROM {table} ORDER BY 1")]


def _values(name: str, values: list[object]) -> Callable[[sqlite3.Connection], list[dict[str, object]]]:
    return lambda db: [{name: v} for v in values]


NONE: Callable[[sqlite3.Connection], list[dict[str, object]]] = lambda db: [{}]  # noqa: E731

TEMPLATES: dict[str, list[Template]] = {
    "shop": [
        Template(
            "count-city",
            1,
            "How many customers live in {city}?",
            "SELECT COUNT(*) FROM customers WHERE city = '{city}'",
            _distinct("city", "customers"),
        ),
        Template(
            "names-city",
            1,
            "List the names of the customers who live in {city}.",
            "SELECT name FROM customers WHERE city = '{city}'",
            _distinct("city", "customers"),
        ),
        Template(
            "price-above",
            1,
            "Which products cost more than {price}? Give their names.",
            "SELECT name FROM products WHERE price > {price}",
            _values("price", [40, 60, 90, 100]),
        ),
        Template(
            "joined-after",
            1,
            "How many customers joined after {year}?",
            "SELECT COUNT(*) FROM customers WHERE joined > {year}",
            _values("year", [2016, 2018, 2020, 2022]),
        ),
        Template(
            "per-category",
            2,
            "For each product category, how many products are there? Give the category and the count.",
            "SELECT category, COUNT(*) FROM products GROUP BY category",
            NONE,
        ),
        Template(
            "avg-price",
            2,
            "What is the average price of the products in the category {category}, rounded to 2 decimals?",
            "SELECT ROUND(AVG(price), 2) FROM products WHERE category = '{category}'",
            _distinct("category", "products"),
        ),
        Template(
            "top-price",
            2,
            "List the {n} most expensive products, most expensive first: name and price.",
            "SELECT name, price FROM products ORDER BY price DESC LIMIT {n}",
            _values("n", [2, 3, 5]),
            ordered=True,
        ),
        Template(
            "orders-month",
            2,
            "How many orders were placed in month {month} of 2024 (days are 'YYYY-MM-DD')?",
            "SELECT COUNT(*) FROM orders WHERE substr(day, 6, 2) = '{month}'",
            _values("month", ["02", "03", "07", "11"]),
        ),
        Template(
            "spent-by",
            3,
            "How much did customers from {city} spend in total (quantity times price), rounded to 2 decimals?",
            "SELECT ROUND(SUM(o.quantity * p.price), 2) FROM orders o JOIN customers c ON c.id = o.customer_id"
            " JOIN products p ON p.id = o.product_id WHERE c.city = '{city}'",
            _values("city", ["Lyon", "Oslo", "Porto", "Graz"]),
        ),
        Template(
            "buyers-of",
            3,
            "Which customers (names, each once) ordered a product of the category {category}?",
            "SELECT DISTINCT c.name FROM customers c JOIN orders o ON o.customer_id = c.id"
            " JOIN products p ON p.id = o.product_id WHERE p.category = '{category}'",
            _distinct("category", "products"),
        ),
        Template(
            "many-orders",
            3,
            "Which customers placed at least {k} orders? Give their names and order counts.",
            "SELECT c.name, COUNT(*) FROM customers c JOIN orders o ON o.customer_id = c.id GROUP BY c.id"
            " HAVING COUNT(*) >= {k}",
            _values("k", [3, 4, 5]),
        ),
        Template(
            "never-ordered",
            3,
            "Which products were never ordered? Give their names.",
            "SELECT name FROM products WHERE id NOT IN (SELECT product_id FROM orders)",
            NONE,
        ),
    ],
    "school": [
        Template(
            "count-year",
            1,
            "How many students are in year {year}?",
            "SELECT COUNT(*) FROM students WHERE year = {year}",
            _values("year", [1, 2, 3, 4]),
        ),
        Template(
            "courses-subject",
            1,
            "What are the titles of the {subject} courses?",
            "SELECT title FROM courses WHERE subject = '{subject}'",
            _distinct("subject", "courses"),
        ),
        Template(
            "credits-min",
            1,
            "Which courses give at least {c} credits? Give their titles.",
            "SELECT title FROM courses WHERE credits >= {c}",
            _values("c", [3, 4, 5]),
        ),
        Template(
            "students-city",
            1,
            "Give the names of the students from {city}.",
            "SELECT name FROM students WHERE city = '{city}'",
            _values("city", ["Graz", "Turin", "Ghent", "Oslo"]),
        ),
        Template(
            "per-year",
            2,
            "How many students are in each year? Give the year and the count, by year.",
            "SELECT year, COUNT(*) FROM students GROUP BY year ORDER BY year",
            NONE,
            ordered=True,
        ),
        Template(
            "avg-grade-course",
            2,
            "What is the average grade in the course with id {cid}, rounded to 1 decimal?",
            "SELECT ROUND(AVG(grade), 1) FROM enrollments WHERE course_id = {cid}",
            _values("cid", [1, 4, 7, 10]),
        ),
        Template(
            "top-grades",
            2,
            "List the {n} highest grades ever given, highest first.",
            "SELECT grade FROM enrollments ORDER BY grade DESC LIMIT {n}",
            _values("n", [2, 3, 5]),
            ordered=True,
        ),
        Template(
            "credits-subject",
            2,
            "How many credits do the {subject} courses give in total?",
            "SELECT SUM(credits) FROM courses WHERE subject = '{subject}'",
            _distinct("subject", "courses"),
        ),
        Template(
            "enrolled-in",
            3,
            "Which students (names) are enrolled in a {subject} course? Each name once.",
            "SELECT DISTINCT s.name FROM students s JOIN enrollments e ON e.student_id = s.id"
            " JOIN courses c ON c.id = e.course_id WHERE c.subject = '{subject}'",
            _distinct("subject", "courses"),
        ),
        Template(
            "student-credits",
            3,
            "For each student enrolled in at least {k} courses, give the name and the total credits of those courses.",
            "SELECT s.name, SUM(c.credits) FROM students s JOIN enrollments e ON e.student_id = s.id"
            " JOIN courses c ON c.id = e.course_id GROUP BY s.id HAVING COUNT(*) >= {k}",
            _values("k", [2, 3, 4]),
        ),
        Template(
            "best-in-subject",
            3,
            "What is the highest grade any student got in a {subject} course?",
            "SELECT MAX(e.grade) FROM enrollments e JOIN courses c ON c.id = e.course_id WHERE c.subject = '{subject}'",
            _values("subject", ["math", "art", "history"]),
        ),
        Template(
            "no-enrollment",
            3,
            "Which students are not enrolled in any course? Give their names.",
            "SELECT name FROM students WHERE id NOT IN (SELECT student_id FROM enrollments)",
            NONE,
        ),
    ],
    "library": [
        Template(
            "count-genre",
            1,
            "How many books of the genre {genre} does the library have?",
            "SELECT COUNT(*) FROM books WHERE genre = '{genre}'",
            _distinct("genre", "books"),
        ),
        Template(
            "books-after",
            1,
            "Which books were published after {year}? Give their titles.",
            "SELECT title FROM books WHERE year > {year}",
            _values("year", [2010, 2015, 2020]),
        ),
        Template(
            "long-books",
            1,
            "How many books have more than {p} pages?",
            "SELECT COUNT(*) FROM books WHERE pages > {p}",
            _values("p", [200, 300, 500]),
        ),
        Template(
            "authors-born",
            1,
            "Which authors were born before {year}? Give their names.",
            "SELECT name FROM authors WHERE born < {year}",
            _values("year", [1930, 1950, 1970]),
        ),
        Template(
            "per-genre",
            2,
            "For each genre, how many books are there? Give the genre and the count.",
            "SELECT genre, COUNT(*) FROM books GROUP BY genre",
            NONE,
        ),
        Template(
            "avg-pages",
            2,
            "What is the average number of pages of the {genre} books, rounded to 1 decimal?",
            "SELECT ROUND(AVG(pages), 1) FROM books WHERE genre = '{genre}'",
            _distinct("genre", "books"),
        ),
        Template(
            "oldest",
            2,
            "List the titles of the {n} oldest books, oldest first (ties by title).",
            "SELECT title FROM books ORDER BY year, title LIMIT {n}",
            _values("n", [2, 3, 4]),
            ordered=True,
        ),
        Template(
            "long-loans",
            2,
            "How many loans lasted more than {d} days?",
            "SELECT COUNT(*) FROM loans WHERE days > {d}",
            _values("d", [20, 30, 45]),
        ),
        Template(
            "books-by",
            3,
            "Which books did authors born after {year} write? Give the titles.",
            "SELECT b.title FROM books b JOIN authors a ON a.id = b.author_id WHERE a.born > {year}",
            _values("year", [1950, 1960, 1980]),
        ),
        Template(
            "loans-genre",
            3,
            "How many loans were there of {genre} books?",
            "SELECT COUNT(*) FROM loans l JOIN books b ON b.id = l.book_id WHERE b.genre = '{genre}'",
            _distinct("genre", "books"),
        ),
        Template(
            "prolific",
            3,
            "Which authors wrote at least {k} books? Give their names and book counts.",
            "SELECT a.name, COUNT(*) FROM authors a JOIN books b ON b.author_id = a.id GROUP BY a.id"
            " HAVING COUNT(*) >= {k}",
            _values("k", [2, 3, 4]),
        ),
        Template(
            "never-loaned",
            3,
            "Which books were never loaned? Give their titles.",
            "SELECT title FROM books WHERE id NOT IN (SELECT book_id FROM loans)",
            NONE,
        ),
    ],
}
TRIVIAL: tuple[list[list[object]], ...] = ([], [[0]], [[1]], [[None]])
"""Results any lazy answer gets (no row, a constant): no task may have one."""


def databases(seed: int) -> list[tuple[str, str, list[Template]]]:
    """(schema, its SQL script drawn from `seed`, its templates) of every
    database: the three hand-written ones, then rl.tasks.sql_domains'."""
    out = [(name, make(random.Random(f"{seed}/{name}")), TEMPLATES[name]) for name, make in SCHEMAS.items()]
    for d in DOMAINS:
        made = [Template(*t) for t in domain_templates(d)]
        out.append((d.name, domain_script(d, random.Random(f"{seed}/{d.name}")), made))
    return out


def sql_tasks(seed: int = 0, per_template: int = 4) -> list[Task]:
    """Up to `per_template` instances of every template over each schema's
    data (drawn from `seed`); instances whose answer is empty or a constant
    are left out."""
    out = []
    for schema, script, templates in databases(seed):
        db = sqlite3.connect(":memory:")
        db.executescript(script)
        for t in templates:
            picks = t.params(db)
            random.Random(f"{seed}/{schema}/{t.key}").shuffle(picks)
            n = 0
            for p in picks:
                if n == per_template:
                    break
                query = t.query.format(**p)
                rows = [list(r) for r in db.execute(query)]
                if rows in TRIVIAL:
                    continue
                n += 1
                suffix = "-".join(str(v) for v in p.values()) or "all"
                out.append(
                    Task(
                        task_id=f"sql/{schema}/{t.key}/{suffix}",
                        prompt=t.question.format(**p),
                        entry_point="answer",
                        tests=json.dumps({"reference": query, "ordered": t.ordered}),
                        test_format="sql",
                        environment="sql",
                        reference=query,
                        files={"data.sql": script},
                        limits=TaskLimits(wall_s=10.0, call_s=3.0),
                        metadata={
                            "source": "sarl-sql",
                            "family": f"sql-{schema}",
                            "template": f"sql/{schema}/{t.key}",
                            "difficulty": t.level,
                        },
                    )
                )
        db.close()
    return out
