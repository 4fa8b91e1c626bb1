//! The papers' headline claims ("A is faster than B"), each quoted with its place in the
//! paper and tested by a paired comparison over the per-seed rows of a results section
//! ([`verdict::claim`]), rendered into the page's `claims` block.
//!
//! A results directory holds them in `claims/*.toml`, one file per paper, each a list of
//! `[[claim]]` tables ([`ClaimSpec`]; `results/README.md` documents the keys). A claim the
//! CPU cannot test names what is missing in `not_testable` instead of the keys of a test.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use fedsel::error::Result;
use serde::Deserialize;

use super::{PaperRow, Row, bad, io, num};
use crate::verdict::{self, ClaimOutcome, Direction, Effect};

/// The folder of claim files in a results directory.
pub const CLAIMS_DIR: &str = "claims";

/// The name of the page's block of claims; no section may take it.
pub const BLOCK: &str = "claims";

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    claim: Vec<Raw>,
}

/// A `[[claim]]` table as written; [`load`] checks it into a [`ClaimSpec`].
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Raw {
    id: String,
    paper: String,
    quote: String,
    place: String,
    claimed: String,
    not_testable: Option<String>,
    section: Option<String>,
    metric: Option<String>,
    settings: Option<Vec<String>>,
    a: Option<String>,
    b: Option<String>,
    effect: Option<Effect>,
    direction: Option<Direction>,
}

/// How a claim is tested.
#[derive(Debug, Clone, PartialEq)]
pub enum Test {
    /// Not on this machine: what is missing (the model, the data, the size).
    NotTestable(String),
    /// Paired over seeds.
    Paired(Paired),
}

/// A paired test: A against B on `metric`, over the seeds of `section` that both have.
#[derive(Debug, Clone, PartialEq)]
pub struct Paired {
    /// The results section whose rows are paired.
    pub section: String,
    /// The `metric` column of those rows.
    pub metric: String,
    /// One test per setting; empty: every row of the section as one test, paired by
    /// (setting, seed).
    pub settings: Vec<String>,
    /// The method claimed better.
    pub a: String,
    /// The method it is compared with.
    pub b: String,
    /// How the effect is measured.
    pub effect: Effect,
    /// The side the claim puts A on.
    pub direction: Direction,
}

/// One claim, checked.
#[derive(Debug, Clone, PartialEq)]
pub struct ClaimSpec {
    /// Unique kebab-case id.
    pub id: String,
    /// The paper making the claim.
    pub paper: String,
    /// The paper's own words.
    pub quote: String,
    /// Where in the paper.
    pub place: String,
    /// The claim as a testable statement.
    pub claimed: String,
    /// How it is tested.
    pub test: Test,
    /// The file it came from, for errors.
    pub file: PathBuf,
}

/// `text` on one line with its pipes escaped, so that it stays inside one table cell.
fn cell(text: &str) -> String {
    text.split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
        .replace('|', "\\|")
}

fn is_kebab(id: &str) -> bool {
    !id.is_empty()
        && !id.starts_with('-')
        && !id.ends_with('-')
        && !id.contains("--")
        && id
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
}

/// Reads `dir/claims/*.toml` (none when the folder is absent) and checks each claim against
/// the per-seed `rows` and the `paper` values: required keys present, ids unique and
/// kebab-case, and a paired claim's section, metric, methods and settings present in them
/// (in the paper values alone when a planned cell has not run yet: its test then has no
/// pairs). Errors name the file and the claim id.
pub fn load(dir: &Path, rows: &[Row], paper: &[PaperRow]) -> Result<Vec<ClaimSpec>> {
    let folder = dir.join(CLAIMS_DIR);
    if !folder.is_dir() {
        return Ok(Vec::new());
    }
    let mut files: Vec<PathBuf> = std::fs::read_dir(&folder)
        .map_err(io(&folder))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "toml"))
        .collect();
    files.sort();
    let mut out = Vec::new();
    let mut ids: BTreeMap<String, PathBuf> = BTreeMap::new();
    for f in files {
        let text = std::fs::read_to_string(&f).map_err(io(&f))?;
        let parsed: File = toml::from_str(&text).map_err(|e| bad(&f, e))?;
        for raw in parsed.claim {
            let spec = check_raw(raw, &f, rows, paper)?;
            if let Some(other) = ids.insert(spec.id.clone(), f.clone()) {
                return Err(bad(
                    &f,
                    format!(
                        "claim `{}` is also in {}: ids are unique",
                        spec.id,
                        other.display()
                    ),
                ));
            }
            out.push(spec);
        }
    }
    Ok(out)
}

