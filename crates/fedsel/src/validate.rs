//! The checks every part of a config's validation shares: each names the key it refuses,
//! so a bad value is an error that says which one. They sit below the config schema and
//! the strategies' and availability models' own options, which all call them.

use crate::error::ConfigError;

/// `Ok` when `ok`, else the error naming `key` with `reason`.
pub fn check(ok: bool, key: &str, reason: impl Into<String>) -> Result<(), ConfigError> {
    if ok {
        Ok(())
    } else {
        Err(ConfigError::invalid(key, reason))
    }
}

/// `x` must lie in the unit interval, each end open or closed as asked.
pub fn check_prob(x: f64, key: &str, lo_open: bool, hi_open: bool) -> Result<(), ConfigError> {
    let lo = if lo_open { x > 0.0 } else { x >= 0.0 };
    let hi = if hi_open { x < 1.0 } else { x <= 1.0 };
    check(
        x.is_finite() && lo && hi,
        key,
        format!(
            "{x} is outside {}0, 1{}",
            if lo_open { "(" } else { "[" },
            if hi_open { ")" } else { "]" }
        ),
    )
}

/// `x` must be finite and > 0.
pub fn check_pos(x: f64, key: &str) -> Result<(), ConfigError> {
    check(x.is_finite() && x > 0.0, key, format!("{x} must be > 0"))
}
