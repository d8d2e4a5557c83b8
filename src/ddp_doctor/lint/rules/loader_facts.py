"""What the data-pipeline rules share: DataLoader arguments by name or position, which loaders
train, and what a dataset is (iterable, sharded by rank, held in memory)."""
from __future__ import annotations

import ast
import re
from dataclasses import dataclass

from ddp_doctor.lint import analysis as A
from ddp_doctor.lint.model import ModuleModel
from ddp_doctor.lint.names import ITERABLE_DATASETS, arg_or_kw, final_name, kwarg
from ddp_doctor.lint.function_summary import Related
from ddp_doctor.lint.scopes import Scope


# DataLoader(dataset, batch_size, shuffle, sampler, batch_sampler, num_workers, collate_fn, pin_memory, drop_last)
_POS = {"dataset": 0, "batch_size": 1, "shuffle": 2, "sampler": 3, "batch_sampler": 4, "num_workers": 5,
        "collate_fn": 6, "pin_memory": 7, "drop_last": 8, "persistent_workers": 99}


def dl_arg(call: ast.Call, name: str) -> ast.expr | None:
    return arg_or_kw(call, _POS[name], name)


def is_none(node: ast.AST | None) -> bool:
    return node is None or (isinstance(node, ast.Constant) and node.value is None)


def all_calls(m: ModuleModel, pred):
    for scope in m.scopes.values():
        for site in scope.sites:
            if pred(site.call):
                yield site.call, scope


def uses_wrapper_loaders(m: ModuleModel) -> bool:
    """Fabric / accelerate / Lightning own the sampler (they add a DistributedSampler and set its epoch)."""
    return any(q.split(".")[0] in ("lightning", "pytorch_lightning", "accelerate", "lightning_fabric")
               for q in m.imports.values())


def dataset_is_iterable_or_sharded(m: ModuleModel, ds: ast.expr | None, scope: Scope, depth: int = 0) -> bool:
    if ds is None or depth > 3:
        return True  # unknown: stay quiet
    if isinstance(ds, ast.Call):
        q = m.qual(ds.func)
        name = final_name(ds.func) or ""
        if q in ITERABLE_DATASETS or "Iterable" in name or name in ("IterableWrapper", "WebDataset",
                                                                       "load_dataset", "StreamingDataset",
                                                                       "IterDataPipe"):
            return True
        cls = m.classes.get(name)
        if cls is not None:
            for b in cls.bases:
                bq = m.qual(b) or final_name(b) or ""
                if bq in ITERABLE_DATASETS or "Iterable" in bq or "IterDataPipe" in bq:
                    return True
        if any(_per_rank(m, a, scope) for a in (*ds.args, *(k.value for k in ds.keywords))):
            return True  # Subset(ds, range(rank, n, world)) and friends: already split per rank
        text = ast.dump(ds)
        if "shard" in text or "split_dataset_by_node" in text:
            return True
        fn = m.resolve_function(ds.func, scope)
        if fn is not None and depth < 2:
            return any(dataset_is_iterable_or_sharded(m, r.value, m.scopes[fn], depth + 1)
                       for r in m.returns_of(fn) if r.value is not None)
        return False
    if isinstance(ds, (ast.Name, ast.Attribute)):
        vals = m.values_of(ds, scope)
        if not vals:
            return True  # a parameter or unknown object
        return any(dataset_is_iterable_or_sharded(m, v, scope, depth + 1) for v in vals if v is not ds)
    return True


def _per_rank(m: ModuleModel, expr: ast.expr, scope: Scope, depth: int = 0) -> bool:
    """Is ``expr`` derived from the rank (``rank``, ``list(DistributedSampler(ds))``, ...)?"""
    if depth > 3:
        return False
    if m.mentions_rank(expr, scope):
        return True
    for n in ast.walk(expr):
        if isinstance(n, ast.Call) and m.is_sampler_call(n):
            return True
        if isinstance(n, ast.Name) and n.id not in m.imports:
            for v in m.values_of(n, scope):
                if v is not expr and _per_rank(m, v, scope, depth + 1):
                    return True
    return False


_LOADING = re.compile(r"open|load|read|decode|imread|Image|transform|augment|sleep|fetch|tokeni|resize|crop|"
                      r"flip|request|download|cv2|PIL|np\.|numpy|pickle|json|h5|lmdb|zip", re.I)


