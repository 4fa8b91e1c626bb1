#!/usr/bin/env python3
"""Independent recount of the claims verdicts on docs/results.md.

What it checks
--------------
The block between ``<!-- results:claims begin -->`` and ``<!-- results:claims end -->`` in
``docs/results.md`` is rendered by ``fedsel results render`` (Rust). This script recomputes,
from ``results/claims/*.toml`` and the per-seed rows of ``results/*.csv`` alone, with the
Python standard library only (its own Student-t quantile, no numpy/scipy), what that block
states, following the rule of docs/reproducing.md ("Claims"):

1. every test row of the big table ("The tests, one per setting and set of seeds"): the
   pairs cell (pairs kept, both-censored pairs left out, pairs with A or B censored), the
   seeds the test reads, the bound marker (=, <=, >=, ~), the effect and its 95 % t-interval
   to the decimals the page prints (for a log-ratio the page shows b/a = exp(-effect) with
   the interval reversed) and the outcome label the verdict cell starts with;
2. each claim's counted verdict in the per-claim table (its variant too), the counted
   test being chosen by the evidence the page's "written" cell reads (pre-registered: the
   claim's section; post hoc with "fresh seeds pre-registered": its confirmatory section;
   post hoc otherwise: its section); the evidence reading itself (which needs the git
   history) is taken from the page, every outcome is recomputed;
3. the count table at the top (evidence x variant by outcome, and "all"), and the header's
   "N claims counted of M", from the recomputed counted verdicts (claims not testable and
   claims the page marks "not counted" are left out, and so is a claim whose counted test
   reads an arm that `results/sections.toml` marks `not_current` in that section: the page
   must then say it awaits a rerun).

Run it from the repository root:

    python3 scripts/reference/recount_claims.py

It prints how many test rows, claims and count cells matched and every mismatch with both
values, and exits 0 when everything matches, 1 otherwise.
"""

import csv
import glob
import math
import os
import re
import sys
import tomllib

PAGE = "docs/results.md"
BEGIN = "<!-- results:claims begin -->"
END = "<!-- results:claims end -->"

OUTCOMES = [
    "reproduced",
    "direction only",
    "direction, size undetermined",
    "not reproduced",
    "contradicted",
    "undetermined by a bound",
    "too few seeds",
    "too few informative seeds",
]
# A claim over several settings counts as the first of these that any setting has.
PRIORITY = [
    "contradicted",
    "not reproduced",
    "undetermined by a bound",
    "too few informative seeds",
    "too few seeds",
    "direction only",
    "direction, size undetermined",
    "reproduced",
]
NOT_TESTABLE = "not testable on CPU"


# ---------------------------------------------------------------------------------------
# Student t, integer degrees of freedom (closed form, Abramowitz & Stegun 26.7.3 / 26.7.4)
# ---------------------------------------------------------------------------------------


def t_two_sided_mass(t, nu):
    """P(|T| < t) for T ~ Student t with integer nu >= 1 degrees of freedom, t >= 0."""
    theta = math.atan(t / math.sqrt(nu))
    s, c = math.sin(theta), math.cos(theta)
    if nu % 2 == 1:
        if nu == 1:
            return 2.0 * theta / math.pi
        term, total = c, c
        for k in range(3, nu - 1, 2):  # terms c^3 (2/3), c^5 (2*4)/(3*5), ...
            term *= c * c * (k - 1) / k
            total += term
        return 2.0 / math.pi * (theta + s * total)
    term, total = 1.0, 1.0
    for k in range(2, nu - 1, 2):  # terms c^2 (1/2), c^4 (1*3)/(2*4), ...
        term *= c * c * (k - 1) / k
        total += term
    return s * total


def t_quantile_975(nu):
    """t(0.975, nu): the t with P(|T| < t) = 0.95, by bisection."""
    lo, hi = 0.0, 1.0
    while t_two_sided_mass(hi, nu) < 0.95:
        hi *= 2.0
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        if t_two_sided_mass(mid, nu) < 0.95:
            lo = mid
        else:
            hi = mid
    return 0.5 * (lo + hi)


# ---------------------------------------------------------------------------------------
# Data
# ---------------------------------------------------------------------------------------


