//! Root. [`crate::b::Bar`] in a doc comment is not an edge.
mod a;
mod b;
#[cfg(target_arch = "aarch64")]
mod arm;
#[cfg(target_arch = "x86_64")]
mod x86;
#[path = "weird/place.rs"]
mod c;

pub use a::Foo;
pub(crate) use b::{Bar, Baz as Qux};

/// The root names nothing of its children in code: `crate::a::f()` here is in a doc comment.
pub struct Root;
