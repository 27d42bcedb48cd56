//! The macro behind every C enum and flag set the library reads or writes.
//!
//! A C enum field can hold any value the library (or a newer library) puts
//! there, so a Rust `enum` would be undefined behaviour waiting for an
//! unknown value. Each C enum is a `#[repr(transparent)]` newtype over its
//! integer with one associated constant per named value; an unknown value is
//! just a number that prints as `UNKNOWN(n)`.

/// Declares a transparent newtype over a C enum or flag set.
///
/// `prefix` is the common prefix of the C names (`IBV_WC_` for
/// `IBV_WC_SUCCESS`); each constant's C name is the prefix followed by the
/// constant's own name, which the layout tests check against the header.
macro_rules! c_enum {
    (
        $(#[$meta:meta])*
        pub struct $name:ident($repr:ty), prefix $prefix:literal {
            $( $(#[$cmeta:meta])* $konst:ident = $value:expr, )*
        }
    ) => {
        $(#[$meta])*
        #[repr(transparent)]
        #[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
        pub struct $name(pub $repr);

        impl $name {
            $(
                #[doc = concat!("`", $prefix, stringify!($konst), "`")]
                $(#[$cmeta])*
                pub const $konst: $name = $name($value);
            )*

            /// The C prefix shared by every named value.
            pub const C_PREFIX: &'static str = $prefix;

            /// Every named value with its name (without the C prefix).
            pub const NAMED: &'static [(&'static str, $name)] =
                &[ $( (stringify!($konst), $name($value)) ),* ];

            /// The name of this value (without the C prefix), or `None` for
            /// a value this crate does not know.
            pub fn name(self) -> Option<&'static str> {
                Self::NAMED.iter().find(|(_, v)| *v == self).map(|(n, _)| *n)
            }
        }

        impl core::fmt::Debug for $name {
            fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
                match self.name() {
                    Some(n) => f.write_str(n),
                    None => write!(f, "UNKNOWN({})", self.0),
                }
            }
        }

        impl core::fmt::Display for $name {
            fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
                core::fmt::Debug::fmt(self, f)
            }
        }
    };
}

/// Declares a transparent newtype over a C flag set: a [`c_enum!`] plus the
/// bit operations.
macro_rules! c_flags {
    (
        $(#[$meta:meta])*
        pub struct $name:ident($repr:ty), prefix $prefix:literal {
            $( $(#[$cmeta:meta])* $konst:ident = $value:expr, )*
        }
    ) => {
        c_enum! {
            $(#[$meta])*
            pub struct $name($repr), prefix $prefix {
                $( $(#[$cmeta])* $konst = $value, )*
            }
        }

        impl $name {
            /// No flag set.
            pub const EMPTY: $name = $name(0);

            /// True when every bit of `other` is set in `self`.
            #[inline]
            pub const fn contains(self, other: $name) -> bool {
                self.0 & other.0 == other.0
            }

            /// `self` with the bits of `other` cleared.
            #[inline]
            #[must_use]
            pub const fn without(self, other: $name) -> $name {
                $name(self.0 & !other.0)
            }

            /// True when no bit is set.
            #[inline]
            pub const fn is_empty(self) -> bool {
                self.0 == 0
            }
        }

        impl core::ops::BitOr for $name {
            type Output = $name;
            #[inline]
            fn bitor(self, rhs: $name) -> $name {
                $name(self.0 | rhs.0)
            }
        }

        impl core::ops::BitOrAssign for $name {
            #[inline]
            fn bitor_assign(&mut self, rhs: $name) {
                self.0 |= rhs.0;
            }
        }

        impl core::ops::BitAnd for $name {
            type Output = $name;
            #[inline]
            fn bitand(self, rhs: $name) -> $name {
                $name(self.0 & rhs.0)
            }
        }
    };
}

/// Types whose all-zero bit pattern is a valid value (integers, raw
/// pointers, and unions and structs of them): the C idiom `= {0}`.
pub trait Zeroed: Sized {
    /// The all-zero value.
    fn zeroed() -> Self;
}

macro_rules! zeroed {
    ($($t:ty),* $(,)?) => {$(
        impl Zeroed for $t {
            #[inline(always)]
            fn zeroed() -> Self {
                // SAFETY: every field of this `#[repr(C)]` type (checked by
                // tests/layout.rs) is an integer, a transparent integer
                // newtype, a raw pointer, or an array/union/struct of those,
                // for all of which all-zero bits are a valid value.
                unsafe { core::mem::zeroed() }
            }
        }
    )*};
}