def in_memory_dataset(m: ModuleModel, ds: ast.expr | None, scope: Scope, depth: int = 0) -> bool:
    """A dataset that only indexes tensors already in memory (no file I/O, no transforms)."""
    if ds is None or depth > 6:
        return False
    if isinstance(ds, ast.Call):
        name = final_name(ds.func) or ""
        if name == "TensorDataset":
            return True
        if name in ("Subset", "ConcatDataset", "random_split") and ds.args:
            first = ds.args[0]
            if isinstance(first, (ast.List, ast.Tuple)) and first.elts:
                return all(in_memory_dataset(m, e, scope, depth + 1) for e in first.elts)
            return in_memory_dataset(m, first, scope, depth + 1)
        cls = m.classes.get(name)
        if cls is not None:
            getitem = m.methods.get(cls, {}).get("__getitem__") or m.methods.get(cls, {}).get("__iter__")
            if getitem is None:
                return False
            for c in ast.walk(getitem):
                if isinstance(c, ast.Call) and _LOADING.search(ast.unparse(c.func)):
                    return False
            init = m.methods.get(cls, {}).get("__init__")
            return init is None or not any(isinstance(c, ast.Call) and "transform" in ast.unparse(c).lower()
                                           for c in ast.walk(getitem))
        fn = m.resolve_function(ds.func, scope)
        if fn is not None:
            rets = [r.value for r in m.returns_of(fn) if r.value is not None]
            return bool(rets) and all(in_memory_dataset(m, r, m.scopes[fn], depth + 1) for r in rets)
        return False
    if isinstance(ds, ast.Subscript):
        return in_memory_dataset(m, ds.value, scope, depth + 1)
    if isinstance(ds, (ast.Name, ast.Attribute)):
        vals = [v for v in m.values_of(ds, scope) if v is not ds]
        return bool(vals) and all(in_memory_dataset(m, v, scope, depth + 1) for v in vals)
    return False


_FILE_DATASETS = {"ImageFolder", "DatasetFolder", "ImageNet", "CocoDetection", "CocoCaptions", "VOCSegmentation",
                  "VOCDetection", "Kinetics", "UCF101", "HMDB51", "LSUN", "Places365", "CelebA", "Cityscapes",
                  "Flowers102", "Food101", "StanfordCars", "OxfordIIITPet", "WIDERFace", "SBDataset"}


# torchvision datasets that read their whole file at construction: an item is an array turned into an image
_IN_MEMORY_DATASETS = {"MNIST", "FashionMNIST", "KMNIST", "EMNIST", "QMNIST", "CIFAR10", "CIFAR100", "SVHN", "USPS",
                       "SEMEION", "FakeData"}
_AUGMENT = re.compile(r"^(Random|ColorJitter|AutoAugment|RandAugment|TrivialAugment|AugMix|GaussianBlur|ElasticTransform)")


def _augmentation(m: ModuleModel, transform, scope: Scope, depth: int = 0) -> str | None:
    """The random augmentation a ``transform=`` runs per item (``RandomCrop`` in a ``Compose``), if any: it is what
    makes an in-memory dataset (MNIST, CIFAR) cost real time per item; ``ToTensor`` + ``Normalize`` do not."""
    expr = getattr(transform, "value", transform)
    if expr is None or depth > 4:
        return None
    for v in [expr, *(m.values_of(expr, scope) if isinstance(expr, (ast.Name, ast.Attribute)) else ())]:
        for c in ast.walk(v):
            if isinstance(c, ast.Call) and _AUGMENT.match(final_name(c.func) or ""):
                return final_name(c.func)
            if isinstance(c, ast.Name) and c is not expr and depth < 4 and m.values_of(c, scope):
                got = _augmentation(m, c, scope, depth + 1)
                if got:
                    return got
    return None


@dataclass(frozen=True)
class LoadCost:
    """Why loading one item costs real time, and where that happens when it is in another file."""

    why: str
    related: Related | None = None


