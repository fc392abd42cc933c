"""The databases of the SQL tasks (rl.tasks.sql): a shop, a school and a
library, each a script that creates and fills its tables with rows drawn
from the random generator it is given."""

from __future__ import annotations

import random
from collections.abc import Sequence

CITIES = ["Lyon", "Porto", "Oslo", "Graz", "Turin", "Ghent", "Bergen", "Malmo"]
FIRST = ["Ana", "Ben", "Cleo", "Dan", "Eva", "Finn", "Gia", "Hugo", "Ines", "Jon", "Kira", "Leo", "Mia", "Noah", "Omar"]
LAST = ["Silva", "Berg", "Rossi", "Meyer", "Novak", "Costa", "Lund", "Weber", "Moreau", "Haas"]
CATEGORIES = ["books", "garden", "kitchen", "toys", "sports"]
SUBJECTS = ["math", "physics", "history", "art", "biology"]
GENRES = ["novel", "poetry", "science", "travel", "crime"]


def _name(rng: random.Random) -> str:
    return f"{rng.choice(FIRST)} {rng.choice(LAST)}"


def _sql(v: object) -> str:
    return "'" + str(v).replace("'", "''") + "'" if isinstance(v, str) else str(v)


def _script(tables: dict[str, tuple[str, Sequence[Sequence[object]]]]) -> str:
    out = []
    for name, (create, rows) in tables.items():
        out.append(create.strip() + ";")
        out += [f"INSERT INTO {name} VALUES ({', '.join(_sql(v) for v in row)});" for row in rows]
    return "\n".join(out) + "\n"


def shop(rng: random.Random) -> str:
    customers = [(i, _name(rng), rng.choice(CITIES), rng.randint(2015, 2024)) for i in range(1, 31)]
    products = [
        (i, f"{rng.choice(['red', 'big', 'tiny', 'smart', 'old'])} {c} item {i}", c, round(rng.uniform(2, 120), 2))
        for i, c in ((i, rng.choice(CATEGORIES)) for i in range(1, 26))
    ]
    orders = [
        (
            i,
            rng.randint(1, 30),
            rng.randint(1, 25),
            rng.randint(1, 5),
            f"2024-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}",
        )
        for i in range(1, 81)
    ]
    return _script(
        {
            "customers": (
                "CREATE TABLE customers (id INTEGER PRIMARY KEY, name TEXT, city TEXT, joined INTEGER)",
                customers,
            ),
            "products": (
                "CREATE TABLE products (id INTEGER PRIMARY KEY, name TEXT, category TEXT, price REAL)",
                products,
            ),
            "orders": (
                "CREATE TABLE orders (id INTEGER PRIMARY KEY, customer_id INTEGER REFERENCES customers(id), "
                "product_id INTEGER REFERENCES products(id), quantity INTEGER, day TEXT)",
                orders,
            ),
        }
    )


def school(rng: random.Random) -> str:
    students = [(i, _name(rng), rng.randint(1, 4), rng.choice(CITIES)) for i in range(1, 36)]
    courses = [(i, f"{s} {i}", s, rng.randint(2, 6)) for i, s in ((i, rng.choice(SUBJECTS)) for i in range(1, 13))]
    seen: set[tuple[int, int]] = set()
    enrol: list[tuple[int, int, int]] = []
    while len(enrol) < 90:
        pair = (rng.randint(1, 35), rng.randint(1, 12))
        if pair not in seen:
            seen.add(pair)
            enrol.append((*pair, rng.randint(40, 100)))
    return _script(
        {
            "students": (
                "CREATE TABLE students (id INTEGER PRIMARY KEY, name TEXT, year INTEGER, city TEXT)",
                students,
            ),
            "courses": (
                "CREATE TABLE courses (id INTEGER PRIMARY KEY, title TEXT, subject TEXT, credits INTEGER)",
                courses,
            ),
            "enrollments": (
                "CREATE TABLE enrollments (student_id INTEGER REFERENCES students(id), "
                "course_id INTEGER REFERENCES courses(id), grade INTEGER)",
                enrol,
            ),
        }
    )


def library(rng: random.Random) -> str:
    authors = [(i, _name(rng), rng.randint(1900, 1995)) for i in range(1, 16)]
    books = [
        (
            i,
            f"The {rng.choice(['Silent', 'Last', 'Blue', 'Hidden', 'Long'])} "
            f"{rng.choice(['River', 'Door', 'Map', 'Year'])} {i}",
            rng.randint(1, 15),
            rng.choice(GENRES),
            rng.randint(1950, 2023),
            rng.randint(90, 700),
        )
        for i in range(1, 41)
    ]
    loans = [(i, rng.randint(1, 40), _name(rng), rng.randint(1, 60)) for i in range(1, 71)]
    return _script(
        {
            "authors": ("CREATE TABLE authors (id INTEGER PRIMARY KEY, name TEXT, born INTEGER)", authors),
            "books": (
                "CREATE TABLE books (id INTEGER PRIMARY KEY, title TEXT, author_id INTEGER REFERENCES authors(id), "
                "genre TEXT, year INTEGER, pages INTEGER)",
                books,
            ),
            "loans": (
                "CREATE TABLE loans (id INTEGER PRIMARY KEY, book_id INTEGER REFERENCES books(id), reader TEXT, "
                "days INTEGER)",
                loans,
            ),
        }
    )


SCHEMAS = {"shop": shop, "school": school, "library": library}
"""Each schema's script, by name."""
