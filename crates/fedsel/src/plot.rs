//! Figures for reports (plotters): every figure is written as SVG and PNG.
//!
//! Text needs a TrueType font; fedsel looks for one in `FEDSEL_FONT` and then
//! in the usual system places (DejaVu, Liberation, Arial). Without one the
//! report is still written and says why its figures are missing.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use plotters::coord::Shift;
use plotters::prelude::*;

use crate::error::{Error, Result};

/// Colours that stay apart for up to ten series (Tableau 10).
const COLOURS: [RGBColor; 10] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(127, 127, 127),
    RGBColor(188, 189, 34),
    RGBColor(23, 190, 207),
];

const FONT_PATHS: [&str; 7] = [
    "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/TTF/DejaVuSans.ttf",
    "/usr/share/fonts/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/truetype/liberation/LiberationSans-Regular.ttf",
    "/Library/Fonts/Arial.ttf",
    "/System/Library/Fonts/Supplemental/Arial.ttf",
    "C:\\Windows\\Fonts\\arial.ttf",
];

/// Registers a font once; `Err` says why none could be used.
pub fn ensure_font() -> std::result::Result<(), String> {
    static FONT: OnceLock<std::result::Result<(), String>> = OnceLock::new();
    FONT.get_or_init(|| {
        let candidates: Vec<PathBuf> = std::env::var_os("FEDSEL_FONT")
            .map(PathBuf::from)
            .into_iter()
            .chain(FONT_PATHS.iter().map(PathBuf::from))
            .collect();
        for p in &candidates {
            if let Ok(bytes) = std::fs::read(p) {
                let bytes: &'static [u8] = Box::leak(bytes.into_boxed_slice());
                if plotters::style::register_font("sans-serif", FontStyle::Normal, bytes).is_ok() {
                    return Ok(());
                }
            }
        }
        Err("no TrueType font found; set FEDSEL_FONT to a .ttf file to get figures".into())
    })
    .clone()
}

/// A mean curve with a ± std band.
#[derive(Debug, Clone)]
pub struct Curve {
    /// Legend entry.
    pub label: String,
    /// (x, mean, std) points.
    pub points: Vec<(f64, f64, f64)>,
}

/// One line per series over integer x (e.g. per-client selection frequency).
#[derive(Debug, Clone)]
pub struct Series {
    /// Legend entry.
    pub label: String,
    /// y for x = 0, 1, 2, ...
    pub values: Vec<f64>,
}

fn plot_err(path: &Path) -> impl Fn(String) -> Error + '_ {
    move |reason| Error::Plot {
        path: path.to_path_buf(),
        reason,
    }
}

/// A figure that can be drawn on any plotters backend.
trait Figure {
    fn draw<DB: DrawingBackend>(
        &self,
        root: &DrawingArea<DB, Shift>,
    ) -> std::result::Result<(), String>;
}

/// Draws a figure as `stem.svg` and `stem.png`.
/// `stem` + `.ext`; unlike `Path::with_extension` it keeps a dot inside the stem
/// (a setting named `ldf_0.7`).
fn with_suffix(stem: &Path, ext: &str) -> std::path::PathBuf {
    let mut s = stem.as_os_str().to_owned();
    s.push(".");
    s.push(ext);
    s.into()
}

fn both(stem: &Path, fig: &impl Figure) -> Result<()> {
    let size = (960, 600);
    let svg = with_suffix(stem, "svg");
    let png = with_suffix(stem, "png");
    ensure_font().map_err(plot_err(&png))?;
    {
        let root = SVGBackend::new(&svg, size).into_drawing_area();
        fig.draw(&root).map_err(plot_err(&svg))?;
        root.present().map_err(|e| plot_err(&svg)(e.to_string()))?;
    }
    let root = BitMapBackend::new(&png, size).into_drawing_area();
    fig.draw(&root).map_err(plot_err(&png))?;
    root.present().map_err(|e| plot_err(&png)(e.to_string()))
}