def expensive_dataset(m: ModuleModel, ds: ast.expr | None, scope: Scope, depth: int = 0,
                      origin: ModuleModel | None = None) -> LoadCost | None:
    """Why loading one item of ``ds`` costs real time (file I/O, decoding, transforms in ``__getitem__``,
    a file-backed torchvision dataset), or None when nothing shows it (an in-memory TensorDataset, a
    dataset class that only indexes lists of tensors, a dataset we cannot read)."""
    if ds is None or depth > 6:
        return None
    origin = origin or m  # the linted file: a loading line elsewhere is named as a related location
    if isinstance(ds, ast.Call):
        name = final_name(ds.func) or ""
        q = m.qual(ds.func) or ""
        if name in ("Subset", "ConcatDataset") and ds.args:
            first = ds.args[0]
            parts = first.elts if isinstance(first, (ast.List, ast.Tuple)) else [first]
            for e in parts:
                why = expensive_dataset(m, e, scope, depth + 1, origin)
                if why:
                    return why
            return None
        if name in _IN_MEMORY_DATASETS and (q.startswith("torchvision.datasets.") or not q):
            aug = _augmentation(m, kwarg(ds, "transform"), scope)
            return LoadCost(f"`{name}` holds its images in memory but runs `{aug}` on every item") if aug else None
        if name in _FILE_DATASETS or (q.startswith("torchvision.datasets.") and name[:1].isupper()):
            return LoadCost(f"`{name}` reads and decodes a file for every item")
        owner, cls = m, m.classes.get(name) if isinstance(ds.func, ast.Name) else None
        if cls is None and m.project is not None:
            got = m.project.resolve_call(m, ds.func, scope)
            if got is not None and isinstance(got[1], ast.ClassDef):
                owner, cls = got
        if cls is not None:
            methods = owner.methods.get(cls, {})
            getitem = methods.get("__getitem__") or methods.get("__iter__")
            for c in ast.walk(getitem) if getitem is not None else ():
                if isinstance(c, ast.Call) and _LOADING.search(ast.unparse(c.func)):
                    text = f"`{cls.name}.{getitem.name}` calls `{ast.unparse(c.func)}(...)`"
                    if owner.path == origin.path:
                        return LoadCost(f"{text} for every item")
                    where = Related(owner.path, c.lineno, f"`{cls.name}.{getitem.name}` loads each item here")
                    return LoadCost(f"{text} ({where.where}) for every item", where)
            return None
        owner, fn = m, m.resolve_function(ds.func, scope)
        if fn is None and m.project is not None:  # build_dataset(...) from datasets/__init__.py
            got = m.project.resolve_call(m, ds.func, scope)
            if got is not None and not isinstance(got[1], ast.ClassDef):
                owner, fn = got
        if fn is not None:
            for r in owner.returns_of(fn):
                if r.value is None:
                    continue
                why = expensive_dataset(owner, r.value, owner.scopes[fn], depth + 1, origin)
                if why:
                    return why
        return None
    if isinstance(ds, ast.Subscript):
        return expensive_dataset(m, ds.value, scope, depth + 1, origin)
    if isinstance(ds, (ast.Name, ast.Attribute)):
        for v in m.values_of(ds, scope):
            if v is not ds:
                why = expensive_dataset(m, v, m.scope_of_value(v, scope), depth + 1, origin)
                if why:
                    return why
    return None


def dataset_unknown(m: ModuleModel, ds: ast.expr | None, scope: Scope, depth: int = 0) -> bool:
    """Nothing here says what ``ds`` is: a parameter, or what an installed library's function returns
    (``load_dataset(...)``, ``build_dataset(cfg)`` of a package).  A class or helper of this file or of
    the project, a torchvision or in-memory dataset, is known (and :func:`expensive_dataset` judged it)."""
    if ds is None or depth > 6:
        return ds is not None
    if isinstance(ds, ast.Call):
        name = final_name(ds.func) or ""
        if name in ("TensorDataset", "Subset", "ConcatDataset", "random_split") or name in _FILE_DATASETS or \
                (m.qual(ds.func) or "").startswith("torchvision.datasets."):
            return False
        if _hf_preprocessed(m, ds, scope):
            return False
        if isinstance(ds.func, ast.Name) and name in m.classes:
            return False
        fn = m.resolve_function(ds.func, scope)
        if fn is not None:
            rets = [r.value for r in m.returns_of(fn) if r.value is not None]
            return any(dataset_unknown(m, r, m.scopes[fn], depth + 1) for r in rets)
        return m.project is None or m.project.resolve_call(m, ds.func, scope) is None
    if isinstance(ds, ast.Subscript):
        got = m.returned_values(ds, scope)  # dataset, model, opt = load_train_objs()
        if got:
            return any(dataset_unknown(m, v, vs, depth + 1) for v, vs in got)
        return dataset_unknown(m, ds.value, scope, depth + 1)
    if isinstance(ds, (ast.Name, ast.Attribute)):
        vals = [(v, m.scope_of_value(v, scope)) for v in m.values_of(ds, scope) if v is not ds] or \
            m.param_args(ds, scope)  # prepare_dataloader(dataset, ...): what this file's callers pass
        return not vals or any(dataset_unknown(m, v, vs, depth + 1) for v, vs in vals)
    return True


