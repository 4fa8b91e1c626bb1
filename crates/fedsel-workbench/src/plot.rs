//! Figures for reports (plotters): every figure is written as SVG and PNG.
//!
//! Text needs a TrueType font; fedsel looks for one in `FEDSEL_FONT` and then
//! in the usual system places (DejaVu, Liberation, Arial). Without one the
//! report is still written and says why its figures are missing.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use plotters::coord::Shift;
use plotters::prelude::*;

use fedsel::error::{Error, Result};

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

/// One line per series over ranks 1, 2, ... (e.g. selection frequency by client rank).
#[derive(Debug, Clone)]
pub struct Series {
    /// Legend entry.
    pub label: String,
    /// y for rank 1, 2, 3, ..., sorted descending.
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
    limits: (f64, f64),
}

/// The part of a run the y-axis is fitted to: the rounds after the first tenth. The first
/// rounds (accuracy near chance, loss near ln C) would otherwise squeeze the rest of the
/// run into a sliver of the height; they are clipped at the frame instead.
const SETTLED_FROM: f64 = 0.1;

/// The y-range of mean ± std over the settled part of the curves, within `limits` (what
/// the quantity can be: accuracy in [0, 1], loss ≥ 0).
fn settled_range(curves: &[Curve], limits: (f64, f64)) -> (f64, f64) {
    let x_max = curves
        .iter()
        .flat_map(|c| c.points.iter().map(|p| p.0))
        .fold(0.0, f64::max);
    let (lo, hi) = range(curves.iter().flat_map(|c| {
        c.points
            .iter()
            .filter(|p| p.0 >= SETTLED_FROM * x_max)
            .flat_map(|p| [p.1 - p.2, p.1 + p.2])
    }));
    (lo.max(limits.0), hi.min(limits.1))
}

/// Pieces of a polyline inside lo ≤ y ≤ hi, cut where it crosses a bound. Plotters pins
/// points outside the frame to its edge, which bends the lines; cutting keeps every drawn
/// slope true.
fn clip_polyline(points: &[(f64, f64)], lo: f64, hi: f64) -> Vec<Vec<(f64, f64)>> {
    let inside = |y: f64| (lo..=hi).contains(&y);
    let mut pieces: Vec<Vec<(f64, f64)>> = Vec::new();
    let mut current: Vec<(f64, f64)> = Vec::new();
    let mut close = |current: &mut Vec<(f64, f64)>| {
        if current.len() > 1 {
            pieces.push(std::mem::take(current));
        }
        current.clear();
    };
    for (i, &p) in points.iter().enumerate() {
        if i > 0 {
            let a = points[i - 1];
            // Where a→p crosses each bound, as the fraction of the way along it.
            let mut hits: Vec<f64> = [lo, hi]
                .into_iter()
                .filter(|&y| (a.1 - y) * (p.1 - y) < 0.0)
                .map(|y| (y - a.1) / (p.1 - a.1))
                .collect();
            hits.sort_by(f64::total_cmp);
            for t in hits {
                let h = (a.0 + t * (p.0 - a.0), a.1 + t * (p.1 - a.1));
                let h = (h.0, h.1.clamp(lo, hi));
                if current.is_empty() {
                    current.push(h);
                } else {
                    current.push(h);
                    close(&mut current);
                }
            }
        }
        if inside(p.1) {
            current.push(p);
        } else {
            close(&mut current);
        }
    }
    close(&mut current);
    pieces
}

