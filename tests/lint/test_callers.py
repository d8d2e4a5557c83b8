"""The reverse direction of the project (issue 24): which files import or call a module, and the
whole-program facts read from every file."""
from pathlib import Path

from ddp_doctor.lint import lint_paths

_UTIL_LOAD = "import torch\n\n\ndef read_stats(path):\n    return torch.load(path)\n"
_TRAIN = """import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from util import box_ops


def main(net):
    dist.init_process_group("nccl")
    return DDP(net), box_ops
"""


def _project(root: Path, init_text: str) -> Path:
    (root / "util").mkdir(parents=True)
    (root / "util" / "__init__.py").write_text(init_text)
    (root / "util" / "box_ops.py").write_text("def area(b):\n    return b\n")
    (root / "util" / "plots.py").write_text(_UTIL_LOAD)
    (root / "train.py").write_text(_TRAIN)
    return root


def _ddp301(root: Path) -> set[str]:
    return {Path(f.location.path).name for f in lint_paths([root]).findings if f.code == "DDP301"}


def test_importing_a_package_does_not_import_its_other_modules(tmp_path):
    # `from util import box_ops` loads util/__init__.py and box_ops, never util/plots.py (detr's plot_utils)
    assert _ddp301(_project(tmp_path / "a", "")) == set()


def test_a_package_that_loads_the_module_makes_it_part_of_the_distributed_program(tmp_path):
    assert _ddp301(_project(tmp_path / "b", "from .plots import read_stats\n")) == {"plots.py"}
    assert _ddp301(_project(tmp_path / "c", "import importlib\n\n\ndef load(name):\n"
                                           "    return importlib.import_module('util.' + name)\n")) == {"plots.py"}




def test_a_model_dropped_from_the_cache_is_not_used_through_an_importers_cached_resolution(tmp_path):
    # detectron2's tools/: a kept module had resolved a name into a module the cache later dropped and
    # released; the next file that needed it reused that resolution (KeyError, an "internal error")
    import os

    from ddp_doctor.lint.project import Project

    (tmp_path / "core.py").write_text("import torch.distributed as dist\n\n\ndef g(model, x):\n    return model(x)\n")
    (tmp_path / "lib.py").write_text("import torch.distributed as dist\nfrom core import g\n\n\ndef h(model, x):\n    return g(model, x)\n")
    project = Project([tmp_path])
    lib = project.model_at(tmp_path / "lib.py")
    core, _g = project.resolve_local(lib, "g")
    project._by_path.pop(os.path.realpath(tmp_path / "core.py"))  # what the LRU cache does
    project._dropped.append(core)
    project.release_dropped()
    owner, g = project.resolve_local(lib, "g")
    assert owner is not core and g in owner.scopes
