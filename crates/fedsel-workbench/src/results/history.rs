//! The repository's history through git: what [`super::registration`] asks of it (when a
//! claim's test and its arms' configs stood as they do) and what [`super::check`] reads (which
//! commits changed a section's code). It runs git; it judges nothing.

use super::*;

/// The repository holding a results directory, through git: what [`registration::provenance`]
/// asks of its history.
pub struct Git {
    root: PathBuf,
    claims: PathBuf,
}

impl Git {
    /// The repository holding `dir`; `Err` says why its history cannot date the claims: no
    /// git, no repository, or a shallow clone (whose oldest commit would pass for the one
    /// that added every claim).
    pub fn open(dir: &Path) -> std::result::Result<Git, String> {
        let root = git(dir, &["rev-parse", "--show-toplevel"]).map_err(|e| e.to_string())?;
        let root =
            std::fs::canonicalize(root.trim()).map_err(|e| format!("{}: {e}", root.trim()))?;
        let shallow =
            git(&root, &["rev-parse", "--is-shallow-repository"]).map_err(|e| e.to_string())?;
        if shallow.trim() == "true" {
            return Err(format!(
                "{} is a shallow clone: fetch its whole history (`git fetch --unshallow`)",
                root.display()
            ));
        }
        let claims = std::fs::canonicalize(dir)
            .map_err(|e| format!("{}: {e}", dir.display()))?
            .join(claims::CLAIMS_DIR);
        Ok(Git { root, claims })
    }

    /// `path` (inside the checkout) as `commit` had it; `None` where it had no such file.
    pub(super) fn show(&self, commit: &str, path: &str) -> Option<String> {
        git(&self.root, &["show", &format!("{commit}:{path}")]).ok()
    }
}

impl registration::History for Git {
    fn first_adding(&self, needle: &str) -> std::result::Result<Option<String>, String> {
        let path = self.claims.to_string_lossy();
        let out = git(
            &self.root,
            &[
                "log",
                "--format=%H",
                "--reverse",
                "-S",
                needle,
                "--",
                path.as_ref(),
            ],
        )
        .map_err(|e| e.to_string())?;
        Ok(out.lines().next().map(str::to_string))
    }

    fn versions(&self, file: &Path) -> std::result::Result<Vec<(String, Option<String>)>, String> {
        let file = std::fs::canonicalize(file).map_err(|e| format!("{}: {e}", file.display()))?;
        let inside = file
            .strip_prefix(&self.root)
            .map_err(|_| format!("{} is outside {}", file.display(), self.root.display()))?
            .to_string_lossy()
            .into_owned();
        let commits = git(
            &self.root,
            &["log", "--format=%H", "--reverse", "--", &inside],
        )
        .map_err(|e| e.to_string())?;
        Ok(commits
            .lines()
            .map(|c| (c.to_string(), self.show(c, &inside)))
            .collect())
    }

    fn file_at(&self, commit: &str, path: &str) -> Option<String> {
        self.show(commit, path)
    }

    fn first_recorded(&self) -> std::result::Result<BTreeMap<String, String>, String> {
        let results = self
            .claims
            .parent()
            .map(|p| p.to_string_lossy().into_owned())
            .unwrap_or_default();
        let log = git(
            &self.root,
            &[
                "log",
                "-p",
                "--reverse",
                "--format=commit %H",
                "--",
                &results,
            ],
        )
        .map_err(|e| e.to_string())?;
        let mut first = BTreeMap::new();
        let mut commit = "";
        for line in log.lines() {
            if let Some(c) = line.strip_prefix("commit ") {
                commit = c;
            } else if let Some(row) = line.strip_prefix('+') {
                let hash = row.rsplit(',').next().unwrap_or("");
                if hash.len() == 64 && hash.bytes().all(|b| b.is_ascii_hexdigit()) {
                    first
                        .entry(hash.to_string())
                        .or_insert_with(|| commit.to_string());
                }
            }
        }
        Ok(first)
    }

    fn changed(
        &self,
        since: &str,
        commit: &str,
        paths: &[String],
    ) -> std::result::Result<Vec<String>, String> {
        let range = format!("{since}..{commit}");
        let mut args = vec!["log", "--format=", "--name-only", range.as_str(), "--"];
        args.extend(paths.iter().map(String::as_str));
        let out = git(&self.root, &args).map_err(|e| e.to_string())?;
        let changed: BTreeSet<String> = out
            .lines()
            .filter(|l| !l.is_empty())
            .map(str::to_string)
            .collect();
        Ok(changed.into_iter().collect())
    }

    fn is_ancestor(&self, ancestor: &str, commit: &str) -> std::result::Result<bool, String> {
        let out = std::process::Command::new("git")
            .arg("-C")
            .arg(&self.root)
            .args(["merge-base", "--is-ancestor", ancestor, commit])
            .output()
            .map_err(|e| format!("git: {e}"))?;
        match out.status.code() {
            Some(0) => Ok(true),
            Some(1) => Ok(false),
            _ => Err(format!(
                "git merge-base --is-ancestor {ancestor} {commit}: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            )),
        }
    }
}

/// Runs git in `dir` and returns its standard output; an error carries git's message.
pub(super) fn git(dir: &Path, args: &[&str]) -> Result<String> {
    let out = std::process::Command::new("git")
        .arg("-C")
        .arg(dir)
        .args(args)
        .output()
        .map_err(io(dir))?;
    if !out.status.success() {
        return Err(bad(
            dir,
            format!(
                "git {}: {}",
                args.join(" "),
                String::from_utf8_lossy(&out.stderr).trim()
            ),
        ));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}
