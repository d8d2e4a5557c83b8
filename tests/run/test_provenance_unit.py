"""Decision provenance: the probe reads plain values from a live thread's user frames; the diagnosis finds
the decision the ranks parted at (branch, loop exit, a helper's early return) from each rank's user stack
and the source, with each rank's way and values."""
from __future__ import annotations

import textwrap
from dataclasses import replace
import threading

import torch

from ddp_doctor.diagnose import provenance
from ddp_doctor.evidence import FrameValues, RankState, Site, ThreadStack
from ddp_doctor.diagnose.draft import Draft
from ddp_doctor.diagnose.wording import decided
from ddp_doctor.findings import Location
from ddp_doctor.probe import frame_values


def _script(tmp_path, text: str) -> str:
    p = tmp_path / "train.py"
    p.write_text(textwrap.dedent(text).lstrip())
    return str(p)


def _line(path: str, marker: str) -> int:
    return next(i for i, ln in enumerate(open(path).read().splitlines(), 1) if marker in ln)


def _rank(r: int, frames: list[Site], values: dict[str, dict[str, str]] | None = None) -> RankState:
    """A rank whose main thread stands at ``frames`` (outermost first), its frames holding ``values``
    ({function: {name: repr}}), as the probe posts them."""
    fvs = tuple(FrameValues(f, tuple((values or {}).get(f.function, {}).items())) for f in reversed(frames))
    return RankState(rank=r, stack=tuple(frames), threads=(ThreadStack("MainThread", True, tuple(frames), fvs),))


def test_probe_reads_plain_values_of_a_blocked_thread():
    ready, release = threading.Event(), threading.Event()

    class Trainer:
        def __init__(self):
            self.rank, self.name, self._hidden = 1, "x" * 100, 5

    def user_loop():
        val_loss, best, batch, t = 0.25, float("nan"), [], torch.tensor(3.5)  # noqa: F841 - read by the probe
        big, trainer = torch.zeros(4, 3), Trainer()  # noqa: F841
        ready.set()
        release.wait(10)

    th = threading.Thread(target=user_loop)
    th.start()
    try:
        assert ready.wait(10)
        got = frame_values.user_frame_values(th.ident)
    finally:
        release.set()
        th.join()
    frame = next(fv for fv in got if fv.site.function == "user_loop")
    v = dict(frame.values)
    assert v["val_loss"] == "0.25" and v["best"] == "nan" and v["batch"] == "list of 0"
    assert v["t"] == "tensor(3.5)" and v["big"] == "tensor float32 [4, 3] on cpu"
    assert v["trainer.rank"] == "1" and v["trainer.name"].endswith("...'") and "trainer._hidden" not in v
    assert not any(k in v for k in ("ready", "release", "Trainer"))  # objects without plain values, classes


def test_branch_on_the_rank(tmp_path):
    path = _script(tmp_path, """
        def main(rank):
            for epoch in range(3):
                train(epoch)
                if rank == 0:  # decision
                    dist.barrier()  # rank0
    """)
    dec, r0 = _line(path, "# decision"), _line(path, "# rank0")
    ranks = {0: _rank(0, [Site(path, r0, "main")], {"main": {"rank": "0", "epoch": "1"}}),
             1: _rank(1, [Site(path, dec - 1, "main")], {"main": {"rank": "1", "epoch": "2"}})}
    d = provenance.locate([0], ranks)
    assert d is not None and d.site.line == dec and d.kind == "if" and d.condition == "rank == 0"
    assert dict(d.ways) == {0: "went into it", 1: "went past it"}
    assert dict(d.values) == {0: (("rank", "0"),), 1: (("rank", "1"),)}
    assert "reads the rank" in d.why


def test_shard_local_metric_beats_the_loop_counter(tmp_path):
    """An outer per-epoch `if` holds the rank's line too; it reads only the loop variable (ranks in different
    epochs differ there without deciding): the metric's `if` is the decision."""
    path = _script(tmp_path, """
        def main(model):
            best = 1.0
            for epoch in range(10):
                loss = train(model)
                if epoch % 2 == 0:
                    val_loss = evaluate(model)
                    if val_loss < best:  # decision
                        dist.broadcast_object_list([val_loss])  # rank0
    """)
    dec, r0 = _line(path, "# decision"), _line(path, "# rank0")
    ranks = {0: _rank(0, [Site(path, r0, "main")], {"main": {"val_loss": "0.31", "best": "1", "epoch": "2"}}),
             1: _rank(1, [Site(path, r0 - 4, "main")], {"main": {"val_loss": "1.2", "best": "1", "epoch": "3"}})}
    d = provenance.locate([0], ranks)
    assert d is not None and d.site.line == dec and d.condition == "val_loss < best"
    assert "differ between the ranks" in d.why
    assert "val_loss=0.31, best=1" in d.text() and "val_loss=1.2" in d.text()


def test_early_return_in_a_helper(tmp_path):
    path = _script(tmp_path, """
        def prepare(cache):
            if not_first(cache):
                return None
            if dist.get_rank() != 0:
                return None  # decision
            build(cache)
            dist.barrier()  # rank0

        def main():
            prepare("c")
            model = DDP(net)  # rank1
    """)
    dec, r0, r1 = _line(path, "# decision"), _line(path, "# rank0"), _line(path, "# rank1")
    ranks = {0: _rank(0, [Site(path, r1 - 1, "main"), Site(path, r0, "prepare")]),
             1: _rank(1, [Site(path, r1, "main")])}
    d = provenance.locate([0], ranks)
    assert d is not None and d.site.line == dec and d.kind == "return"
    assert d.condition == "dist.get_rank() != 0"
    assert dict(d.ways)[1].startswith("returned early from prepare()")


