//! GPT-2 checkpoints: [`save`] and [`load`] the weights, the optimizer state and the run's
//! position ([`CheckpointMeta`]), in files that Hugging Face transformers can load.
//!
//! A checkpoint `FILE` is three files, each written atomically (a temporary file renamed into
//! place; the weights file last):
//!
//! - `FILE`: the weights as safetensors, under `GPT2LMHeadModel`'s names and layouts
//!   ([`expected_parameters`]) and nothing else, so that `load_state_dict(load_file(FILE))`
//!   loads strictly; its metadata holds `"format": "pt"` (which transformers requires) and
//!   `"pipeweave"`, the JSON of the [`CheckpointMeta`];
//! - `FILE.config.json` ([`config_path`]): GPT-2's `config.json` ([`gpt2_config_json`]);
//! - `FILE.optim.safetensors` ([`optimizer_path`]): the AdamW moments as
//!   `optimizer.m.<name>` / `optimizer.v.<name>`, with the same `"pipeweave"` metadata (so a
//!   stray file of another checkpoint is noticed) and the optimizer's step count.
//!
//! To load the model with `GPT2LMHeadModel.from_pretrained(folder)`, put `FILE` in a folder as
//! `model.safetensors` and `FILE.config.json` as `config.json`. The model is GPT-2's architecture
//! with an untied `lm_head` (`tie_word_embeddings: false`); the causal-mask buffers
//! `attn.bias` are not persistent in transformers and are not written. The byte vocabulary has
//! no special tokens: `bos_token_id` and `eos_token_id` are set to 0 (the NUL byte, absent from
//! text), so generation never stops early on a real byte.
//!
//! A model whose blocks have a mixture of experts (`--experts`) is saved the same way, each
//! block's `mlp.*` replaced by `moe.router.*` and `moe.experts.{e}.*`, its shape in the record and
//! in `config.json`: the files read back here (any expert parallelism), but `GPT2LMHeadModel`
//! does not load them.
//!
//! This file holds what a checkpoint is and checks; `files.rs` the safetensors files themselves
//! (tensors to and from their bytes, written atomically).

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

use candle_core::{DType, Tensor};
use pipeweave_kernels::{GptConfig, MoeConfig, StageLayout, StageModel};
use serde::{Deserialize, Serialize};

use crate::data::DataPosition;
use crate::error::{Result, TrainError};
use crate::optim::OptimizerState;
use files::{read_safetensors, serialize, with_suffix, write_atomically};

mod files;
/// The metadata key of the pipeweave record.
const META_KEY: &str = "pipeweave";
/// The metadata key of the optimizer's step count (in the optimizer file).
const OPTIMIZER_STEP_KEY: &str = "pipeweave.optimizer_step";
/// The version of the pipeweave record.
const META_VERSION: u32 = 1;

/// Where a run stands, saved with its weights.
#[derive(Debug, Clone, PartialEq)]
pub struct CheckpointMeta {
    /// Optimizer steps completed.
    pub step: u64,
    /// The data loader's position after those steps.
    pub data: DataPosition,
    /// The state of the run's random generators, if any.
    pub rng: Vec<u64>,
    /// A fingerprint of the schedule (and whatever else a resumed run must share).
    pub schedule: String,
    /// The model's shape.
    pub config: GptConfig,
}

/// A loaded checkpoint.
#[derive(Debug, Clone)]
pub struct Checkpoint {
    /// The weights by GPT-2 name.
    pub weights: BTreeMap<String, Tensor>,
    /// The optimizer's moments by parameter name, and its step count.
    pub optimizer: OptimizerState,
    /// The run's position and model.
    pub meta: CheckpointMeta,
}

/// The model fields of the record, under GPT-2's names (and the blocks' mixture of experts,
/// absent for GPT-2's MLPs).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct ModelRecord {
    vocab_size: usize,
    n_positions: usize,
    n_embd: usize,
    n_layer: usize,
    n_head: usize,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    moe: Option<MoeRecord>,
}

/// The blocks' mixture of experts in the record.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct MoeRecord {
    experts: usize,
    top_k: usize,
    hidden: usize,
    aux_coefficient: f64,
}

