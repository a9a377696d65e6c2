//! The GPT as a list of layers: what a [`crate::StageModel`] runs, what the trainer cuts into
//! stages and what a profile measures, none of them naming a layer kind (a kind is named only in
//! its own file and in its registration).
//!
//! A model layer (the embedding, a block, the head) implements [`ModelLayer`] in its own file,
//! beside its [`Layer`] impl: a [`KindDescription`] (its name, where a cut may place it, what it
//! takes), how many the model has, how it is built from the seed (through the
//! [`ParameterFactory`]), where its errors are located and what its parameters are called in the
//! model (Hugging Face's GPT-2 names), and how an expert-parallel rank runs it
//! ([`ModelLayer::with_experts`]). One line of [`register_layers!`] in `layers/registry.rs`
//! registers it; the registration's order is the model's order ([`model_layers`]), and the macro
//! writes the one enum of layers (`AnyLayer`) and of their states that a stage holds,
//! each method one `match` dispatching to the kind's own.
//!
//! The layers of a model are placed in order: first those pinned to the first stage
//! ([`Placement::First`]), then the free ones ([`Placement::Any`], spread over the stages), then
//! those pinned to the last ([`Placement::Last`]), whose output is what the loss reads.

use candle_core::Tensor;

use super::moe::ExpertPlacement;
use super::protocol::Layer;
use crate::config::GptConfig;
use crate::error::Result;
use crate::flops::passes::PassFlops;
use crate::init::ParameterFactory;

/// Where a cut may put a layer: on the first stage, on any, or on the last.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Placement {
    /// Pinned to the first stage (the embedding).
    First,
    /// Free: spread over the stages in order (the blocks).
    Any,
    /// Pinned to the last stage (the head).
    Last,
}

/// What a layer takes: token ids `[B, T]` (U32) or hidden states `[B, T, d]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LayerInput {
    /// Token ids `[B, T]`: the layer has no input gradient.
    TokenIds,
    /// Hidden states `[B, T, d]`.
    Hidden,
}

/// What a layer kind's file says of it: its name (in profiles and messages), its placement and
/// its input.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct KindDescription {
    name: &'static str,
    placement: Placement,
    input: LayerInput,
}

impl KindDescription {
    /// A kind called `name` placed `placement`, taking hidden states.
    pub(crate) const fn placed(name: &'static str, placement: Placement) -> Self {
        KindDescription {
            name,
            placement,
            input: LayerInput::Hidden,
        }
    }

    /// The same kind taking token ids.
    pub(crate) const fn taking_token_ids(self) -> Self {
        KindDescription {
            input: LayerInput::TokenIds,
            ..self
        }
    }

    /// The kind's name.
    pub(crate) fn name(self) -> &'static str {
        self.name
    }

    /// Where a cut may put the kind's layers.
    pub(crate) fn placement(self) -> Placement {
        self.placement
    }

    /// What the kind's layers take.
    pub(crate) fn input(self) -> LayerInput {
        self.input
    }
}

/// A layer of the model, as its own file declares it (see the module doc).
pub(crate) trait ModelLayer: Layer + Sized {
    /// Its name, placement and input.
    const KIND: KindDescription;

    /// How many layers of this kind the model of `config` has, one after another (one unless
    /// the kind says otherwise).
    fn count(_config: &GptConfig) -> usize {
        1
    }

