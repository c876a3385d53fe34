//! The core's integration tests as one test binary: each file is a module, so the release
//! profile links (with LTO) once instead of once per file.

mod advantage_properties;
mod counterfactual_calibration;
mod fuzz_inputs;
mod graph_properties;
mod ingest_properties;
mod metrics_properties;
mod shapley_calibration;
mod shapley_noise;
mod shapley_pipeline;
mod shapley_players;
mod shapley_properties;
mod validation;
