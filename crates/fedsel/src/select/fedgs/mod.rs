//! FedGS (Wang et al., AAAI 2023; seed 002): federated graph-based sampling
//! under arbitrary client availability.
//!
//! In the initial phase, when every client is reachable (§3.2), the server builds the 3DG
//! once (Alg. 1 lines 2–3): client features → similarities V → edges → Floyd–Warshall
//! distances H. Each round it solves Eq. 16–17 over the available clients A_t with
//! |S| = min(M, |A_t|), which balances the sampling counts v (Alg. 1 line 15) while
//! spreading the sample over the graph. Aggregation is by data size over the selected
//! (Eq. 18), what `aggregation = "auto"` gives.
//!
//! Two protocols (decisions.md), because Table 2 was produced by the authors' code:
//! - `paper`: maximise (α/N) Σ_{i≠j∈S} h_ij − Σ_{i∈S} z_i with z_i = 2(v_i − v̄ − M/N) + 1
//!   (Eq. 16). The pair term has weight 2α/N per unordered pair against 1 per count, so it
//!   can only break ties unless α > N/(k − 1). The oracle and SSPP similarity is the inner
//!   product; update and response similarities are cosines clipped at 0 (Eq. 11–12); an
//!   edge joins V ≥ ε = 0.1 with length e^{−V/σ²}, σ² = 0.01 (Eq. 13).
//! - `code`: maximise α · mean_{i<j∈S} h_ij − Σ_{i∈S} z_i / (N − 1), i.e. pair weight
//!   2α/(M(M − 1)), so α trades the mean spread against count balance on one scale; every
//!   similarity is the unclipped cosine; an edge joins V > ε = 0.01 with length
//!   exp(−V²/σ), σ = 0.1.
//!
//! Cost at N clients, K a round: the graph is O(N³) once (Floyd–Warshall, run phase by
//! phase on the upper triangle, [`graph::shortest_paths`]; about 5·10¹¹ relaxations at
//! 10,000 clients) and two N × N matrices at its peak. A round is O(N²) when the available
//! set changes (the solver's top-distance sums, by selection) and otherwise O(restarts ·
//! swaps · K · N) for the local searches; the branch-and-bound runs only up to
//! `exact_up_to` available clients, under its node and work budgets. With every client
//! available, H itself is the instance (no copy).
//!
//! `fedgs_solver.csv` records, per round, the solver's value, bound, gap and the mean graph
//! distance among the selected clients, which is what α buys. `fedgs_graph.csv` records the
//! graph's edges and, with `graph_quality`, the **oracle** diagnostic of FedGS Table 3 as the
//! authors' `algorithm/3DG_builder.py` computes it, one row per ε (`graph::table3_quality`).

pub mod graph;
pub mod solver;

use serde::{Deserialize, Serialize};

use super::{ClientQuery, Needs, Protocol, RoundContext, Selection, Selector, Setup};
use crate::error::{ConfigError, Error};
use crate::rng::Rng;
use crate::validate::{check, check_pos, check_prob};

/// Where FedGS's client features for the 3DG come from (FedGS §3.2, Table 4).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FedGsGraph {
    /// **Oracle** features read directly (label distributions; generating models on Synthetic).
    Oracle,
    /// The same oracle features, but the server learns only their dot products, by the
    /// secure scalar product protocol (FedGS App. D).
    Sspp,
    /// Functional similarity: output-layer responses to Gaussian noise (Eq. 12), FedGS_func.
    Functional,
    /// Cosine of the clients' first model updates (Eq. 11), FedGS_cos.
    Update,
}