fn range(values: impl Iterator<Item = f64>) -> (f64, f64) {
    let (lo, hi) = values
        .filter(|v| v.is_finite())
        .fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), v| {
            (a.min(v), b.max(v))
        });
    if !lo.is_finite() {
        return (0.0, 1.0);
    }
    let pad = ((hi - lo) * 0.05).max(1e-6);
    // Every plotted quantity (accuracy, loss, frequency) is non-negative.
    ((lo - pad).max(0.0), hi + pad)
}

fn e<T: std::fmt::Display>(x: T) -> String {
    x.to_string()
}

/// Chart frame shared by every figure: white background, caption, labelled axes.
fn frame<'a, DB: DrawingBackend>(
    root: &'a DrawingArea<DB, Shift>,
    title: &str,
    x: (f64, f64, &str),
    y: (f64, f64, &str),
    mesh: bool,
) -> std::result::Result<Chart<'a, DB>, String> {
    root.fill(&WHITE).map_err(e)?;
    let mut chart = ChartBuilder::on(root)
        .caption(title, ("sans-serif", 22))
        .margin(14)
        .margin_right(34)
        .x_label_area_size(45)
        .y_label_area_size(70)
        .build_cartesian_2d(x.0..x.1, y.0..y.1)
        .map_err(e)?;
    let int = |v: &f64| format!("{v:.0}");
    let mut m = chart.configure_mesh();
    m.x_label_formatter(&int);
    if !mesh {
        m.y_label_formatter(&int);
    }
    m.x_desc(x.2)
        .y_desc(y.2)
        .label_style(("sans-serif", 15))
        .axis_desc_style(("sans-serif", 17))
        .light_line_style(WHITE.mix(0.0));
    if !mesh {
        m.disable_mesh();
    }
    m.draw().map_err(e)?;
    Ok(chart)
}

type Chart<'a, DB> = ChartContext<
    'a,
    DB,
    Cartesian2d<plotters::coord::types::RangedCoordf64, plotters::coord::types::RangedCoordf64>,
>;

/// The legend box every figure uses.
fn legend<'a, DB: DrawingBackend + 'a>(
    chart: &mut Chart<'a, DB>,
    at: SeriesLabelPosition,
) -> std::result::Result<(), String> {
    chart
        .configure_series_labels()
        .label_font(("sans-serif", 16))
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .position(at)
        .draw()
        .map_err(e)
}

struct Curves<'a> {
    title: &'a str,
    y_desc: &'a str,
    curves: &'a [Curve],
}

impl Figure for Curves<'_> {
    fn draw<DB: DrawingBackend>(
        &self,
        root: &DrawingArea<DB, Shift>,
    ) -> std::result::Result<(), String> {
        let x_max = self
            .curves
            .iter()
            .flat_map(|c| c.points.iter().map(|p| p.0))
            .fold(1.0, f64::max);
        let (y_lo, y_hi) = range(
            self.curves
                .iter()
                .flat_map(|c| c.points.iter().flat_map(|p| [p.1 - p.2, p.1 + p.2])),
        );
        let mut chart = frame(
            root,
            self.title,
            (0.0, x_max, "round"),
            (y_lo, y_hi, self.y_desc),
            true,
        )?;
        // The legend goes in the right-hand corner the curves' ends stay away from.
        let ends: Vec<f64> = self
            .curves
            .iter()
            .filter_map(|c| c.points.last().map(|p| p.1))
            .collect();
        let end = ends.iter().sum::<f64>() / ends.len().max(1) as f64;
        let legend_at = if end > (y_lo + y_hi) / 2.0 {
            SeriesLabelPosition::LowerRight
        } else {
            SeriesLabelPosition::UpperRight
        };
        for (i, c) in self.curves.iter().enumerate() {
            let colour = COLOURS[i % COLOURS.len()];
            let mut band: Vec<(f64, f64)> = c.points.iter().map(|p| (p.0, p.1 + p.2)).collect();
            band.extend(c.points.iter().rev().map(|p| (p.0, (p.1 - p.2).max(0.0))));
            chart
                .draw_series(std::iter::once(Polygon::new(
                    band,
                    colour.mix(0.18).filled(),
                )))
                .map_err(e)?;
            chart
                .draw_series(LineSeries::new(
                    c.points.iter().map(|p| (p.0, p.1)),
                    colour.stroke_width(2),
                ))
                .map_err(e)?
                .label(c.label.clone())
                .legend(move |(x, y)| {
                    PathElement::new(vec![(x, y), (x + 22, y)], colour.stroke_width(3))
                });
        }
        legend(&mut chart, legend_at)
    }
}