def test_loop_left_by_one_rank(tmp_path):
    path = _script(tmp_path, """
        def main():
            for epoch in range(10):
                loss = step()  # rank0
                if bad_epochs > patience:
                    break  # decision
            dist.barrier()  # rank1
    """)
    dec, r0, r1 = _line(path, "# decision"), _line(path, "# rank0"), _line(path, "# rank1")
    vals = {0: {"main": {"bad_epochs": "0", "patience": "1"}}, 1: {"main": {"bad_epochs": "2", "patience": "1"}}}
    ranks = {0: _rank(0, [Site(path, r0, "main")], vals[0]), 1: _rank(1, [Site(path, r1, "main")], vals[1])}
    d = provenance.locate([1], ranks)
    assert d is not None and d.site.line == dec and d.kind == "break"
    assert dict(d.ways) == {1: f"left the loop at line {dec}", 0: "stayed in the loop"}


def test_no_decision_when_ranks_stand_at_one_line(tmp_path):
    path = _script(tmp_path, """
        def main():
            dist.all_gather(out, preds)  # both
    """)
    at = _line(path, "# both")
    ranks = {r: _rank(r, [Site(path, at, "main")]) for r in (0, 1)}
    assert provenance.locate([0, 1], ranks) is None


def test_a_lint_located_continue_gets_its_condition_and_values(tmp_path):
    path = _script(tmp_path, """
        def main(loader):
            for batch in loader:
                if batch is None:
                    continue  # decision
                loss = model(batch).sum()
                loss.backward()
    """)
    dec = _line(path, "# decision")
    ranks = {1: _rank(1, [Site(path, dec + 2, "main")], {"main": {"batch": "None"}}),
             0: _rank(0, [Site(path, dec + 2, "main")], {"main": {"batch": "tensor float32 [8, 3] on cpu"}})}
    f = Draft("DDP101", "Rank 1 ran fewer steps.", "fix", location=Location(path, dec, None), ranks=[1])
    [f] = decided([f], ranks)
    assert f.location.line == dec and f.evidence["decision"]["kind"] == "continue"
    # lint located it, no stack showed the ranks part there: the message says so, and claims no rank's way
    assert f.message.startswith("No stack shows where the ranks parted; ddp-doctor lint located a rank-local "
                                "`continue` under `if batch is None:`")
    assert f.evidence["decision"]["by_lint"] is True
    assert "empty or missing batch" in f.evidence["decision"]["why"] and "showed_at" not in f.evidence


def test_finding_moves_to_the_decision_and_keeps_where_it_showed(tmp_path):
    path = _script(tmp_path, """
        def main(rank):
            if rank == 0:  # decision
                dist.barrier()  # rank0
            model = DDP(net)  # rank1
    """)
    dec, r0, r1 = _line(path, "# decision"), _line(path, "# rank0"), _line(path, "# rank1")
    ranks = {0: _rank(0, [Site(path, r0, "main")]), 1: _rank(1, [Site(path, r1, "main")])}
    f = Draft("DDP201", "Rank 0 called barrier() alone.", "fix", location=Location(path, r0, "main"), ranks=[0])
    [f] = decided([f], ranks)
    assert f.location.line == dec and f.evidence["showed_at"]["line"] == r0
    assert f.message.endswith("Rank 0 called barrier() alone.")


def test_a_hook_run_on_one_rank_names_its_rank_branch_not_a_distributed_check(tmp_path):
    """Rank 0 is in a hook a framework called (rank 1's user frames are elsewhere): the `if` that reads
    the rank is the decision; `local_rank != -1` is true on every rank of a distributed job."""
    path = _script(tmp_path, """
        class Hook:
            def on_batch_end(self, args, batch_idx):
                if args.local_rank != -1:
                    if batch_idx == 5 and self.global_rank == 0:  # decision
                        dist.barrier()  # rank0

        def main(trainer):
            trainer.fit()  # fit
    """)
    dec, r0, fit = _line(path, "# decision"), _line(path, "# rank0"), _line(path, "# fit")
    ranks = {0: _rank(0, [Site(path, fit, "main"), Site(path, r0, "on_batch_end")],
                      {"on_batch_end": {"batch_idx": "5", "self.global_rank": "0"}}),
             1: _rank(1, [Site(path, fit, "main"), Site(path, fit + 40, "training_step")])}
    d = provenance.locate([0], ranks)
    assert d is not None and d.site.line == dec and d.condition == "batch_idx == 5 and self.global_rank == 0"
    assert dict(d.ways) == {0: "went into it", 1: "did not"} and "reads the rank" in d.why
    assert dict(d.values)[0] == (("batch_idx", "5"), ("self.global_rank", "0"))


def test_a_rank_finished_while_the_other_went_alone_into_a_rank_branch(tmp_path):
    """HF Trainer's evaluate() on the main process only: rank 1 finished (no stack), rank 0 waits inside
    evaluate; the finding about the finished rank is located at the branch rank 0 alone took."""
    path = _script(tmp_path, """
        def main(trainer):
            trainer.train()
            if trainer.is_world_process_zero():  # decision
                trainer.evaluate()  # rank0
    """)
    dec, r0 = _line(path, "# decision"), _line(path, "# rank0")
    ranks = {0: _rank(0, [Site(path, r0, "main")]), 1: RankState(rank=1, done=True)}
    f = Draft("DDP204", "Rank 1 finished while the others still wait.", "fix", location=Location(path, r0, "main"),
                ranks=[1])
    [f] = decided([f], ranks)
    assert f.location.line == dec and f.evidence["showed_at"]["line"] == r0
    assert f.evidence["decision"]["ways"] == {"0": "went into it", "1": "did not"}


