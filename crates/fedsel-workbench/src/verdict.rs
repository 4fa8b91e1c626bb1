//! Judging one cell of a results page against the paper's value, and one paired claim.
//!
//! **The rule** (fixed before the runs it judges; `docs/reproducing.md` states it for readers):
//!
//! - *Cell.* The per-seed values of one metric for one (paper, table, setting, method),
//!   beside the paper's mean (with its std and seed count where the paper gives them).
//! - *Margin.* Each cell has an equivalence margin m, with its source:
//!   the paper's own std for that cell where it gives one; otherwise half the distance from
//!   the cell's paper mean to the nearest different paper mean of another method in the same
//!   column (same table, setting and metric). Half that distance is the widest margin for which
//!   no two methods' windows overlap, so a cell that agrees with one method's value cannot
//!   also agree with another's: the verdict can tell the paper's methods apart. A column with
//!   one method and no std has no margin, and its cell is judged "no margin", never "agrees".
//!   Accuracy, loss and rounds take the same rule; there is no fixed tolerance.
//! - *Interval.* The two-sided 95 % Student t-interval of our mean over seeds,
//!   mean ± t(0.975, n − 1)·s/√n. Unlike a percentile bootstrap of 3 to 5 values, which is
//!   about [min, max], it widens with few seeds and can exclude a value lying between our
//!   worst and best seed.
//! - *Seeds.* Below [`MIN_SEEDS`] seeds the verdict is "too few seeds", whatever the values.
//! - *Verdict.* With window W = [paper − m, paper + m]: **agrees** when the interval lies inside
//!   W (equivalence, as two one-sided tests at 2.5 % each); **differs** when the interval and
//!   W do not meet; **inconclusive** otherwise.
//! - *Censored.* A cell with any censored seed (rounds to a target never reached) is judged
//!   "censored": its mean is unknown, and a median would be compared with the paper's mean.
//!   It is shown with the count of censored seeds and never counted as agreeing.
//!
//! **Claims** ("A is faster than B"): over seeds paired on the same data and availability, the
//! effect is the mean paired difference a − b or the mean log-ratio ln(a/b), with its 95 %
//! t-interval and the exact Wilcoxon signed-rank p of the paired differences
//! ([`crate::stats::wilcoxon`]). The verdict ([`ClaimOutcome`]):
//! - **reproduced**: the interval excludes 0 on the claimed side and, where the claim states
//!   a size or range ([`Size`]), the size is *met*: the point estimate lies in the range
//!   (and so the interval meets it);
//! - **direction only**: the interval is on the claimed side and the size is *missed*: the
//!   interval excludes the range (the verdict says by how much);
//! - **direction, size undetermined**: on the claimed side, the point outside the stated
//!   range and the interval still meeting it: the seeds cannot tell; the verdict says how
//!   many seeds would, at the observed spread ([`SizeJudgement::Undetermined`]);
//! - **not reproduced**: the interval contains 0;
//! - **contradicted**: the interval excludes 0 on the other side, a significant result
//!   against the claim;
//! - **undetermined by a bound**: a censored arm makes the effect a one-sided bound
//!   ([`Bound`]) that points away from the side the interval is on, so the interval cannot
//!   say which side the true effect lies on;
//! - **too few seeds** below [`MIN_SEEDS`] pairs, and **too few informative seeds** when
//!   that many remain only after leaving out the pairs with both arms censored.
//!
//! *Censored pairs* (a target neither arm reached) say nothing of which arm is faster, so they
//! are left out of the test and counted. A pair with one arm censored enters at that arm's
//! bound (the rounds it ran), so the effect is then a bound, on the side [`Claim::bound`]
//! names. **A bound supports a verdict only in its own direction**: an effect that is at
//! most what is shown can show that A is lower, never that it is higher, and a stated size
//! can then be missed in the bound's direction but never met.
use fedsel::error::ConfigError;

use crate::stats::{Obs, mean_std, wilcoxon};

/// Fewest seeds a cell or a claim needs for any verdict but "too few seeds".
pub const MIN_SEEDS: usize = 5;

/// Two-sided coverage of every interval.
pub const LEVEL: f64 = 0.95;

/// Where a cell's equivalence margin comes from.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum MarginSource {
    /// The paper's std of this cell.
    PaperStd,
    /// Half the distance to the nearest other method's paper mean in the same column.
    HalfNearestGap,
}

/// A cell's equivalence margin.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Margin {
    /// Half-width of the window around the paper's mean.
    pub value: f64,
    /// Its source.
    pub source: MarginSource,
}

/// The margin of a cell under the rule: the paper's `std` when it gives one (and it is
/// positive), otherwise half the distance from `mean` to the nearest different value among
/// `others`, the paper means of the other methods in the same column. `None` when neither
/// exists.
pub fn margin(mean: f64, std: Option<f64>, others: &[f64]) -> Option<Margin> {
    if let Some(s) = std.filter(|s| *s > 0.0 && s.is_finite()) {
        return Some(Margin {
            value: s,
            source: MarginSource::PaperStd,
        });
    }
    others
        .iter()
        .map(|o| (o - mean).abs())
        .filter(|g| *g > 0.0 && g.is_finite())
        .min_by(f64::total_cmp)
        .map(|g| Margin {
            value: g / 2.0,
            source: MarginSource::HalfNearestGap,
        })
}

