//! The page's `claims` block: each claim's tests as rows, the counted verdict per claim by
//! its evidence (pre-registered, confirmed, post hoc) and variant, and the counts. It renders
//! what [`super::test`] and [`super::registration`] found; it judges no pair itself.

use std::fmt::Write as _;

use super::*;

/// How a claim's counted verdict was reached.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Evidence {
    /// Written before every run it is tested on.
    PreRegistered,
    /// Written after its runs, and tested again on fresh seeds run after its confirmatory
    /// set was written: that test counts.
    Confirmed,
    /// Written after its runs, no confirmatory set yet: the verdict is on seeds seen first.
    PostHoc,
    /// The history cannot tell.
    Unknown,
}

impl Evidence {
    pub(super) const ALL: [Evidence; 4] = [
        Evidence::PreRegistered,
        Evidence::Confirmed,
        Evidence::PostHoc,
        Evidence::Unknown,
    ];

    pub(super) fn label(self) -> &'static str {
        match self {
            Evidence::PreRegistered => "pre-registered (written before its runs)",
            Evidence::Confirmed => {
                "post hoc, confirmed on fresh seeds (the fresh seeds' verdict counts)"
            }
            Evidence::PostHoc => {
                "post hoc, no fresh seeds yet (the verdict on the seeds seen before it was written)"
            }
            Evidence::Unknown => "written when? (the history cannot tell)",
        }
    }
}

/// Whether two arms hold the same values to 3 decimals on every seed.
pub(super) fn same_values(x: &BTreeMap<(&str, u64), Obs>, y: &BTreeMap<(&str, u64), Obs>) -> bool {
    !x.is_empty()
        && x.len() == y.len()
        && x.iter().all(|(k, a)| match (a, y.get(k)) {
            (Obs::Value(a), Some(Obs::Value(b))) | (Obs::Above(a), Some(Obs::Above(b))) => {
                (a - b).abs() <= DUPLICATE_TOLERANCE
            }
            _ => false,
        })
}

/// Each claim that repeats an earlier one: the same sections (as run and fresh), metric,
/// settings, effect and direction, and arms that are the same method or hold the same values
/// to 3 decimals on every seed of every section the claims read. Maps its id to the earlier claim's id and the arms found equal.
pub(super) fn duplicates<'a>(
    claims: &'a [ClaimSpec],
    rows: &[Row],
) -> BTreeMap<&'a str, (&'a str, String)> {
    let mut out = BTreeMap::new();
    let paired: Vec<(&ClaimSpec, &Paired)> = claims
        .iter()
        .filter_map(|c| match &c.test {
            Test::Paired(p) => Some((c, p)),
            Test::NotTestable(_) => None,
        })
        .collect();
    for (j, (cj, pj)) in paired.iter().enumerate() {
        for (ci, pi) in &paired[..j] {
            let comparable = pi.section == pj.section
                && pi.metric == pj.metric
                && pi.settings == pj.settings
                && pi.effect == pj.effect
                && pi.direction == pj.direction
                && pi.confirmatory_section == pj.confirmatory_section
                && (pi.a != pj.a || pi.b != pj.b)
                && !out.contains_key(ci.id.as_str());
            if !comparable {
                continue;
            }
            let mut equal = Vec::new();
            let arms_match = [(&pi.a, &pj.a), (&pi.b, &pj.b)].iter().all(|(x, y)| {
                if x == y {
                    return true;
                }
                // Equal in every section the claims read: as run and on fresh seeds.
                let same = std::iter::once(&pi.section)
                    .chain(&pi.confirmatory_section)
                    .enumerate()
                    .all(|(i, section)| {
                        let (ax, ay) = (
                            arm(pi, section, x, None, rows),
                            arm(pj, section, y, None, rows),
                        );
                        // A confirmatory set not run yet has nothing to compare.
                        (i > 0 && ax.is_empty() && ay.is_empty()) || same_values(&ax, &ay)
                    });
                if same {
                    equal.push(format!("`{y}` equals `{x}`"));
                }
                same
            });
            if arms_match {
                out.insert(
                    cj.id.as_str(),
                    (
                        ci.id.as_str(),
                        format!("{} to 3 decimals on every seed", equal.join(" and ")),
                    ),
                );
                break;
            }
        }
    }
    out
}