fn check_raw(raw: Raw, file: &Path, rows: &[Row], paper: &[PaperRow]) -> Result<ClaimSpec> {
    let id = raw.id.clone();
    let err = |msg: String| bad(file, format!("claim `{id}`: {msg}"));
    if !is_kebab(&raw.id) {
        return Err(err(
            "the id must be kebab-case (a-z, 0-9, single dashes)".into()
        ));
    }
    for (key, v) in [
        ("paper", &raw.paper),
        ("quote", &raw.quote),
        ("place", &raw.place),
        ("claimed", &raw.claimed),
    ] {
        if v.trim().is_empty() {
            return Err(err(format!("`{key}` must not be empty")));
        }
    }
    let test_keys = [
        ("section", raw.section.is_some()),
        ("metric", raw.metric.is_some()),
        ("settings", raw.settings.is_some()),
        ("a", raw.a.is_some()),
        ("b", raw.b.is_some()),
        ("effect", raw.effect.is_some()),
        ("direction", raw.direction.is_some()),
    ];
    let test = match raw.not_testable {
        Some(reason) => {
            if reason.trim().is_empty() {
                return Err(err(
                    "`not_testable` must name what is missing (model, data, size)".into(),
                ));
            }
            if let Some((key, _)) = test_keys.iter().find(|(_, set)| *set) {
                return Err(err(format!(
                    "has both `not_testable` and `{key}`: a claim is either tested or not"
                )));
            }
            Test::NotTestable(reason)
        }
        None => {
            let (Some(section), Some(metric), Some(a), Some(b), Some(effect), Some(direction)) = (
                raw.section,
                raw.metric,
                raw.a,
                raw.b,
                raw.effect,
                raw.direction,
            ) else {
                let key = test_keys
                    .iter()
                    .find(|(k, set)| !set && *k != "settings")
                    .map_or("section", |(k, _)| k);
                return Err(err(format!(
                    "no `{key}`: a tested claim gives section, metric, a, b, effect and direction; one the CPU cannot test gives `not_testable`"
                )));
            };
            let p = Paired {
                section,
                metric,
                settings: raw.settings.unwrap_or_default(),
                a,
                b,
                effect,
                direction,
            };
            check_against_rows(&p, rows, paper).map_err(err)?;
            Test::Paired(p)
        }
    };
    Ok(ClaimSpec {
        id: raw.id,
        paper: raw.paper,
        quote: raw.quote,
        place: raw.place,
        claimed: raw.claimed,
        test,
        file: file.to_path_buf(),
    })
}