/// A cell's verdict.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Verdict {
    /// Our interval lies inside the paper's window.
    Agrees,
    /// Our interval and the paper's window do not meet.
    Differs,
    /// Neither: the seeds cannot decide.
    Inconclusive,
    /// Fewer than [`MIN_SEEDS`] seeds.
    TooFewSeeds,
    /// A seed is censored: its value is only a bound.
    Censored,
    /// The paper gives no std and no other method in the column.
    NoMargin,
}

impl Verdict {
    /// Every verdict, in the order the counts list them.
    pub const ALL: [Verdict; 6] = [
        Verdict::Agrees,
        Verdict::Differs,
        Verdict::Inconclusive,
        Verdict::TooFewSeeds,
        Verdict::Censored,
        Verdict::NoMargin,
    ];

    /// The verdict as a results table writes it.
    pub fn label(self) -> &'static str {
        match self {
            Verdict::Agrees => "agrees",
            Verdict::Differs => "differs",
            Verdict::Inconclusive => "inconclusive",
            Verdict::TooFewSeeds => "too few seeds",
            Verdict::Censored => "censored",
            Verdict::NoMargin => "no margin",
        }
    }
}

/// The judgement of one cell, with what a table shows of it.
#[derive(Debug, Clone, PartialEq)]
pub struct Judgement {
    /// The verdict.
    pub verdict: Verdict,
    /// Seeds.
    pub n: usize,
    /// Censored seeds.
    pub censored: usize,
    /// Our mean over seeds (with censored seeds at their bound: then a lower bound).
    pub mean: f64,
    /// Our 95 % t-interval of the mean, when n ≥ 2 and no seed is censored.
    pub interval: Option<(f64, f64)>,
    /// The paper's window, paper mean ± margin, when the cell has a margin.
    pub window: Option<(f64, f64)>,
}

/// The quantile of Student's t distribution with `df` degrees of freedom at probability `p`
/// (0.5 < p < 1), exact to about 1e-12: the distribution function for integer df has a
/// closed form (Abramowitz & Stegun 26.7.3-4), inverted by bisection.
pub fn t_quantile(p: f64, df: usize) -> Result<f64, ConfigError> {
    if df == 0 {
        return Err(ConfigError::invalid(
            "df",
            "the t distribution needs at least 1 degree of freedom",
        ));
    }
    if !(p > 0.5 && p < 1.0) {
        return Err(ConfigError::invalid(
            "p",
            format!("{p}: a t quantile here is for 0.5 < p < 1"),
        ));
    }
    // P(|T| ≤ t) = 2p − 1.
    let target = 2.0 * p - 1.0;
    let mut hi = 1.0;
    while t_central(hi, df) < target {
        hi *= 2.0;
    }
    let mut lo = 0.0;
    for _ in 0..200 {
        let mid = 0.5 * (lo + hi);
        if t_central(mid, df) < target {
            lo = mid;
        } else {
            hi = mid;
        }
        if hi - lo <= 1e-14 * hi {
            break;
        }
    }
    Ok(0.5 * (lo + hi))
}

/// P(|T| ≤ t) for Student's t with `df` ≥ 1 degrees of freedom (A&S 26.7.3-4).
fn t_central(t: f64, df: usize) -> f64 {
    let theta = (t / (df as f64).sqrt()).atan();
    let (s, c) = theta.sin_cos();
    let c2 = c * c;
    if df % 2 == 1 {
        // (2/π)·[θ + sin θ·(cos θ + (2/3)cos³θ + … + (2·4…(df−3))/(1·3…(df−2))·cos^(df−2)θ)]
        let mut sum = 0.0;
        if df > 1 {
            let mut term = c;
            sum = term;
            let mut k = 2;
            while k < df - 1 {
                term *= c2 * k as f64 / (k + 1) as f64;
                sum += term;
                k += 2;
            }
        }
        std::f64::consts::FRAC_2_PI * (theta + s * sum)
    } else {
        // sin θ·(1 + (1/2)cos²θ + (1·3)/(2·4)cos⁴θ + … + (1·3…(df−3))/(2·4…(df−2))·cos^(df−2)θ)
        let mut term = 1.0;
        let mut sum = 1.0;
        let mut k = 1;
        while k < df - 1 {
            term *= c2 * k as f64 / (k + 1) as f64;
            sum += term;
            k += 2;
        }
        s * sum
    }
}

/// The mean of `xs` and its two-sided 95 % t-interval; `None` with fewer than 2 values.
pub fn t_interval(xs: &[f64]) -> Option<(f64, (f64, f64))> {
    if xs.len() < 2 {
        return None;
    }
    let (m, s) = mean_std(xs);
    let t = t_quantile(0.5 + LEVEL / 2.0, xs.len() - 1).expect("df ≥ 1 and p in range");
    let h = t * s / (xs.len() as f64).sqrt();
    Some((m, (m - h, m + h)))
}

/// Judges one cell: our per-seed `values` against the paper's `paper_mean` and the cell's
/// [`margin`] (see the module doc for the rule and its order: seeds, censoring, margin,
/// interval). `values` must not be empty.
pub fn judge(values: &[Obs], paper_mean: f64, margin: Option<Margin>) -> Judgement {
    let bounds: Vec<f64> = values
        .iter()
        .map(|o| match o {
            Obs::Value(x) | Obs::Above(x) => *x,
        })
        .collect();
    let censored = values.iter().filter(|o| matches!(o, Obs::Above(_))).count();
    let n = values.len();
    let window = margin.map(|m| (paper_mean - m.value, paper_mean + m.value));
    let interval = if censored == 0 {
        t_interval(&bounds).map(|(_, i)| i)
    } else {
        None
    };
    let verdict = match (interval, window) {
        _ if n < MIN_SEEDS => Verdict::TooFewSeeds,
        _ if censored > 0 => Verdict::Censored,
        (_, None) => Verdict::NoMargin,
        (Some((lo, hi)), Some((wlo, whi))) => {
            if lo >= wlo && hi <= whi {
                Verdict::Agrees
            } else if hi < wlo || lo > whi {
                Verdict::Differs
            } else {
                Verdict::Inconclusive
            }
        }
        (None, Some(_)) => unreachable!("n ≥ MIN_SEEDS ≥ 2 uncensored values have an interval"),
    };
    Judgement {
        verdict,
        n,
        censored,
        mean: mean_std(&bounds).0,
        interval,
        window,
    }
}