def test_a_crash_keeps_its_raise_line(tmp_path):
    path = _script(tmp_path, """
        def main(rank):
            if rank == 1:
                raise RuntimeError("bad")  # raise
    """)
    at = _line(path, "# raise")
    ranks = {1: RankState(rank=1, stack=(Site(path, at, "main"),)), 0: _rank(0, [Site(path, at - 2, "main")])}
    f = Draft("DDP204", "Rank 1 failed.", "fix", location=Location(path, at, "main"), ranks=[1])
    [f] = decided([f], ranks)
    assert f.location.line == at and "decision" not in f.evidence


def test_a_group_not_its_own_is_blamed_where_it_was_chosen(tmp_path):
    path = _script(tmp_path, """
        def main(rank):
            pairs = [new_group([0, 1]), new_group([2, 3])]
            pair = pairs[rank % 2]  # decision
            for step in range(10):
                if step % 4 == 3:
                    dist.all_reduce(t, group=pair)  # showed
    """)
    dec, at = _line(path, "# decision"), _line(path, "# showed")
    ranks = {r: _rank(r, [Site(path, at - 2, "main")], {"main": {"rank": str(r)}}) for r in range(4)}
    f = Draft("DDP203", "Ranks 1, 2 passed a group they are not in.", "fix", location=Location(path, at, "main"),
                ranks=[1, 2], not_member=True)
    [f] = decided([f], ranks)
    assert f.location.line == dec and f.evidence["decision"]["kind"] == "value"
    assert f.message.startswith("The ranks parted at `pair = pairs[rank % 2]`")
    assert "ranks 1, 2 got a group without this rank; ranks 0, 3 got a group with this rank" in f.message


def test_a_test_of_loop_variables_alone_is_never_the_decision(tmp_path):
    path = _script(tmp_path, """
        def main(loader):
            for step, batch in enumerate(loader):
                loss = train(batch)  # rank1
                if step % 4 == 3:
                    dist.all_reduce(t)  # rank0
    """)
    r0, r1 = _line(path, "# rank0"), _line(path, "# rank1")
    ranks = {0: _rank(0, [Site(path, r0, "main")], {"main": {"step": "3"}}),
             1: _rank(1, [Site(path, r1, "main")], {"main": {"step": "4"}})}
    assert provenance.locate([0], ranks) is None


def test_a_while_loop_one_rank_left(tmp_path):
    path = _script(tmp_path, """
        def main():
            while tokens_seen < budget:  # decision
                tokens_seen += step()  # rank0
            dist.barrier()  # rank1
    """)
    dec, r0, r1 = _line(path, "# decision"), _line(path, "# rank0"), _line(path, "# rank1")
    ranks = {0: _rank(0, [Site(path, r0, "main")], {"main": {"tokens_seen": "900", "budget": "1000"}}),
             1: _rank(1, [Site(path, r1, "main")], {"main": {"tokens_seen": "1012", "budget": "1000"}})}
    d = provenance.locate([1], ranks)
    assert d is not None and d.site.line == dec and d.kind == "while" and d.condition == "tokens_seen < budget"
    assert dict(d.ways) == {1: "left the loop", 0: "stayed in the loop"}


def test_every_rank_still_in_the_loop_is_named(tmp_path):
    """Three ranks, one left: both ranks whose stacks stand inside the loop stayed in it (not only the one
    compared with); a rank whose stack is elsewhere is left unsaid."""
    path = _script(tmp_path, """
        def main():
            while tokens_seen < budget:  # decision
                tokens_seen += step()  # rank0
            dist.barrier()  # rank1
        def elsewhere():
            pass  # rank3
    """)
    dec, r0, r1, r3 = (_line(path, m) for m in ("# decision", "# rank0", "# rank1", "# rank3"))
    vals = {"main": {"tokens_seen": "900", "budget": "1000"}}
    ranks = {0: _rank(0, [Site(path, r0, "main")], vals),
             1: _rank(1, [Site(path, r1, "main")], {"main": {"tokens_seen": "1012", "budget": "1000"}}),
             2: _rank(2, [Site(path, r0, "main")], vals), 3: _rank(3, [Site(path, r3, "elsewhere")], vals)}
    d = provenance.locate([1], ranks)
    assert d is not None and d.site.line == dec and d.kind == "while"
    assert dict(d.ways) == {1: "left the loop", 0: "stayed in the loop", 2: "stayed in the loop"}
    assert "ranks 0, 2 stayed in the loop" in d.text()
    assert "differ between the ranks" in d.why


def test_a_collective_inside_an_arm_that_comes_back_is_one_only_some_ranks_make(tmp_path):
    """Rank 1 broadcasts under a shard-local `if` whose arm does not leave: DDP201 on rank 1 (rank 0 is in
    DDP's all-reduce on the common path); an arm that `return`s is the others' alternative: DDP203 stays."""
    path = _script(tmp_path, """
        def main():
            for epoch in range(4):
                train()  # rank0
                if val_loss < best:  # decision
                    dist.broadcast_object_list(name)  # rank1

        def resume(ckpt):
            if ckpt.exists():  # other
                dist.broadcast(epoch)  # a
                return 1
            dist.barrier()  # b
    """)
    dec, r0, r1 = _line(path, "# decision"), _line(path, "# rank0"), _line(path, "# rank1")
    ranks = {0: _rank(0, [Site(path, r0, "main")], {"main": {"val_loss": "0.6", "best": "0.5"}}),
             1: _rank(1, [Site(path, r1, "main")], {"main": {"val_loss": "0.4", "best": "0.4"}})}
    f = Draft("DDP203", "At collective #18 on world the ranks disagree: ...", "fix",
                location=Location(path, r0, "main"), ranks=[0, 1])
    [g] = decided([f], ranks)
    assert (g.code, g.ranks, g.location.line) == ("DDP201", [1], dec)
    a, b = _line(path, "# a"), _line(path, "# b")
    ranks = {0: _rank(0, [Site(path, a, "resume")]), 1: _rank(1, [Site(path, b, "resume")])}
    f = Draft("DDP203", "At collective #0 ...", "fix", location=Location(path, a, "resume"), ranks=[0, 1])
    [g] = decided([f], ranks)
    assert (g.code, g.ranks, g.location.line) == ("DDP203", [0, 1], _line(path, "# other"))