/// The effect as the block writes it: the geometric-mean ratio b/a for a log-ratio (so that
/// "b takes 1.34× a's rounds" reads directly), the mean difference a − b otherwise, each
/// with its 95 % t-interval. A bound is written as one, `≤` or `≥`, when an arm is censored.
pub(super) fn effect_text(p: &Paired, c: &verdict::Claim) -> String {
    if c.n == 0 {
        return "—".into();
    }
    let ratio = p.effect == Effect::LogRatio;
    // A censored A is larger than its bound, so a − b is larger and b/a smaller than shown.
    let (relation, bound) = match (c.bound, ratio) {
        (Bound::Exact, _) => ("=", None),
        (Bound::AtLeast, true) | (Bound::AtMost, false) => (
            "≤",
            Some("an upper bound: the censored arm's values are only bounds"),
        ),
        (Bound::AtLeast, false) | (Bound::AtMost, true) => (
            "≥",
            Some("a lower bound: the censored arm's values are only bounds"),
        ),
        (Bound::Neither, _) => (
            "≈",
            Some("no bound either way: each arm is censored in some pair"),
        ),
    };
    let shown = if ratio {
        let r = |x: f64| format!("{:.3}", (-x).exp());
        match c.interval {
            Some((lo, hi)) => format!("b/a {relation} {} [{}, {}]", r(c.effect), r(hi), r(lo)),
            None => format!("b/a {relation} {}", r(c.effect)),
        }
    } else {
        let d = |x: f64| num(&p.metric, x);
        match c.interval {
            Some((lo, hi)) => format!("a − b {relation} {} [{}, {}]", d(c.effect), d(lo), d(hi)),
            None => format!("a − b {relation} {}", d(c.effect)),
        }
    };
    match bound {
        None => shown,
        Some(b) => format!("{shown}, {b}"),
    }
}

/// The stated size as the page writes it.
pub(super) fn size_text(p: &Paired, s: Size) -> String {
    let scale = match p.effect {
        Effect::LogRatio => "b/a",
        Effect::Difference => "a − b",
    };
    if s.lo == s.hi {
        format!("{scale} {}", s.lo)
    } else {
        format!("{scale} {}-{}", s.lo, s.hi)
    }
}

pub(super) fn verdict_text(p: &Paired, c: &verdict::Claim) -> String {
    let fmt = |x: f64| match p.effect {
        Effect::LogRatio => format!("{x:.3}"),
        Effect::Difference => num(&p.metric, x),
    };
    match (c.outcome, p.size, c.size) {
        (ClaimOutcome::Reproduced, Some(s), _) => {
            format!(
                "reproduced (the point lies in the stated {})",
                size_text(p, s)
            )
        }
        (ClaimOutcome::DirectionOnly, Some(s), Some(SizeJudgement::Missed(m))) => format!(
            "direction only: the interval ends at {}, {} {} the stated {}",
            fmt(m.nearest),
            fmt((m.nearest - m.stated).abs()),
            if m.nearest > m.stated {
                "above"
            } else {
                "below"
            },
            size_text(p, s)
        ),
        (ClaimOutcome::SizeUndetermined, Some(s), Some(SizeJudgement::Undetermined(why))) => {
            format!(
                "direction, size undetermined: the interval meets the stated {} {}",
                size_text(p, s),
                match why {
                    Undecided::Spread(Some(n)) => format!(
                        "but the point lies outside it; {n} pairs would decide at this spread"
                    ),
                    Undecided::Spread(None) => format!(
                        "but the point lies outside it; not even {} pairs would decide at this spread",
                        verdict::MAX_SEEDS_TO_DECIDE
                    ),
                    Undecided::Bound => {
                        "and the effect is a censored bound: longer runs, not more seeds, would decide"
                            .to_string()
                    }
                }
            )
        }
        (ClaimOutcome::BoundUndetermined, _, _) => {
            let below = c.interval.is_some_and(|(_, hi)| hi < 0.0);
            let (scale, side) = match (p.effect, below) {
                (Effect::LogRatio, true) => ("b/a", "above 1"),
                (Effect::LogRatio, false) => ("b/a", "below 1"),
                (Effect::Difference, true) => ("a − b", "below 0"),
                (Effect::Difference, false) => ("a − b", "above 0"),
            };
            let bound = match c.bound {
                Bound::Neither => "bounded neither way".to_string(),
                _ => format!(
                    "only {} bound",
                    if (c.bound == Bound::AtLeast) == (p.effect == Effect::LogRatio) {
                        "an upper"
                    } else {
                        "a lower"
                    }
                ),
            };
            format!(
                "undetermined by a bound: {scale}'s interval lies {side}, but the censored arm leaves {scale} {bound}"
            )
        }
        (o, _, _) => o.label().to_string(),
    }
}

pub(super) fn pairs_text(c: &verdict::Claim) -> String {
    let mut notes = Vec::new();
    if c.both_censored > 0 {
        notes.push(format!("{} with both censored, left out", c.both_censored));
    }
    if c.a_censored > 0 {
        notes.push(format!("A censored in {}", c.a_censored));
    }
    if c.b_censored > 0 {
        notes.push(format!("B censored in {}", c.b_censored));
    }
    if notes.is_empty() {
        c.n.to_string()
    } else {
        format!("{} ({})", c.n, notes.join("; "))
    }
}

