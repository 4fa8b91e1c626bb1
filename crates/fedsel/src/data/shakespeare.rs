//! Shakespeare, built from the raw Gutenberg text with LEAF's preprocessing.
//!
//! LEAF (Caldas et al. 2018, `data/shakespeare/preprocess`) turns the complete
//! works into one client per (play, character): a play starts at a line
//! containing "by William Shakespeare" with its title a few lines above; a
//! speech starts on a line `␣␣NAME. text` and continues on lines indented by
//! four spaces (The Comedy of Errors is not indented, so it uses unindented
//! patterns). Characters with at most two lines and plays with at most one
//! character are dropped. Each character's lines are joined with spaces, runs
//! of spaces collapse, and every 80-character window predicts the next
//! character over LEAF's 80-symbol vocabulary. The split is by sample: the
//! first ⌊tf·n⌋ windows train; test windows start 79 later, so no test
//! window overlaps a training one.
//!
//! Characters outside the vocabulary (LEAF maps them to −1, a latent bug) map
//! to the space symbol here. The parsed roles are cached under the user's
//! cache directory, keyed by the text's SHA-256.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use rand::seq::SliceRandom;

use super::{Dataset, FederatedData, Inputs, read_file};
use crate::digest::sha256_hex;
use crate::error::DataError;
use crate::rng::{Purpose, stream};

/// Subdirectory of the data directory.
pub const DIR: &str = "shakespeare";
/// The raw text, as in `../shared/data/shakespeare`.
pub const FILE: &str = "pg100.txt";
/// LEAF's vocabulary; a symbol's id is its position.
pub const VOCAB: &str =
    "\n !\"&'(),-.0123456789:;>?ABCDEFGHIJKLMNOPQRSTUVWXYZ[]abcdefghijklmnopqrstuvwxyz}";
/// Window length.
pub const SEQ_LEN: usize = 80;

/// Options of the build.
#[derive(Debug, Clone)]
pub struct ShakespeareSpec {
    /// Fraction of each role's windows used for training.
    pub train_fraction: f64,
    /// Drop roles with fewer windows.
    pub min_samples: usize,
    /// Keep at most this many roles (0 = all).
    pub max_clients: usize,
    /// Keep at most this many windows per role (0 = all).
    pub max_samples_per_client: usize,
    /// Seed for the role order when `max_clients` trims.
    pub seed: u64,
}

/// One (play, character) with its joined text.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Role {
    /// `PLAY_CHARACTER` with non-word characters replaced by `_`.
    pub id: String,
    /// The character's lines joined by spaces, runs of spaces collapsed.
    pub text: String,
}

/// Whether the raw text is present under `dir`.
pub fn available(dir: &Path) -> bool {
    dir.join(FILE).is_file()
}

/// Speaker line: `indent` + NAME (letters and spaces, starting with a letter) + ". " + text.
fn speaker(line: &str, indent: usize) -> Option<(&str, &str)> {
    let rest = line.strip_prefix(&"  "[..indent])?;
    if indent == 2 && rest.starts_with(' ') {
        return None;
    }
    let first = rest.chars().next()?;
    if !first.is_ascii_alphabetic() {
        return None;
    }
    let end = rest.find(|c: char| !(c.is_ascii_alphabetic() || c == ' '))?;
    let tail = &rest[end..];
    let text = tail.strip_prefix(". ")?;
    Some((&rest[..end], text))
}

fn sanitize(s: &str) -> String {
    s.chars()
        .map(|c| {
            if c.is_alphanumeric() || c == '_' {
                c
            } else {
                '_'
            }
        })
        .collect()
}