/// A polygon cut to lo ≤ y ≤ hi (Sutherland–Hodgman against the two horizontal bounds),
/// so a std band never spills past the frame or below what the quantity can be.
fn clip_polygon(poly: &[(f64, f64)], lo: f64, hi: f64) -> Vec<(f64, f64)> {
    let mut out = poly.to_vec();
    for (bound, keep_above) in [(lo, true), (hi, false)] {
        let inside = |y: f64| if keep_above { y >= bound } else { y <= bound };
        let input = std::mem::take(&mut out);
        for (i, &p) in input.iter().enumerate() {
            let a = input[(i + input.len() - 1) % input.len()];
            if inside(p.1) != inside(a.1) {
                out.push((a.0 + (p.0 - a.0) * (bound - a.1) / (p.1 - a.1), bound));
            }
            if inside(p.1) {
                out.push(p);
            }
        }
    }
    out
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
        let (y_lo, y_hi) = settled_range(self.curves, self.limits);
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
            band.extend(c.points.iter().rev().map(|p| (p.0, p.1 - p.2)));
            let band = clip_polygon(&band, y_lo, y_hi);
            if band.len() > 2 {
                chart
                    .draw_series(std::iter::once(Polygon::new(
                        band,
                        colour.mix(0.18).filled(),
                    )))
                    .map_err(e)?;
            }
            let mean: Vec<(f64, f64)> = c.points.iter().map(|p| (p.0, p.1)).collect();
            let pieces = clip_polyline(&mean, y_lo, y_hi);
            for piece in &pieces[..pieces.len().saturating_sub(1)] {
                chart
                    .draw_series(LineSeries::new(piece.clone(), colour.stroke_width(2)))
                    .map_err(e)?;
            }
            // The legend entry comes with the last piece (every curve ends inside the
            // frame, which covers the settled part of the run).
            if let Some(last) = pieces.last() {
                chart
                    .draw_series(LineSeries::new(last.clone(), colour.stroke_width(2)))
                    .map_err(e)?
                    .label(c.label.clone())
                    .legend(move |(x, y)| {
                        PathElement::new(vec![(x, y), (x + 22, y)], colour.stroke_width(3))
                    });
            }
        }
        legend(&mut chart, legend_at)
    }
}

/// Mean ± std curves over rounds (accuracy or loss vs round). `limits` are the values the
/// quantity can take (accuracy [0, 1], loss [0, ∞)); bands are cut to them. The y-axis
/// fits the rounds after the first tenth of the run ([`SETTLED_FROM`]).
pub fn curves(
    stem: &Path,
    title: &str,
    y_desc: &str,
    curves: &[Curve],
    limits: (f64, f64),
) -> Result<()> {
    both(
        stem,
        &Curves {
            title,
            y_desc,
            curves,
            limits,
        },
    )
}

struct TimeFigure<'a> {
    title: &'a str,
    timeline: &'a crate::timeline::Timeline,
}

