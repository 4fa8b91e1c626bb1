//! A table's cells and columns, and a table written as Markdown, CSV or LaTeX.
//! It formats what it is given; it reads no run and computes no statistic.

use std::fmt::Write as _;

use super::*;

/// A p-value for reading.
pub(super) fn p_text(p: Option<f64>) -> String {
    match p {
        None => "p N/A".into(),
        Some(p) if p < 0.001 => "p < 0.001".into(),
        Some(p) => format!("p = {p:.3}"),
    }
}

impl V {
    pub(super) fn text(s: impl Into<String>) -> Self {
        V::Text(s.into())
    }

    pub(super) fn markdown(&self) -> String {
        match self {
            V::Text(s) => s.clone(),
            V::Num(x, d) => format!("{x:.d$}"),
            V::Times(x) => format!("{x:.2}x"),
            V::MeanStd(m, s, d) => format!("{m:.d$} ± {s:.d$}"),
            V::Stat {
                stats: s,
                digits: d,
                censorable,
                bound_digits: b,
            } => {
                let reached = format!("{}/{}", s.reached, s.n);
                if let (0, Some(r)) = (s.reached, s.censored_at) {
                    return format!("> {r:.b$} ({reached})");
                }
                let head = match s.mean_std {
                    Some((m, sd)) => format!("{m:.d$} ± {sd:.d$}"),
                    None => format!("≥ {:.d$}", s.mean_lb),
                };
                let mut parts = vec![match s.median {
                    Median::Value(m) => format!("median {m:.d$}"),
                    Median::Above(r) => format!("median > {r:.b$}"),
                }];
                if let Some((lo, hi)) = s.ci {
                    parts.push(format!("CI {lo:.d$}–{hi:.d$}"));
                }
                if *censorable {
                    parts.push(reached);
                }
                format!("{head} ({})", parts.join(", "))
            }
            V::Paired(p, d) => {
                if p.n == 0 {
                    return "no shared seeds".into();
                }
                let diff = p
                    .median_diff
                    .map_or("Δ N/A".into(), |x| format!("Δ {x:+.d$}"));
                format!(
                    "{diff}, {} ({}↑ {}↓ of {})",
                    p_text(p.p),
                    p.above,
                    p.below,
                    p.n
                )
            }
            V::Baseline => "(baseline)".into(),
            V::Na => "N/A".into(),
        }
    }

    /// The entry for a printed table: statistics over seeds without median and CI, paired
    /// comparisons without the seed counts.
    pub(super) fn short(&self) -> String {
        match self {
            V::Stat {
                stats: s,
                digits: d,
                censorable,
                bound_digits: b,
            } => {
                let reached = format!("{}/{}", s.reached, s.n);
                let head = match (s.reached, s.censored_at, s.mean_std) {
                    (0, Some(r), _) => format!("> {r:.b$}"),
                    (_, _, Some((m, sd))) => format!("{m:.d$} ± {sd:.d$}"),
                    _ => format!("≥ {:.d$}", s.mean_lb),
                };
                match censorable {
                    true => format!("{head} ({reached})"),
                    false => head,
                }
            }
            V::Paired(p, d) if p.n > 0 => {
                let diff = p
                    .median_diff
                    .map_or("Δ N/A".into(), |x| format!("Δ {x:+.d$}"));
                format!("{diff}, {}", p_text(p.p))
            }
            other => other.markdown(),
        }
    }

    /// The CSV fields of this entry, one for each of its column's [`Col::fields`].
    pub(super) fn csv(&self, col: &Col) -> Vec<String> {
        let num = |x: f64, d: usize| format!("{x:.d$}");
        let mut out = match self {
            V::Text(s) => vec![s.clone()],
            V::Num(x, d) => vec![num(*x, *d)],
            V::Times(x) => vec![num(*x, 4)],
            V::MeanStd(m, s, d) => vec![num(*m, *d), num(*s, *d)],
            V::Stat {
                stats: s,
                digits: d,
                ..
            } => {
                let opt = |x: Option<f64>| x.map_or(String::new(), |x| num(x, *d));
                vec![
                    opt(s.mean_std.map(|m| m.0)),
                    opt(s.mean_std.map(|m| m.1)),
                    opt(match s.median {
                        Median::Value(m) => Some(m),
                        Median::Above(_) => None,
                    }),
                    opt(s.ci.map(|c| c.0)),
                    opt(s.ci.map(|c| c.1)),
                    s.reached.to_string(),
                    num(s.mean_lb, *d),
                ]
            }
            V::Paired(p, d) => vec![
                p.n.to_string(),
                p.above.to_string(),
                p.below.to_string(),
                p.median_diff.map_or(String::new(), |x| num(x, *d)),
                p.p.map_or(String::new(), |p| num(p, 6)),
            ],
            V::Baseline | V::Na => vec![],
        };
        out.resize(col.fields().len(), String::new());
        out
    }
}

/// `s` as LaTeX text: the ten special characters escaped, and the few non-ASCII signs the
/// report prints written as commands, so that the table compiles without any package or
/// input encoding. Other non-ASCII passes through.
pub(super) fn latex_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\textbackslash{}"),
            '{' | '}' | '_' | '%' | '&' | '#' | '$' => {
                out.push('\\');
                out.push(c);
            }
            '~' => out.push_str("\\textasciitilde{}"),
            '^' => out.push_str("\\textasciicircum{}"),
            '<' => out.push_str("\\textless{}"),
            '>' => out.push_str("\\textgreater{}"),
            '|' => out.push_str("\\textbar{}"),
            '±' => out.push_str("$\\pm$"),
            '≥' => out.push_str("$\\geq$"),
            '≤' => out.push_str("$\\leq$"),
            'Δ' => out.push_str("$\\Delta$"),
            '↑' => out.push_str("$\\uparrow$"),
            '↓' => out.push_str("$\\downarrow$"),
            '−' => out.push_str("$-$"),
            '–' => out.push_str("--"),
            '—' => out.push_str("---"),
            'ⁿ' => out.push_str("$^n$"),
            _ => out.push(c),
        }
    }
    out
}

