use crate::Foo; // through the root's re-export: an edge to crate::a
pub struct Bar(pub Foo);
pub struct Baz;
macro_rules! make {
    () => { $crate::a::Foo };
}
pub(crate) use make;
pub fn m() -> Foo { make!() }