/// How a claim measures the effect of A against B (`effect` in a claims file).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Effect {
    /// a − b, in the metric's units.
    Difference,
    /// ln(a / b): for positive metrics whose spread grows with their size (rounds to a
    /// target), so that "34 % faster" is one number across settings.
    LogRatio,
}

/// The side a claim puts A on (`direction` in a claims file).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Direction {
    /// A's value is claimed lower than B's (fewer rounds, lower loss).
    Lower,
    /// A's value is claimed higher than B's (higher accuracy).
    Higher,
}

/// A claim's outcome (the rule is in the module doc).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum ClaimOutcome {
    /// The interval lies on the claimed side and the point lies in the stated size, if any.
    Reproduced,
    /// On the claimed side, but the interval excludes the stated size.
    DirectionOnly,
    /// On the claimed side; whether the stated size holds, the seeds cannot tell.
    SizeUndetermined,
    /// The interval contains 0.
    NotReproduced,
    /// The interval lies on the other side.
    Contradicted,
    /// A censored arm's bound points away from the interval's side: no side is shown.
    BoundUndetermined,
    /// Fewer than [`MIN_SEEDS`] pairs.
    TooFewSeeds,
    /// Fewer than [`MIN_SEEDS`] pairs once the pairs with both arms censored are left out.
    TooFewInformative,
}

impl ClaimOutcome {
    /// Every outcome, in the order the counts list them.
    pub const ALL: [ClaimOutcome; 8] = [
        ClaimOutcome::Reproduced,
        ClaimOutcome::DirectionOnly,
        ClaimOutcome::SizeUndetermined,
        ClaimOutcome::NotReproduced,
        ClaimOutcome::Contradicted,
        ClaimOutcome::BoundUndetermined,
        ClaimOutcome::TooFewSeeds,
        ClaimOutcome::TooFewInformative,
    ];

    /// The outcome as a results table writes it.
    pub fn label(self) -> &'static str {
        match self {
            ClaimOutcome::Reproduced => "reproduced",
            ClaimOutcome::DirectionOnly => "direction only",
            ClaimOutcome::SizeUndetermined => "direction, size undetermined",
            ClaimOutcome::NotReproduced => "not reproduced",
            ClaimOutcome::Contradicted => "contradicted",
            ClaimOutcome::BoundUndetermined => "undetermined by a bound",
            ClaimOutcome::TooFewSeeds => "too few seeds",
            ClaimOutcome::TooFewInformative => "too few informative seeds",
        }
    }

    /// The outcome of a claim made of several tests that must each hold ("in every
    /// setting"): the first of contradicted, not reproduced, undetermined by a bound, too
    /// few (informative) seeds, direction only and size undetermined that any test has,
    /// reproduced when every test is. `None` for no test.
    pub fn all_of(outcomes: &[ClaimOutcome]) -> Option<ClaimOutcome> {
        [
            ClaimOutcome::Contradicted,
            ClaimOutcome::NotReproduced,
            ClaimOutcome::BoundUndetermined,
            ClaimOutcome::TooFewInformative,
            ClaimOutcome::TooFewSeeds,
            ClaimOutcome::DirectionOnly,
            ClaimOutcome::SizeUndetermined,
            ClaimOutcome::Reproduced,
        ]
        .into_iter()
        .find(|o| outcomes.contains(o))
    }
}

/// The size a claim states, as a closed range of the effect as the page shows it: the ratio
/// b/a for a log-ratio ("34 % ∼ 99 % faster": b/a in [1.34, 1.99]), a − b for a difference.
/// A point ("4.9 % below") is the range its rounding allows.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Size {
    /// The smallest value the claim allows.
    pub lo: f64,
    /// The largest.
    pub hi: f64,
}

impl Size {
    /// Checks a stated range: finite, `lo ≤ hi`, and wholly on the claimed side (b/a above 1
    /// for a claim that A is lower on a log-ratio, and so on), so that no size can turn a
    /// result on the other side into "reproduced". Errors say which.
    pub fn new(
        lo: f64,
        hi: f64,
        effect: Effect,
        direction: Direction,
    ) -> Result<Self, ConfigError> {
        if !(lo.is_finite() && hi.is_finite() && lo <= hi) {
            return Err(ConfigError::invalid(
                "size",
                format!("[{lo}, {hi}]: a size is a finite range, low end first"),
            ));
        }
        let s = Size { lo, hi };
        let (dlo, dhi) = s.on_effect_scale(effect);
        let side = match direction {
            Direction::Lower => dhi < 0.0,
            Direction::Higher => dlo > 0.0,
        };
        if (effect == Effect::LogRatio && lo <= 0.0) || !side {
            return Err(ConfigError::invalid(
                "size",
                format!(
                    "[{lo}, {hi}] is not wholly on the claimed side ({})",
                    match (effect, direction) {
                        (Effect::LogRatio, Direction::Lower) => "b/a above 1",
                        (Effect::LogRatio, Direction::Higher) => "b/a below 1",
                        (Effect::Difference, Direction::Lower) => "a − b below 0",
                        (Effect::Difference, Direction::Higher) => "a − b above 0",
                    }
                ),
            ));
        }
        Ok(s)
    }

