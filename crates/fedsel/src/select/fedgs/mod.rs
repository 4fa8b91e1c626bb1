//! FedGS (Wang et al., AAAI 2023; seed 002): federated graph-based sampling
//! under arbitrary client availability.
//!
//! Before the first round the server builds the 3DG once (Alg. 1 lines 2–3):
//! client features (oracle, oracle through secure scalar products, functional
//! similarity Eq. 12, or update cosine Eq. 11) → similarities → edges of
//! length e^{−V/σ²} where V ≥ ε → Floyd–Warshall distances H. Each round it
//! solves Eq. 16–17 over the available clients A_t with |S| = min(M, |A_t|):
//!
//!   max (α/N) Σ_{i≠j∈S} h_ij − Σ_{i∈S} z_i,  z_i = 2(v_i − v̄ − M/N) + 1,
//!
//! where v counts past selections (Alg. 1 line 15), which balances the
//! sampling counts while spreading the sample over the graph. Aggregation is
//! by data size over the selected (Eq. 18): use `aggregation = "data_size"`.

pub mod graph;
pub mod solver;

use serde::{Deserialize, Serialize};

use super::{ClientQuery, Needs, RoundContext, Selection, Selector, Setup};
use crate::config::{FedGsConfig, FedGsGraph, FedGsObjective};
use crate::error::Error;
use crate::rng::Rng;

/// The FedGS selector.
#[derive(Debug, Clone)]
pub struct FedGs {
    cfg: FedGsConfig,
    n: usize,
    per_round: usize,
    oracle: Option<Vec<Vec<f64>>>,
    state: State,
    solves: Vec<SolveRecord>,
}

/// What FedGS has learned: the graph distances and the selection counts.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
struct State {
    distances: Option<Vec<Vec<f64>>>,
    counts: Vec<u64>,
    quality: Option<(f64, f64, f64)>,
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
        }
    }

    /// Shortest-path distances H of the 3DG, once built.
    pub fn distances(&self) -> Option<&[Vec<f64>]> {
        self.state.distances.as_deref()
    }

    /// Similarities of all clients from the configured source.
    fn similarity(
        &self,
        query: &mut dyn ClientQuery,
        round: usize,
    ) -> Result<Vec<Vec<f64>>, Error> {
        let all: Vec<usize> = (0..self.n).collect();
        Ok(match self.cfg.graph {
            FedGsGraph::Oracle => {
                graph::cosine_similarity(self.oracle.as_ref().ok_or_else(|| Error::Selection {
                    selector: "fedgs".into(),
                    round,
                    reason: "the oracle graph needs oracle features".into(),
                })?)
            }
            FedGsGraph::Sspp => {
                let gram = query.secure_gram(&all)?;
                let sq: Vec<f64> = (0..self.n).map(|i| gram[i][i]).collect();
                graph::similarity_from_gram(&gram, &sq)
            }
            FedGsGraph::Update => {
                let updates = query.local_updates(&all)?;
                let f: Vec<Vec<f64>> = updates
                    .iter()
                    .map(|u| u.iter().map(|&x| f64::from(x)).collect())
                    .collect();
                graph::cosine_similarity(&f)
            }
            FedGsGraph::Functional => {
                let updates = query.local_updates(&all)?;
                let e = query.noise_responses(&updates, self.cfg.noise_batch)?;
                graph::cosine_similarity(&e)
            }
        })
    }

    fn build_graph(&mut self, query: &mut dyn ClientQuery, round: usize) -> Result<(), Error> {
        let sim = self.similarity(query, round)?;
        let adj = graph::adjacency(&sim, self.cfg.epsilon, self.cfg.sigma2);
        self.state.edges = (0..self.n)
            .map(|i| (i + 1..self.n).filter(|&j| adj[i][j].is_finite()).count())
            .sum();
        if self.cfg.graph_quality {
            let oracle = graph::adjacency(
                &graph::cosine_similarity(self.oracle.as_ref().expect("asked for at setup")),
                self.cfg.epsilon,
                self.cfg.sigma2,
            );
            self.state.quality = Some(graph::edge_quality(&adj, &oracle));
        }
        self.state.distances = Some(graph::shortest_paths(&adj));
        Ok(())
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
        let (pair_weight, linear): (f64, Vec<f64>) = match self.cfg.objective {
            // Eq. 16: sᵀHs counts each unordered pair twice.
            FedGsObjective::Paper => (2.0 * self.cfg.alpha / n, z.iter().map(|z| -z).collect()),
            FedGsObjective::Code => (
                if k > 1 {
                    2.0 * self.cfg.alpha / (k * (k - 1)) as f64
                } else {
                    0.0
                },
                z.iter().map(|z| -z / (n - 1.0).max(1.0)).collect(),
            ),
        };
        let dist: Vec<Vec<f64>> = a
            .iter()
            .map(|&i| a.iter().map(|&j| h[i][j]).collect())
            .collect();
        let sol = solver::solve(
            &solver::Problem {
                dist: &dist,
                pair_weight,
                linear: &linear,
                k,
            },
            solver::Limits {
                exact_up_to: self.cfg.exact_up_to,
                node_budget: self.cfg.node_budget,
                swap_budget: self.cfg.swap_budget,
            },
        );
        self.solves.push(SolveRecord {
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
        self.state = super::load_state("fedgs", state)?;
        Ok(())
    }

    fn reports(&self) -> Vec<(String, String)> {
        let mut solves =
            String::from("round,available,k,value,upper_bound,gap,proven,nodes,solve_ms\n");
        for s in &self.solves {
            solves.push_str(&format!(
                "{},{},{},{:.6},{:.6},{:.6},{},{},{:.3}\n",
                s.round,
                s.available,
                s.k,
                s.value,
                s.upper_bound,
                s.upper_bound - s.value,
                s.proven,
                s.nodes,
                s.ms
            ));
        }
        let mut files = vec![("fedgs_solver.csv".to_string(), solves)];
        let mut g = format!(
            "graph,edges,pairs\n{:?},{},{}\n",
            self.cfg.graph,
            self.state.edges,
            self.n * self.n.saturating_sub(1) / 2
        );
        if let Some((p, r, f1)) = self.state.quality {
            g = format!(
                "graph,edges,pairs,precision,recall,f1\n{:?},{},{},{p:.4},{r:.4},{f1:.4}\n",
                self.cfg.graph,
                self.state.edges,
                self.n * self.n.saturating_sub(1) / 2
            );
        }
        files.push(("fedgs_graph.csv".into(), g));
        files
    }
}
