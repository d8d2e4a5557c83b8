"""The probe's step bookkeeping (probe/recorder.py) on its own, no processes: training epochs and skipped
gradient syncs are what the DDP101 proof and its blame rest on."""
from __future__ import annotations

from ddp_doctor.probe.recorder import EpochRec, LoaderRec, Recorder


def _batch(rec: Recorder, lr: LoaderRec, e: EpochRec) -> None:
    """One batch of pass ``e`` (the DataLoader hook calls ``batch_drawn`` and notes the loader)."""
    rec.batch_drawn(lr, e)
    rec.last_loader = lr


def test_a_pass_without_a_step_is_not_an_epoch():
    rec = Recorder()
    lr = LoaderRec(0, None, {}, None)
    peek = lr.cur = EpochRec()      # rank 0 logs the shape of next(iter(loader))
    _batch(rec, lr, peek)
    for epoch in range(2):
        e = lr.cur = EpochRec()
        for _ in range(4):
            _batch(rec, lr, e)
            rec.step()
    samples = lr.cur = EpochRec()   # sample predictions on a few training batches: no step
    for _ in range(3):
        _batch(rec, lr, samples)
    steps, batches, skips, joined, skipped = lr.epoch_counts()
    assert steps == (4, 4) and batches == (4, 4) and skips == (0, 0) and peek.index is None
    assert samples.index is None and rec.epoch_ctx() == (2, 0)  # a pass not followed by a step yet


def test_a_skipped_batch_is_counted_where_it_happened():
    rec = Recorder()
    lr = LoaderRec(0, None, {}, None)
    e = lr.cur = EpochRec()
    for b in range(1, 6):
        _batch(rec, lr, e)
        if b != 3:                  # batch 3: `continue` before backward and step
            rec.step()
    assert e.skips == 1 and e.skipped == [3] and e.steps == 4


def test_a_sync_forward_with_no_backward_is_a_skipped_sync():
    rec = Recorder()
    for it in range(1, 6):
        rec.sync_forward("world", 0)
        if it != 3:
            rec.pending_grad_sync = None   # the backward hook consumed it
    assert rec.sync_forwards == 5 and rec.syncs_skipped == 1 and rec.skipped_syncs[0][0] == 3


def test_a_sync_left_pending_into_the_next_accumulation_is_a_skipped_sync_once():
    """Micro-steps of 2 (the first under no_sync()): iteration 2's last micro-step `continue`s before its
    backward, so the sync it prepared runs at iteration 3's first backward: skipped once, however many forwards
    overtake it; a no-sync forward with nothing pending counts nothing."""
    rec = Recorder()
    for it in range(1, 5):
        rec.sync_overtaken()                # micro-step 0: a forward under no_sync()
        rec.pending_grad_sync = None        # its backward (runs a pending sync, if any)
        rec.sync_forward("world", 0)        # micro-step 1 prepares the sync
        if it != 2:
            rec.pending_grad_sync = None    # its backward ran the sync
        else:
            rec.sync_overtaken()            # `continue`: the next forward, under no_sync(), overtakes it ...
            rec.sync_overtaken()            # ... and so does any other before a backward: counted once
    assert rec.sync_forwards == 4 and rec.syncs_skipped == 1 and [x[0] for x in rec.skipped_syncs] == [2]