    /// The range on the scale of the test's effect: ln(a/b) = −ln(b/a) for a log-ratio.
    fn on_effect_scale(self, effect: Effect) -> (f64, f64) {
        match effect {
            Effect::Difference => (self.lo, self.hi),
            Effect::LogRatio => (-self.hi.ln(), -self.lo.ln()),
        }
    }
}

/// How the stated size was missed, on the page's scale (b/a or a − b).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SizeMiss {
    /// The interval's end nearest the stated range.
    pub nearest: f64,
    /// The stated range's end nearest the interval.
    pub stated: f64,
}

/// Why the seeds cannot tell whether the stated size holds.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Undecided {
    /// The point lies outside the range and the interval meets it: this many pairs would
    /// decide it (the interval's half-width below the point's distance to the range) if the
    /// spread and the point stayed as observed; `None` when no count up to
    /// [`MAX_SEEDS_TO_DECIDE`] would.
    Spread(Option<usize>),
    /// The effect is a censored bound that does not exclude the range on its own side:
    /// more seeds cannot decide it, longer runs (fewer censored arms) can.
    Bound,
}

/// The most pairs [`Undecided::Spread`] looks for.
pub const MAX_SEEDS_TO_DECIDE: usize = 10_000;

/// A stated size against the interval, judged three ways.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum SizeJudgement {
    /// The point lies in the range.
    Met,
    /// The interval excludes the range.
    Missed(SizeMiss),
    /// Neither.
    Undetermined(Undecided),
}

/// What the censored arms make of the effect.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Bound {
    /// No informative pair has a censored arm: the effect is as measured.
    Exact,
    /// Only A is censored in some pairs: its true values are larger, so the true a − b (or
    /// ln(a/b)) is at least the effect shown.
    AtLeast,
    /// Only B is censored in some pairs: the true a − b is at most the effect shown.
    AtMost,
    /// Both arms are censored in different pairs: the effect bounds neither way.
    Neither,
}

/// The test of one paired claim.
#[derive(Debug, Clone, PartialEq)]
pub struct Claim {
    /// Informative pairs: those tested.
    pub n: usize,
    /// Pairs left out because both arms are censored.
    pub both_censored: usize,
    /// Tested pairs with A censored (at its bound).
    pub a_censored: usize,
    /// Tested pairs with B censored (at its bound).
    pub b_censored: usize,
    /// Whether the effect is exact or a bound.
    pub bound: Bound,
    /// The mean paired effect.
    pub effect: f64,
    /// Its 95 % t-interval, when n ≥ 2.
    pub interval: Option<(f64, f64)>,
    /// The exact two-sided Wilcoxon signed-rank p of the paired effects; `None` when every
    /// effect is zero.
    pub wilcoxon_p: Option<f64>,
    /// The outcome.
    pub outcome: ClaimOutcome,
    /// The stated size against the interval, when the claim states one and the interval is
    /// on the claimed side.
    pub size: Option<SizeJudgement>,
}

/// Tests the claim that A's values lie on `direction`'s side of B's, and within `size` when
/// the claim states one. `pairs[i]` holds one seed's values of A and B (same data and
/// availability), each exact or censored at its bound. Pairs with both censored are left
/// out (see the module doc). Errors name the pair whose value cannot be used.
pub fn claim(
    pairs: &[(Obs, Obs)],
    effect: Effect,
    direction: Direction,
    size: Option<Size>,
) -> Result<Claim, ConfigError> {
    let value = |o: Obs| match o {
        Obs::Value(x) | Obs::Above(x) => x,
    };
    let censored = |o: Obs| matches!(o, Obs::Above(_));
    let informative: Vec<(usize, Obs, Obs)> = pairs
        .iter()
        .enumerate()
        .filter(|(_, (x, y))| !(censored(*x) && censored(*y)))
        .map(|(i, &(x, y))| (i, x, y))
        .collect();
    let d: Vec<f64> = informative
        .iter()
        .map(|&(i, x, y)| {
            let (x, y) = (value(x), value(y));
            match effect {
                _ if !x.is_finite() || !y.is_finite() => Err(ConfigError::invalid(
                    "claim",
                    format!("pair {i}: {x} and {y} must both be finite"),
                )),
                Effect::Difference => Ok(x - y),
                Effect::LogRatio if x > 0.0 && y > 0.0 => Ok((x / y).ln()),
                Effect::LogRatio => Err(ConfigError::invalid(
                    "claim",
                    format!("pair {i}: {x} and {y} must both be positive for a log-ratio"),
                )),
            }
        })
        .collect::<Result<_, _>>()?;
    let n = d.len();
    let both_censored = pairs.len() - n;
    let a_censored = informative.iter().filter(|p| censored(p.1)).count();
    let b_censored = informative.iter().filter(|p| censored(p.2)).count();
    let bound = match (a_censored > 0, b_censored > 0) {
        (false, false) => Bound::Exact,
        (true, false) => Bound::AtLeast,
        (false, true) => Bound::AtMost,
        (true, true) => Bound::Neither,
    };
    let interval = t_interval(&d).map(|(_, i)| i);
    // NaN for no pair, as the effect then reads.
    let (point, spread) = mean_std(&d);
    let mut judged = None;
    let outcome = match interval {
        _ if n < MIN_SEEDS && both_censored > 0 => ClaimOutcome::TooFewInformative,
        _ if n < MIN_SEEDS => ClaimOutcome::TooFewSeeds,
        None => unreachable!("n ≥ MIN_SEEDS ≥ 2 pairs have an interval"),
        Some((lo, hi)) => {
            // The side the interval shows, and whether the bound lets it show that side:
            // an effect at least what is shown can be shown above 0, never below.
            let (below, above) = (hi < 0.0, lo > 0.0);
            let supported = match bound {
                Bound::Exact => true,
                Bound::AtLeast => !below,
                Bound::AtMost => !above,
                Bound::Neither => !(below || above),
            };
            let (claimed, against) = match direction {
                Direction::Lower => (below, above),
                Direction::Higher => (above, below),
            };
            if !supported {
                ClaimOutcome::BoundUndetermined
            } else if against {
                ClaimOutcome::Contradicted
            } else if !claimed {
                ClaimOutcome::NotReproduced
            } else {
                judged = size.map(|sz| judge_size(sz, point, (lo, hi), spread, n, bound, effect));
                match judged {
                    None | Some(SizeJudgement::Met) => ClaimOutcome::Reproduced,
                    Some(SizeJudgement::Missed(_)) => ClaimOutcome::DirectionOnly,
                    Some(SizeJudgement::Undetermined(_)) => ClaimOutcome::SizeUndetermined,
                }
            }
        }
    };
    Ok(Claim {
        n,
        both_censored,
        a_censored,
        b_censored,
        bound,
        effect: point,
        interval,
        wilcoxon_p: wilcoxon(&d),
        outcome,
        size: judged,
    })
}

