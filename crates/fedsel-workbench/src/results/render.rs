//! `fedsel results render`: every generated block of a page from the rows, the paper values
//! and the claims, each cell judged by the rule of [`crate::verdict`]. It writes the page's
//! blocks only, never a row.

use std::fmt::Write as _;

use super::*;

/// What a table row says of a cell with no verdict of its own.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Status {
    /// Judged by the rule.
    Judged(Verdict),
    /// The paper gives the cell no value (N/A).
    NoPaperValue,
    /// Planned, but no row yet.
    NotRun,
}

impl Status {
    pub(super) fn label(self) -> &'static str {
        match self {
            Status::Judged(v) => v.label(),
            Status::NoPaperValue => "no paper value",
            Status::NotRun => "not run",
        }
    }
}

/// The seeds of one cell as observations, in seed order.
pub(super) fn observations(rows: &[&Row]) -> Vec<Obs> {
    let mut rs = rows.to_vec();
    rs.sort_by_key(|r| r.seed);
    rs.iter()
        .map(|r| {
            if r.censored {
                Obs::Above(r.value)
            } else {
                Obs::Value(r.value)
            }
        })
        .collect()
}

/// The judgement of one cell's rows against its paper row (`None` when it has no paper
/// value), with the margin's description.
pub(super) fn judge_cell(
    rows: &[&Row],
    paper: Option<&PaperRow>,
    all_paper: &[PaperRow],
) -> (Option<Judgement>, String) {
    let obs = observations(rows);
    let Some((p, mean)) = paper.and_then(|p| p.mean.map(|m| (p, m))) else {
        return (None, "—".into());
    };
    let others: Vec<f64> = all_paper
        .iter()
        .filter(|o| {
            o.section == p.section
                && o.table == p.table
                && o.setting == p.setting
                && o.metric == p.metric
                && o.method != p.method
        })
        .filter_map(|o| o.mean)
        .collect();
    let m = verdict::margin(mean, p.std, &others);
    let text = match m {
        Some(m) => format!(
            "{} ({})",
            num(&p.metric, m.value),
            match m.source {
                MarginSource::PaperStd => "paper's std",
                MarginSource::HalfNearestGap => "½ nearest gap",
            }
        ),
        None => "—".into(),
    };
    let j = (!obs.is_empty()).then(|| verdict::judge(&obs, mean, m));
    (j, text)
}

pub(super) fn ours(metric: &str, rows: &[&Row]) -> String {
    if rows.is_empty() {
        return "—".into();
    }
    let obs = observations(rows);
    let j = verdict::judge(&obs, 0.0, None);
    if j.censored > 0 {
        let at = rows
            .iter()
            .filter(|r| r.censored)
            .map(|r| r.value)
            .fold(f64::INFINITY, f64::min);
        format!(
            "≥ {} ({} of {} censored at {})",
            num(metric, j.mean),
            j.censored,
            j.n,
            num(metric, at)
        )
    } else {
        match j.interval {
            Some((lo, hi)) => format!(
                "{} [{}, {}]",
                num(metric, j.mean),
                num(metric, lo),
                num(metric, hi)
            ),
            None => num(metric, j.mean),
        }
    }
}

pub(super) fn paper_text(p: Option<&PaperRow>) -> String {
    match p {
        None => "—".into(),
        Some(p) => {
            let mut s = match p.mean {
                Some(m) => num(&p.metric, m),
                None => "N/A".into(),
            };
            if let Some(sd) = p.std {
                let _ = write!(s, " ± {}", num(&p.metric, sd));
            }
            if let Some(n) = p.n {
                let _ = write!(s, ", {n} seeds");
            }
            s
        }
    }
}

pub(super) const HEADER: &str = "| table | setting | method | metric | seeds | ours: mean [95 % t-interval] | paper | margin | verdict | paper's source |\n|---|---|---|---|---|---|---|---|---|---|\n";

pub(super) fn table_row(
    out: &mut String,
    key: &CellKey,
    rows: &[&Row],
    paper: Option<&PaperRow>,
    status: Status,
    margin: &str,
) {
    let _ = writeln!(
        out,
        "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
        key.table,
        key.setting,
        key.method,
        key.metric,
        rows.len(),
        ours(&key.metric, rows),
        paper_text(paper),
        margin,
        status.label(),
        paper.map_or("—", |p| p.source.as_str()),
    );
}

