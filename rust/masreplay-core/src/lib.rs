//! masreplay-core: the pure-Rust storage and credit engine behind the `masreplay` Python
//! package. Data flows one way: source -> [`validate`] -> [`store`] / [`graph`] -> [`trace_view`] -> estimators.

pub mod advantage;
pub mod buffer;
pub mod convert;
pub mod counterfactual;
pub mod error;
pub mod graph;
pub mod interrupt;
pub mod limit;
pub mod metrics;
pub mod names;
pub mod parallel;
mod prefetch;
mod rank_sort;
pub mod rng;
pub mod shapley;
pub mod sim;
mod stamped;
pub mod store;
pub mod student_t;
pub mod trace;
pub mod trace_view;
pub mod validate;

pub use error::{MasreplayError, Result, ValidationError, split_outcomes};
pub use names::Named;
pub use store::TraceBatch;
pub use trace::{EdgeType, Event, EventType, Trace};
pub use validate::ValidateOptions;
