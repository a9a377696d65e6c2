//! [`Progress`]: the training run's progress bar — step / total, loss, tokens per second and
//! the estimated time left — drawn with indicatif on standard error.
//!
//! The bar is drawn only when both standard output and standard error are terminals: a run
//! whose output goes to a file or a pipe (scripts, CI, `--log` consumers) gets no bar and no
//! control characters. The summary of [`Progress::finish`] is written to standard error either
//! way.

use std::io::IsTerminal;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

/// The bar's layout: elapsed time, bar, step / total, the message (loss and throughput), ETA.
const TEMPLATE: &str =
    "[{elapsed_precise}] {bar:32.cyan/blue} {pos}/{len} steps | {msg} | ETA {eta}";

/// A progress bar over the optimizer steps of a run.
#[derive(Debug)]
pub struct Progress {
    bar: ProgressBar,
}

impl Progress {
    /// A bar over `total` steps, drawn on standard error if standard output and standard error
    /// are both terminals, else hidden.
    pub fn start(total: u64) -> Progress {
        let visible = std::io::stdout().is_terminal() && std::io::stderr().is_terminal();
        Progress::with_visibility(total, visible)
    }

    /// A bar over `total` steps, drawn on standard error if `visible`, else hidden.
    pub fn with_visibility(total: u64, visible: bool) -> Progress {
        let target = match visible {
            true => ProgressDrawTarget::stderr(),
            false => ProgressDrawTarget::hidden(),
        };
        let bar = ProgressBar::with_draw_target(Some(total), target);
        if let Ok(style) = ProgressStyle::with_template(TEMPLATE) {
            bar.set_style(style.progress_chars("=> "));
        }
        bar.set_message("starting");
        Progress { bar }
    }

    /// Whether the bar is drawn.
    pub fn is_visible(&self) -> bool {
        !self.bar.is_hidden()
    }

    /// Records that step `step` (counting from 1) is done, with its loss and throughput.
    pub fn update(&self, step: u64, loss: f64, tokens_per_second: f64) {
        self.bar.set_position(step);
        self.bar.set_message(status(loss, tokens_per_second));
    }

    /// Prints `line` above the bar (or on standard error when the bar is hidden).
    pub fn println(&self, line: &str) {
        match self.is_visible() {
            true => self.bar.println(line),
            false => eprintln!("{line}"),
        }
    }

    /// Removes the bar and writes `summary` on standard error.
    pub fn finish(&self, summary: &str) {
        self.bar.finish_and_clear();
        eprintln!("{summary}");
    }

    /// The message shown now (loss and throughput).
    pub fn message(&self) -> String {
        self.bar.message()
    }
}

/// `loss 2.3456 | 12.3k tok/s`.
fn status(loss: f64, tokens_per_second: f64) -> String {
    format!("loss {loss:.4} | {} tok/s", human(tokens_per_second))
}

/// A rate with a k / M suffix and three significant digits or so.
fn human(rate: f64) -> String {
    match rate {
        r if !r.is_finite() || r < 0.0 => "-".to_string(),
        r if r >= 1e6 => format!("{:.2}M", r / 1e6),
        r if r >= 1e3 => format!("{:.1}k", r / 1e3),
        r => format!("{r:.0}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_hidden_bar_tracks_step_loss_and_throughput() {
        let progress = Progress::with_visibility(10, false);
        assert!(!progress.is_visible());
        progress.update(3, 2.345_678, 12_345.0);
        assert_eq!(progress.bar.position(), 3);
        assert_eq!(progress.message(), "loss 2.3457 | 12.3k tok/s");
        progress.finish("done: 10 steps");
        assert!(progress.bar.is_finished());
    }

    #[test]
    fn rates_are_shortened() {
        assert_eq!(human(950.4), "950");
        assert_eq!(human(2_500_000.0), "2.50M");
        assert_eq!(human(f64::NAN), "-");
    }
}
