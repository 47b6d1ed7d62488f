"""py_trees 2.x side of the engine bench: builds the same tree shapes as benches/engine.rs and
prints their tick rates as one JSON line."""

import json
import operator
import sys
import time

import py_trees
from py_trees.behaviours import (
    CheckBlackboardVariableExists,
    CheckBlackboardVariableValue,
    SetBlackboardVariable,
)
from py_trees.common import ComparisonExpression
from py_trees.composites import Selector, Sequence


def set_(key, value):
    return SetBlackboardVariable(f"set {key}", key, value, overwrite=True)


def check(key, value):
    return CheckBlackboardVariableValue(
        f"check {key}", ComparisonExpression(key, value, operator.eq)
    )


def block(i):
    """9 nodes: a selector whose first child fails and whose second runs six leaves."""
    work = []
    for key in ("a", "b", "c"):
        work.append(set_(f"{key}{i}", i))
        work.append(check(f"{key}{i}", i))
    return Selector(
        f"block {i}",
        memory=True,
        children=[
            CheckBlackboardVariableExists(f"never {i}", "never"),
            Sequence(f"work {i}", memory=True, children=work),
        ],
    )


def big_tree():
    """1,000 nodes: a sequence of 111 blocks."""
    return Sequence("root", memory=True, children=[block(i) for i in range(111)])


def small_tree():
    """10 nodes."""
    return Sequence(
        "root",
        memory=True,
        children=[
            set_("x", 1),
            check("x", 1),
            Selector(
                "pick",
                memory=True,
                children=[CheckBlackboardVariableExists("never", "never"), set_("y", 2)],
            ),
            Sequence("tail", memory=True, children=[set_("z", 3), check("z", 3), set_("w", 4)]),
        ],
    )


def count(root):
    return sum(1 for _ in root.iterate())


def rate(root, ticks):
    start = time.perf_counter()
    for _ in range(ticks):
        root.tick_once()
        if root.status != py_trees.common.Status.SUCCESS:
            sys.exit(f"tree did not succeed: {root.status}")
    return ticks / (time.perf_counter() - start)


def main():
    big, small = big_tree(), small_tree()
    assert count(big) == 1000 and count(small) == 10, (count(big), count(small))
    rate(big, 5)
    print(
        json.dumps(
            {
                "big_ticks_per_s": rate(big, 200),
                "small_ticks_per_s": rate(small, 10_000),
            }
        )
    )


if __name__ == "__main__":
    main()