def load_rows():
    rows = {}  # (section, metric, method) -> {(setting, seed): (value, censored)}
    for path in sorted(glob.glob("results/*.csv")):
        with open(path, newline="") as f:
            reader = csv.DictReader(f)
            if "censored" not in (reader.fieldnames or []):
                continue  # results/paper.csv: the papers' values, not per-seed rows
            for r in reader:
                if r["planned"] != "true":
                    continue
                key = (r["section"], r["metric"], r["method"])
                cell = (r["setting"], int(r["seed"]))
                arm = rows.setdefault(key, {})
                if cell in arm:
                    raise SystemExit(f"duplicate row {key} {cell} in {path}")
                arm[cell] = (float(r["value"]), r["censored"] == "true")
    return rows


def load_not_current():
    """Each section's methods whose rows `results/sections.toml` marks not current: a claim
    reading them is shown awaiting a rerun and counted nowhere."""
    with open("results/sections.toml", "rb") as f:
        sections = tomllib.load(f)
    return {name: set(info.get("not_current", [])) for name, info in sections.items()}


def load_claims():
    claims = []
    for path in sorted(glob.glob("results/claims/*.toml")):
        with open(path, "rb") as f:
            claims.extend(tomllib.load(f).get("claim", []))
    return claims


def seed_ranges(seeds):
    seeds = sorted(set(seeds))
    parts, i = [], 0
    while i < len(seeds):
        j = i
        while j + 1 < len(seeds) and seeds[j + 1] == seeds[j] + 1:
            j += 1
        parts.append(str(seeds[i]) if i == j else f"{seeds[i]}-{seeds[j]}")
        i = j + 1
    return ", ".join(parts)


# ---------------------------------------------------------------------------------------
# The test
# ---------------------------------------------------------------------------------------


def run_test(claim, section, setting, rows):
    """One paired test. setting None: every row of the section as one test."""
    metric = claim["metric"]
    a = rows.get((section, metric, claim["a"]), {})
    b = rows.get((section, metric, claim["b"]), {})
    keys = sorted(k for k in a if k in b and (setting is None or k[0] == setting))
    seeds = [k[1] for k in keys]
    both = a_only = b_only = 0
    d = []
    for k in keys:
        (va, ca), (vb, cb) = a[k], b[k]
        if ca and cb:
            both += 1
            continue
        if ca:
            a_only += 1
        if cb:
            b_only += 1
        d.append(math.log(va / vb) if claim["effect"] == "log_ratio" else va - vb)
    n = len(d)
    if a_only and not b_only:
        bound = "at least"
    elif b_only and not a_only:
        bound = "at most"
    elif a_only and b_only:
        bound = "neither"
    else:
        bound = "exact"
    mean = sum(d) / n if n else None
    lo = hi = None
    if n >= 2:
        s = math.sqrt(sum((x - mean) ** 2 for x in d) / (n - 1))
        half = t_quantile_975(n - 1) * s / math.sqrt(n)
        lo, hi = mean - half, mean + half
    outcome = judge(claim, n, both, bound, mean, lo, hi)
    return {
        "n": n,
        "both": both,
        "a_only": a_only,
        "b_only": b_only,
        "bound": bound,
        "mean": mean,
        "lo": lo,
        "hi": hi,
        "outcome": outcome,
        "seeds": seed_ranges(seeds),
    }


def judge(claim, n, both, bound, mean, lo, hi):
    if n < 5:
        return "too few informative seeds" if both else "too few seeds"
    below, above = hi < 0, lo > 0
    supported = {
        "exact": True,
        "at least": not below,
        "at most": not above,
        "neither": not (below or above),
    }[bound]
    if not supported:
        return "undetermined by a bound"
    claimed, against = (below, above) if claim["direction"] == "lower" else (above, below)
    if against:
        return "contradicted"
    if not claimed:
        return "not reproduced"
    size = claim.get("size")
    if not size:
        return "reproduced"
    if claim["effect"] == "log_ratio":
        slo, shi = -math.log(size[1]), -math.log(size[0])
    else:
        slo, shi = size[0], size[1]
    missed_below, missed_above = hi < slo, lo > shi
    missed = {
        "exact": missed_below or missed_above,
        "at least": missed_above,
        "at most": missed_below,
        "neither": False,
    }[bound]
    if missed:
        return "direction only"
    if bound != "exact":
        return "direction, size undetermined"
    if slo <= mean <= shi:
        return "reproduced"
    return "direction, size undetermined"