def test_a_stack_cut_by_faulthandler_uses_the_frames_values_were_read_from(tmp_path):
    """faulthandler keeps the innermost 100 frames: a rank deep in an import shows no user frame there; the
    probe's values (read from the live frame chain) still say where its user frames are."""
    path = _script(tmp_path, """
        def prepare():
            if dist.get_rank() != 0:
                return  # decision
            dist.barrier()  # rank0

        def main():
            prepare()
            model = DDP(net)  # rank1
    """)
    dec, r0, r1 = _line(path, "# decision"), _line(path, "# rank0"), _line(path, "# rank1")
    deep = tuple(Site("/x/site-packages/torch/_dynamo/m.py", i, "<module>") for i in range(100))
    rank1 = RankState(rank=1, stack=deep, threads=(ThreadStack("MainThread", True, deep, (
        FrameValues(Site(path, r1, "main")), FrameValues(Site(path, r1 + 2, "<module>")))),))
    ranks = {0: _rank(0, [Site(path, r1 + 2, "<module>"), Site(path, r1 - 1, "main"), Site(path, r0, "prepare")]),
             1: rank1}
    d = provenance.locate([0], ranks)
    assert d is not None and d.site.line == dec and d.kind == "return"


def test_an_operand_that_reads_the_rank_makes_the_test_read_it(tmp_path):
    import ast

    from ddp_doctor.diagnose import source

    path = _script(tmp_path, """
        import sys
        MODE = sys.argv[1]

        def main(trainer, args):
            if MODE == "eval" and trainer.is_world_process_zero():
                pass
            if not (args.local_rank != -1):
                pass
    """)
    tree, _ = source.parse_file(path)
    fn = source.function_at(tree, "main", 6)
    tests = [n.test for n in source.own_nodes(fn) if isinstance(n, ast.If)]
    assert sorted(source.reads_rank(path, fn, t) for t in tests) == [False, True]


def test_a_hang_names_the_members_that_passed_a_group_they_are_not_in(tmp_path):
    """Ranks 0 and 3 wait in their pair's all_reduce at line L; ranks 1 and 2 made that call with the other
    pair's group (torch skipped it) and are elsewhere now, in a collective or not: DDP203 on 1 and 2."""
    from ddp_doctor.diagnose import diagnose
    from ddp_doctor.evidence import Collective, JobEvidence, SiteCount, Verdict

    path = _script(tmp_path, """
        def main(rank):
            pairs = [new_group([0, 1]), new_group([2, 3])]
            pair = pairs[rank % 2]  # decision
            for step in range(10):
                loss = step_ddp()  # ddp
                dist.all_reduce(t, group=pair)  # showed
    """)
    dec, ddp, at = _line(path, "# decision"), _line(path, "# ddp"), _line(path, "# showed")
    site = Site(path, at, "main")
    skipped = (SiteCount("all_reduce", site, 1),)
    ranks = {0: RankState(rank=0, in_collective=Collective("pg:0,1", 3, "all_reduce", site=site)),
             1: RankState(rank=1, not_member=skipped, stack=(Site(path, ddp, "main"),)),
             2: RankState(rank=2, not_member=skipped,
                          in_collective=Collective("world", 9, "ddp.backward(allreduce_grads)",
                                                   site=Site(path, ddp, "main"))),
             3: RankState(rank=3, in_collective=Collective("pg:2,3", 3, "all_reduce", site=site))}
    verdict, findings = diagnose(JobEvidence(4, ranks), Verdict("hang", stalled_s=30.0, limit_s=30.0))
    f = findings[0]
    assert (verdict, f.code, f.ranks, f.location.line) == ("hang", "DDP203", [1, 2], dec)
    assert "not members of" in f.message and "rank 0 waits in all_reduce on pg:0,1" in f.message


def test_a_rank_that_failed_is_placed_by_its_traceback(tmp_path):
    """Seed 000: rank 1 finished, rank 0 then failed in validate's DDP forward (a broken connection): no stack
    was taken, its traceback says the way it came, through the rank-0 branch."""
    from ddp_doctor.evidence import RaisedError

    path = _script(tmp_path, """
        def validate(model):
            return model(x)  # showed

        def main(rank):
            for epoch in range(3):
                train()
                if rank == 0:  # decision
                    validate(model)  # call
    """)
    dec, at, call = _line(path, "# decision"), _line(path, "# showed"), _line(path, "# call")
    tb = (Site(path, call, "main"), Site(path, at, "validate"), Site("/x/site-packages/torch/nn/m.py", 9, "f"))
    from ddp_doctor.evidence import Collective

    waited = Collective("world", 17, "ddp.forward(broadcast_buffers)", site=Site(path, at, "validate"))
    ranks = {0: RankState(rank=0, exc=RaisedError("RuntimeError", "Connection closed by peer", "builtins",
                                                  Site(path, at, "validate"), tb, True, waited)),
             1: RankState(rank=1, done=True)}
    f = Draft("DDP202", "Rank 0 ran the DDP model alone.", "fix", location=Location(path, at, "validate"), ranks=[0])
    [f] = decided([f], ranks)
    assert f.location.line == dec and f.evidence["decision"]["kind"] == "if"


