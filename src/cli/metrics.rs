//! `train --metrics`: one JSON record per line, one per step and one per epoch, and how a
//! resumed run takes up the file of the run it continues.
//!
//! Step records: `{"step", "epoch", "loss", "lr", "loss_scale"}`. Epoch records: `{"epoch",
//! "step", "complete", "train_loss", "train_acc", "test_acc", "seconds", "images_per_s",
//! "allreduce_share"}`; `step` is the run's step count when the epoch ended and `complete`
//! is false for an epoch that `--max-steps` cut short. A value that is not finite is
//! written as `null` (JSON has no NaN) and read back as NaN.

use std::path::Path;

use nanoddp::train::{EpochReport, StepReport};
use serde_json::{json, Value};

use super::plot::Curves;

/// The record of one step.
pub fn step_record(s: &StepReport) -> String {
    json!({"step": s.step, "epoch": s.epoch, "loss": s.loss, "lr": s.lr, "loss_scale": s.loss_scale})
        .to_string()
}

/// The record of one epoch.
pub fn epoch_record(e: &EpochReport) -> String {
    json!({"epoch": e.epoch, "step": e.step, "complete": e.complete, "train_loss": e.train_loss,
        "train_acc": e.train_acc, "test_acc": e.test_acc, "seconds": e.seconds,
        "images_per_s": e.images_per_s, "allreduce_share": e.allreduce_share})
    .to_string()
}

/// The metrics file, written a whole record at a time: a record that cannot be written
/// whole (a full disk) is cut off again, so the file always ends with a complete line.
#[derive(Debug)]
pub struct Recorder {
    file: std::fs::File,
    /// The file's length after the last whole record.
    len: u64,
}

impl Recorder {
    /// Takes a file opened for appending.
    pub fn new(file: std::fs::File) -> std::io::Result<Recorder> {
        let len = file.metadata()?.len();
        Ok(Recorder { file, len })
    }

    /// Appends `record` and a newline in one write, or leaves the file as it was.
    pub fn write(&mut self, record: &str) -> std::io::Result<()> {
        use std::io::Write;
        let line = format!("{record}\n");
        if let Err(e) = self.file.write_all(line.as_bytes()) {
            // Best effort: the failure reported is the write's.
            let _ = self.file.set_len(self.len);
            return Err(e);
        }
        self.len += line.len() as u64;
        Ok(())
    }
}

/// What a resumed run keeps of its metrics file.
#[derive(Debug, Default)]
pub struct History {
    /// The lines kept, each a record, without their newlines.
    pub lines: Vec<String>,
    /// The curves they draw.
    pub curves: Curves,
    /// Whether a torn last line (a crash mid-write) was dropped.
    pub dropped_torn_line: bool,
    /// Records dropped because they come after the checkpoint (the part of the earlier run
    /// that is trained again).
    pub dropped_after_checkpoint: usize,
}

fn number(v: &Value, key: &str) -> Option<f64> {
    match v.get(key)? {
        Value::Null => Some(f64::NAN),
        x => x.as_f64(),
    }
}

/// Reads the metrics file of the run a checkpoint at `resumed_step` continues: keeps every
/// record up to that step, drops the records after it (their steps are trained again) and
/// a torn last line, and rebuilds the curves. Any other line that is not a record is an
/// error naming the file and the line.
pub fn history(
    path: &Path,
    resumed_step: usize,
    steps_per_epoch: usize,
) -> Result<History, String> {
    let text = match std::fs::read(path) {
        Ok(bytes) => String::from_utf8_lossy(&bytes).into_owned(),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(History::default()),
        Err(e) => return Err(format!("{}: {e}", path.display())),
    };
    let mut history = History::default();
    let lines: Vec<&str> = text.lines().collect();
    let spe = steps_per_epoch.max(1) as f64;
    for (i, line) in lines.iter().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let last = i + 1 == lines.len();
        let parsed: Option<Value> = serde_json::from_str(line).ok().filter(Value::is_object);
        let Some(rec) = parsed.filter(|_| !last || text.ends_with('\n')) else {
            if last {
                history.dropped_torn_line = true;
                continue;
            }
            return Err(format!(
                "{}: line {} is not a metrics record of `nanoddp train`; give --metrics another \
                 file, or remove this one",
                path.display(),
                i + 1
            ));
        };
        let epoch = number(&rec, "epoch").unwrap_or(0.0);
        if rec.get("train_loss").is_some() {
            // Epoch records from before `step` was recorded end at a whole epoch.
            let step = number(&rec, "step").unwrap_or(epoch * spe);
            if step > resumed_step as f64 {
                history.dropped_after_checkpoint += 1;
                continue;
            }
            history.curves.epochs.push(super::plot::EpochPoint {
                at: step / spe,
                complete: rec.get("complete").and_then(Value::as_bool).unwrap_or(true),
                train_loss: number(&rec, "train_loss").unwrap_or(f64::NAN),
                train_acc: number(&rec, "train_acc").unwrap_or(f64::NAN),
                test_acc: number(&rec, "test_acc").unwrap_or(f64::NAN),
            });
        } else {
            let step = number(&rec, "step").unwrap_or(0.0);
            if step > resumed_step as f64 {
                history.dropped_after_checkpoint += 1;
                continue;
            }
            history
                .curves
                .step_loss
                .push((step / spe, number(&rec, "loss").unwrap_or(f64::NAN)));
        }
        history.lines.push((*line).to_string());
    }
    Ok(history)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_resume_keeps_the_records_up_to_its_step_and_drops_a_torn_line() {
        let dir = std::env::temp_dir().join(format!("nanoddp-metrics-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("m.jsonl");
        let text = [
            r#"{"step":1,"epoch":1,"loss":2.3,"lr":0.05,"loss_scale":1}"#,
            r#"{"step":2,"epoch":1,"loss":null,"lr":0.05,"loss_scale":1}"#,
            r#"{"epoch":1,"step":2,"complete":true,"train_loss":2.0,"train_acc":0.3,"test_acc":0.4,"seconds":1,"images_per_s":9,"allreduce_share":0.1}"#,
            r#"{"step":3,"epoch":2,"loss":1.9,"lr":0.04,"loss_scale":1}"#,
            r#"{"step":4,"epo"#,
        ]
        .join("\n");
        std::fs::write(&path, &text).unwrap();
        let h = history(&path, 2, 2).unwrap();
        assert_eq!(h.lines.len(), 3);
        assert!(h.dropped_torn_line);
        assert_eq!(h.dropped_after_checkpoint, 1);
        assert_eq!(h.curves.step_loss.len(), 2);
        assert!(h.curves.step_loss[1].1.is_nan(), "null reads back as NaN");
        assert_eq!(h.curves.epochs.len(), 1);
        assert_eq!(h.curves.epochs[0].at, 1.0);
        // A bad line that is not the last is an error naming it.
        std::fs::write(&path, "garbage\n{\"step\":1}\n").unwrap();
        let e = history(&path, 2, 2).unwrap_err();
        assert!(e.contains("line 1"), "{e}");
        // A missing file is an empty history.
        std::fs::remove_file(&path).unwrap();
        assert!(history(&path, 2, 2).unwrap().lines.is_empty());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