def counted_outcome(outcomes):
    for o in PRIORITY:
        if o in outcomes:
            return o
    raise ValueError(outcomes)


# ---------------------------------------------------------------------------------------
# The page
# ---------------------------------------------------------------------------------------


def cells(line):
    line = line.strip()
    assert line.startswith("|") and line.endswith("|"), line
    return [c.strip() for c in line[1:-1].split(" | ")]


def unticked(s):
    return s.strip().strip("`")


def parse_page():
    text = open(PAGE, encoding="utf-8").read()
    block = text[text.index(BEGIN) : text.index(END)]
    lines = block.splitlines()
    header = re.search(r"(\d+) claims counted of (\d+)", block)
    counts, per_claim, tests = {}, {}, []
    mode = None
    for line in lines:
        if not line.startswith("|"):
            continue
        c = cells(line)
        if c[0] == "claims" and c[-1] == "all":
            mode, cols = "counts", c[1:]
            assert cols[:-1] == OUTCOMES, cols
            continue
        if c[:2] == ["claim", "variant"]:
            mode = "per_claim"
            continue
        if c[:2] == ["claim", "paper"]:
            mode = "tests"
            continue
        if set(line.replace("|", "").strip()) <= set("-"):
            continue
        if mode == "counts":
            counts[c[0]] = dict(zip(cols, (int(x) for x in c[1:])))
        elif mode == "per_claim":
            cid, variant, written, verdict = unticked(c[0]), c[1], c[2], c[3]
            m = re.match(r"\*\*(.+?)\*\*( — not counted: .*)?$", verdict)
            plain = re.match(r"(.+?) — not counted: (.*)$", verdict)
            if m:
                label, not_counted = m.group(1), m.group(2) is not None
            elif plain:
                label, not_counted = plain.group(1), True
            else:
                label, not_counted = verdict, verdict != NOT_TESTABLE
            per_claim[cid] = {
                "variant": variant,
                "written": written,
                "verdict": label,
                "not_counted": not_counted,
            }
        elif mode == "tests":
            assert len(c) == 10, line
            tests.append(
                {
                    "claim": unticked(c[0]),
                    "setting": c[3],
                    "test": c[4],
                    "arms": c[5],
                    "pairs": c[6],
                    "effect": c[7],
                    "verdict": c[9],
                }
            )
    return header, counts, per_claim, tests


def evidence_of(written):
    if written.startswith("pre-registered"):
        return "pre-registered"
    if written.startswith("post hoc"):
        if "fresh seeds pre-registered" in written:
            return "fresh"
        return "post hoc"
    return None


EVIDENCE_LABEL = {
    "pre-registered": "pre-registered (written before its runs)",
    "fresh": "post hoc, confirmed on fresh seeds (the fresh seeds' verdict counts)",
    "post hoc": "post hoc, no fresh seeds yet (the verdict on the seeds seen before it was written)",
}
PAPER_SUFFIX = "; the paper's text's variant, which the authors' code does not run"
VARIANT_LABEL = {"paper": "paper's text (not the authors' code)", None: "authors' code"}

NUM = r"(-?\d+(?:\.\d+)?)"


def parse_effect(cell):
    """(marker, point, lo, hi, decimals) from the effect cell; None for '—'."""
    if cell == "—":
        return None
    m = re.match(r"(b/a|a − b) (=|≤|≥|≈) " + NUM + r"(?: \[" + NUM + ", " + NUM + r"\])?", cell)
    if not m:
        raise ValueError(f"effect cell not understood: {cell!r}")
    scale, marker, point, lo, hi = m.groups()
    dec = len(point.split(".")[1]) if "." in point else 0
    return scale, marker, point, lo, hi, dec


def pairs_text(t):
    inner = []
    if t["both"]:
        inner.append(f"{t['both']} with both censored, left out")
    if t["a_only"]:
        inner.append(f"A censored in {t['a_only']}")
    if t["b_only"]:
        inner.append(f"B censored in {t['b_only']}")
    return f"{t['n']}" + (f" ({'; '.join(inner)})" if inner else "")


