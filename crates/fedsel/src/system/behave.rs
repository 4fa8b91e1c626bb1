//! When a client is online on the virtual clock: one entry of FedScale's
//! `client_behave_trace`, a list of online intervals repeated every `finish_time` seconds.
//!
//! FedScale's `ClientMetadata.is_active` reduces the time modulo `finish_time` and tests
//! `active[i] ≤ t ≤ inactive[i]` (both ends included) for one interval, behind a cursor
//! that moves forward by at most one interval per query, so a client asked about rarely
//! can be reported offline inside a later interval. Here every interval is tested (a
//! binary search), so the answer depends on the time alone, not on the order of queries.

/// One client's online intervals, `[active[i], inactive[i]]`, cycled over `finish_s`.
#[derive(Debug, Clone, PartialEq)]
pub struct Activity {
    active: Vec<f64>,
    inactive: Vec<f64>,
    finish_s: f64,
}

impl Activity {
    /// Checks an entry: the two lists as long as each other and not empty, every time
    /// finite and ≥ 0, the intervals in order without overlap, each starting inside the
    /// cycle (one that starts at or after `finish_s` is never reached), and `finish_s`
    /// finite and > 0. The error names the offending key of the entry.
    pub fn new(
        active: Vec<f64>,
        inactive: Vec<f64>,
        finish_s: f64,
    ) -> std::result::Result<Self, String> {
        if !(finish_s.is_finite() && finish_s > 0.0) {
            return Err(format!("`finish_time` is {finish_s}, not finite and > 0"));
        }
        if active.is_empty() || active.len() != inactive.len() {
            return Err(format!(
                "`active` has {} times and `inactive` {}: they must pair up, at least one each",
                active.len(),
                inactive.len()
            ));
        }
        for (key, times) in [("active", &active), ("inactive", &inactive)] {
            if let Some(t) = times.iter().find(|t| !(t.is_finite() && **t >= 0.0)) {
                return Err(format!("`{key}` holds {t}, not a finite time ≥ 0"));
            }
        }
        for i in 0..active.len() {
            let (start, end) = (active[i], inactive[i]);
            if start > end || (i > 0 && start < inactive[i - 1]) {
                return Err(format!(
                    "interval {i} [`active` {start}, `inactive` {end}] is out of order"
                ));
            }
            if start >= finish_s {
                return Err(format!(
                    "`active` {start} is at or after `finish_time` {finish_s}: never reached"
                ));
            }
        }
        Ok(Self {
            active,
            inactive,
            finish_s,
        })
    }

    /// The time within the cycle, and the first interval that does not end before it.
    fn locate(&self, t: f64) -> (f64, usize) {
        let x = t.rem_euclid(self.finish_s);
        (x, self.inactive.partition_point(|&end| end < x))
    }

    /// Whether the client is online at virtual second `t`.
    pub fn is_active(&self, t: f64) -> bool {
        let (x, i) = self.locate(t);
        i < self.active.len() && self.active[i] <= x
    }

    /// The next virtual second after `t` at which the client changes state: the end of
    /// its interval if it is online at `t` (`t` itself at the interval's last instant),
    /// else the start of its next interval.
    pub fn next_change(&self, t: f64) -> f64 {
        let (x, i) = self.locate(t);
        match self.active.get(i) {
            Some(&start) if start <= x => t + (self.inactive[i] - x),
            _ => self.next_active(t),
        }
    }

    /// The first virtual second ≥ `t` at which the client is online: `t` itself if it is,
    /// else the start of its next interval, in this cycle or the next.
    pub fn next_active(&self, t: f64) -> f64 {
        let (x, i) = self.locate(t);
        match self.active.get(i) {
            Some(&start) if start <= x => t,
            Some(&start) => t + (start - x),
            None => t + (self.finish_s - x) + self.active[0],
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Online during [0, 50] and [100, 150] of every 200 s.
    fn two_intervals() -> Activity {
        Activity::new(vec![0.0, 100.0], vec![50.0, 150.0], 200.0).unwrap()
    }

    #[test]
    fn activity_is_cycled_over_the_finish_time_with_both_ends_included() {
        let a = two_intervals();
        for (t, online) in [
            (0.0, true),
            (50.0, true),
            (60.0, false),
            (99.9, false),
            (100.0, true),
            (120.0, true),
            (150.0, true),
            (150.5, false),
            (199.0, false),
            (200.0, true),
            (260.0, false),
            (320.0, true),
            (1_000_060.0, false),
        ] {
            assert_eq!(a.is_active(t), online, "t = {t}");
        }
    }

    #[test]
    fn the_next_change_is_the_interval_end_online_and_the_next_start_offline() {
        let a = two_intervals();
        assert_eq!(a.next_change(20.0), 50.0);
        assert_eq!(a.next_change(60.0), 100.0);
        assert_eq!(a.next_change(120.0), 150.0);
        assert_eq!(a.next_change(170.0), 200.0);
        assert_eq!(a.next_change(420.0), 450.0);
    }

    #[test]
    fn the_next_online_time_is_now_or_the_next_interval_start() {
        let a = two_intervals();
        assert_eq!(a.next_active(20.0), 20.0);
        assert_eq!(a.next_active(60.0), 100.0);
        assert_eq!(a.next_active(170.0), 200.0);
        assert_eq!(a.next_active(460.0), 500.0);
        // An interval that starts late in the cycle: from 5 s into the cycle the next
        // start is 190 s; from 195 s (past the interval's end at 192) it is 190 s into the
        // next cycle.
        let late = Activity::new(vec![190.0], vec![192.0], 200.0).unwrap();
        assert_eq!(late.next_active(5.0), 190.0);
        assert_eq!(late.next_active(195.0), 390.0);
        assert!(late.is_active(late.next_active(195.0)));
    }

    #[test]
    fn a_malformed_entry_names_its_key() {
        for (active, inactive, finish, want) in [
            (vec![0.0], vec![1.0], 0.0, "`finish_time` is 0"),
            (vec![0.0], vec![1.0], f64::NAN, "`finish_time` is NaN"),
            (vec![], vec![], 10.0, "`active` has 0 times"),
            (
                vec![0.0, 5.0],
                vec![1.0],
                10.0,
                "`active` has 2 times and `inactive` 1",
            ),
            (vec![-1.0], vec![1.0], 10.0, "`active` holds -1"),
            (vec![0.0], vec![f64::INFINITY], 10.0, "`inactive` holds inf"),
            (
                vec![3.0],
                vec![1.0],
                10.0,
                "interval 0 [`active` 3, `inactive` 1]",
            ),
            (vec![0.0, 2.0], vec![4.0, 5.0], 10.0, "interval 1"),
            (vec![12.0], vec![14.0], 10.0, "`active` 12 is at or after"),
        ] {
            let e = Activity::new(active, inactive, finish).unwrap_err();
            assert!(e.contains(want), "{e} lacks {want}");
        }
    }
}