/// FedGS (seed 002).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct FedGsConfig {
    /// Weight α of the graph-distance term (decisions.md: 1.0; the paper sweeps 0–5).
    pub alpha: f64,
    /// Source of the 3DG.
    pub graph: FedGsGraph,
    /// Paper or code (module docs of `select::fedgs`): the objective's scale, the
    /// similarity, the edge rule and the edge length.
    pub protocol: Protocol,
    /// Edge threshold ε on the normalised similarity; unset means the protocol's
    /// (paper 0.1, code 0.01).
    pub epsilon: Option<f64>,
    /// σ² of the paper's edge length e^{−V/σ²}, or σ of the code's exp(−V²/σ); unset
    /// means the protocol's (paper 0.01, code 0.1).
    pub sigma2: Option<f64>,
    /// Solve exactly by branch-and-bound when at most this many clients are available.
    pub exact_up_to: usize,
    /// Node budget of the branch-and-bound; past it the best found is kept and the gap reported.
    pub node_budget: usize,
    /// Work budget of the branch-and-bound: open clients summed over the nodes expanded
    /// (`solver::Limits::work_budget`). It binds only above 100 available clients, where
    /// a node costs more: at 1,000 it keeps a round within about a second.
    pub work_budget: usize,
    /// Improving 1-swaps the local search may make.
    pub swap_budget: usize,
    /// Further local searches from other seeds (`solver::Limits::restarts`).
    pub restarts: usize,
    /// Subgradient steps of the spectral upper bound (`solver::spectral_bound`), which
    /// gives the gap where the branch-and-bound cannot close it; 0 turns it off.
    pub spectral_steps: usize,
    /// Compute the spectral bound when at most this many clients are available (each
    /// step is an eigendecomposition of their distance matrix).
    pub spectral_up_to: usize,
    /// Gaussian-noise batch of the functional similarity.
    pub noise_batch: usize,
    /// **Oracle** diagnostic: also build the oracle 3DG and report the precision, recall
    /// and F1 of the constructed graph's edges against it, one row per ε, as the authors'
    /// script behind FedGS Table 3 computes them ([`graph::table3_quality`]). It reads the
    /// features the selection graph was built from and changes no selection.
    pub graph_quality: bool,
}

impl Default for FedGsConfig {
    fn default() -> Self {
        Self {
            alpha: 1.0,
            graph: FedGsGraph::Oracle,
            protocol: Protocol::Paper,
            epsilon: None,
            sigma2: None,
            exact_up_to: 1000,
            node_budget: 200_000,
            work_budget: 20_000_000,
            swap_budget: 10_000,
            restarts: 16,
            spectral_steps: 50,
            spectral_up_to: 200,
            noise_batch: 128,
            graph_quality: false,
        }
    }
}

impl FedGsConfig {
    /// (ε, σ) of the 3DG's edges: the configured values, or the protocol's (paper
    /// ε = 0.1, σ² = 0.01 as its 3DG experiment states; code ε = 0.01, σ = 0.1, the
    /// defaults the authors' code calls its graph builder with).
    pub fn edge_parameters(&self) -> (f64, f64) {
        let (epsilon, sigma) = match self.protocol {
            Protocol::Paper => (0.1, 0.01),
            Protocol::Code => (0.01, 0.1),
        };
        (
            self.epsilon.unwrap_or(epsilon),
            self.sigma2.unwrap_or(sigma),
        )
    }

    /// Rejects values no run can use, naming the key: the `selection.fedgs` part of
    /// [`Config::validate`](crate::config::Config::validate).
    pub(crate) fn validate(&self) -> Result<(), ConfigError> {
        check(
            self.alpha.is_finite() && self.alpha >= 0.0,
            "selection.fedgs.alpha",
            "must be >= 0",
        )?;
        if let Some(epsilon) = self.epsilon {
            check_prob(epsilon, "selection.fedgs.epsilon", false, false)?;
        }
        if let Some(sigma2) = self.sigma2 {
            check_pos(sigma2, "selection.fedgs.sigma2")?;
        }
        check(
            self.noise_batch > 0,
            "selection.fedgs.noise_batch",
            "must be at least 1",
        )
    }
}

/// The FedGS selector.
#[derive(Debug, Clone)]
pub struct FedGs {
    cfg: FedGsConfig,
    n: usize,
    per_round: usize,
    oracle: Option<Vec<Vec<f64>>>,
    state: State,
    solves: Vec<SolveRecord>,
    /// The last round's available clients, k and [`solver::Problem::top_distance_sums`].
    top: Option<(Vec<usize>, usize, Vec<f64>)>,
}

/// What FedGS has learned: the graph distances and the selection counts.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
struct State {
    distances: Option<Vec<Vec<f64>>>,
    counts: Vec<u64>,
    /// The Table 3 diagnostic, one comparison per ε (named apart from the single
    /// (precision, recall, F1) earlier checkpoints hold, which are left unread).
    table3: Option<Vec<graph::EdgeQuality>>,
    edges: usize,
}