/// Says what a paired claim names that neither the rows nor the paper values have.
fn check_against_rows(
    p: &Paired,
    rows: &[Row],
    paper: &[PaperRow],
) -> std::result::Result<(), String> {
    if p.a == p.b {
        return Err(format!("`a` and `b` are both `{}`", p.a));
    }
    // (metric, method, setting) of every row and paper value of the section.
    let cells: Vec<(&str, &str, &str)> = rows
        .iter()
        .filter(|r| r.section == p.section)
        .map(|r| (r.metric.as_str(), r.method.as_str(), r.setting.as_str()))
        .chain(
            paper
                .iter()
                .filter(|r| r.section == p.section)
                .map(|r| (r.metric.as_str(), r.method.as_str(), r.setting.as_str())),
        )
        .collect();
    if cells.is_empty() {
        return Err(format!(
            "section `{}` has no rows or paper values in the results directory",
            p.section
        ));
    }
    let list = |xs: BTreeSet<&str>| xs.into_iter().collect::<Vec<_>>().join(", ");
    let of_metric: Vec<_> = cells.iter().filter(|c| c.0 == p.metric).collect();
    if of_metric.is_empty() {
        return Err(format!(
            "section `{}` has no metric `{}` (metrics: {})",
            p.section,
            p.metric,
            list(cells.iter().map(|c| c.0).collect())
        ));
    }
    for (key, m) in [("a", &p.a), ("b", &p.b)] {
        if !of_metric.iter().any(|c| c.1 == m) {
            return Err(format!(
                "`{key}` = `{m}` is no method of section `{}` (methods: {})",
                p.section,
                list(of_metric.iter().map(|c| c.1).collect())
            ));
        }
    }
    let settings: BTreeSet<&str> = of_metric.iter().map(|c| c.2).collect();
    if let Some(s) = p.settings.iter().find(|s| !settings.contains(s.as_str())) {
        return Err(format!(
            "setting `{s}` is no setting of section `{}` (settings: {})",
            p.section,
            list(settings)
        ));
    }
    Ok(())
}

/// One (claim, setting) test, as the block shows it.
#[derive(Debug, Clone, PartialEq)]
pub struct Tested {
    /// The setting, or `None` for all rows as one.
    pub setting: Option<String>,
    /// The paired test.
    pub result: verdict::Claim,
    /// Paired values that are only bounds (a target never reached), on either side.
    pub censored: usize,
}

/// Pairs A's and B's rows of one setting (all settings when `setting` is `None`) by
/// (setting, seed), censored values at their bound, and tests them. Errors name the claim.
pub fn test(spec: &ClaimSpec, p: &Paired, setting: Option<&str>, rows: &[Row]) -> Result<Tested> {
    let side = |method: &str| -> BTreeMap<(&str, u64), (f64, bool)> {
        rows.iter()
            .filter(|r| {
                r.section == p.section
                    && r.metric == p.metric
                    && r.method == method
                    && setting.is_none_or(|s| r.setting == s)
            })
            .map(|r| ((r.setting.as_str(), r.seed), (r.value, r.censored)))
            .collect()
    };
    let (a_side, b_side) = (side(&p.a), side(&p.b));
    let mut a = Vec::new();
    let mut b = Vec::new();
    let mut censored = 0;
    for (key, &(x, xc)) in &a_side {
        if let Some(&(y, yc)) = b_side.get(key) {
            a.push(x);
            b.push(y);
            censored += usize::from(xc) + usize::from(yc);
        }
    }
    let result = verdict::claim(&a, &b, p.effect, p.direction).map_err(|e| {
        bad(
            &spec.file,
            format!(
                "claim `{}`{}: {e}",
                spec.id,
                setting.map_or(String::new(), |s| format!(", setting `{s}`"))
            ),
        )
    })?;
    Ok(Tested {
        setting: setting.map(str::to_string),
        result,
        censored,
    })
}

/// The effect as the block writes it: the geometric-mean ratio b/a for a log-ratio (so that
/// "b takes 1.34× a's rounds" reads directly), the mean difference a − b otherwise, each
/// with its 95 % t-interval.
fn effect_text(p: &Paired, c: &verdict::Claim) -> String {
    if c.n == 0 {
        return "—".into();
    }
    match p.effect {
        Effect::LogRatio => {
            let r = |x: f64| format!("{:.3}", (-x).exp());
            match c.interval {
                Some((lo, hi)) => format!("b/a = {} [{}, {}]", r(c.effect), r(hi), r(lo)),
                None => format!("b/a = {}", r(c.effect)),
            }
        }
        Effect::Difference => {
            let d = |x: f64| num(&p.metric, x);
            match c.interval {
                Some((lo, hi)) => format!("a − b = {} [{}, {}]", d(c.effect), d(lo), d(hi)),
                None => format!("a − b = {}", d(c.effect)),
            }
        }
    }
}