def test_a_rank_that_went_on_alone_after_training_is_the_culprit_not_the_one_that_finished(tmp_path):
    """Both ranks ran 8 steps; rank 1 finished; rank 0 waits in an all_gather of an evaluation only it runs:
    DDP201 on rank 0 at its main-process branch, not DDP101 'left the training loop' on rank 1."""
    from ddp_doctor.diagnose import diagnose
    from ddp_doctor.evidence import Collective, JobEvidence, Verdict

    path = _script(tmp_path, """
        def main(trainer):
            trainer.train()
            if trainer.is_world_process_zero():  # decision
                trainer.evaluate()  # eval
    """)
    dec, at = _line(path, "# decision"), _line(path, "# eval")
    ranks = {0: RankState(rank=0, step=8, in_collective=Collective("world", 40, "all_gather", site=Site(path, at, "main")),
                          stack=(Site(path, at, "main"),)),
             1: RankState(rank=1, step=8, done=True)}
    verdict, findings = diagnose(JobEvidence(2, ranks), Verdict("exit", rank=1, finished=True))
    f = next(f for f in findings if f.severity.value == "error")
    assert (f.code, f.ranks, f.location.line) == ("DDP201", [0], dec)
    assert "went on alone into all_gather()" in f.message


def test_a_ddp_call_at_an_unknown_line_is_not_a_parting():
    """watch() after DDP(): a rank's first gradient all-reduce has no known line; that is no different line."""
    from ddp_doctor.diagnose.live import parted_calls
    from ddp_doctor.evidence import Collective

    op, at = "ddp.backward(allreduce_grads)", Site("/u/train.py", 33, "main")
    fps = {0: {("world", 0): Collective("world", 0, op, site=None)},
           1: {("world", 0): Collective("world", 0, op, site=at)}}
    assert parted_calls(fps) == {}
    fps[0][("world", 0)] = Collective("world", 0, op, site=Site("/u/train.py", 40, "evaluate"))
    assert set(parted_calls(fps)) == {0, 1}


def _in_grad_sync(st: RankState, forwards: int, syncs: int) -> RankState:
    from ddp_doctor.evidence import Collective
    from ddp_doctor.diagnose.grad_sync import GRAD_SYNC

    return replace(st, forwards=forwards, sync_forwards=syncs, in_collective=Collective("pg:0,1", syncs, GRAD_SYNC))


def test_a_rank_local_no_sync_choice_is_the_decision(tmp_path):
    """Gradient accumulation to a per-rank token budget: the ranks leave no_sync() after different
    micro-batches; the choice of the context manager is where they parted, with the count it read."""
    path = _script(tmp_path, """
        def main(model, batches):
            tokens = 0
            for ids in batches:
                tokens += count(ids)
                sync_now = tokens >= 96
                ctx = nullcontext() if sync_now else model.no_sync()  # decision
                with ctx:
                    model(ids).sum().backward()  # rank1
                if sync_now:
                    tokens = 0
            dist.barrier()  # rank0
    """)
    dec, r0, r1 = _line(path, "# decision"), _line(path, "# rank0"), _line(path, "# rank1")
    ranks = {0: _in_grad_sync(_rank(0, [Site(path, r0, "main")], {"main": {"tokens": "40"}}), 48, 12),
             1: _in_grad_sync(_rank(1, [Site(path, r1, "main")], {"main": {"tokens": "101", "sync_now": "True"}}), 46, 13)}
    f = Draft("DDP101", "Ranks ran different numbers of steps.", "", location=Location(path, r1, "main"), ranks=[0])
    [f] = decided([f], ranks)
    d = f.evidence["decision"]
    assert f.location.line == dec and d["kind"] == "value" and "model.no_sync()" in d["condition"]
    assert d["ways"] == {"1": "synced gradients after 13 of 46 forwards", "0": "synced gradients after 12 of 48 forwards"}
    assert d["values"]["1"] == {"sync_now": "True", "tokens": "101"}


def test_the_fewer_ranks_of_a_no_sync_choice_are_its_culprits(tmp_path):
    """A per-rank no_sync() choice over 3+ ranks: the group of ranks in the minority -- the ones still in a
    gradient sync (they synced more often), or the ones elsewhere (they synced less often) -- took the odd way:
    DDP101 on them at the choice, not DDP203/DDP201 on whoever stood at the mismatch.  Of two ranks, neither."""
    path = _script(tmp_path, """
        def main(model, batches):
            tokens = 0
            for ids in batches:
                tokens += count(ids)
                sync_now = tokens >= 96
                if not sync_now:  # decision
                    with model.no_sync():
                        model(ids).sum().backward()
                else:
                    model(ids).sum().backward()  # sync
                if sync_now:
                    tokens = 0
            dist.all_reduce(done)  # end
    """)
    dec, sync, end = _line(path, "# decision"), _line(path, "# sync"), _line(path, "# end")

    def job(in_sync: set[int], world: int):
        return {r: _in_grad_sync(_rank(r, [Site(path, sync, "main")], {"main": {"sync_now": "True"}}), 12, 6)
                if r in in_sync else replace(_rank(r, [Site(path, end, "main")], {"main": {"sync_now": "False"}}),
                                             forwards=16, sync_forwards=5) for r in range(world)}

    for in_sync, world, culprits in (({3}, 4, [3]), ({1, 2}, 3, [0])):
        f = Draft("DDP203", "The ranks disagree.", "", location=Location(path, sync, "main"), ranks=[1])
        f = decided([f], job(in_sync, world))[0]
        assert (f.code, f.ranks, f.location.line) == ("DDP101", culprits, dec), (in_sync, f.code, f.ranks)
        assert f.evidence["decision"]["parting"] == "skip"
        # `not sync_now` over a recorded True/False tests a flag, not an empty batch
        assert "empty" not in f.evidence["decision"]["why"]
    f = Draft("DDP203", "The ranks disagree.", "", location=Location(path, sync, "main"), ranks=[1])
    f = decided([f], job({1}, 2))[0]
    assert (f.code, f.ranks, f.location.line) == ("DDP203", [1], dec)