/// Parses the complete works into roles, in order of first appearance.
pub fn parse_roles(text: &str) -> Vec<Role> {
    let text = text.trim_start_matches('\u{feff}');
    let lines: Vec<&str> = text.lines().collect();
    // Plays: (title, first line, end line).
    let mut starts = Vec::new();
    for (i, l) in lines.iter().enumerate() {
        if l.to_ascii_lowercase().contains("by william shakespeare") {
            let title = (2..=7)
                .filter_map(|back| i.checked_sub(back).map(|j| lines[j].trim()))
                .find(|t| !t.is_empty());
            if let Some(title) = title {
                starts.push((title.to_string(), i + 1));
            }
        }
    }
    let end_of_works = lines
        .iter()
        .position(|l| {
            l.contains("End of the Project Gutenberg") || l.contains("End of Project Gutenberg")
        })
        .unwrap_or(lines.len());
    let mut roles = Vec::new();
    for (p, (title, start)) in starts.iter().enumerate() {
        if title.to_ascii_uppercase().contains("SONNETS") {
            continue;
        }
        let end = starts
            .get(p + 1)
            .map_or(end_of_works, |s| s.1.saturating_sub(8));
        let coe = title.eq_ignore_ascii_case("THE COMEDY OF ERRORS");
        let mut by_char: BTreeMap<String, (usize, Vec<String>)> = BTreeMap::new();
        let mut current: Option<String> = None;
        for line in lines.get(*start..end.max(*start)).unwrap_or(&[]) {
            let found = if coe {
                speaker(line, 0)
            } else {
                speaker(line, 2)
            };
            if let Some((name, said)) = found {
                let name = name.trim().to_ascii_uppercase();
                if coe && name.starts_with("ACT ") {
                    current = None;
                    continue;
                }
                let order = by_char.len();
                by_char
                    .entry(name.clone())
                    .or_insert((order, Vec::new()))
                    .1
                    .push(said.to_string());
                current = Some(name);
            } else if let Some(name) = &current {
                let cont = if coe {
                    Some(*line)
                } else {
                    line.strip_prefix("    ")
                };
                match cont {
                    Some(c) if !(coe && c.starts_with('<')) => by_char
                        .get_mut(name)
                        .expect("current character exists")
                        .1
                        .push(c.to_string()),
                    _ => current = None,
                }
            }
        }
        if by_char.len() <= 1 {
            continue;
        }
        let mut chars: Vec<(String, (usize, Vec<String>))> = by_char.into_iter().collect();
        chars.sort_by_key(|c| c.1.0);
        for (name, (_, said)) in chars {
            if said.len() <= 2 {
                continue;
            }
            let joined = said.join(" ");
            let mut text = String::with_capacity(joined.len());
            for c in joined.chars() {
                if !(c == ' ' && text.ends_with(' ')) {
                    text.push(c);
                }
            }
            roles.push(Role {
                id: format!("{}_{}", sanitize(title), sanitize(&name)),
                text,
            });
        }
    }
    roles
}

fn cache_path(hash: &str) -> Option<PathBuf> {
    let base = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))?;
    Some(
        base.join("fedsel")
            .join(format!("shakespeare-roles-{}.json", &hash[..16])),
    )
}

/// Roles of the file, from the cache when it holds this exact text.
fn roles_cached(path: &Path) -> Result<Vec<Role>, DataError> {
    let bytes = read_file(path)?;
    let hash = sha256_hex(&bytes);
    let cache = cache_path(&hash);
    if let Some(roles) = cache
        .as_ref()
        .and_then(|c| std::fs::read(c).ok())
        .and_then(|b| serde_json::from_slice::<Vec<Role>>(&b).ok())
    {
        return Ok(roles);
    }
    let roles = roles_from_bytes(path, &bytes)?;
    if let Some(c) = cache {
        // The cache only saves time; failing to write it is not an error.
        let _ = std::fs::create_dir_all(c.parent().expect("cache file has a parent"))
            .and_then(|_| std::fs::write(&c, serde_json::to_vec(&roles).expect("roles serialize")));
    }
    Ok(roles)
}

/// Parses the raw bytes of the complete works (`path` names them in errors): they must be
/// UTF-8 and hold at least one play with speaking characters.
pub fn roles_from_bytes(path: &Path, bytes: &[u8]) -> Result<Vec<Role>, DataError> {
    let text = std::str::from_utf8(bytes)
        .map_err(|e| DataError::corrupt(path, format!("not UTF-8 text: {e}")))?;
    let roles = parse_roles(text);
    if roles.is_empty() {
        return Err(DataError::corrupt(
            path,
            "no play with speaking characters found; is this the Gutenberg complete works?",
        ));
    }
    Ok(roles)
}

fn encode(text: &str) -> Vec<u8> {
    let space = VOCAB.find(' ').expect("space is in the vocabulary") as u8;
    text.chars()
        .map(|c| VOCAB.find(c).map_or(space, |i| i as u8))
        .collect()
}

