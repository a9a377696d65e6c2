//! The GPT as a list of layers: what a [`crate::StageModel`] runs, what the trainer cuts into
//! stages and what a profile measures, none of them naming a layer kind (a kind is named only in
//! its own file and in its registration).
//!
//! A model layer (the embedding, a block, the head) implements [`ModelLayer`] in its own file,
//! beside its [`Layer`] impl: a [`KindDescription`] (its name, where a cut may place it, what it
//! takes), how many the model has, how it is built from the seed (through the
//! [`ParameterFactory`]), where its errors are located and what its parameters are called in the
//! model (Hugging Face's GPT-2 names). One line of [`register_layers!`] in `layers/mod.rs`
//! registers it; the registration's order is the model's order ([`model_layers`]), and the macro
//! writes the one enum of layers ([`super::AnyLayer`]) and of their states that a stage holds,
//! each method one `match` dispatching to the kind's own.
//!
//! The layers of a model are placed in order: first those pinned to the first stage
//! ([`Placement::First`]), then the free ones ([`Placement::Any`], spread over the stages), then
//! those pinned to the last ([`Placement::Last`]), whose output is what the loss reads.

use candle_core::Tensor;

use super::{Layer, LayerKind};
use crate::config::GptConfig;
use crate::error::{KernelError, Result};
use crate::flops::PassFlops;
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

impl LayerKind {
    /// The kind's name (`embedding`, `block`, `head`).
    pub fn name(self) -> &'static str {
        self.description().name
    }

    /// Where a cut may put the kind's layers.
    pub fn placement(self) -> Placement {
        self.description().placement
    }

    /// What the kind's layers take.
    pub fn input(self) -> LayerInput {
        self.description().input
    }
}

/// One layer of the model: its kind and its index among the layers of that kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct LayerId {
    kind: LayerKind,
    index: usize,
    /// How many layers of the kind the model has.
    of: usize,
}

impl LayerId {
    /// The layer's kind.
    pub fn kind(self) -> LayerKind {
        self.kind
    }

    /// The layer's index among the layers of its kind (a block's global index).
    pub fn index(self) -> usize {
        self.index
    }

    /// Where a cut may put it.
    pub fn placement(self) -> Placement {
        self.kind.placement()
    }

    /// What it takes.
    pub fn input(self) -> LayerInput {
        self.kind.input()
    }

    /// Its name in a profile: the kind's name, with the index for free kinds and kinds of
    /// several layers (`embedding`, `block.3`, `head`).
    pub fn label(self) -> String {
        match self.placement() == Placement::Any || self.of > 1 {
            true => format!("{}.{}", self.kind.name(), self.index),
            false => self.kind.name().to_string(),
        }
    }

    /// Where its errors are located: its GPT-2 name.
    pub(crate) fn location(self) -> String {
        self.kind.location(self.index)
    }
}

/// The layers of the model of `config`, in order: every registered kind's layers, kind after
/// kind in the order of the registration.
pub fn model_layers(config: &GptConfig) -> Vec<LayerId> {
    LayerKind::ALL
        .iter()
        .flat_map(|&kind| {
            let of = kind.count(config);
            (0..of).map(move |index| LayerId { kind, index, of })
        })
        .collect()
}

/// The error of a layer given a state of another kind's layer (`field`: `saved` or `pending`).
pub(crate) fn state_mismatch(
    field: &'static str,
    layer: LayerKind,
    state: LayerKind,
) -> KernelError {
    KernelError::InvalidArgument {
        field,
        value: format!("a state of the {} for the {}", state.name(), layer.name()),
        reason: "was produced by a stage with another layout",
    }
}

