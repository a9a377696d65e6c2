//! The registration of the model's layer kinds, in model order ([`LayerKind`], written by
//! `model.rs`'s `register_layers!`: the embedding, GPT-2's blocks or the blocks with a mixture
//! of experts (a model has `n_layer` of one or the other, as its configuration says), the
//! head), and what it gives: each layer of a model ([`LayerId`]),
//! the model's layers in order ([`model_layers`]) and the enums a stage holds (`AnyLayer`,
//! `AnySaved`, `AnyPending`).

use super::block::Block;
use super::embedding::Embedding;
use super::head::Head;
use super::model::{register_layers, LayerInput, Placement};
use super::moe_block::MoeBlock;
use crate::config::GptConfig;
use crate::error::KernelError;

// The model's layers, in order: one line per kind (see `model.rs`). A new layer is its own file
// (its `Layer` and `ModelLayer` impls), its `mod` line in `mod.rs` and its line here.
register_layers! {
    Embedding(Embedding),
    Block(Block),
    MoeBlock(MoeBlock),
    Head(Head),
}

impl LayerKind {
    /// The kind's name (`embedding`, `block`, `moe_block`, `head`).
    pub fn name(self) -> &'static str {
        self.description().name()
    }

    /// Where a cut may put the kind's layers.
    pub fn placement(self) -> Placement {
        self.description().placement()
    }

    /// What the kind's layers take.
    pub fn input(self) -> LayerInput {
        self.description().input()
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
    fn a_gpt_with_a_mixture_has_moe_blocks_in_place_of_blocks() {
        let moe = crate::MoeConfig::new(4, 2, 32, 0.01).unwrap();
        let config = GptConfig::new(2, 8, 2, 8).unwrap().with_moe(moe);
        let layers = model_layers(&config);
        let labels: Vec<String> = layers.iter().map(|l| l.label()).collect();
        assert_eq!(labels, ["embedding", "moe_block.0", "moe_block.1", "head"]);
        assert_eq!(layers[2].placement(), Placement::Any);
        assert_eq!(layers[2].location(), "transformer.h.1");
        assert_eq!(LayerKind::Block.count(&config), 0);
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
