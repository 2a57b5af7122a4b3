//! `train --plot`: the loss and accuracy curves of a run, redrawn after every epoch (so an
//! interrupted run still leaves its picture). PNG, or SVG when the name ends in `.svg`.
//! Text is drawn in DejaVu Sans, built into the binary (the `dejavu` crate), or in the
//! TrueType font `$NANODDP_FONT` names.

use std::path::{Path, PathBuf};

use plotters::coord::types::RangedCoordf64;
use plotters::coord::Shift;
use plotters::prelude::*;

/// Width and height of the picture in pixels.
pub const SIZE: (u32, u32) = (1200, 450);

/// The curves collected so far.
#[derive(Debug, Default)]
pub struct Curves {
    /// (epoch as a fraction: step / steps per epoch, mean loss of the step's global batch).
    pub step_loss: Vec<(f64, f64)>,
    /// One point per epoch.
    pub epochs: Vec<EpochPoint>,
}

/// An epoch's figures, where the plot puts them.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct EpochPoint {
    /// Where the epoch ended, in epochs (step / steps per epoch): a partial epoch sits
    /// between two whole ones.
    pub at: f64,
    /// Whether it covered the whole training set (partial ones are drawn hollow).
    pub complete: bool,
    /// Mean training loss.
    pub train_loss: f64,
    /// Training accuracy.
    pub train_acc: f64,
    /// Test accuracy.
    pub test_acc: f64,
}

/// The finite stretches of a curve: a value that is not finite breaks the line instead of
/// being drawn as some number.
fn finite_runs(points: impl Iterator<Item = (f64, f64)>) -> Vec<Vec<(f64, f64)>> {
    let mut runs = vec![Vec::new()];
    for (x, y) in points {
        if y.is_finite() {
            runs.last_mut().expect("never empty").push((x, y));
        } else if !runs.last().expect("never empty").is_empty() {
            runs.push(Vec::new());
        }
    }
    runs.retain(|r| !r.is_empty());
    runs
}

/// Registers the font once, before training starts. `NANODDP_FONT`, when set (and not
/// empty), is the only font considered: a value that names no readable TrueType file is an
/// error naming the variable, never an unannounced fall-back to the built-in DejaVu Sans.
pub fn load_font() -> Result<(), String> {
    if let Some(named) = std::env::var_os("NANODDP_FONT").filter(|v| !v.is_empty()) {
        let path = PathBuf::from(named);
        return register_font(&path).map_err(|why| {
            format!(
                "NANODDP_FONT={}: {why}; it must name a TrueType font file (such as \
                 DejaVuSans.ttf), or be unset to use the built-in DejaVu Sans",
                path.display()
            )
        });
    }
    register(dejavu::sans::regular()).map_err(|why| format!("the built-in DejaVu Sans: {why}"))
}

/// Reads the font file at `path` and registers it as the plots' sans-serif face; the error
/// is a clause saying what the path is instead ("no such file or directory", "is a folder",
/// "not a TrueType font plotters can read").
fn register_font(path: &Path) -> Result<(), String> {
    if path.is_dir() {
        return Err("is a folder, not a font file".into());
    }
    let bytes = std::fs::read(path).map_err(|e| {
        // "No such file or directory (os error 2)" as a clause: lower case, no error number.
        let text = e.to_string();
        let text = text.split(" (os error").next().unwrap_or(&text);
        let mut chars = text.chars();
        chars
            .next()
            .map(|c| c.to_lowercase().chain(chars).collect::<String>())
            .unwrap_or_default()
    })?;
    // plotters keeps fonts for the life of the process; this runs once per run.
    register(Box::leak(bytes.into_boxed_slice()))
}

/// Registers `bytes` as the plots' sans-serif face.
fn register(bytes: &'static [u8]) -> Result<(), String> {
    plotters::style::register_font("sans-serif", FontStyle::Normal, bytes)
        .map_err(|_| "not a TrueType font plotters can read".to_string())
}

/// Draws `curves` into `path` (PNG, or SVG for `*.svg`; the run checks the name before it
/// starts), replacing it atomically: the picture is drawn in memory, then written to a
/// temporary file renamed over `path`, so a crash or a full disk leaves the previous
/// picture. Errors are one line: what failed, and the system's reason.
pub fn draw(path: &Path, curves: &Curves) -> Result<(), String> {
    let svg = path
        .extension()
        .is_some_and(|e| e.eq_ignore_ascii_case("svg"));
    let bytes = if svg {
        let mut text = String::new();
        {
            let root = SVGBackend::with_string(&mut text, SIZE).into_drawing_area();
            panels(&root, curves).and_then(|()| root.present().map_err(|e| e.to_string()))?;
        }
        text.into_bytes()
    } else {
        let (w, h) = SIZE;
        let mut rgb = vec![0u8; 3 * w as usize * h as usize];
        {
            let root = BitMapBackend::with_buffer(&mut rgb, SIZE).into_drawing_area();
            panels(&root, curves).and_then(|()| root.present().map_err(|e| e.to_string()))?;
        }
        encode_png(&rgb, SIZE).map_err(|e| format!("encoding the plot as PNG: {e}"))?
    };
    nanoddp::train::checkpoint::replace_file(path, |_, f| {
        use std::io::Write;
        f.write_all(&bytes)
    })
    .map_err(|e| format!("writing the plot to {e}"))
}

/// An 8-bit RGB picture of `size` as PNG bytes.
fn encode_png(rgb: &[u8], (w, h): (u32, u32)) -> Result<Vec<u8>, png::EncodingError> {
    let mut out = Vec::new();
    let mut encoder = png::Encoder::new(&mut out, w, h);
    encoder.set_color(png::ColorType::Rgb);
    encoder.set_depth(png::BitDepth::Eight);
    encoder.write_header()?.write_image_data(rgb)?;
    Ok(out)
}

