//! Which traces are recorded, as the standard `OTEL_TRACES_SAMPLER` and
//! `OTEL_TRACES_SAMPLER_ARG` variables say: every trace (the default follows the
//! caller's choice and records the rest), none, or a share chosen from the trace id so
//! that every host sharing a trace decides alike.

use opentelemetry::trace::TraceId;

/// What decides a trace with no parent, or every trace if the sampler is not
/// parent-based.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Rule {
    Always,
    Never,
    /// Recorded when the trace id's low 63 bits fall below this.
    Below(u64),
}

/// A sampler named by `OTEL_TRACES_SAMPLER`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Sampler {
    rule: Rule,
    /// Whether a span with a parent follows the parent's choice.
    parent_based: bool,
}

impl Default for Sampler {
    /// `parentbased_always_on`, the specification's default.
    fn default() -> Self {
        Sampler {
            rule: Rule::Always,
            parent_based: true,
        }
    }
}

impl Sampler {
    /// The sampler the variables name (`var` reads one); unset, the default. As the
    /// specification says, a sampler the host does not have is set aside for the default,
    /// and a ratio outside 0 to 1 for a ratio of 1; the second value then says what was
    /// set aside, for the caller to log.
    pub(super) fn from_env(var: impl Fn(&str) -> Option<String>) -> (Sampler, Option<String>) {
        const NAME: &str = "OTEL_TRACES_SAMPLER";
        const ARG: &str = "OTEL_TRACES_SAMPLER_ARG";
        let Some(name) = var(NAME).filter(|name| !name.trim().is_empty()) else {
            return (Sampler::default(), None);
        };
        let name = name.trim().to_ascii_lowercase();
        let mut note = None;
        let mut ratio = || match var(ARG).filter(|arg| !arg.trim().is_empty()) {
            None => Rule::Always,
            Some(arg) => match arg.trim().parse::<f64>() {
                Ok(ratio) if (0.0..=1.0).contains(&ratio) => threshold(ratio),
                _ => {
                    note = Some(format!(
                        "{ARG}={arg:?} is not a ratio from 0 to 1: every trace is recorded"
                    ));
                    Rule::Always
                }
            },
        };
        let (rule, parent_based) = match name.as_str() {
            "always_on" => (Rule::Always, false),
            "always_off" => (Rule::Never, false),
            "traceidratio" => (ratio(), false),
            "parentbased_always_on" => (Rule::Always, true),
            "parentbased_always_off" => (Rule::Never, true),
            "parentbased_traceidratio" => (ratio(), true),
            _ => {
                let note = format!(
                    "{NAME}={name:?} is not a sampler the host has (it has always_on, \
                     always_off, traceidratio and their parentbased_ forms): the default, \
                     parentbased_always_on, is used"
                );
                return (Sampler::default(), Some(note));
            }
        };
        (Sampler { rule, parent_based }, note)
    }

    /// Whether no span is ever recorded: then the pipeline need not start.
    pub(super) fn records_nothing(&self) -> bool {
        self.rule == Rule::Never && !self.parent_based
    }

    /// Whether a span of `trace` is recorded, given its parent's choice if it has one.
    pub(super) fn samples(&self, trace: TraceId, parent_sampled: Option<bool>) -> bool {
        if self.parent_based
            && let Some(parent) = parent_sampled
        {
            return parent;
        }
        match self.rule {
            Rule::Always => true,
            Rule::Never => false,
            Rule::Below(bound) => {
                let low = u64::from_be_bytes(trace.to_bytes()[8..].try_into().unwrap_or_default());
                low >> 1 < bound
            }
        }
    }
}

/// The rule recording a share `ratio` of traces.
fn threshold(ratio: f64) -> Rule {
    if ratio >= 1.0 {
        return Rule::Always;
    }
    // The share of 63-bit values below the bound.
    Rule::Below((ratio * (1u64 << 63) as f64) as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sampler(vars: &[(&str, &str)]) -> (Sampler, Option<String>) {
        Sampler::from_env(|name| {
            vars.iter()
                .find(|(n, _)| *n == name)
                .map(|(_, v)| (*v).to_owned())
        })
    }

    #[test]
    fn the_default_follows_the_parent_and_records_the_rest() {
        let (default, note) = sampler(&[]);
        assert_eq!(note, None);
        let trace = TraceId::from(7u128);
        assert!(default.samples(trace, None));
        assert!(!default.samples(trace, Some(false)));
        assert!(!default.records_nothing());
    }

    #[test]
    fn each_named_sampler_decides_as_the_specification_says() {
        let trace = TraceId::from(7u128);
        let off = sampler(&[("OTEL_TRACES_SAMPLER", "always_off")]).0;
        assert!(off.records_nothing() && !off.samples(trace, Some(true)));
        let on = sampler(&[("OTEL_TRACES_SAMPLER", "always_on")]).0;
        assert!(on.samples(trace, Some(false)));
        let parent_off = sampler(&[("OTEL_TRACES_SAMPLER", "parentbased_always_off")]).0;
        assert!(!parent_off.records_nothing());
        assert!(!parent_off.samples(trace, None) && parent_off.samples(trace, Some(true)));
        // A quarter of the traces, chosen from the id: the same id, the same choice.
        let quarter = sampler(&[
            ("OTEL_TRACES_SAMPLER", "traceidratio"),
            ("OTEL_TRACES_SAMPLER_ARG", "0.25"),
        ])
        .0;
        let kept = (0..4000u128)
            .filter(|i| {
                quarter.samples(
                    TraceId::from(i.wrapping_mul(0x9e37_79b9_7f4a_7c15_f39c_c060_5ced_c835)),
                    None,
                )
            })
            .count();
        assert!((800..1200).contains(&kept), "{kept} of 4000 kept");
    }

    #[test]
    fn an_unknown_sampler_or_a_bad_ratio_is_set_aside_with_a_note_naming_the_variable() {
        let trace = TraceId::from(7u128);
        let (unknown, note) = sampler(&[("OTEL_TRACES_SAMPLER", "jaeger_remote")]);
        assert_eq!(unknown, Sampler::default());
        let note = note.expect("a note");
        assert!(note.starts_with("OTEL_TRACES_SAMPLER="), "{note}");
        for bad in ["1.5", "-0.1", "half"] {
            let (ratio, note) = sampler(&[
                ("OTEL_TRACES_SAMPLER", "traceidratio"),
                ("OTEL_TRACES_SAMPLER_ARG", bad),
            ]);
            // As if no ratio were given: every trace, and still not parent-based.
            assert!(ratio.samples(trace, Some(false)), "{bad}");
            let note = note.expect("a note");
            assert!(note.starts_with("OTEL_TRACES_SAMPLER_ARG="), "{note}");
        }
    }
}