/// Seeds as ranges: 1-10, or 1-5, 7.
pub(super) fn seeds_text(seeds: &BTreeSet<u64>) -> String {
    let mut parts: Vec<(u64, u64)> = Vec::new();
    for &s in seeds {
        match parts.last_mut() {
            Some((_, hi)) if *hi + 1 == s => *hi = s,
            _ => parts.push((s, s)),
        }
    }
    parts
        .iter()
        .map(|&(lo, hi)| {
            if lo == hi {
                lo.to_string()
            } else {
                format!("{lo}-{hi}")
            }
        })
        .collect::<Vec<_>>()
        .join(", ")
}

pub(super) const HEADER: &str = "| claim | paper | claimed | setting | test (seeds) | a vs b | pairs | effect [95 % t-interval] | Wilcoxon p | verdict |\n|---|---|---|---|---|---|---|---|---|---|\n";

pub(super) const PER_CLAIM_HEADER: &str =
    "| claim | variant | written | counted verdict |\n|---|---|---|---|\n";

/// The `claims` block: the counts, one per claim, by evidence (pre-registered, confirmed on
/// fresh seeds, post hoc) and variant; one row per claim saying when it was written and the
/// verdict counted; one row per (claim, setting, set of seeds) with its paired test; and
/// each claim's quote below. `prov` is [`provenance`]'s. Errors name a claim whose values
/// cannot be tested (a log-ratio of a non-positive value).
pub fn render(
    claims: &[ClaimSpec],
    rows: &[Row],
    prov: &BTreeMap<String, ClaimProvenance>,
    sections: &BTreeMap<String, SectionInfo>,
) -> Result<String> {
    let dups = duplicates(claims, rows);
    let mut awaiting: Vec<String> = Vec::new();
    let mut table = String::new();
    let mut per_claim = String::new();
    let mut counts: BTreeMap<(Variant, Evidence, ClaimOutcome), usize> = BTreeMap::new();
    let mut not_testable = 0;
    for spec in claims {
        // A claim's later rows leave its paper and statement to its first row.
        let mut first = true;
        let mut row = |setting: &str,
                       test: &str,
                       ab: &str,
                       pairs: &str,
                       effect: &str,
                       p: &str,
                       v: &str| {
            let (paper, claimed) = if first {
                (cell(&spec.paper), cell(&spec.claimed))
            } else {
                ("〃".into(), "〃".into())
            };
            first = false;
            format!(
                "| `{}` | {paper} | {claimed} | {setting} | {test} | {ab} | {pairs} | {effect} | {p} | {v} |\n",
                spec.id
            )
        };
        let variant = match spec.variant {
            Variant::Authors => "authors' code",
            Variant::Paper => "paper's text (not the authors' code)",
        };
        let p = match &spec.test {
            Test::NotTestable(reason) => {
                not_testable += 1;
                table.push_str(&row(
                    "—",
                    "—",
                    "—",
                    "—",
                    "—",
                    "—",
                    &format!("not testable on CPU: {}", cell(reason)),
                ));
                let _ = writeln!(
                    per_claim,
                    "| `{}` | {variant} | — | not testable on CPU |",
                    spec.id
                );
                continue;
            }
            Test::Paired(p) => p,
        };
        let settings: Vec<Option<&str>> = if p.settings.is_empty() {
            vec![None]
        } else {
            p.settings.iter().map(|s| Some(s.as_str())).collect()
        };
        let mut run_tests = |section: &str, label: &str| -> Result<Vec<ClaimOutcome>> {
            let mut outcomes = Vec::new();
            for s in &settings {
                let t = test(spec, p, section, *s, rows)?;
                let c = &t.result;
                outcomes.push(c.outcome);
                table.push_str(&row(
                    s.unwrap_or("all"),
                    &format!("{label} ({})", seeds_text(&t.seeds)),
                    &format!("{} vs {}, {}", p.a, p.b, p.metric),
                    &pairs_text(c),
                    &effect_text(p, c),
                    &c.wilcoxon_p.map_or("—".into(), |p| format!("{p:.4}")),
                    &verdict_text(p, c),
                ));
            }
            Ok(outcomes)
        };
        let original = run_tests(&p.section, "as run")?;
        let cp = prov.get(&spec.id);
        let confirmed = match (
            &p.confirmatory_section,
            cp.and_then(|c| c.confirmatory.as_ref()),
        ) {
            (Some(c), Some(_)) => Some(run_tests(c, "fresh seeds")?),
            (Some(_), None) => {
                table.push_str(&row(
                    "—",
                    "fresh seeds (not run yet)",
                    "—",
                    "—",
                    "—",
                    "—",
                    "—",
                ));
                None
            }
            (None, _) => None,
        };
        let (evidence, outcomes) = match cp.map(|c| (&c.claim, &c.confirmatory)) {
            Some((Provenance::Known(r), _)) if !r.post_hoc() => (Evidence::PreRegistered, original),
            Some((Provenance::Known(_), Some(Provenance::Known(c)))) if !c.post_hoc() => {
                (Evidence::Confirmed, confirmed.unwrap_or_default())
            }
            Some((Provenance::Known(_), _)) => (Evidence::PostHoc, original),
            Some((Provenance::Unknown(_), _)) | None => (Evidence::Unknown, original),
        };
        let outcome = ClaimOutcome::all_of(&outcomes).unwrap_or(ClaimOutcome::TooFewSeeds);
        let written = match cp {
            Some(c) => {
                let mut w = provenance_text(&c.claim);
                if let Some(conf) = &c.confirmatory {
                    let _ = write!(w, "; fresh seeds {}", provenance_text(conf));
                }
                w
            }
            None => "unknown: no history".into(),
        };
        // The section whose rows the counted verdict reads, and its arms not current.
        let read = match evidence {
            Evidence::Confirmed => p.confirmatory_section.as_deref().unwrap_or(&p.section),
            _ => &p.section,
        };
        let stale: Vec<&str> = sections.get(read).map_or(Vec::new(), |i| {
            i.not_current
                .iter()
                .filter(|m| **m == p.a || **m == p.b)
                .map(String::as_str)
                .collect()
        });
        let counted = match dups.get(spec.id.as_str()) {
            Some((of, why)) => format!("{} — not counted: repeats `{of}` ({why})", outcome.label()),
            None if !stale.is_empty() => {
                awaiting.push(format!("`{}`", spec.id));
                format!(
                    "{} — not counted: awaiting rerun (the rows of {} in `{read}` are marked not current in sections.toml)",
                    outcome.label(),
                    stale
                        .iter()
                        .map(|m| format!("`{m}`"))
                        .collect::<Vec<_>>()
                        .join(" and ")
                )
            }
            None => {
                *counts.entry((spec.variant, evidence, outcome)).or_default() += 1;
                format!("**{}**", outcome.label())
            }
        };
        let _ = writeln!(
            per_claim,
            "| `{}` | {variant} | {} | {counted} |",
            spec.id,
            cell(&written)
        );
    }
    let mut s = String::new();
    let _ = writeln!(
        s,
        "_Generated by `fedsel results render` from `claims/*.toml`, the per-seed rows of the results directory and the repository's history; the test is in docs/reproducing.md. Do not edit by hand._\n"
    );
    let counted: usize = counts.values().sum();
    let _ = writeln!(
        s,
        "**Counts** (computed, one per claim: a claim over several settings holds only if each does), {counted} claims counted of {}:\n",
        claims.len()
    );
    s.push_str("| claims | ");
    for o in ClaimOutcome::ALL {
        let _ = write!(s, "{} | ", o.label());
    }
    s.push_str("all |\n|---|");
    for _ in ClaimOutcome::ALL {
        s.push_str("---|");
    }
    s.push_str("---|\n");
    for variant in [Variant::Authors, Variant::Paper] {
        for evidence in Evidence::ALL {
            let n: Vec<usize> = ClaimOutcome::ALL
                .iter()
                .map(|o| counts.get(&(variant, evidence, *o)).copied().unwrap_or(0))
                .collect();
            let total: usize = n.iter().sum();
            if total == 0 {
                continue;
            }
            let _ = write!(
                s,
                "| {}{} | ",
                evidence.label(),
                match variant {
                    Variant::Authors => "",
                    Variant::Paper =>
                        "; the paper's text's variant, which the authors' code does not run",
                }
            );
            for x in n {
                let _ = write!(s, "{x} | ");
            }
            let _ = writeln!(s, "{total} |");
        }
    }
    let _ = writeln!(
        s,
        "\nNot counted: {} not testable on CPU; {} awaiting a rerun of rows marked not current{}; {} repeating another claim's result{}.\n",
        not_testable,
        awaiting.len(),
        if awaiting.is_empty() {
            String::new()
        } else {
            format!(" ({})", awaiting.join(", "))
        },
        dups.len(),
        if dups.is_empty() {
            String::new()
        } else {
            format!(
                " ({})",
                dups.iter()
                    .map(|(id, (of, _))| format!("`{id}` repeats `{of}`"))
                    .collect::<Vec<_>>()
                    .join("; ")
            )
        }
    );
    s.push_str(PER_CLAIM_HEADER);
    s.push_str(&per_claim);
    s.push_str("\nThe tests, one per setting and set of seeds:\n\n");
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
