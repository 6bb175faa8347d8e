"""A Trainer's phases (helpers/run/train.py): built → started → stepping → finished, each call allowed only in its
own; a call out of phase fails in one line."""
from __future__ import annotations

import pytest

from helpers.run.corpus import DataError
from helpers.record import load_run
from helpers.run.data import DataGate
from helpers.run.train import Phase, Trainer, TrainError, Turns
from helpers.tune.study import base_config


def _tiny(corpus, **changes):
    return base_config("debug", 6, str(corpus), {"steady_after": 2, "eval_every": 0, "eval_batches": 2, "threads": 1,
                                                **changes})


def test_a_built_trainer_refuses_steps_evaluation_and_a_summary_before_start(tmp_path, small_corpus):
    trainer = Trainer(_tiny(small_corpus), tmp_path / "run")  # nothing written, MindSpore untouched
    assert trainer.phase is Phase.BUILT and trainer.outcome is None and trainer.last_loss is None
    for name, call in (("step_block", lambda: trainer.step_block(1)), ("step_block", lambda: trainer.measure_block(1)),
                       ("evaluate", trainer.evaluate), ("finish", trainer.finish)):
        with pytest.raises(TrainError) as err:
            call()
        assert str(err.value) == f"Trainer.{name}() before start(): this trainer is only built; call start() first"
    assert not (tmp_path / "run" / "summary.json").exists()


@pytest.mark.slow
def test_a_round_arm_goes_through_every_phase_then_measures_past_its_record(tmp_path, small_corpus):
    gate = DataGate()
    trainer = Trainer(_tiny(small_corpus), tmp_path / "arm", turns=Turns(gate, extra_steps=3))
    assert trainer.start() == 1 and trainer.phase is Phase.STARTED
    assert load_run(tmp_path / "arm").summary["status"] == "running"
    assert len(trainer.step_block(4)) == 4 and trainer.phase is Phase.STEPPING and trainer.outcome is None
    assert isinstance(trainer.last_loss, float)
    times, waits = trainer.measure_block(4)  # steps 5 and 6 end the record; 2 measurement-only steps follow
    assert len(times) == len(waits) == 4 and trainer.phase is Phase.FINISHED and trainer.outcome.status == "ok"
    record = load_run(tmp_path / "arm")
    assert record.status == "ok" and [r["step"] for r in record.metrics] == list(range(1, 7))
    assert len(trainer.step_block(5)) == 1  # only what is left of the 3 measurement-only steps
    assert not gate.is_open  # between its blocks the gate stays closed, also after the record ended
    assert trainer.finish() is trainer.outcome and load_run(tmp_path / "arm").summary == record.summary
    # no step comes after finish: the gate opens for good, or the pipeline's threads would wait on it for ever and
    # so would whatever stops them (the garbage collector hung a pytest-xdist worker; MindSpore's exit, a DP rank)
    assert gate.is_open
    with pytest.raises(TrainError, match=r"Trainer.start\(\) called on a finished trainer; a Trainer trains one run"):
        trainer.start()


@pytest.mark.slow
def test_a_failed_start_is_recorded_and_the_trainer_is_finished(tmp_path, small_corpus):
    trainer = Trainer(_tiny(small_corpus, **{"model.vocab_size": 8}), tmp_path / "run")  # below the tokenizer's
    with pytest.raises(DataError, match="the tokenizer .char. has 30 tokens and the model's vocabulary "
                                        "model.vocab_size=8 is smaller"):
        trainer.start()
    assert trainer.phase is Phase.FINISHED and trainer.outcome.status == "failed"
    summary = load_run(tmp_path / "run").summary
    assert summary["status"] == "failed" and summary["status_reason"].startswith("DataError: the tokenizer (char)")
    assert summary["n_params"] is None  # it failed before its model was built
    assert trainer.finish().status == "failed" and load_run(tmp_path / "run").summary == summary  # not rewritten
    assert trainer.step_block(3) == []  # nothing after a failure
    with pytest.raises(TrainError, match="this run failed before its model was built"):
        trainer.evaluate()


@pytest.mark.slow
def test_a_round_arms_compile_step_lets_its_pipeline_read_only_the_batch_it_asks_for(tmp_path, small_corpus,
                                                                                      monkeypatch):
    """Left open through the compile (seconds), the pipeline read data.prefetch batches ahead, and the arm's first
    timed steps met no data wait a data-bound run pays later."""
    import helpers.run.data as data
    reads = []  # windows cut (the map op: the pipeline's work per sample; the source only hands out indices)
    cut = data._SliceWindow.__call__
    monkeypatch.setattr(data._SliceWindow, "__call__", lambda self, i: (reads.append(i), cut(self, i))[1])
    cfg = _tiny(small_corpus, **{"data.prefetch": 16, "steps": 40})
    gate = DataGate()
    trainer = Trainer(cfg, tmp_path / "arm", turns=Turns(gate))
    trainer.start()
    trainer.step_block(1)  # the compile step
    # the batch asked for, and what the workers cut while next() handed it over (3 batches quiet, 4 on a loaded CI
    # machine); left open through the compile, the pipeline read all 16 prefetched batches ahead
    assert len(reads) <= 8 * cfg.batch_size, (len(reads), cfg.batch_size)
    trainer.step_block(3)
    assert len(reads) > 4 * cfg.batch_size  # after it, the pipeline reads ahead while the arm steps
    trainer.finish()
    gate.open()  # the pipeline's threads end with this process, not blocked on a closed gate


@pytest.mark.slow
def test_a_round_arm_holds_its_pipeline_through_validation_passes_and_checkpoints(tmp_path, small_corpus):
    """Work no step waits on must not let an arm's pipeline read ahead: the workbook's short runs validate every
    few steps, and the batches read meanwhile hid the stalls of the steps measured after them."""
    gate = DataGate()
    trainer = Trainer(_tiny(small_corpus, eval_every=1, checkpoint_every=2), tmp_path / "arm", turns=Turns(gate, 0))
    trainer.start()
    seen = []
    built, save = trainer._built, trainer._loop.checkpoint
    evaluate = built.evaluate
    built.evaluate = lambda: seen.append(("validate", gate.is_open)) or evaluate()
    trainer._loop.checkpoint = lambda step: seen.append(("checkpoint", gate.is_open)) or save(step)
    assert len(trainer.step_block(4)) == 4
    assert seen == [("validate", False)] * 2 + [("checkpoint", False), ("validate", False), ("validate", False),
                                                ("checkpoint", False)], seen
    alone = Trainer(_tiny(small_corpus, eval_every=1), tmp_path / "alone")  # a run of its own: nothing held
    alone.start()
    assert len(alone.step_block(2)) == 2 and alone._loop.turn_gate is None