/// Registers the model's layer kinds, in model order, one line each (`Kind(LayerType)`), in
/// `layers/mod.rs`: writes [`LayerKind`] (with what [`ModelLayer`] says of each) and the enums a
/// stage holds, [`super::AnyLayer`] and its states [`super::AnySaved`] and
/// [`super::AnyPending`], each method one `match` over the kinds.
macro_rules! register_layers {
    ($($kind:ident($layer:ty)),+ $(,)?) => {
        /// The kinds of the model's layers, in model order (registered in `layers/mod.rs`).
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
            ) -> $crate::flops::PassFlops {
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
            $($kind(<$layer as $crate::layers::Layer>::Saved),)+
        }

        /// What [`AnyLayer::backward_weight`] needs: its kind's pending state.
        #[derive(Debug)]
        pub(crate) enum AnyPending {
            $($kind(<$layer as $crate::layers::Layer>::PendingWeightGrad),)+
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
                            Some((at, memory)) => $crate::layers::Layer::forward_chunk(
                                layer, ops, input, at, memory,
                            )?,
                            None => $crate::layers::Layer::forward(layer, ops, input)?,
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
                            Some((at, memory)) => $crate::layers::Layer::backward_input_chunk(
                                layer, ops, saved, grad_output, at, memory,
                            )?,
                            None => $crate::layers::Layer::backward_input(
                                layer,
                                ops,
                                saved,
                                grad_output,
                            )?,
                        };
                        Ok((
                            $crate::layers::InputGradient::into_gradient(grad),
                            AnyPending::$kind(pending),
                        ))
                    })+
                    #[allow(unreachable_patterns)]
                    (layer, saved) => Err($crate::layers::model::state_mismatch(
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
                        $crate::layers::Layer::backward_weight(layer, ops, pending)
                    })+
                    #[allow(unreachable_patterns)]
                    (layer, pending) => Err($crate::layers::model::state_mismatch(
                        "pending",
                        layer.kind(),
                        pending.kind(),
                    )),
                }
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

        impl $crate::layers::ParameterSlots for AnyLayer {
            fn push_slots<'a>(&'a mut self, out: &mut Vec<&'a mut candle_core::Tensor>) {
                match self {
                    $(AnyLayer::$kind(layer) => $crate::layers::ParameterSlots::push_slots(layer, out),)+
                }
            }
        }

        $crate::layers::held_tensors!(mut enum AnySaved { $($kind(state)),+ });
        $crate::layers::held_tensors!(mut enum AnyPending { $($kind(state)),+ });
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_gpt_is_its_embedding_blocks_and_head_in_order() {
        let config = GptConfig::new(3, 8, 2, 8).unwrap();
        let layers = model_layers(&config);
        let labels: Vec<String> = layers.iter().map(|l| l.label()).collect();
        assert_eq!(
            labels,
            ["embedding", "block.0", "block.1", "block.2", "head"]
        );
        let placements: Vec<Placement> = layers.iter().map(|l| l.placement()).collect();
        use Placement::{Any, First, Last};
        assert_eq!(placements, [First, Any, Any, Any, Last]);
        assert_eq!(layers[0].input(), LayerInput::TokenIds);
        assert!(layers[1..].iter().all(|l| l.input() == LayerInput::Hidden));
        assert_eq!(layers[3].location(), "transformer.h.2");
    }

    #[test]
    fn the_registration_keeps_placements_and_token_inputs_in_order() {
        // Those placed first open the model, those placed last end it; only layers before every
        // other may take token ids (they hand no gradient back).
        let rank = |p: Placement| match p {
            Placement::First => 0,
            Placement::Any => 1,
            Placement::Last => 2,
        };
        let kinds = LayerKind::ALL;
        assert!(kinds
            .windows(2)
            .all(|w| rank(w[0].placement()) <= rank(w[1].placement())));
        let first_hidden = kinds.iter().position(|k| k.input() == LayerInput::Hidden);
        let tokens_after = first_hidden.map_or(&[][..], |i| &kinds[i..]);
        assert!(tokens_after.iter().all(|k| k.input() == LayerInput::Hidden));
    }
}