const HEADER: &str = "| claim | paper | claimed | place | setting | a vs b | pairs | effect [95 % t-interval] | Wilcoxon p | verdict |\n|---|---|---|---|---|---|---|---|---|---|\n";

/// The `claims` block: one row per (claim, setting) with its paired test and verdict, the
/// counts of verdicts, and each claim's quote below. Errors name a claim whose values
/// cannot be tested (a log-ratio of a non-positive value).
pub fn render(claims: &[ClaimSpec], rows: &[Row]) -> Result<String> {
    let mut table = String::new();
    let mut counts: BTreeMap<&str, usize> = BTreeMap::new();
    for spec in claims {
        // A claim's later settings leave its paper, statement and place to its first row.
        let mut first = true;
        let mut row = |setting: &str, ab: &str, pairs: &str, effect: &str, p: &str, v: &str| {
            let (paper, claimed, place) = if first {
                (cell(&spec.paper), cell(&spec.claimed), cell(&spec.place))
            } else {
                ("〃".into(), "〃".into(), "〃".into())
            };
            first = false;
            format!(
                "| `{}` | {paper} | {claimed} | {place} | {setting} | {ab} | {pairs} | {effect} | {p} | {v} |\n",
                spec.id
            )
        };
        match &spec.test {
            Test::NotTestable(reason) => {
                *counts.entry("not testable on CPU").or_default() += 1;
                table.push_str(&row(
                    "—",
                    "—",
                    "—",
                    "—",
                    "—",
                    &format!("not testable on CPU: {}", cell(reason)),
                ));
            }
            Test::Paired(p) => {
                let settings: Vec<Option<&str>> = if p.settings.is_empty() {
                    vec![None]
                } else {
                    p.settings.iter().map(|s| Some(s.as_str())).collect()
                };
                for s in settings {
                    let t = test(spec, p, s, rows)?;
                    let c = &t.result;
                    *counts.entry(c.outcome.label()).or_default() += 1;
                    let pairs = if t.censored > 0 {
                        format!("{} ({} censored)", c.n, t.censored)
                    } else {
                        c.n.to_string()
                    };
                    table.push_str(&row(
                        s.unwrap_or("all"),
                        &format!("{} vs {}, {}", p.a, p.b, p.metric),
                        &pairs,
                        &effect_text(p, c),
                        &c.wilcoxon_p.map_or("—".into(), |p| format!("{p:.4}")),
                        c.outcome.label(),
                    ));
                }
            }
        }
    }
    let mut s = String::new();
    let _ = writeln!(
        s,
        "_Generated by `fedsel results render` from `claims/*.toml` and the per-seed rows of the results directory; the test is in docs/reproducing.md. Do not edit by hand._\n"
    );
    let labels = [
        ClaimOutcome::Reproduced.label(),
        ClaimOutcome::NotReproduced.label(),
        ClaimOutcome::TooFewSeeds.label(),
        "not testable on CPU",
    ];
    let total: usize = counts.values().sum();
    let _ = writeln!(
        s,
        "**Counts** (computed): {}, of {total} tests of {} claims.\n",
        labels
            .iter()
            .map(|l| format!("{} {l}", counts.get(l).copied().unwrap_or(0)))
            .collect::<Vec<_>>()
            .join(", "),
        claims.len()
    );
    s.push_str(HEADER);
    s.push_str(&table);
    s.push_str("\nIn the papers' words:\n\n");
    for spec in claims {
        let _ = writeln!(
            s,
            "- `{}` ({}, {}): “{}”",
            spec.id,
            cell(&spec.paper),
            cell(&spec.place),
            cell(&spec.quote)
        );
    }
    Ok(s)
}
