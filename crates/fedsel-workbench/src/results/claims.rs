//! The papers' headline claims ("A is faster than B"), each quoted with its place in the
//! paper and tested by a paired comparison over the per-seed rows of a results section
//! ([`verdict::claim`]), rendered into the page's `claims` block.
//!
//! A results directory holds them in `claims/*.toml`, one file per paper, each a list of
//! `[[claim]]` tables ([`ClaimSpec`]; `results/README.md` documents the keys). A claim the
//! CPU cannot test names what is missing in `not_testable` instead of the keys of a test.
//!
//! **Written before the runs?** A claim written after the runs it is tested on could have been
//! worded to fit them. [`super::registration::provenance`] dates each claim's test from the history
//! and checks every row it reads against it (ran after it, with the arms' configs as
//! registered); a claim that fails is *post hoc*. A post-hoc claim is confirmed on fresh
//! seeds run after it: the rows of its `confirmatory_section`, whose first mention in the
//! claims must itself precede their runs. The confirmatory verdict is the one counted; the
//! page shows both.
//!
//! **Counted once per claim** ([`render`]): a claim over several settings holds only if each
//! does ([`ClaimOutcome::all_of`]); a claim whose arms repeat another claim's (every seed's
//! values within [`DUPLICATE_TOLERANCE`]) is named a duplicate and not counted again; a claim
//! on the paper's text's variant of a method, which the authors' code did not run, is
//! counted apart ([`Variant`]).

use std::collections::{BTreeMap, BTreeSet};

use std::path::{Path, PathBuf};

use fedsel::error::Result;

use serde::Deserialize;

use super::registration::{ClaimProvenance, Provenance, provenance_text};

use super::{PaperRow, Row, SectionInfo, bad, io, num};

use crate::stats::Obs;

use crate::verdict::{
    self, Bound, ClaimOutcome, Direction, Effect, Size, SizeJudgement, Undecided,
};

mod block;

pub use block::render;

/// The folder of claim files in a results directory.
pub const CLAIMS_DIR: &str = "claims";

/// The name of the page's block of claims; no section may take it.
pub const BLOCK: &str = "claims";

/// Two arms whose values differ by at most this on every paired seed are the same result to
/// 3 decimals: a claim on one repeats a claim on the other.
pub const DUPLICATE_TOLERANCE: f64 = 5e-4;

/// Which protocol a claim's arm A runs (`variant` in a claims file).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Default, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Variant {
    /// The protocol of the authors' code, which produced the paper's tables.
    #[default]
    Authors,
    /// The paper's text's protocol where the authors' code differs: a result on it says
    /// what the paper describes would do, not what the authors ran, so it is counted apart.
    Paper,
}

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
    size: Option<[f64; 2]>,
    variant: Option<Variant>,
    confirmatory_section: Option<String>,
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
    /// The size or range the claim states, if any.
    pub size: Option<Size>,
    /// The section of the fresh-seed rows that confirm a claim written after its runs.
    pub confirmatory_section: Option<String>,
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
    /// Whose protocol arm A runs.
    pub variant: Variant,
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
        ("size", raw.size.is_some()),
        ("confirmatory_section", raw.confirmatory_section.is_some()),
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
                let optional = ["settings", "size", "confirmatory_section"];
                let key = test_keys
                    .iter()
                    .find(|(k, set)| !set && !optional.contains(k))
                    .map_or("section", |(k, _)| k);
                return Err(err(format!(
                    "no `{key}`: a tested claim gives section, metric, a, b, effect and direction; one the CPU cannot test gives `not_testable`"
                )));
            };
            let size = raw
                .size
                .map(|[lo, hi]| Size::new(lo, hi, effect, direction))
                .transpose()
                .map_err(|e| err(e.to_string()))?;
            let p = Paired {
                section,
                metric,
                settings: raw.settings.unwrap_or_default(),
                a,
                b,
                effect,
                direction,
                size,
                confirmatory_section: raw.confirmatory_section,
            };
            check_against_rows(&p, &p.section, rows, paper).map_err(err)?;
            if let Some(c) = &p.confirmatory_section {
                if c == &p.section {
                    return Err(err(format!(
                        "`confirmatory_section` is its own `section` `{c}`: fresh seeds go in a section of their own"
                    )));
                }
                // A confirmatory set not run yet has no rows: its test says so.
                if rows.iter().any(|r| &r.section == c) {
                    check_against_rows(&p, c, rows, &[]).map_err(err)?;
                }
            }
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
        variant: raw.variant.unwrap_or_default(),
        file: file.to_path_buf(),
    })
}