#[derive(Debug, Clone)]
struct SolveRecord {
    round: usize,
    available: usize,
    k: usize,
    value: f64,
    upper_bound: f64,
    proven: bool,
    nodes: usize,
    /// Mean graph distance h_ij over the selected pairs (0 with fewer than two).
    spread: f64,
    ms: f64,
}

impl FedGs {
    /// A selector with the given settings.
    pub fn new(cfg: FedGsConfig) -> Self {
        Self {
            cfg,
            n: 0,
            per_round: 0,
            oracle: None,
            state: State::default(),
            solves: Vec::new(),
            top: None,
        }
    }

    /// Shortest-path distances H of the 3DG, once built.
    pub fn distances(&self) -> Option<&[Vec<f64>]> {
        self.state.distances.as_deref()
    }

    /// The Gram matrix of all clients' features from the configured source: the
    /// selection graph and the Table 3 diagnostic each take their similarity from it.
    fn feature_gram(
        &self,
        query: &mut dyn ClientQuery,
        round: usize,
    ) -> Result<Vec<Vec<f64>>, Error> {
        let all: Vec<usize> = (0..self.n).collect();
        Ok(match self.cfg.graph {
            FedGsGraph::Oracle => graph::gram(self.oracle_features(round)?),
            FedGsGraph::Sspp => query.secure_gram(&all)?,
            FedGsGraph::Update => {
                let updates = query.local_updates(&all)?;
                let f: Vec<Vec<f64>> = updates
                    .iter()
                    .map(|u| u.iter().map(|&x| f64::from(x)).collect())
                    .collect();
                graph::gram(&f)
            }
            FedGsGraph::Functional => {
                let updates = query.local_updates(&all)?;
                let e = query.noise_responses(&updates, self.cfg.noise_batch)?;
                graph::gram(&e)
            }
        })
    }

    /// How the selection graph turns the features' Gram matrix into similarities, as the
    /// protocol computes them (module docs).
    fn selection_similarity(&self) -> graph::Similarity {
        use graph::Similarity::{ClippedCosine, Cosine, InnerProduct};
        let learned = matches!(self.cfg.graph, FedGsGraph::Update | FedGsGraph::Functional);
        match (self.cfg.protocol, learned) {
            (Protocol::Code, _) => Cosine,
            (Protocol::Paper, false) => InnerProduct,
            (Protocol::Paper, true) => ClippedCosine,
        }
    }

    fn oracle_features(&self, round: usize) -> Result<&[Vec<f64>], Error> {
        self.oracle.as_deref().ok_or_else(|| Error::Selection {
            selector: "fedgs".into(),
            round,
            reason: "the oracle graph needs oracle features".into(),
        })
    }

    /// The 3DG's edge lengths from similarities, with the protocol's rule.
    fn adjacency(&self, similarity: &[Vec<f64>]) -> Vec<Vec<f64>> {
        let (epsilon, sigma) = self.cfg.edge_parameters();
        graph::adjacency(similarity, epsilon, sigma, self.cfg.protocol)
    }

    fn build_graph(&mut self, query: &mut dyn ClientQuery, round: usize) -> Result<(), Error> {
        let gram = self.feature_gram(query, round)?;
        if self.cfg.graph_quality {
            self.state.table3 = Some(self.table3(&gram, round)?);
        }
        let similarity = graph::from_gram(&gram, self.selection_similarity());
        drop(gram);
        let adj = self.adjacency(&similarity);
        drop(similarity);
        self.state.edges = (0..self.n)
            .map(|i| (i + 1..self.n).filter(|&j| adj[i][j].is_finite()).count())
            .sum();
        self.state.distances = Some(graph::shortest_paths(adj));
        self.top = None;
        Ok(())
    }

