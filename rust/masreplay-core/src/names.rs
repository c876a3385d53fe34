//! Closed sets of names: the vocabularies of the trace schema (event, edge, topology and
//! branch kinds) and the arguments that pick one of a few behaviours (estimator, stratum,
//! sampler, ...). [`named_enum!`] writes such an enum and its names from one list, so the
//! names a caller sees and the variants cannot drift apart, and gives every one of them the
//! same API: `NAMES` and `ALL` in the canonical order, `as_str`, `from_name` (a lookup),
//! `parse` (an argument, with one message format) and `expected` (the names for a message).

use crate::error::{MasreplayError, Result};

/// What the bindings need to parse any named argument once, at the edge (the core only ever
/// sees the enum). Implemented by [`named_enum!`].
pub trait Named: Sized + Copy + 'static {
    /// The names, in the canonical order.
    const NAMES: &'static [&'static str];

    /// The value named `name`, or an InvalidArgument error that says what was expected.
    fn parse(name: &str) -> Result<Self>;
}

/// The error for a name outside `names`: "unknown estimator 'ppo': expected one of 'grpo', ...".
pub fn unknown(what: &str, name: &str, names: &[&str]) -> MasreplayError {
    MasreplayError::InvalidArgument(format!("unknown {what} '{name}': expected one of {}", quoted(names)))
}

/// `names` quoted and comma-separated, for messages.
pub fn quoted(names: &[&str]) -> String {
    names.iter().map(|name| format!("'{name}'")).collect::<Vec<_>>().join(", ")
}

/// `named_enum!(/// docs
///     Estimator as "estimator" { Grpo = "grpo", ... } aliases { "other" => Grpo })`: the enum
/// (variants numbered in the order given, which is the order of `NAMES`), its API and its
/// [`Named`] impl. Aliases are further spellings `from_name` and `parse` accept.
macro_rules! named_enum {
    (
        $(#[$meta:meta])*
        $name:ident as $what:literal {
            $($(#[$variant_meta:meta])* $variant:ident = $text:literal),+ $(,)?
        }
        $(aliases { $($alias:literal => $target:ident),+ $(,)? })?
    ) => {
        $(#[$meta])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
        #[repr(u8)]
        pub enum $name { $($(#[$variant_meta])* $variant),+ }

        impl $name {
            /// Every variant, in the order of [`Self::NAMES`] (for the schema enums: their
            /// dictionary codes in the Arrow layout).
            pub const ALL: &'static [$name] = &[$($name::$variant),+];
            /// The names, index-aligned with [`Self::ALL`].
            pub const NAMES: &'static [&'static str] = &[$($text),+];

            pub fn as_str(self) -> &'static str {
                // Variants are numbered 0.. in the order of NAMES (repr(u8), no explicit values).
                Self::NAMES[self as usize]
            }

            pub fn from_name(name: &str) -> Option<Self> {
                match name {
                    $($text => Some($name::$variant),)+
                    $($($alias => Some($name::$target),)+)?
                    _ => None,
                }
            }

            /// The variant named `name`, or an InvalidArgument error listing the names.
            pub fn parse(name: &str) -> $crate::error::Result<Self> {
                Self::from_name(name).ok_or_else(|| $crate::names::unknown($what, name, Self::NAMES))
            }

            pub fn from_code(code: usize) -> Option<Self> {
                Self::ALL.get(code).copied()
            }

            /// The names, quoted and comma-separated, for messages.
            pub fn expected() -> String {
                $crate::names::quoted(Self::NAMES)
            }
        }

        impl $crate::names::Named for $name {
            const NAMES: &'static [&'static str] = $name::NAMES;

            fn parse(name: &str) -> $crate::error::Result<Self> {
                $name::parse(name)
            }
        }
    };
}

pub(crate) use named_enum;

#[cfg(test)]
mod tests {
    use crate::advantage::Estimator;
    use crate::trace::{EventType, Unit};

    #[test]
    fn names_round_trip_in_their_canonical_order() {
        for (code, name) in EventType::NAMES.iter().enumerate() {
            let value = EventType::from_name(name).expect("a listed name");
            assert_eq!((value.as_str(), value as usize, EventType::from_code(code)), (*name, code, Some(value)));
            assert_eq!(EventType::ALL[code], value);
        }
        assert_eq!(EventType::from_name("Spawn"), None);
        assert_eq!(EventType::from_code(EventType::NAMES.len()), None);
    }

    #[test]
    fn an_alias_parses_to_its_value_and_prints_as_the_name() {
        let value = Estimator::parse("reinforce_plus_plus_baseline").expect("an alias");
        assert_eq!((value, value.as_str()), (Estimator::ReinforcePpBaseline, "reinforce_pp_baseline"));
        assert!(!Estimator::NAMES.contains(&"reinforce_plus_plus_baseline"));
    }

    #[test]
    fn an_unknown_name_says_what_it_is_and_lists_the_names() {
        let error = Unit::parse("bytes").expect_err("not a unit").to_string();
        assert_eq!(error, "unknown unit 'bytes': expected one of 'traces', 'events'");
    }
}