/// Judges the stated `size` against the mean effect `point`, its interval `(lo, hi)` and
/// the spread `s` of `n` paired effects, all on the effect's scale (see [`SizeJudgement`]).
/// A bound can only miss the range on its own side: an effect at least what is shown misses
/// it when even the interval's low end lies above the range.
fn judge_size(
    size: Size,
    point: f64,
    (lo, hi): (f64, f64),
    s: f64,
    n: usize,
    bound: Bound,
    effect: Effect,
) -> SizeJudgement {
    let (slo, shi) = size.on_effect_scale(effect);
    let shown = |x: f64| match effect {
        Effect::Difference => x,
        Effect::LogRatio => (-x).exp(),
    };
    let below = hi < slo;
    let above = lo > shi;
    let missed = match bound {
        Bound::Exact => below || above,
        Bound::AtLeast => above,
        Bound::AtMost => below,
        Bound::Neither => false,
    };
    if missed {
        let (nearest, stated) = if below { (hi, slo) } else { (lo, shi) };
        return SizeJudgement::Missed(SizeMiss {
            nearest: shown(nearest),
            stated: shown(stated),
        });
    }
    if bound != Bound::Exact {
        return SizeJudgement::Undetermined(Undecided::Bound);
    }
    if (slo..=shi).contains(&point) {
        return SizeJudgement::Met;
    }
    SizeJudgement::Undetermined(Undecided::Spread(seeds_to_decide(
        (point - slo).abs().min((point - shi).abs()),
        s,
        n,
    )))
}