    /// FedGS Table 3 for this graph's features, with the similarities of the authors'
    /// `algorithm/3DG_builder.py` whatever the protocol: the oracle is the inner product of
    /// the label distributions, the constructed graph the clipped cosine of updates or
    /// noise responses (the inner product itself for the oracle and SSPP sources), neither
    /// min–max normalised ([`graph::table3_quality`]).
    fn table3(&self, gram: &[Vec<f64>], round: usize) -> Result<Vec<graph::EdgeQuality>, Error> {
        use graph::Similarity::{ClippedCosine, InnerProduct};
        let kind = match self.cfg.graph {
            FedGsGraph::Oracle | FedGsGraph::Sspp => InnerProduct,
            FedGsGraph::Update | FedGsGraph::Functional => ClippedCosine,
        };
        let oracle = graph::similarity(self.oracle_features(round)?, InnerProduct);
        Ok(graph::table3_quality(
            &graph::from_gram(gram, kind),
            &oracle,
        ))
    }
}

impl Selector for FedGs {
    fn name(&self) -> &'static str {
        "fedgs"
    }

    fn needs(&self) -> Needs {
        Needs {
            oracle_features: self.cfg.graph == FedGsGraph::Oracle || self.cfg.graph_quality,
            ..Needs::default()
        }
    }

    fn setup(&mut self, setup: &Setup) {
        self.n = setup.sizes.len();
        self.per_round = setup.per_round;
        self.oracle = setup.oracle_features.clone();
        self.state.counts = vec![0; self.n];
    }

    /// FedGS §3.2 assumes every client is available in the initial phase, so that the
    /// server has the 3DG before training starts; this is that phase.
    fn initial_phase(&mut self, query: &mut dyn ClientQuery) -> Result<(), Error> {
        self.build_graph(query, 0)
    }

    fn select(
        &mut self,
        ctx: &RoundContext<'_>,
        _: &mut dyn ClientQuery,
        _: &mut Rng,
    ) -> Result<Selection, Error> {
        let started = std::time::Instant::now();
        let h = self
            .state
            .distances
            .as_ref()
            .ok_or_else(|| Error::Selection {
                selector: "fedgs".into(),
                round: ctx.round,
                reason: "the 3DG is not built: the initial phase did not run".into(),
            })?;
        let a = ctx.available;
        let k = ctx.budget.min(a.len());
        let n = self.n as f64;
        let m = ctx.budget as f64;
        let mean_v = self.state.counts.iter().sum::<u64>() as f64 / n.max(1.0);
        let z: Vec<f64> = a
            .iter()
            .map(|&i| 2.0 * (self.state.counts[i] as f64 - mean_v - m / n) + 1.0)
            .collect();
        let (pair_weight, linear): (f64, Vec<f64>) = match self.cfg.protocol {
            // Eq. 16: sᵀHs counts each unordered pair twice.
            Protocol::Paper => (2.0 * self.cfg.alpha / n, z.iter().map(|z| -z).collect()),
            Protocol::Code => (
                if k > 1 {
                    2.0 * self.cfg.alpha / (k * (k - 1)) as f64
                } else {
                    0.0
                },
                z.iter().map(|z| -z / (n - 1.0).max(1.0)).collect(),
            ),
        };
        // With every client available the instance's distances are H itself; otherwise
        // the available clients' rows and columns of it.
        let sub: Vec<Vec<f64>>;
        let dist: &[Vec<f64>] = if a.iter().enumerate().all(|(x, &i)| x == i) && a.len() == h.len()
        {
            h
        } else {
            sub = a
                .iter()
                .map(|&i| a.iter().map(|&j| h[i][j]).collect())
                .collect();
            &sub
        };
        let problem = solver::Problem {
            dist,
            pair_weight,
            linear: &linear,
            k,
        };
        // The top-distance sums depend on the available set and k only: a round with the
        // same ones as the last reuses them (O(n²) a round saved at full availability).
        let top = match self.top.take() {
            Some((avail, kept_k, top)) if kept_k == k && avail == a => (avail, kept_k, top),
            _ => (a.to_vec(), k, problem.top_distance_sums()),
        };
        let sol = solver::solve_with(
            &problem,
            solver::Limits {
                exact_up_to: self.cfg.exact_up_to,
                node_budget: self.cfg.node_budget,
                work_budget: self.cfg.work_budget,
                swap_budget: self.cfg.swap_budget,
                restarts: self.cfg.restarts,
                spectral_steps: self.cfg.spectral_steps,
                spectral_up_to: self.cfg.spectral_up_to,
            },
            &top.2,
        );
        self.top = Some(top);
        let pairs = sol.chosen.len() * sol.chosen.len().saturating_sub(1) / 2;
        let spread = if pairs == 0 {
            0.0
        } else {
            let mut sum = 0.0;
            for (x, &i) in sol.chosen.iter().enumerate() {
                for &j in &sol.chosen[x + 1..] {
                    sum += dist[i][j];
                }
            }
            sum / pairs as f64
        };
        self.solves.push(SolveRecord {
            spread,
            round: ctx.round,
            available: a.len(),
            k,
            value: sol.value,
            upper_bound: sol.upper_bound,
            proven: sol.proven,
            nodes: sol.nodes,
            ms: started.elapsed().as_secs_f64() * 1e3,
        });
        Ok(Selection {
            clients: sol.chosen.iter().map(|&i| a[i]).collect(),
            weights: None,
        })
    }

    fn observe(&mut self, feedback: &super::Feedback<'_>) {
        for &k in feedback.selected {
            self.state.counts[k] += 1;
        }
    }

    fn save(&self) -> serde_json::Value {
        super::save_state(&self.state)
    }

    fn load(&mut self, state: &serde_json::Value) -> Result<(), Error> {
        let loaded: State = super::load_state("fedgs", state)?;
        super::check_loaded("fedgs", "selection counts", loaded.counts.len(), self.n)?;
        if let Some(d) = &loaded.distances {
            super::check_loaded("fedgs", "distance rows", d.len(), self.n)?;
            for row in d {
                super::check_loaded("fedgs", "distances in a row", row.len(), self.n)?;
            }
        }
        self.state = loaded;
        self.top = None;
        Ok(())
    }

    fn reports(&self) -> Vec<(String, String)> {
        let mut solves = String::from(
            "round,available,k,value,upper_bound,gap,proven,nodes,mean_distance,solve_ms\n",
        );
        for s in &self.solves {
            solves.push_str(&format!(
                "{},{},{},{:.6},{:.6},{:.6},{},{},{:.6},{:.3}\n",
                s.round,
                s.available,
                s.k,
                s.value,
                s.upper_bound,
                s.upper_bound - s.value,
                s.proven,
                s.nodes,
                s.spread,
                s.ms
            ));
        }
        let mut files = vec![("fedgs_solver.csv".to_string(), solves)];
        let graph = format!(
            "{:?},{},{}",
            self.cfg.graph,
            self.state.edges,
            self.n * self.n.saturating_sub(1) / 2
        );
        let g = match &self.state.table3 {
            None => format!("graph,edges,pairs\n{graph}\n"),
            Some(rows) => {
                let mut g = String::from(
                    "graph,edges,pairs,epsilon,built_edges,oracle_edges,matched,\
                     precision,recall,f1,precision_offdiag,recall_offdiag,f1_offdiag\n",
                );
                for q in rows {
                    let (p, r, f1) = q.as_code();
                    let (po, ro, f1o) = q.off_diagonal();
                    g.push_str(&format!(
                        "{graph},{},{},{},{},{p:.6},{r:.6},{f1:.6},{po:.6},{ro:.6},{f1o:.6}\n",
                        q.epsilon, q.built, q.oracle, q.matched
                    ));
                }
                g
            }
        };
        files.push(("fedgs_graph.csv".into(), g));
        files
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rng::{Purpose, stream};
    use crate::select::testing::{FixedLosses, setup};
    use crate::select::{Feedback, RoundContext};

    /// A FedGS selector on a given distance matrix H, with every count 0.
    fn on_graph(h: Vec<Vec<f64>>, alpha: f64, protocol: Protocol) -> FedGs {
        let n = h.len();
        let mut s = FedGs::new(FedGsConfig {
            alpha,
            protocol,
            ..FedGsConfig::default()
        });
        s.setup(&Setup {
            per_round: 2,
            ..setup(&vec![1.0 / n as f64; n])
        });
        s.state.distances = Some(h);
        s
    }

    fn pick(s: &mut FedGs, round: usize, available: &[usize], budget: usize) -> Vec<usize> {
        let ctx = RoundContext {
            round,
            available,
            budget,
            clock_s: None,
        };
        let mut rng = stream(1, Purpose::Selection, round as u64, 0);
        let sel = s
            .select(&ctx, &mut FixedLosses(vec![]), &mut rng)
            .unwrap()
            .clients;
        s.observe(&Feedback {
            round,
            selected: &sel,
            train_losses: &vec![0.0; sel.len()],
            updates: None,
            durations: None,
            dropped: None,
        });
        sel
    }

    /// Two clusters {0, 1} and {2, 3}: 0.1 inside a cluster, 1 across.
    fn two_clusters() -> Vec<Vec<f64>> {
        (0..4)
            .map(|i| {
                (0..4)
                    .map(|j| match (i == j, i / 2 == j / 2) {
                        (true, _) => 0.0,
                        (false, true) => 0.1,
                        (false, false) => 1.0,
                    })
                    .collect()
            })
            .collect()
    }

    /// The Table 3 diagnostic on an update graph, by hand. Updates (1, 0, 0), (1, 1, 0),
    /// (0, 1, 1), (−1, 0, 1) have clipped cosines 1/√2 (0–1), ½ (1–2, 2–3) and 0 elsewhere;
    /// the label distributions of the graph module's Table 3 test join {0–1, 1–2, 2–3} in
    /// the oracle. Every ε up to 0.2 finds exactly those (F1 1); ε = 0.5 keeps 0–1 only:
    /// with the 4 self-pairs P = 5/5, R = 5/7, F1 = 2/(1 + 7/5) = 5/6; without them
    /// P = 1, R = 1/3, F1 = ½. Under `code` the selection graph is the min–max normalised
    /// unclipped cosine, and its distances do not depend on the diagnostic.
    #[test]
    fn graph_quality_reports_table3_per_epsilon_and_leaves_the_selection_graph_alone() {
        let labels = vec![
            vec![0.5, 0.5, 0.0, 0.0],
            vec![0.5, 0.0, 0.5, 0.0],
            vec![0.0, 0.0, 0.5, 0.5],
            vec![0.2, 0.0, 0.0, 0.8],
        ];
        let updates = [
            vec![1.0, 0.0, 0.0],
            vec![1.0, 1.0, 0.0],
            vec![0.0, 1.0, 1.0],
            vec![-1.0, 0.0, 1.0],
        ];
        let build = |protocol, graph_quality| {
            let mut s = FedGs::new(FedGsConfig {
                graph: FedGsGraph::Update,
                protocol,
                graph_quality,
                ..FedGsConfig::default()
            });
            s.setup(&Setup {
                oracle_features: Some(labels.clone()),
                ..setup(&[0.25; 4])
            });
            s.initial_phase(&mut crate::select::testing::Vectors::new(|_, k| {
                updates[k].clone()
            }))
            .unwrap();
            s
        };
        for protocol in [Protocol::Paper, Protocol::Code] {
            let (with, without) = (build(protocol, true), build(protocol, false));
            assert_eq!(with.distances(), without.distances());
            let reports = with.reports();
            let csv = &reports.iter().find(|f| f.0 == "fedgs_graph.csv").unwrap().1;
            let lines: Vec<&str> = csv.lines().collect();
            assert_eq!(lines.len(), 1 + graph::TABLE3_EPSILONS.len(), "{csv}");
            assert!(lines[0].ends_with(",precision_offdiag,recall_offdiag,f1_offdiag"));
            let edges = with.state.edges;
            for line in &lines[1..6] {
                let fields: Vec<&str> = line.split(',').collect();
                assert_eq!(fields[0..3], ["Update", &edges.to_string(), "6"]);
                assert_eq!(fields[4..7], ["3", "3", "3"], "{line}");
                assert_eq!(fields[9], "1.000000");
            }
            assert_eq!(
                lines[6],
                format!(
                    "Update,{edges},6,0.5,1,3,1,1.000000,0.714286,0.833333,1.000000,0.333333,0.500000"
                )
            );
        }
    }

    /// At the paper's 100 clients (two labels each, FMNIST's setting), under both
    /// protocols, rounds of full and of partial availability pick the clients that the
    /// textbook Floyd–Warshall distances give, and the top-distance sums kept from the
    /// last round pick as sums computed afresh.
    #[test]
    fn selections_are_the_textbook_graphs_at_the_paper_size() {
        use rand::Rng as _;
        let n = 100;
        let features: Vec<Vec<f64>> = (0..n)
            .map(|k| {
                let mut f = vec![0.0; 10];
                f[k % 10] += 0.5;
                f[(k / 10 + 3 * k + 1) % 10] += 0.5;
                f
            })
            .collect();
        for protocol in [Protocol::Paper, Protocol::Code] {
            let cfg = FedGsConfig {
                protocol,
                ..FedGsConfig::default()
            };
            let build = || {
                let mut s = FedGs::new(cfg.clone());
                s.setup(&Setup {
                    per_round: 10,
                    oracle_features: Some(features.clone()),
                    ..setup(&vec![1.0 / n as f64; n])
                });
                s
            };
            let mut phased = build();
            phased.initial_phase(&mut FixedLosses(vec![])).unwrap();
            let mut textbook = build();
            let adj = textbook.adjacency(&graph::similarity(
                &features,
                textbook.selection_similarity(),
            ));
            textbook.state.distances = Some(graph::tests::textbook_shortest_paths(&adj));
            assert_eq!(phased.distances(), textbook.distances());
            let mut fresh = build();
            fresh.state.distances = textbook.state.distances.clone();
            let mut rng = stream(3, Purpose::Availability, 0, 0);
            for t in 0..12 {
                let available: Vec<usize> = if t % 3 == 2 {
                    (0..n).filter(|_| rng.random::<f64>() < 0.6).collect()
                } else {
                    (0..n).collect()
                };
                fresh.top = None;
                let want = pick(&mut textbook, t, &available, 10);
                assert_eq!(pick(&mut phased, t, &available, 10), want, "round {t}");
                assert_eq!(pick(&mut fresh, t, &available, 10), want, "round {t}");
            }
        }
    }

    #[test]
    fn under_code_alpha_spreads_the_selection_over_the_graph() {
        // Counts are tied, so with α = 0 every pair scores the same and the lowest ids,
        // the adjacent pair {0, 1}, win; any α > 0 under `code` takes one client of each
        // cluster, whatever the counts' tie.
        let mut s = on_graph(two_clusters(), 0.0, Protocol::Code);
        assert_eq!(pick(&mut s, 0, &[0, 1, 2, 3], 2), vec![0, 1]);
        for alpha in [0.1, 1.0, 5.0] {
            let mut s = on_graph(two_clusters(), alpha, Protocol::Code);
            let sel = pick(&mut s, 0, &[0, 1, 2, 3], 2);
            assert_ne!(sel[0] / 2, sel[1] / 2, "α = {alpha}: {sel:?}");
        }
        // Under `paper` the pair weight is 2α/N, enough to break the counts' tie.
        let mut s = on_graph(two_clusters(), 0.1, Protocol::Paper);
        let sel = pick(&mut s, 0, &[0, 1, 2, 3], 2);
        assert_ne!(sel[0] / 2, sel[1] / 2);
    }

    #[test]
    fn counts_steer_towards_the_least_selected_and_the_budget_is_min_m_available() {
        // z_i = 2(v_i − v̄ − M/N) + 1 grows with v_i: after round 0 picks {0, 1} (α = 0,
        // ties to the lowest ids), round 1 must pick {2, 3}, the unpicked ones.
        let mut s = on_graph(two_clusters(), 0.0, Protocol::Paper);
        assert_eq!(pick(&mut s, 0, &[0, 1, 2, 3], 2), vec![0, 1]);
        assert_eq!(s.state.counts, vec![1, 1, 0, 0]);
        assert_eq!(pick(&mut s, 1, &[0, 1, 2, 3], 2), vec![2, 3]);
        assert_eq!(s.state.counts, vec![1, 1, 1, 1]);
        // Only available clients, and |S| = min(M, |A_t|).
        assert_eq!(pick(&mut s, 2, &[3], 2), vec![3]);
        let sel = pick(&mut s, 3, &[0, 2, 3], 2);
        assert_eq!(sel.len(), 2);
        assert!(sel.iter().all(|k| [0, 2, 3].contains(k)));
    }
}