/// Says what a paired claim names that neither the rows nor the paper values of `section`
/// have.
fn check_against_rows(
    p: &Paired,
    section: &str,
    rows: &[Row],
    paper: &[PaperRow],
) -> std::result::Result<(), String> {
    if p.a == p.b {
        return Err(format!("`a` and `b` are both `{}`", p.a));
    }
    // (metric, method, setting) of every row and paper value of the section.
    let cells: Vec<(&str, &str, &str)> = rows
        .iter()
        .filter(|r| r.section == section)
        .map(|r| (r.metric.as_str(), r.method.as_str(), r.setting.as_str()))
        .chain(
            paper
                .iter()
                .filter(|r| r.section == section)
                .map(|r| (r.metric.as_str(), r.method.as_str(), r.setting.as_str())),
        )
        .collect();
    if cells.is_empty() {
        return Err(format!(
            "section `{}` has no rows or paper values in the results directory",
            section
        ));
    }
    let list = |xs: BTreeSet<&str>| xs.into_iter().collect::<Vec<_>>().join(", ");
    let of_metric: Vec<_> = cells.iter().filter(|c| c.0 == p.metric).collect();
    if of_metric.is_empty() {
        return Err(format!(
            "section `{}` has no metric `{}` (metrics: {})",
            section,
            p.metric,
            list(cells.iter().map(|c| c.0).collect())
        ));
    }
    for (key, m) in [("a", &p.a), ("b", &p.b)] {
        if !of_metric.iter().any(|c| c.1 == m) {
            return Err(format!(
                "`{key}` = `{m}` is no method of section `{}` (methods: {})",
                section,
                list(of_metric.iter().map(|c| c.1).collect())
            ));
        }
    }
    let settings: BTreeSet<&str> = of_metric.iter().map(|c| c.2).collect();
    if let Some(s) = p.settings.iter().find(|s| !settings.contains(s.as_str())) {
        return Err(format!(
            "setting `{s}` is no setting of section `{}` (settings: {})",
            section,
            list(settings)
        ));
    }
    Ok(())
}

/// One (claim, setting) test over the rows of one section, as the block shows it.
#[derive(Debug, Clone, PartialEq)]
pub struct Tested {
    /// The setting, or `None` for all rows as one.
    pub setting: Option<String>,
    /// The paired test.
    pub result: verdict::Claim,
    /// The seeds paired, censored pairs included.
    pub seeds: BTreeSet<u64>,
}

/// One arm's rows of a claim in `section`: (setting, seed) → value, censored ones at their
/// bound.
fn arm<'a>(
    p: &Paired,
    section: &str,
    method: &str,
    setting: Option<&str>,
    rows: &'a [Row],
) -> BTreeMap<(&'a str, u64), Obs> {
    rows.iter()
        .filter(|r| {
            // An unplanned row (an arm or seeds added after the results were seen) explains
            // a mismatch and never enters a verdict.
            r.planned
                && r.section == section
                && r.metric == p.metric
                && r.method == method
                && setting.map_or(
                    p.settings.is_empty() || p.settings.contains(&r.setting),
                    |s| r.setting == s,
                )
        })
        .map(|r| {
            let o = if r.censored {
                Obs::Above(r.value)
            } else {
                Obs::Value(r.value)
            };
            ((r.setting.as_str(), r.seed), o)
        })
        .collect()
}

/// Pairs A's and B's planned rows of `section` in one setting (all settings when `setting`
/// is `None`) by (setting, seed) and tests them ([`verdict::claim`]: pairs with both arms
/// censored are left out, one censored arm enters at its bound). Errors name the claim.
pub fn test(
    spec: &ClaimSpec,
    p: &Paired,
    section: &str,
    setting: Option<&str>,
    rows: &[Row],
) -> Result<Tested> {
    let (a_side, b_side) = (
        arm(p, section, &p.a, setting, rows),
        arm(p, section, &p.b, setting, rows),
    );
    let mut pairs = Vec::new();
    let mut seeds = BTreeSet::new();
    for (key, &x) in &a_side {
        if let Some(&y) = b_side.get(key) {
            pairs.push((x, y));
            seeds.insert(key.1);
        }
    }
    let result = verdict::claim(&pairs, p.effect, p.direction, p.size).map_err(|e| {
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
        seeds,
    })
}