def verdict_label(cell):
    for label in sorted(OUTCOMES + [NOT_TESTABLE], key=len, reverse=True):
        if cell == label or cell.startswith(label + ":") or cell.startswith(label + " ("):
            return label
    return cell


def close(mine, page_str, dec):
    return abs(mine - float(page_str)) <= 0.5 * 10.0 ** (-dec) + 1e-12


def compare_row(claim, t, row):
    """List of (what, page, mine) differences of one test row."""
    diffs = []
    mine_pairs = pairs_text(t)
    if row["pairs"] != mine_pairs:
        diffs.append(("pairs", row["pairs"], mine_pairs))
    m = re.match(r"(as run|fresh seeds) \((.*)\)$", row["test"])
    if not m or m.group(2) != t["seeds"]:
        diffs.append(("seeds", row["test"], t["seeds"]))
    arms = f"{claim['a']} vs {claim['b']}, {claim['metric']}"
    if row["arms"] != arms:
        diffs.append(("arms", row["arms"], arms))
    eff = parse_effect(row["effect"])
    log = claim["effect"] == "log_ratio"
    if t["mean"] is None:
        if eff is not None:
            diffs.append(("effect", row["effect"], "— (no informative pair)"))
    elif eff is None:
        diffs.append(("effect", row["effect"], f"mean {t['mean']}"))
    else:
        scale, marker, point, lo, hi, dec = eff
        want_scale = "b/a" if log else "a − b"
        if scale != want_scale:
            diffs.append(("scale", scale, want_scale))
        flip = {"at least": "≤", "at most": "≥"} if log else {"at least": "≥", "at most": "≤"}
        want_marker = {"exact": "=", "neither": "≈"}.get(t["bound"]) or flip[t["bound"]]
        if marker != want_marker:
            diffs.append(("bound", marker, f"{want_marker} ({t['bound']})"))
        if log:
            mp = math.exp(-t["mean"])
            mlo = math.exp(-t["hi"]) if t["hi"] is not None else None
            mhi = math.exp(-t["lo"]) if t["lo"] is not None else None
        else:
            mp, mlo, mhi = t["mean"], t["lo"], t["hi"]
        fmt = lambda x: "—" if x is None else f"{x:.{dec}f}"
        if not close(mp, point, dec):
            diffs.append(("effect", point, fmt(mp)))
        if (lo is None) != (mlo is None):
            diffs.append(("interval", f"[{lo}, {hi}]", f"[{fmt(mlo)}, {fmt(mhi)}]"))
        elif lo is not None and not (close(mlo, lo, dec) and close(mhi, hi, dec)):
            diffs.append(("interval", f"[{lo}, {hi}]", f"[{fmt(mlo)}, {fmt(mhi)}]"))
    label = verdict_label(row["verdict"])
    if label != t["outcome"]:
        diffs.append(("outcome", label, t["outcome"]))
    return diffs