impl Figure for TimeFigure<'_> {
    fn draw<DB: DrawingBackend>(
        &self,
        root: &DrawingArea<DB, Shift>,
    ) -> std::result::Result<(), String> {
        let tl = self.timeline;
        // The y axis fits each seed after the first tenth of its own range (as the
        // per-round figures do), the bands and the targets.
        let settled = tl.arms.iter().flat_map(|a| {
            let seeds = a.seeds.iter().flat_map(|s| {
                let (from, to) = (s[0].0, s[s.len() - 1].0);
                s.iter()
                    .filter(move |p| p.0 >= from + SETTLED_FROM * (to - from))
                    .map(|p| p.1)
            });
            let band = a.band.iter().flatten().flat_map(|p| [p.1 - p.2, p.1 + p.2]);
            seeds.chain(band).chain(a.markers.iter().map(|m| m.target))
        });
        let (lo, hi) = range(settled);
        let (lo, hi) = (lo.max(0.0), hi.min(1.0));
        // A little room past the longest run, so that a marker at its end shows whole.
        let x_max = tl.x_max.max(1e-9) * 1.03;
        let mut chart = frame(
            root,
            self.title,
            (0.0, x_max, &format!("virtual time ({})", tl.unit.0)),
            (lo, hi, "test accuracy"),
            true,
        )?;
        let mut targets: Vec<f64> = tl
            .arms
            .iter()
            .flat_map(|a| a.markers.iter().map(|m| m.target))
            .collect();
        targets.sort_by(f64::total_cmp);
        targets.dedup();
        for t in targets {
            chart
                .draw_series(DashedLineSeries::new(
                    [(0.0, t), (x_max, t)],
                    6,
                    4,
                    COLOURS[7].mix(0.6).stroke_width(1),
                ))
                .map_err(e)?;
        }
        let ends: Vec<f64> = tl
            .arms
            .iter()
            .flat_map(|a| a.seeds.iter().filter_map(|s| s.last().map(|p| p.1)))
            .collect();
        let legend_at = match ends.iter().sum::<f64>() / ends.len().max(1) as f64 {
            end if end > (lo + hi) / 2.0 => SeriesLabelPosition::LowerRight,
            _ => SeriesLabelPosition::UpperRight,
        };
        for (i, arm) in tl.arms.iter().enumerate() {
            let colour = COLOURS[i % COLOURS.len()];
            for seed in &arm.seeds {
                for piece in clip_polyline(seed, lo, hi) {
                    chart
                        .draw_series(LineSeries::new(piece, colour.mix(0.5).stroke_width(1)))
                        .map_err(e)?;
                }
            }
            for piece in &arm.band {
                let mut band: Vec<(f64, f64)> = piece.iter().map(|p| (p.0, p.1 + p.2)).collect();
                band.extend(piece.iter().rev().map(|p| (p.0, p.1 - p.2)));
                let band = clip_polygon(&band, lo, hi);
                if band.len() > 2 {
                    chart
                        .draw_series(std::iter::once(Polygon::new(
                            band,
                            colour.mix(0.18).filled(),
                        )))
                        .map_err(e)?;
                }
                let mean: Vec<(f64, f64)> = piece.iter().map(|p| (p.0, p.1)).collect();
                for line in clip_polyline(&mean, lo, hi) {
                    chart
                        .draw_series(LineSeries::new(line, colour.stroke_width(3)))
                        .map_err(e)?;
                }
            }
            for m in &arm.markers {
                let at = (m.x, m.target);
                let fill = match m.censored {
                    true => WHITE.filled(),
                    false => colour.filled(),
                };
                chart
                    .draw_series([
                        Circle::new(at, 7, fill),
                        Circle::new(at, 7, colour.stroke_width(2)),
                    ])
                    .map_err(e)?;
            }
            chart
                .draw_series(std::iter::empty::<PathElement<(f64, f64)>>())
                .map_err(e)?
                .label(arm.label.clone())
                .legend(move |(x, y)| {
                    PathElement::new(vec![(x, y), (x + 22, y)], colour.stroke_width(3))
                });
        }
        legend(&mut chart, legend_at)
    }
}

/// Accuracy over virtual time ([`crate::timeline`]): every seed as a thin line over its
/// own range, each arm's mean ± std band where at least half of its seeds run, a circle at
/// each arm's median time to each target (hollow where that median is only a lower bound)
/// on a dashed line at the target.
pub fn timeline(stem: &Path, title: &str, timeline: &crate::timeline::Timeline) -> Result<()> {
    both(stem, &TimeFigure { title, timeline })
}

struct RankProfile<'a> {
    title: &'a str,
    y_desc: &'a str,
    series: &'a [Series],
    reference: Option<(f64, &'a str)>,
}

impl Figure for RankProfile<'_> {
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
        let (_, y_hi) = range(
            self.series
                .iter()
                .flat_map(|s| s.values.iter().copied())
                .chain(self.reference.map(|r| r.0)),
        );
        let mut chart = frame(
            root,
            self.title,
            (
                0.5,
                n as f64 + 0.5,
                "client rank (most often selected first)",
            ),
            (0.0, y_hi.max(1e-3), self.y_desc),
            true,
        )?;
        if let Some((y, label)) = self.reference {
            let grey = COLOURS[7];
            chart
                .draw_series(DashedLineSeries::new(
                    [(0.5, y), (n as f64 + 0.5, y)],
                    6,
                    4,
                    grey.stroke_width(2),
                ))
                .map_err(e)?
                .label(label)
                .legend(move |(x, y)| {
                    PathElement::new(vec![(x, y), (x + 22, y)], grey.stroke_width(2))
                });
        }
        for (i, s) in self.series.iter().enumerate() {
            let colour = COLOURS[i % COLOURS.len()];
            let pts: Vec<(f64, f64)> = s
                .values
                .iter()
                .enumerate()
                .map(|(k, &v)| (k as f64 + 1.0, v))
                .collect();
            chart
                .draw_series(LineSeries::new(pts.clone(), colour.stroke_width(2)))
                .map_err(e)?;
            chart
                .draw_series(pts.into_iter().map(|p| Circle::new(p, 2, colour.filled())))
                .map_err(e)?
                .label(s.label.clone())
                .legend(move |(x, y)| Circle::new((x + 10, y), 4, colour.filled()));
        }
        legend(&mut chart, SeriesLabelPosition::UpperRight)
    }
}