pub(super) fn pm(xs: &[f64], digits: usize) -> V {
    let (m, s) = mean_std(xs);
    V::MeanStd(m, s, digits)
}

impl Col {
    pub(super) fn new(title: impl Into<String>, kind: Kind) -> Self {
        let title = title.into();
        Col {
            csv: title.replace(' ', "_"),
            title,
            kind,
            new: false,
        }
    }

    pub(super) fn plain(title: &str) -> Self {
        Col::new(title, Kind::Plain)
    }

    /// A column of paired comparisons for the metric whose CSV stem is `csv`.
    pub(super) fn paired(title: impl Into<String>, csv: &str) -> Self {
        Col {
            csv: csv.into(),
            ..Col::new(title, Kind::Paired)
        }
    }

    /// Its CSV field names, each with whether it is new.
    pub(super) fn fields(&self) -> Vec<(String, bool)> {
        let f = |suffix: &str, new: bool| (format!("{}{suffix}", self.csv), new || self.new);
        match self.kind {
            Kind::Plain => vec![f("", false)],
            Kind::MeanStd => vec![f("_mean", false), f("_std", false)],
            Kind::Stat { censorable, single } => {
                let mut v = match single {
                    true => vec![f("", false), f("_std", true)],
                    false => vec![f("_mean", false), f("_std", false)],
                };
                v.extend(["_median", "_ci_lo", "_ci_hi"].map(|s| f(s, true)));
                if censorable {
                    v.extend(["_reached", "_mean_lb"].map(|s| f(s, true)));
                }
                v
            }
            Kind::Paired => [
                "_paired_n",
                "_paired_above",
                "_paired_below",
                "_paired_diff",
                "_p",
            ]
            .map(|s| f(s, true))
            .to_vec(),
        }
    }
}

impl Table {
    pub(super) fn markdown(&self) -> String {
        let titles: Vec<&str> = self.columns.iter().map(|c| c.title.as_str()).collect();
        let mut s = format!(
            "## {}\n\n| {} |\n|{}\n",
            self.title,
            titles.join(" | "),
            "---|".repeat(titles.len())
        );
        for r in &self.rows {
            let cells: Vec<String> = r.iter().map(V::markdown).collect();
            let _ = writeln!(s, "| {} |", cells.join(" | "));
        }
        s.push('\n');
        s
    }

    /// The table as a LaTeX float: `table` around a `tabular` with `\hline` rules (no
    /// package needed), every cell escaped; statistics over seeds show their head (mean ±
    /// std, or the bound) and comparisons Δ and p, the rest staying in the CSV.
    pub(super) fn latex(&self) -> String {
        let row = |cells: Vec<String>| format!("{} \\\\\n", cells.join(" & "));
        let mut s = format!(
            "\\begin{{table}}[htbp]\n\\centering\n\\caption{{{}}}\n\\label{{tab:{}}}\n\\begin{{tabular}}{{{}}}\n\\hline\n",
            latex_escape(&self.title),
            self.file.trim_end_matches(".csv").replace('_', "-"),
            "l".repeat(self.columns.len())
        );
        s.push_str(&row(self
            .columns
            .iter()
            .map(|c| latex_escape(&c.title))
            .collect()));
        s.push_str("\\hline\n");
        for r in &self.rows {
            s.push_str(&row(r.iter().map(|v| latex_escape(&v.short())).collect()));
        }
        s.push_str("\\hline\n\\end{tabular}\n\\end{table}\n\n");
        s
    }

    /// The CSV: every field is one number (or text, or empty for N/A). The fields of earlier
    /// releases come first, in their old order, and the new ones (median, CI, paired
    /// comparison) after them, so a reader going by name or by position still finds the old
    /// columns.
    pub(super) fn csv(&self) -> Vec<Vec<String>> {
        let flags: Vec<bool> = self
            .columns
            .iter()
            .flat_map(|c| c.fields().into_iter().map(|f| f.1))
            .collect();
        let order = |fields: Vec<String>| -> Vec<String> {
            let (old, new): (Vec<_>, Vec<_>) = fields.into_iter().zip(&flags).partition(|x| !x.1);
            old.into_iter().chain(new).map(|x| x.0).collect()
        };
        let header = self
            .columns
            .iter()
            .flat_map(|c| c.fields().into_iter().map(|f| f.0))
            .collect();
        std::iter::once(order(header))
            .chain(self.rows.iter().map(|r| {
                order(
                    r.iter()
                        .zip(&self.columns)
                        .flat_map(|(v, c)| v.csv(c))
                        .collect(),
                )
            }))
            .collect()
    }

    pub(super) fn write_csv(&self, dir: &Path) -> Result<()> {
        let path = dir.join(self.file);
        let err = |e: csv::Error| Error::Output {
            path: path.clone(),
            error: std::io::Error::other(e),
        };
        let mut w = csv::Writer::from_path(&path).map_err(err)?;
        for r in self.csv() {
            w.write_record(&r).map_err(err)?;
        }
        w.flush().map_err(|source| Error::Output {
            path: path.clone(),
            error: source,
        })
    }
}
