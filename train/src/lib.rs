//! `pipeweave-train`: training through pipeweave's schedules.
//!
//! - [`cut`]: a GPT cut into a plan's stages (embedding first, head last, blocks spread, mirrored
//!   replicas sharing one set of weights);
//! - [`batch`]: a step's tokens and the global loss normaliser;
//! - [`stage`]: [`GptStage`], one rank's share as a `StageCompute` honouring every marker;
//! - [`experts`]: mixtures of experts in training: the load-balancing loss per microbatch and
//!   expert parallelism (each pipeline rank `X` expert ranks exchanging their experts' rows);
//! - [`gradients`]: the [`GradSync`] trait and its in-process, optionally deterministic fold;
//!   [`reduce`]: the same sums between processes (an ordered reduction over point-to-point
//!   messages);
//! - [`step`]: [`StepRunner`] (a plan's checked programs, run for any model) and [`GptModel`];
//! - [`timeline`]: a step's measured timeline (SVG, Perfetto trace) beside the simulator's
//!   prediction from measured op costs;
//! - [`cluster`]: where a step's ranks run ([`ThreadsCluster`]; `mpi::MpiCluster` with the cargo
//!   feature `mpi`) and how their losses, gradients and norms meet;
//! - [`trainer`]: the training loop ([`Trainer`]): steps, clipping, AdamW, evaluation through the
//!   forward-only programs, checkpoints that resume bit for bit;
//! - [`data`]: the byte corpus (any UTF-8 text, by default the checkout's own sources), its
//!   held-out split and the seeded loader ([`documents`]: variable-length sequences cut at
//!   document boundaries); [`optim`]: AdamW and global-norm clipping;
//!   [`schedule`]: warm-up + cosine learning rate; [`checkpoint`]: GPT-2 checkpoints in
//!   safetensors with optimizer state, step, data position; [`curve`]: the loss-curve SVG;
//!   [`progress`]: the terminal progress bar;
//! - [`profile`]: the measured per-layer costs (`train_gpt --profile`) that `pipeweave plan
//!   --profile` sums for any cut;
//! - [`allocator`]: glibc's allocator set to keep freed activations for the next microbatch;
//! - [`command`]: the trainer's command-line front door (`pipeweave train`, `train_gpt`): its
//!   options, the backend choice and the run;
//! - [`error`]: [`TrainError`], the crate's one error type.
#![warn(missing_docs)]

pub mod allocator;
pub mod batch;
pub mod checkpoint;
pub mod chunks;
pub mod cluster;
pub mod command;
pub mod curve;
pub mod cut;
pub mod data;
pub mod documents;
pub mod error;
pub mod experts;
pub mod gradients;
mod host_link;
#[cfg(feature = "mpi")]
pub mod mpi;
pub mod optim;
pub mod profile;
pub mod progress;
pub mod reduce;
pub mod schedule;
pub mod stage;
pub mod step;
pub mod timeline;
pub mod trainer;

pub use batch::{StepBatch, PAD_ID};
pub use checkpoint::{Checkpoint, CheckpointMeta};
pub use cluster::{Cluster, ClusterStep, ThreadsCluster};
pub use curve::LossCurve;
pub use cut::ModelCut;
pub use data::{BatchShape, Corpus, DataPosition, GlobalBatch, Loader};
pub use error::TrainError;
pub use gradients::{GradSync, LocalGradients};
pub use optim::{AdamW, AdamWConfig, OptimizerState};
pub use profile::{
    calibrate, measure_profile, measure_profile_on, GptProfileModel, ProfileRequest,
};
pub use progress::Progress;
pub use schedule::LrSchedule;
pub use stage::{GptStage, Injection, MeasuredOp, Pairs};
pub use step::{GptModel, StepOutcome, StepRunner};
pub use timeline::{pipeline_overhead, step_timeline, PipelineOverhead, StepTimeline};
pub use trainer::{StepLog, TrainSettings, Trainer, CALIBRATION_STEPS};
