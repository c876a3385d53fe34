//! Advantages for RL on orchestration traces: group normalisation of rewards (GRPO, Dr.GRPO,
//! RLOO, REINFORCE++-baseline, OPO), stratified over the shape of the trace (agent, role,
//! depth, turn, event type), loss weights that keep wide traces from drowning narrow ones,
//! and returns over the event graph (discounted return-to-go, MAGRPO tree returns, GAE,
//! MARSHAL turn returns).
//!
//! Layers, one idea each: [`spec`] says what to compute, [`cell`] holds the statistics of one
//! normalisation cell and applies an estimator's formula (native f64, or a trainer's fp32
//! arithmetic), [`kernel`] partitions rows into groups and strata and runs the cells in
//! parallel, `small` takes the small groups (GRPO rollouts) on its fast paths, `scatter` takes
//! groups scattered over the rows (after a shuffle) as tables indexed by group, all writing
//! their results in an [`AdvantageFloat`] ([`float`]), [`strata`] derives per-event stratum
//! codes from a batch, [`batch`] turns a [`crate::TraceBatch`] into rows and back,
//! [`weights`] computes loss weights, and [`returns`] walks the event graph. What they read
//! of a batch comes from [`crate::trace_view`].

pub mod batch;
mod cell;
pub mod float;
pub mod kernel;
pub mod returns;
mod rows;
mod scatter;
mod small;
pub mod spec;
pub mod strata;
pub mod torch_sqrt;
mod torch_sum;
mod trainer_scatter;
pub mod weights;

pub use crate::store::{trace_channel, trace_text_codes};
pub use crate::trace::Unit;
pub use batch::{BatchAdvantages, BatchOptions, batch_advantages};
pub use float::AdvantageFloat;
pub use kernel::{dense_codes, normalize, normalize_labels};
pub use returns::{ReturnKind, graph_gae, graph_returns};
pub use rows::Rows;
pub use spec::{Compat, Estimator, Scale, Spec};
pub use strata::{Stratum, strata_codes};
pub use torch_sqrt::{SqrtKernel, torch_sqrt};