/// The generated text of every section with rows or paper values: its verdict table over
/// the planned cells (those in `paper.csv`), the counts computed from it, the unplanned arms
/// and the cells without a paper value below it (shown, never counted), and where the rows
/// came from; and, when the directory has claims and `history` can date them, the `claims`
/// block ([`claims::render`]). Errors name a claim whose values cannot be tested.
pub fn render(
    data: &Data,
    history: Option<&dyn registration::History>,
) -> Result<BTreeMap<String, String>> {
    let mut by_cell: BTreeMap<CellKey, Vec<&Row>> = BTreeMap::new();
    for r in &data.rows {
        by_cell.entry(r.key()).or_default().push(r);
    }
    let paper_of: BTreeMap<CellKey, &PaperRow> = data.paper.iter().map(|p| (p.key(), p)).collect();
    let mut out = BTreeMap::new();
    for section in data.section_names() {
        let mut planned_table = String::new();
        let mut counts: BTreeMap<Status, usize> = BTreeMap::new();
        let mut planned_cells = 0;
        for p in data.paper.iter().filter(|p| p.section == section) {
            let key = p.key();
            let rows: Vec<&Row> = by_cell
                .get(&key)
                .map(|v| v.iter().copied().filter(|r| r.planned).collect())
                .unwrap_or_default();
            let (j, margin) = judge_cell(&rows, Some(p), &data.paper);
            let status = match (p.mean, j) {
                (None, _) => Status::NoPaperValue,
                (Some(_), None) => Status::NotRun,
                (Some(_), Some(j)) => Status::Judged(j.verdict),
            };
            planned_cells += 1;
            *counts.entry(status).or_default() += 1;
            table_row(&mut planned_table, &key, &rows, Some(p), status, &margin);
        }
        let mut unplanned = String::new();
        let mut unpaired = String::new();
        for (key, rows) in by_cell.iter().filter(|(k, _)| k.section == section) {
            let paper = paper_of.get(key).copied();
            let extra: Vec<&Row> = rows.iter().copied().filter(|r| !r.planned).collect();
            if !extra.is_empty() {
                let (j, margin) = judge_cell(&extra, paper, &data.paper);
                let status = j.map_or(Status::NoPaperValue, |j| Status::Judged(j.verdict));
                table_row(&mut unplanned, key, &extra, paper, status, &margin);
            }
            let planned: Vec<&Row> = rows.iter().copied().filter(|r| r.planned).collect();
            if paper.is_none() && !planned.is_empty() {
                table_row(
                    &mut unpaired,
                    key,
                    &planned,
                    None,
                    Status::NoPaperValue,
                    "—",
                );
            }
        }
        let mut s = String::new();
        let _ = writeln!(
            s,
            "_Generated by `fedsel results render` from the per-seed rows and `paper.csv` of the results directory; the rule is in docs/reproducing.md. Do not edit by hand._\n"
        );
        let mut parts: Vec<String> = Verdict::ALL
            .iter()
            .map(|&v| Status::Judged(v))
            .chain([Status::NoPaperValue, Status::NotRun])
            .map(|st| format!("{} {}", counts.get(&st).copied().unwrap_or(0), st.label()))
            .collect();
        let last = parts.pop().unwrap_or_default();
        if planned_cells > 0 {
            let _ = writeln!(
                s,
                "**Counts** (computed): {}, {last}, of {planned_cells} planned cells.\n",
                parts.join(", ")
            );
        } else {
            let _ = writeln!(
                s,
                "No paper value is filed for this section's cells, so none is judged against the paper; they are our per-seed results, summarised:\n"
            );
        }
        if planned_cells > 0 {
            s.push_str(HEADER);
            s.push_str(&planned_table);
            s.push('\n');
        }
        if !unplanned.is_empty() {
            s.push_str(
                "Arms added after the comparison was planned (they explain; never counted):\n\n",
            );
            s.push_str(HEADER);
            s.push_str(&unplanned);
            s.push('\n');
        }
        if !unpaired.is_empty() {
            if planned_cells > 0 {
                s.push_str("Cells the paper does not report (never counted):\n\n");
            }
            s.push_str(HEADER);
            s.push_str(&unpaired);
            s.push('\n');
        }
        let rows: Vec<&Row> = data.rows.iter().filter(|r| r.section == section).collect();
        if !rows.is_empty() {
            let commits: BTreeSet<&str> = rows.iter().map(|r| r.commit.as_str()).collect();
            let commands: BTreeSet<&str> = rows.iter().map(|r| r.command.as_str()).collect();
            let _ = writeln!(
                s,
                "{} rows (config hashes in the CSV); commit {}; {}.",
                rows.len(),
                commits
                    .into_iter()
                    .map(|c| format!("`{c}`"))
                    .collect::<Vec<_>>()
                    .join(", "),
                commands
                    .into_iter()
                    .map(|c| format!("`{c}`"))
                    .collect::<Vec<_>>()
                    .join("; ")
            );
        }
        out.insert(section, s);
    }
    if let (false, Some(h)) = (data.claims.is_empty(), history) {
        let prov = registration::provenance(&data.claims, &data.rows, h);
        out.insert(
            claims::BLOCK.to_string(),
            claims::render(&data.claims, &data.rows, &prov, &data.sections)?,
        );
    }
    Ok(out)
}