def test_a_while_loop_left_by_its_own_test_is_the_decision(tmp_path):
    """A per-rank time budget, `while spent < budget:` with no break: the slower rank left after fewer optimizer
    steps than the others are in.  No value read at the test survived (the ranks were killed); the step counts
    and a loop with no other way out make its header the decision, DDP101 on the rank that left."""
    path = _script(tmp_path, """
        def main(model, opt, budget, cost):
            spent = 0.0
            while spent < budget:  # decision
                model(x).sum().backward()  # sync
                opt.step()
                spent += cost
            dist.all_reduce(done)  # end
    """)
    dec, sync, end = _line(path, "# decision"), _line(path, "# sync"), _line(path, "# end")
    ranks = {0: replace(_in_grad_sync(_rank(0, [Site(path, sync, "main")]), 14, 14), step=13),
             1: replace(_rank(1, [Site(path, end, "main")]), step=13)}
    f = Draft("DDP201", "Rank 1 called all_reduce() at a line the others never reach.", "",
                location=Location(path, end, "main"), ranks=[1])
    f = decided([f], ranks)[0]
    assert (f.code, f.ranks, f.location.line) == ("DDP101", [1], dec)
    assert "left it after 13 optimizer steps while rank 0 trains in it, in step 14" in f.message
    # the same ranks with as many steps: nothing says the loop's test let one out sooner
    ranks[1] = replace(ranks[1], step=14)
    f = Draft("DDP201", "Rank 1 called all_reduce().", "", location=Location(path, end, "main"), ranks=[1])
    assert decided([f], ranks)[0].location.line != dec
    # an epoch's loop inside an epoch loop: rank 0 may be in the next epoch's round of it (generated job: a
    # rank-0-only step between epochs was blamed on the batch loop; a file of its own: sources are cached by path)
    (tmp_path / "nested").mkdir()
    path = _script(tmp_path / "nested", """
        def main(model, opt, loader, epochs):
            for epoch in range(epochs):
                for x in loader:  # inner
                    model(x).sum().backward()  # sync
                    opt.step()
                log_on_rank0()  # end
    """)
    inner, sync, end = _line(path, "# inner"), _line(path, "# sync"), _line(path, "# end")
    ranks = {0: replace(_in_grad_sync(_rank(0, [Site(path, sync, "main")]), 5, 5), step=4),
             1: replace(_rank(1, [Site(path, end, "main")]), step=4)}
    f = Draft("DDP201", "Rank 1 called barrier().", "", location=Location(path, end, "main"), ranks=[1])
    f = decided([f], ranks)[0]
    assert f.location.line != inner and "optimizer steps while" not in f.message

def test_a_rank_that_went_alone_into_an_api_through_a_helper(tmp_path):
    """A rank-0 evaluation of an FSDP2 model through a helper (3 ranks): rank 0 issued all-gathers at the helper's
    forward line, which no other rank ran, and stands at the shared forward again by the time the mismatch shows.
    The helper's every call is under `if rank == 0`: rank 0 went alone (generated job: rank 2 was blamed for
    entering the backward more often)."""
    from ddp_doctor.diagnose.apiwords import went_alone
    from ddp_doctor.evidence import SiteCount

    path = _script(tmp_path, """
        def run_eval(model, x):
            print(model(x).mean().item())  # eval

        def main(model, opt):
            for step in range(17):
                loss = model(x).sum()  # fwd
                loss.backward()  # bwd
                if rank == 0 and step == 5:
                    run_eval(model, x)
                opt.step()
    """)
    ev, fwd, bwd = _line(path, "# eval"), _line(path, "# fwd"), _line(path, "# bwd")
    at = {n: Site(path, ln, fn, api="fsdp2.forward") for n, ln, fn in
          (("eval", ev, "run_eval"), ("fwd", fwd, "main"), ("bwd", bwd, "main"))}
    seen = lambda *names: frozenset(("all_gather_single", at[n].key()) for n in names)  # noqa: E731
    ranks = {0: replace(_rank(0, [Site(path, fwd, "main")]), sites_seen=seen("eval", "fwd", "bwd"),
                        site_counts=(SiteCount("all_gather_single", at["eval"], 2),)),
             1: replace(_rank(1, [Site(path, bwd, "main")]), sites_seen=seen("fwd", "bwd")),
             2: replace(_rank(2, [Site(path, bwd, "main")]), sites_seen=seen("fwd", "bwd"))}
    got = went_alone(ranks)
    assert got is not None and got[0] == [0] and got[1].site.line == ev
    # called from a line every rank runs too: not a rank's own way
    path2 = tmp_path / "other"
    path2.mkdir()
    p2 = _script(path2, open(path).read().replace("if rank == 0 and step == 5:", "if step == 5:"))
    moved = {r: replace(st, site_counts=tuple(SiteCount(c.op, replace(c.site, path=p2), c.calls) for c in st.site_counts),
                        stack=(Site(p2, st.stack[0].line, "main"),),
                        threads=(replace(st.threads[0], frames=(Site(p2, st.stack[0].line, "main"),)),))
             for r, st in ranks.items()}
    assert went_alone(moved) is None

def test_an_accumulation_schedule_on_the_step_is_not_the_decision(tmp_path):
    """`if (step + 1) % accum != 0: with model.no_sync()` is the same on every rank at one step: ranks whose
    syncs differ parted elsewhere (uneven batches), so the choice is not named."""
    path = _script(tmp_path, """
        def main(model, loader, accum):
            for step, ids in enumerate(loader):
                if (step + 1) % accum != 0:
                    with model.no_sync():
                        model(ids).sum().backward()
                else:
                    model(ids).sum().backward()  # rank1
            dist.barrier()  # rank0
    """)
    r0, r1 = _line(path, "# rank0"), _line(path, "# rank1")
    ranks = {0: _in_grad_sync(_rank(0, [Site(path, r0, "main")]), 40, 10),
             1: _in_grad_sync(_rank(1, [Site(path, r1, "main")]), 44, 11)}
    from ddp_doctor.diagnose.grad_sync import sync_choice

    assert sync_choice(ranks) is None