def main():
    if not os.path.exists(PAGE):
        raise SystemExit("run from the repository root (docs/results.md not found)")
    rows = load_rows()
    claims = load_claims()
    not_current = load_not_current()
    header, page_counts, page_claims, page_tests = parse_page()
    mismatches = []

    # 1. every test, as run and on fresh seeds
    mine = {}  # (claim id, setting, kind) -> test
    for claim in claims:
        if "not_testable" in claim:
            continue
        sections = [("as run", claim["section"])]
        if claim.get("confirmatory_section"):
            sections.append(("fresh seeds", claim["confirmatory_section"]))
        settings = claim.get("settings") or [None]
        for kind, section in sections:
            for setting in settings:
                t = run_test(claim, section, setting, rows)
                mine[(claim["id"], setting or "all", kind)] = t
    by_id = {c["id"]: c for c in claims}
    rows_ok = rows_total = 0
    seen = set()
    for row in page_tests:
        claim = by_id.get(row["claim"])
        if claim is None:
            mismatches.append(f"test row of unknown claim {row['claim']}")
            continue
        if "not_testable" in claim:
            if verdict_label(row["verdict"]) != NOT_TESTABLE:
                mismatches.append(f"{row['claim']}: not testable, page says {row['verdict']!r}")
            continue
        rows_total += 1
        kind = row["test"].split(" (")[0]
        key = (row["claim"], row["setting"], kind)
        seen.add(key)
        t = mine.get(key)
        if t is None:
            mismatches.append(f"test row {key}: on the page, not in the recount")
            continue
        diffs = compare_row(claim, t, row)
        if diffs:
            for what, p, m in diffs:
                mismatches.append(f"test {key[0]} / {key[1]} / {key[2]}: {what}: page {p!r}, recount {m!r}")
        else:
            rows_ok += 1
    for key in sorted(set(mine) - seen):
        mismatches.append(f"test {key}: in the recount, no row on the page")

    # 2. counted verdict per claim
    claims_ok = 0
    my_counts = {}
    n_counted = 0
    for claim in claims:
        cid = claim["id"]
        pc = page_claims.get(cid)
        if pc is None:
            mismatches.append(f"claim {cid}: no row in the per-claim table")
            continue
        want_variant = VARIANT_LABEL.get(claim.get("variant"), claim.get("variant"))
        ok = True
        if pc["variant"] != want_variant:
            mismatches.append(f"claim {cid}: variant: page {pc['variant']!r}, toml {want_variant!r}")
            ok = False
        if "not_testable" in claim:
            if pc["verdict"] != NOT_TESTABLE:
                mismatches.append(f"claim {cid}: page {pc['verdict']!r}, recount {NOT_TESTABLE!r}")
                ok = False
            claims_ok += ok
            continue
        evidence = evidence_of(pc["written"])
        if evidence is None:
            mismatches.append(f"claim {cid}: 'written' cell not understood: {pc['written']!r}")
            continue
        kind = "fresh seeds" if evidence == "fresh" else "as run"
        settings = claim.get("settings") or ["all"]
        verdict = counted_outcome([mine[(cid, s, kind)]["outcome"] for s in settings])
        if pc["verdict"] != verdict:
            mismatches.append(
                f"claim {cid}: counted verdict ({evidence}, {kind}): page {pc['verdict']!r}, recount {verdict!r}"
            )
            ok = False
        read = claim.get("confirmatory_section", claim["section"]) if evidence == "fresh" else claim["section"]
        stale = not_current.get(read, set()) & {claim["a"], claim["b"]}
        if stale and not pc["not_counted"]:
            mismatches.append(f"claim {cid}: reads rows marked not current in {read}, yet counted on the page")
            ok = False
        claims_ok += ok
        if pc["not_counted"] or stale:
            continue
        n_counted += 1
        label = EVIDENCE_LABEL[evidence] + (PAPER_SUFFIX if claim.get("variant") == "paper" else "")
        row = my_counts.setdefault(label, {o: 0 for o in OUTCOMES})
        row[verdict] += 1
    for cid in page_claims:
        if cid not in by_id:
            mismatches.append(f"claim {cid}: on the page, in no claims file")

    # 3. the count table
    cells_ok = cells_total = 0
    for label in list(page_counts) + [l for l in my_counts if l not in page_counts]:
        p = page_counts.get(label)
        m = my_counts.get(label)
        mrow = dict(m or {o: 0 for o in OUTCOMES})
        mrow["all"] = sum(mrow.values())
        prow = p or {o: 0 for o in OUTCOMES + ["all"]}
        if p is None:
            mismatches.append(f"count row {label!r}: in the recount, not on the page")
        for col in OUTCOMES + ["all"]:
            cells_total += 1
            if prow[col] == mrow[col]:
                cells_ok += 1
            else:
                mismatches.append(f"count [{label}] [{col}]: page {prow[col]}, recount {mrow[col]}")
    n_all = len(claims)
    if header is None or (int(header.group(1)), int(header.group(2))) != (n_counted, n_all):
        got = header.group(0) if header else None
        mismatches.append(f"header: page {got!r}, recount '{n_counted} claims counted of {n_all}'")

    n_testable = sum("not_testable" not in c for c in claims)
    print(f"test rows matched: {rows_ok}/{rows_total} (recount made {len(mine)} tests)")
    print(f"claims matched: {claims_ok}/{len(claims)} ({n_testable} testable, {n_counted} counted)")
    print(f"count cells matched: {cells_ok}/{cells_total}")
    if mismatches:
        print(f"{len(mismatches)} mismatch(es):")
        for line in mismatches:
            print("  " + line)
        return 1
    print("all match")
    return 0


if __name__ == "__main__":
    sys.exit(main())