/// [`CheckpointMeta`] as JSON in the safetensors metadata.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct MetaRecord {
    version: u32,
    step: u64,
    data: DataPosition,
    rng: Vec<u64>,
    schedule: String,
    model: ModelRecord,
}

impl ModelRecord {
    fn of(config: &GptConfig) -> Self {
        ModelRecord {
            vocab_size: config.vocab_size(),
            n_positions: config.max_seq_len(),
            n_embd: config.d_model(),
            n_layer: config.n_layer(),
            n_head: config.n_head(),
            moe: config.moe().map(|moe| MoeRecord {
                experts: moe.experts(),
                top_k: moe.top_k(),
                hidden: moe.hidden(),
                aux_coefficient: moe.aux_coefficient(),
            }),
        }
    }

    /// `(field name, value)` in the order they are compared: GPT-2's, then the mixture's
    /// shape (0 for GPT-2's MLPs; its loss's coefficient may change between runs).
    fn fields(&self) -> [(&'static str, usize); 8] {
        let moe = self.moe.as_ref();
        [
            ("n_layer", self.n_layer),
            ("n_embd", self.n_embd),
            ("n_head", self.n_head),
            ("n_positions", self.n_positions),
            ("vocab_size", self.vocab_size),
            ("n_experts", moe.map_or(0, |m| m.experts)),
            ("n_experts_per_token", moe.map_or(0, |m| m.top_k)),
            ("expert_n_inner", moe.map_or(0, |m| m.hidden)),
        ]
    }

    fn config(&self) -> std::result::Result<GptConfig, String> {
        let config = GptConfig::new(self.n_layer, self.n_embd, self.n_head, self.n_positions)
            .and_then(|c| c.with_vocab_size(self.vocab_size))
            .map_err(|e| e.to_string())?;
        let Some(moe) = &self.moe else {
            return Ok(config);
        };
        MoeConfig::new(moe.experts, moe.top_k, moe.hidden, moe.aux_coefficient)
            .map(|moe| config.with_moe(moe))
            .map_err(|e| e.to_string())
    }
}

impl CheckpointMeta {
    fn record(&self) -> MetaRecord {
        MetaRecord {
            version: META_VERSION,
            step: self.step,
            data: self.data,
            rng: self.rng.clone(),
            schedule: self.schedule.clone(),
            model: ModelRecord::of(&self.config),
        }
    }

    /// Fails with [`TrainError::ConfigMismatch`], naming the first differing GPT-2 field,
    /// unless the checkpoint at `path` was made for `expected`.
    pub fn check_model(&self, path: &Path, expected: &GptConfig) -> Result<()> {
        let (ours, theirs) = (ModelRecord::of(&self.config), ModelRecord::of(expected));
        for ((field, checkpoint), (_, expected)) in ours.fields().into_iter().zip(theirs.fields()) {
            if checkpoint != expected {
                return Err(TrainError::ConfigMismatch {
                    path: path.to_path_buf(),
                    field,
                    checkpoint: checkpoint.to_string(),
                    expected: expected.to_string(),
                });
            }
        }
        Ok(())
    }