def test_a_sync_flag_passed_into_a_helper_is_the_decision(tmp_path):
    """The choice made in a helper from a flag its caller computed per rank: the helper's choice, with the flag."""
    path = _script(tmp_path, """
        def micro_step(model, ids, sync):
            with (nullcontext() if sync else model.no_sync()):  # decision
                model(ids).sum().backward()  # rank1

        def main(model, batches):
            for ids in batches:
                micro_step(model, ids, count(ids) > 40)  # call
            dist.barrier()  # rank0
    """)
    dec, call, r0, r1 = (_line(path, m) for m in ("# decision", "# call", "# rank0", "# rank1"))
    ranks = {0: _in_grad_sync(_rank(0, [Site(path, r0, "main")]), 48, 12),
             1: _in_grad_sync(_rank(1, [Site(path, call, "main"), Site(path, r1, "micro_step")],
                                    {"micro_step": {"sync": "True"}}), 46, 13)}
    from ddp_doctor.diagnose.grad_sync import sync_choice

    d = sync_choice(ranks)
    assert d is not None and d.site.line == dec and d.site.function == "micro_step"
    assert dict(d.values) == {1: (("sync", "True"),)}


def test_a_thread_that_makes_one_call_more_is_the_culprit_at_its_loop(tmp_path):
    """Two groups of the same ranks; a metrics thread all-reduces `40 + rank` times on the second.  Rank 1's
    thread waits in its 41st call, rank 0's thread has ended and rank 0 waits in the final barrier on the
    first group: a wait cycle.  The culprit is rank 1's thread, at the loop whose count reads the rank -
    not rank 0's barrier, which only waits for it."""
    from ddp_doctor.diagnose.collectives import blame_positions
    from ddp_doctor.evidence import Collective, SiteCount

    path = _script(tmp_path, """
        def main(rank, train_group, metrics_group):
            def report():
                for _ in range(40 + rank):  # decision
                    dist.all_reduce(torch.ones(1), group=metrics_group)  # thread
            t = threading.Thread(target=report)
            t.start()
            train(train_group)
            t.join()  # join
            dist.barrier(group=train_group)  # rank0
    """)
    dec, th, jn, r0 = (_line(path, m) for m in ("# decision", "# thread", "# join", "# rank0"))
    reduce_at, barrier_at = Site(path, th, "report"), Site(path, r0, "main")
    counts = (SiteCount("all_reduce", reduce_at, 40),)
    ranks = {
        0: replace(_rank(0, [barrier_at]), site_counts=counts, seq={"pg:0,1": 62, "pg:0,1~1": 40},
                   in_collective=Collective("pg:0,1", 61, "barrier", site=barrier_at, blocking=True, waiting_s=2.0)),
        1: replace(_rank(1, [Site(path, jn, "main")]), site_counts=counts, seq={"pg:0,1": 61, "pg:0,1~1": 41},
                   in_collective=Collective("pg:0,1~1", 40, "all_reduce", site=reduce_at, blocking=True, waiting_s=2.0),
                   threads=(ThreadStack("MainThread", True, (Site(path, jn, "main"),)),
                            ThreadStack("metrics", False, (Site(path, th, "report"),)))),
    }
    b = blame_positions({r: st.in_collective for r, st in ranks.items()}, ranks)
    code, fault, site, group = b.code, b.ranks, b.site, b.group
    assert (code, fault, site.line, group, b.why) == ("DDP201", [1], th, "pg:0,1~1", "thread")
    d = provenance.thread_loop(site, [1], ranks)
    assert d is not None and d.site.line == dec and d.kind == "for" and dict(d.ways) == {0: "left the loop", 1: "stayed in the loop"}


def test_a_skip_of_the_training_loop_is_found_while_the_other_rank_is_in_its_accumulation_loop(tmp_path):
    """A `while True` training loop whose counter moves on a skipped batch (`continue`), with a
    gradient-accumulation loop inside it: rank 1 finished after 36 steps; rank 0 waits in its 37th step's
    gradient sync, inside the accumulation loop (which has no `continue` of its own).  The skip of the outer
    loop is the decision -- not "left the training loop" with no line."""
    from ddp_doctor.diagnose import diagnose
    from ddp_doctor.evidence import Collective, JobEvidence, Verdict

    path = _script(tmp_path, """
        it = 0
        while True:
            if noisy(xb):
                it += 1
                continue  # decision
            for micro in range(accum):
                loss = model(xb)
                loss.backward()  # sync
            opt.step()
            it += 1
            if it > max_iters:
                break
    """)
    dec, sync = _line(path, "# decision"), _line(path, "# sync")
    ranks = {0: RankState(rank=0, step=36, stack=(Site(path, sync, "<module>"),),
                          in_collective=Collective("world", 37, "ddp.backward(allreduce_grads)",
                                                   site=Site(path, sync, "<module>"))),
             1: RankState(rank=1, step=36, done=True)}
    verdict, findings = diagnose(JobEvidence(2, ranks), Verdict("exit", rank=1, finished=True))
    f = next(f for f in findings if f.severity.value == "error")
    assert (f.code, f.ranks, f.location.line) == ("DDP101", [1], dec), f.message
    assert f.evidence["decision"]["ways"] == {"1": "left the loop after 36 optimizer steps",
                                              "0": "is still in it, in step 37"}


