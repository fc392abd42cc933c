"""Duplicate tasks: exact (prompt and tests equal once comments, docstrings
and layout are normalised away) and near (MinHash over token 5-shingles;
estimated Jaccard >= a threshold). Task synthesis keeps its output free of
them, and validation flags them."""

from __future__ import annotations

import ast
import io
import re
import tokenize

import numpy as np
import xxhash

from rl.tasks.format import Task


def normalise(code: str) -> str:
    """Code without comments, docstrings and layout: what makes two tasks the same."""
    try:
        tree = ast.parse(code)
        for node in ast.walk(tree):
            body = getattr(node, "body", None)
            if not isinstance(body, list) or not body:
                continue
            first = body[0]
            if (
                isinstance(first, ast.Expr)
                and isinstance(first.value, ast.Constant)
                and isinstance(first.value.value, str)
            ):
                body[0] = ast.Pass()  # a docstring
        code = ast.unparse(tree)
    except SyntaxError:
        pass
    return re.sub(r"\s+", " ", code).strip()


def _tokens(code: str) -> list[str]:
    try:
        return [
            t.string
            for t in tokenize.generate_tokens(io.StringIO(code).readline)
            if t.type not in (tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT)
        ]
    except (tokenize.TokenError, IndentationError, SyntaxError):
        return code.split()


_RNG = np.random.default_rng(20241130)
_A = _RNG.integers(1, 2**63, 128, dtype=np.uint64) | np.uint64(1)  # odd multipliers
_B = _RNG.integers(0, 2**63, 128, dtype=np.uint64)


def words(text: str) -> list[str]:
    """Words and punctuation, lower-cased: the tokens of prose (a docstring
    is one Python token, so code tokens cannot compare two prompts)."""
    return re.findall(r"\w+|[^\w\s]", text.lower())


def minhash(text: str, k: int = 5, tokens: list[str] | None = None) -> np.ndarray:
    """128 MinHash values of the k-shingles of `tokens` (default: the
    code's Python tokens): one xxh3 per shingle, then 128 multiply-add
    hashes mod 2^64, vectorised."""
    toks = _tokens(text) if tokens is None else tokens
    shingles = {" ".join(toks[i : i + k]) for i in range(max(1, len(toks) - k + 1))}
    x = np.fromiter((xxhash.xxh3_64_intdigest(s.encode()) for s in shingles), dtype=np.uint64, count=len(shingles))
    with np.errstate(over="ignore"):
        return (_A[:, None] * x[None, :] + _B[:, None]).min(axis=1)


def duplicates(tasks: list[Task], threshold: float = 0.8) -> dict[str, str]:
    """task_id -> why it duplicates an earlier task (the first of each kind is kept)."""
    out: dict[str, str] = {}
    exact: dict[str, str] = {}
    sigs: list[tuple[str, np.ndarray, str | None]] = []
    for t in tasks:
        # a workspace is part of what the policy sees: the same tests over
        # different starting files (a bug to fix, a stub to fill) are different tasks
        files = "".join(f"\0{p}\0{normalise(c)}" for p, c in sorted(t.files.items()))
        key = normalise(t.prompt) + files + "\0" + normalise(t.tests)
        if key in exact:
            out[t.task_id] = f"duplicate of {exact[key]}"
            continue
        exact[key] = t.task_id
        sig = minhash(t.prompt + "\n" + t.tests)  # what is asked and checked; shared files (a database) are not
        variant = t.metadata.get("template") if t.test_format == "workspace" else None
        for other, osig, ovariant in sigs:
            if variant and variant == ovariant:
                continue  # declared variants of one workspace (fix, implement, ...): split together by template
            j = float(np.mean(sig == osig))
            if j >= threshold:
                out[t.task_id] = f"near-duplicate of {other} (estimated Jaccard {j:.2f})"
                break
        else:
            sigs.append((t.task_id, sig, variant))
    return out