/// Mean ± std curves over rounds (accuracy or loss vs round).
pub fn curves(stem: &Path, title: &str, y_desc: &str, curves: &[Curve]) -> Result<()> {
    both(
        stem,
        &Curves {
            title,
            y_desc,
            curves,
        },
    )
}

struct PerClient<'a> {
    title: &'a str,
    y_desc: &'a str,
    series: &'a [Series],
}

impl Figure for PerClient<'_> {
    fn draw<DB: DrawingBackend>(
        &self,
        root: &DrawingArea<DB, Shift>,
    ) -> std::result::Result<(), String> {
        let n = self
            .series
            .iter()
            .map(|s| s.values.len())
            .max()
            .unwrap_or(1)
            .max(1);
        let (_, y_hi) = range(self.series.iter().flat_map(|s| s.values.iter().copied()));
        let mut chart = frame(
            root,
            self.title,
            (-0.5, n as f64 - 0.5, "client"),
            (0.0, y_hi.max(1e-3), self.y_desc),
            true,
        )?;
        for (i, s) in self.series.iter().enumerate() {
            let colour = COLOURS[i % COLOURS.len()];
            let pts: Vec<(f64, f64)> = s
                .values
                .iter()
                .enumerate()
                .map(|(k, &v)| (k as f64, v))
                .collect();
            chart
                .draw_series(LineSeries::new(
                    pts.clone(),
                    colour.mix(0.6).stroke_width(1),
                ))
                .map_err(e)?;
            chart
                .draw_series(pts.into_iter().map(|p| Circle::new(p, 3, colour.filled())))
                .map_err(e)?
                .label(s.label.clone())
                .legend(move |(x, y)| Circle::new((x + 10, y), 4, colour.filled()));
        }
        legend(&mut chart, SeriesLabelPosition::UpperRight)
    }
}

/// One line with markers per series over client ids (FedCor Fig. 6 style).
pub fn per_client(stem: &Path, title: &str, y_desc: &str, series: &[Series]) -> Result<()> {
    both(
        stem,
        &PerClient {
            title,
            y_desc,
            series,
        },
    )
}

struct Raster<'a> {
    title: &'a str,
    clients: usize,
    rounds: &'a [Vec<usize>],
}

impl Figure for Raster<'_> {
    fn draw<DB: DrawingBackend>(
        &self,
        root: &DrawingArea<DB, Shift>,
    ) -> std::result::Result<(), String> {
        let r = self.rounds.len().max(1) as f64;
        let mut chart = frame(
            root,
            self.title,
            (0.0, r, "round"),
            (0.0, self.clients.max(1) as f64, "client"),
            false,
        )?;
        chart
            .draw_series(self.rounds.iter().enumerate().flat_map(|(t, active)| {
                active.iter().map(move |&k| {
                    Rectangle::new(
                        [(t as f64, k as f64), (t as f64 + 1.0, k as f64 + 1.0)],
                        COLOURS[0].filled(),
                    )
                })
            }))
            .map_err(e)?;
        Ok(())
    }
}

/// Clients × rounds raster of availability (FedGS Fig. 8): a filled cell is an available client.
pub fn raster(stem: &Path, title: &str, clients: usize, rounds: &[Vec<usize>]) -> Result<()> {
    both(
        stem,
        &Raster {
            title,
            clients,
            rounds,
        },
    )
}

struct Scatter<'a> {
    title: &'a str,
    points: &'a [(f64, f64)],
    labels: &'a [usize],
}

