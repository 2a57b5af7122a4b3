//! Ctrl-C and SIGTERM during `train`: the run stops at its next step instead of dying
//! wherever it is, so that no save is cut in half, and says what `--save` holds and the
//! command that continues the run. A second signal ends the process at once.

use std::ffi::OsString;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

/// The signals a run stops for, once registered ([`Interrupts::watch`]).
pub struct Interrupts {
    /// The first signal received (0: none yet).
    received: Arc<AtomicUsize>,
}

/// The run stopped because the process received `signal`: the event handler's error, which
/// the command line tells apart from its other failures.
#[derive(Debug, thiserror::Error)]
#[error("interrupted by {}", signal_name(*.signal))]
pub struct Interrupted {
    /// The signal's number (its exit code is 128 + it).
    pub signal: i32,
}

/// How a signal is known to a user.
pub fn signal_name(signal: i32) -> &'static str {
    match signal {
        #[cfg(unix)]
        libc::SIGINT => "SIGINT (Ctrl-C)",
        #[cfg(unix)]
        libc::SIGTERM => "SIGTERM",
        _ => "a signal",
    }
}

impl Interrupts {
    /// From now on SIGINT and SIGTERM are recorded instead of ending the process; a second
    /// one ends it at once, with the exit code of the signal (130 or 143). Where handlers
    /// cannot be installed, signals keep their default action and [`Interrupts::check`]
    /// never fires.
    pub fn watch() -> Self {
        let received = Arc::new(AtomicUsize::new(0));
        #[cfg(unix)]
        {
            use signal_hook::consts::{SIGINT, SIGTERM};
            use signal_hook::flag;
            use std::sync::atomic::AtomicBool;
            let once = Arc::new(AtomicBool::new(false));
            for signal in [SIGINT, SIGTERM] {
                // The order matters: the shutdown checks the flag before the second
                // registration sets it, so the first signal only sets it.
                let _ = flag::register_conditional_shutdown(signal, 128 + signal, once.clone())
                    .and_then(|_| flag::register(signal, once.clone()))
                    .and_then(|_| flag::register_usize(signal, received.clone(), signal as usize));
            }
        }
        Interrupts { received }
    }

    /// The first signal received, if any.
    pub fn check(&self) -> Result<(), Interrupted> {
        match self.received.load(Ordering::Relaxed) {
            0 => Ok(()),
            signal => Err(Interrupted {
                signal: signal as i32,
            }),
        }
    }
}

/// The command line that continues this run from `checkpoint`: the same arguments with
/// `--resume CHECKPOINT` in place of any --init, --resume, --save and --overwrite (a resumed
/// run saves to the checkpoint it resumed), quoted for a POSIX shell.
pub fn continue_command(
    args: impl IntoIterator<Item = OsString>,
    checkpoint: &std::ffi::OsStr,
) -> String {
    const DROPPED_WITH_VALUE: [&str; 3] = ["--init", "--resume", "--save"];
    let mut kept: Vec<OsString> = Vec::new();
    let mut args = args.into_iter();
    while let Some(arg) = args.next() {
        let text = arg.to_string_lossy();
        if DROPPED_WITH_VALUE.contains(&text.as_ref()) {
            args.next();
        } else if text == "--overwrite"
            || DROPPED_WITH_VALUE
                .iter()
                .any(|flag| text.starts_with(&format!("{flag}=")))
        {
        } else {
            kept.push(arg);
        }
    }
    kept.push("--resume".into());
    kept.push(checkpoint.to_os_string());
    kept.iter()
        .map(|a| shell_quoted(&a.to_string_lossy()))
        .collect::<Vec<_>>()
        .join(" ")
}

/// `word` as a POSIX shell reads it back: as is when it holds only characters no shell
/// treats specially, else in single quotes.
fn shell_quoted(word: &str) -> String {
    let plain = |c: char| c.is_ascii_alphanumeric() || "-_./=:,+@%".contains(c);
    if !word.is_empty() && word.chars().all(plain) {
        word.to_string()
    } else {
        format!("'{}'", word.replace('\'', r"'\''"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn continued(args: &[&str], checkpoint: &str) -> String {
        continue_command(args.iter().map(OsString::from), checkpoint.as_ref())
    }

    #[test]
    fn the_continue_command_resumes_the_checkpoint_with_the_same_settings() {
        assert_eq!(
            continued(
                &[
                    "nanoddp",
                    "train",
                    "--init",
                    "a.st",
                    "--save=b.st",
                    "--lr",
                    "0.1",
                    "--overwrite"
                ],
                "b.st"
            ),
            "nanoddp train --lr 0.1 --resume b.st"
        );
        assert_eq!(
            continued(
                &["nanoddp", "train", "--resume", "my run.st", "--epochs", "3"],
                "my run.st"
            ),
            "nanoddp train --epochs 3 --resume 'my run.st'"
        );
        assert_eq!(shell_quoted("it's"), r"'it'\''s'");
        assert_eq!(shell_quoted(""), "''");
    }
}
