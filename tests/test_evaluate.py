import pytest

from trl_ext.tasks.doubling.evaluate import score_completions


def test_score_completions_on_hand_written_answers():
    questions = [3320, 3320, 3320, 3320, 1000]
    labels = [0, 0, 0, 1, 2]
    answers = ["6640E", "6640E", "6640E", "六六四〇E", "贰零零零E"]
    completions = ["6640E", "六六四〇E", "6641E", "六六四〇", "贰零零零EPP"]
    m = score_completions(questions, labels, answers, completions)
    # correct / wrong set / wrong value / missing E / correct with trailing pad
    assert m["value_acc"] == pytest.approx(4 / 5)
    assert m["charset_acc"] == pytest.approx(4 / 5)
    assert m["exact"] == pytest.approx(2 / 5)
    assert m["finished"] == pytest.approx(4 / 5)
    assert m["per_label"]["digits"]["exact"] == pytest.approx(1 / 3)
    assert m["per_label"]["upper"]["exact"] == 1.0


def test_score_completions_rejects_ragged_input():
    with pytest.raises(ValueError, match="equally many"):
        score_completions([1], [0], ["2E"], [])


def test_run_recorder_counts_training_time_only():
    import time

    from trl_ext.runs.recorder import RunRecorder

    recorder = RunRecorder(backend="x")
    time.sleep(0.3)  # building the trainer
    recorder.begin()
    time.sleep(0.05)
    recorder.end()
    time.sleep(0.3)  # saving
    assert recorder.setup_seconds >= 0.3 and 0.04 <= recorder.train_seconds < 0.25