impl Figure for Scatter<'_> {
    fn draw<DB: DrawingBackend>(
        &self,
        root: &DrawingArea<DB, Shift>,
    ) -> std::result::Result<(), String> {
        let span = |v: Vec<f64>| {
            let lo = v.iter().cloned().fold(f64::INFINITY, f64::min);
            let hi = v.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let pad = ((hi - lo) * 0.08).max(1e-6);
            (lo - pad, hi + pad)
        };
        let (x0, x1) = span(self.points.iter().map(|p| p.0).collect());
        let (y0, y1) = span(self.points.iter().map(|p| p.1).collect());
        root.fill(&WHITE).map_err(e)?;
        let mut chart = ChartBuilder::on(root)
            .caption(self.title, ("sans-serif", 22))
            .margin(14)
            .margin_right(34)
            .x_label_area_size(45)
            .y_label_area_size(70)
            .build_cartesian_2d(x0..x1, y0..y1)
            .map_err(e)?;
        chart
            .configure_mesh()
            .x_desc("component 1")
            .y_desc("component 2")
            .label_style(("sans-serif", 15))
            .axis_desc_style(("sans-serif", 17))
            .light_line_style(WHITE.mix(0.0))
            .draw()
            .map_err(e)?;
        let mut labels: Vec<usize> = self.labels.to_vec();
        labels.sort_unstable();
        labels.dedup();
        for l in labels {
            let colour = COLOURS[l % COLOURS.len()];
            chart
                .draw_series(
                    self.points
                        .iter()
                        .zip(self.labels)
                        .filter(|(_, k)| **k == l)
                        .map(|(p, _)| Circle::new(*p, 5, colour.filled())),
                )
                .map_err(e)?
                .label(format!("label {l}"))
                .legend(move |(x, y)| Circle::new((x + 10, y), 5, colour.filled()));
        }
        legend(&mut chart, SeriesLabelPosition::UpperRight)
    }
}

/// A 2-D scatter coloured by an integer label (FedCor Fig. 7).
pub fn scatter(stem: &Path, title: &str, points: &[(f64, f64)], labels: &[usize]) -> Result<()> {
    both(
        stem,
        &Scatter {
            title,
            points,
            labels,
        },
    )
}

/// Savitzky–Golay smoothing with a quadratic fit over a window of `2m + 1`
/// points (as HiCS-FL smooths its curves). The convolution weights are the
/// closed form c_i = 3(3m² + 3m − 1 − 5i²) / ((2m + 1)(4m² + 4m − 3));
/// near the ends the window shrinks symmetrically.
pub fn savitzky_golay(y: &[f64], window: usize) -> Vec<f64> {
    let m_max = window / 2;
    (0..y.len())
        .map(|j| {
            let m = m_max.min(j).min(y.len() - 1 - j);
            if m == 0 {
                return y[j];
            }
            let mf = m as f64;
            let norm = (2.0 * mf + 1.0) * (4.0 * mf * mf + 4.0 * mf - 3.0);
            (0..=2 * m)
                .map(|k| {
                    let i = k as f64 - mf;
                    3.0 * (3.0 * mf * mf + 3.0 * mf - 1.0 - 5.0 * i * i) / norm * y[j + k - m]
                })
                .sum()
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn figure_paths_keep_dots_in_the_stem() {
        let p = with_suffix(Path::new("plots/availability_ldf_0.7-accuracy"), "png");
        assert_eq!(p, Path::new("plots/availability_ldf_0.7-accuracy.png"));
    }

    #[test]
    fn savitzky_golay_keeps_quadratics_and_smooths_noise() {
        // A quadratic fit reproduces any quadratic exactly.
        let q: Vec<f64> = (0..30)
            .map(|x| 0.5 * (x * x) as f64 - 3.0 * x as f64 + 2.0)
            .collect();
        let s = savitzky_golay(&q, 7);
        assert!(q.iter().zip(&s).all(|(a, b)| (a - b).abs() < 1e-9));
        // Window 5 weights are (−3, 12, 17, 12, −3)/35.
        let spike = [0.0, 0.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0, 0.0];
        let s = savitzky_golay(&spike, 5);
        assert!(
            (s[4] - 17.0 / 35.0).abs() < 1e-12
                && (s[3] - 12.0 / 35.0).abs() < 1e-12
                && (s[2] + 3.0 / 35.0).abs() < 1e-12
        );
    }
}
