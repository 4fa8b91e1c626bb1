//! Links from the report to each run's experiment-tracker record (the TensorBoard event
//! files its `[output]` named). It reads each run's resolved config for that directory and
//! nothing else of the run.

use std::fmt::Write as _;

use super::*;

/// The TensorBoard directory the run in `dir` wrote its event files to: its resolved
/// config's `[output] tensorboard` (a sweep records each cell's own, absolute); `None`
/// when the run asked for none or never started. A path recorded relative is taken as
/// relative to the working directory, as the run took it.
pub(super) fn tracker_dir(dir: &Path) -> Result<Option<std::path::PathBuf>> {
    let path = dir.join("config.resolved.toml");
    let text = match std::fs::read_to_string(&path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(source) => {
            return Err(Error::Output {
                path,
                error: source,
            });
        }
    };
    let table: toml::Table = text.parse().map_err(|e| bad(&path, e))?;
    let Some(tb) = table
        .get("output")
        .and_then(|o| o.get("tensorboard"))
        .and_then(toml::Value::as_str)
    else {
        return Ok(None);
    };
    std::path::absolute(tb)
        .map(Some)
        .map_err(|source| Error::Output {
            path,
            error: source,
        })
}

/// The report's section linking each run's TensorBoard directory: a link relative to
/// `out`, the report's directory, where the events lie inside it (so the link survives
/// moving the whole directory), else the absolute path. Empty when no run wrote events.
pub(super) fn trackers_section(
    trackers: &[(String, std::path::PathBuf)],
    out: &Path,
) -> Result<String> {
    let Some((_, first)) = trackers.first() else {
        return Ok(String::new());
    };
    let out = std::path::absolute(out).map_err(|source| Error::Output {
        path: out.to_path_buf(),
        error: source,
    })?;
    let mut md = String::from("\n## TensorBoard\n\nEach run's event files");
    // A sweep's cells share one parent: TensorBoard shows them side by side from there.
    if let Some(parent) = first.parent()
        && trackers.iter().all(|(_, t)| t.parent() == Some(parent))
    {
        let _ = write!(md, " (`tensorboard --logdir {}`)", parent.display());
    }
    md.push_str(":\n\n");
    for (label, dir) in trackers {
        let shown = match dir.strip_prefix(&out) {
            Ok(rel) => {
                let parts: Vec<String> = rel
                    .components()
                    .map(|c| url_escape(&c.as_os_str().to_string_lossy()))
                    .collect();
                format!("[{}]({})", rel.display(), parts.join("/"))
            }
            Err(_) => format!("`{}`", dir.display()),
        };
        let missing = if dir.is_dir() { "" } else { " (not found)" };
        let _ = writeln!(md, "- `{label}`: {shown}{missing}");
    }
    Ok(md)
}

/// `s` with every byte outside RFC 3986's unreserved characters percent-encoded, so that
/// a path with spaces or parentheses stays one Markdown link target.
pub(super) fn url_escape(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => {
                char::from(b).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}
