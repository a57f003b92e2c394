"""Terminal progress lines: durations, epoch line fields and ETA arithmetic."""

import io

from pipeline.terminal import StageProgress, epoch_line, evaluation_line, format_duration


def test_format_duration():
    assert format_duration(12) == "12s"
    assert format_duration(287) == "4m47s"
    assert format_duration(3723) == "1h02m03s"


def test_epoch_line_fields_and_eta():
    progress = {
        "epoch": 2,
        "epochs": 5,
        "loss": 0.5,
        "accuracy": 0.8,
        "val_loss": 0.6,
        "val_accuracy": 0.75,
        "learning_rate": 0.001,
        "examples_per_second": 1234.4,
    }
    line = epoch_line(progress, [60.0, 80.0])
    assert line == (
        "epoch 2/5 loss 0.5000 acc 0.8000 val_loss 0.6000 val_acc 0.7500 "
        "lr 1.00e-03 1234 ex/s ETA 3m30s"
    )


def test_stage_progress_prints_epoch_line_with_eta_from_timings():
    out = io.StringIO()
    progress = StageProgress("train", out)
    progress.last_epoch_at = 100.0
    progress.epoch({"epoch": 1, "epochs": 3, "loss": 1.0}, now=130.0)
    assert out.getvalue() == "[train] epoch 1/3 loss 1.0000 ETA 1m00s\n"


def test_evaluation_line_reads_metrics_and_blessing(tmp_path):
    (tmp_path / "metrics.json").write_text('{"accuracy": 0.9312}')
    (tmp_path / "blessing.json").write_text('{"blessed": false, "reasons": ["below 0.94"]}')
    assert evaluation_line(str(tmp_path)) == "accuracy 0.9312 NOT blessed (below 0.94)"
    assert "no metrics.json" in evaluation_line(str(tmp_path / "missing"))