/// Color of the per-step loss (light) and of the epoch train figures.
const STEP_LOSS: RGBColor = RGBColor(150, 180, 230);
/// Train loss and train accuracy per epoch.
pub const TRAIN: RGBColor = RGBColor(31, 119, 180);
/// Test accuracy per epoch.
pub const TEST: RGBColor = RGBColor(214, 39, 40);
/// Marks of a loss that is not finite.
const NOT_FINITE: RGBColor = RGBColor(0, 0, 0);

/// A chart of the panels: epochs across, values up.
type Chart<'a, DB> = ChartContext<'a, DB, Cartesian2d<RangedCoordf64, RangedCoordf64>>;

/// Draws `points` as a line in `style`, broken where a value is not finite ([`finite_runs`]),
/// and names it `label` in the legend (once).
fn curve<DB: DrawingBackend>(
    chart: &mut Chart<'_, DB>,
    points: impl Iterator<Item = (f64, f64)>,
    style: ShapeStyle,
    label: &str,
) -> Result<(), String>
where
    DB::ErrorType: 'static,
{
    for (i, run) in finite_runs(points).into_iter().enumerate() {
        let series = chart
            .draw_series(LineSeries::new(run, style))
            .map_err(|e| e.to_string())?;
        if i == 0 {
            series
                .label(label)
                .legend(move |(x, y)| PathElement::new([(x, y), (x + 20, y)], style));
        }
    }
    Ok(())
}

fn panels<DB: DrawingBackend>(root: &DrawingArea<DB, Shift>, c: &Curves) -> Result<(), String>
where
    DB::ErrorType: 'static,
{
    let err = |e: DrawingAreaErrorKind<DB::ErrorType>| e.to_string();
    root.fill(&WHITE).map_err(err)?;
    let (left, right) = root.split_horizontally(SIZE.0 / 2);
    let last = c
        .step_loss
        .last()
        .map(|p| p.0)
        .into_iter()
        .chain(c.epochs.last().map(|e| e.at))
        .fold(1.0f64, f64::max);
    let first = c
        .step_loss
        .first()
        .map(|p| p.0.floor())
        .unwrap_or(0.0)
        .min(last - 1.0);
    let max_loss = c
        .step_loss
        .iter()
        .map(|p| p.1)
        .chain(c.epochs.iter().map(|e| e.train_loss))
        .filter(|v| v.is_finite())
        .fold(0.1f64, f64::max);

    let mut loss = ChartBuilder::on(&left)
        .caption("loss", ("sans-serif", 22))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(55)
        .build_cartesian_2d(first..last, 0.0..max_loss * 1.05)
        .map_err(err)?;
    loss.configure_mesh()
        .x_desc("epoch")
        .y_desc("cross-entropy")
        .draw()
        .map_err(err)?;
    curve(
        &mut loss,
        c.step_loss.iter().copied(),
        STEP_LOSS.into(),
        "per step (global batch)",
    )?;
    curve(
        &mut loss,
        c.epochs.iter().map(|e| (e.at, e.train_loss)),
        TRAIN.stroke_width(2),
        "train, epoch mean",
    )?;
    // A loss that is not finite is marked where it happened, on the top edge, not drawn as
    // a number.
    let bad: Vec<f64> = c
        .step_loss
        .iter()
        .filter(|p| !p.1.is_finite())
        .map(|p| p.0)
        .chain(
            c.epochs
                .iter()
                .filter(|e| !e.train_loss.is_finite())
                .map(|e| e.at),
        )
        .collect();
    if !bad.is_empty() {
        let top = max_loss * 1.05;
        loss.draw_series(
            bad.iter()
                .map(|&x| Cross::new((x, top), 6, NOT_FINITE.stroke_width(2))),
        )
        .map_err(err)?
        .label("loss not finite")
        .legend(|(x, y)| Cross::new((x + 10, y), 5, NOT_FINITE.stroke_width(2)));
    }
    loss.configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()
        .map_err(err)?;

    let low = c
        .epochs
        .iter()
        .flat_map(|e| [e.train_acc, e.test_acc])
        .filter(|v| v.is_finite())
        .fold(1.0f64, f64::min);
    let low = ((low * 10.0).floor() / 10.0).clamp(0.0, 0.9);
    let mut acc = ChartBuilder::on(&right)
        .caption("accuracy", ("sans-serif", 22))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(55)
        .build_cartesian_2d(first..last, low..1.0)
        .map_err(err)?;
    acc.configure_mesh()
        .x_desc("epoch")
        .y_desc("fraction correct")
        .draw()
        .map_err(err)?;
    for (color, pick, name) in [
        (TRAIN, 2usize, "train (during the epoch)"),
        (TEST, 3, "test (after the epoch)"),
    ] {
        let value = move |e: &EpochPoint| if pick == 2 { e.train_acc } else { e.test_acc };
        curve(
            &mut acc,
            c.epochs.iter().map(|e| (e.at, value(e))),
            color.stroke_width(2),
            name,
        )?;
        // Whole epochs are filled dots; an epoch --max-steps cut short is a hollow one.
        acc.draw_series(c.epochs.iter().filter(|e| value(e).is_finite()).map(|e| {
            let style = if e.complete {
                color.filled()
            } else {
                color.stroke_width(2)
            };
            Circle::new((e.at, value(e)), 4, style)
        }))
        .map_err(err)?;
    }
    acc.configure_series_labels()
        .position(SeriesLabelPosition::LowerRight)
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()
        .map_err(err)?;
    Ok(())
}
