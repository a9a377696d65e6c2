//! The fields of the reports the front ends hand out (a plan's report, a `tune` candidate, a
//! frontier point), read from the Rust definitions themselves: each field's name and its type as
//! Python sees the JSON (`List[float]`, `Optional[int]`, ...). Python's type stub is tested
//! against this list, and the list is checked against the structs at compile time (an exhaustive
//! destructuring: a field added to a struct and not listed here does not compile), so the stub
//! cannot drift from the report alone.

use crate::frontier_point::FrontierPoint;
use crate::report::{BoundBasis, PlanReport};
use crate::tune::Candidate;
use pipeweave_core::Task;

/// One field of a report: its JSON name and its type as Python reads the JSON.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReportField {
    /// The JSON key (and the Python attribute).
    pub name: &'static str,
    /// The type in Python's typing notation; `Optional[..]` where the report may leave the
    /// field out or give null.
    pub python_type: String,
}

impl ReportField {
    /// The field `name` of `S`, whose value `field` reaches (only its type is used).
    fn of<S, T: PythonType>(name: &'static str, _field: fn(&S) -> &T) -> ReportField {
        ReportField {
            name,
            python_type: T::python_type(),
        }
    }
}

/// A Rust type's JSON value as Python's typing names it.
trait PythonType {
    fn python_type() -> String;
}

macro_rules! python_type {
    ($($rust:ty => $python:literal),* $(,)?) => {
        $(impl PythonType for $rust {
            fn python_type() -> String {
                $python.to_string()
            }
        })*
    };
}

python_type! {
    String => "str",
    bool => "bool",
    u32 => "int",
    usize => "int",
    f64 => "float",
    // Written as text: `0F1`, `relaxed`.
    Task => "str",
    BoundBasis => "str",
}

impl<T: PythonType> PythonType for Vec<T> {
    fn python_type() -> String {
        format!("List[{}]", T::python_type())
    }
}

impl<T: PythonType> PythonType for Option<T> {
    fn python_type() -> String {
        format!("Optional[{}]", T::python_type())
    }
}

/// A tuple is a JSON list of mixed items.
impl<A, B, C> PythonType for (A, B, C) {
    fn python_type() -> String {
        "List[Any]".to_string()
    }
}

/// `fn $function() -> Vec<ReportField>` listing `$fields` of `$report` in order; compiles only
/// when `$fields` are exactly the struct's fields.
macro_rules! report_fields {
    ($(#[$doc:meta])* $function:ident, $report:ident { $($field:ident),* $(,)? }) => {
        $(#[$doc])*
        pub fn $function() -> Vec<ReportField> {
            // Every field named, none left out: a new field must be listed to compile.
            #[allow(dead_code)]
            fn exhaustive(report: $report) {
                let $report { $($field: _),* } = report;
            }
            vec![$(ReportField::of(stringify!($field), |r: &$report| &r.$field)),*]
        }
    };
}

report_fields!(
    /// The fields of a plan's report (`pipeweave plan --format json`, Python's `Plan`).
    plan_report_fields,
    PlanReport {
        expression,
        passes,
        ranks,
        stages,
        microbatches,
        seq_chunks,
        stage_to_rank,
        routes,
        tied_stages,
        order,
        makespan,
        max_span,
        bubble_rate,
        lower_bound,
        lower_bound_basis,
        costs,
        optimality_gap,
        busy_per_rank,
        idle_per_rank,
        peak_activations_per_rank,
        device_peak_per_rank,
        host_peak_per_rank,
        experts_peak_per_rank,
        link_busy_per_rank,
        ranks_per_link,
        shared_link_busy,
        offloads_per_rank,
        recomputes_per_rank,
        recomputed_ops,
        a2a_hidden,
        a2a_exposed,
        a2a_hidden_fraction,
        a2a_paired_fraction,
        a2a_sequential_makespan,
        memory_limit,
        layers_per_stage,
        bytes_per_unit,
        peak_activation_bytes_per_rank,
        verified,
        messages,
        communication_groups,
        communication_checked,
        receive_buffers_per_rank,
        parameter_actions,
    }
);

report_fields!(
    /// The fields of a ranked candidate (`tune --format json`, Python's `Candidate`).
    candidate_fields,
    Candidate {
        expression,
        makespan,
        bubble_rate,
        peak_activations,
        stages,
        pytorch,
        lower_bound,
        layers_per_stage,
        peak_activation_bytes,
    }
);

report_fields!(
    /// The fields of a frontier point (`tune --frontier --format json`, Python's
    /// `FrontierPoint`).
    frontier_point_fields,
    FrontierPoint {
        memory_limit,
        expression,
        makespan,
        peak_activations,
        family,
    }
);

#[cfg(test)]
mod tests {
    use super::*;
    use crate::compile::compile;
    use crate::config::PipelineConfig;
    use pipeweave_core::RecvPolicy;
    use pipeweave_transforms::Registry;

    fn keys(value: &serde_json::Value) -> Vec<String> {
        value
            .as_object()
            .expect("a report is a JSON object")
            .keys()
            .cloned()
            .collect()
    }

    #[test]
    fn every_key_of_a_report_is_listed_and_every_required_field_is_there() {
        let fields = plan_report_fields();
        let config = PipelineConfig::new(4, 8).unwrap();
        for expression in ["f1b(gpipe)", "offload(f1b(gpipe), memory=2)"] {
            let compiled =
                compile(&Registry::builtin(), expression, &config, RecvPolicy::Early).unwrap();
            let report = compiled.report(expression, None);
            let json = serde_json::to_value(&report).unwrap();
            for key in keys(&json) {
                assert!(fields.iter().any(|f| f.name == key), "{key} is not listed");
            }
            for field in &fields {
                let value = json.get(field.name);
                if !field.python_type.starts_with("Optional[") {
                    assert!(
                        value.is_some_and(|v| !v.is_null()),
                        "{} is required but missing in {expression}",
                        field.name
                    );
                }
            }
        }
    }

    #[test]
    fn types_read_as_python_reads_the_json() {
        let fields = plan_report_fields();
        let type_of = |name: &str| {
            fields
                .iter()
                .find(|f| f.name == name)
                .map(|f| f.python_type.as_str())
        };
        assert_eq!(type_of("makespan"), Some("float"));
        assert_eq!(type_of("order"), Some("List[List[str]]"));
        assert_eq!(type_of("memory_limit"), Some("Optional[float]"));
        assert_eq!(type_of("routes"), Some("List[List[Any]]"));
        assert_eq!(candidate_fields().len(), 9);
        assert_eq!(frontier_point_fields()[4].python_type, "str");
    }
}
