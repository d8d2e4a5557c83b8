"""Local vs global rank (issue 13): the evaluated world is 2 nodes of 2 ranks, so `local_rank == 0` holds
once per node and `rank == 0` once per job; order-aware "varies by rank" on values."""
import ast

import pytest

from ddp_doctor.lint import lint_source
from ddp_doctor.lint.model import ModuleModel

SRC = """import os
import torch.distributed as dist

local_rank = int(os.environ["LOCAL_RANK"])
rank = dist.get_rank()
node = int(os.environ["GROUP_RANK"])
"""


@pytest.mark.parametrize("test, truths", [
    ("local_rank == 0", ["T", "F", "T", "F"]),
    ("rank == 0", ["T", "F", "F", "F"]),
    ("node == 0", ["T", "T", "F", "F"]),
    ("int(os.environ['LOCAL_RANK']) == 0", ["T", "F", "T", "F"]),
    ("dist.get_node_local_rank() == 0", ["T", "F", "T", "F"]),
    ("local_rank != -1", ["T", "T", "T", "T"]),
])
def test_local_global_and_node_ranks_evaluate_differently(test, truths):
    src = SRC + f"flag = {test}\n"
    m = ModuleModel(ast.parse(src), "t.py", src)
    expr = m.scope.assigns["flag"][0][0]
    assert m.rank_truths(expr, m.scope, {}) == truths


def test_a_local_rank_guard_is_named_as_once_per_node():
    src = SRC + "if local_rank == 0:\n    dist.barrier()\n"
    (f,) = lint_source(src, "t.py").findings
    assert f.code == "DDP201" and "true on one rank of every node" in f.message
    src = SRC + "if rank == 0:\n    dist.barrier()\n"
    (f,) = lint_source(src, "t.py").findings
    assert "every node" not in f.message


def test_varies_by_rank_is_about_values_not_mentions():
    src = SRC + "a = rank != -1\nb = [1, 2, 3, 4][rank]\nc = f'ckpt-{rank}.pt'\nd = dist.get_world_size()\n"
    m = ModuleModel(ast.parse(src), "t.py", src)
    got = {n: m.varies_by_rank(m.scope.assigns[n][0][0], m.scope) for n in "abcd"}
    assert got == {"a": False, "b": True, "c": True, "d": False}