def test_a_rank_that_called_sys_exit_inside_the_loop_did_not_leave_it_by_its_test(tmp_path):
    """Rank 1 called sys.exit() inside the training loop (a preemption notice only its node got) after 8 steps;
    rank 0 waits in its 9th step's gradient sync.  The rank ended its process there: DDP204 at the exit, and no
    "the ranks parted at `for step in range(18):` ... its test let rank 1 out sooner" (the loop's test let no
    rank out; the report once said so)."""
    from ddp_doctor.diagnose import diagnose
    from ddp_doctor.evidence import Collective, JobEvidence, Verdict

    path = _script(tmp_path, """
        def main():
            for step in range(18):  # loop
                if rank == 1 and step == 8:
                    sys.exit(0)  # exit
                loss = model(x)
                loss.backward()  # sync
                opt.step()
    """)
    loop, ex, sync = _line(path, "# loop"), _line(path, "# exit"), _line(path, "# sync")
    ranks = {0: RankState(rank=0, step=8, stack=(Site(path, sync, "main"),),
                          in_collective=Collective("world", 9, "ddp.backward(allreduce_grads)",
                                                   site=Site(path, sync, "main"))),
             1: RankState(rank=1, step=8, done=True, exit_site=Site(path, ex, "main"))}
    assert provenance.exited_inside_loop(ranks[1], [ranks[0]])
    assert provenance.locate([1], ranks) is None
    verdict, findings = diagnose(JobEvidence(2, ranks), Verdict("exit", rank=1, finished=True))
    errors = [f for f in findings if f.severity.value == "error"]
    assert [(f.code, f.ranks, f.location.line) for f in errors] == [("DDP204", [1], ex)], [f.message for f in errors]
    assert not any("its test let" in f.message or f.location.line == loop for f in findings)


def test_a_rank_that_raised_system_exit_in_a_helper_the_loop_calls_did_not_leave_the_loop(tmp_path):
    """The same exit, inside a helper the loop calls (``raise SystemExit(0)``): the exit's frames (the probe's
    ``exit_stack``) put it inside the loop rank 0 still trains in."""
    from ddp_doctor.diagnose import diagnose
    from ddp_doctor.evidence import Collective, JobEvidence, Verdict

    path = _script(tmp_path, """
        def check_preemption(notice):
            if notice:
                raise SystemExit(0)  # exit
        def main():
            for step in range(18):  # loop
                check_preemption(rank == 1 and step == 8)  # call
                loss = model(x)
                loss.backward()  # sync
                opt.step()
    """)
    loop, ex, call, sync = (_line(path, m) for m in ("# loop", "# exit", "# call", "# sync"))
    exit_site = Site(path, ex, "check_preemption")
    ranks = {0: RankState(rank=0, step=8, stack=(Site(path, sync, "main"),),
                          in_collective=Collective("world", 9, "ddp.backward(allreduce_grads)",
                                                   site=Site(path, sync, "main"))),
             1: RankState(rank=1, step=8, done=True, exit_site=exit_site,
                          exit_stack=(Site(path, call, "main"), exit_site))}
    assert provenance.exited_inside_loop(ranks[1], [ranks[0]])
    assert not provenance.exited_inside_loop(ranks[1].with_(exit_stack=()), [ranks[0]])  # the helper alone: unknown
    verdict, findings = diagnose(JobEvidence(2, ranks), Verdict("exit", rank=1, finished=True))
    errors = [f for f in findings if f.severity.value == "error"]
    assert [(f.code, f.ranks, f.location.line) for f in errors] == [("DDP204", [1], ex)], [f.message for f in errors]
    assert errors[0].message.startswith(f"Rank 1 raised SystemExit at train.py:{ex}")  # its line's words
    assert not any("its test let" in f.message or f.location.line == loop for f in findings)


def test_a_rank_that_exits_before_training_left_no_training_loop(tmp_path):
    """Rank 1 has no shard and calls sys.exit() right after init; rank 0 waits in DDP's constructor: DDP204 at the
    exit, not "Rank 1 left the training loop and finished after 0 steps while the others still train" (it was
    never in one, and the others do not train yet; the report once said so)."""
    from ddp_doctor.diagnose import diagnose
    from ddp_doctor.evidence import Collective, JobEvidence, Verdict

    path = _script(tmp_path, """
        def main():
            if not my_shards:
                sys.exit(0)  # exit
            model = DDP(net)  # ctor
            for step in range(8):
                train(model)
    """)
    ex, ctor = _line(path, "# exit"), _line(path, "# ctor")
    ranks = {0: RankState(rank=0, stack=(Site(path, ctor, "main"),),
                          in_collective=Collective("world", 0, "ddp.init(broadcast_params)", site=Site(path, ctor, "main"))),
             1: RankState(rank=1, done=True, exit_site=Site(path, ex, "main"), exit_stack=(Site(path, ex, "main"),))}
    verdict, findings = diagnose(JobEvidence(2, ranks), Verdict("exit", rank=1, finished=True))
    errors = [f for f in findings if f.severity.value == "error"]
    assert [(f.code, f.ranks, f.location.line) for f in errors] == [("DDP204", [1], ex)], [f.message for f in errors]
    assert not any("training loop" in f.message for f in findings)


def test_how_a_program_ended_is_said_in_its_own_lines_words(tmp_path):
    """The DDP204 of a SystemExit names what the line did: a method whose name ends in "exit" is no exit()."""
    from ddp_doctor.diagnose.exits import _exit_words

    path = _script(tmp_path, """
        sys.exit(0)
        raise SystemExit(2)
        exit()
        trainer.should_exit(flag)
        runner.exit(0)
    """)
    assert [_exit_words(Site(path, n, "<module>")) for n in range(1, 6)] == [
        "called sys.exit()", "raised SystemExit", "called exit()", "ended its program (SystemExit)",
        "ended its program (SystemExit)"]