    /// Layer `index` of the kind, GPT-2-initialised from the factory's seed.
    fn build(factory: &ParameterFactory<'_>, config: &GptConfig, index: usize) -> Result<Self>;

    /// Where errors of layer `index` are located: its GPT-2 name (`transformer.h.3`).
    fn location(index: usize) -> String;

    /// Pushes the parameters of layer `index` with their GPT-2 names, in order: by default its
    /// own names under its location.
    fn push_model_parameters(&self, index: usize, out: &mut Vec<(String, Tensor)>) {
        self.push_parameters(&Self::location(index), out);
    }

    /// Its estimated FLOPs on `batch` sequences of `seq_len` tokens (none by default: only
    /// matrix products count).
    fn flops(_config: &GptConfig, _batch: usize, _seq_len: usize) -> PassFlops {
        PassFlops::default()
    }

    /// The layer as the expert-parallel rank of `placement` runs it: a layer with a mixture of
    /// experts holds and runs that rank's experts only; any other is unchanged (the default).
    fn with_experts(self, _placement: &ExpertPlacement) -> Result<Self> {
        Ok(self)
    }
}

/// A layer's input gradient ([`Layer::InputGrad`]) as a stage hands it on and the oracle checks
/// see it: a tensor, or none where the input (token ids) has no gradient.
pub(crate) trait InputGradient {
    /// The gradient, if the input has one.
    fn into_gradient(self) -> Option<Tensor>;
}

impl InputGradient for Tensor {
    fn into_gradient(self) -> Option<Tensor> {
        Some(self)
    }
}

impl InputGradient for () {
    fn into_gradient(self) -> Option<Tensor> {
        None
    }
}

/// Registers the model's layer kinds, in model order, one line each (`Kind(LayerType)`), in
/// `layers/registry.rs`: writes `LayerKind` (with what [`ModelLayer`] says of each) and the enums a
/// stage holds, `AnyLayer` and its states `AnySaved` and
/// `AnyPending`, each method one `match` over the kinds.
// The registration's file provides `state_mismatch` (the error of a state given to another kind's
// layer): this file names nothing of the registration.
macro_rules! register_layers {
    ($($kind:ident($layer:ty)),+ $(,)?) => {
        /// The kinds of the model's layers, in model order (registered in `layers/registry.rs`).
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub enum LayerKind {
            $(
                #[doc = concat!("[`", stringify!($layer), "`]")]
                $kind,
            )+
        }

        impl LayerKind {
            /// Every kind, in model order.
            pub const ALL: &'static [LayerKind] = &[$(LayerKind::$kind),+];

            /// What the kind's file says of it.
            fn description(self) -> $crate::layers::model::KindDescription {
                match self {
                    $(LayerKind::$kind => <$layer as $crate::layers::model::ModelLayer>::KIND,)+
                }
            }

            /// How many layers of this kind the model of `config` has.
            pub fn count(self, config: &$crate::config::GptConfig) -> usize {
                match self {
                    $(LayerKind::$kind => {
                        <$layer as $crate::layers::model::ModelLayer>::count(config)
                    })+
                }
            }

            /// Estimated FLOPs of one layer of the kind on `batch` sequences of `seq_len` tokens.
            pub fn flops(
                self,
                config: &$crate::config::GptConfig,
                batch: usize,
                seq_len: usize,
            ) -> $crate::flops::passes::PassFlops {
                match self {
                    $(LayerKind::$kind => {
                        <$layer as $crate::layers::model::ModelLayer>::flops(config, batch, seq_len)
                    })+
                }
            }

            /// Where errors of layer `index` of the kind are located.
            fn location(self, index: usize) -> String {
                match self {
                    $(LayerKind::$kind => {
                        <$layer as $crate::layers::model::ModelLayer>::location(index)
                    })+
                }
            }

            /// Layer `index` of the kind, initialised by `factory`.
            pub(crate) fn build(
                self,
                factory: &$crate::init::ParameterFactory<'_>,
                config: &$crate::config::GptConfig,
                index: usize,
            ) -> $crate::error::Result<AnyLayer> {
                Ok(match self {
                    $(LayerKind::$kind => AnyLayer::$kind(
                        <$layer as $crate::layers::model::ModelLayer>::build(factory, config, index)?,
                    ),)+
                })
            }
        }

        /// A layer of any registered kind: what a stage runs.
        #[derive(Debug, Clone)]
        pub(crate) enum AnyLayer {
            $($kind($layer),)+
        }

        /// What [`AnyLayer::forward`] keeps: its kind's saved state.
        #[derive(Debug)]
        pub(crate) enum AnySaved {
            $($kind(<$layer as $crate::layers::protocol::Layer>::Saved),)+
        }

        /// What [`AnyLayer::backward_weight`] needs: its kind's pending state.
        #[derive(Debug)]
        pub(crate) enum AnyPending {
            $($kind(<$layer as $crate::layers::protocol::Layer>::PendingWeightGrad),)+
        }

        impl AnyLayer {
            /// The layer's [`Layer::forward`], or of a sequence chunk its
            /// [`Layer::forward_chunk`].
            pub(crate) fn forward(
                &self,
                ops: &dyn $crate::primitives::Primitives,
                input: &candle_core::Tensor,
                chunk: Option<($crate::sequence::ChunkAt, &mut $crate::sequence::ChunkMemory)>,
            ) -> $crate::error::Result<(candle_core::Tensor, AnySaved)> {
                match self {
                    $(AnyLayer::$kind(layer) => {
                        let (output, saved) = match chunk {
                            Some((at, memory)) => $crate::layers::protocol::Layer::forward_chunk(
                                layer, ops, input, at, memory,
                            )?,
                            None => $crate::layers::protocol::Layer::forward(layer, ops, input)?,
                        };
                        Ok((output, AnySaved::$kind(saved)))
                    })+
                }
            }

            /// The layer's [`Layer::backward_input`] (of a sequence chunk its
            /// [`Layer::backward_input_chunk`]); `None` for an input without a gradient.
            pub(crate) fn backward_input(
                &self,
                ops: &dyn $crate::primitives::Primitives,
                saved: AnySaved,
                grad_output: &candle_core::Tensor,
                chunk: Option<($crate::sequence::ChunkAt, &mut $crate::sequence::ChunkMemory)>,
            ) -> $crate::error::Result<(Option<candle_core::Tensor>, AnyPending)> {
                match (self, saved) {
                    $((AnyLayer::$kind(layer), AnySaved::$kind(saved)) => {
                        let (grad, pending) = match chunk {
                            Some((at, memory)) => $crate::layers::protocol::Layer::backward_input_chunk(
                                layer, ops, saved, grad_output, at, memory,
                            )?,
                            None => $crate::layers::protocol::Layer::backward_input(
                                layer,
                                ops,
                                saved,
                                grad_output,
                            )?,
                        };
                        Ok((
                            $crate::layers::model::InputGradient::into_gradient(grad),
                            AnyPending::$kind(pending),
                        ))
                    })+
                    #[allow(unreachable_patterns)]
                    (layer, saved) => Err(state_mismatch(
                        "saved",
                        layer.kind(),
                        saved.kind(),
                    )),
                }
            }

            /// The layer's [`Layer::backward_weight`].
            pub(crate) fn backward_weight(
                &self,
                ops: &dyn $crate::primitives::Primitives,
                pending: AnyPending,
            ) -> $crate::error::Result<Vec<candle_core::Tensor>> {
                match (self, pending) {
                    $((AnyLayer::$kind(layer), AnyPending::$kind(pending)) => {
                        $crate::layers::protocol::Layer::backward_weight(layer, ops, pending)
                    })+
                    #[allow(unreachable_patterns)]
                    (layer, pending) => Err(state_mismatch(
                        "pending",
                        layer.kind(),
                        pending.kind(),
                    )),
                }
            }

            /// The layer as the expert-parallel rank of `placement` runs it
            /// (`ModelLayer::with_experts`).
            pub(crate) fn with_experts(
                self,
                placement: &$crate::layers::moe::ExpertPlacement,
            ) -> $crate::error::Result<AnyLayer> {
                Ok(match self {
                    $(AnyLayer::$kind(layer) => AnyLayer::$kind(
                        $crate::layers::model::ModelLayer::with_experts(layer, placement)?,
                    ),)+
                })
            }

            /// Pushes the parameters of the layer, its kind's `index`-th, with their GPT-2 names.
            pub(crate) fn push_model_parameters(
                &self,
                index: usize,
                out: &mut Vec<(String, candle_core::Tensor)>,
            ) {
                match self {
                    $(AnyLayer::$kind(layer) => {
                        $crate::layers::model::ModelLayer::push_model_parameters(layer, index, out)
                    })+
                }
            }
        }

        $crate::layers::model::register_layers!(@kind AnyLayer { $($kind),+ });
        $crate::layers::model::register_layers!(@kind AnySaved { $($kind),+ });
        $crate::layers::model::register_layers!(@kind AnyPending { $($kind),+ });

        impl $crate::layers::protocol::ParameterSlots for AnyLayer {
            fn push_slots<'a>(&'a mut self, out: &mut Vec<&'a mut candle_core::Tensor>) {
                match self {
                    $(AnyLayer::$kind(layer) => $crate::layers::protocol::ParameterSlots::push_slots(layer, out),)+
                }
            }
        }

        $crate::layers::protocol::held_tensors!(mut enum AnySaved { $($kind(state)),+ });
        $crate::layers::protocol::held_tensors!(mut enum AnyPending { $($kind(state)),+ });
    };
    (@kind $enum:ident { $($kind:ident),+ }) => {
        impl $enum {
            /// The kind of the layer (of the layer that made the state).
            pub(crate) fn kind(&self) -> LayerKind {
                match self {
                    $($enum::$kind(_) => LayerKind::$kind,)+
                }
            }
        }
    };
}
pub(crate) use register_layers;