pub(super) fn begin(name: &str) -> String {
    format!("<!-- results:{name} begin -->")
}

pub(super) fn end(name: &str) -> String {
    format!("<!-- results:{name} end -->")
}

/// The generated blocks of a page: name → byte range of the text between its markers.
/// Errors name a marker that is unmatched, nested or repeated.
pub(super) fn blocks(doc: &str, path: &Path) -> Result<BTreeMap<String, std::ops::Range<usize>>> {
    let mut out = BTreeMap::new();
    let mut open: Option<(String, usize)> = None;
    let mut pos = 0;
    for line in doc.split_inclusive('\n') {
        let t = line.trim();
        let marker = t
            .strip_prefix("<!-- results:")
            .and_then(|r| r.strip_suffix(" -->"));
        match (marker.and_then(|m| m.rsplit_once(' ')), &open) {
            (Some((name, "begin")), None) => open = Some((name.to_string(), pos + line.len())),
            (Some((name, "end")), Some((o, start))) if name == o => {
                if out.insert(name.to_string(), *start..pos).is_some() {
                    return Err(bad(path, format!("block `{name}` appears twice")));
                }
                open = None;
            }
            (Some((name, kind)), _) => {
                return Err(bad(
                    path,
                    format!(
                        "marker `{kind}` of `{name}` where {}",
                        open.as_ref()
                            .map_or("no block is open".to_string(), |(o, _)| format!(
                                "block `{o}` is open"
                            ))
                    ),
                ));
            }
            (None, _) => {}
        }
        pos += line.len();
    }
    match open {
        Some((name, _)) => Err(bad(path, format!("block `{name}` has no end marker"))),
        None => Ok(out),
    }
}

/// What [`render_doc`] did.
#[derive(Debug, Clone, PartialEq)]
pub struct Rendered {
    /// Blocks rewritten in place.
    pub updated: Vec<String>,
    /// Sections the page had no block for, appended at its end.
    pub appended: Vec<String>,
    /// Why the claims block was left as it was: the history cannot date the claims.
    pub claims_kept: Option<String>,
}

/// `fedsel results render`: rewrites every generated block of the page `doc` from the
/// results directory `dir`, and appends a block for each section the page lacks (move it
/// where it belongs; later renders keep it there); a page that does not exist is made. Without a history that can date the
/// claims ([`Git::open`]) the claims block is left as it was, and [`Rendered`] says why.
pub fn render_doc(dir: &Path, doc: &Path) -> Result<Rendered> {
    let data = load(dir)?;
    let history = Git::open(dir);
    let claims_kept = match (&history, data.claims.is_empty()) {
        (Err(why), false) => Some(why.clone()),
        _ => None,
    };
    let rendered = render(
        &data,
        history
            .as_ref()
            .ok()
            .map(|g| g as &dyn registration::History),
    )?;
    // A page not written yet (a user's first results directory) starts as a title; the
    // blocks are appended below it.
    let text = match std::fs::read_to_string(doc) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => "# Results\n".to_string(),
        read => read.map_err(io(doc))?,
    };
    let found = blocks(&text, doc)?;
    let mut ranges: Vec<(&String, &std::ops::Range<usize>)> = found.iter().collect();
    ranges.sort_by_key(|(_, r)| r.start);
    let mut new = String::with_capacity(text.len());
    let mut at = 0;
    let mut updated = Vec::new();
    for (name, range) in ranges {
        new.push_str(&text[at..range.start]);
        match rendered.get(name) {
            Some(body) => {
                new.push_str(body);
                updated.push(name.clone());
            }
            None if name == claims::BLOCK && claims_kept.is_some() => {
                new.push_str(&text[range.clone()]);
            }
            None => {
                return Err(bad(
                    doc,
                    format!(
                        "block `{name}` names a section with no rows or paper values in {}",
                        dir.display()
                    ),
                ));
            }
        }
        at = range.end;
    }
    new.push_str(&text[at..]);
    let mut appended = Vec::new();
    for (name, body) in &rendered {
        if !found.contains_key(name) {
            if !new.ends_with('\n') {
                new.push('\n');
            }
            let _ = write!(new, "\n{}\n{body}{}\n", begin(name), end(name));
            appended.push(name.clone());
        }
    }
    std::fs::write(doc, new).map_err(io(doc))?;
    Ok(Rendered {
        updated,
        appended,
        claims_kept,
    })
}