/// Builds the federated dataset from roles: one natural user per kept role.
pub fn from_roles(roles: &[Role], spec: &ShakespeareSpec) -> FederatedData {
    let mut order: Vec<usize> = (0..roles.len()).collect();
    if spec.max_clients > 0 && spec.max_clients < roles.len() {
        order.shuffle(&mut stream(spec.seed, Purpose::Dataset, 0, 0));
    }
    let mut train = (Vec::new(), Vec::new());
    let mut test = (Vec::new(), Vec::new());
    let mut users = Vec::new();
    for &r in &order {
        if spec.max_clients > 0 && users.len() == spec.max_clients {
            break;
        }
        let ids = encode(&roles[r].text);
        let n = ids.len().saturating_sub(SEQ_LEN);
        if n == 0 || n < spec.min_samples {
            continue;
        }
        let n_train = ((spec.train_fraction * n as f64).floor() as usize).max(1);
        let cap = |k: usize| {
            if spec.max_samples_per_client > 0 {
                k.min(spec.max_samples_per_client)
            } else {
                k
            }
        };
        let test_start = (n_train + SEQ_LEN - 1).min(n);
        let n_test = cap(n - test_start);
        let push = |dst: &mut (Vec<u8>, Vec<u32>), i: usize| {
            dst.0.extend_from_slice(&ids[i..i + SEQ_LEN]);
            dst.1.push(ids[i + SEQ_LEN] as u32);
        };
        let first = train.1.len();
        for i in 0..cap(n_train) {
            push(&mut train, i);
        }
        users.push((first..train.1.len()).collect());
        for i in test_start..test_start + n_test {
            push(&mut test, i);
        }
    }
    let ds = |(values, labels): (Vec<u8>, Vec<u32>)| Dataset {
        inputs: Inputs::Tokens {
            len: SEQ_LEN,
            values,
        },
        labels,
        classes: VOCAB.len(),
    };
    FederatedData {
        name: "shakespeare".into(),
        train: ds(train),
        test: ds(test),
        users: Some(users),
        user_models: None,
        user_holdout: None,
    }
}

/// Loads Shakespeare from `dir`.
pub fn load(dir: &Path, spec: &ShakespeareSpec) -> Result<FederatedData, DataError> {
    let path = dir.join(FILE);
    if !path.is_file() {
        return Err(DataError::Missing {
            dataset: "shakespeare".into(),
            dir: dir.to_path_buf(),
            missing: FILE.into(),
            hint: "Get Project Gutenberg eBook #100 (https://www.gutenberg.org/cache/epub/100/pg100.txt) and save it there.".into(),
        });
    }
    Ok(from_roles(&roles_cached(&path)?, spec))
}

#[cfg(test)]
mod tests {
    use super::*;

    const PLAY: &str = "\
THE TRAGEDY OF TESTING

by William Shakespeare

  ALPHA. To be, or not
    to be.
  BETA. That is the question.
  ALPHA. Whether 'tis nobler
  BETA. In the mind
  ALPHA. to suffer.
  BETA. Slings and
    arrows.
  GAMMA. Only once.
";

    #[test]
    fn parses_speakers_continuations_and_drops_small_roles() {
        let roles = parse_roles(PLAY);
        let ids: Vec<&str> = roles.iter().map(|r| r.id.as_str()).collect();
        assert_eq!(
            ids,
            [
                "THE_TRAGEDY_OF_TESTING_ALPHA",
                "THE_TRAGEDY_OF_TESTING_BETA"
            ]
        );
        assert_eq!(
            roles[0].text,
            "To be, or not to be. Whether 'tis nobler to suffer."
        );
    }

    #[test]
    fn vocabulary_has_80_symbols_and_windows_do_not_overlap() {
        assert_eq!(VOCAB.chars().count(), 80);
        let role = Role {
            id: "P_A".into(),
            text: "abcdefghij".repeat(30),
        };
        let spec = ShakespeareSpec {
            train_fraction: 0.8,
            min_samples: 0,
            max_clients: 0,
            max_samples_per_client: 0,
            seed: 1,
        };
        let d = from_roles(&[role], &spec);
        // 300 chars give 220 windows: 176 train, test starts at 176 + 79 = 255 > 220, so none.
        assert_eq!(d.train.len(), 176);
        assert_eq!(d.test.len(), 0);
        assert_eq!(d.train.labels[0], VOCAB.find('a').unwrap() as u32);
        assert_eq!(d.train.labels[0], encode("a")[0] as u32);
    }
}
