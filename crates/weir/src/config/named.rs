//! Values chosen by name in the config ([`Named`]), and the `named_enum!`
//! macro that declares such an enum with its list of names, so validation
//! can look names up and list the choices in one place.

/// A value chosen by name in the config, so validation can look names up
/// and list the choices in one place.
pub(crate) trait Named: Sized {
    /// Every accepted name.
    const NAMES: &'static [&'static str];
    /// The value called `name`, if any.
    fn from_name(name: &str) -> Option<Self>;
}

/// An enum chosen by name in the config, with the list of names for error
/// messages.
macro_rules! named_enum {
    (
        $(#[$meta:meta])*
        pub enum $name:ident { $($(#[$vmeta:meta])* $variant:ident = $text:literal,)+ }
    ) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub enum $name {
            $($(#[$vmeta])* $variant,)+
        }

        impl $name {
            /// Every accepted name, in documentation order.
            pub const NAMES: &'static [&'static str] = &[$($text),+];

            /// The name as written in the config.
            pub fn as_str(self) -> &'static str {
                match self {
                    $($name::$variant => $text,)+
                }
            }

            /// The value called `name`, if any.
            pub fn from_name(name: &str) -> Option<Self> {
                match name {
                    $($text => Some($name::$variant),)+
                    _ => None,
                }
            }
        }

        impl ::std::fmt::Display for $name {
            fn fmt(&self, f: &mut ::std::fmt::Formatter<'_>) -> ::std::fmt::Result {
                f.write_str(self.as_str())
            }
        }

        impl $crate::config::named::Named for $name {
            const NAMES: &'static [&'static str] = $name::NAMES;

            fn from_name(name: &str) -> Option<Self> {
                $name::from_name(name)
            }
        }
    };
}

pub(crate) use named_enum;