    /// Fails with [`TrainError::ScheduleMismatch`] unless the checkpoint at `path` has the
    /// schedule fingerprint `expected`.
    pub fn check_schedule(&self, path: &Path, expected: &str) -> Result<()> {
        if self.schedule == expected {
            return Ok(());
        }
        Err(TrainError::ScheduleMismatch {
            path: path.to_path_buf(),
            checkpoint: self.schedule.clone(),
            expected: expected.to_string(),
        })
    }
}

impl Checkpoint {
    /// The weights named `names`, in that order (e.g. a stage's
    /// `StageModel::parameter_names()`, for `set_parameters`).
    pub fn weights_for(&self, path: &Path, names: &[String]) -> Result<Vec<Tensor>> {
        names
            .iter()
            .map(|name| {
                let missing = || TrainError::MissingTensor {
                    path: path.to_path_buf(),
                    name: name.clone(),
                };
                self.weights.get(name).cloned().ok_or_else(missing)
            })
            .collect()
    }
}

/// `FILE.config.json`: GPT-2's config beside the weights file `FILE`.
pub fn config_path(path: &Path) -> PathBuf {
    with_suffix(path, ".config.json")
}

/// `FILE.optim.safetensors`: the optimizer state beside the weights file `FILE`.
pub fn optimizer_path(path: &Path) -> PathBuf {
    with_suffix(path, ".optim.safetensors")
}

/// The parameters of `GPT2LMHeadModel` (untied `lm_head`) for `config`: names and shapes, in
/// the order of `StageModel::parameters` for the whole model (the kernels' own list of the
/// model's layers, so a layer added there is checked here too).
pub fn expected_parameters(config: &GptConfig) -> Result<Vec<(String, Vec<usize>)>> {
    StageModel::parameter_shapes(config, &StageLayout::whole_model(config))
        .map_err(TrainError::kernel("listing the model's parameters"))
}

/// GPT-2's `config.json` for `config` with weights of `dtype`; a model with a mixture of experts
/// adds its shape (`n_experts`, `n_experts_per_token`, `expert_n_inner`,
/// `router_aux_loss_coef`), which GPT-2's loader ignores (its weights, under `moe.`, are not
/// GPT-2's).
pub fn gpt2_config_json(config: &GptConfig, dtype: DType) -> serde_json::Value {
    let mut json = gpt2_json(config, dtype);
    if let (Some(moe), Some(fields)) = (config.moe(), json.as_object_mut()) {
        fields.insert("n_experts".into(), moe.experts().into());
        fields.insert("n_experts_per_token".into(), moe.top_k().into());
        fields.insert("expert_n_inner".into(), moe.hidden().into());
        fields.insert("router_aux_loss_coef".into(), moe.aux_coefficient().into());
    }
    json
}

/// GPT-2's own fields of `config.json`.
fn gpt2_json(config: &GptConfig, dtype: DType) -> serde_json::Value {
    let torch_dtype = match dtype {
        DType::F64 => "float64",
        _ => "float32",
    };
    serde_json::json!({
        "architectures": ["GPT2LMHeadModel"],
        "model_type": "gpt2",
        "vocab_size": config.vocab_size(),
        "n_positions": config.max_seq_len(),
        "n_ctx": config.max_seq_len(),
        "n_embd": config.d_model(),
        "n_layer": config.n_layer(),
        "n_head": config.n_head(),
        "n_inner": null,
        "activation_function": "gelu_new",
        "resid_pdrop": 0.0,
        "embd_pdrop": 0.0,
        "attn_pdrop": 0.0,
        "layer_norm_epsilon": 1e-5,
        "initializer_range": 0.02,
        "scale_attn_weights": true,
        "scale_attn_by_inverse_layer_idx": false,
        "reorder_and_upcast_attn": false,
        "use_cache": true,
        "tie_word_embeddings": false,
        "bos_token_id": 0,
        "eos_token_id": 0,
        "torch_dtype": torch_dtype,
    })
}

/// Writes the checkpoint `path` (weights), `path.optim.safetensors` and `path.config.json`.
/// `weights` must be exactly the model's parameters ([`expected_parameters`] of
/// `meta.config`), all F32 or all F64, and `optimizer` must hold both moments of each.
pub fn save(
    path: &Path,
    weights: &[(String, Tensor)],
    optimizer: &OptimizerState,
    meta: &CheckpointMeta,
) -> Result<()> {
    let weight_map: BTreeMap<String, Tensor> = weights.iter().cloned().collect();
    let dtype = check_weights(path, &weight_map, &meta.config)?;
    let moments = optimizer_tensors(optimizer);
    check_moments(&optimizer_path(path), &moments, &weight_map)?;
    let record = serde_json::to_string(&meta.record()).map_err(|e| bad_meta(path, e))?;
    let mut info = HashMap::from([
        ("format".to_string(), "pt".to_string()),
        (META_KEY.to_string(), record),
    ]);
    let weight_bytes = serialize(path, &weight_map, info.clone())?;
    info.insert(OPTIMIZER_STEP_KEY.to_string(), optimizer.step.to_string());
    let optimizer_bytes = serialize(&optimizer_path(path), &moments, info)?;
    let config = gpt2_config_json(&meta.config, dtype);
    let config_bytes = serde_json::to_vec_pretty(&config).map_err(|e| bad_meta(path, e))?;
    write_atomically(&optimizer_path(path), &optimizer_bytes)?;
    write_atomically(&config_path(path), &config_bytes)?;
    write_atomically(path, &weight_bytes)
}

/// Reads the checkpoint `path` with its optimizer state, checking that every tensor the model
/// of its metadata needs is there with its shape, and nothing else.
pub fn load(path: &Path) -> Result<Checkpoint> {
    let (weights, meta) = load_weights(path)?;
    let optim_path = optimizer_path(path);
    let (moments, info) = read_safetensors(&optim_path)?;
    let record = parse_record(&optim_path, &info)?;
    if record != meta.record() {
        let reason = format!("does not match the metadata of {}", path.display());
        return Err(metadata_error(&optim_path, META_KEY, reason));
    }
    let step = info
        .get(OPTIMIZER_STEP_KEY)
        .and_then(|s| s.parse::<u64>().ok());
    let step = step.ok_or_else(|| {
        metadata_error(&optim_path, OPTIMIZER_STEP_KEY, "missing or not an integer")
    })?;
    check_moments(&optim_path, &moments, &weights)?;
    let optimizer = split_moments(step, moments);
    Ok(Checkpoint {
        weights,
        optimizer,
        meta,
    })
}

/// Reads the weights of the checkpoint `path` and its metadata, without the optimizer state
/// (e.g. for evaluation), checked as in [`load`].
pub fn load_weights(path: &Path) -> Result<(BTreeMap<String, Tensor>, CheckpointMeta)> {
    let (weights, info) = read_safetensors(path)?;
    let record = parse_record(path, &info)?;
    let config = record
        .model
        .config()
        .map_err(|reason| metadata_error(path, "pipeweave.model", reason))?;
    check_weights(path, &weights, &config)?;
    let meta = CheckpointMeta {
        step: record.step,
        data: record.data,
        rng: record.rng,
        schedule: record.schedule,
        config,
    };
    Ok((weights, meta))
}

fn parse_record(path: &Path, info: &HashMap<String, String>) -> Result<MetaRecord> {
    let text = info
        .get(META_KEY)
        .ok_or_else(|| metadata_error(path, META_KEY, "missing: not a pipeweave checkpoint"))?;
    let record: MetaRecord =
        serde_json::from_str(text).map_err(|e| metadata_error(path, META_KEY, e.to_string()))?;
    if record.version != META_VERSION {
        let reason = format!(
            "version {} (this build reads {META_VERSION})",
            record.version
        );
        return Err(metadata_error(path, META_KEY, reason));
    }
    Ok(record)
}

fn metadata_error(path: &Path, key: &str, reason: impl Into<String>) -> TrainError {
    TrainError::Metadata {
        path: path.to_path_buf(),
        key: key.to_string(),
        reason: reason.into(),
    }
}

fn bad_meta(path: &Path, e: serde_json::Error) -> TrainError {
    metadata_error(path, META_KEY, e.to_string())
}

/// Fails unless `weights` are exactly the parameters of `config` with their shapes, all of one
/// dtype (F32 or F64); returns that dtype.
fn check_weights(
    path: &Path,
    weights: &BTreeMap<String, Tensor>,
    config: &GptConfig,
) -> Result<DType> {
    let expected = expected_parameters(config)?;
    let mut dtype = None;
    for (name, shape) in &expected {
        let tensor = weights.get(name).ok_or_else(|| TrainError::MissingTensor {
            path: path.to_path_buf(),
            name: name.clone(),
        })?;
        check_tensor(
            path,
            name,
            tensor,
            shape,
            *dtype.get_or_insert(tensor.dtype()),
        )?;
    }
    let known: std::collections::BTreeSet<&str> =
        expected.iter().map(|(n, _)| n.as_str()).collect();
    if let Some(name) = weights.keys().find(|n| !known.contains(n.as_str())) {
        return Err(TrainError::UnexpectedTensor {
            path: path.to_path_buf(),
            name: name.clone(),
        });
    }
    Ok(dtype.unwrap_or(DType::F32))
}

/// Fails unless `tensor` has `shape` and `dtype`, and `dtype` is F32 or F64.
fn check_tensor(
    path: &Path,
    name: &str,
    tensor: &Tensor,
    shape: &[usize],
    dtype: DType,
) -> Result<()> {
    if tensor.dims() != shape {
        return Err(TrainError::TensorShape {
            path: path.to_path_buf(),
            name: name.to_string(),
            actual: tensor.dims().to_vec(),
            expected: shape.to_vec(),
        });
    }
    let supported = matches!(dtype, DType::F32 | DType::F64);
    if tensor.dtype() != dtype || !supported {
        return Err(TrainError::TensorDType {
            path: path.to_path_buf(),
            name: name.to_string(),
            actual: format!("{:?}", tensor.dtype()),
            expected: format!("{dtype:?} like the other weights (F32 or F64)"),
        });
    }
    Ok(())
}

/// The optimizer state as `optimizer.m.<name>` / `optimizer.v.<name>` tensors.
fn optimizer_tensors(state: &OptimizerState) -> BTreeMap<String, Tensor> {
    let m = state
        .m
        .iter()
        .map(|(n, t)| (format!("optimizer.m.{n}"), t.clone()));
    let v = state
        .v
        .iter()
        .map(|(n, t)| (format!("optimizer.v.{n}"), t.clone()));
    m.chain(v).collect()
}

/// The inverse of [`optimizer_tensors`] (names are checked by [`check_moments`] first).
fn split_moments(step: u64, tensors: BTreeMap<String, Tensor>) -> OptimizerState {
    let mut state = OptimizerState {
        step,
        ..Default::default()
    };
    for (name, tensor) in tensors {
        if let Some(param) = name.strip_prefix("optimizer.m.") {
            state.m.insert(param.to_string(), tensor);
        } else if let Some(param) = name.strip_prefix("optimizer.v.") {
            state.v.insert(param.to_string(), tensor);
        }
    }
    state
}

/// Fails unless `moments` are exactly both moments of every weight, each like its weight.
fn check_moments(
    path: &Path,
    moments: &BTreeMap<String, Tensor>,
    weights: &BTreeMap<String, Tensor>,
) -> Result<()> {
    for (name, weight) in weights {
        for kind in ["m", "v"] {
            let key = format!("optimizer.{kind}.{name}");
            let moment = moments.get(&key).ok_or_else(|| TrainError::MissingTensor {
                path: path.to_path_buf(),
                name: key.clone(),
            })?;
            check_tensor(path, &key, moment, weight.dims(), weight.dtype())?;
        }
    }
    if moments.len() != 2 * weights.len() {
        let known = |n: &String| {
            let param = n
                .strip_prefix("optimizer.m.")
                .or_else(|| n.strip_prefix("optimizer.v."));
            param.is_some_and(|p| weights.contains_key(p))
        };
        if let Some(name) = moments.keys().find(|n| !known(n)) {
            return Err(TrainError::UnexpectedTensor {
                path: path.to_path_buf(),
                name: name.clone(),
            });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::data::tests::scratch_dir;
    use crate::optim::{AdamW, AdamWConfig};
    use candle_core::Device;
    use pipeweave_kernels::{StageLayout, StageModel};
    use std::fs;

    /// A checkpoint's path in a fresh empty folder.
    fn scratch(name: &str) -> PathBuf {
        scratch_dir(&format!("ckpt-{name}")).join("model.safetensors")
    }

    fn config(n_layer: usize) -> GptConfig {
        GptConfig::new(n_layer, 8, 2, 4).unwrap()
    }

    /// A whole model's parameters, its optimizer state and a meta.
    type Trained = (Vec<(String, Tensor)>, OptimizerState, CheckpointMeta);

    /// A whole model's parameters after one AdamW step, its optimizer state and a meta.
    fn trained(config: GptConfig, dtype: DType) -> Trained {
        let model = StageModel::new(config, StageLayout::whole_model(&config), 5, dtype).unwrap();
        let params = model.parameters();
        let mut opt = AdamW::new(AdamWConfig::default(), &params).unwrap();
        let values: Vec<Tensor> = params.iter().map(|(_, t)| t.clone()).collect();
        let grads: Vec<Tensor> = values
            .iter()
            .map(|t| t.affine(0.5, 0.01).unwrap())
            .collect();
        let values = opt.step(&values, &grads, 0.01).unwrap();
        let names = params.iter().map(|(n, _)| n.clone());
        let meta = CheckpointMeta {
            step: 1,
            data: DataPosition {
                epoch: 3,
                cursor: 17,
            },
            rng: vec![u64::MAX, 12345],
            schedule: "1f1b ranks=2 microbatches=4".into(),
            config,
        };
        (names.zip(values).collect(), opt.state(), meta)
    }

    /// [`trained`] with `n_layer` blocks, saved as the checkpoint [`scratch`] `name`: its path and
    /// what was saved.
    fn saved(name: &str, n_layer: usize, dtype: DType) -> (PathBuf, Trained) {
        let path = scratch(name);
        let (weights, optimizer, meta) = trained(config(n_layer), dtype);
        save(&path, &weights, &optimizer, &meta).unwrap();
        (path, (weights, optimizer, meta))
    }

    fn bits(t: &Tensor) -> Vec<u64> {
        match t.dtype() {
            DType::F32 => t
                .flatten_all()
                .unwrap()
                .to_vec1::<f32>()
                .unwrap()
                .iter()
                .map(|x| u64::from(x.to_bits()))
                .collect(),
            _ => t
                .flatten_all()
                .unwrap()
                .to_vec1::<f64>()
                .unwrap()
                .iter()
                .map(|x| x.to_bits())
                .collect(),
        }
    }

    #[test]
    fn expected_parameters_are_the_kernels_parameters() {
        let config = config(3);
        let model =
            StageModel::new(config, StageLayout::whole_model(&config), 0, DType::F32).unwrap();
        let actual: Vec<(String, Vec<usize>)> = model
            .parameters()
            .into_iter()
            .map(|(n, t)| (n, t.dims().to_vec()))
            .collect();
        assert_eq!(actual, expected_parameters(&config).unwrap());
    }

    #[test]
    fn a_checkpoint_round_trips_bit_for_bit() {
        for dtype in [DType::F32, DType::F64] {
            let (path, (weights, optimizer, meta)) =
                saved(&format!("roundtrip-{dtype:?}"), 2, dtype);
            let loaded = load(&path).unwrap();
            assert_eq!(loaded.meta, meta);
            assert_eq!(loaded.weights.len(), weights.len());
            for (name, tensor) in &weights {
                assert_eq!(bits(&loaded.weights[name]), bits(tensor), "{name}");
                assert_eq!(bits(&loaded.optimizer.m[name]), bits(&optimizer.m[name]));
                assert_eq!(bits(&loaded.optimizer.v[name]), bits(&optimizer.v[name]));
            }
            assert_eq!(loaded.optimizer.step, 1);
            let names: Vec<String> = weights.iter().map(|(n, _)| n.clone()).collect();
            assert_eq!(
                loaded.weights_for(&path, &names).unwrap().len(),
                names.len()
            );
            fs::remove_dir_all(path.parent().unwrap()).unwrap();
        }
    }

    #[test]
    fn the_config_json_is_gpt2s() {
        let (path, ..) = saved("config", 2, DType::F32);
        let text = fs::read_to_string(config_path(&path)).unwrap();
        let json: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(json["model_type"], "gpt2");
        assert_eq!(json["architectures"][0], "GPT2LMHeadModel");
        assert_eq!(
            (json["n_layer"].as_u64(), json["n_embd"].as_u64()),
            (Some(2), Some(8))
        );
        assert_eq!(json["tie_word_embeddings"], false);
        assert_eq!(json["activation_function"], "gelu_new");
        let (_, info) = read_safetensors(&path).unwrap();
        assert_eq!(info["format"], "pt");
        fs::remove_dir_all(path.parent().unwrap()).unwrap();
    }

    #[test]
    fn a_checkpoint_for_another_model_or_schedule_is_refused() {
        let (path, (_, _, meta)) = saved("mismatch", 2, DType::F32);
        let loaded = load(&path).unwrap();
        match loaded.meta.check_model(&path, &config(3)) {
            Err(
                e @ TrainError::ConfigMismatch {
                    field: "n_layer", ..
                },
            ) => {
                let text = e.to_string();
                assert!(text.contains("n_layer is 2 there, 3 here"), "{text}");
                assert!(e.is_bad_input());
            }
            other => panic!("expected a config mismatch, got {other:?}"),
        }
        let wider = GptConfig::new(2, 16, 2, 4).unwrap();
        let err = loaded.meta.check_model(&path, &wider).unwrap_err();
        assert!(matches!(
            err,
            TrainError::ConfigMismatch {
                field: "n_embd",
                ..
            }
        ));
        loaded.meta.check_model(&path, &config(2)).unwrap();
        loaded.meta.check_schedule(&path, &meta.schedule).unwrap();
        let err = loaded.meta.check_schedule(&path, "zb-h1").unwrap_err();
        assert!(matches!(err, TrainError::ScheduleMismatch { .. }));
        fs::remove_dir_all(path.parent().unwrap()).unwrap();
    }

    #[test]
    fn missing_wrong_and_extra_tensors_are_named() {
        let path = scratch("tensors");
        let (mut weights, optimizer, meta) = trained(config(1), DType::F32);
        let removed = weights.remove(3);
        let err = save(&path, &weights, &optimizer, &meta).unwrap_err();
        assert!(
            matches!(&err, TrainError::MissingTensor { name, .. } if *name == removed.0),
            "{err}"
        );
        weights.insert(
            3,
            (
                removed.0.clone(),
                Tensor::zeros((2, 2), DType::F32, &Device::Cpu).unwrap(),
            ),
        );
        let err = save(&path, &weights, &optimizer, &meta).unwrap_err();
        assert!(
            matches!(&err, TrainError::TensorShape { actual, .. } if *actual == [2, 2]),
            "{err}"
        );
        weights[3].1 = removed.1.clone();
        weights.push(("transformer.h.0.attn.bias".into(), removed.1.clone()));
        let err = save(&path, &weights, &optimizer, &meta).unwrap_err();
        assert!(matches!(err, TrainError::UnexpectedTensor { .. }));
        weights.pop();
        // A file written by someone else, lacking a tensor, is refused on load.
        let mut map: BTreeMap<String, Tensor> = weights.iter().cloned().collect();
        map.remove("lm_head.weight");
        let info = HashMap::from([(
            META_KEY.to_string(),
            serde_json::to_string(&meta.record()).unwrap(),
        )]);
        fs::write(&path, serialize(&path, &map, info).unwrap()).unwrap();
        let err = load(&path).unwrap_err();
        assert!(matches!(&err, TrainError::MissingTensor { name, .. } if name == "lm_head.weight"));
        fs::remove_dir_all(path.parent().unwrap()).unwrap();
    }

    #[test]
    fn a_stray_optimizer_file_and_foreign_files_are_refused() {
        let (path, (weights, optimizer, meta)) = saved("stray", 1, DType::F32);
        let other = path.with_file_name("other.safetensors");
        let later = CheckpointMeta {
            step: 2,
            ..meta.clone()
        };
        save(&other, &weights, &optimizer, &later).unwrap();
        fs::copy(optimizer_path(&other), optimizer_path(&path)).unwrap();
        let err = load(&path).unwrap_err();
        assert!(matches!(err, TrainError::Metadata { .. }), "{err}");
        load_weights(&path).unwrap();
        let map: BTreeMap<String, Tensor> = weights.iter().cloned().collect();
        fs::write(&path, serialize(&path, &map, HashMap::new()).unwrap()).unwrap();
        let err = load(&path).unwrap_err();
        assert!(
            err.to_string().contains("not a pipeweave checkpoint"),
            "{err}"
        );
        fs::write(&path, b"not safetensors").unwrap();
        assert!(matches!(
            load(&path).unwrap_err(),
            TrainError::Safetensors { .. }
        ));
        fs::remove_dir_all(path.parent().unwrap()).unwrap();
    }
}