/// Each series' values in rank order (largest first), one line per series, with an
/// optional dashed reference level. Ranks, unlike client ids, mean the same thing across
/// seeds whose partitions differ, and neighbouring points are related, so the line is
/// honest.
pub fn rank_profile(
    stem: &Path,
    title: &str,
    y_desc: &str,
    series: &[Series],
    reference: Option<(f64, &str)>,
) -> Result<()> {
    both(
        stem,
        &RankProfile {
            title,
            y_desc,
            series,
            reference,
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

    /// Hand-computed cuts: a line rising from −1 to 3 through the band [0, 2] crosses 0 at
    /// x = 0.25 and 2 at x = 0.75; a line that leaves and re-enters gives two pieces.
    #[test]
    fn polylines_are_cut_where_they_cross_the_frame() {
        let p = clip_polyline(&[(0.0, -1.0), (1.0, 3.0)], 0.0, 2.0);
        assert_eq!(p, vec![vec![(0.25, 0.0), (0.75, 2.0)]]);
        let p = clip_polyline(&[(0.0, 1.0), (1.0, 3.0), (2.0, 1.0)], 0.0, 2.0);
        assert_eq!(
            p,
            vec![vec![(0.0, 1.0), (0.5, 2.0)], vec![(1.5, 2.0), (2.0, 1.0)]]
        );
        let inside = [(0.0, 0.5), (1.0, 1.5), (2.0, 1.0)];
        assert_eq!(clip_polyline(&inside, 0.0, 2.0), vec![inside.to_vec()]);
        assert!(clip_polyline(&[(0.0, 5.0), (1.0, 6.0)], 0.0, 2.0).is_empty());
    }

    /// A band from y = −1 to 1 over x ∈ [0, 2] cut at 0 keeps the rectangle [0, 2] × [0, 1]:
    /// no vertex below 0.
    #[test]
    fn bands_are_cut_to_the_quantitys_limits() {
        let band = [(0.0, 1.0), (2.0, 1.0), (2.0, -1.0), (0.0, -1.0)];
        let c = clip_polygon(&band, 0.0, 10.0);
        assert!(c.iter().all(|p| p.1 >= 0.0), "{c:?}");
        let area: f64 = (0..c.len())
            .map(|i| {
                let (a, b) = (c[i], c[(i + 1) % c.len()]);
                a.0 * b.1 - b.0 * a.1
            })
            .sum::<f64>()
            .abs()
            / 2.0;
        assert!((area - 2.0).abs() < 1e-12, "{area}");
    }

    /// The y-range fits the rounds after the first tenth: accuracy that starts at 0.1 and
    /// settles in [0.6, 0.8] gets a frame near [0.6, 0.8], not [0, 0.8], and never above 1.
    #[test]
    fn the_y_range_fits_the_settled_run_within_the_limits() {
        let points: Vec<(f64, f64, f64)> = (1..=100)
            .map(|t| {
                let acc = if t < 5 {
                    0.1
                } else {
                    0.6 + 0.2 * t as f64 / 100.0
                };
                (t as f64, acc, 0.01)
            })
            .collect();
        let c = [Curve {
            label: "a".into(),
            points,
        }];
        let (lo, hi) = settled_range(&c, (0.0, 1.0));
        assert!(lo > 0.55 && lo < 0.63, "{lo}");
        assert!(hi > 0.8 && hi <= 1.0, "{hi}");
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
