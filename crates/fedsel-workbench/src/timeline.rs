//! Accuracy over virtual time as the report's figure shows it, computed apart from the
//! drawing so that what the figure covers can be checked.
//!
//! Each seed's accuracy is a step function of its own clock: the accuracy of its last
//! evaluation so far (what the server holds at that time), from its first evaluation to the
//! end of its run. The seeds of one arm can run for very different times (devices are drawn
//! per data seed, and clocks 40x apart happen): the span that all of them cover can be
//! empty, and cutting every seed at the earliest end hides where the others go. So each
//! seed is drawn over its own range, and the arm's mean ± std over the seeds that have an
//! evaluation and still run, only where at least half of its seeds do (beyond that the mean
//! would follow the few slowest seeds). A marker shows each arm's median time to each
//! target, as the time-to-target table gives it, and the x axis reaches every seed's end
//! and every marker.

use crate::stats::{self, Median, Obs, mean_std};

/// One seed's run on the virtual clock.
#[derive(Debug, Clone, PartialEq)]
pub struct SeedClock {
    /// (virtual seconds at the end of the round, test accuracy) of every evaluated round,
    /// in order; at least one.
    pub evals: Vec<(f64, f64)>,
    /// The virtual seconds at the end of the run.
    pub end_s: f64,
    /// Each target accuracy and the virtual seconds to it (`None`: never reached).
    pub to_target: Vec<(f64, Option<f64>)>,
}

/// The seeds of one arm.
#[derive(Debug, Clone, PartialEq)]
pub struct ArmClocks {
    /// Legend entry.
    pub label: String,
    /// Its seeds; at least one.
    pub seeds: Vec<SeedClock>,
}

/// An arm's median time to one target.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Marker {
    /// The target accuracy (the marker's height).
    pub target: f64,
    /// The median time, in the figure's unit.
    pub x: f64,
    /// Half the seeds or more never reached the target: the median is only known to be
    /// above `x`.
    pub censored: bool,
}

/// What the figure draws of one arm.
#[derive(Debug, Clone, PartialEq)]
pub struct ArmTimeline {
    /// Legend entry.
    pub label: String,
    /// Each seed's steps (time in the figure's unit, accuracy), from its first evaluation to
    /// its end.
    pub seeds: Vec<Vec<(f64, f64)>>,
    /// The band's pieces, each a run of (time, mean, std) steps over which at least half of
    /// the seeds have an evaluation and still run; none elsewhere.
    pub band: Vec<Vec<(f64, f64, f64)>>,
    /// The median time to each target.
    pub markers: Vec<Marker>,
}