# Hugging Face ``datasets`` methods that return the same Arrow table re-indexed, renamed or re-typed
_HF_SAME_ROWS = {"rename_column", "rename_columns", "remove_columns", "select", "shuffle", "filter", "sort",
                 "train_test_split", "flatten", "cast_column", "select_columns", "shard"}


def _hf_preprocessed(m: ModuleModel, ds: ast.expr, scope: Scope, mapped: bool = False, depth: int = 0) -> bool:
    """``load_dataset(...).map(tokenize, ...)`` (then renamed, selected, shuffled, split): the preprocessing ran
    once, up front, and an item is a row read from the Arrow table, which costs what an in-memory list does.
    Not so for a streamed dataset (``streaming=True``: ``.map`` runs per item), a lazy ``with_transform`` /
    ``set_transform`` (images decoded per item), or a ``load_dataset`` result that nothing mapped (its image or
    audio columns decode on access)."""
    if depth > 8:
        return False
    if isinstance(ds, ast.Subscript):  # tokenized["train"]
        return _hf_preprocessed(m, ds.value, scope, mapped, depth + 1)
    if isinstance(ds, (ast.Name, ast.Attribute)):
        vals = [v for v in m.values_of(ds, scope) if not any(n is ds for n in ast.walk(v))]  # x = x.rename_column(...)
        return bool(vals) and all(_hf_preprocessed(m, v, scope, mapped, depth + 1) for v in vals)
    if not isinstance(ds, ast.Call):
        return False
    if (m.qual(ds.func) or "") in ("datasets.load_dataset", "datasets.load_from_disk"):
        streaming = kwarg(ds, "streaming")
        return mapped and (streaming is None or (isinstance(streaming.value, ast.Constant) and not streaming.value.value))
    if isinstance(ds.func, ast.Attribute) and not m.qual(ds.func):
        if ds.func.attr == "map":
            return _hf_preprocessed(m, ds.func.value, scope, True, depth + 1)
        if ds.func.attr in _HF_SAME_ROWS:
            return _hf_preprocessed(m, ds.func.value, scope, mapped, depth + 1)
    return False


def training_loader_uses(m: ModuleModel, candidate=None, epochs: bool = False) -> dict[ast.Call, list[A.LoaderUse]]:
    """The training loaders of ``m`` and their uses (``epochs``: only uses over several epochs).
    ``candidate(call, scope)``: a loader the rule would report; for such a loader that this file does
    not walk, the callers of other files that walk what its factory returns are looked up too."""
    out: dict[ast.Call, list[A.LoaderUse]] = {}
    for use in A.loader_uses(m):
        if use.training and (use.epochs or not epochs):
            out.setdefault(use.loader, []).append(use)
    if candidate is not None and m.project is not None:
        for call, scope in all_calls(m, m.is_dataloader_call):
            if call in out or scope.is_module or not candidate(call, scope):
                continue
            got = [u for u in A.returned_loader_uses(m, call, scope) if u.training and (u.epochs or not epochs)]
            if got:
                out[call] = got
    return out


def expanded_test(m: ModuleModel, test):
    """A ``candidate`` for :func:`training_loader_uses`: ``test`` on the call with its ``**kwargs`` spelled out."""
    def candidate(call: ast.Call, scope: Scope) -> bool:
        full = m.expand_star_kwargs(call, scope)
        return full is not None and test(full)
    return candidate


def num_workers_arg(call: ast.Call):
    nw = dl_arg(call, "num_workers")
    return nw, (0 if nw is None else A.literal(nw))