/// The fewest pairs, above `n`, whose 95 % half-width t(0.975, m − 1)·s/√m falls below
/// `gap`; `None` when none up to [`MAX_SEEDS_TO_DECIDE`] does. The half-width falls as m
/// grows, so the count is found by bisection.
fn seeds_to_decide(gap: f64, s: f64, n: usize) -> Option<usize> {
    let decides = |m: usize| {
        let t = t_quantile(0.5 + LEVEL / 2.0, m - 1).expect("m ≥ 2 and p in range");
        t * s / (m as f64).sqrt() < gap
    };
    let (mut lo, mut hi) = (n.max(1), MAX_SEEDS_TO_DECIDE);
    if !decides(hi) {
        return None;
    }
    // decides(hi) holds and lo is below the answer.
    while hi - lo > 1 {
        let mid = lo + (hi - lo) / 2;
        if decides(mid) {
            hi = mid;
        } else {
            lo = mid;
        }
    }
    Some(hi)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn values(xs: &[f64]) -> Vec<Obs> {
        xs.iter().map(|&x| Obs::Value(x)).collect()
    }

    fn std_margin(m: f64) -> Option<Margin> {
        Some(Margin {
            value: m,
            source: MarginSource::PaperStd,
        })
    }

    #[test]
    fn t_quantiles_match_the_tables() {
        for (df, t) in [(1, 12.706), (2, 4.303), (4, 2.776), (9, 2.262), (19, 2.093)] {
            let q = t_quantile(0.975, df).unwrap();
            assert!((q - t).abs() < 5e-4, "df {df}: {q}");
        }
        // df = 1 is the Cauchy distribution: tan(π(p − ½)) exactly.
        let q = t_quantile(0.975, 1).unwrap();
        assert!(
            (q - (std::f64::consts::PI * 0.475).tan()).abs() < 1e-9,
            "{q}"
        );
        // df = 2 has a closed form too: (2p − 1)·√(2 / (4p(1 − p))).
        let p: f64 = 0.9;
        let exact = (2.0 * p - 1.0) * (2.0 / (4.0 * p * (1.0 - p))).sqrt();
        assert!((t_quantile(p, 2).unwrap() - exact).abs() < 1e-9);
        // Large df tends to the normal's 1.959964.
        assert!((t_quantile(0.975, 10_000).unwrap() - 1.960_20).abs() < 1e-4);
    }

    #[test]
    fn bad_quantile_arguments_are_named() {
        assert!(
            t_quantile(0.975, 0)
                .unwrap_err()
                .to_string()
                .contains("`df`")
        );
        assert!(t_quantile(0.4, 3).unwrap_err().to_string().contains("`p`"));
    }

    #[test]
    fn hand_computed_agree_differ_inconclusive() {
        // 10..14: mean 12, s = √2.5, half-width 2.776445·√2.5/√5 = 1.96324.
        let xs = values(&[10.0, 11.0, 12.0, 13.0, 14.0]);
        let j = judge(&xs, 12.0, std_margin(2.5));
        let (lo, hi) = j.interval.unwrap();
        assert!((lo - 10.036_76).abs() < 1e-4 && (hi - 13.963_24).abs() < 1e-4);
        assert_eq!(j.verdict, Verdict::Agrees);
        assert_eq!(j.window, Some((9.5, 14.5)));
        assert_eq!(
            judge(&xs, 12.0, std_margin(1.0)).verdict,
            Verdict::Inconclusive
        );
        assert_eq!(judge(&xs, 20.0, std_margin(2.5)).verdict, Verdict::Differs);
        assert_eq!(judge(&xs, 12.0, None).verdict, Verdict::NoMargin);
    }

    #[test]
    fn three_seeds_are_too_few_even_when_they_match_exactly() {
        let j = judge(&values(&[12.0, 12.0, 12.0]), 12.0, std_margin(5.0));
        assert_eq!(j.verdict, Verdict::TooFewSeeds);
    }

    #[test]
    fn five_seeds_can_exclude_a_paper_value_between_their_min_and_max() {
        // Mean 10.4, s = √0.08, half-width 2.776445·0.28284/√5 = 0.35119: [10.0488, 10.7512]
        // leaves out 10.0, which lies inside [9.9, 10.6].
        let seeds = [9.9, 10.5, 10.5, 10.5, 10.6];
        let j = judge(&values(&seeds), 10.0, std_margin(0.02));
        let (lo, hi) = j.interval.unwrap();
        assert!((lo - 10.048_81).abs() < 1e-4 && (hi - 10.751_19).abs() < 1e-4);
        let min = seeds.iter().copied().fold(f64::INFINITY, f64::min);
        let max = seeds.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        assert!(min < 10.0 && 10.0 < max && lo > 10.0);
        assert_eq!(j.verdict, Verdict::Differs);
    }

    #[test]
    fn any_censored_seed_makes_the_cell_censored() {
        let mut xs = values(&[10.0, 11.0, 12.0, 13.0]);
        xs.push(Obs::Above(500.0));
        let j = judge(&xs, 12.0, std_margin(1000.0));
        assert_eq!(j.verdict, Verdict::Censored);
        assert_eq!((j.censored, j.interval), (1, None));
    }

    #[test]
    fn margins_come_from_the_std_or_half_the_nearest_gap() {
        assert_eq!(margin(10.0, Some(3.0), &[11.0]), std_margin(3.0));
        let m = margin(10.0, None, &[16.0, 7.0, 10.0, 30.0]).unwrap();
        assert_eq!((m.value, m.source), (1.5, MarginSource::HalfNearestGap));
        assert_eq!(margin(10.0, Some(0.0), &[10.0]), None);
    }

    fn exact(a: &[f64], b: &[f64]) -> Vec<(Obs, Obs)> {
        a.iter()
            .zip(b)
            .map(|(&x, &y)| (Obs::Value(x), Obs::Value(y)))
            .collect()
    }

    #[test]
    fn a_claim_needs_the_interval_on_its_side() {
        // a − b = −3, −2, −4, −3, −3: mean −3, s = √0.5, half-width 0.878; p = 2/32.
        let b = [100.0, 90.0, 80.0, 70.0, 60.0];
        let a = [97.0, 88.0, 76.0, 67.0, 57.0];
        let c = claim(&exact(&a, &b), Effect::Difference, Direction::Lower, None).unwrap();
        assert_eq!(c.outcome, ClaimOutcome::Reproduced);
        assert!((c.effect + 3.0).abs() < 1e-12);
        assert!((c.wilcoxon_p.unwrap() - 0.0625).abs() < 1e-12);
        assert_eq!((c.bound, c.both_censored), (Bound::Exact, 0));
        let c = claim(
            &exact(&a[..3], &b[..3]),
            Effect::LogRatio,
            Direction::Lower,
            None,
        )
        .unwrap();
        assert_eq!(c.outcome, ClaimOutcome::TooFewSeeds);
        assert!(
            claim(
                &exact(&[0.0; 5], &b),
                Effect::LogRatio,
                Direction::Lower,
                None
            )
            .is_err()
        );
    }

    /// The four verdicts from one set of differences and its mirror images.
    #[test]
    fn reversed_and_straddling_intervals_are_contradicted_and_not_reproduced() {
        let b = [100.0, 90.0, 80.0, 70.0, 60.0];
        let a = [97.0, 88.0, 76.0, 67.0, 57.0];
        // The interval [−3.88, −2.12] lies below 0: a claim that A is higher is contradicted.
        let c = claim(&exact(&a, &b), Effect::Difference, Direction::Higher, None).unwrap();
        assert_eq!(c.outcome, ClaimOutcome::Contradicted);
        // a − b = −3, +2, −4, +3, −3: mean −1, the interval holds 0.
        let a2 = [97.0, 92.0, 76.0, 73.0, 57.0];
        for dir in [Direction::Lower, Direction::Higher] {
            let c = claim(&exact(&a2, &b), Effect::Difference, dir, None).unwrap();
            assert_eq!(c.outcome, ClaimOutcome::NotReproduced);
            let (lo, hi) = c.interval.unwrap();
            assert!(lo < 0.0 && hi > 0.0);
        }
    }

    /// b/a = 1.25 on every seed but one (1.20, 1.30 around it): the interval of b/a is about
    /// [1.20, 1.30]. A claim of "4.9 % below" (b/a 1.051-1.052) is right in direction and
    /// wrong in size; "1.2-14.1×" is met.
    #[test]
    fn a_stated_size_must_meet_the_interval() {
        let b = [125.0, 250.0, 375.0, 500.0, 625.0];
        let a = [100.0, 200.0, 300.0, 416.0, 480.0];
        let pairs = exact(&a, &b);
        let small = Size::new(1.051, 1.052, Effect::LogRatio, Direction::Lower).unwrap();
        let c = claim(&pairs, Effect::LogRatio, Direction::Lower, Some(small)).unwrap();
        assert_eq!(c.outcome, ClaimOutcome::DirectionOnly);
        let Some(SizeJudgement::Missed(m)) = c.size else {
            panic!("{:?}", c.size)
        };
        // The interval of ln(a/b) lies below the stated range's: its upper end is b/a's lower.
        let (_, hi) = c.interval.unwrap();
        assert!((m.nearest - (-hi).exp()).abs() < 1e-12 && (m.stated - 1.052).abs() < 1e-12);
        assert!(m.nearest > m.stated, "{m:?}");
        let range = Size::new(1.2, 14.1, Effect::LogRatio, Direction::Lower).unwrap();
        let c = claim(&pairs, Effect::LogRatio, Direction::Lower, Some(range)).unwrap();
        assert_eq!(
            (c.outcome, c.size),
            (ClaimOutcome::Reproduced, Some(SizeJudgement::Met))
        );
        // Above the stated range: a − b of +0.05 against a claimed +0.001 to +0.01.
        let up = [0.80, 0.81, 0.79, 0.80, 0.80];
        let down = [0.75, 0.76, 0.74, 0.75, 0.75];
        let s = Size::new(0.001, 0.01, Effect::Difference, Direction::Higher).unwrap();
        let c = claim(
            &exact(&up, &down),
            Effect::Difference,
            Direction::Higher,
            Some(s),
        )
        .unwrap();
        assert_eq!(c.outcome, ClaimOutcome::DirectionOnly);
        assert!(matches!(c.size, Some(SizeJudgement::Missed(m)) if m.stated == 0.01));
        // A size on the wrong side, or upside down, is refused.
        assert!(Size::new(0.5, 0.9, Effect::LogRatio, Direction::Lower).is_err());
        assert!(Size::new(0.02, 0.01, Effect::Difference, Direction::Higher).is_err());
        assert!(Size::new(-0.02, -0.01, Effect::Difference, Direction::Higher).is_err());
    }

    /// A point outside the range with an interval that still meets it decides nothing: a
    /// wide interval no longer "meets the size". b/a = 2.0 on four seeds and 1.25 on a fifth:
    /// ln(b/a) has mean 0.599, s = 0.210, half-width 2.776·0.210/√5 = 0.261, so b/a's
    /// interval is about [1.41, 2.36]; a stated 2.45-2.55 lies outside it (missed) and a
    /// stated 2.2-2.6 inside it but away from the point (undetermined, with the seeds that
    /// would tell at this spread: the first m with t(0.975, m − 1)·0.210/√m below
    /// ln 2.2 − 0.599 = 0.189: at m = 7, 2.447·0.210/√7 = 0.194; at m = 8, 2.365·0.210/√8 =
    /// 0.176, so 8).
    #[test]
    fn sizes_are_met_missed_or_undetermined_with_the_seeds_that_would_tell() {
        let b = [200.0, 200.0, 200.0, 200.0, 125.0];
        let a = [100.0; 5];
        let pairs = exact(&a, &b);
        let size = |lo, hi| Some(Size::new(lo, hi, Effect::LogRatio, Direction::Lower).unwrap());
        let c = claim(&pairs, Effect::LogRatio, Direction::Lower, size(2.45, 2.55)).unwrap();
        assert_eq!(c.outcome, ClaimOutcome::DirectionOnly);
        let c = claim(&pairs, Effect::LogRatio, Direction::Lower, size(2.2, 2.6)).unwrap();
        assert_eq!(c.outcome, ClaimOutcome::SizeUndetermined);
        assert_eq!(
            c.size,
            Some(SizeJudgement::Undetermined(Undecided::Spread(Some(8))))
        );
        let c = claim(&pairs, Effect::LogRatio, Direction::Lower, size(1.5, 1.9)).unwrap();
        assert_eq!(
            (c.outcome, c.size),
            (ClaimOutcome::Reproduced, Some(SizeJudgement::Met))
        );
        // A point a hair's breadth outside the range takes more seeds than any run would.
        let point = (-c.effect).exp();
        let c = claim(
            &pairs,
            Effect::LogRatio,
            Direction::Lower,
            size(point * 1.000_001, 3.0),
        )
        .unwrap();
        assert_eq!(
            c.size,
            Some(SizeJudgement::Undetermined(Undecided::Spread(None)))
        );
    }

    /// A censored arm's bound supports a verdict in its own direction only. With A censored
    /// at its bound in one pair, the true ln(a/b) is at least what is shown: an interval
    /// below 0 shows neither side, an interval above 0 shows A higher.
    #[test]
    fn a_bound_supports_only_its_own_direction() {
        use Obs::{Above, Value};
        let four: Vec<(Obs, Obs)> = [(50.0, 100.0), (60.0, 110.0), (55.0, 90.0), (70.0, 120.0)]
            .iter()
            .map(|&(x, y)| (Value(x), Value(y)))
            .collect();
        let with = |last: (Obs, Obs), flip: bool| -> Vec<(Obs, Obs)> {
            let mut v = four.clone();
            v.push(last);
            if flip {
                v.iter_mut().for_each(|p| *p = (p.1, p.0));
            }
            v
        };
        let test = |pairs: &[(Obs, Obs)], dir, size: Option<(f64, f64)>| {
            let size = size.map(|(lo, hi)| Size::new(lo, hi, Effect::LogRatio, dir).unwrap());
            claim(pairs, Effect::LogRatio, dir, size).unwrap()
        };
        use ClaimOutcome::*;
        use Direction::{Higher, Lower};
        // A lower on every seed, A censored in one: the bound points up, the interval down.
        let a_cut = with((Above(65.0), Value(130.0)), false);
        for dir in [Lower, Higher] {
            let c = test(&a_cut, dir, None);
            assert_eq!((c.bound, c.outcome), (Bound::AtLeast, BoundUndetermined));
        }
        // A higher on every seed, A censored in one: the bound and the interval agree.
        let a_cut_up = with((Value(65.0), Above(130.0)), true);
        assert_eq!(test(&a_cut_up, Higher, None).outcome, Reproduced);
        assert_eq!(test(&a_cut_up, Lower, None).outcome, Contradicted);
        // A lower, B censored in one: at most what is shown, so A lower holds. b/a is then at
        // least what is shown (about [1.6, 2.0]): a size below the interval is missed, one
        // that meets it or lies above it undetermined.
        let b_cut = with((Value(65.0), Above(130.0)), false);
        let c = test(&b_cut, Lower, None);
        assert_eq!((c.bound, c.outcome), (Bound::AtMost, Reproduced));
        assert_eq!(test(&b_cut, Lower, Some((1.2, 1.3))).outcome, DirectionOnly);
        let c = test(&b_cut, Lower, Some((1.5, 2.5)));
        assert_eq!(
            (c.outcome, c.size),
            (
                SizeUndetermined,
                Some(SizeJudgement::Undetermined(Undecided::Bound))
            )
        );
        assert_eq!(
            test(&b_cut, Lower, Some((3.0, 4.0))).outcome,
            SizeUndetermined
        );
        // Each arm censored in some pair: no side at all.
        let mut both = b_cut.clone();
        both[0] = (Above(50.0), Value(100.0));
        let c = test(&both, Lower, None);
        assert_eq!((c.bound, c.outcome), (Bound::Neither, BoundUndetermined));
    }

    /// Pairs with both arms censored say nothing about which is faster: left out and counted;
    /// one censored arm makes the effect a bound.
    #[test]
    fn censored_pairs_are_left_out_or_make_a_bound() {
        use Obs::{Above, Value};
        let all = vec![(Above(200.0), Above(200.0)); 10];
        let c = claim(&all, Effect::LogRatio, Direction::Lower, None).unwrap();
        assert_eq!((c.n, c.both_censored), (0, 10));
        assert_eq!(c.outcome, ClaimOutcome::TooFewInformative);
        assert_eq!(c.wilcoxon_p, None);
        // Six informative pairs, B censored in two: the effect is at most what is shown.
        let mut pairs = vec![
            (Value(50.0), Value(100.0)),
            (Value(60.0), Value(110.0)),
            (Value(55.0), Value(90.0)),
            (Value(70.0), Value(120.0)),
            (Value(65.0), Above(200.0)),
            (Value(52.0), Above(200.0)),
        ];
        pairs.extend(vec![(Above(200.0), Above(200.0)); 4]);
        let c = claim(&pairs, Effect::LogRatio, Direction::Lower, None).unwrap();
        assert_eq!((c.n, c.both_censored, c.b_censored), (6, 4, 2));
        assert_eq!(
            (c.bound, c.outcome),
            (Bound::AtMost, ClaimOutcome::Reproduced)
        );
        // Four informative pairs are below the minimum once the censored ones are gone.
        let c = claim(&pairs[2..], Effect::LogRatio, Direction::Lower, None).unwrap();
        assert_eq!(c.outcome, ClaimOutcome::TooFewInformative);
        pairs[0] = (Above(200.0), Value(100.0));
        let c = claim(&pairs, Effect::LogRatio, Direction::Lower, None).unwrap();
        assert_eq!(c.bound, Bound::Neither);
    }

    #[test]
    fn every_setting_must_hold_for_the_claim_to() {
        use ClaimOutcome::*;
        assert_eq!(
            ClaimOutcome::all_of(&[Reproduced, Reproduced]),
            Some(Reproduced)
        );
        assert_eq!(
            ClaimOutcome::all_of(&[Reproduced, DirectionOnly]),
            Some(DirectionOnly)
        );
        assert_eq!(
            ClaimOutcome::all_of(&[Reproduced, NotReproduced, Contradicted]),
            Some(Contradicted)
        );
        assert_eq!(
            ClaimOutcome::all_of(&[TooFewInformative, NotReproduced]),
            Some(NotReproduced)
        );
        assert_eq!(ClaimOutcome::all_of(&[]), None);
    }
}