/// The accuracy-over-virtual-time figure of one setting.
#[derive(Debug, Clone, PartialEq)]
pub struct Timeline {
    /// The x axis's unit: its name and its length in seconds.
    pub unit: (&'static str, f64),
    /// The end of the x axis, in `unit`: the latest end of any seed (every marker lies
    /// before it).
    pub x_max: f64,
    /// One entry per arm, in the order given.
    pub arms: Vec<ArmTimeline>,
}

/// Seconds in an hour.
pub const HOUR_S: f64 = 3600.0;

/// A seed's accuracy at `t` seconds: that of its last evaluation at or before `t`.
fn at(seed: &SeedClock, t: f64) -> f64 {
    seed.evals[seed.evals.partition_point(|e| e.0 <= t).max(1) - 1].1
}

/// A seed's steps from its first evaluation to its end, in seconds.
fn steps(seed: &SeedClock) -> Vec<(f64, f64)> {
    let mut out: Vec<(f64, f64)> = Vec::new();
    for &(t, a) in &seed.evals {
        if let Some(&(_, before)) = out.last() {
            out.push((t, before));
        }
        out.push((t, a));
    }
    let (last_t, last_a) = seed.evals[seed.evals.len() - 1];
    if seed.end_s > last_t {
        out.push((seed.end_s, last_a));
    }
    out
}

/// The band of an arm, in seconds: between consecutive times at which a seed is evaluated
/// or ends, the mean ± std over the seeds evaluated by then and not ended before the next,
/// where they are at least half of the arm's seeds.
fn band(seeds: &[SeedClock]) -> Vec<Vec<(f64, f64, f64)>> {
    let mut times: Vec<f64> = seeds
        .iter()
        .flat_map(|s| s.evals.iter().map(|e| e.0).chain([s.end_s]))
        .collect();
    times.sort_by(f64::total_cmp);
    times.dedup();
    let mut pieces: Vec<Vec<(f64, f64, f64)>> = Vec::new();
    let mut current: Vec<(f64, f64, f64)> = Vec::new();
    for w in times.windows(2) {
        let (from, to) = (w[0], w[1]);
        let running: Vec<f64> = seeds
            .iter()
            .filter(|s| s.evals[0].0 <= from && s.end_s >= to)
            .map(|s| at(s, from))
            .collect();
        if 2 * running.len() >= seeds.len() {
            let (m, sd) = mean_std(&running);
            current.extend([(from, m, sd), (to, m, sd)]);
        } else if !current.is_empty() {
            pieces.push(std::mem::take(&mut current));
        }
    }
    if !current.is_empty() {
        pieces.push(current);
    }
    pieces
}

/// An arm's median seconds to target `ti`, each seed censored at its own end; `None` when a
/// seed has no such target.
fn median_to_target(seeds: &[SeedClock], ti: usize) -> Option<(f64, f64, bool)> {
    let obs = seeds
        .iter()
        .map(|s| {
            let (target, t) = *s.to_target.get(ti)?;
            Some((target, t.map_or(Obs::Above(s.end_s), Obs::Value)))
        })
        .collect::<Option<Vec<_>>>()?;
    let target = obs[0].0;
    let obs: Vec<Obs> = obs.into_iter().map(|o| o.1).collect();
    Some(match stats::seed_stats(&obs).median {
        Median::Value(m) => (target, m, false),
        Median::Above(b) => (target, b, true),
    })
}

/// The figure's data for `arms` (each with at least one seed, each seed with at least one
/// evaluation): every seed's steps, each arm's band where at least half of its seeds run,
/// each arm's median time to each target, in a unit in which the axis spans at least ten
/// (hours, minutes or seconds) so that its whole-number ticks are distinct.
pub fn timeline(arms: &[ArmClocks]) -> Timeline {
    let longest = arms
        .iter()
        .flat_map(|a| &a.seeds)
        .map(|s| s.end_s.max(s.evals[s.evals.len() - 1].0))
        .fold(0.0, f64::max);
    let unit = [("hours", HOUR_S), ("minutes", 60.0)]
        .into_iter()
        .find(|u| longest >= 10.0 * u.1)
        .unwrap_or(("seconds", 1.0));
    let scale = |x: f64| x / unit.1;
    let arms: Vec<ArmTimeline> = arms
        .iter()
        .map(|arm| {
            let targets = arm.seeds.iter().map(|s| s.to_target.len()).max();
            ArmTimeline {
                label: arm.label.clone(),
                seeds: arm
                    .seeds
                    .iter()
                    .map(|s| steps(s).into_iter().map(|(t, a)| (scale(t), a)).collect())
                    .collect(),
                band: band(&arm.seeds)
                    .into_iter()
                    .map(|p| p.into_iter().map(|(t, m, s)| (scale(t), m, s)).collect())
                    .collect(),
                markers: (0..targets.unwrap_or(0))
                    .filter_map(|ti| median_to_target(&arm.seeds, ti))
                    .map(|(target, t, censored)| Marker {
                        target,
                        x: scale(t),
                        censored,
                    })
                    .collect(),
            }
        })
        .collect();
    let x_max = arms
        .iter()
        .flat_map(|a| {
            let ends = a.seeds.iter().filter_map(|s| s.last().map(|p| p.0));
            ends.chain(a.markers.iter().map(|m| m.x))
        })
        .fold(scale(longest), f64::max);
    Timeline { unit, x_max, arms }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seed(evals: &[(f64, f64)], end_s: f64, reached: Option<f64>) -> SeedClock {
        SeedClock {
            evals: evals.to_vec(),
            end_s,
            to_target: vec![(0.5, reached)],
        }
    }

    /// Oort's seeds as they were reported: one first evaluated at 1,530 s, after two other
    /// seeds had ended (1,302 s and 1,400 s), and two long runs. No span is common to all
    /// five, yet every seed is drawn to its end, the band is drawn exactly where at least
    /// three of the five run, and the x axis reaches the median time to the target and the
    /// longest run.
    #[test]
    fn seeds_keep_their_range_and_the_band_needs_half_of_them() {
        let seeds = vec![
            seed(&[(300.0, 0.3), (900.0, 0.5)], 1302.0, Some(900.0)),
            seed(&[(400.0, 0.2), (1000.0, 0.5)], 1400.0, Some(1000.0)),
            seed(&[(1530.0, 0.1), (3000.0, 0.6)], 3600.0, Some(3000.0)),
            seed(&[(200.0, 0.2), (2000.0, 0.5)], 30000.0, Some(2000.0)),
            seed(&[(250.0, 0.1), (5000.0, 0.55)], 100800.0, Some(5000.0)),
        ];
        let tl = timeline(&[ArmClocks {
            label: "oort".into(),
            seeds: seeds.clone(),
        }]);
        assert_eq!(tl.unit, ("hours", 3600.0));
        assert_eq!(tl.x_max, 28.0);
        let arm = &tl.arms[0];
        // Each seed from its first evaluation to its end, holding its last accuracy.
        assert_eq!(arm.seeds[0][0], (300.0 / 3600.0, 0.3));
        assert_eq!(arm.seeds[4].last(), Some(&(28.0, 0.55)));
        assert_eq!(arm.seeds[2][0].0, 1530.0 / 3600.0);
        // The band: from 300 s, when the third seed is evaluated, to 1,400 s, when the
        // second of them ends; then from 1,530 s to 3,600 s; never beyond.
        let spans: Vec<(f64, f64)> = arm
            .band
            .iter()
            .map(|p| (p[0].0 * 3600.0, p[p.len() - 1].0 * 3600.0))
            .collect();
        let close = |a: f64, b: f64| (a - b).abs() < 1e-9;
        assert_eq!(spans.len(), 2, "{spans:?}");
        assert!(
            close(spans[0].0, 300.0) && close(spans[0].1, 1400.0),
            "{spans:?}"
        );
        assert!(
            close(spans[1].0, 1530.0) && close(spans[1].1, 3600.0),
            "{spans:?}"
        );
        for (t, m, _) in arm.band.iter().flatten() {
            let t = t * 3600.0;
            let running = seeds
                .iter()
                .filter(|s| s.evals[0].0 <= t && s.end_s >= t)
                .count();
            assert!(2 * running >= seeds.len(), "{running} run at {t} s");
            assert!((0.0..=1.0).contains(m));
        }
        // 300 s to 400 s: seeds 1, 4 and 5 run, at 0.3, 0.2 and 0.1.
        let first = arm.band[0][0];
        assert!(close(first.1, 0.2) && close(first.2, 0.1), "{first:?}");
        // Median seconds to 50 %: 900, 1000, 2000, 3000, 5000: 2000 s, exact.
        assert_eq!(arm.markers.len(), 1);
        let m = arm.markers[0];
        assert!(close(m.x * 3600.0, 2000.0) && !m.censored && m.target == 0.5);
        for arm in &tl.arms {
            for m in &arm.markers {
                assert!(m.x <= tl.x_max);
            }
        }
    }

    /// When half the seeds never reach the target, the marker is the bound and says so,
    /// and the axis still reaches it; a short run keeps the axis in seconds.
    #[test]
    fn a_censored_median_is_marked_at_its_bound() {
        let tl = timeline(&[
            ArmClocks {
                label: "uniform".into(),
                seeds: vec![
                    seed(&[(10.0, 0.6)], 20.0, Some(10.0)),
                    seed(&[(10.0, 0.2)], 50.0, None),
                ],
            },
            ArmClocks {
                label: "oort".into(),
                seeds: vec![seed(&[(5.0, 0.7)], 8.0, Some(5.0))],
            },
        ]);
        assert_eq!(tl.unit, ("seconds", 1.0));
        assert_eq!(
            tl.arms[0].markers,
            [Marker {
                target: 0.5,
                x: 50.0,
                censored: true
            }]
        );
        assert_eq!(tl.x_max, 50.0);
        assert_eq!(tl.arms[1].markers[0].x, 5.0);
        // Two seeds: one running is half; the band lasts to the later end.
        assert_eq!(tl.arms[0].band.len(), 1);
        assert_eq!(tl.arms[0].band[0].last().unwrap().0, 50.0);
    }
}
